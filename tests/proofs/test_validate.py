"""Validation of the operator properties (TASO section 3): symbolic execution on small tensors,
consistency and redundancy of the axiom set."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import z3

from graphsub.tensors.types import TensorType
from graphsub.ops import get_op
from graphsub.proofs.axioms import (
    ACT_NONE,
    ACT_RELU,
    PAD_SAME,
    PAD_VALID,
    Axiom,
    axioms,
    signature,
)
from graphsub.proofs.validate import (
    SHAPES,
    Bounds,
    Property,
    axiom_properties,
    c_pool,
    check_axioms,
    check_consistency,
    check_redundancy,
    concat,
    conv,
    enlarge,
    formula_property,
    instances,
    kernel_of,
    matmul,
    pool_avg,
    pool_max,
    split0,
    split1,
    step_count,
    transpose,
    validate_axiom,
    validate_property,
)

# Small enough for a test, large enough for odd and even sizes, SAME padding that is
# asymmetric, strides and dilations.
SMALL = Bounds(dims=(1, 2), spatial=(2, 3), kernels=(1, 3), strides=(1, 2), dilations=(1, 2))

IMAGE, KERNEL = (1, "c", "H", "H"), ("o", "c", "K", "K")


def names() -> list[str]:
    return [a.name for a in axioms()]


def test_every_axiom_has_a_validation_entry_with_instances():
    assert set(SHAPES) == set(axiom_properties()) == set(names())
    for name, prop in axiom_properties().items():
        assert any(True for _ in instances(prop, SMALL)), name


# ---- the symbolic operators are graphsub's operators ---------------------------------------

def numbers(shape, rng) -> np.ndarray:
    return rng.integers(-4, 5, size=shape).astype(np.float64)


def symbolic(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.shape, dtype=object)
    for idx in np.ndindex(*values.shape):
        out[idx] = z3.RealVal(int(values[idx]))
    return out


def evaluated(t: np.ndarray) -> np.ndarray:
    out = np.empty(t.shape)
    for idx in np.ndindex(*t.shape):
        out[idx] = float(Fraction(z3.simplify(t[idx]).as_fraction()))
    return out


def numeric(op: str, xs: list[np.ndarray], **attrs) -> np.ndarray:
    opdef = get_op(op)
    types = tuple(TensorType(x.shape, "float64") for x in xs)
    return opdef.evaluate(opdef.make_attrs(attrs, types), xs)[0]


PAD = {PAD_SAME: "same", PAD_VALID: "valid"}


@pytest.mark.parametrize("stride,dilation,padding,x_shape,w_shape", [
    (1, 1, PAD_SAME, (1, 2, 4, 4), (3, 2, 3, 3)),
    (2, 1, PAD_SAME, (2, 2, 4, 5), (2, 2, 2, 3)),
    (2, 2, PAD_SAME, (1, 1, 5, 4), (2, 1, 3, 2)),
    (1, 2, PAD_VALID, (1, 4, 5, 5), (4, 2, 2, 2)),  # two groups
    (2, 1, PAD_VALID, (1, 2, 5, 4), (2, 1, 3, 3)),  # depth-wise
])
def test_symbolic_conv_computes_graphsubs_conv2d(stride, dilation, padding, x_shape, w_shape):
    rng = np.random.default_rng(0)
    x, w = numbers(x_shape, rng), numbers(w_shape, rng)
    got = evaluated(conv(stride, dilation, padding, ACT_NONE, symbolic(x), symbolic(w)))
    want = numeric("conv2d", [x, w], stride=stride, dilation=dilation, padding=PAD[padding])
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("kernel,stride,padding,count_include_pad", [
    ((3, 3), 1, PAD_SAME, False), ((3, 3), 1, PAD_SAME, True), ((2, 2), 2, PAD_SAME, False),
    ((2, 3), 2, PAD_VALID, False), ((3, 3), 2, PAD_SAME, True),
])
def test_symbolic_pooling_computes_graphsubs_pooling(kernel, stride, padding, count_include_pad):
    x = numbers((2, 2, 5, 4), np.random.default_rng(1))
    attrs = {"kernel": kernel, "stride": stride, "padding": PAD[padding]}
    np.testing.assert_allclose(evaluated(pool_max(kernel, stride, padding, symbolic(x))),
                               numeric("max_pool2d", [x], **attrs))
    np.testing.assert_allclose(
        evaluated(pool_avg(kernel, stride, padding, symbolic(x), count_include_pad)),
        numeric("avg_pool2d", [x], count_include_pad=count_include_pad, **attrs))


def test_symbolic_data_movement_and_matmul_compute_graphsubs_operators():
    rng = np.random.default_rng(2)
    a, b, w = numbers((2, 3), rng), numbers((3, 4), rng), numbers((2, 3, 1, 3), rng)
    np.testing.assert_allclose(evaluated(matmul(symbolic(a), symbolic(b))),
                               numeric("matmul", [a, b]))
    np.testing.assert_allclose(evaluated(transpose(symbolic(a))),
                               numeric("transpose", [a], perm=(1, 0)))
    np.testing.assert_allclose(evaluated(concat(0, symbolic(a), symbolic(b.T))),
                               numeric("concat", [a, b.T], axis=0))
    np.testing.assert_allclose(evaluated(enlarge((3, 5), symbolic(w))),
                               numeric("enlarge", [w], kernel=(3, 5)))
    split = get_op("split")
    halves = split.evaluate(split.make_attrs({"axis": 1, "sizes": (1, 2)},
                                             (TensorType(a.shape, "float64"),)), [a])
    np.testing.assert_allclose(evaluated(split0(1, symbolic(a), 1)), halves[0])
    np.testing.assert_allclose(evaluated(split1(1, symbolic(a), 1)), halves[1])


def test_c_pool_is_the_depthwise_averaging_kernel():
    """TASO figure 8b and merge.rules' avgpool-as-depthwise-conv: (C, 1, kh, kw), 1/(kh*kw)."""
    k = c_pool((2, 3), 4)
    assert k.shape == (4, 1, 2, 3)
    assert all(z3.simplify(e).as_fraction() == Fraction(1, 6) for e in k.flat)


