"""graphsub's rewrites spliced into dynamo's own graph: edit the captured program, don't
rebuild it.

graphsub reads a captured graph at the ATen level and rewrites parts of it in its own IR.
What it hands to inductor is dynamo's graph itself, copied with everything dynamo attached
to it (the placeholders' sources, which say which inputs are static for CUDA graphs; the
graph's compile id and parameter sources), with only the nodes of the kept rewrites
replaced, the way inductor's pattern matcher edits a graph: every other node, the in-place
writes where the program makes them (a static cache's `index_copy_`), strides, dtypes and
symbolic sizes reach inductor as captured. Rebuilt from graphsub's IR instead, an unchanged
graph ran at two thirds of inductor's speed on an H200, and its writes, moved to the end,
turned CUDA graphs off.

A part's rewrite is spliced as a region (`plan_region`): the nodes of the rewritten part
that are not the original's (added, or reading other inputs), each reading values the
program already computes (a dynamo node whose value is exactly the original's: fx_origins)
or other nodes of the region. A region value that takes the place of an original one
replaces every use of that original's dynamo node; an original value the region needs and
the program does not have as one node (the product inside a `linear`) is computed again in
the region; a value of the rewrite read by nodes it kept, which the program has no node
for, brings those readers into the region. The region is lowered by graphsub's torch
backend (its operators' lowerings) and its nodes copied into dynamo's graph; its weights
computed once (merged projections' concatenations) are constants of the graph, computed
when it is built, never per call. What the replaced nodes alone read is removed, the graph
is sorted again where a region reads what came later (as inductor's pattern matcher does),
and nothing else moves.

`whole=True` splices the whole rewritten part instead (every operator graphsub's, weights as
its own constants): graphsub's own program for the part, without inductor, where its library
kernels (oneDNN's linear layers on the CPU) are the fastest way to run it.
"""

from __future__ import annotations

import itertools
from functools import partial
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx as fx

from graphsub.errors import GraphsubError
from graphsub.frontends.fx_import import SIZE_CARRIER_DTYPE
from graphsub.frontends.fx_origins import ORIGIN
from graphsub.frontends.side_effects import possibly_written
from graphsub.ir.graph import Graph, Value, make_node
from graphsub.ir.node import Node
from graphsub.ops import get_op
from graphsub.targets.torch.lowering import torch_dtype
from graphsub.tensors.symbolic import symbols_in, symbols_in_value


#: The largest value (elements) the splice copies to read it as it was before the graph
#: writes into it: a counter or a position, never a cache.
SNAPSHOT_LIMIT = 4096


class SpliceError(GraphsubError):
    """A rewrite that cannot be spliced into the captured graph (the part stays as
    captured); the message says why."""


@dataclass(frozen=True)
class Rewrite:
    """One part's rewrite: the part as converted (`original`), what graphsub keeps in its
    place (`rewritten`, made from it by substitutions, so that nodes it did not touch keep
    their ids), and for values of the original the traced ATen node whose value each is
    (fx_import.Converted.sources, the part's inputs as the nodes of `owner`, the traced
    graph the part was cut from): where that node is a node of dynamo's graph
    (`meta[fx_origins.ORIGIN]`), the splice reads or replaces that; where it is not (a value
    inside the decomposition of one of dynamo's operators: the additive mask SDPA makes of a
    boolean one), the ATen operators computing it from values that are, are copied.
    `reference`: the sizes at which library kernels are chosen where the part has size
    symbols."""

    original: Graph
    rewritten: Graph
    sources: Mapping[Value, fx.Node]
    owner: fx.GraphModule
    reference: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Region:
    """What a rewrite adds to the program: `graph`, whose inputs are values the program
    computes (`reads`: the original value each input is) and whose outputs take the places
    of original values (`replaces`, in order)."""

    graph: Graph
    reads: tuple[Value, ...]
    replaces: tuple[Value, ...]


