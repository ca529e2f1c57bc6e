"""Random, valid ONNX models for differential testing of graphsub.

The generator is written against the ONNX specification with `onnx.helper` alone: it shares no
code with graphsub (no GraphBuilder, no op registry), so it does not share graphsub's
assumptions about what a model looks like. It covers every ONNX op graphsub imports, each in
the form its opset requires and with its attribute variants (negative axes, keepdims, Gemm's
transposes and scalings, grouped/strided/dilated/padded convolutions, ...), plus a few ops
graphsub does not model (imported as opaque nodes).

Models are biased toward what graphsub's rewrite rules rewrite (rules/library/*.rules and
TASO's graph_subst.pb): matmuls and convolutions sharing an input, matmul chains with vector
and batched operands, a convolution followed by a bias, an activation, a batch norm or a scalar
multiplication, concatenated convolutions, transpose and reshape round trips, weight-only
subgraphs. With `symbolic` > 0, that share of the models has a size symbol: one size the inputs share
becomes the dim_param `s` wherever the model runs at other values of it too (checked at
three), so that import, search and export are checked at several sizes of it; the sizes
the model was built with are kept in its metadata (`fuzz_sizes`). Values stay numerically
sane so that a difference means something: weights are
scaled like Xavier initialisation, Sqrt/Log/Reciprocal/Pow/Div only see inputs made positive
and bounded away from zero (x*x + 1, sigmoid(x) + 0.5, exp(tanh(x))), Exp only sees bounded
inputs. Each model is checked with onnx.checker (full check) and run once in onnxruntime; one
that fails or computes non-finite values is discarded and generated again from the next
sub-seed, and the discards are counted.

    model = random_model(7)                   # deterministic per seed
    model, stats = generate(7, opset=20)      # ... with the discards and their reasons
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphsub.tensors.onnx_types import made_up_value, opaque_type

#: The opsets models are written for, and how often (graphsub reads 13 to 23; Gelu needs 20,
#: RMSNormalization 23).
OPSETS: tuple[int, ...] = (13, 17, 18, 20, 23)
OPSET_WEIGHTS: tuple[float, ...] = (0.15, 0.35, 0.15, 0.15, 0.2)
#: ONNX ops graphsub does not model: they become opaque nodes at import.
OPAQUE_OPS: tuple[str, ...] = ("Expand", "Where", "Greater", "Equal", "Tile", "Gather", "Shape",
                               "Abs", "Max")
#: Largest |output| a model may compute: beyond it float32 rounding swamps the tolerances.
MAX_MAGNITUDE = 1e5
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class InvalidModel(Exception):
    """A generated model that the checker or onnxruntime rejects (it is discarded)."""


@dataclass(frozen=True)
class GenOptions:
    """What `random_model` generates. `opset` None picks one of OPSETS per model;
    `opaque_rate` is the chance that a model contains an op graphsub does not model."""

    min_nodes: int = 3
    max_nodes: int = 25
    opset: int | None = None
    opaque_rate: float = 0.25
    max_attempts: int = 50
    #: The share of models given a size symbol (see `symbolize`).
    symbolic: float = 0.0


@dataclass
class GenStats:
    """How many attempts were discarded before a valid model came out, and why."""

    attempts: int = 0
    discards: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


def random_model(seed: int, **options: object) -> onnx.ModelProto:
    """A random valid float32 ONNX model, the same for the same seed and options (see
    GenOptions for the options)."""
    return generate(seed, **options)[0]


def generate(seed: int, **options: Any) -> tuple[onnx.ModelProto, GenStats]:
    """A random valid model and the statistics of its generation. Attempt k draws from the
    seed sequence (seed, k), so a discard never changes what other seeds generate."""
    opts = replace(GenOptions(), **options)
    stats = GenStats()
    for attempt in range(opts.max_attempts):
        stats.attempts += 1
        rng = np.random.default_rng([seed, attempt])
        try:
            model = _Builder(rng, opts).build(seed)
            validate(model, seed)
            if opts.symbolic and rng.random() < opts.symbolic:
                try:
                    model = symbolize(model, seed)
                except InvalidModel as exc:  # the model stays static: counted, not discarded
                    stats.reasons[str(exc).split(":")[0]] += 1
            return model, stats
        except InvalidModel as exc:
            stats.discards += 1
            stats.reasons[str(exc).split(":")[0]] += 1
    raise RuntimeError(f"seed {seed}: no valid model in {opts.max_attempts} attempts "
                       f"({dict(stats.reasons)})")


def random_inputs(model: onnx.ModelProto, seed: int,
                  sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Standard-normal inputs of each input's float type (random booleans for a condition)
    for the model's graph inputs (those that are not initializers), reproducible from the seed; a size symbol takes its value in `sizes`
    (default: the size the model was built with, `fuzz_sizes`)."""
    rng = np.random.default_rng(seed)
    sizes = fuzz_sizes(model) if sizes is None else sizes
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        opaque = opaque_type(inp.type)
        if opaque is not None:  # words, a sequence: a made-up value of its type
            feeds[inp.name] = made_up_value(opaque, rng)
            continue
        shape = [sizes[d.dim_param] if d.dim_param else d.dim_value
                 for d in inp.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        if dtype == np.bool_:  # a condition (fuzz.classes' control flow): either branch
            feeds[inp.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


#: The metadata key of the sizes a symbolic model was built with ("s=5").
SIZES_KEY = "fuzz_sizes"
#: The size symbol `symbolize` introduces.
SYMBOL = "s"


def fuzz_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """The sizes a model from `symbolize` was built with (empty for a static model)."""
    for prop in model.metadata_props:
        if prop.key == SIZES_KEY:
            return {name: int(value) for name, value in
                    (item.split("=") for item in prop.value.split(",") if item)}
    return {}


def other_sizes(model: onnx.ModelProto) -> list[dict[str, int]]:
    """Sizes other than the built ones that a symbolic model is checked at: one odd, one
    larger (empty for a static model)."""
    return [{name: v + k for name, v in fuzz_sizes(model).items()} for k in (1, 3)]


def symbolize(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """The model with one size its inputs share made the symbol `s`: a size of at least 2
    (the most frequent first) whose every input dimension becomes `s` and at whose other
    values (`other_sizes`) the model still runs with finite, sane outputs. Output dimensions
    that change with it lose their numbers. InvalidModel when no size qualifies."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    counts = Counter(d.dim_value for i in inputs for d in i.type.tensor_type.shape.dim
                     if d.dim_value >= 2)
    for value, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        candidate = onnx.ModelProto()
        candidate.CopyFrom(model)
        for inp in candidate.graph.input:
            if inp.name in inits:
                continue
            for d in inp.type.tensor_type.shape.dim:
                if d.dim_value == value:
                    d.Clear()
                    d.dim_param = SYMBOL
        prop = candidate.metadata_props.add()
        prop.key, prop.value = SIZES_KEY, f"{SYMBOL}={value}"
        try:
            shapes = [{k: v.shape for k, v in run_reference(candidate, random_inputs(
                candidate, seed, sizes)).items()} for sizes in
                [{SYMBOL: value}, *other_sizes(candidate)]]
            for sizes in other_sizes(candidate):
                _check_outputs(run_reference(candidate, random_inputs(candidate, seed, sizes)))
        except Exception:  # noqa: BLE001 (InvalidModel, or onnxruntime's own kinds)
            continue
        if not _grows(shapes):
            continue
        for out in candidate.graph.output:
            for axis, d in enumerate(out.type.tensor_type.shape.dim):
                if len({s[out.name][axis] for s in shapes}) > 1:
                    d.Clear()
        onnx.checker.check_model(candidate, full_check=True)
        return candidate
    raise InvalidModel("symbolic: no input size can vary")


def run_reference(model: onnx.ModelProto | bytes,
                  feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs by name from onnxruntime's CPU provider with every graph optimization off:
    the reference semantics of the model, without onnxruntime's own rewrites (whose bugs
    would otherwise be blamed on graphsub)."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4  # failures surface as exceptions; the log would repeat them
    session = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def validate(model: onnx.ModelProto, seed: int = 0) -> None:
    """Raise InvalidModel unless the model passes onnx.checker's full check, runs in
    onnxruntime with finite outputs of sane magnitude and of the declared shapes, and loads
    with onnxruntime's own graph optimizations on, as a deployed model does: where its
    optimizer fails (1.32's QDQ propagation writes an int8 QuantizeLinear with a uint8 zero
    point before a Slice at opset 23: campaign 30000, seed 31822), nobody can run the model
    as it is, and graphsub has nothing to measure its candidates against."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise InvalidModel(f"checker: {str(exc).splitlines()[0]}") from None
    try:
        outputs = run_reference(model, random_inputs(model, seed))
    except Exception as exc:
        raise InvalidModel(f"onnxruntime: {str(exc).splitlines()[0][:200]}") from None
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise InvalidModel(f"onnxruntime's optimizer: {str(exc).splitlines()[0][:200]}") \
            from None
    declared = {o.name: tuple(d.dim_value for d in o.type.tensor_type.shape.dim)
                for o in model.graph.output}
    for name, value in outputs.items():
        if value.shape != declared[name]:
            raise InvalidModel(f"shape: {name} is {value.shape}, declared {declared[name]}")
    _check_outputs(outputs)


def _grows(shapes: list[dict[str, tuple[int, ...]]]) -> bool:
    """Whether every output is non-empty at every size and none of its dimensions shrinks as
    the size grows (a slice that empties as the input grows computes less from more: not a
    model anyone exports)."""
    for name in shapes[0]:
        seen = [s[name] for s in shapes]
        if any(0 in shape for shape in seen):
            return False
        if any(b < a for before, after in zip(seen, seen[1:]) for a, b in zip(before, after)):
            return False
    return True


def _check_outputs(outputs: dict[str, np.ndarray]) -> None:
    for name, value in outputs.items():
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise InvalidModel(f"non-finite: {name}")
        if value.dtype.kind == "f" and value.size and float(np.abs(value).max()) > MAX_MAGNITUDE:
            raise InvalidModel(f"magnitude: {name}")


# ---- the builder -------------------------------------------------------------------------

Shape = tuple[int, ...]
T = TypeVar("T")
#: A builder's state to go back to: nodes, inputs, initializers, pool, weights, positive and
#: bounded values.
_Saved = tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto], list[onnx.TensorProto],
               list[str], set[str], set[str], set[str]]


class _Builder:
    """One attempt at a model: a pool of float32 values, grown by op and motif builders until
    the node count is reached. Shapes come from ONNX shape inference on the graph so far, so
    the builders never compute an output shape themselves."""

    def __init__(self, rng: np.random.Generator, opts: GenOptions) -> None:
        self.rng = rng
        self.opts = opts
        self.opset = opts.opset if opts.opset is not None else int(
            rng.choice(OPSETS, p=OPSET_WEIGHTS))
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, Shape] = {}
        self.pool: list[str] = []          # float32 values builders may read
        self.weights: set[str] = set()     # float initializers and weight-only values
        self.positive: set[str] = set()    # values >= ~0.3 everywhere
        self.bounded: set[str] = set()     # values in [-3, 3]
        self.counter = 0

    # -- naming, values, nodes --
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def input(self, shape: Shape) -> str:
        name = self.fresh("x")
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.shapes[name] = tuple(shape)
        self.pool.append(name)
        return name

    def weight(self, shape: Shape, fan_in: int | None = None, low: float | None = None,
               high: float | None = None) -> str:
        """A float32 initializer: Xavier-like normal values (std 1/sqrt(fan_in)), or uniform
        in [low, high)."""
        if low is not None and high is not None:
            data = self.rng.uniform(low, high, shape)
        else:
            fan = fan_in or (shape[-1] if shape else 1)
            data = self.rng.standard_normal(shape) / math.sqrt(max(fan, 1))
        name = self.fresh("w")
        self.inits.append(numpy_helper.from_array(np.asarray(data, np.float32), name))
        self.shapes[name] = tuple(shape)
        self.weights.add(name)
        return name

    def scalar(self, value: float, shape: Shape = ()) -> str:
        """A float32 constant filled with `value`, as an initializer or a Constant node."""
        array = np.full(shape, value, np.float32)
        return self.constant(array, "s")

    def ints(self, values: Sequence[int]) -> str:
        """An int64 1-D constant (axes, shapes, pads, sizes), as an initializer or a Constant
        node: graphsub must fold both."""
        return self.constant(np.asarray(list(values), np.int64), "c")

    def constant(self, array: np.ndarray, prefix: str) -> str:
        name = self.fresh(prefix)
        if self.rng.random() < 0.2:
            self.nodes.append(helper.make_node("Constant", [], [name],
                                               value=numpy_helper.from_array(array, name),
                                               name=self.fresh("n")))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        self.shapes[name] = array.shape
        if array.dtype == np.float32:
            self.weights.add(name)
        return name

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, pool: bool = True,
             **attrs: Any) -> list[str]:
        """Append a node; its float outputs join the pool (a weight-only node's outputs are
        weights too)."""
        outs = [self.fresh("t") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.fresh("n"),
                                           **attrs))
        if all(i in self.weights for i in inputs if i):
            self.weights.update(outs)
        if pool:
            self.pool.extend(outs)
        return outs

    def one(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.node(op, inputs, **attrs)[0]

    def shape(self, name: str) -> Shape:
        if name not in self.shapes:
            self._infer()
            if name not in self.shapes:
                raise InvalidModel(f"shape inference: no static shape for {name}")
        return self.shapes[name]

    def _infer(self) -> None:
        graph = helper.make_graph(self.nodes, "g", self.inputs, [], initializer=self.inits)
        model = self._model(graph)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception as exc:
            raise InvalidModel(f"shape inference: {str(exc).splitlines()[0][:200]}") from None
        for vi in inferred.graph.value_info:
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims) and vi.type.tensor_type.HasField("shape"):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def _model(self, graph: onnx.GraphProto) -> onnx.ModelProto:
        opsets = [helper.make_opsetid("", self.opset)]
        return helper.make_model(graph, opset_imports=opsets, producer_name="graphsub-fuzz",
                                 ir_version=helper.find_min_ir_version_for(opsets))

    # -- choosing operands --
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick_from(self, options: Sequence[T]) -> T:
        return options[int(self.rng.integers(len(options)))]

    def dim(self, low: int = 1, high: int = 8) -> int:
        return int(self.rng.integers(low, high + 1))

    def random_shape(self, rank: int) -> Shape:
        return tuple(self.dim() for _ in range(rank))

    def pick(self, accept: Callable[[str], bool] = lambda name: True,
             make: Callable[[], str] | None = None) -> str:
        """A pool value that `accept`s, preferring recent ones (deeper graphs) and activations
        over weights; `make` builds one when none does (default: a new rank-2 input)."""
        found = [n for n in self.pool if accept(n)]
        if not found or self.chance(0.08):
            return make() if make is not None else self.input(self.random_shape(2))
        live = [n for n in found if n not in self.weights] or found
        if self.chance(0.6):
            return live[-1 - int(self.rng.integers(min(3, len(live))))]
        return self.pick_from(live)

    def pick_rank(self, ranks: Sequence[int]) -> str:
        return self.pick(lambda n: len(self.shape(n)) in ranks,
                         lambda: self.input(self.random_shape(self.pick_from(ranks))))

    def pick_image(self) -> str:
        """A 4-D (N, C, H, W) value, or a new input with H and W in 4..12."""
        return self.pick(lambda n: len(self.shape(n)) == 4 and min(self.shape(n)[2:]) >= 2,
                         self.new_image)

    def new_image(self) -> str:
        return self.input((self.dim(1, 2), self.dim(1, 8), self.dim(4, 12), self.dim(4, 12)))

    def partner(self, shape: Shape) -> Shape:
        """A shape that broadcasts against `shape`: trailing dims kept or set to 1, and where
        `shape` has a 1, sometimes a larger size (both operands then broadcast)."""
        keep = int(self.rng.integers(0, len(shape) + 1))
        tail = shape[len(shape) - keep:]
        out = [self.dim(2, 4) if d == 1 and self.chance(0.2) else
               1 if self.chance(0.3) else d for d in tail]
        if keep == len(shape) and len(out) < 4 and self.chance(0.1):
            out = [self.dim(1, 3)] + out
        return tuple(out)

    def operand(self, shape: Shape) -> str:
        """A second operand for an element-wise op with a value of this shape: a pool value
        that broadcasts with it, a new weight, a new input or a scalar."""
        def fits(n: str) -> bool:
            try:
                np.broadcast_shapes(shape, self.shape(n))
            except ValueError:
                return False
            return len(self.shape(n)) <= 4
        r = self.rng.random()
        if r < 0.35:
            return self.pick(fits, lambda: self.weight(self.partner(shape)))
        if r < 0.7:
            return self.weight(self.partner(shape), low=-1.0, high=1.0) if self.chance(0.3) \
                else self.weight(self.partner(shape), fan_in=1)
        if r < 0.85:
            return self.input(self.partner(shape))
        return self.scalar(float(self.rng.uniform(-2, 2)), self.pick_from([(), (1,)]))

    def make_positive(self, x: str) -> str:
        """x mapped to values >= ~0.37 with the listed ops: x*x + 1, sigmoid(x) + 0.5 or
        exp(tanh(x))."""
        if x in self.positive:
            return x
        kind = int(self.rng.integers(3))
        if kind == 0:
            y = self.one("Add", [self.one("Mul", [x, x]), self.scalar(1.0)])
        elif kind == 1:
            y = self.one("Add", [self.one("Sigmoid", [x]), self.scalar(0.5)])
        else:
            y = self.one("Exp", [self.bound(x)])
        self.positive.add(y)
        return y

    def bound(self, x: str) -> str:
        """x mapped into [-3, 3] (tanh, sigmoid or clip) unless it is there already."""
        if x in self.bounded:
            return x
        kind = int(self.rng.integers(3))
        if kind == 0:
            y = self.one("Tanh", [x])
        elif kind == 1:
            y = self.one("Sigmoid", [x])
        else:
            y = self.one("Clip", [x, self.scalar(-3.0), self.scalar(3.0)])
        self.bounded.add(y)
        return y

    def axis(self, rank: int) -> int:
        """An axis in [-rank, rank - 1], negative half the time."""
        a = int(self.rng.integers(rank))
        return a - rank if self.chance(0.5) else a

    # -- building --
    def build(self, seed: int) -> onnx.ModelProto:
        """Apply random builders until the node count reaches a random target; a builder that
        would go past max_nodes is undone (motifs add several nodes at once)."""
        target = int(self.rng.integers(self.opts.min_nodes, self.opts.max_nodes + 1))
        builders = _builders(self.opset)
        names = list(builders)
        weights = np.array([builders[n][0] for n in names], np.float64)
        opaque = self.chance(self.opts.opaque_rate)
        for _ in range(20 * self.opts.max_nodes):
            if len(self.nodes) >= target:
                break
            if opaque and len(self.nodes) >= target // 2:
                step: Builder = _opaque
                opaque = False
            else:
                drawn = int(self.rng.choice(len(names), p=weights / weights.sum()))
                step = builders[names[drawn]][1]
            saved = self.save()
            step(self)
            if len(self.nodes) > self.opts.max_nodes:
                self.restore(saved)
        return self.finish(seed)

    def save(self) -> _Saved:
        return (list(self.nodes), list(self.inputs), list(self.inits), list(self.pool),
                set(self.weights), set(self.positive), set(self.bounded))

    def restore(self, saved: _Saved) -> None:
        (self.nodes, self.inputs, self.inits, self.pool, self.weights, self.positive,
         self.bounded) = saved

    def finish(self, seed: int) -> onnx.ModelProto:
        """The model, with every unread computed float value as an output, sometimes also a
        value other nodes read, and sometimes a graph input passed straight through."""
        if len(self.nodes) < self.opts.min_nodes:
            raise InvalidModel("too few nodes")
        read = {i for n in self.nodes for i in n.input}
        sources = [i.name for i in self.inputs]
        computed = [n for n in self.pool if n not in sources]
        outputs = [n for n in computed if n not in read]
        inner = [n for n in computed if n in read]
        if inner and (not outputs or self.chance(0.3)):
            outputs.append(self.pick_from(inner))
        if sources and (not outputs or self.chance(0.1)):
            outputs.append(self.pick_from(sources))
        if not outputs:
            raise InvalidModel("no outputs")
        self._infer()
        graph = helper.make_graph(
            self.nodes, f"fuzz{seed}", self.inputs,
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(self.shape(o)))
             for o in outputs], initializer=self.inits)
        model = self._model(graph)
        model.doc_string = f"graphsub.fuzz.models.random_model(seed={seed}), opset {self.opset}"
        return model


