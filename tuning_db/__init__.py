"""Tuning database: a SQL store of MetaSchedule workloads and records, and its MetaSchedule adapter.

Names are imported lazily, so `import tvmsched.tuning_db` loads neither TVM nor SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "SQLStore": "store",
    "RecordRow": "store",
    "WorkloadRow": "store",
    "open_store": "store",
    "target_hash": "store",
    "TuningDatabase": "ms_adapter",
    "open_database": "ms_adapter",
    "import_ms_json": "ms_json",
    "export_ms_json": "ms_json",
    "default_url": "settings",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .ms_adapter import TuningDatabase, open_database
    from .ms_json import export_ms_json, import_ms_json
    from .settings import default_url
    from .store import RecordRow, SQLStore, WorkloadRow, open_store, target_hash


def __getattr__(name: str) -> Any:
    """Import an exported name on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
