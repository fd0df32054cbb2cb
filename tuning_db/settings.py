"""Where the tuning database lives by default: a SQLite file in the user cache, or `$TVMSCHED_DB`."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "TVMSCHED_DB"
DEFAULT_PATH = Path.home() / ".cache" / "tvmsched" / "tuning.db"
DEFAULT_URL = os.environ.get(ENV_VAR) or f"sqlite:///{DEFAULT_PATH}"


def default_url() -> str:
    """The database URL: `$TVMSCHED_DB` if set, else the cache SQLite file (its folder is created)."""
    url = os.environ.get(ENV_VAR)
    if url:
        return url
    DEFAULT_PATH.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{DEFAULT_PATH}"
