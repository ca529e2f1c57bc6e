"""Import of TASO's rule file (graph_subst.pb) into graphsub rules.

The file is a protobuf (schema in ../shared/data/README.md); it is small and flat, so a
varint decoder of a few lines reads it without generated code. Each TASO rule is a list of
source ops and target ops whose inputs are external variables (negative ids) or outputs of
ops on the same side, plus a mapping of source outputs to target outputs.

TASO applies convolution rules to any kernel size (its loader ignores KERNEL_H/W) and infers
the group count from shapes, as graphsub's conv2d does. Split sizes, which TASO takes from
the shapes at hand, are written as expressions over the shapes of the source outputs that the
split outputs replace.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from graphsub.errors import GraphsubError
from graphsub.rules.ast import AVar, Call, Expr, ListExpr, Lit, OpTerm, OutRef, Rule, Term, Var
from graphsub.rules.matcher import SAME_SHAPES
from graphsub.rules.roles import Role

if TYPE_CHECKING:
    from graphsub.rules.check import Decision

OP_NAMES = {0: "INPUT", 1: "WEIGHT", 2: "ANY", 3: "CONV2D", 4: "DROPOUT", 5: "LINEAR",
            6: "POOL2D_MAX", 7: "POOL2D_AVG", 8: "RELU", 9: "SIGMOID", 10: "TANH",
            11: "BATCHNORM", 12: "CONCAT", 13: "SPLIT", 14: "RESHAPE", 15: "TRANSPOSE",
            16: "EW_ADD", 17: "EW_MUL", 18: "MATMUL", 19: "MUL", 20: "ENLARGE",
            21: "MERGE_GCONV", 22: "CONSTANT_IMM", 23: "CONSTANT_ICONV", 24: "CONSTANT_ONE",
            25: "CONSTANT_POOL"}
PM = {0: "OP_TYPE", 1: "NUM_INPUTS", 2: "NUM_OUTPUTS", 3: "GROUP", 4: "KERNEL_H", 5: "KERNEL_W",
      6: "STRIDE_H", 7: "STRIDE_W", 8: "PAD", 9: "ACTI", 10: "NUMDIM", 11: "AXIS", 12: "PERM",
      13: "OUTSHUFFLE", 14: "MERGE_GCONV_COUNT", 15: "AXES", 16: "KEEP_DIMS", 17: "EPSILON"}
ACTIVATIONS = {0: "none", 1: "sigmoid", 2: "relu", 3: "tanh"}


# ---- protobuf wire format ------------------------------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of one message: ints for varints, bytes for messages."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            if value >= 1 << 63:
                value -= 1 << 64  # negative int32s are written as 10-byte varints
            out.append((number, value))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            out.append((number, buf[pos:pos + length]))
            pos += length
        else:
            raise GraphsubError(f"unexpected protobuf wire type {wire}")
    return out


@dataclass
class TasoOp:
    type: int
    inputs: list[tuple[int, int]]  # (op id or negative variable, output index)
    params: dict[str, int]

    @property
    def name(self) -> str:
        return OP_NAMES.get(self.type, str(self.type))


@dataclass
class TasoRule:
    number: int
    src: list[TasoOp]
    dst: list[TasoOp]
    mapping: list[tuple[int, int, int, int]]  # src op, dst op, src output, dst output


def _message(value: int | bytes) -> bytes:
    """A field's embedded message (a length-delimited field); an integer there is a file
    that is not TASO's."""
    if not isinstance(value, bytes):
        raise GraphsubError("a message field holds an integer")
    return value


def _op(buf: bytes) -> TasoOp:
    op = TasoOp(0, [], {})
    for num, val in _fields(buf):
        if num == 1:
            op.type = int(val)
        elif num == 2:
            t = dict(_fields(_message(val)))
            op.inputs.append((int(t.get(1, 0)), int(t.get(2, 0))))
        elif num == 3:
            p = dict(_fields(_message(val)))
            op.params[PM.get(int(p.get(1, 0)), str(p.get(1)))] = int(p.get(2, 0))
    return op


def read_taso_rules(path: str | Path) -> list[TasoRule]:
    """The rules of TASO's protobuf rule file (graph_subst.pb)."""
    try:
        return _read_taso_rules(Path(path).read_bytes())
    except (GraphsubError, IndexError) as exc:  # a truncated varint runs off the end
        raise GraphsubError(f"{path} is not a TASO rule file ({exc or 'truncated'}); give "
                            "TASO's graph_subst.pb, or a graphsub .rules file") from None