# ---- op builders: one per ONNX op graphsub imports --------------------------------------

def _unary(op: str, **attrs: object) -> Callable[[_Builder], None]:
    def build(b: _Builder) -> None:
        y = b.one(op, [b.pick()], **attrs)
        if op in ("Sigmoid", "Tanh", "Erf"):
            b.bounded.add(y)
    return build


def _leaky_relu(b: _Builder) -> None:
    b.one("LeakyRelu", [b.pick()], alpha=float(b.pick_from([0.01, 0.1, 0.2])))


def _gelu(b: _Builder) -> None:
    attrs = {} if b.chance(0.4) else {"approximate": b.pick_from(["none", "tanh"])}
    b.one("Gelu", [b.pick()], **attrs)


def _exp(b: _Builder) -> None:
    b.one("Exp", [b.bound(b.pick())])


def _positive_unary(op: str) -> Callable[[_Builder], None]:
    def build(b: _Builder) -> None:
        b.one(op, [b.make_positive(b.pick())])
    return build


def _binary(op: str) -> Callable[[_Builder], None]:
    def build(b: _Builder) -> None:
        a = b.pick(lambda n: len(b.shape(n)) <= 4)
        if op == "Pow":
            b.one("Pow", [b.make_positive(a), _exponent(b, b.shape(a))])
            return
        c = b.operand(b.shape(a))
        if op == "Div":
            b.one("Div", [a, b.make_positive(c)])
            return
        b.one(op, [c, a] if b.chance(0.3) else [a, c])
    return build


