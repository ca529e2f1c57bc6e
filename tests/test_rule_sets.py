"""The rules a run reads (graphsub.pipeline.rule_sets): a user's rules are added to the
library, whose normal form stays; `rules_only` / `--rules-only` runs them alone, saying what
that leaves out."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import graphsub
from graphsub.cli import app
from graphsub.cost import AnalyticCostModel
from graphsub.ir import GraphBuilder
from graphsub.pipeline import RuleSet, load_rule_files, rule_set
from graphsub.rules import builtin_rules, parse_rules
from graphsub.rules.roles import Role
from graphsub.rules.roles import Role, with_role

MINE = "rule my-relu-relu: (relu (relu ?x)) => (relu ?x)\n"


def relu_relu_identity():
    """relu(relu(x)), then an identity the library's normal form removes."""
    b = GraphBuilder(seed=0)
    x = b.input("x", (8, 64))
    b.output(b.tanh(b.identity(b.relu(b.relu(x)))), "y")
    return b.build()


def test_no_rules_given_is_the_library():
    assert rule_set(None) == RuleSet(tuple(builtin_rules()))
    assert load_rule_files([]) == RuleSet(tuple(builtin_rules()))


def test_rules_given_are_added_to_the_library():
    library = builtin_rules()
    (mine,) = parse_rules(MINE, origin="my.rules")
    chosen = rule_set([mine])
    assert chosen.rules == (*library, mine) and chosen.notes == ()
    assert with_role(chosen.rules, Role.NORMAL_FORM) == with_role(library, Role.NORMAL_FORM)


def test_the_library_given_again_is_the_library_once():
    library = builtin_rules()
    assert rule_set(library) == RuleSet(tuple(library))


def test_a_rule_named_as_a_library_rule_is_used_in_its_place_with_a_note():
    library = builtin_rules()
    (mine,) = parse_rules("rule remove-identity: (identity (relu ?x)) => (relu ?x)\n",
                          origin="my.rules")
    chosen = rule_set([mine])
    at = [r.name for r in library].index("remove-identity")
    assert chosen.rules == (*library[:at], mine, *library[at + 1:])
    assert chosen.notes == ("rule remove-identity of my.rules is used in place of the "
                            "library's (cleanup.rules, roles normal-form, search, cleanup)",)
    # declaring no role, the user's rule is a search rule: the normal form loses the library's
    assert "remove-identity" not in [r.name for r in with_role(chosen.rules, Role.NORMAL_FORM)]


def test_rules_only_drops_the_library_and_says_what_that_leaves_out():
    (mine,) = parse_rules(MINE, origin="my.rules")
    chosen = rule_set([mine], rules_only=True)
    assert chosen.rules == (mine,)
    assert chosen.notes == ("the library's normal form is not applied (rules only): no rule "
                            "given declares the normal-form role, so there is none",)
    (normal,) = parse_rules("roles: normal-form\n" + MINE, origin="my.rules")
    assert rule_set([normal], rules_only=True).notes == (
        "the library's normal form is not applied (rules only): the normal form is the 1 "
        "rule(s) given that declare the normal-form role",)
    library = builtin_rules()
    assert rule_set([*library, mine], rules_only=True) == RuleSet((*library, mine))


def test_rules_whose_roles_no_run_reads_are_named():
    (kernel,) = parse_rules("roles: kernel\n" + MINE, origin="my.rules")
    assert rule_set([kernel]).notes == (
        "the rules of my.rules declare only kernel, which a run reads from graphsub's own rule "
        "files: they take no part in this run",)


def test_the_search_and_the_normal_form_read_the_rules_that_declare_them():
    graph = relu_relu_identity()
    (mine,) = parse_rules(MINE, origin="my.rules")
    cost = AnalyticCostModel("cpu")
    both = graphsub.optimize(graph, [mine], "greedy", cost=cost, time_limit=5)
    assert set(both.rules_used()) == {"remove-identity", "my-relu-relu"}
    alone = graphsub.optimize(graph, [mine], "greedy", rules_only=True, cost=cost, time_limit=5)
    assert set(alone.rules_used()) == {"my-relu-relu"}
    # a rule that declares the normal form alone leads the trace and is not searched with
    (normal,) = parse_rules("roles: normal-form\n" + MINE, origin="my.rules")
    assert normal.roles == {Role.NORMAL_FORM}
    first = graphsub.optimize(graph, [normal], "greedy", rules_only=True, cost=cost,
                              time_limit=5)
    assert [s.rule for s in first.trace] == ["my-relu-relu"]
    (kernel_only,) = parse_rules("roles: kernel\n" + MINE, origin="my.rules")
    unread = graphsub.optimize(graph, [kernel_only], "greedy", rules_only=True, cost=cost,
                               time_limit=5)
    assert unread.trace == ()


def test_cli_rules_add_to_the_library_and_rules_only_replaces_it(tmp_path):
    model, mine = tmp_path / "m.onnx", tmp_path / "my.rules"
    graphsub.save(relu_relu_identity(), model)
    mine.write_text(MINE)
    common = [str(model), "--cost", "analytic", "--algorithm", "greedy", "--time-limit", "6",
              "--candidates", "1", "--no-peers", "--no-fission", "--rules", str(mine), "--json"]
    runner = CliRunner()
    added = runner.invoke(app, ["optimize", *common, "-o", str(tmp_path / "a.onnx")])
    assert added.exit_code == 0, added.output
    report = json.loads(added.stdout)  # the candidate's rewrites, whether or not it is kept
    assert set(report["candidates"][0]["rules"]) == {"remove-identity", "my-relu-relu"}
    assert not any("normal form" in note for note in report["notes"])
    alone = runner.invoke(app, ["optimize", *common, "--rules-only",
                                "-o", str(tmp_path / "b.onnx")])
    assert alone.exit_code == 0, alone.output
    report = json.loads(alone.stdout)
    assert set(report["candidates"][0]["rules"]) == {"my-relu-relu"}
    assert "the library's normal form is not applied (rules only): no rule given declares the " \
           "normal-form role, so there is none" in report["notes"]
