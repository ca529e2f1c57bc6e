"""What a run holds open and closes once: the original model's onnxruntime session, made
once per run and shared by every stage that runs the original in onnxruntime, and the
chosen candidate prepared on the target, from the measuring that chose it to the
verification that checks it.

Each session of a model is a copy of its weights and seconds of building for a large model;
the probe, the measuring (where the target is onnxruntime on the CPU), the check at the other
sizes of a profile and the verification all run the same original on the same provider with
the same threads, and once built one after the other up to four sessions of it. One session
serves them all: `session.run` keeps no state between calls.

It is made *timed* (onnxruntime's worker threads spinning, as users run it) where the target
times it, and not timed otherwise (a reference whose spinning threads would slow the torch
program timed after it in the same process: runtime.ort_sessions.make_session).

The chosen candidate's runnable is the other thing a stage hands a later one that must be
closed: it is held here rather than in the Selection, a value the report reads, so that
whatever way a run ends (an error, a dropped candidate, a failed check), `close` frees it.
"""

from __future__ import annotations

import time
from typing import Any

from graphsub.runtime.ort_sessions import ModelData, OrtRunnable, make_session
from graphsub.runtime.timing import Runnable
from graphsub.targets import Target
from graphsub.targets.ort import OrtTarget

_CPU = ("CPUExecutionProvider",)


def times_the_reference(target: Target, threads: int) -> bool:
    """Whether the target runs the original exactly as the reference session does: onnxruntime
    on the CPU provider alone, with the same threads, in a plain session."""
    return (isinstance(target, OrtTarget) and tuple(target.providers) == _CPU
            and target.runnable is OrtRunnable and target.threads == threads)


class RunSessions:
    """The run's onnxruntime session of its original model (one at a time: a session of
    another model, or at other threads, replaces it), and its chosen candidate on the
    target."""

    def __init__(self) -> None:
        self._model: ModelData | None = None
        self._key: tuple[int, bool] | None = None
        self._session: Any = None
        self._chosen: Runnable | None = None
        #: Seconds the session took to build (what another session of the model would take).
        self.build_seconds = 0.0

    def reference(self, model: ModelData, threads: int, target: Target) -> Any:
        """The session of `model` on onnxruntime's CPU provider (built on the first call;
        onnxruntime's error if it cannot be)."""
        key = (threads, times_the_reference(target, threads))
        if self._session is None or self._model is not model or self._key != key:
            self._drop_session()
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

    def hold_chosen(self, runnable: Runnable | None) -> None:
        """Keep the chosen candidate's runnable open for the checks after the measuring
        (None: none was chosen)."""
        self.release_chosen()
        self._chosen = runnable

    @property
    def chosen(self) -> Runnable:
        """The chosen candidate's runnable (an error where none is held: a stage that
        reads it runs only once a candidate was chosen)."""
        if self._chosen is None:
            raise RuntimeError("no chosen candidate is held: measure first")
        return self._chosen

    def release_chosen(self) -> None:
        """Close the chosen candidate's runnable: once it is dropped, or once checked (on a
        large model, at most two sessions live at a time)."""
        if self._chosen is not None:
            self._chosen.close()
            self._chosen = None

    def close(self) -> None:
        """Close the chosen candidate's runnable and drop the original's session
        (onnxruntime frees it, and its copy of the weights, once no runnable that borrowed
        it holds it either)."""
        self.release_chosen()
        self._drop_session()

    def _drop_session(self) -> None:
        self._session, self._model, self._key = None, None, None