def plan_region(rewrite: Rewrite, readable: Callable[[Value], bool],
                replaceable: Callable[[Value], bool], whole: bool = False) -> Region:
    """The region splicing `rewrite` adds (see the module's docstring). `readable(v)`: the
    program has the original's value `v`, or can compute it from what it has, where the
    region runs; `replaceable(v)`: the program has a node whose value is `v`, whose readers
    can read the region's value instead. Raises SpliceError where the part's interface
    cannot be kept."""
    original, rewritten = rewrite.original, rewrite.rewritten
    live, before = rewritten.nodes, original.nodes
    users = rewritten.users()

    def kept(nid: int) -> bool:
        return nid in before and (live[nid] is before[nid] or live[nid] == before[nid])

    changed = {nid for nid, node in live.items() if node.op != "input"
               and (whole or not kept(nid))}
    # Readers the rewrite kept of a changed value the program has no node for are changed
    # with it (emitted, and their own values redirected).
    pending = list(changed)
    while pending:
        nid = pending.pop()
        if nid not in before or whole:
            continue
        for reader, position in users.get(nid, ()):
            if reader not in changed and not replaceable(live[reader].inputs[position]):
                changed.add(reader)
                pending.append(reader)
    replaces: dict[Value, Value] = {}
    for k, (was, now) in enumerate(zip(original.outputs, rewritten.outputs)):
        same = was == now and kept(was.node)
        if same and (not whole or not replaceable(was)):
            continue  # (a value written into in place keeps its node, even in a whole part)
        if not replaceable(was):
            raise SpliceError(f"output {k} of the part is no single node of the captured "
                              f"graph that can be read in another's place")
        replaces[was] = now
    for nid in sorted(changed):
        if nid not in before or whole:
            continue
        for reader, position in users.get(nid, ()):
            value = live[reader].inputs[position]
            if reader not in changed:
                replaces.setdefault(value, value)
    emitted, reads = _inputs_of(rewritten, changed, set(replaces.values()), readable, whole)
    return _region(rewritten, emitted, reads + _size_reads(rewritten, emitted, reads, readable),
                   replaces)


def _size_reads(rewritten: Graph, emitted: set[int], reads: Sequence[Value],
                readable: Callable[[Value], bool]) -> list[Value]:
    """Inputs of the part the region reads for their sizes alone: where the region
    computes with a size symbol that no value it reads has as a dimension (a program reads
    each symbol from its inputs' shapes), one of the part's inputs that has it."""
    live = rewritten.nodes
    needed = set().union(*(symbols_in(t.shape) | symbols_in_value(live[nid].attrs)
                           for nid in emitted for t in live[nid].outputs),
                         *(symbols_in(rewritten.type_of(v).shape) for v in reads))
    have = {d.name for v in reads for d in rewritten.type_of(v).shape
            if not isinstance(d, int) and d.is_Symbol}
    extra: list[Value] = []
    for name in sorted(needed - have):
        source = next((Value(nid, 0) for nid in rewritten.inputs
                       if any(not isinstance(d, int) and d.is_Symbol and d.name == name
                              for d in live[nid].outputs[0].shape)
                       and readable(Value(nid, 0))), None)
        if source is None:
            raise SpliceError(f"the region computes with the size {name}, which no input of "
                              f"the part it can read has")
        if source not in extra:
            extra.append(source)
        have |= {d.name for d in live[source.node].outputs[0].shape
                 if not isinstance(d, int) and d.is_Symbol}
    return extra


def _inputs_of(rewritten: Graph, changed: set[int], results: set[Value],
               readable: Callable[[Value], bool], whole: bool
               ) -> tuple[set[int], list[Value]]:
    """The nodes to emit (the changed ones, and copies of those whose values they need and
    the program has no node for) and the values read from the program, in a fixed order.
    A weight is read from the program (a parameter, not copied) unless a constant computed
    from it once is in the region (a merged projection's weight), or the whole part is
    graphsub's."""
    live = rewritten.nodes
    folded = rewritten.weight_only()
    emitted = set(changed)
    reads: dict[Value, None] = {}
    # (a value the region needs, the emitted node reading it; None: a region output)
    wanted: list[tuple[Value, int | None]] = [(v, nid) for nid in changed
                                              for v in live[nid].inputs]
    wanted += [(v, None) for v in results]
    while wanted:
        value, reader = wanted.pop()
        source = live[value.node]
        if value.node in emitted or value in reads:
            continue
        if source.op == "input":
            if not readable(value):
                raise SpliceError(f"input {source.attrs['name']} of the part is no single "
                                  f"node of the captured graph")
            reads[value] = None
        elif source.op == "weight":
            if whole or not readable(value) or reader in folded:
                emitted.add(value.node)
            else:
                reads[value] = None
        elif readable(value) and not whole:
            reads[value] = None
        else:
            emitted.add(value.node)
            wanted += [(v, value.node) for v in source.inputs]
    return emitted, sorted(reads, key=lambda v: (v.node, v.index))


