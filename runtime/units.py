"""Compute-unit restriction on CPU: the calling thread's TVM thread pool is limited to k threads."""

from __future__ import annotations

import os
import threading

_local = threading.local()


def full_cpu_units() -> int:
    """The threads a CPU kernel may use at most (TVM_NUM_THREADS, else the core count)."""
    return int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)


def set_cpu_units(units: int) -> None:
    """Limit TVM kernels launched from this Python thread to `units` worker threads (cached per thread)."""
    if getattr(_local, "units", None) != units:
        import tvm

        tvm.get_global_func("runtime.config_threadpool")(0, int(units))
        _local.units = units