def _read_taso_rules(data: bytes) -> list[TasoRule]:
    rules: list[TasoRule] = []
    for num, rbuf in _fields(data):
        if num != 1:
            continue
        src, dst, mapping = [], [], []
        for rn, rv in _fields(_message(rbuf)):
            if rn == 1:
                src.append(_op(_message(rv)))
            elif rn == 2:
                dst.append(_op(_message(rv)))
            elif rn == 3:
                m = dict(_fields(_message(rv)))
                mapping.append((int(m.get(1, 0)), int(m.get(2, 0)), int(m.get(3, 0)),
                                int(m.get(4, 0))))
        rules.append(TasoRule(len(rules), src, dst, mapping))
    return rules


# ---- conversion -----------------------------------------------------------------------------

class Unsupported(Exception):
    pass


def _attr_terms(op: TasoOp) -> tuple[tuple[str, Expr], ...]:
    p = op.params
    if op.name == "CONV2D":
        return (("stride", ListExpr((Lit(p.get("STRIDE_H", 1)), Lit(p.get("STRIDE_W", 1))))),
                ("padding", Lit("same" if p.get("PAD", 0) == 0 else "valid")),
                ("dilation", ListExpr((Lit(1), Lit(1)))),
                ("activation", Lit(ACTIVATIONS[p.get("ACTI", 0)])))
    if op.name == "MATMUL":
        return (("activation", Lit(ACTIVATIONS[p.get("ACTI", 0)])),)
    if op.name in ("CONCAT",):
        return (("axis", Lit(p["AXIS"])),)
    if op.name in ("EW_ADD", "EW_MUL"):
        return ((SAME_SHAPES, Lit(True)),)  # TASO's element-wise ops do not broadcast
    return ()


_SIMPLE = {"EW_ADD": "add", "EW_MUL": "mul", "RELU": "relu", "SIGMOID": "sigmoid",
           "TANH": "tanh", "MATMUL": "matmul", "CONV2D": "conv2d", "CONCAT": "concat"}


def _convert_side(ops: list[TasoOp], is_source: bool,
                  split_sizes: dict[int, Expr]) -> list[list[Term]]:
    """Terms for every output of every op of one side."""
    outs: list[list[Term]] = []
    for i, op in enumerate(ops):
        args: list[Term] = []
        for src, idx in op.inputs:
            if src < 0:
                args.append(Var(f"x{-src}"))
            else:
                args.append(outs[src][idx])
        if op.name in _SIMPLE:
            term = OpTerm(_SIMPLE[op.name], _attr_terms(op), tuple(args))
            outs.append([term])
        elif op.name == "SPLIT":
            axis = op.params["AXIS"]
            n = op.params.get("NUM_OUTPUTS", 2)
            attrs: tuple[tuple[str, Expr], ...] = (("axis", Lit(axis)),)
            if not is_source:
                if i not in split_sizes:
                    raise Unsupported("split whose outputs are not all mapped to source outputs")
                attrs += (("sizes", split_sizes[i]),)
            outs.append([OpTerm("split", attrs, tuple(args), k) for k in range(n)])
        else:
            raise Unsupported(f"op {op.name}")
    return outs


def ungrouped_conditions(terms: tuple[Term, ...]) -> tuple[Expr, ...]:
    """(eq (dim ?w 1) (dim ?x 1)) for every source convolution over two variables."""
    conds: list[Expr] = []

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            x, w = (t.args + (None, None))[:2]
            if t.op == "conv2d" and isinstance(x, Var) and isinstance(w, Var):
                cond = Call("eq", (Call("dim", (AVar(w.name), Lit(1))),
                                   Call("dim", (AVar(x.name), Lit(1)))))
                if cond not in conds:
                    conds.append(cond)
            for a in t.args:
                walk(a)

    for t in terms:
        walk(t)
    return tuple(conds)


