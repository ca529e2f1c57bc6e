"""Operators' ONNX importers keep what graphsub does not model for the import to leave
opaque: they return None, or raise a GraphsubError the import catches."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphsub.errors import OpAttributeError
from graphsub.onnx_io.importer import ImportContext
from graphsub.ops import importer_for


def test_a_cast_imports_unless_graphsub_or_onnx_lacks_its_element_type():
    ctx = ImportContext(21, {"": 21})
    ctx.values["x"] = ctx.weight(np.linspace(-1, 1, 4, dtype=np.float32))
    cast = importer_for("Cast")
    (y,) = cast(ctx, helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16))
    assert ctx.type_of(y).dtype == "float16"
    with pytest.raises(OpAttributeError, match="unsupported dtype complex64"):
        cast(ctx, helper.make_node("Cast", ["x"], ["y"], to=TensorProto.COMPLEX64))
    assert cast(ctx, helper.make_node("Cast", ["x"], ["y"], to=999)) is None  # no such code
