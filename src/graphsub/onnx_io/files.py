"""Files written whole or not at all: through a temporary file in the same folder and a
rename, so that a path holds either its old content or the complete new one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from graphsub.errors import ExportError


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` only when the block ends without an error. It
    gets the permissions a plain write would give it: an existing file's, or the umask's for a
    new one (the temporary file is private until then)."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise ExportError(f"cannot write {target}: folder {target.parent} does not exist")
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write bytes to path atomically (see `atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)
    return Path(path)


def _umask() -> int:
    """The process's umask (reading it means setting it; it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


__all__ = ["atomic_file", "write_atomic"]