def _region(rewritten: Graph, emitted: set[int], reads: Sequence[Value],
            replaces: Mapping[Value, Value]) -> Region:
    """The region's graph: the emitted nodes, an input for each value read, an output for
    each value replaced."""
    live = rewritten.nodes
    next_id = rewritten.next_id
    nodes: dict[int, Node] = {}
    read_as: dict[Value, Value] = {}
    for k, value in enumerate(reads):
        t = rewritten.type_of(value)
        if t.is_opaque:
            raise SpliceError(f"the part reads a value of type {t}, which is no tensor")
        nodes[next_id] = make_node("input", (), (), {"name": f"read{k}", "shape": t.shape,
                                                      "dtype": t.dtype})
        read_as[value] = Value(next_id, 0)
        next_id += 1
    for nid in emitted:
        node = live[nid]
        ins = tuple(read_as.get(v, v) for v in node.inputs)
        nodes[nid] = node if ins == node.inputs else Node(node.op, node.attrs, ins,
                                                          node.outputs, node.name)
    outputs = [read_as.get(v, v) for v in replaces.values()]
    graph = Graph(nodes, [read_as[v].node for v in reads], outputs,
                  [f"out{k}" for k in range(len(outputs))], rewritten.facts, next_id)
    return Region(graph, tuple(reads), tuple(replaces))


#: Builds graphsub's torch program of a graph (a TorchTarget's `program`, with the part's
#: reference sizes): its `module` is an FX GraphModule.
ProgramBuilder = Callable[[Graph, Mapping[str, int] | None], Any]


@dataclass
class Spliced:
    """dynamo's graph with rewrites spliced in: the module, how many rewrites it holds, and
    the rewrites left out, with why, by their position in the list given."""

    module: fx.GraphModule
    count: int = 0
    failed: dict[int, str] = field(default_factory=dict)


def splice(gm: fx.GraphModule, rewrites: Sequence[Rewrite], build: ProgramBuilder,
           whole: bool = False) -> Spliced:
    """A copy of dynamo's graph `gm` with each rewrite spliced in (those that cannot be are
    left out, with the reason)."""
    edited = copy_captured(gm)
    program = _Program(edited)
    out = Spliced(edited)
    replaced: list[fx.Node] = []
    for k, rewrite in enumerate(rewrites):
        def readable(value: Value, rewrite: Rewrite = rewrite) -> bool:
            source = rewrite.sources.get(value)
            return source is not None and program.computes(source,
                                                           rewrite.original.type_of(value))

        def replaceable(value: Value, rewrite: Rewrite = rewrite) -> bool:
            source = rewrite.sources.get(value)
            return source is not None and program.replaceable(
                source, rewrite.original.type_of(value))

        mark = program.mark()
        try:
            region = plan_region(rewrite, readable, replaceable, whole)
            if not region.replaces:
                continue  # nothing rewritten
            module = getattr(build(region.graph, rewrite.reference), "module", None)
            if not isinstance(module, fx.GraphModule):
                raise SpliceError("the part's program is lowered once per size, which no "
                                  "single graph can hold")
            olds = [program.node(rewrite.sources[v], rewrite.owner) for v in region.replaces]
            reads = [program.node(rewrite.sources[v], rewrite.owner) for v in region.reads]
            stale = program.stale(reads)
            if stale:  # read them where they are as captured, and read the copies
                program.undo(mark)
                for leaf in stale:
                    program.snapshot(leaf)
                reads = [program.node(rewrite.sources[v], rewrite.owner)
                         for v in region.reads]
                if program.stale(reads):
                    raise SpliceError(f"the part reads {stale[0].name} as it was before the "
                                      f"graph writes into it")
        except Exception as exc:  # noqa: BLE001 - one part stays as captured, not the graph
            program.undo(mark)
            program.spliced()
            out.failed[k] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        program.spliced()
        if any(old in program.made for old in olds):
            raise AssertionError("a copied ATen value is no output of the part")
        copied = program.aliasing_written(region, reads)
        news = _inline(edited, module, reads, olds, f"_graphsub_{k}", copied)
        for old, new in zip(olds, news):
            replaced.append(old)
            program.current[old.name] = new
        out.count += 1
    if out.count:
        _remove_dead(edited, replaced + list(program.made))
        from torch._inductor.pattern_matcher import stable_topological_sort

        stable_topological_sort(edited.graph)
        edited.graph.lint()
        edited.recompile()
    return out


