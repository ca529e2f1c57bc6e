"""Measured cost: each operator signature timed on the target the model will run on.

How one operator is timed is the target's business (`Target.time_op`: a one-node onnxruntime
model, or CUDA events around a captured torch kernel); this module prices graphs with those
timings and keeps them. Results persist in an sqlite cache under the user cache folder, keyed
by the target's device description (device name, library and driver versions, threads) and
the signature; the cache is safe under concurrent runs, and a corrupt cache file is rebuilt
rather than fatal.
"""

from __future__ import annotations

import hashlib
import sqlite3
import statistics
import time
import warnings
from pathlib import Path

from graphsub.cache import cache_dir
from graphsub.cost.analytic import AnalyticCostModel
from graphsub.cost.base import CostModel, OpSignature, TimingTarget
from graphsub.ir.graph import Graph
from graphsub.ops import view_ops

#: Bumped whenever what a cached figure means changes, so old entries are not reused.
CACHE_VERSION = 5


#: Tries at opening the cache while another process or thread holds the lock.
OPEN_ATTEMPTS = 20


class CostCache:
    """A persistent map from signature keys to seconds, in sqlite."""

    def __init__(self, path: Path, context: str) -> None:
        self.path = path
        self.context = context
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for attempt in range(OPEN_ATTEMPTS):
                try:
                    self._conn = self._open()
                    break
                except sqlite3.OperationalError:
                    # Locked by another process or thread opening it too (switching a new
                    # file to WAL takes a lock the busy timeout does not wait for): it is a
                    # database, so try again rather than delete what the other one writes.
                    if attempt == OPEN_ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
                except sqlite3.DatabaseError:
                    # Not a database (or damaged): start a new one instead of failing the run.
                    self.path.unlink(missing_ok=True)
                    self._conn = self._open()
                    break
        assert self._conn is not None  # opened above, or the last attempt raised
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
        except sqlite3.OperationalError:  # locked past the timeout: measure instead
            return None
        except sqlite3.DatabaseError:
            self._reset()
            return None
        return None if row is None else float(row[0])

    def put(self, key: str, seconds: float) -> None:
        try:
            self._connect().execute("INSERT OR REPLACE INTO costs VALUES (?, ?)",
                                    (self._key(key), seconds))
        except sqlite3.OperationalError:  # locked past the timeout: this one stays unstored
            return
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


