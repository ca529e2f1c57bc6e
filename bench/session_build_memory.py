"""One onnxruntime session of a model with external data, built as graphsub builds it, with
the pages of its mapped weights given back while it builds (`on`) or only after (`off`): the
build's seconds, the runs' (first, then the median of five) and the process's peak memory.

    PYTHONPATH=src python bench/session_build_memory.py on|off MODEL.onnx
"""
import sys, time, resource
import numpy as np
from graphsub.onnx_io.importer import model_data
from graphsub.runtime import ort_sessions as gort
if sys.argv[1] == "off":
    gort.RELEASE_INTERVAL = 1e9
m = model_data(sys.argv[2])
t = time.perf_counter(); s = gort.make_session(m, timed=True); b = time.perf_counter() - t
feeds = {"input_ids": np.ones((1, 128), np.int64), "attention_mask": np.ones((1, 128), np.int64)}
names = [i.name for i in s.get_inputs()]
feeds = {k: v for k, v in feeds.items() if k in names}
runs = []
for _ in range(6):
    t = time.perf_counter(); s.run(None, feeds); runs.append(time.perf_counter() - t)
r1 = runs[0]; r2 = sorted(runs[1:])[2]
print(sys.argv[1], "build", round(b, 1), "run1", round(r1, 2), "run2", round(r2, 2), "maxrss GB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
