"""onnxruntime sessions, runs and interleaved timing.

Timing follows one rule: models being compared are measured in the same process, interleaved
round by round, and summarized by medians, so that drift on a shared machine hits all of them
alike.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def _as_bytes(model: Any) -> bytes | str:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, Path)):
        return str(model)
    return model.SerializeToString()


def make_session(model: Any, threads: int | None = None, optimize: bool = True):
    """An onnxruntime CPU session with onnxruntime's default settings, as users run it.
    `optimize` turns on all of its graph optimizations (the baseline graphsub must beat);
    threads defaults to the core count."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(_as_bytes(model), sess_options=opts,
                                providers=["CPUExecutionProvider"])


def run(model: Any, feeds: Mapping[str, np.ndarray], threads: int | None = None,
        optimize: bool = True) -> dict[str, np.ndarray]:
    sess = model if hasattr(model, "run") else make_session(model, threads, optimize)
    names = [o.name for o in sess.get_outputs()]
    arrays = {k: np.asarray(v) for k, v in feeds.items()}
    return dict(zip(names, sess.run(names, arrays)))


@dataclass(frozen=True)
class Timing:
    """Latency samples of one model, in seconds, in the order taken (`block` per round)."""

    samples: tuple[float, ...]
    block: int = 1

    def round_medians(self) -> list[float]:
        return [statistics.median(self.samples[i:i + self.block])
                for i in range(0, len(self.samples), self.block)]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def q3(self) -> float:
        return float(np.percentile(self.samples, 75))

    @property
    def minimum(self) -> float:
        return min(self.samples)

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median * 1e3, "q1_ms": self.q1 * 1e3, "q3_ms": self.q3 * 1e3,
                "min_ms": self.minimum * 1e3, "runs": len(self.samples)}


def time_models(models: Sequence[Any], feeds: Mapping[str, np.ndarray],
                threads: int | None = None, warmup: int = 3, rounds: int | None = None,
                min_seconds: float = 2.0, max_rounds: int = 200, block: int = 5,
                pause: float = 0.02, min_rounds: int = 3) -> list[Timing]:
    """Time several models on the same inputs, side by side in one process, with onnxruntime's
    default session settings.

    Each round times a block of `block` runs of every model, in an order that rotates so none is
    always first. Before each block the process sleeps `pause` seconds: onnxruntime's idle
    worker threads spin for a while after a run, and without the pause the previous model's
    spinning threads would steal the cores from the next (on 2 cores, tripling its latency).
    Without `rounds`, rounds continue until `min_seconds` of runs (at least `min_rounds`, at
    most `max_rounds`)."""
    sessions = [make_session(m, threads) for m in models]
    for sess in sessions:
        for _ in range(warmup):
            sess.run(None, dict(feeds))
    samples: list[list[float]] = [[] for _ in sessions]
    timed = 0.0
    r = 0
    while True:
        if rounds is not None and r >= rounds:
            break
        if rounds is None and r >= min_rounds and (timed >= min_seconds or r >= max_rounds):
            break
        order = list(range(len(sessions)))
        shift = r % len(order)
        for i in order[shift:] + order[:shift]:
            time.sleep(pause)
            sessions[i].run(None, dict(feeds))  # wakes the thread pool up again
            for _ in range(block):
                t0 = time.perf_counter()
                sessions[i].run(None, dict(feeds))
                dt = time.perf_counter() - t0
                samples[i].append(dt)
                timed += dt
        r += 1
    return [Timing(tuple(s), block) for s in samples]


@dataclass(frozen=True)
class PairedComparison:
    """A head-to-head timing of two models, round by round: drift on a shared machine moves
    both models of a round alike, so per-round ratios are steadier than whole-run medians."""

    before: Timing
    after: Timing

    @property
    def ratios(self) -> list[float]:
        return [b / a for b, a in zip(self.before.round_medians(), self.after.round_medians())]

    @property
    def speedup(self) -> float:
        """Median over rounds of (time before / time after)."""
        return statistics.median(self.ratios)

    @property
    def wins(self) -> float:
        """The fraction of rounds in which the second model was faster."""
        return sum(r > 1 for r in self.ratios) / len(self.ratios)


def compare_speed(before: Any, after: Any, feeds: Mapping[str, np.ndarray],
                  threads: int | None = None, min_seconds: float = 4.0,
                  min_rounds: int = 10) -> PairedComparison:
    """Time two models head to head (at least `min_rounds` rounds)."""
    t_before, t_after = time_models([before, after], feeds, threads=threads,
                                    min_seconds=min_seconds, rounds=None,
                                    max_rounds=max(min_rounds, 200), min_rounds=min_rounds)
    return PairedComparison(t_before, t_after)
