"""Does an onnxruntime session in the process slow torch's runs (item 6)? Rounds of the zoo
llama as graphsub's torch-cpu program: alone, then with an onnxruntime session of the same
model run between torch's rounds (as verification or the probe would), then alone again.

    PYTHONPATH=src python bench/torch_beside_ort.py llama            # a reference session
    PYTHONPATH=src python bench/torch_beside_ort.py llama spinning   # a timed one (spinning)
"""
import statistics, sys
from graphsub import zoo
from graphsub.targets import get_target
from graphsub.onnx_io import to_onnx_bytes
from graphsub.runtime import graph_input_specs, random_feeds
from graphsub.runtime.ort_sessions import make_session

g = zoo.build(sys.argv[1] if len(sys.argv) > 1 else "llama")
target = get_target("torch-cpu")
run = target.prepare(g)
feeds = random_feeds(graph_input_specs(g))
run.bind(feeds)
sess = make_session(to_onnx_bytes(g), timed=len(sys.argv) > 2)
def rounds(between, n=60):
    out = []
    for _ in range(n):
        if between: between()
        out.append(min(run.timed(3)) * 1e3)
    return out
def show(name, xs):
    xs = sorted(xs); q = lambda f: xs[int(f * (len(xs) - 1))]
    print(f"{name:40s} median {statistics.median(xs):7.2f} q1-q3 {q(.25):.2f}-{q(.75):.2f} min {xs[0]:.2f} max {xs[-1]:.2f}")
rounds(None, 5)
show("torch alone", rounds(None))
show("ort run before each round", rounds(lambda: sess.run(None, feeds)))
show("torch alone again", rounds(None))
