"""What the generator enumerates: families of input tensors and the operators over them.

TASO's generator runs over one pool of inputs: matrices (x1..x3 of 2x4, w1..w3 of 4x4), images
(i1..i3 of 2x4x5x5), kernels (3x3, 1x3 and 3x1, three of each, and a depthwise 3x3), a scalar,
and the constants. Here a tensor is in the pool only when some chosen operator can use it
(the scalar with smul, the 1x3 and 3x1 kernels with enlarge, each constant with the operator
it is the identity of). Matrices and images never meet in one operator, so a graph mixing them is
two unrelated graphs side by side; graphsub enumerates each *family* on its own (with the
scalar and the constants that fit it), which gives the same substitutions for a fraction of
the graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphsub.generate.enumerate import GeneratorInput
from graphsub.generate.opset import DEFAULT_OPS, OPS


@dataclass(frozen=True)
class Family:
    name: str
    inputs: tuple[GeneratorInput, ...]
    ops: tuple[str, ...]  # the operators that apply to these tensors


MATRIX_OPS = frozenset({"ewadd", "ewmul", "smul", "relu", "transpose", "matmul", "concat",
                        "split"})
IMAGE_OPS = frozenset({"ewadd", "ewmul", "smul", "relu", "conv", "conv-strided", "enlarge",
                       "avg-pool", "max-pool", "concat", "split"})
#: Operator-fission primitives beyond Table 1; they work on matrices.
EXTENSION_OPS = frozenset({"sub", "div", "exp", "reduce-sum"})


def _matrix_family(ops: Sequence[str], variables: int) -> Family:
    inputs = [GeneratorInput(f"x{i}", (2, 4)) for i in range(1, variables + 1)]
    inputs += [GeneratorInput(f"w{i}", (4, 4)) for i in range(1, variables + 1)]
    if "smul" in ops:
        inputs.append(GeneratorInput("s0", ()))
    if "matmul" in ops:
        inputs.append(GeneratorInput("I_matmul", (4, 4), "i-matmul", (("size", 4),)))
    return Family("matrix", tuple(inputs),
                  tuple(o for o in ops if o in MATRIX_OPS | EXTENSION_OPS))


def _image_family(ops: Sequence[str], variables: int) -> Family:
    inputs = [GeneratorInput(f"i{i}", (2, 4, 5, 5)) for i in range(1, variables + 1)]
    for kh, kw in ((3, 3), (1, 3), (3, 1)):
        if (kh, kw) != (3, 3) and "enlarge" not in ops:
            continue  # 1x3 and 3x1 kernels serve the enlarge rules
        inputs += [GeneratorInput(f"k{kh}{kw}_{i}", (4, 4, kh, kw), kernel=True)
                   for i in range(1, variables + 1)]
    inputs.append(GeneratorInput("kdw", (4, 1, 3, 3), kernel=True))  # depthwise (grouped) kernel
    if "smul" in ops:
        inputs.append(GeneratorInput("s0", ()))
    convs = {"conv", "conv-strided"} & set(ops)
    if convs and "avg-pool" in ops:
        inputs.append(GeneratorInput("C_pool", (4, 1, 3, 3), "c-pool",
                                (("channels", 4), ("kernel", (3, 3)))))
    if convs:
        inputs.append(GeneratorInput("I_conv", (4, 4, 3, 3), "i-conv",
                                (("channels", 4), ("kernel", (3, 3)))))
    if "ewmul" in ops:
        inputs.append(GeneratorInput("I_ewmul", (2, 4, 5, 5), "i-ewmul",
                                     (("shape", (2, 4, 5, 5)),)))
    return Family("image", tuple(inputs), tuple(o for o in ops if o in IMAGE_OPS))


def families(ops: Sequence[str] = DEFAULT_OPS, variables: int = 3) -> list[Family]:
    """TASO's input pool split by family, keeping the families some operator applies to.

    `variables` is how many interchangeable tensors of each kind there are (TASO: 3)."""
    unknown = set(ops) - set(OPS)
    if unknown:
        raise ValueError(f"unknown generator operators {sorted(unknown)}; known: {sorted(OPS)}")
    out = []
    for fam in (_matrix_family(ops, variables), _image_family(ops, variables)):
        structural = set(fam.ops) - {"concat", "split", "ewadd", "ewmul", "smul", "relu"}
        if structural or (fam.name == "matrix" and fam.ops):
            out.append(fam)
    return out
