"""Control flow: If, Loop and Scan imported with the values their bodies capture, written back
exactly, searched inside, and optimized end to end."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest

import graphsub
from graphsub.targets import get_target
from graphsub.cost import make_cost_model
from graphsub.errors import ModelLoadError
from graphsub.ops.control_flow import captured_names, defined_names
from graphsub.pipeline.bodies import optimize_bodies
from graphsub.rules import builtin_rules
from graphsub.runtime import make_session
from graphsub.search import ALGORITHMS
from graphsub.search.registry import Limits
from tests.onnx_io.control_flow_models import conv_bn_in_branch, nested_if_loop_scan, shape_condition


def outputs_at_every_branch(a: onnx.ModelProto | bytes, b: onnx.ModelProto | bytes,
                            conditions: list[str], x_shape: tuple[int, ...], seed: int = 3
                            ) -> float:
    """The largest difference between the two models' outputs over every combination of the
    boolean conditions."""
    sa, sb = (make_session(m if isinstance(m, bytes) else m.SerializeToString(), threads=1)
              for m in (a, b))
    rng = np.random.default_rng(seed)
    worst = 0.0
    for values in itertools.product([True, False], repeat=len(conditions)):
        feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
                 **{c: np.array(v) for c, v in zip(conditions, values)}}
        for p, q in zip(sa.run(None, feeds), sb.run(None, feeds)):
            assert p.shape == q.shape
            worst = max(worst, float(np.abs(p - q).max()) if p.size else 0.0)
    return worst


def analytic_search(seconds_scale: float = 1.0):
    rules = builtin_rules()
    cost = make_cost_model("analytic", target=get_target("ort-cpu"))
    algorithm = ALGORITHMS["backtracking"]

    def search(graph, seconds):
        result = algorithm.function(graph, rules, cost, Limits(time=seconds * seconds_scale,
                                                               keep=1), algorithm.options())
        return result.graph, result.initial_cost, result.final_cost
    return search


def test_captured_and_defined_names_follow_nested_bodies():
    model = nested_if_loop_scan()
    nodes = {n.op_type: n for n in model.graph.node}
    assert set(captured_names(nodes["If"])) == {"y", "b", "x2", "c2"}  # the inner If's too
    assert {"t1", "t2", "t3", "it", "ie", "e1", "e2"} <= defined_names(nodes["If"])
    assert captured_names(nodes["Loop"]) == ("y",)
    assert captured_names(nodes["Scan"]) == ("b",)


def test_if_loop_and_scan_import_and_write_back_exactly():
    model = nested_if_loop_scan()
    graph = graphsub.load(model)
    flows = sorted(graph[n].attrs["op_type"] for n in graph.nodes if graph[n].op == "opaque")
    assert flows == ["If", "Loop", "Scan"]
    exported = graphsub.to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert outputs_at_every_branch(model, exported, ["c1", "c2"], (2, 8)) == 0.0


def test_control_flow_over_symbolic_sizes_is_typed_by_its_bodies():
    graph = graphsub.load(nested_if_loop_scan(batch="n"))
    assert [str(graph.type_of(v)) for v in graph.outputs] == [
        "float32[nx8]", "float32[3]", "float32[8]"]
    exported = graphsub.to_onnx(graph)
    for batch in (1, 5):
        assert outputs_at_every_branch(nested_if_loop_scan(batch="n"), exported,
                                       ["c1", "c2"], (batch, 8)) == 0.0


def test_a_rewrite_inside_a_branch_is_found_checked_and_written_back():
    model = conv_bn_in_branch()
    graph = graphsub.load(model)
    optimized, outcomes = optimize_bodies(graph, analytic_search(), seconds=5.0, threads=1)
    then = next(o for o in outcomes if o.where.endswith("then_branch"))
    assert then.kept and then.cost_after < then.cost_before, then.text()
    exported = graphsub.to_onnx(optimized)
    onnx.checker.check_model(exported, full_check=True)
    (if_node,) = [n for n in exported.graph.node if n.op_type == "If"]
    then_ops = [n.op_type for a in if_node.attribute if a.name == "then_branch" for n in a.g.node]
    assert "BatchNormalization" not in then_ops and "Conv" in then_ops
    # the weights the branch alone read moved inside it: the outer graph keeps none of them
    assert not {"w", "s", "bb", "m", "v"} & {i.name for i in exported.graph.initializer}
    assert outputs_at_every_branch(model, exported, ["c"], (1, 4, 6, 6)) < 1e-4


def test_optimize_model_keeps_control_flow_correct_end_to_end():
    model = nested_if_loop_scan()
    data, report = graphsub.optimize_model(graphsub.load(model), model.SerializeToString(),
                                           time_limit=8, target="ort-cpu", fission=False)
    assert report.verification["equivalent"]
    assert {b["where"].split()[0] for b in report.bodies} >= {"If", "Loop"}
    assert outputs_at_every_branch(model, data, ["c1", "c2"], (2, 8)) < 1e-4


def test_an_if_decided_by_static_sizes_is_imported_as_its_branch():
    graph = graphsub.load(shape_condition(batch=1))
    assert not [n for n in graph.nodes.values() if n.op == "opaque"]
    assert [str(graph.type_of(v)) for v in graph.outputs] == ["float32[5]"]


def test_branches_of_different_ranks_over_a_symbol_are_refused_by_name():
    with pytest.raises(ModelLoadError, match="branches of If .* different types.*--input-shape"):
        graphsub.load(shape_condition(batch="n"))
