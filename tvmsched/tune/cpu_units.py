"""Compute-unit restriction on CPU: the calling thread's TVM thread pool is limited to k threads."""

from __future__ import annotations

import threading

_local = threading.local()


def set_cpu_units(units: int) -> None:
    """Limit TVM kernels launched from this Python thread to `units` worker threads (cached per thread)."""
    if getattr(_local, "units", None) != units:
        import tvm

        tvm.get_global_func("runtime.config_threadpool")(0, int(units))
        _local.units = units