class MeasuredCostModel(CostModel):
    """Operator costs measured on a target (onnxruntime's CPU provider by default), cached
    persistently per device. On targets where operators read views (torch, which runs strided
    views without a kernel: `Target.free_views`), an operator's signature includes its inputs'
    strides, so layouts are priced as they run. A view is timed like any operator: on torch's
    CPU target making one costs the host about as much as a small kernel.

    Whether weights are priced cold (read from memory) or hot (from the caches) follows the
    model: a model whose weights exceed the device's last-level cache reads every weight from
    memory once per run, and timing its operators with cached weights would underestimate the
    memory-bound ones several-fold (NasRNN's matrix-vector products). `cold_weights=None`
    decides from the first graph priced.

    An operator the target cannot time (a library refusing the one-operator model, an opaque
    operator whose inputs cannot be made up) is priced by the analytic model of the target's
    device instead, and noted in `untimed`: one operator must not end a run. So is every
    operator not yet timed once `deadline` (a time.perf_counter() value) has passed: timing a
    large model's operators for the first time can take minutes (Swin-T on torch-cpu, with
    cold weights: five), and a search's time limit is a promise. Timings made before the
    deadline are cached, so the next run gets further. An analytic price stands beside
    timed ones, so it is scaled to them (`scale`): by the median of timed operators of its
    kind against their analytic prices (of all timed operators where none of its kind was),
    as a roofline misses a device's launch costs and real efficiency by a factor that
    differs per kind of operator; unscaled, a rewrite whose new operators came late was
    judged by another unit than the graph it replaces."""

    name = "measured"

    def __init__(self, target: TimingTarget, cache: bool = True,
                 cold_weights: bool | None = None) -> None:
        super().__init__()
        self.cold_weights = cold_weights
        self.target = target
        # Operators read strided inputs where strided views run without a kernel.
        self.layouts = target.input_layouts if "strided" in target.free_views else None
        self.layout_ops = view_ops(*target.free_views)
        context = f"v{CACHE_VERSION}|{target.device().key()}"
        self.cache = CostCache(cache_dir() / "op_costs.sqlite", context) if cache else None
        target.cache = self.cache
        self.measured = 0  # signatures timed in this process (not found in the cache)
        #: Operators priced analytically because timing them failed: label -> (count, reason).
        self.untimed: dict[str, tuple[int, str]] = {}
        #: Past this time.perf_counter() value, operators not in the cache are not timed.
        self.deadline: float | None = None
        self.late = 0  # signatures priced analytically because the deadline had passed
        self._fallback = AnalyticCostModel(target.analytic_profile, target.free_views)
        #: Timed (or cached) signatures not yet compared with their analytic prices.
        self._timed: list[tuple[OpSignature, float]] = []
        #: Per operator kind, timed cost over analytic price, of each signature compared.
        self._ratios: dict[str, list[float]] = {}

    def decide_weights(self, graph: Graph) -> None:
        if self.cold_weights is None:
            held = sum(graph[n].type.nbytes for n in graph.nodes_by_op("weight"))
            self.cold_weights = held > self.target.cache_bytes()

    def graph_cost(self, graph: Graph) -> float:
        self.decide_weights(graph)
        return super().graph_cost(graph)

    def node_cost(self, graph: Graph, nid: int) -> float:
        self.decide_weights(graph)
        return super().node_cost(graph, nid)

    def known_cost(self, sig: OpSignature) -> float | None:
        known = super().known_cost(sig)
        if known is None and self.cache is not None and sig.is_static:
            known = self.cache.get(self._cache_key(sig))
            if known is not None:
                self._memo[sig] = known
                self._timed.append((sig, known))
        return known

    def _cache_key(self, sig: OpSignature) -> str:
        return sig.key() + ("|cold" if self.cold_weights else "")

    def op_cost(self, sig: OpSignature) -> float:
        cold = bool(self.cold_weights)
        key = self._cache_key(sig)
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                self._timed.append((sig, cached))
                return cached
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.late += 1
            return self._scaled_analytic(sig)
        try:
            seconds = self.target.time_op(sig, cold)
        except Exception as exc:  # noqa: BLE001 (onnxruntime and torch raise their own types)
            return self._price_untimed(sig, exc)
        self.measured += 1
        self._timed.append((sig, seconds))
        if self.cache is not None:
            self.cache.put(key, seconds)
        return seconds

    def _price_untimed(self, sig: OpSignature, exc: Exception) -> float:
        """The scaled analytic price of an operator that could not be timed, noted (not
        cached, so a later run times it again)."""
        label = sig.op if sig.op != "opaque" else f"opaque {sig.attrs['op_type']}"
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        count, first = self.untimed.get(label, (0, reason))
        self.untimed[label] = (count + 1, first)
        if count == 0:
            warnings.warn(f"could not time {label} on {self.target.name} ({reason}); priced "
                          "it with the analytic model instead", RuntimeWarning, stacklevel=2)
        return self._scaled_analytic(sig)

    def _scaled_analytic(self, sig: OpSignature) -> float:
        return self._analytic(sig) * self.scale(sig.op)

    def scale(self, op: str) -> float:
        """What timed operators of kind `op` cost against their analytic prices (the median;
        of all kinds where none of `op` was timed; 1 where nothing was). Comparisons are made
        here, when an analytic price is needed, so that a run whose operators are all timed
        pays nothing for them."""
        for sig, seconds in self._timed:
            estimate = self._analytic(sig)
            if estimate > 0 and seconds > 0:
                self._ratios.setdefault(sig.op, []).append(seconds / estimate)
        self._timed.clear()
        ratios = self._ratios.get(op) or [r for kind in self._ratios.values() for r in kind]
        return statistics.median(ratios) if ratios else 1.0

    def _analytic(self, sig: OpSignature) -> float:
        try:
            return self._fallback.op_cost(sig)
        except Exception:  # noqa: BLE001 (an op the analytic model has no counts for)
            return 0.0

    def notes(self) -> list[str]:
        """What a report should say about operators that were not timed."""
        notes = [f"{count} signature(s) of {label} could not be timed on {self.target.name} "
                 f"and were priced by the analytic model, scaled to the timed ones ({reason})"
                 for label, (count, reason) in self.untimed.items()]
        if self.late:
            notes.append(f"the time for timing operators on {self.target.name} ran out: "
                         f"{self.late} signature(s) were priced by the analytic model, scaled "
                         f"to the timed ones ({self.measured} timed and cached, so a second "
                         "run gets further; or give a longer --time-limit)")
        return notes