def _exponent(b: _Builder, shape: Shape) -> str:
    if b.chance(0.6):
        return b.scalar(float(b.pick_from([2.0, 0.5, 3.0, -1.0, 1.5, -0.5])))
    return b.weight(b.partner(shape), low=-1.5, high=2.0)


def _sum(b: _Builder) -> None:
    a = b.pick(lambda n: len(b.shape(n)) <= 4)
    ins = [a] + [b.operand(b.shape(a)) for _ in range(int(b.rng.integers(0, 3)))]
    b.one("Sum", ins)


def _clip(b: _Builder) -> None:
    x = b.pick()
    lo, hi = sorted(b.rng.uniform(-2, 2, 2))
    low = b.scalar(float(lo)) if b.chance(0.7) else ""
    ins = [x, low, b.scalar(float(hi)) if b.chance(0.7) else ""]
    while ins[-1] == "" and len(ins) > 1:
        ins.pop()
    y = b.one("Clip", ins)
    if len(ins) == 3 and ins[1] and ins[2]:
        b.bounded.add(y)


def _cast(b: _Builder) -> None:
    x = b.pick()
    if b.chance(0.4):
        b.one("Cast", [x], to=TensorProto.FLOAT)
        return
    wide = b.node("Cast", [x], pool=False, to=TensorProto.DOUBLE)[0]
    b.one("Cast", [wide], to=TensorProto.FLOAT)


