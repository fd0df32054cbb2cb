"""TVM's tensor intrinsics (WMMA, MMA, ldmatrix, ...), loaded in seconds instead of a minute.

`tvm.s_tir.tensor_intrin` defines a few hundred intrinsics in TVMScript at import; dlight's tensor-core rule, the
replay of a record whose trace tensorizes, and MetaSchedule's TuneContext all need them registered.
(docs/tvm-pitfalls.md)
"""

from __future__ import annotations

import contextlib
import functools
import threading

_GETMODULE_LOCK = threading.Lock()
_getmodule_memo = {"depth": 0, "original": None}  # callers inside inspect_getmodule_memoized, inspect's own function


@contextlib.contextmanager
def inspect_getmodule_memoized():
    """Memoize `inspect.getmodule` for pseudo-files ("<frozen importlib._bootstrap>", "<ast>") while importing
    TVMScript-defined modules: each `@T.prim_func` calls `inspect.stack()`, whose frames inside an import and inside
    TVMScript's evaluator have no source file, and inspect then scans every module in `sys.modules` for each such
    frame, twice: hundreds of prim_funcs x ~30 frames x ~1000-3000 modules. A frame's module depends only on its file
    name there (frames have no `__module__`), so the answer is the same each time. Nested and concurrent uses share one
    memo; the last to leave puts inspect's own function back. (docs/tvm-pitfalls.md)"""
    import inspect

    with _GETMODULE_LOCK:
        if _getmodule_memo["depth"] == 0:
            original, found = inspect.getmodule, {}

            def getmodule(obj, _filename=None):
                if _filename is None or not _filename.startswith("<") or hasattr(obj, "__module__") or inspect.ismodule(obj):
                    return original(obj, _filename)
                if _filename not in found:
                    found[_filename] = original(obj, _filename)
                return found[_filename]

            _getmodule_memo["original"], inspect.getmodule = original, getmodule
        _getmodule_memo["depth"] += 1
    try:
        yield
    finally:
        with _GETMODULE_LOCK:
            _getmodule_memo["depth"] -= 1
            if _getmodule_memo["depth"] == 0:
                inspect.getmodule = _getmodule_memo["original"]


@functools.cache
def load_tensor_intrinsics() -> None:
    """Import `tvm.s_tir.tensor_intrin` (every target's intrinsics, CUDA's among them) with inspect's module lookup
    memoized: ~6-7 s instead of 20-130 s, depending on how many modules the process has loaded."""
    with inspect_getmodule_memoized():
        import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the intrinsics
