"""Where independent tasks run (the generator's enumeration and candidate shards, the split
search's parts): in this process, in a local process pool (the default), or on a Dask
distributed cluster (`--executor dask`).

Every executor has one method, `run(fn, args)`, yielding results as tasks finish, in any
order, so callers can advance a progress bar. Tasks and results must be picklable; tasks
write bulky output (fingerprint shards) to files themselves and return small summaries, so a
Dask cluster needs the work directory on storage all workers share (a local cluster does).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Protocol

from graphsub.errors import GraphsubError


class Executor(Protocol):
    workers: int

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[Any]: ...

    def close(self) -> None: ...


class SerialExecutor:
    """Runs tasks one after another here: for tiny runs and tests."""

    workers = 1

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
        for a in args:
            yield fn(*a)

    def close(self) -> None:
        pass


class ProcessExecutor:
    """A pool of worker processes on this machine."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool = ProcessPoolExecutor(max_workers=self.workers)

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
        futures = [self._pool.submit(fn, *a) for a in args]
        try:
            for f in as_completed(futures):
                yield f.result()
        finally:
            for f in futures:
                f.cancel()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


class DaskExecutor:
    """A Dask distributed cluster: the one at `scheduler` (host:port), or a local one on
    127.0.0.1 with `workers` single-threaded worker processes."""

    def __init__(self, workers: int | None = None, scheduler: str | None = None) -> None:
        self._distributed = _distributed()
        self._cluster: Any = None
        self._client: Any
        if scheduler:
            try:
                self._client = self._distributed.Client(scheduler, timeout="20s")
            except OSError as exc:
                raise GraphsubError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
            self.workers = max(len(self._client.scheduler_info().get("workers", {})), 1)
        else:
            self.workers = workers or os.cpu_count() or 1
            self._cluster = self._distributed.LocalCluster(
                n_workers=self.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None)
            self._client = self._distributed.Client(self._cluster)

    def run(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
        futures = [self._client.submit(fn, *a, pure=False) for a in args]
        try:
            for f in self._distributed.as_completed(futures):
                yield f.result()
        finally:
            for f in futures:
                f.cancel()

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def _distributed() -> Any:
    """dask.distributed, as a module of untyped values: it leaves Client, LocalCluster and
    the methods used here unannotated where it is installed, and is absent where it is not,
    so that mypy's verdict on this module would depend on the extras installed (ignores that
    one install needs are "unused" in the other)."""
    try:
        return importlib.import_module("distributed")
    except ImportError as exc:
        raise GraphsubError("the Dask executor needs dask.distributed: "
                            "pip install 'graphsub[dask]'") from exc


def make_executor(kind: str = "process", workers: int | None = None,
                  scheduler: str | None = None) -> Executor:
    if kind == "serial" or (kind == "process" and workers == 1):
        return SerialExecutor()
    if kind == "process":
        return ProcessExecutor(workers)
    if kind == "dask":
        return DaskExecutor(workers, scheduler)
    raise GraphsubError(f"unknown executor {kind!r}: use process, dask or serial")
