"""The two decisions every caller makes the same way: whether two models compute the same
function (`verdicts.equivalence`: one tolerance policy for the optimizer, its screening, the
torch.compile backend, the fuzzer and `graphsub check`) and whether one runs faster than
another (`verdicts.speedup`: one statistic and one decision for the optimizer, `graphsub
bench` and the torch.compile race). They sit above the runtime, which only runs and times."""

from graphsub.verdicts.equivalence import (SAME_FUNCTION, Comparison, OutputDiff, Tolerance,
                                           compare_models, compare_outputs, diff_arrays)

__all__ = ["SAME_FUNCTION", "Comparison", "OutputDiff", "Tolerance", "compare_models",
           "compare_outputs", "diff_arrays"]
