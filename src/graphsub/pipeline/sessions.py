"""The original model's onnxruntime session: made once per run, shared by every stage that
runs the original in onnxruntime, and closed by the run that made it.

Each session of a model is a copy of its weights and seconds of building for a large model;
the probe, the measuring (where the target is onnxruntime on the CPU), the check at the other
sizes of a profile and the verification all run the same original on the same provider with
the same threads, and once built one after the other up to four sessions of it. One session
serves them all: `session.run` keeps no state between calls.

It is made *timed* (onnxruntime's worker threads spinning, as users run it) where the target
times it, and not timed otherwise (a reference whose spinning threads would slow the torch
program timed after it in the same process: runtime.ort_sessions.make_session).
"""

from __future__ import annotations

import time
from typing import Any

from graphsub.runtime.ort_sessions import ModelData, OrtRunnable, make_session
from graphsub.targets import Target
from graphsub.targets.ort import OrtTarget

_CPU = ("CPUExecutionProvider",)


def times_the_reference(target: Target, threads: int) -> bool:
    """Whether the target runs the original exactly as the reference session does: onnxruntime
    on the CPU provider alone, with the same threads, in a plain session."""
    return (isinstance(target, OrtTarget) and tuple(target.providers) == _CPU
            and target.runnable is OrtRunnable and target.threads == threads)


class OriginalSessions:
    """The run's onnxruntime session of its original model (one at a time: a session of
    another model, or at other threads, replaces it)."""

    def __init__(self) -> None:
        self._model: ModelData | None = None
        self._key: tuple[int, bool] | None = None
        self._session: Any = None
        #: Seconds the session took to build (what another session of the model would take).
        self.build_seconds = 0.0

    def reference(self, model: ModelData, threads: int, target: Target) -> Any:
        """The session of `model` on onnxruntime's CPU provider (built on the first call;
        onnxruntime's error if it cannot be)."""
        key = (threads, times_the_reference(target, threads))
        if self._session is None or self._model is not model or self._key != key:
            self.close()
            start = time.perf_counter()
            self._session = make_session(model, threads, quiet=True, timed=key[1])
            self.build_seconds = time.perf_counter() - start
            self._model, self._key = model, key
        return self._session

    def for_target(self, model: ModelData, threads: int, target: Target) -> Any:
        """The session to hand the target's `prepare` for the original, where the target runs
        it as the reference session does; None where the target prepares its own (another
        provider, torch), or where onnxruntime cannot build it (the target's own preparation
        then says why, as for any model it cannot run)."""
        if not times_the_reference(target, threads):
            return None
        try:
            return self.reference(model, threads, target)
        except Exception:  # noqa: BLE001 (onnxruntime's own error types)
            return None

    def close(self) -> None:
        """Drop the session (onnxruntime frees it, and its copy of the weights, once no
        runnable that borrowed it holds it either)."""
        self._session, self._model, self._key = None, None, None
