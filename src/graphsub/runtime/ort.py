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


def make_session(model: Any, threads: int | None = None, optimize: bool = True,
                 spinning: bool = False):
    """An onnxruntime CPU session. `optimize` turns on all of onnxruntime's graph
    optimizations (the baseline graphsub must beat); threads defaults to the core count.

    Idle worker threads do not spin: with spinning on, the thread pools of other live
    sessions in this process (models timed side by side, cost measurements) busy-wait on the
    same cores and triple measured latencies on a 2-core machine. `spinning=True` is
    onnxruntime's default, for measuring one session at a time as a user would run it."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
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
    """Latency samples of one model, in seconds."""

    samples: tuple[float, ...]

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
                min_seconds: float = 2.0, max_rounds: int = 200) -> list[Timing]:
    """Time several models on the same inputs, interleaved: each round runs every model once,
    in an order that rotates so none is always first. Without `rounds`, rounds continue until
    `min_seconds` have passed (at least 5, at most `max_rounds`)."""
    sessions = [make_session(m, threads) for m in models]
    for sess in sessions:
        for _ in range(warmup):
            sess.run(None, dict(feeds))
    samples: list[list[float]] = [[] for _ in sessions]
    start = time.perf_counter()
    r = 0
    while True:
        if rounds is not None and r >= rounds:
            break
        if rounds is None and r >= 5 and (time.perf_counter() - start >= min_seconds
                                          or r >= max_rounds):
            break
        order = list(range(len(sessions)))
        shift = r % len(order)
        for i in order[shift:] + order[:shift]:
            t0 = time.perf_counter()
            sessions[i].run(None, dict(feeds))
            samples[i].append(time.perf_counter() - t0)
        r += 1
    return [Timing(tuple(s)) for s in samples]


def time_isolated(models: Sequence[Any], feeds: Mapping[str, np.ndarray],
                  threads: int | None = None, rounds: int = 5, runs: int = 20,
                  warmup: int = 3) -> list[Timing]:
    """Time models with onnxruntime's default settings (idle threads spin), one live session
    at a time: each round creates, warms up, times and drops a session per model, in
    alternating order. Slower than `time_models`, but it measures what a user's own
    single-session deployment sees."""
    samples: list[list[float]] = [[] for _ in models]
    for r in range(rounds):
        order = list(range(len(models)))
        if r % 2:
            order.reverse()
        for i in order:
            sess = make_session(models[i], threads, spinning=True)
            for _ in range(warmup):
                sess.run(None, dict(feeds))
            for _ in range(runs):
                t0 = time.perf_counter()
                sess.run(None, dict(feeds))
                samples[i].append(time.perf_counter() - t0)
            del sess
    return [Timing(tuple(s)) for s in samples]