# ---- the axioms, validated -----------------------------------------------------------------

@pytest.mark.parametrize("name", names())
def test_axiom_validates_on_small_tensors(name):
    result = validate_axiom(name, SMALL)
    assert result.instances > 0
    assert result.status == "valid", result


def test_table_2_form_of_enlarge_fails_at_stride_2_on_even_sizes():
    """Table 2 states enlarge for any stride; graphsub's axiom is narrowed to stride 1 because
    SAME padding of an even-sized input at stride 2 puts the odd pixel at the end."""
    s = signature()
    st, c, k = z3.Ints("s c k")
    x, y = z3.Consts("x y", s.T)
    any_stride = z3.ForAll([st, c, k, x, y], s.conv(st, 1, PAD_SAME, c, x, y)
                           == s.conv(st, 1, PAD_SAME, c, x, s.enlarge(k, y)))
    result = validate_property(formula_property("enlarge-any-stride", any_stride,
                                                SHAPES["conv-enlarge"]), SMALL)
    cex = result.counterexample
    assert result.status == "invalid" and cex is not None
    assert cex.params["s"] == 2 and cex.shapes["x"][2] % 2 == 0


def test_table_2_form_of_c_pool_fails_with_same_padding():
    """Table 2 states C_pool for any padding; graphsub's average pooling does not count padded
    cells, so the axiom is narrowed to VALID padding. Counting them, SAME holds too."""
    s = signature()
    st, p, k = z3.Ints("s p k")
    x = z3.Const("x", s.T)
    any_padding = z3.ForAll([st, p, x, k], s.conv(st, 1, p, ACT_NONE, x, s.c_pool(k))
                            == s.pool_avg(k, st, p, x))
    result = validate_property(formula_property("cpool-any-padding", any_padding,
                                                SHAPES["conv-cpool"]), SMALL)
    cex = result.counterexample
    assert result.status == "invalid" and cex is not None
    assert cex.params["p"] == PAD_SAME and cex.params["cip"] is False

    def counted(v):
        k = kernel_of(v.k)
        return (conv(v.s, 1, v.p, ACT_NONE, v.x, c_pool(k, v.x.shape[1])),
                pool_avg(k, v.s, v.p, v.x, True))

    prop = Property("conv-cpool-counted", counted, ({"x": IMAGE},), ("s", "p", "k"))
    assert validate_property(prop, SMALL).status == "valid"


# ---- user-given properties: wrong ones are rejected ----------------------------------------

def conv_linearity(activation: int) -> z3.BoolRef:
    s = signature()
    st, d, p = z3.Ints("s d p")
    x, y, w = z3.Consts("x y w", s.T)
    return z3.ForAll([st, d, p, x, y, w],
                     s.conv(st, d, p, activation, s.ewadd(x, y), w)
                     == s.ewadd(s.conv(st, d, p, activation, x, w),
                                s.conv(st, d, p, activation, y, w)))


LINEARITY_SHAPES = ({"x": IMAGE, "y": IMAGE, "w": KERNEL},)


