"""Differential fuzzing in CI: a seeded campaign of random ONNX models through every graphsub
path (graphsub.fuzz), plus unit tests of the generator and the minimizer.

The campaign is split into chunks that pytest-xdist spreads over workers. Models, inputs and
the search bounds (k, budget, node limit) are fixed, so a red run names seeds that reproduce:
`python bench/fuzz.py --count 1 --seed S` checks one again and minimizes its failures.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphsub.ops  # noqa: F401  (registers the ops whose ONNX importers are listed below)
from graphsub.fuzz.classes import CLASSES, OLD_OPSETS, model_class, with_class
from graphsub.fuzz.classes import random_model as random_model_in_class
from graphsub.fuzz.differential import DEFAULT_STAGES, Reference, check_model
from graphsub.fuzz.minimize import minimize, minimize_rules
from graphsub.fuzz.models import (OPAQUE_OPS, OPSETS, InvalidModel, fuzz_sizes, generate,
                                  other_sizes, random_inputs, random_model, run_reference,
                                  validate)
from graphsub.ops.base import importable_onnx_ops
from graphsub.ops.control_flow import captured_names

CHUNKS = 4
MODELS_PER_CHUNK = 60
FIRST_SEED = 100_000
#: Bounds that stop most searches before the time limit, so results do not depend on the
#: machine's speed (MCTS alone may still stop on time).
SEARCH_OPTIONS = {"k": 2, "budget": 5, "node_limit": 500}
TIME_LIMIT = 0.3
#: Statuses that fail the campaign (timeouts depend on the machine's load: bench/fuzz.py
#: reports them).
FAILING = ("wrong", "error", "refused")
COVERAGE_SEEDS = 300
#: The share of the campaign's models with a size symbol (checked at three sizes of it).
SYMBOLIC = 0.3
#: The share made into a class people deploy (control flow, float16, mixed precision, QDQ).
CLASSES_SHARE = 0.2


# ---- the campaign ---------------------------------------------------------------------------

def _stages(seed: int) -> tuple[str, ...]:
    """The first model of each chunk also goes through optimize_model (it takes seconds)."""
    return DEFAULT_STAGES + (("pipeline",) if (seed - FIRST_SEED) % MODELS_PER_CHUNK == 0 else ())


# the first chunk runs in the fast suite, the others with the slow tests (about 2 min each)
@pytest.mark.parametrize("chunk", [0] + [pytest.param(c, marks=pytest.mark.slow)
                                         for c in range(1, CHUNKS)])
def test_fuzz_campaign(chunk: int) -> None:
    found = []
    start = FIRST_SEED + chunk * MODELS_PER_CHUNK
    for seed in range(start, start + MODELS_PER_CHUNK):
        model = random_model_in_class(seed, CLASSES_SHARE, symbolic=SYMBOLIC)
        report = check_model(model, seed=seed, time_limit=TIME_LIMIT, stages=_stages(seed),
                             search_options=SEARCH_OPTIONS)
        assert report.outcomes, f"seed {seed}: nothing was checked ({report.notes})"
        found += [f"seed {seed} (opset {model.opset_import[0].version}, "
                  f"{len(model.graph.node)} nodes) {o.stage} {o.status}: {o.message}"
                  for o in report.outcomes if o.status in FAILING]
    assert not found, (f"{len(found)} failing outcomes; rerun and minimize one with "
                       "python bench/fuzz.py --count 1 --seed S:\n" + "\n".join(found))


# ---- the generator ----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", OPSETS)
def test_generated_models_are_valid(opset: int) -> None:
    for seed in range(15):
        model = random_model(seed, opset=opset)
        assert model.opset_import[0].version == opset
        onnx.checker.check_model(model, full_check=True)
        validate(model, seed)  # runs in onnxruntime, finite outputs of the declared shapes
        assert 3 <= len(model.graph.node) <= 25


def test_symbolic_models_run_at_every_size_of_their_symbol() -> None:
    symbolic = 0
    for seed in range(12):
        model = random_model(seed, symbolic=1.0)
        sizes = fuzz_sizes(model)
        if not sizes:
            continue
        symbolic += 1
        assert set(sizes) == {"s"}
        dims = [d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim]
        assert "s" in dims
        for other in [sizes, *other_sizes(model)]:
            outputs = run_reference(model, random_inputs(model, seed, other))
            assert all(np.all(np.isfinite(v)) for v in outputs.values())
        reference = Reference.of(model, seed)
        assert len(reference.feeds) == 4  # two trials at the built size, one at each other
        assert len({tuple(a.shape for a in f.values()) for f in reference.feeds}) == 3
    assert symbolic >= 6
    assert not fuzz_sizes(random_model(0))


#: The operators onnxruntime's quantizers write, which the classes make rather than the plain
#: generator (each class's test below checks its own); MatMulNBits, which needs weights wider
#: than a fuzzed model's, is tested in tests/ops/test_quantization.py and tests/test_quantized.py.
QUANTIZER_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                 "ConvInteger", "QLinearMatMul", "QLinearConv", "com.microsoft.MatMulNBits"}
#: What each quantizing class must write.
CLASS_OPS = {"qdq": {"QuantizeLinear", "DequantizeLinear"},
             "dynamic": {"DynamicQuantizeLinear"}, "qoperator": {"QuantizeLinear"}}


def test_the_quantizing_classes_write_every_integer_operator() -> None:
    seen: set[str] = set()
    for name in ("qdq", "dynamic", "qoperator"):
        for seed in range(12):
            made = _made(random_model(seed), name, seed)
            if made is not None:
                seen |= {n.op_type for n in made.graph.node}
    assert QUANTIZER_OPS - {"com.microsoft.MatMulNBits"} <= seen


@pytest.mark.parametrize("name", CLASSES)
def test_each_class_people_deploy_is_generated_valid(name: str) -> None:
    """Control flow reading outer values, float16, mixed precision and quantized models (QDQ,
    dynamic, QOperator), made by the tools that make them in the field, pass the checker and run (with_class validates)."""
    made = 0
    for seed in range(12):
        try:
            model = with_class(random_model(seed), name, np.random.default_rng(seed))
        except InvalidModel:
            continue
        made += 1
        assert model_class(model) == name
        ops = {n.op_type for n in model.graph.node}
        if name == "control-flow":
            assert ops == {"If"} and captured_names(model.graph.node[0])
        elif name == "opaque-values":
            assert {"SplitToSequence", "ConcatFromSequence", "Optional", "Equal"} <= ops
            assert any(i.type.tensor_type.elem_type == TensorProto.STRING
                       for i in model.graph.input)
        elif name == "old-opset":
            assert model.opset_import[0].version in OLD_OPSETS
        elif name in CLASS_OPS:
            assert CLASS_OPS[name] <= ops
        else:
            assert any(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer) or \
                any(a.i == TensorProto.FLOAT16 for n in model.graph.node for a in n.attribute
                    if n.op_type == "Cast" and a.name == "to")
    assert made >= 6, f"only {made} of 12 models could be made {name}"


def test_a_quantized_models_reference_allows_one_quantization_step() -> None:
    """graphsub's own evaluators sum the float operators between a dequantization and a
    quantization in another order than onnxruntime; a value on a rounding boundary then
    lands one step away (seen in campaign 28000), which is not a wrong rewrite."""
    model, quantized = next((m, q) for seed in range(20) for m in [random_model(seed)]
                            for q in [_made(m, "qdq", seed)] if q is not None)
    scales = [float(np.max(numpy_helper.to_array(t))) for t in quantized.graph.initializer
              if t.name.endswith("_scale")]
    reference = Reference.of(quantized, seed=0)
    assert reference.tolerance.atol == pytest.approx(1.01 * max(scales))
    assert Reference.of(model, seed=0).tolerance.atol < 1e-5


def test_a_dynamically_quantized_models_reference_allows_one_step_of_its_run_time_scale() -> None:
    """A dynamic quantization's scale is computed at run time: the step is read from a run
    (activation scale x weight scale, times the largest integer weight)."""
    model, quantized = next((m, q) for seed in range(20) for m in [random_model(seed)]
                            for q in [_made(m, "dynamic", seed)] if q is not None)
    reference = Reference.of(quantized, seed=0)
    assert reference.tolerance.atol > 1e-4
    assert Reference.of(model, seed=0).tolerance.atol < 1e-5


def _made(model, name: str, seed: int):
    try:
        return with_class(model, name, np.random.default_rng(seed))
    except InvalidModel:
        return None


def test_generator_is_deterministic_per_seed() -> None:
    for seed in (0, 1, 17, 12345):
        assert random_model(seed).SerializeToString() == random_model(seed).SerializeToString()
    assert random_model(1).SerializeToString() != random_model(2).SerializeToString()


def test_generator_covers_every_imported_op_and_opaque_ones() -> None:
    ops: Counter[str] = Counter()
    discards = 0
    for seed in range(COVERAGE_SEEDS):
        model, stats = generate(seed)
        ops.update(n.op_type for n in model.graph.node)
        discards += stats.discards
    missing = set(importable_onnx_ops()) - set(ops) - QUANTIZER_OPS
    assert not missing, f"never generated: {sorted(missing)}"
    assert set(OPAQUE_OPS) & set(ops)
    assert discards < COVERAGE_SEEDS * 0.1, f"{discards} discarded models"


def test_generator_uses_each_opsets_form_of_reduce_axes() -> None:
    """ReduceMean/ReduceMax take axes as an attribute before opset 18, as an input from 18."""
    seen = set()
    for seed in range(200):
        model = random_model(seed)
        opset = model.opset_import[0].version
        for n in model.graph.node:
            if n.op_type in ("ReduceMean", "ReduceMax"):
                as_input = len(n.input) > 1
                as_attribute = any(a.name == "axes" for a in n.attribute)
                assert not (as_input and opset < 18) and not (as_attribute and opset >= 18)
                seen.add((opset >= 18, as_input or as_attribute))
    assert {(False, True), (True, True)} <= seen


# ---- the minimizer ------------------------------------------------------------------------------

def _has(op: str):
    return lambda model: any(n.op_type == op for n in model.graph.node)


def test_minimizer_shrinks_to_the_node_a_predicate_needs() -> None:
    seed = next(s for s in range(100) if _has("Conv")(random_model(s))
                and len(random_model(s).graph.node) >= 10)
    model = random_model(seed)
    small = minimize(model, _has("Conv"), max_seconds=60, seed=seed)
    assert [n.op_type for n in small.graph.node] == ["Conv"]
    assert len(small.graph.output) == 1
    validate(small, seed)


def test_minimizer_returns_the_model_when_nothing_smaller_fails() -> None:
    model = random_model(3)
    data = model.SerializeToString()
    assert minimize(model, lambda m: m.SerializeToString() == data, max_seconds=30) == model


def test_minimize_rules_finds_the_culprits() -> None:
    rules = [f"r{i}" for i in range(20)]
    assert minimize_rules(rules, lambda rs: "r7" in rs and "r13" in rs) == ["r7", "r13"]


# ---- the differential runner ----------------------------------------------------------------

def _relu_matmul_model() -> onnx.ModelProto:
    values = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    w = numpy_helper.from_array(values, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_stage_that_raises_does_not_stop_the_others() -> None:
    report = check_model(_relu_matmul_model(), algorithms=["greedy"], rules=[object()],
                         time_limit=0.2)
    status = {o.stage: o.status for o in report.outcomes}
    assert status == {"roundtrip": "equal", "search:greedy": "error", "fission": "equal",
                      "numpy": "equal", "torch-cpu": "equal"}
    assert report.outcome("search:greedy").message


def test_reference_comparison_flags_values_shapes_and_interfaces() -> None:
    model = _relu_matmul_model()
    ref = Reference.of(model, seed=0)
    assert ref.compare(lambda feeds: run_reference(model, dict(feeds))) == ("equal", "")
    shifted = ref.compare(lambda feeds: {"z": run_reference(model, dict(feeds))["z"] + 1})
    assert shifted[0] == "wrong"
    assert ref.compare(lambda feeds: {"z": np.zeros((3, 2), np.float32)})[0] == "wrong"
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.output[0].name = "other"
    renamed.graph.node[1].output[0] = "other"
    status, message = ref.compare_onnx(renamed.SerializeToString())
    assert status == "wrong" and "outputs changed" in message


def test_a_half_precision_output_is_judged_by_its_own_rounding() -> None:
    """Seed 100130's mixed-precision model has an output that cancels (0.0033 from operands
    near 0.2): the model itself is 0.8% off its float32 computation there, and a transposed
    product rounds one operand the other way (3.6% of the value). Judged against the float32
    computation, that is the model's own rounding; a weight off by 2% is still wrong."""
    import graphsub
    from graphsub.onnx_io import to_onnx_bytes
    from graphsub.rules import apply_match, builtin_rules, find_matches

    model, _ = generate(100130, symbolic=SYMBOLIC)
    pick = np.random.default_rng([100130, 1])  # the class's stream, as classes.generate draws
    pick.random(), pick.integers(len(CLASSES))  # it (the class itself is named here)
    model = with_class(model, "mixed-precision", pick)
    reference = Reference.of(model, seed=100130)
    assert reference.truth and reference.noise
    graph = graphsub.load(model)
    rule = {r.name: r for r in builtin_rules()}["matmul-as-transposed-product"]
    verdicts = [reference.compare_onnx(to_onnx_bytes(apply_match(graph, m)))[0]
                for m in find_matches(graph, rule)]
    assert verdicts and set(verdicts) == {"equal"}
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    weight = max(broken.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    values = numpy_helper.to_array(weight)
    weight.CopyFrom(numpy_helper.from_array((values * 1.02).astype(values.dtype), weight.name))
    assert reference.compare_onnx(broken.SerializeToString())[0] == "wrong"


def test_a_model_onnxruntimes_optimizer_cannot_load_is_not_generated() -> None:
    """onnxruntime 1.32's QDQ propagation fails on an int8 QuantizeLinear/DequantizeLinear
    pair before a Slice at opset 23 (campaign 30000, seed 31822): with its graph
    optimizations on, no one runs such a model, so the generator does not keep it."""
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "s")
    zero = numpy_helper.from_array(np.array(-128, np.int8), "z")
    bounds = [numpy_helper.from_array(np.array([v], np.int64), n)
              for n, v in (("st", -5), ("en", 2 ** 63 - 1), ("ax", -2))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Slice", ["d", "st", "en", "ax"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 2, 7, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 2, 5, 3])], initializer=[scale, zero, *bounds])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(InvalidModel, match="onnxruntime's optimizer"):
        validate(model)


@pytest.mark.parametrize("name", ["opaque-values", "old-opset"])
def test_models_with_opaque_values_and_old_opsets_survive_every_stage(name: str) -> None:
    """Sequences, optionals and words around a random model, and models written for opsets
    7-12 (kept at their opset where onnx's converter would change their meaning): import,
    search, export and graphsub's own evaluator agree with onnxruntime on the original."""
    found, checked = [], 0
    for seed in range(8):
        try:
            model = with_class(random_model(seed), name, np.random.default_rng(seed))
        except InvalidModel:
            continue
        checked += 1
        report = check_model(model, seed=seed, time_limit=1, algorithms=["greedy"],
                             stages=("roundtrip", "search", "numpy"))
        found += [f"seed {seed} {o.stage} {o.status}: {o.message}" for o in report.outcomes
                  if o.status in FAILING]
    assert checked >= 4 and not found, "\n".join(found)
