"""How many onnxruntime sessions of the original one `optimize_model` run builds (issue 52,
item 2), on a model with an open batch (the probe runs) and a two-size profile (the chosen
candidate is checked at the second size), the original slowed by a sleep so that a candidate
is kept and verified on any machine (as tests/test_original_sessions.py, which holds it to 1).

    PYTHONPATH=src python bench/count_original_sessions.py ort-cpu torch-cpu

Works on trees from before the shared session too (their `Target.prepare` takes no session),
so that the count before and after can be compared.
"""
import inspect
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
from graphsub.onnx_io import load
from graphsub.optimizer import optimize_model
try:
    from graphsub.targets import get_target
except ImportError:  # a tree from before targets/ was named so
    from graphsub.backends import get_target  # type: ignore[no-redef]
from graphsub.runtime.timing import Runnable

class Slowed(Runnable):
    def __init__(self, inner): self.inner, self.label = inner, inner.label
    def run(self, feeds): time.sleep(0.002); return self.inner.run(feeds)
    def bind(self, feeds): self.inner.bind(feeds)
    def timed(self, n):
        out = []
        for _ in range(n):
            t = time.perf_counter(); time.sleep(0.002); self.inner.timed(1); out.append(time.perf_counter() - t)
        return out
    def close(self): self.inner.close()

built = []
class Counted(ort.InferenceSession):
    def __init__(self, model, *a, **k):
        built.append(model if isinstance(model, bytes) else b""); super().__init__(model, *a, **k)
ort.InferenceSession = Counted
w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t1"], perm=[0, 2, 1]),
         helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]), helper.make_node("MatMul", ["t2", "w"], ["m"]),
         helper.make_node("Tanh", ["m"], ["y"])]
g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64, 64])], [numpy_helper.from_array(w, "w")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
original = m.SerializeToString()
for name in sys.argv[1:]:
    target = get_target(name, threads=1)
    prepare = target.prepare
    takes_session = "session" in inspect.signature(prepare).parameters
    def slow(graph, onnx=None, label="", session=None, prepare=prepare):
        r = prepare(graph, onnx, label, session=session) if takes_session else prepare(graph, onnx, label)
        return Slowed(r) if label.startswith("original") else r
    target.prepare = slow
    built.clear()
    _, report = optimize_model(load(original), original, "t", time_limit=20, measure_limit=6, cost="analytic",
                               fission=False, peers=False, target=target, threads=1,
                               shape_profile=("batch=4", "batch=2:0.5"), evidence=False)
    print(name, report.outcome, "sessions of the original:", built.count(original), "all sessions:", len(built))
