"""Measured cost: each operator signature timed in onnxruntime as a one-node model.

The one-node model runs with the same thread count and optimization level as the final model
(constant inputs are initializers, so onnxruntime may pre-pack them as it will in the real
model). The time of an empty run (the fixed cost of one `run` call) is subtracted. Results
persist in an sqlite cache under the user cache folder, keyed by onnxruntime version, CPU
model, thread count and signature; the cache is safe under concurrent runs, and a corrupt
cache file is rebuilt rather than fatal.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sqlite3
import statistics
import time
from pathlib import Path

import numpy as np

from graphsub.cost.base import CostModel, OpSignature
from graphsub.ir.builder import GraphBuilder
from graphsub.ir.graph import Value

#: Bumped whenever what a cached figure means changes, so old entries are not reused.
CACHE_VERSION = 4
#: Shape of the tensor used to calibrate the per-operator overhead: large enough that
#: onnxruntime runs the operator on its thread pool, as it does the model's real operators.
CALIBRATION_SHAPE = (1, 64, 56, 56)


def cache_dir() -> Path:
    env = os.environ.get("GRAPHSUB_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("graphsub"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CostCache:
    """A persistent map from signature keys to seconds, in sqlite."""

    def __init__(self, path: Path, context: str) -> None:
        self.path = path
        self.context = context
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._conn = self._open()
            except sqlite3.DatabaseError:
                # Not a database (or damaged): start a new one instead of failing the run.
                self.path.unlink(missing_ok=True)
                self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, seconds REAL)")
        conn.execute("SELECT count(*) FROM costs").fetchone()
        return conn

    def _key(self, key: str) -> str:
        return hashlib.sha256(f"{self.context}|{key}".encode()).hexdigest()

    def get(self, key: str) -> float | None:
        try:
            row = self._connect().execute("SELECT seconds FROM costs WHERE key = ?",
                                          (self._key(key),)).fetchone()
        except sqlite3.DatabaseError:
            self._reset()
            return None
        return None if row is None else float(row[0])

    def put(self, key: str, seconds: float) -> None:
        try:
            self._connect().execute("INSERT OR REPLACE INTO costs VALUES (?, ?)",
                                    (self._key(key), seconds))
        except sqlite3.DatabaseError:
            self._reset()

    def _reset(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def single_op_model(sig: OpSignature) -> tuple[bytes, dict[str, np.ndarray]]:
    """A one-node ONNX model computing the signature, and inputs to feed it."""
    from graphsub.onnx_io.exporter import to_onnx

    rng = np.random.default_rng(0)
    b = GraphBuilder()
    args, feeds = [], {}
    for i, (t, const) in enumerate(zip(sig.inputs, sig.constant_inputs)):
        data = (rng.standard_normal(t.shape).astype(t.dtype) if t.dtype.startswith("float")
                else np.zeros(t.shape, t.dtype))
        if sig.op in ("batch_norm",) and i == 4:
            data = np.abs(data) + 1
        if const:
            args.append(b.weight(data))
        else:
            args.append(b.input(f"in{i}", t.shape, t.dtype))
            feeds[f"in{i}"] = data
    outs = b.op(sig.op, *args, **dict(sig.attrs))
    for i, v in enumerate((outs,) if isinstance(outs, Value) else outs):
        b.output(v, f"out{i}")
    model = to_onnx(b.build(), check=False)
    return model.SerializeToString(), feeds


def time_session(sess, feeds: dict[str, np.ndarray], min_runs: int = 5,
                 min_seconds: float = 0.02, max_runs: int = 200) -> float:
    """Median seconds of one run, after warm-up. Inputs are bound once and outputs stay in
    onnxruntime (IOBinding), so the time is the operators' and not numpy copies'."""
    import onnxruntime as ort

    binding = sess.io_binding()
    for name, arr in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
    for out in sess.get_outputs():
        binding.bind_output(out.name)
    for _ in range(2):
        sess.run_with_iobinding(binding)
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_runs or (time.perf_counter() - start < min_seconds
                                      and len(samples) < max_runs):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class MeasuredCostModel(CostModel):
    name = "measured"

    def __init__(self, threads: int | None = None, cache: bool = True) -> None:
        super().__init__()
        import onnxruntime as ort

        self.threads = threads or os.cpu_count() or 1
        context = (f"v{CACHE_VERSION}|ort={ort.__version__}|cpu={cpu_model()}|"
                   f"threads={self.threads}|opt=all")
        self.cache = CostCache(cache_dir() / "op_costs.sqlite", context) if cache else None
        self._baseline: float | None = None
        self._dispatch: float | None = None
        self.measured = 0  # signatures timed in this process (not found in the cache)

    def baseline(self) -> float:
        """The time of running a model that does nothing (one Identity on a scalar)."""
        if self._baseline is None:
            from onnx import TensorProto, helper

            from graphsub.runtime.ort import make_session

            g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            sess = make_session(m.SerializeToString(), self.threads)
            self._baseline = time_session(sess, {"x": np.zeros(1, np.float32)}, min_runs=20,
                                          min_seconds=0.05)
        return self._baseline

    def dispatch_overhead(self) -> float:
        """What one more operator costs inside a model beyond its one-node time: scheduling and
        waking the thread pool. Measured (and cached) as the marginal time of a relu in a chain
        of relus, minus that relu's one-node time."""
        if self._dispatch is None:
            cached = self.cache.get("__dispatch__") if self.cache is not None else None
            if cached is None:
                cached = self._calibrate_dispatch()
                if self.cache is not None:
                    self.cache.put("__dispatch__", cached)
            self._dispatch = cached
        return self._dispatch

    def _calibrate_dispatch(self) -> float:
        from graphsub.onnx_io.exporter import to_onnx_bytes
        from graphsub.runtime.ort import make_session

        def chain(n: int) -> float:
            b = GraphBuilder()
            x = b.input("x", CALIBRATION_SHAPE)
            y = x
            for _ in range(n):
                y = b.relu(y)
            b.output(y, "y")
            sess = make_session(to_onnx_bytes(b.build()), self.threads)
            feeds = {"x": np.random.default_rng(0).standard_normal(CALIBRATION_SHAPE)
                     .astype(np.float32)}
            return time_session(sess, feeds, min_runs=20, min_seconds=0.2)

        marginal = (chain(24) - chain(8)) / 16
        single = max(chain(1) - self.baseline(), 0.0)
        return max(marginal - single, 0.0)

    def op_cost(self, sig: OpSignature) -> float:
        key = sig.key()
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                return cached
        seconds = self.measure(sig)
        if self.cache is not None:
            self.cache.put(key, seconds)
        return seconds

    def measure(self, sig: OpSignature) -> float:
        from graphsub.runtime.ort import make_session

        model, feeds = single_op_model(sig)
        sess = make_session(model, self.threads)
        self.measured += 1
        return max(time_session(sess, feeds) - self.baseline(), 0.0) + self.dispatch_overhead()