class _Program:
    """dynamo's graph being edited, as the splice reads values from it: each traced node's
    counterpart (`computes`, `node`), ATen operators copied in for values it has no node for
    (`made`, undone with a failed splice), and the order of its writes."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        #: each node by its name as captured: a replaced one by what replaced it, so that a
        #: later part reading an earlier part's output reads the new value
        self.current: dict[str, fx.Node] = {n.name: n for n in gm.graph.nodes}
        self.examples = {n.name: example_of(n) for n in gm.graph.nodes}
        #: ATen operators copied in (by the traced node copied), and every node inserted
        #: for the regions' reads (those copies, snapshots), in order
        self.copied: dict[fx.Node, fx.Node] = {}
        self.made: list[fx.Node] = []
        #: copies of nodes as captured, read by the rewrite being spliced in their place
        self.snapshots: dict[fx.Node, fx.Node] = {}
        #: the memory the graph writes into, anywhere
        self.written = {_storage(arg) for node in gm.graph.nodes
                        for arg in possibly_written(gm, node) if isinstance(arg, fx.Node)}
        self.written.discard(None)

    def computes(self, source: fx.Node, t: Any) -> bool:
        """Whether the program has, or can compute by copying ATen operators, the traced
        node `source`'s value, of graphsub's type `t`."""
        name = source.meta.get(ORIGIN)
        if name is not None and name in self.current:
            return _same_type(self.examples[name], t) or _carries(self.examples[name], t)
        value = source.meta.get("val")
        return _copyable(source, self.current) and _same_type(
            value if isinstance(value, torch.Tensor) else source.meta.get("tensor_meta"), t)

    def replaceable(self, source: fx.Node, t: Any) -> bool:
        """Whether the program has a node whose value is the traced node `source`'s, of
        graphsub's type `t`, whose readers may read another value in its place: not one
        that shares its memory with something the graph writes into (its readers may
        depend on that memory: an in-place write through a view)."""
        name = source.meta.get(ORIGIN)
        return name is not None and name in self.current and \
            _same_type(self.examples[name], t) and \
            _storage_of(self.examples[name]) not in self.written

    def node(self, source: fx.Node, owner: fx.GraphModule, carried: bool = True) -> fx.Node:
        """The program's node of the traced node's value, copying the ATen operators that
        compute it where it has none; a size as the tensor that carries it (what a region
        reads), unless not `carried` (what a copied ATen operator reads)."""
        name = source.meta.get(ORIGIN)
        if name is not None and name in self.current:
            captured = self.current[name]
            if isinstance(self.examples[name], torch.SymInt):
                return self._carrier(captured) if carried else captured
            return self.snapshots.get(captured, captured)
        if source in self.copied:
            return self.copied[source]
        graph = self.gm.graph
        if source.op == "get_attr":
            attribute = add_constant(self.gm, "_graphsub_copied",
                                     getattr(owner, str(source.target)))
            placeholders = list(graph.find_nodes(op="placeholder"))
            at = placeholders[-1].next if placeholders else next(iter(graph.nodes))
            with graph.inserting_before(at):
                made = graph.get_attr(attribute)
        else:
            read: dict[fx.Node, fx.Node] = {}

            def reading(n: fx.Node) -> fx.Node:
                if n not in read:
                    read[n] = self.node(n, owner, carried=False)
                return read[n]

            args, kwargs = fx.node.map_arg((source.args, source.kwargs), reading)
            order = {n: k for k, n in enumerate(graph.nodes)}
            after = max(read.values(), key=order.__getitem__, default=None)
            at = after.next if after is not None else next(iter(graph.nodes))
            with graph.inserting_before(at):
                made = graph.call_function(cast(Callable[..., Any], source.target), args,
                                           kwargs)
        made.meta["tensor_meta"] = source.meta.get("tensor_meta")
        self.copied[source] = made
        self.made.append(made)
        return made

    def _carrier(self, size: fx.Node) -> fx.Node:
        """An empty tensor of a size's length (fx_import's size carrier): how a region
        reads a size no tensor it reads has as a dimension."""
        device = next((v.device for v in self.examples.values()
                       if isinstance(v, torch.Tensor)), torch.device("cpu"))
        with self.gm.graph.inserting_after(size):
            made = self.gm.graph.call_function(torch.empty, ((size,),),
                                               {"dtype": torch.uint8, "device": device})
        self.made.append(made)
        return made

    def mark(self) -> int:
        return len(self.made)

    def undo(self, mark: int) -> None:
        """Remove the nodes inserted since `mark` (a splice that failed, or one read again
        from snapshots)."""
        kept = set(self.made[:mark])
        for made in reversed(self.made[mark:]):
            if not made.users:
                self.gm.graph.erase_node(made)
        self.copied = {k: v for k, v in self.copied.items() if v in kept}
        self.snapshots = {k: v for k, v in self.snapshots.items() if v in kept}
        del self.made[mark:]

    def stale(self, reads: Sequence[fx.Node]) -> list[fx.Node]:
        """The nodes as captured that the region reads (directly or through ATen copies)
        and that the graph writes into between where they are read as captured and where
        the region will run, after the last of its reads: there the region would see the
        written value."""
        graph = self.gm.graph
        order = {n: k for k, n in enumerate(graph.nodes)}
        leaves = _ancestors(reads, set(self.made) - set(self.snapshots.values()))
        at = max((order[n] for n in reads), default=0)
        writes: list[tuple[int, Any]] = []
        for node in graph.nodes:
            if order[node] > at:
                break
            for arg in possibly_written(self.gm, node):
                # (None: a call that may write anything, a module's)
                writes.append((order[node], _storage(arg) if isinstance(arg, fx.Node)
                               else None))
        out = []
        for leaf in sorted(leaves, key=order.__getitem__):
            mine = _storage(leaf)
            if mine is not None and any(order[leaf] < where and (written is None
                                                                  or written == mine)
                                        for where, written in writes):
                out.append(leaf)
        return out

    def snapshot(self, leaf: fx.Node) -> None:
        """Read `leaf`'s value where it is as captured, before the graph writes into it: a
        copy made there (a counter, a position: SNAPSHOT_LIMIT elements at most), which
        `node` hands out in its place until the rewrite is spliced."""
        value = example_of(leaf)
        if not isinstance(value, torch.Tensor) or value.numel() > SNAPSHOT_LIMIT:
            raise SpliceError(f"the part reads {leaf.name} as it was before the graph writes "
                              f"into it, and it is too large to keep a copy of")
        at = leaf
        while at.op == "placeholder" and at.next.op == "placeholder":
            at = at.next  # the graph's inputs stay first
        with self.gm.graph.inserting_after(at):
            copy = self.gm.graph.call_method("clone", (leaf,))
        self.snapshots[leaf] = copy
        self.made.append(copy)

    def aliasing_written(self, region: Region, reads: Sequence[fx.Node]) -> list[bool]:
        """For each output of the region, whether it may be a view of a value the graph
        writes into somewhere (a view of a counter the region reads before the graph
        advances it would show the advanced count where the output is read later): such an
        output is handed on as a copy."""
        copies = set(self.made) - set(self.snapshots.values())
        graph = region.graph
        position = {nid: k for k, nid in enumerate(graph.inputs)}
        out = []
        for value in graph.outputs:
            nid = value.node
            while graph[nid].op != "input" and get_op(graph[nid].op).view and graph[nid].inputs:
                nid = graph[nid].inputs[0].node  # a view: of its first operand
            leaves = _ancestors([reads[position[nid]]], copies) if nid in position else set()
            out.append(any(_storage(leaf) in self.written for leaf in leaves))
        return out

    def spliced(self) -> None:
        """The rewrite is in: its snapshots are its own (other parts read the live values)."""
        self.snapshots.clear()


def _ancestors(reads: Sequence[fx.Node], copies: set[fx.Node]) -> set[fx.Node]:
    """The nodes that `reads` are, or that the ATen copies among them read, other than
    those copies."""
    out: set[fx.Node] = set()
    pending = list(reads)
    while pending:
        node = pending.pop()
        if node in copies:
            pending += node.all_input_nodes
        else:
            out.add(node)
    return out


def _storage(node: fx.Node) -> Any:
    """The storage of a captured node's example value (None: not a tensor)."""
    return _storage_of(example_of(node))


