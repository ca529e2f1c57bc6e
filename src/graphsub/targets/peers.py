"""What the tools a user would otherwise reach for make of a model, as candidates.

A user who does not run graphsub runs onnxruntime's own optimizer (its graph
transformations, saved offline), onnxscript's optimizer, onnxslim or onnxsim. graphsub must
never hand back something slower than what those give, so on a target that runs ONNX in
onnxruntime their outputs for the original enter the selection beside graphsub's own
candidates, timed, confirmed and verified like every candidate; the report names the peer a
kept model was made by.

The peers: onnxruntime at its basic and extended levels (saved offline), its transformers
optimizer, onnxscript's optimizer, onnxslim and onnxsim, where installed. An output that
brings in operators of a domain the model did not use (onnxruntime's com.microsoft fusions)
takes part only where the user accepts a model only onnxruntime runs (`--ort-fusions`), as
graphsub's own fused candidates do; without them, the extended level's output is standard
ONNX where it fused nothing of its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from graphsub.errors import GraphsubError
from graphsub.ops.control_flow import all_graphs


@dataclass(frozen=True)
class Peer:
    """A tool graphsub compares itself with: its name in reports and the function that
    applies it (serialized model in and out; None where it had nothing to do)."""

    name: str
    apply: Callable[[bytes], bytes | None]
    #: Whether it exists to write onnxruntime's own operators (run only where they are
    #: accepted: --ort-fusions).
    vendor: bool = False
    #: The module whose absence means the peer is not installed (None: always there).
    needs: str | None = None

    def available(self) -> bool:
        if self.needs is None:
            return True
        import importlib.util

        return importlib.util.find_spec(self.needs) is not None


def _ort_offline(level_name: str) -> Callable[[bytes], bytes | None]:
    def apply(model: bytes) -> bytes | None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level_name)
        options.log_severity_level = 3
        with tempfile.TemporaryDirectory(prefix="graphsub-peer-") as folder:
            path = os.path.join(folder, "optimized.onnx")
            options.optimized_model_filepath = path
            ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            with open(path, "rb") as f:
                return f.read()
    return apply


def _onnxscript(model: bytes) -> bytes | None:
    from onnxscript import optimizer

    optimized: bytes = optimizer.optimize(onnx.load_from_string(model)).SerializeToString()
    return optimized


def _onnxslim(model: bytes) -> bytes | None:
    import onnxslim

    slimmed: bytes = onnxslim.slim(onnx.load_from_string(model)).SerializeToString()
    return slimmed


def _onnxsim(model: bytes) -> bytes | None:
    import onnxsim

    simplified, ok = onnxsim.simplify(onnx.load_from_string(model))
    return simplified.SerializeToString() if ok else None


def _ort_transformers(model: bytes) -> bytes | None:
    """onnxruntime's transformers optimizer (attention, layer norm and GELU fusions) with its
    model type left at its default and sizes detected; its own onnxruntime pass off (the
    session graphsub times applies it)."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    proto = onnx.load_from_string(model)
    if not any(n.op_type == "Softmax" for n in proto.graph.node):
        return None  # nothing it fuses: it only rewrites attention-bearing models
    optimized: bytes = optimize_model(proto, opt_level=0).model.SerializeToString()
    return optimized


#: Cheapest first: the stage starts each while its share of the time lasts.
PEERS = (
    Peer("onnxruntime (basic level, saved)", _ort_offline("ORT_ENABLE_BASIC")),
    Peer("onnxruntime (extended level, saved)", _ort_offline("ORT_ENABLE_EXTENDED")),
    Peer("onnxscript optimizer", _onnxscript, needs="onnxscript"),
    Peer("onnxslim", _onnxslim, needs="onnxslim"),
    Peer("onnxsim", _onnxsim, needs="onnxsim"),
    Peer("onnxruntime transformers optimizer", _ort_transformers, vendor=True,
         needs="onnxruntime.transformers"),
)


def installed_peers(vendor: bool) -> list[Peer]:
    """The peers installed here; with `vendor`, also those that exist to write onnxruntime's
    own operators."""
    return [p for p in PEERS if p.available() and (vendor or not p.vendor)]


@dataclass(frozen=True)
class ModelOperators:
    """A model's operators, its bodies' included, read in one parse: how many of each type
    (what tells a peer's output that changed something from one that did not) and their
    domains ("" for ONNX's own; another one is onnxruntime's com.microsoft fusions)."""

    counts: tuple[tuple[str, int], ...]
    domains: frozenset[str]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelOperators:
        nodes = [n for g in all_graphs(model.graph) for n in g.node]
        return cls(tuple(sorted(Counter(n.op_type for n in nodes).items())),
                   frozenset("" if n.domain == "ai.onnx" else n.domain for n in nodes))


def apply_peer(peer: Peer, model: bytes) -> bytes | None:
    """The peer's output for `model` (None: it changed nothing). Its failure is its own:
    GraphsubError, which the caller notes and goes on. What it prints is dropped."""
    try:
        # what a peer prints (onnxsim's warnings, in colour) is not graphsub's output: it
        # would break `--json`
        with contextlib.redirect_stdout(io.StringIO()):
            out = peer.apply(model)
    except Exception as exc:  # noqa: BLE001 (a third-party tool's failure, of any kind)
        message = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise GraphsubError(f"{peer.name} failed: {type(exc).__name__}: {message}") from None
    return None if out is None or out == model else out


__all__ = ["PEERS", "Peer", "apply_peer", "installed_peers", "ModelOperators"]