def _dropout(b: _Builder) -> None:
    x = b.pick()
    ins = [x] + ([b.scalar(float(b.pick_from([0.1, 0.5])))] if b.chance(0.4) else [])
    n_out = 2 if b.chance(0.3) else 1
    attrs = {"seed": 3} if b.chance(0.2) else {}
    outs = b.node("Dropout", ins, n_out=n_out, pool=False, **attrs)
    b.pool.append(outs[0])


def _softmax(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    attrs = {} if b.chance(0.2) else {"axis": b.axis(len(b.shape(x)))}
    b.bounded.add(b.one("Softmax", [x], **attrs))


def _log_softmax(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    attrs = {} if b.chance(0.2) else {"axis": b.axis(len(b.shape(x)))}
    b.one("LogSoftmax", [x], **attrs)


def _flatten(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    rank = len(b.shape(x))
    attrs = {} if b.chance(0.15) else {"axis": int(b.rng.integers(-rank, rank + 1))}
    b.one("Flatten", [x], **attrs)


def _transpose(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 2)
    rank = len(b.shape(x))
    if b.chance(0.2):
        b.one("Transpose", [x])
    else:
        b.one("Transpose", [x], perm=[int(p) for p in b.rng.permutation(rank)])


def _reshape_target(b: _Builder, shape: Shape) -> list[int]:
    """A new shape of the same size, with 0 (copy the input's dim) and -1 (inferred) used."""
    size = int(np.prod(shape))
    rank = int(b.rng.integers(1, 5))
    dims = []
    rest = size
    for _ in range(rank - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0 and d <= 8]
        d = b.pick_from(divisors)
        dims.append(d)
        rest //= d
    dims.append(rest)
    b.rng.shuffle(dims)
    out = [int(d) for d in dims]
    for i, d in enumerate(out):
        if i < len(shape) and shape[i] == d and b.chance(0.3):
            out[i] = 0
    if b.chance(0.5):
        out[int(b.rng.integers(len(out)))] = -1
    return out


def _reshape(b: _Builder) -> None:
    x = b.pick()
    b.one("Reshape", [x, b.ints(_reshape_target(b, b.shape(x)))])


def _squeeze(b: _Builder) -> None:
    x = b.pick(lambda n: 1 in b.shape(n), lambda: _unsqueezed(b))
    shape = b.shape(x)
    ones = [i for i, d in enumerate(shape) if d == 1]
    if b.chance(0.25):
        b.one("Squeeze", [x])
        return
    chosen = [i for i in ones if b.chance(0.6)] or ones[:1]
    axes = [i - len(shape) if b.chance(0.5) else i for i in chosen]
    b.one("Squeeze", [x, b.ints(axes)])


def _unsqueezed(b: _Builder) -> str:
    x = b.pick(lambda n: len(b.shape(n)) <= 4)
    rank = len(b.shape(x))
    return b.one("Unsqueeze", [x, b.ints([b.axis(rank + 1)])])


def _unsqueeze(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) <= 4)
    rank = len(b.shape(x))
    count = 1 if b.chance(0.7) else 2
    out_rank = rank + count
    positions = sorted(int(p) for p in b.rng.choice(out_rank, count, replace=False))
    axes = [p - out_rank if b.chance(0.5) else p for p in positions]
    b.rng.shuffle(axes)
    b.one("Unsqueeze", [x, b.ints(axes)])


def _concat(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    shape = b.shape(x)
    axis = b.axis(len(shape))
    k = axis % len(shape)

    def fits(n: str) -> bool:
        s = b.shape(n)
        return len(s) == len(shape) and all(s[i] == shape[i] for i in range(len(s)) if i != k)

    parts = [x]
    for _ in range(int(b.rng.integers(1, 3))):
        other = list(shape)
        other[k] = b.dim(1, 6)
        make = (lambda o=tuple(other): b.weight(o)) if b.chance(0.5) else \
            (lambda o=tuple(other): b.input(o))
        parts.append(b.pick(fits, make))
    b.rng.shuffle(parts)
    b.one("Concat", parts, axis=axis)


def _splittable(b: _Builder) -> tuple[str, int, int] | None:
    """A value with an axis of size 2 or more: the value, the axis, and the axis as the node
    names it (negative half the time)."""
    x = b.pick(lambda n: max(b.shape(n), default=0) >= 2)
    shape = b.shape(x)
    axes = [i for i, d in enumerate(shape) if d >= 2]
    if not axes:
        return None
    k = b.pick_from(axes)
    return x, k, k - len(shape) if b.chance(0.5) else k


def _split(b: _Builder) -> None:
    picked = _splittable(b)
    if picked is None:
        return
    x, k, axis = picked
    shape = b.shape(x)
    d = shape[k]
    equal = [n for n in (2, 3, 4) if d % n == 0]
    if equal and b.chance(0.4):
        parts = b.pick_from(equal)
        attrs: dict[str, Any] = {"axis": axis}
        if b.opset >= 18:
            attrs["num_outputs"] = parts
        b.node("Split", [x], n_out=parts, **attrs)
        return
    count = min(int(b.rng.integers(1, 3)), d - 1)
    cut = sorted(int(c) for c in b.rng.choice(np.arange(1, d), count, replace=False))
    sizes = [e - s for s, e in zip([0] + cut, cut + [d])]
    b.node("Split", [x, b.ints(sizes)], n_out=len(sizes), axis=axis)


def _slice(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    shape = b.shape(x)
    rank = len(shape)
    axes = _some_axes(b, rank)
    starts, ends, steps = [], [], []
    for a in axes:
        s, e, st = _slice_range(b, shape[a])
        starts.append(s)
        ends.append(e)
        steps.append(st)
    ins = [x, b.ints(starts), b.ints(ends)]
    omit_axes = axes == list(range(len(axes))) and b.chance(0.5)
    ins.append("" if omit_axes else b.ints([a - rank if b.chance(0.4) else a for a in axes]))
    if any(st != 1 for st in steps) or b.chance(0.3):
        ins.append(b.ints(steps))
    while not ins[-1]:
        ins.pop()
    b.one("Slice", ins)


def _some_axes(b: _Builder, rank: int) -> list[int]:
    """One or more distinct axes of a tensor of this rank, sorted."""
    return sorted(int(a) for a in b.rng.choice(rank, int(b.rng.integers(1, rank + 1)),
                                               replace=False))


def _slice_range(b: _Builder, d: int) -> tuple[int, int, int]:
    """start, end, step for an axis of size d, with a non-empty result, using negative
    indices, out-of-range ends and negative steps."""
    step = int(b.pick_from([1, 1, 1, 2, -1, -2]))
    start = int(b.rng.integers(d))
    if step > 0:
        end = int(b.rng.integers(start + 1, d + 1))
        end = INT64_MAX if end == d and b.chance(0.3) else end
    else:
        end = int(b.rng.integers(-1, start))
        if end == -1:
            end = INT64_MIN if b.chance(0.5) else -d - 1
    if b.chance(0.4):
        start -= d
    if 0 <= end < d and b.chance(0.3):
        end -= d
    return start, end, step


def _pad(b: _Builder) -> None:
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 4)
    shape = b.shape(x)
    rank = len(shape)
    modes = ["constant", "constant", "reflect", "edge"] + (["wrap"] if b.opset >= 19 else [])
    mode = b.pick_from(modes)
    axes = list(range(rank))
    if b.opset >= 18 and b.chance(0.4):
        axes = _some_axes(b, rank)
    begins: list[int] = []
    ends: list[int] = []
    for a in axes:
        limit = {"reflect": shape[a] - 1, "wrap": shape[a]}.get(mode, 2)
        for side in (begins, ends):
            p = int(b.rng.integers(0, min(limit, 2) + 1))
            if mode == "constant" and shape[a] > 2 and b.chance(0.1):
                p = -1
            side.append(p)
    ins = [x, b.ints(begins + ends)]
    if mode == "constant" and b.chance(0.5):
        ins.append(b.scalar(float(b.rng.uniform(-1, 1))))
    if axes != list(range(rank)):
        ins += [""] * (3 - len(ins))
        ins.append(b.ints([a - rank if b.chance(0.5) else a for a in axes]))
    attrs = {} if mode == "constant" and b.chance(0.5) else {"mode": mode}
    b.one("Pad", ins, **attrs)


def _reduce(op: str) -> Callable[[_Builder], None]:
    def build(b: _Builder) -> None:
        x = b.pick(lambda n: len(b.shape(n)) >= 1)
        rank = len(b.shape(x))
        axes = [int(a) for a in b.rng.choice(rank, int(b.rng.integers(0, rank + 1)), replace=False)]
        axes = [a - rank if b.chance(0.4) else a for a in axes]
        attrs: dict[str, object] = {}
        if b.chance(0.7):
            attrs["keepdims"] = int(b.rng.integers(2))
        axes_as_input = op == "ReduceSum" or b.opset >= 18
        if axes_as_input and b.chance(0.1):
            attrs["noop_with_empty_axes"] = 1
            axes = [] if b.chance(0.5) else axes
        if not axes:
            b.one(op, [x], **attrs)
        elif axes_as_input:
            b.one(op, [x, b.ints(axes)], **attrs)
        else:
            b.one(op, [x], axes=axes, **attrs)
    return build


def _matmul(b: _Builder) -> None:
    a = b.pick(lambda n: 1 <= len(b.shape(n)) <= 4)
    shape = b.shape(a)
    k = shape[-1]
    r = b.rng.random()
    if r < 0.55:
        w = b.weight((k, b.dim()), fan_in=k)
        b.one("MatMul", [a, w])
    elif r < 0.7 and len(shape) >= 2:
        b.one("MatMul", [a, b.weight((k,), fan_in=k)])
    elif r < 0.85 and len(shape) >= 2:
        batch = tuple(d if b.chance(0.7) else 1 for d in shape[:-2])
        w = b.weight(batch + (k, b.dim()), fan_in=k)
        b.one("MatMul", [a, w] if b.chance(0.7) else [a, b.input(batch + (k, b.dim()))])
    elif len(shape) >= 2:
        m = shape[-2]
        b.one("MatMul", [b.weight((b.dim(), m), fan_in=m), a])
    else:
        b.one("MatMul", [b.weight((b.dim(), k), fan_in=k), a])


def _gemm(b: _Builder) -> None:
    trans_a, trans_b = int(b.chance(0.3)), int(b.chance(0.4))
    a = b.pick_rank([2])
    rows, k = b.shape(a)[::-1] if trans_a else b.shape(a)
    n = b.dim()
    w = b.weight((n, k) if trans_b else (k, n), fan_in=k)
    attrs: dict[str, object] = {}
    if trans_a or b.chance(0.3):
        attrs["transA"] = trans_a
    if trans_b or b.chance(0.3):
        attrs["transB"] = trans_b
    if b.chance(0.3):
        attrs["alpha"] = float(b.pick_from([0.5, 2.0, -1.0]))
    ins = [a, w]
    if b.chance(0.75):
        c_shape = b.pick_from([(n,), (1, n), (rows, n), (rows, 1), (), (1, 1)])
        ins.append(b.weight(c_shape, fan_in=1) if b.chance(0.8) else b.input(c_shape))
        if b.chance(0.3):
            attrs["beta"] = float(b.pick_from([0.5, 2.0, 0.0]))
    b.one("Gemm", ins, **attrs)


def _conv_attrs(b: _Builder, hw: Shape, kernel: tuple[int, int]) -> dict[str, object]:
    """Strides, dilations and padding (explicit, asymmetric, or auto_pad) that leave an
    output of at least one pixel."""
    attrs: dict[str, Any] = {}
    strides = [int(b.pick_from([1, 1, 2])) for _ in range(2)]
    dilations = [int(b.pick_from([1, 1, 1, 2])) for _ in range(2)]
    if strides != [1, 1] or b.chance(0.2):
        attrs["strides"] = strides
    style = b.pick_from(["explicit", "explicit", "none", "same_upper", "same_lower", "valid"])
    if style.startswith("same"):
        dilations = [1, 1]  # onnxruntime does not support dilations with SAME padding
    if dilations != [1, 1] or b.chance(0.1):
        attrs["dilations"] = dilations
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if style == "explicit":
        pads = [int(b.rng.integers(0, s)) if s > 1 else 0 for s in span + span]
        if pads[0] == pads[2] and pads[1] == pads[3] and b.chance(0.5) and span[0] > 1:
            pads[2] = max(pads[2] - 1, 0)
        attrs["pads"] = pads
    elif style.startswith("same"):
        attrs["auto_pad"] = style.upper()
    elif style == "valid":
        attrs["auto_pad"] = "VALID"
    padded = [h + sum(attrs.get("pads", [0, 0, 0, 0])[i::2]) for i, h in enumerate(hw)]
    if not style.startswith("same") and any(p < s for p, s in zip(padded, span)):
        attrs.pop("dilations", None)  # the kernel fits (it is at most the input's size)
    return attrs


def _kernel(b: _Builder, hw: Shape) -> tuple[int, int]:
    kh = int(b.pick_from([k for k in (1, 2, 3, 3, 5) if k <= hw[0]] or [1]))
    widths = [k for k in (1, 2, 3) if k <= hw[1]] or [1]
    kw = kh if kh <= hw[1] and b.chance(0.7) else int(b.pick_from(widths))
    return kh, kw


def _conv_node(b: _Builder, x: str, out_channels: int | None = None,
               kernel: tuple[int, int] | None = None, attrs: dict[str, object] | None = None,
               groups: int = 1, bias: bool | None = None) -> str:
    """A Conv of x with a new Xavier weight (and maybe a bias); returns its output."""
    n, c, h, w = b.shape(x)
    kernel = kernel or _kernel(b, (h, w))
    attrs = dict(_conv_attrs(b, (h, w), kernel) if attrs is None else attrs)
    out_channels = out_channels or groups * b.dim(1, max(1, 8 // groups))
    fan_in = c // groups * kernel[0] * kernel[1]
    weight = b.weight((out_channels, c // groups) + kernel, fan_in=fan_in)
    ins = [x, weight]
    if bias if bias is not None else b.chance(0.5):
        ins.append(b.weight((out_channels,), fan_in=1))
    if groups != 1 or b.chance(0.1):
        attrs["group"] = groups
    if b.chance(0.3):
        attrs["kernel_shape"] = list(kernel)
    return b.one("Conv", ins, **attrs)


def _conv(b: _Builder) -> None:
    x = b.pick_image()
    c = b.shape(x)[1]
    groups = 1
    if b.chance(0.3):
        groups = int(b.pick_from([g for g in range(1, c + 1) if c % g == 0]))
    _conv_node(b, x, groups=groups)


def _batch_norm(b: _Builder) -> None:
    x = b.pick(lambda n: 2 <= len(b.shape(n)) <= 4 and b.shape(n)[1] >= 1, b.new_image)
    _batch_norm_node(b, x)


def _batch_norm_node(b: _Builder, x: str) -> str:
    c = b.shape(x)[1]
    params = [b.weight((c,), low=0.5, high=1.5), b.weight((c,), fan_in=1),
              b.weight((c,), fan_in=1), b.weight((c,), low=0.5, high=2.0)]
    attrs = {"epsilon": float(b.pick_from([1e-5, 1e-3]))} if b.chance(0.5) else {}
    return b.one("BatchNormalization", [x] + params, **attrs)


def _layer_norm(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    shape = b.shape(x)
    axis = b.axis(len(shape)) if b.chance(0.8) else None
    normalized = shape[axis if axis is not None else -1:]
    ins = [x, b.weight(tuple(normalized), low=0.5, high=1.5)]
    if b.chance(0.6):
        ins.append(b.weight(tuple(normalized), fan_in=1))
    attrs: dict[str, object] = {} if axis is None else {"axis": axis}
    if b.chance(0.3):
        attrs["epsilon"] = 1e-3
    b.one("LayerNormalization", ins, **attrs)


def _rms_norm(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) >= 1)
    shape = b.shape(x)
    axis = b.axis(len(shape)) if b.chance(0.8) else None
    normalized = shape[axis if axis is not None else -1:]
    attrs: dict[str, object] = {} if axis is None else {"axis": axis}
    if b.chance(0.3):
        attrs["epsilon"] = 1e-3
    b.one("RMSNormalization", [x, b.weight(tuple(normalized), low=0.5, high=1.5)], **attrs)


def _rotary_embedding(b: _Builder) -> None:
    """ONNX RotaryEmbedding (opset 23) as Llama-style exports write it: heads of 4-D
    (batch, heads, sequence, head) or 3-D values with num_heads, all or part of each head
    rotated in halves or interleaved pairs, by caches of cosines and sines per token or
    gathered by position ids (from caches of at least as many positions as tokens, which
    onnxruntime's kernel wants)."""
    x = b.pick(lambda n: len(b.shape(n)) in (3, 4) and b.shape(n)[-1] % 2 == 0,
               lambda: b.input((b.dim(1, 2), b.dim(1, 3), b.dim(1, 6), 2 * b.dim(1, 4))))
    shape = b.shape(x)
    attrs: dict[str, object] = {}
    if len(shape) == 4:
        batch, seq, head = shape[0], shape[2], shape[3]
    else:
        batch, seq, hidden = shape
        heads = b.pick_from([n for n in range(1, hidden + 1)
                             if hidden % n == 0 and hidden // n % 2 == 0])
        attrs["num_heads"], head = heads, hidden // heads
    rotary = head
    if b.chance(0.3):
        rotary = 2 * b.dim(1, head // 2)
        attrs["rotary_embedding_dim"] = rotary
    if b.chance(0.4):
        attrs["interleaved"] = 1
    ids: list[str] = []
    if b.chance(0.6):
        positions = b.dim(seq, seq + 8)
        cache_shape: Shape = (positions, rotary // 2)
        ids.append(b.constant(b.rng.integers(0, positions, (batch, seq)).astype(np.int64), "p"))
    else:
        cache_shape = (batch, seq, rotary // 2)
    angles = b.rng.uniform(-math.pi, math.pi, cache_shape)
    caches = [b.constant(f(angles).astype(np.float32), "r") for f in (np.cos, np.sin)]
    b.one("RotaryEmbedding", [x, *caches, *ids], **attrs)


def _pool(op: str) -> Callable[[_Builder], None]:
    def build(b: _Builder) -> None:
        x = b.pick_image()
        h, w = b.shape(x)[2:]
        kernel = _kernel(b, (h, w))
        attrs: dict[str, object] = {"kernel_shape": list(kernel)}
        style = b.pick_from(["explicit", "none", "same_upper", "same_lower", "valid"])
        # onnxruntime computes negative SAME pads when a stride exceeds the kernel
        strides = [int(b.pick_from([1, 2, 2])) if not style.startswith("same") or k >= 2 else 1
                   for k in kernel]
        if strides != [1, 1] or b.chance(0.3):
            attrs["strides"] = strides
        if style == "explicit":
            attrs["pads"] = [int(b.rng.integers(0, k)) for k in kernel + kernel]
        elif style != "none":
            attrs["auto_pad"] = style.upper()
        if op == "MaxPool" and b.chance(0.2) and style in ("explicit", "none"):
            span = [2 * (k - 1) + 1 for k in kernel]
            if all(s <= d for s, d in zip(span, (h, w))):
                attrs["dilations"] = [2, 2]
        if op == "AveragePool" and b.chance(0.5):
            attrs["count_include_pad"] = int(b.rng.integers(2))
        if b.chance(0.2) and "auto_pad" not in attrs:
            attrs["ceil_mode"] = 1
        b.one(op, [x], **attrs)
    return build


def _global_average_pool(b: _Builder) -> None:
    x = b.pick(lambda n: len(b.shape(n)) in (3, 4), b.new_image)
    b.one("GlobalAveragePool", [x])


# ---- motifs: what the rewrite rules rewrite ----------------------------------------------

def _matmuls_shared_input(b: _Builder) -> None:
    """x @ W1 and x @ W2 (maybe with biases, maybe combined): merge-matmuls rules."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    k = b.shape(x)[-1]
    ys = []
    for _ in range(int(b.rng.integers(2, 4))):
        y = b.one("MatMul", [x, b.weight((k, b.dim()), fan_in=k)])
        if b.chance(0.4):
            y = b.one("Add", [y, b.weight((b.shape(y)[-1],), fan_in=1)])
        ys.append(y)
    if b.chance(0.5):
        b.one("Concat", ys, axis=-1)


def _matmul_chain(b: _Builder) -> None:
    """Products of several factors: associativity rules, with 1-D and batched operands."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    for _ in range(int(b.rng.integers(2, 4))):
        shape = b.shape(x)
        if not shape:
            return
        k = shape[-1]
        r = b.rng.random()
        if r < 0.2 and len(shape) >= 2:
            w = b.weight((k,), fan_in=k)
        elif r < 0.35 and len(shape) == 3:
            w = b.weight((shape[0] if b.chance(0.5) else 1, k, b.dim()), fan_in=k)
        else:
            w = b.weight((k, b.dim()), fan_in=k)
        x = b.one("MatMul", [x, w])


def _matmul_distributive(b: _Builder) -> None:
    """x @ (W1 + W2), x @ W1 + x @ W2, x @ W + y @ W: distributivity rules and weight-only
    subgraphs."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    shape = b.shape(x)
    k, n = shape[-1], b.dim()
    w1, w2 = b.weight((k, n), fan_in=k), b.weight((k, n), fan_in=k)
    kind = int(b.rng.integers(3))
    if kind == 0:
        b.one("MatMul", [x, b.one("Add", [w1, w2])])
    elif kind == 1:
        b.one("Add", [b.one("MatMul", [x, w1]), b.one("MatMul", [x, w2])])
    else:
        y = b.input(shape) if b.chance(0.5) else b.one("Tanh", [x])
        b.one("Add", [b.one("MatMul", [x, w1]), b.one("MatMul", [y, w1])])


def _attention(b: _Builder) -> None:
    """softmax(q @ k^T * scale) @ v with projections of one input: transposes, scalar
    multiplications into weights, merged projections."""
    x = b.pick(lambda n: len(b.shape(n)) in (2, 3))
    d, h = b.shape(x)[-1], b.dim(2, 8)
    q, k, v = (b.one("MatMul", [x, b.weight((d, h), fan_in=d)]) for _ in range(3))
    rank = len(b.shape(q))
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scores = b.one("MatMul", [q, b.one("Transpose", [k], perm=perm)])
    scores = b.one("Mul", [scores, b.scalar(1 / math.sqrt(h))])
    if b.chance(0.5):
        b.one("MatMul", [b.one("Softmax", [scores], axis=-1), v])
        return
    # As the dynamo exporter writes a masked attention: an additive mask of 0 and -inf, the
    # softmax, and the guard that turns a fully masked query's NaN row into zeros. Most masks
    # leave every query a key (the guard can go); some mask a whole row (it must stay).
    queries, keys = b.shape(scores)[-2:]
    mask = np.where(b.rng.random((queries, keys)) < 0.4, -np.inf, 0.0).astype(np.float32)
    if b.chance(0.7):
        mask[:, 0] = 0.0
    masked = b.node("Add", [scores, b.constant(mask, "mask")], pool=False)[0]
    probs = b.node("Softmax", [masked], axis=-1, pool=False)[0]
    nan = b.node("IsNaN", [probs], pool=False)[0]
    b.one("MatMul", [b.one("Where", [nan, b.scalar(0.0), probs]), v])


def _attention_node(b: _Builder) -> None:
    """ONNX Attention (opset 23) on heads made from one input: (s, d) projected to q, k, v of
    (1, heads, s, size), grouped-query heads, causal or not, a boolean or additive mask."""
    x = b.pick(lambda n: len(b.shape(n)) == 2)
    s, d = b.shape(x)
    kv_heads, group, size = b.dim(1, 2), b.dim(1, 2), b.dim(2, 6)

    def heads(n: int) -> str:
        proj = b.one("MatMul", [x, b.weight((d, n * size), fan_in=d)])
        shaped = b.one("Reshape", [proj, b.ints([1, s, n, size])])
        return b.one("Transpose", [shaped], perm=[0, 2, 1, 3])

    ins = [heads(kv_heads * group), heads(kv_heads), heads(kv_heads)]
    attrs: dict[str, object] = {}
    if b.chance(0.4):
        attrs["is_causal"] = 1
    if b.chance(0.3):
        attrs["scale"] = float(b.rng.uniform(0.1, 1.0))
    if b.chance(0.4):
        if b.chance(0.5):
            keep = b.rng.random((s, s)) > 0.3
            keep[:, 0] = True  # every query sees a key (a fully masked one is tested apart)
            ins.append(b.constant(keep, "m"))
        else:
            ins.append(b.weight((s, s), fan_in=1))
    b.one("Attention", ins, **attrs)


def _conv_block(b: _Builder) -> None:
    """A convolution followed by a bias add, an activation, a batch norm or a scalar
    multiplication: the fusion rules."""
    x = b.pick_image()
    y = _conv_node(b, x)
    channels = b.shape(y)[1]
    for _ in range(int(b.rng.integers(1, 3))):
        kind = int(b.rng.integers(5))
        if kind == 0:
            shape = b.pick_from([(1, channels, 1, 1), (channels, 1, 1)])
            y = b.one("Add", [y, b.weight(shape, fan_in=1)])
        elif kind == 1:
            y = b.one(b.pick_from(["Relu", "Sigmoid", "Tanh"]), [y])
        elif kind == 2:
            y = _batch_norm_node(b, y)
        elif kind == 3:
            y = b.one("Mul", [y, b.scalar(float(b.rng.uniform(0.5, 2)))] if b.chance(0.7)
                      else [b.scalar(float(b.rng.uniform(0.5, 2))), y])
        else:
            y = b.one("Relu", [b.one("Add", [y, b.weight((1, channels, 1, 1), fan_in=1)])])


def _convs_shared_input(b: _Builder) -> None:
    """Convolutions of one input with the same attributes (maybe different kernels with SAME
    padding), concatenated, added or left apart: the merge rules."""
    x = b.pick_image()
    h, w = b.shape(x)[2:]
    out_channels = b.dim(1, 6)
    bias = b.chance(0.4)
    if b.chance(0.6) or min(h, w) < 3:
        kernel = _kernel(b, (h, w))
        attrs = _conv_attrs(b, (h, w), kernel)
        plans = [(kernel, attrs), (kernel, attrs)]
    elif b.chance(0.5):
        plans = [((1, 1), {"auto_pad": "SAME_UPPER"}), ((3, 3), {"auto_pad": "SAME_UPPER"})]
    else:  # the same SAME padding written as explicit pads
        plans = [((1, 1), {}), ((3, 3), {"pads": [1, 1, 1, 1]})]
    ys = [_conv_node(b, x, out_channels if b.chance(0.6) else None, k, a, bias=bias)
          for k, a in plans]
    kind = int(b.rng.integers(3))
    if kind == 0:
        b.one("Concat", ys, axis=b.pick_from([1, -3]))
    elif kind == 1 and b.shape(ys[0]) == b.shape(ys[1]):
        b.one("Add", ys)


def _convs_concat_grouped(b: _Builder) -> None:
    """Convolutions of two inputs of one shape with weights of one shape, concatenated on
    channels: a grouped convolution (TASO)."""
    x1 = b.pick_image()
    x2 = b.pick(lambda n: n != x1 and b.shape(n) == b.shape(x1), lambda: b.input(b.shape(x1)))
    h, w = b.shape(x1)[2:]
    kernel = _kernel(b, (h, w))
    attrs = _conv_attrs(b, (h, w), kernel)
    out_channels = b.dim(1, 6)
    bias = b.chance(0.4)
    ys = [_conv_node(b, x, out_channels, kernel, attrs, bias=bias) for x in (x1, x2)]
    b.one("Concat", ys, axis=1)


def _transpose_round_trip(b: _Builder) -> None:
    x = b.pick(lambda n: 2 <= len(b.shape(n)) <= 5)
    rank = len(b.shape(x))
    p = [int(i) for i in b.rng.permutation(rank)]
    y = b.one("Transpose", [x], perm=p)
    inverse = b.chance(0.6)
    q = [int(i) for i in (np.argsort(p) if inverse else b.rng.permutation(rank))]
    b.one("Transpose", [y], perm=q)


def _reshape_round_trip(b: _Builder) -> None:
    x = b.pick()
    shape = b.shape(x)
    y = b.one("Reshape", [x, b.ints(_reshape_target(b, shape))])
    if b.chance(0.3):
        y = b.one("Relu", [y])
    target = list(shape) if b.chance(0.6) else _reshape_target(b, shape)
    b.one("Reshape", [y, b.ints(target)])


def _weight_only(b: _Builder) -> None:
    """An op over initializers alone feeding a matmul or a convolution: folded at export."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    k = b.shape(x)[-1]
    n = b.dim()
    w = b.weight((n, k), fan_in=k)
    kind = int(b.rng.integers(3))
    if kind == 0:
        w = b.one("Transpose", [w], perm=[1, 0])
    elif kind == 1:
        w = b.one("Transpose", [b.one("Mul", [w, b.scalar(0.5)])])
    else:
        w = b.one("Transpose", [b.one("Add", [w, b.weight((n, k), fan_in=k)])])
    b.one("MatMul", [x, w])


def _identity_constants(b: _Builder) -> None:
    """Element-wise ops with constants of ones or zeros (the remove-* and *-by-ones rules),
    in shapes that broadcast the result larger as well as ones that do not."""
    x = b.pick(lambda n: len(b.shape(n)) <= 3)
    shape = b.partner(b.shape(x)) if b.chance(0.6) else b.shape(x)
    kind = int(b.rng.integers(5))
    if kind == 0:
        ones = b.scalar(1.0, shape)
        b.one("Mul", [x, ones] if b.chance(0.5) else [ones, x])
    elif kind == 1:
        zeros = b.scalar(0.0, shape)
        b.one("Add", [x, zeros] if b.chance(0.5) else [zeros, x])
    elif kind == 2:
        b.one("Sub", [x, b.scalar(0.0, shape)])
    elif kind == 3:
        b.one("Div", [x, b.scalar(1.0, shape)])
    else:
        b.one("Mul", [x, b.scalar(1.0)])


def _split_concat(b: _Builder) -> None:
    """A split whose parts are concatenated again, and a concatenation split again, at the
    seam or not, in order or not: concat-of-split and split-of-concat."""
    picked = _splittable(b)
    if picked is None:
        return
    x, k, axis = picked
    shape = b.shape(x)
    if b.chance(0.5):
        cut = int(b.rng.integers(1, shape[k]))
        parts = b.node("Split", [x, b.ints([cut, shape[k] - cut])], n_out=2, axis=axis)
        b.one("Concat", parts if b.chance(0.7) else parts[::-1], axis=axis)
        return
    other = list(shape)
    other[k] = b.dim(1, 4)
    y = b.one("Concat", [x, b.input(tuple(other))], axis=axis)
    sizes = [shape[k], other[k]] if b.chance(0.7) else [other[k], shape[k]]
    b.node("Split", [y, b.ints(sizes)], n_out=2, axis=axis)


def _unit_reshape_transpose(b: _Builder) -> None:
    """A reshape that inserts or removes dims of size 1, then a transpose, then another
    transpose (transpose-through-unit-reshape, fold-transpose-pair)."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    shape = list(b.shape(x))
    target = list(shape)
    for _ in range(int(b.rng.integers(1, 3))):
        target.insert(int(b.rng.integers(len(target) + 1)), 1)
    y = b.one("Reshape", [x, b.ints(target)])
    perm = [int(p) for p in b.rng.permutation(len(target))]
    y = b.one("Transpose", [y], perm=perm)
    if b.chance(0.5):
        b.one("Transpose", [y], perm=[int(p) for p in np.argsort(perm)])


def _opaque(b: _Builder) -> None:
    """An op graphsub does not model, between modelled ones."""
    x = b.pick(lambda n: 1 <= len(b.shape(n)) <= 3)
    shape = b.shape(x)
    kind = b.pick_from(["Expand", "Where", "Tile", "Gather", "Shape", "Abs", "Max"])
    if kind == "Expand":
        b.one("Expand", [x, b.ints([b.dim(1, 3)] + [d if d != 1 else b.dim(1, 3) for d in shape])])
    elif kind == "Where":
        cond = b.node(b.pick_from(["Greater", "Equal"]), [x, b.scalar(0.0) if b.chance(0.7) else x],
                      pool=False)[0]
        b.one("Where", [cond, x, b.operand(shape)])
    elif kind == "Tile":
        b.one("Tile", [x, b.ints([b.dim(1, 2) for _ in shape])])
    elif kind == "Gather":
        axis = b.axis(len(shape))
        d = shape[axis]
        indices = [int(i) - (d if b.chance(0.3) else 0) for i in b.rng.integers(0, d, b.dim(1, 3))]
        b.one("Gather", [x, b.ints(indices)], axis=axis)
    elif kind == "Shape":
        target = b.node("Shape", [x], pool=False)[0]
        b.one("Expand", [b.operand(shape), target])
    elif kind == "Abs":
        b.one("Abs", [x])
    else:
        b.one("Max", [x, b.operand(shape)])


Builder = Callable[[_Builder], None]


def _builders(opset: int) -> dict[str, tuple[float, Builder]]:
    """Every builder with its weight; ops an opset lacks are left out."""
    table: dict[str, tuple[float, Builder]] = {
        "Relu": (2, _unary("Relu")), "Sigmoid": (1.5, _unary("Sigmoid")),
        "Tanh": (1.5, _unary("Tanh")), "Neg": (1, _unary("Neg")), "Erf": (1, _unary("Erf")),
        "Identity": (1, _unary("Identity")), "LeakyRelu": (1, _leaky_relu), "Exp": (1, _exp),
        "Log": (1, _positive_unary("Log")), "Sqrt": (1, _positive_unary("Sqrt")),
        "Reciprocal": (1, _positive_unary("Reciprocal")),
        "Add": (3, _binary("Add")), "Sub": (2, _binary("Sub")), "Mul": (3, _binary("Mul")),
        "Div": (1.5, _binary("Div")), "Pow": (1, _binary("Pow")), "Sum": (1, _sum),
        "Clip": (1, _clip), "Cast": (1, _cast), "Dropout": (1, _dropout),
        "Softmax": (1.5, _softmax), "LogSoftmax": (1, _log_softmax), "Flatten": (1.5, _flatten), "Transpose": (2, _transpose),
        "Reshape": (2, _reshape), "Squeeze": (1, _squeeze), "Unsqueeze": (1, _unsqueeze),
        "Concat": (2, _concat), "Split": (1.5, _split), "Slice": (1.5, _slice),
        "Pad": (1.5, _pad), "ReduceSum": (1, _reduce("ReduceSum")),
        "ReduceMean": (1, _reduce("ReduceMean")), "ReduceMax": (1, _reduce("ReduceMax")),
        "MatMul": (4, _matmul), "Gemm": (2, _gemm), "Conv": (4, _conv),
        "BatchNormalization": (1.5, _batch_norm), "MaxPool": (1, _pool("MaxPool")),
        "AveragePool": (1, _pool("AveragePool")), "GlobalAveragePool": (1, _global_average_pool),
        "matmuls-shared-input": (3, _matmuls_shared_input), "matmul-chain": (3, _matmul_chain),
        "matmul-distributive": (2, _matmul_distributive), "attention": (1, _attention),
        "conv-block": (3, _conv_block), "convs-shared-input": (3, _convs_shared_input),
        "convs-concat-grouped": (1.5, _convs_concat_grouped),
        "transpose-round-trip": (1.5, _transpose_round_trip),
        "reshape-round-trip": (1.5, _reshape_round_trip), "weight-only": (1.5, _weight_only),
        "identity-constants": (1.5, _identity_constants), "split-concat": (1.5, _split_concat),
        "unit-reshape-transpose": (1.5, _unit_reshape_transpose),
    }
    if opset >= 17:
        table["LayerNormalization"] = (1.5, _layer_norm)
    if opset >= 20:
        table["Gelu"] = (2, _gelu)
    if opset >= 23:
        table["RMSNormalization"] = (1.5, _rms_norm)
        table["Attention"] = (1.5, _attention_node)
        table["RotaryEmbedding"] = (1, _rotary_embedding)
    return table
