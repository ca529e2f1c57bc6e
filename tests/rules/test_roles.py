"""Roles declared, not inferred: a rule file says what its rules are for (`roles: ...`), a rule
may say its own, and every part of graphsub that reads rules chooses them by role."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphsub.fission.primitives import (cleanup_rules, fission_rules, kernel_rules, own_rules,
                                         primitive_rules)
from graphsub.rules import (RuleSyntaxError, builtin_rules, library_files, load_rules,
                            parse_rules, print_rule, print_rules)
from graphsub.rules.roles import DEFAULT_ROLES, Role, with_role
from graphsub.rules.taso import TasoOp, TasoRule, convert_rule
from graphsub.rules.roles import Role, with_role

FISSION_FOLDER = Path(own_rules()[0].origin).parent

# What the rule files' names chose before roles were declared (search.normal_form's
# NORMAL_FORM_FILES: the library's activations, attention and cleanup files; fission's
# files loaded by path), written out so that the declarations are checked to choose the same.
NORMAL_FORM = [
    # activations.rules
    "gelu-kernel", "gelu-tanh-kernel", "gelu-tanh-factored",
    # attention.rules
    "matmul-unflattened-batch", "division-by-scalar-as-scaling", "softmax-in-its-own-precision",
    "softmax-in-its-own-precision-float16", "attention-scaled-scores",
    "attention-unscaled-scores", "attention-masked-scaled-scores",
    "attention-masked-unscaled-scores", "attention-guarded-masked-scores",
    "attention-query-scale", "attention-masked-query-scale", "attention-key-scale",
    "attention-masked-key-scale", "attention-causal-mask", "attention-shared-key-value-heads",
    "attention-masked-shared-key-value-heads",
    # cleanup.rules
    "remove-identity", "remove-dropout", "remove-noop-transpose", "fold-transpose-pair",
    "remove-noop-reshape", "fold-reshape-pair", "fold-squeeze-unsqueeze",
    "fold-unsqueeze-squeeze", "remove-noop-flatten", "concat-of-split", "split-of-concat",
    "softmax-guard-unneeded", "remove-noop-cast", "fold-cast-same", "cast-round-trip",
    "fold-widening-casts"]
CLEANUP = NORMAL_FORM[19:]  # the library's cleanup.rules
FISSION = ["softmax-fission", "log-softmax-fission", "layer-norm-fission",
           "layer-norm-fission-no-bias", "rms-norm-fission", "batch-norm-fission", "gelu-fission",
           "gelu-tanh-fission", "attention-fission", "causal-attention-fission",
           "grouped-attention-fission", "square-as-product", "cube-as-product",
           "divide-by-constant", "product-with-reciprocal", "scalar-multiplication"]
KERNEL = ["softmax-kernel", "log-softmax-kernel", "layer-norm-kernel",
          "layer-norm-no-bias-kernel", "rms-norm-kernel", "batch-norm-kernel",
          "attention-kernel", "causal-attention-kernel",
          *NORMAL_FORM[:3]]  # kernels.rules, then the library's activations.rules
#: The merge form's (merge.rules): the products' merges and the scale folds.
MERGE = ["merge-matmuls-shared-input", "merge-linears-shared-input", "scale-before-flattening",
         "scale-into-product-weight"]
PRIMITIVE = ["reduce-sum-as-matmul", "matmul-ones-as-reduce-sum", "matmul-delay-row-scale",
             "matmul-early-row-scale", "merge-batched-matmuls-shared-input"]


def test_each_part_reads_the_same_built_in_rules_as_when_file_names_chose_them():
    assert [r.name for r in with_role(builtin_rules(check=False), Role.NORMAL_FORM)] == NORMAL_FORM
    assert [r.name for r in fission_rules()] == FISSION
    assert [r.name for r in kernel_rules()] == KERNEL
    assert [r.name for r in primitive_rules()] == PRIMITIVE
    assert [r.name for r in cleanup_rules()] == CLEANUP
    assert [r.name for r in with_role(builtin_rules(check=False), Role.MERGE)] == MERGE


def test_the_search_reads_every_library_rule_and_none_of_fission_s():
    library = load_rules(library_files(), check=False)
    assert len(library) == 98
    assert with_role(library, Role.SEARCH) == library == builtin_rules(check=False)
    assert with_role(own_rules(), Role.SEARCH) == library
    ours = [r for r in own_rules() if Path(r.origin).parent == FISSION_FOLDER]
    assert len(ours) == len(FISSION) + 8 + len(PRIMITIVE)
    assert not with_role(ours, Role.SEARCH) and not with_role(ours, Role.NORMAL_FORM)


def test_a_file_declares_its_roles_and_a_rule_its_own():
    text = """