def test_conv_is_not_linear_with_relu():
    """TASO section 3's example of a wrong property the validation must reject."""
    bad = formula_property("conv-linear-relu", conv_linearity(ACT_RELU), LINEARITY_SHAPES)
    result = validate_property(bad, SMALL)
    assert result.status == "invalid"
    cex = result.counterexample
    assert cex is not None and cex.index is not None and cex.lhs != cex.rhs
    assert set(cex.params) == {"s", "d", "p"} and set(cex.shapes) == {"x", "y", "w"}


def test_conv_is_linear_without_activation():
    good = formula_property("conv-linear", conv_linearity(ACT_NONE), LINEARITY_SHAPES)
    result = validate_property(good, SMALL)
    assert result.status == "valid" and result.instances > 0


def test_concat_is_not_commutative():
    swapped = Property("concat-comm", lambda v: (concat(0, v.x, v.y), concat(0, v.y, v.x)),
                       ({"x": ("m", "n"), "y": ("m", "n")},))
    result = validate_property(swapped, SMALL)
    cex = result.counterexample
    assert result.status == "invalid" and cex is not None
    assert cex.index is not None and cex.lhs != cex.rhs  # same shape, different elements


def test_filter_concatenation_holds_for_ungrouped_convolutions_only():
    formula = next(a.formula for a in axioms() if a.name == "concat-conv-filters")
    grouped = ({"x": IMAGE, "y": ("o", "g", "K", "K"), "z": ("o2", "g", "K", "K")},)
    result = validate_property(formula_property("grouped", formula, grouped), SMALL)
    assert result.status == "invalid"
    assert result.counterexample.shapes["y"][1] < result.counterexample.shapes["x"][1]


def test_shapes_must_cover_the_tensor_variables():
    with pytest.raises(ValueError, match="shapes"):
        formula_property("linear", conv_linearity(ACT_NONE), ({"x": IMAGE, "y": IMAGE},))


# ---- consistency and redundancy -------------------------------------------------------------

def test_the_axioms_are_consistent():
    result = check_consistency(timeout_ms=300)
    assert result.status == "sat"
    assert result.distinct in ("sat", "unknown")  # never unsat: no collapse found


def test_a_collapsing_axiom_is_caught():
    """concat commutative plus split-of-concat makes every two tensors equal."""
    s = signature()
    x, y = z3.Consts("x y", s.T)
    bad = Axiom("concat-comm", z3.ForAll([x, y], s.concat(0, x, y) == s.concat(0, y, x)))
    result = check_consistency(timeout_ms=2_000, axiom_set=[*axioms(), bad])
    assert result.status == "sat" and result.distinct == "unsat"


def test_a_redundant_axiom_is_reported_and_real_ones_are_not():
    s = signature()
    x, y = z3.Consts("x y", s.T)
    dup = Axiom("ewadd-comm-again", z3.ForAll([x, y], s.ewadd(y, x) == s.ewadd(x, y)))
    seen: list[str] = []
    (result,) = check_redundancy(2_000, [*axioms(), dup], names={dup.name},
                                 on_progress=seen.append)
    assert result.status == "redundant" and seen == [f"redundancy {dup.name}: redundant"]
    others = check_redundancy(100, names={"ewadd-comm", "conv-relu"})
    assert [r.name for r in others] == ["ewadd-comm", "conv-relu"]
    assert all(r.status in ("independent", "unknown") for r in others)


@pytest.mark.slow
def test_check_axioms_reports_everything_with_progress():
    """The report's shape and progress lines. Every query gets 50 ms (instances too: with the
    default 5 s, a machine on which Z3 gives up on some instances spent ten minutes here), so
    answers may be `unknown`; the consistency and redundancy tests above check the answers."""
    tiny = Bounds(dims=(1,), spatial=(2,), kernels=(1,), strides=(2,), dilations=(1,))
    lines: list[str] = []
    report = check_axioms(timeout_ms=50, bounds=tiny, instance_timeout_ms=50,
                          on_progress=lines.append)
    assert len(lines) == step_count() == 2 * len(axioms()) + 1
    assert [v.name for v in report.validations] == names()
    assert all(v.instances > 0 for v in report.validations)
    assert report.consistency.status in ("sat", "unknown")
    data = json.loads(json.dumps(report.to_dict()))
    validation, redundancy = data["validation"], data["redundancy"]
    assert validation["valid"] + validation["invalid"] + validation["unknown"] == 43
    assert redundancy["redundant"] + redundancy["independent"] + redundancy["unknown"] == 43
    assert data["ok"] == report.ok == (validation["invalid"] == redundancy["redundant"] == 0)
