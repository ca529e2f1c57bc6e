"""Running graphs and models: the numpy reference, onnxruntime sessions, inputs, timing.
Whether two runs agree or one is faster is decided above this layer, in graphsub.verdicts."""

from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.ort_sessions import OrtRunnable, make_session, run, time_models
from graphsub.runtime.reference import evaluate
from graphsub.runtime.timing import (PairedComparison, Runnable, Timing, compare_runnables,
                                     time_runnables)

__all__ = ["OrtRunnable", "PairedComparison", "Runnable", "Timing", "compare_runnables",
           "evaluate", "graph_input_specs", "make_session", "random_feeds", "run",
           "time_models", "time_runnables"]
