"""Running graphs and models: numpy reference, onnxruntime, timing, numerical comparison."""

from graphsub.runtime.equivalence import Comparison, OutputDiff, compare_models, diff_arrays
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.ort import OrtRunnable, make_session, run, time_models
from graphsub.runtime.reference import evaluate
from graphsub.runtime.timing import (PairedComparison, Runnable, Timing, compare_runnables,
                                     time_runnables)

__all__ = ["Comparison", "OrtRunnable", "OutputDiff", "PairedComparison", "Runnable", "Timing",
           "compare_models", "compare_runnables", "diff_arrays", "evaluate",
           "graph_input_specs", "make_session", "random_feeds", "run", "time_models",
           "time_runnables"]
