"""Where graphsub keeps what it learns across runs: operator timings, rule checks.

The folder is the user cache folder (platformdirs), or GRAPHSUB_CACHE_DIR when set (tests and
CI point it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    env = os.environ.get("GRAPHSUB_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("graphsub"))
