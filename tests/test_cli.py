"""The graphsub command line, end to end through typer's runner."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

import graphsub
from graphsub.cli import app, parse_input_shapes
from graphsub.ir import GraphBuilder

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 3, 16, 16))
    y = b.conv2d(x, b.he_weight((8, 3, 3, 3)), activation="relu")
    b.output(b.global_avg_pool(y), "y")
    g = b.build()
    a = d / "a.onnx"
    graphsub.save(g, a)
    b2 = GraphBuilder(seed=1)  # same structure, other weights: not equivalent
    x = b2.input("x", (1, 3, 16, 16))
    y = b2.conv2d(x, b2.he_weight((8, 3, 3, 3)), activation="relu")
    b2.output(b2.global_avg_pool(y), "y")
    other = d / "other.onnx"
    graphsub.save(b2.build(), other)
    return {"a": str(a), "other": str(other), "dir": d}


def test_info_json(models):
    r = invoke("info", models["a"], "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["ops"] == {"conv2d": 1, "relu": 1, "global_avg_pool": 1}
    assert data["parameters"] == 8 * 3 * 3 * 3
    assert data["flops"] == 2 * 8 * 16 * 16 * 27 + 8 * 16 * 16 + 8 * 16 * 16
    assert data["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]


def test_info_table_on_a_zoo_model():
    r = invoke("info", "squeezenet")
    assert r.exit_code == 0
    assert "conv2d" in r.stdout and "parameters" in r.stdout and "FLOPs" in r.stdout


def test_zoo_list_and_export(models):
    r = invoke("zoo", "list", "--json")
    names = {m["name"] for m in json.loads(r.stdout)}
    assert {"bert", "nasrnn", "resnext50", "nasnet_a", "inception_v3", "resnet50", "squeezenet",
            "vgg19", "mobilenet_v2", "sru", "vit", "resnet_blocks", "inception_e_blocks",
            "light_resnet50"} <= names
    out = models["dir"] / "blocks.onnx"
    r = invoke("zoo", "export", "resnet_blocks:n=2", "-o", str(out))
    assert r.exit_code == 0, r.output
    onnx.checker.check_model(str(out), full_check=True)
    r = invoke("zoo", "export", "resnet_blocks:depth=2", "-o", str(out))
    assert r.exit_code == 2 and "bad parameter" in r.stderr


def test_zoo_list_shows_every_name_whole_at_80_columns():
    from graphsub import zoo

    r = runner.invoke(app, ["zoo", "list"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0
    first_cells = {line.split("│")[1].strip() for line in r.stdout.splitlines()
                   if line.startswith("│") and line.split("│")[1].strip()}
    assert set(zoo.names()) <= first_cells, set(zoo.names()) - first_cells
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_check_exit_status_tells_equivalence(models):
    r = invoke("check", models["a"], models["a"], "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["equivalent"] is True
    r = invoke("check", models["a"], models["other"])
    assert r.exit_code == 1 and "NOT equivalent" in r.stdout


def test_bench_two_models_reports_a_ratio(models):
    r = invoke("bench", models["a"], models["a"], "--json", "--seconds", "0.2", "--threads", "1")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert len(data["models"]) == 2 and data["speedup"] > 0
    assert all(m["runs"] >= 5 and m["median_ms"] > 0 for m in data["models"])
    h = data["head_to_head"]
    assert h["speedup"] == data["speedup"] and h["rounds"] >= 3 and h["cores"] >= 1
    assert h["decision"] in ("faster", "not faster", "undecided", "contended")


def test_bench_reports_the_statistic_selection_decides_on(models, monkeypatch):
    """The median of the rounds' ratios, with its interval and decision, not a ratio of
    medians: here most rounds take A and B alike (a ratio of 1), while their medians, 3 ms
    against 2 ms, would give 1.5."""
    from graphsub import runtime
    from graphsub.verdicts.speedup import describe
    from graphsub.runtime.timing import Timing

    a = (1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    b = (1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    monkeypatch.setattr(runtime, "time_runnables", lambda runnables, feeds, **kw: [
        Timing(tuple(x / 1e3 for x in a)), Timing(tuple(x / 1e3 for x in b))])
    r = invoke("bench", models["a"], models["a"], "--json")
    h = json.loads(r.stdout)["head_to_head"]
    assert h["speedup"] == pytest.approx(1.0)  # ratios 1, 2, 2, 2, 3, 1, 1, 1, 1, 1
    assert (h["low"], h["high"]) == (pytest.approx(1.0), pytest.approx(2.0))
    assert h["decision"] in ("undecided", "contended")  # straddles the 1.020x needed
    text = " ".join(invoke("bench", models["a"], models["a"]).stdout.split())
    assert describe(h) in text and "median of the rounds' ratios" in text
    # A against A: the same graph, so whatever the ratio, it is the machine's noise.
    assert "A and B compute the same graph" in text
    assert json.loads(r.stdout)["same_graph"] is True
    other = invoke("bench", models["a"], models["other"], "--json")
    assert json.loads(other.stdout)["same_graph"] is False


def test_bench_of_a_model_against_itself_on_a_loaded_machine_is_no_faster(tmp_path):
    """With two busy processes beside it, A against A is a tie: nothing is called faster and
    the interval holds 1.0. A 95% interval misses the truth at most 1 time in 20 by design
    (about 1 in 50 at 10 rounds), so a miss gets a second bench; two misses in a row (1 in
    400 at most) are a bias, not chance. The model runs for milliseconds, so that what
    differs between two sessions of it (memory placement) stays far below the noise."""
    from tests.runtime.busy import busy_processes

    b = GraphBuilder(seed=0)
    x = b.input("x", (1, 16, 64, 64))
    b.output(b.conv2d(x, b.he_weight((32, 16, 3, 3)), activation="relu"), "y")
    model = str(tmp_path / "conv.onnx")
    graphsub.save(b.build(), model)
    intervals = []
    with busy_processes(2):
        for _ in range(2):
            r = invoke("bench", model, model, "--json", "--seconds", "0.2", "--threads", "1")
            h = json.loads(r.stdout)["head_to_head"]
            assert h["decision"] != "faster", h
            intervals.append((h["low"], h["high"]))
            if h["low"] <= 1.0 <= h["high"]:
                break
    assert intervals[-1][0] <= 1.0 <= intervals[-1][1], intervals


def test_bad_input_is_one_clear_line_and_status_2(models, tmp_path):
    r = invoke("info", str(tmp_path / "nothing.onnx"))
    assert r.exit_code == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = invoke("info", "not_a_model_name")
    assert r.exit_code == 2 and "not a file or a zoo model" in r.stderr
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage" * 10)
    r = invoke("info", str(junk))
    assert r.exit_code == 2 and "not a valid ONNX model" in r.stderr


def test_symbolic_inputs_stay_symbolic_unless_input_shape_fixes_them(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["img"], ["y"])], "t",
                              [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "dyn.onnx"
    onnx.save(model, str(path))
    r = invoke("info", str(path), "--json")
    info = json.loads(r.stdout)
    assert r.exit_code == 0 and info["inputs"][0]["shape"] == ["N", 4]
    assert info["flops"] == "4*N" and info["at_profile"] == {"profile": "N=1", "flops": 4,
                                                             "bytes_moved": 32}
    r = invoke("info", str(path), "--input-shape", "img=2x4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["inputs"][0]["shape"] == [2, 4]
    r = invoke("info", str(path), "--input-shape", "img:2x4")
    assert r.exit_code == 2 and "NAME=DIMS" in r.output


def test_parse_input_shapes():
    assert parse_input_shapes(["x=1x3x224x224", "a=b=2,3"]) == {"x": (1, 3, 224, 224),
                                                                 "a=b": (2, 3)}


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and graphsub.__version__ in r.stdout


def test_compare_runs_each_algorithm_on_one_cost_model():
    result = invoke("compare", "squeezenet", "--algorithms", "greedy,sampling", "--time-limit",
                    "2", "--target", "ort-cpu", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["algorithm"] for r in data["runs"]] == ["greedy", "sampling"]
    initial = {r["initial_ms"] for r in data["runs"]}
    assert len(initial) == 1  # one cost model prices every run
    assert all(r["final_ms"] <= r["initial_ms"] and r["explored"] >= 1
               for r in data["runs"])
    table = invoke("compare", "squeezenet", "--algorithms", "greedy", "--time-limit", "1")
    assert table.exit_code == 0 and "greedy" in table.output and "expanded" in table.output


def test_compare_names_an_unknown_algorithm():
    result = invoke("compare", "squeezenet", "--algorithms", "greedy,annealing")
    assert result.exit_code == 2
    assert "unknown algorithm(s) annealing" in result.output


def test_optimize_with_split_writes_a_verified_model(tmp_path):
    """Bounded by work (--budget, no peers), the time limit only a ceiling: with a limit of
    4 s, a loaded machine once spent it loading the model and running the peers, and the
    search, given no time, never split."""
    out, report = tmp_path / "n.onnx", tmp_path / "r.json"
    result = invoke("optimize", "nasrnn", "-o", str(out), "--cost", "analytic", "--split", "20",
                    "--executor", "serial", "--budget", "10", "--no-peers", "--time-limit",
                    "30", "--measure-limit", "1", "--candidates", "1", "--report", str(report))
    assert result.exit_code == 0, result.output
    rep = json.loads(report.read_text())
    assert rep["settings"]["split"] == 20
    assert rep["verification"] and out.exists()
    split = rep["search"]["split"]
    assert split["parts"] >= 2 and max(split["part_sizes"]) <= 20
    assert sum(split["part_sizes"]) >= 20 and split["matches_cut"] >= 0
    text = " ".join(result.stdout.split())
    assert f"{split['parts']} parts" in text and "matches cut" in text
    assert rep["verdict"] in text and f"the report to {report}" in text


def test_optimize_with_eqsat_reports_its_egraph(tmp_path):
    out, report = tmp_path / "s.onnx", tmp_path / "r.json"
    result = invoke("optimize", "squeezenet", "-o", str(out), "--cost", "analytic",
                    "--algorithm", "eqsat", "--node-limit", "3000", "--time-limit", "10",
                    "--candidates", "1", "--report", str(report))
    assert result.exit_code == 0, result.output
    rep = json.loads(report.read_text())
    assert rep["settings"]["algorithm"] == "eqsat" and rep["settings"]["node_limit"] == 3000
    egraph = rep["search"]["egraph"]
    assert egraph["nodes"] > rep["nodes_before"] and egraph["extraction"]["ilp"]["status"]
    assert "iterations" in result.output and "e-nodes" in result.output
    assert rep["verification"] and out.exists()


def test_check_uses_the_optimizers_tolerances_unless_given(models):
    r = invoke("check", models["a"], models["a"], "--json")
    data = json.loads(r.stdout)
    assert (data["rtol"], data["atol_scale"]) == (1e-3, 1e-4)
    r = invoke("check", models["a"], models["a"], "--json", "--rtol", "1e-5", "--atol", "1e-7")
    data = json.loads(r.stdout)
    assert (data["rtol"], data["atol"], data["atol_scale"]) == (1e-5, 1e-7, 0.0)
    r = invoke("check", models["a"], models["a"])
    assert "atol 0.0001 of each output's largest" in " ".join(r.stdout.split())