def _storage_of(value: Any) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    if not isinstance(value, torch.Tensor):
        return None
    # (unannotated in torch; with torch absent, Any: the ignore is unused there)
    return StorageWeakRef(value.untyped_storage())  # type: ignore[no-untyped-call, unused-ignore]


def _copyable(source: fx.Node, current: Mapping[str, fx.Node]) -> bool:
    """Whether a traced node's value can be computed in dynamo's graph from values it has:
    a constant, or an ATen operator that writes nothing over such values."""
    pending, seen = [source], set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        name = node.meta.get(ORIGIN)
        if name is not None and name in current:
            continue
        if node.op == "get_attr":
            continue
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or \
                target._schema.is_mutable:
            return False
        pending += node.all_input_nodes
    return True


def example_of(node: fx.Node) -> Any:
    """A node's fake value: dynamo's `example_value`, or torch.export's `val`."""
    return node.meta.get("example_value", node.meta.get("val"))


def copy_captured(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of dynamo's graph module that inductor takes for dynamo's own: its graph
    copied node for node (names, metadata, the placeholders' `_dynamo_source`), and what
    dynamo attached to the module (its meta with the compile id, the parameters' sources,
    the shape environment)."""
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    result = graph.graph_copy(gm.graph, copies)
    old_output = gm.graph.output_node()
    graph.output(result, type_expr=old_output.type)
    graph.output_node().meta.update(old_output.meta)
    for old, new in copies.items():
        for name, value in vars(old).items():
            if name.startswith("_dynamo"):
                setattr(new, name, value)
    edited = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    fresh = vars(edited)
    for name, value in vars(gm).items():
        if name not in fresh:
            setattr(edited, name, value)
    edited.meta = dict(gm.meta)
    return edited


def _carries(example: Any, t: Any) -> bool:
    """Whether `t` is the type of a carrier of the size `example` (fx_import's size
    carriers: an empty tensor of that length)."""
    return isinstance(example, torch.SymInt) and t.dtype == SIZE_CARRIER_DTYPE and \
        len(t.shape) == 1


def _same_type(example: Any, t: Any) -> bool:
    """Whether a node whose example value (or tensor metadata) is `example` computes a
    tensor of graphsub's type `t`: its dtype and rank, and its sizes where both are
    static."""
    shape, dtype = getattr(example, "shape", None), getattr(example, "dtype", None)
    if shape is None or t.is_opaque:
        return False
    try:
        if dtype != torch_dtype(t.dtype) or len(shape) != len(t.shape):
            return False
    except KeyError:
        return False
    return all(have == want for have, want in zip(shape, t.shape)
               if isinstance(have, int) and isinstance(want, int))


def add_constant(gm: fx.GraphModule, prefix: str, value: torch.Tensor) -> str:
    """A constant of dynamo's graph, as dynamo adds one: a buffer of the module (aot
    autograd lifts it as an input, inductor's CUDA graphs read it in place), with its name
    in the module's parameter sources where dynamo keeps them; returns its name."""
    from torch._dynamo.source import ConstantSource

    name = next(f"{prefix}_c{k}" for k in itertools.count() if not hasattr(gm, f"{prefix}_c{k}"))
    gm.register_buffer(name, value)
    sources = getattr(gm, "_param_name_to_source", None)
    if sources is not None:  # a copy: the captured module keeps its own
        setattr(gm, "_param_name_to_source", {**sources, name: ConstantSource(name)})
    return name


def _inline(gm: fx.GraphModule, program: fx.GraphModule, reads: Sequence[fx.Node],
            replaces: Sequence[fx.Node], prefix: str, copied: Sequence[bool]) -> list[fx.Node]:
    """Copy the program's nodes into `gm`, each right after the last node it reads (so that
    the captured order moves as little as it can), its constants as constants of `gm`
    (add_constant), and make every reader of each node in `replaces` read the program's
    output in its place: made contiguous where the replaced value was, and a copy where
    `copied` says it may be a view of something the graph writes into; returns those
    outputs."""
    graph = gm.graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    top = placeholders[-1] if placeholders else None
    env: dict[fx.Node, fx.Node] = dict(zip(program.graph.find_nodes(op="placeholder"), reads))
    inserted: set[fx.Node] = set()

    def placed(make: Callable[[], fx.Node], after: Sequence[fx.Node]) -> fx.Node:
        anchor = max(after, default=top)
        point = graph.inserting_after(anchor) if anchor is not None else \
            graph.inserting_before(next(iter(graph.nodes)))
        with point:
            node = make()
        inserted.add(node)
        return node

    outputs: Sequence[Any] = ()
    for node in program.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            result = node.args[0]
            outputs = result if isinstance(result, (tuple, list)) else (result,)
        elif node.op == "get_attr":
            name = add_constant(gm, prefix, getattr(program, str(node.target)))
            env[node] = placed(partial(graph.get_attr, name), ())
        else:
            env[node] = placed(partial(graph.node_copy, node, env.__getitem__),
                               [env[a] for a in node.all_input_nodes])
    news: list[fx.Node] = []
    for old, new, copy in zip(replaces, outputs, copied):
        value = env[new]
        example = example_of(old)
        kwargs: dict[str, Any] = {"memory_format": torch.contiguous_format} if copy else {}
        method = "clone" if copy else "contiguous"
        if copy or (isinstance(example, torch.Tensor) and example.dim() > 1
                    and example.is_contiguous()):
            value = placed(partial(graph.call_method, method, (value,), kwargs), [value])
        news.append(value)
    for old, value in zip(replaces, news):
        old.replace_all_uses_with(value, delete_user_cb=lambda user: user not in inserted)
    return news


def _drops_nothing(node: fx.Node) -> bool:
    """Whether an operator fx calls impure only because it may draw random numbers (an
    attention's dropout: torch's `nondeterministic_seeded`) draws none here: its dropout
    probability is 0, as in inference, so what nothing reads may go."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable or \
            torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for position, argument in enumerate(target._schema.arguments):
        if argument.name == "dropout_p":
            value = node.args[position] if position < len(node.args) else \
                node.kwargs.get("dropout_p", argument.default_value)
            return bool(value == 0)
    return False


def _remove_dead(gm: fx.GraphModule, replaced: Iterable[fx.Node]) -> None:
    """Remove what the replaced nodes, and what only they read, computed: nodes left with no
    reader that write nothing (a check of the metadata of what nothing else reads, which
    export writes after a mask's comparisons, goes with it). Nodes that had no reader as
    captured stay."""
    pending = list(replaced)
    erased: set[fx.Node] = set()
    while pending:
        node = pending.pop()
        if node not in erased and node.users and all(
                user.target is torch.ops.aten._assert_tensor_metadata.default
                for user in node.users):
            for check in list(node.users):
                gm.graph.erase_node(check)
                erased.add(check)
        if node in erased or node.users or node.op not in ("call_function", "call_method") \
                or (node.is_impure() and not _drops_nothing(node)) or possibly_written(gm, node):
            continue
        inputs = list(node.all_input_nodes)
        gm.graph.erase_node(node)
        erased.add(node)
        pending += inputs


__all__ = ["Region", "Rewrite", "SpliceError", "Spliced", "copy_captured", "plan_region",
           "splice"]