def matrix_conditions(terms: tuple[Term, ...]) -> tuple[Expr, ...]:
    """(eq (rank ?x) 2) for every variable of a rule with a matmul: TASO's rules multiply
    matrices, and their concatenation axes (0: rows, 1: columns) are a matrix's. graphsub's
    matmul, like numpy's, also takes vectors, for which associativity and distributivity fail
    (a vector is a row on one side of the product and a column on the other), and batches that
    broadcast, where axis 1 is no longer the columns (rule 76 with x1 [2 4 4], x4 and x5
    [4 4]: [2 8 4] one way, [2 4 8] the other)."""
    has_matmul = False
    names: list[str] = []

    def walk(t: Term) -> None:
        nonlocal has_matmul
        if isinstance(t, Var):
            if t.name not in names:
                names.append(t.name)
        elif isinstance(t, OpTerm):
            has_matmul |= t.op == "matmul"
            for a in t.args:
                walk(a)

    for t in terms:
        walk(t)
    if not has_matmul:
        return ()
    return tuple(Call("eq", (Call("rank", (AVar(n),)), Lit(2))) for n in names)


def convert_rule(tr: TasoRule, ungrouped: bool = False) -> Rule:
    """One TASO rule in graphsub form (raises Unsupported). With `ungrouped`, its source
    convolutions are restricted to ungrouped ones."""
    # Split sizes in the target: split output k replaces some source output, whose extent
    # along the split axis is the size.
    split_sizes: dict[int, Expr] = {}
    for j, op in enumerate(tr.dst):
        if op.name != "SPLIT":
            continue
        n = op.params.get("NUM_OUTPUTS", 2)
        axis = op.params["AXIS"]
        sizes: list[Expr | None] = [None] * n
        for k, (_, d_op, _, d_ts) in enumerate(tr.mapping):
            if d_op == j:
                sizes[d_ts] = Call("dim", (OutRef(k), Lit(axis)))
        if all(s is not None for s in sizes):
            split_sizes[j] = ListExpr(tuple(s for s in sizes if s is not None))
    src = _convert_side(tr.src, True, {})
    dst = _convert_side(tr.dst, False, split_sizes)
    sources = tuple(src[s_op][s_ts] for s_op, _, s_ts, _ in tr.mapping)
    targets = tuple(dst[d_op][d_ts] for _, d_op, _, d_ts in tr.mapping)
    conditions = matrix_conditions(sources)
    conditions += ungrouped_conditions(sources) if ungrouped else ()
    doc = f"TASO graph_subst.pb rule {tr.number}"
    if ungrouped:
        doc += " (restricted to ungrouped convolutions: it fails for grouped ones)"
    # TASO's file says nothing of roles: its rules are for the search, as a rule file of the
    # user's that declares none (graphsub.rules.roles)
    return Rule(f"taso-{tr.number}", sources, targets, conditions=conditions, doc=doc,
                origin=f"taso:{tr.number}", roles=frozenset({Role.SEARCH}))


@dataclass
class TasoImport:
    rules: list[Rule]
    total: int
    skipped: dict[int, str] = field(default_factory=dict)
    restricted: list[int] = field(default_factory=list)  # held only for ungrouped convolutions

    def summary(self) -> str:
        reasons = Counter(self.skipped.values())
        text = f"{len(self.rules)} of {self.total} TASO rules imported"
        if self.restricted:
            text += (f" ({len(self.restricted)} restricted to ungrouped convolutions: "
                     f"{', '.join(map(str, self.restricted))})")
        if reasons:
            text += "; skipped: " + ", ".join(f"{n} ({r})" for r, n in reasons.most_common())
        return text


def import_taso_rules(path: str | Path, check: bool = True,
                      decide: Decision | None = None) -> TasoImport:
    """Convert TASO's rules; with `check`, each is decided (`decide`: the numerical check by
    default) under graphsub's semantics, and one that fails is retried restricted to
    ungrouped convolutions (TASO's verifier does not model groups) before it is skipped."""
    from graphsub.rules.check import CheckedRules, RuleCheckError, numerical_check

    taso = read_taso_rules(path)
    result = TasoImport([], len(taso))
    with CheckedRules.load(decide or numerical_check) as passed:
        for tr in taso:
            try:
                rule = convert_rule(tr)
            except (Unsupported, KeyError) as exc:
                result.skipped[tr.number] = str(exc)
                continue
            if check:
                try:
                    passed.check(rule)
                except RuleCheckError:
                    rule = convert_rule(tr, ungrouped=True)
                    try:
                        passed.check(rule)
                    except RuleCheckError as exc:
                        first = str(exc).splitlines()[0]
                        result.skipped[tr.number] = (
                            "numerically wrong under graphsub's semantics" if "wrong" in first
                            else "untestable")
                        continue
                    result.restricted.append(tr.number)
            result.rules.append(rule)
    return result