# A header comment, then the file's roles.
roles: normal-form, search

# the first rule's documentation
rule a: (relu ?x) => ?x

rule b:
  roles: kernel
  (tanh ?x) => ?x
"""
    a, b = parse_rules(text, origin="mine.rules")
    assert a.roles == {Role.NORMAL_FORM, Role.SEARCH} and a.doc == "the first rule's documentation"
    assert b.roles == {Role.KERNEL}
    (plain,) = parse_rules("rule c: (relu ?x) => ?x")
    assert plain.roles == DEFAULT_ROLES == {Role.SEARCH}
    (tight,) = parse_rules("roles:cleanup\nrule d: (relu ?x) => ?x")  # no space after ':'
    assert tight.roles == {Role.CLEANUP}


def test_roles_print_and_parse_back():
    rules = parse_rules("roles: kernel, normal-form\nrule a: (relu ?x) => ?x\n"
                        "rule b:\n  roles: search\n  (tanh ?x) => ?x\n")
    assert print_rule(rules[0]).splitlines()[:2] == ["rule a:", "  roles: normal-form, kernel"]
    assert "roles" not in print_rule(rules[1])  # the default is not written
    assert parse_rules(print_rules(rules)) == rules
    assert [r.roles for r in parse_rules(print_rules(rules))] == [r.roles for r in rules]


def test_roles_take_part_in_what_a_rule_is():
    (search,) = parse_rules("rule a: (relu ?x) => ?x")
    (kernel,) = parse_rules("roles: kernel\nrule a: (relu ?x) => ?x")
    assert search != kernel


@pytest.mark.parametrize("text, message", [
    ("roles: normal_form\nrule a: (relu ?x) => ?x",
     r"mine\.rules:1: unknown role 'normal_form'; the roles are normal-form, search, merge, fission, "
     r"kernel, primitive, cleanup"),
    ("rule a:\n  roles: search, kernels\n  (relu ?x) => ?x",
     r"mine\.rules:2: unknown role 'kernels'"),
    ("rule a: (relu ?x) => ?x\nroles: search", r"mine\.rules:2: a file declares its roles before "
                                               r"its first rule"),
    ("roles: search\nroles: kernel\nrule a: (relu ?x) => ?x",
     r"mine\.rules:2: the file's roles are declared twice \(first on line 1\)"),
    ("roles search\nrule a: (relu ?x) => ?x", r"mine\.rules:1: expected ':' after 'roles'"),
])
def test_an_unknown_or_misplaced_role_is_an_error_naming_file_and_line(text, message):
    with pytest.raises(RuleSyntaxError, match=message):
        parse_rules(text, origin="mine.rules")


def test_a_rule_file_without_roles_loads_as_search_rules(tmp_path):
    path = tmp_path / "mine.rules"
    path.write_text("rule my-relu-relu: (relu (relu ?x)) => (relu ?x)\n")
    (rule,) = load_rules([path])
    assert rule.roles == {Role.SEARCH}


def test_taso_rules_are_search_rules():
    add = TasoOp(16, [(-1, 0), (-2, 0)], {})  # EW_ADD x1 x2 => EW_ADD x2 x1
    swapped = TasoOp(16, [(-2, 0), (-1, 0)], {})
    rule = convert_rule(TasoRule(0, [add], [swapped], [(0, 0, 0, 0)]))
    assert rule.roles == {Role.SEARCH}
