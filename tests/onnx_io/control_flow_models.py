"""Models with control flow, written by hand: If (nested, reading outer values), Loop and
Scan, and a branch with a convolution and batch norm over outer weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _model(nodes, inputs, outputs, inits, opset=17, full_check=True):
    graph = h.make_graph(nodes, "cf", inputs, outputs, initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=full_check)
    return model


def nested_if_loop_scan(seed: int = 0, batch: int | str = 2) -> onnx.ModelProto:
    """x[batch,8], c1, c2 (bool): If(c1) whose then-branch holds If(c2); both read outer
    values (y, x2, the initializer b); a Loop of 3 steps reading y; a Scan over the Loop's
    result with a running state and b."""
    rng = np.random.default_rng(seed)
    arr = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inner_then = h.make_graph([h.make_node("Add", ["y", "b"], ["it"])], "inner_then", [],
                              [h.make_tensor_value_info("it", T.FLOAT, [batch, 8])])
    inner_else = h.make_graph([h.make_node("Sub", ["y", "b"], ["ie"])], "inner_else", [],
                              [h.make_tensor_value_info("ie", T.FLOAT, [batch, 8])])
    then_g = h.make_graph([
        h.make_node("Relu", ["y"], ["t1"]),
        h.make_node("If", ["c2"], ["t2"], then_branch=inner_then, else_branch=inner_else),
        h.make_node("Mul", ["t1", "t2"], ["t3"])], "then",
        [], [h.make_tensor_value_info("t3", T.FLOAT, [batch, 8])])
    else_g = h.make_graph([h.make_node("Sigmoid", ["y"], ["e1"]),
                           h.make_node("Mul", ["e1", "x2"], ["e2"])], "else",
                          [], [h.make_tensor_value_info("e2", T.FLOAT, [batch, 8])])
    body = h.make_graph([
        h.make_node("Identity", ["cond_in"], ["cond_out"]),
        h.make_node("Constant", [], ["hc"], value=h.make_tensor("half", T.FLOAT, [], [0.5])),
        h.make_node("Mul", ["y", "hc"], ["yh"]),
        h.make_node("Add", ["v_in", "yh"], ["v_out"]),
        h.make_node("ReduceSum", ["v_out"], ["s_out"], keepdims=0)], "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, [batch, 8])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, [batch, 8]),
         h.make_tensor_value_info("s_out", T.FLOAT, [])])
    scan_body = h.make_graph([
        h.make_node("Add", ["st_in", "row"], ["st_out"]),
        h.make_node("Mul", ["st_out", "b"], ["row_out"])], "scan_body",
        [h.make_tensor_value_info("st_in", T.FLOAT, [8]),
         h.make_tensor_value_info("row", T.FLOAT, [8])],
        [h.make_tensor_value_info("st_out", T.FLOAT, [8]),
         h.make_tensor_value_info("row_out", T.FLOAT, [8])])
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["y"]),
        h.make_node("MatMul", ["x", "W2"], ["x2"]),
        h.make_node("If", ["c1"], ["z"], then_branch=then_g, else_branch=else_g),
        h.make_node("Loop", ["M", "tr", "z"], ["vf", "sums"], body=body),
        h.make_node("Scan", ["zero8", "vf"], ["stf", "rows"], body=scan_body, num_scan_inputs=1),
        h.make_node("Relu", ["rows"], ["out"]),
    ]
    inits = [nh.from_array(arr(8, 8), "W"), nh.from_array(arr(8, 8), "W2"),
             nh.from_array(arr(8), "b"), nh.from_array(np.array(3, np.int64), "M"),
             nh.from_array(np.array(True), "tr"), nh.from_array(np.zeros(8, np.float32), "zero8")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [batch, 8]),
                          h.make_tensor_value_info("c1", T.BOOL, []),
                          h.make_tensor_value_info("c2", T.BOOL, [])],
                  [h.make_tensor_value_info("out", T.FLOAT, [batch, 8]),
                   h.make_tensor_value_info("sums", T.FLOAT, [3]),
                   h.make_tensor_value_info("stf", T.FLOAT, [8])], inits)


def conv_bn_in_branch(seed: int = 0) -> onnx.ModelProto:
    """If(c): then Conv -> BatchNormalization -> Relu over outer weights; else Relu(x)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3
    scale, bias = rng.uniform(0.5, 1.5, 8), rng.standard_normal(8)
    mean, var = rng.standard_normal(8), rng.uniform(0.5, 2.0, 8)
    inits = [nh.from_array(w, "w")] + [nh.from_array(a.astype(np.float32), n) for a, n in
                                       [(scale, "s"), (bias, "bb"), (mean, "m"), (var, "v")]]
    then_g = h.make_graph([
        h.make_node("Conv", ["x", "w"], ["cv"], pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["cv", "s", "bb", "m", "v"], ["n"]),
        h.make_node("Relu", ["n"], ["t"])], "then", [],
        [h.make_tensor_value_info("t", T.FLOAT, [1, 8, 6, 6])])
    else_g = h.make_graph([h.make_node("Tile", ["x", "reps"], ["e0"]),
                           h.make_node("Relu", ["e0"], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", T.FLOAT, [1, 8, 6, 6])])
    inits.append(nh.from_array(np.array([1, 2, 1, 1], np.int64), "reps"))
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6]),
                          h.make_tensor_value_info("c", T.BOOL, [])],
                  [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 6, 6])], inits)


def shape_condition(batch: int | str = 1) -> onnx.ModelProto:
    """`x.squeeze(0) if x.shape[0] == 1 else x` as TorchScript writes it: an If whose
    branches have different ranks, decided by a size."""
    then_g = h.make_graph([h.make_node("Squeeze", ["x", "zero"], ["sq"])], "then", [],
                          [h.make_tensor_value_info("sq", T.FLOAT, ["s0"])])
    else_g = h.make_graph([h.make_node("Identity", ["x"], ["id"])], "else", [],
                          [h.make_tensor_value_info("id", T.FLOAT, ["i0", "i1"])])
    nodes = [h.make_node("Shape", ["x"], ["shp"]),
             h.make_node("Gather", ["shp", "zero_s"], ["n"], axis=0),
             h.make_node("Equal", ["n", "one"], ["is1"]),
             h.make_node("If", ["is1"], ["r"], then_branch=then_g, else_branch=else_g),
             h.make_node("Relu", ["r"], ["out"])]
    inits = [nh.from_array(np.array([0], np.int64), "zero"),
             nh.from_array(np.array(0, np.int64), "zero_s"),
             nh.from_array(np.array(1, np.int64), "one")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [batch, 5])],
                  [h.make_tensor_value_info("out", T.FLOAT, ["o0"])], inits, full_check=False)
