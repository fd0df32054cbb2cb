"""Launch geometry of a scheduled PrimFunc: its thread-block count (GPU) or parallel extent (CPU)."""

from __future__ import annotations

_CHILDREN = ("body", "block", "then_case", "else_case", "init")


def thread_blocks(mod) -> int | None:
    """Thread blocks of the largest kernel launch in `mod`, or the largest parallel extent on CPU.

    GPU: product of the `blockIdx.*` loop extents of a kernel. CPU: product of the extents of an
    outermost nest of parallel loops; 1 when nothing is parallel. None when an extent is symbolic.
    """
    import tvm

    best = 0
    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            counts = _launches(func.body, tvm.tirx)
            if counts is None:
                return None
            best = max([best, *counts])
    return best or 1


def launch_blocks(mod) -> list[int] | None:
    """Thread blocks of every kernel launch in `mod` (GPU), in order; None when an extent is symbolic."""
    import tvm

    counts: list[int] = []
    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            found = _launches(func.body, tvm.tirx)
            if found is None:
                return None
            counts += found
    return counts


def _launches(stmt, tirx) -> list[int] | None:
    """Block counts of every launch (GPU kernel or CPU parallel nest) under `stmt`."""
    if isinstance(stmt, tirx.For) and stmt.kind in (tirx.ForKind.PARALLEL, tirx.ForKind.THREAD_BINDING):
        if stmt.kind == tirx.ForKind.THREAD_BINDING and not stmt.thread_binding.thread_tag.startswith("blockIdx"):
            return _collect(stmt.body, tirx)
        extent = _int(stmt.extent)
        if extent is None:
            return None
        inner = _nest_extent(stmt.body, tirx, stmt.kind)
        return None if inner is None else [extent * inner]
    return _collect(stmt, tirx)


def _nest_extent(stmt, tirx, kind) -> int | None:
    """Product of directly nested loops of the same launch kind (e.g. blockIdx.y inside blockIdx.x)."""
    while isinstance(stmt, tirx.For) and stmt.kind != kind and stmt.kind == tirx.ForKind.SERIAL and _int(stmt.extent) == 1:
        stmt = stmt.body
    if isinstance(stmt, tirx.For) and stmt.kind == kind:
        if kind == tirx.ForKind.THREAD_BINDING and not stmt.thread_binding.thread_tag.startswith("blockIdx"):
            return 1
        extent, inner = _int(stmt.extent), _nest_extent(stmt.body, tirx, kind)
        return None if extent is None or inner is None else extent * inner
    return 1


def _collect(stmt, tirx) -> list[int] | None:
    counts: list[int] = []
    for child in _children(stmt, tirx):
        found = _launches(child, tirx)
        if found is None:
            return None
        counts += found
    return counts


def _children(stmt, tirx) -> list:
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    return [c for c in (getattr(stmt, name, None) for name in _CHILDREN) if c is not None and not isinstance(c, (int, float))]


def _int(expr) -> int | None:
    try:
        return int(expr)
    except (TypeError, ValueError):
        return None
