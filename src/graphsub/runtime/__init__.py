"""Running graphs and models: numpy reference, onnxruntime, timing, numerical comparison."""

from graphsub.runtime.compare import Comparison, OutputDiff, compare_models, diff_arrays
from graphsub.runtime.inputs import graph_input_specs, random_feeds
from graphsub.runtime.ort import (PairedComparison, Timing, compare_speed, make_session, run,
                                  time_models)
from graphsub.runtime.reference import evaluate

__all__ = ["Comparison", "OutputDiff", "PairedComparison", "Timing", "compare_speed", "compare_models", "diff_arrays", "evaluate",
           "graph_input_specs", "make_session", "random_feeds", "run", "time_models"]
