"""A deliberately loaded machine: processes that spin on a core each beside a test, as other
work does on a shared machine."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_processes(n: int = 2) -> Iterator[None]:
    """`n` processes running `while True: pass` for the duration of the block."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3)  # started and spinning
        yield
    finally:
        for process in spinning:
            process.kill()
        for process in spinning:
            process.wait()
