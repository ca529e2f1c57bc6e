"""One Settings object: validated where it is made, every algorithm option reachable (in
Python by name, on the command line with --option NAME=VALUE), refused with the list of what
is accepted when misspelled; a help page a person can read."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from graphsub.cli import app
from graphsub.egraph.mcts import MctsOptions
from graphsub.errors import GraphsubError
from graphsub.pipeline import Objective, Settings, parse_option
from graphsub.search import SamplingOptions

runner = CliRunner()


def test_algorithm_options_by_name_become_the_algorithms_own_dataclass():
    s = Settings.make(algorithm="mcts", c=1.4, seed=3, time_limit=5)
    assert s.search_options == MctsOptions(c=1.4, seed=3)
    assert s.time_limit == 5
    s = Settings.make(algorithm="sampling", options={"q": 10}, eta=2)
    assert s.search_options == SamplingOptions(q=10, eta=2)
    assert Settings.make(algorithm="greedy", k=None).search_options.max_node_factor == 2.0


@pytest.mark.parametrize("given, fragment", [
    ({"algorithm": "mcts", "alpha": 1.2}, "the mcts search has no setting alpha (its settings: "
                                          "node_limit, extractors"),
    ({"algorithm": "annealing"}, "unknown algorithm 'annealing'"),
    ({"alpha": 0.5}, "alpha must be at least 1"),
    ({"algorithm": "dpp", "k": 0}, "--k must be at least 1"),
    ({"time_limit": float("nan")}, "--time-limit must be a positive number"),
    ({"split": 1}, "--split needs a part size of at least 2"),
    ({"cost": "guess"}, "unknown cost model 'guess'"),
    ({"target": "ort-cpu", "allow_tf32": True}, "allow_tf32 is an option of torch-cuda, not of "
                                                "ort-cpu"),
    ({"original_onnx": b""}, "unknown setting 'original_onnx': not an option of the "
                             "backtracking search"),
    ({"algorithm": "eqsat", "extractors": ("ilp", "fastest")}, "unknown extractor(s) fastest"),
    ({"algorithm": "mcts", "c": "big"}, "c takes float, not 'big'"),
    ({"budget": 2.5}, "--budget takes int"),
    ({"measure_seconds": float("nan")}, "measure_seconds must be at least 0"),
])
def test_a_bad_setting_is_refused_where_settings_are_made(given, fragment):
    with pytest.raises(GraphsubError) as info:
        Settings.make(**given)
    assert fragment in str(info.value)


def test_settings_are_frozen_and_a_changed_copy_is_checked_again():
    s = Settings.make(time_limit=5, alpha=1.2)
    with pytest.raises(AttributeError):
        s.time_limit = 6  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.options["alpha"] = 2.0  # type: ignore[index]
    assert s.replace(time_limit=6).time_limit == 6
    assert s.replace(time_limit=6).search_options.alpha == 1.2
    with pytest.raises(GraphsubError, match="--budget must be at least 1"):
        s.replace(budget=0)
    # another algorithm keeps the options it has and drops the others
    assert s.replace(algorithm="greedy").options == {}
    assert s.replace(algorithm="mcts", c=1.4).search_options.c == 1.4


@pytest.mark.parametrize("algorithm, text, expected", [
    ("mcts", "c=1.4", ("c", 1.4)),
    ("mcts", "seed=7", ("seed", 7)),
    ("mcts", "extractors=ilp, greedy", ("extractors", ("ilp", "greedy"))),
    ("eqsat", "extract-time=none", ("extract_time", None)),
    ("eqsat", "extract_time=2.5", ("extract_time", 2.5)),
    ("sampling", "eta=2", ("eta", 2)),
])
def test_option_text_takes_the_type_the_algorithm_declares(algorithm, text, expected):
    assert parse_option(algorithm, text) == expected


@pytest.mark.parametrize("algorithm, text, fragment", [
    ("mcts", "temperature=2", "the mcts search has no option 'temperature'; its options: "
                              "node_limit, extractors, extract_time, max_depth, c, seed"),
    ("mcts", "c", "--option 'c' is not NAME=VALUE"),
    ("mcts", "seed=three", "'three' is not a value of int"),
])
def test_a_bad_option_text_names_what_is_accepted(algorithm, text, fragment):
    with pytest.raises(GraphsubError) as info:
        parse_option(algorithm, text)
    assert fragment in str(info.value)


def test_every_algorithm_option_is_reachable_from_the_command_line(tmp_path):
    out = tmp_path / "out.onnx"
    r = runner.invoke(app, ["optimize", "sru", "-o", str(out), "--algorithm", "mcts",
                            "-O", "c=1.4", "--option", "seed=3", "-O", "max_depth=2",
                            "--cost", "analytic", "--time-limit", "4", "--no-fission",
                            "--json"])
    assert r.exit_code == 0, r.output
    settings = json.loads(r.stdout)["settings"]
    assert (settings["c"], settings["seed"], settings["max_depth"]) == (1.4, 3, 2)
    r = runner.invoke(app, ["optimize", "sru", "-o", str(out), "--algorithm", "mcts",
                            "-O", "cee=1.4"])
    assert r.exit_code == 2 and "no option 'cee'; its options: node_limit" in r.output
    assert not out.exists() or out.stat().st_size > 0


def test_objective_text():
    assert Objective.parse("latency,memory=0.3") == Objective(latency=1.0, memory=0.3)
    assert Objective.parse("memory") == Objective(latency=0.0, memory=1.0)
    assert Objective().latency_only and not Objective.parse("latency,flops=1").latency_only
    for bad, fragment in (("latency,speed=2", "unknown term 'speed'"),
                          ("memory=-1", "at least 0"), ("latency=0", "weighs nothing"),
                          ("memory=lots", "'lots' is not a weight")):
        with pytest.raises(GraphsubError, match=fragment):
            Objective.parse(bad)


def test_the_optimize_help_fits_a_terminal_and_shows_no_python_types():
    r = runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert len(lines) < 130, len(lines)
    options = [line for line in lines if "--" in line and "--help" not in line]
    assert not [line for line in options if re.search(r"<(str|int|float|bool|path|list)", line)]
