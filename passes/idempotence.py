"""Idempotence analysis of a layer kernel (a scheduled or unscheduled s_tir PrimFunc).

A kernel is idempotent when running it again, or after a partial run, gives the same result, so a
preempted launch can simply be re-run. Proven from the blocks' declared reads and writes:
- no parameter is both read and written, except by a reduction that initialises it inside the
  kernel (`T.init()`, or a decomposed `*_init` block that writes it without reading it);
- no atomics and no opaque calls (extern / packed functions may have any side effect);
- every parameter access is inside a block (otherwise nothing can be proven).
What cannot be proven is reported non-idempotent, with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ATOMIC = re.compile(r"\batomic\w*", re.IGNORECASE)
_OPAQUE = re.compile(r"\bT\.(call_extern|call_packed|call_cpacked|call_packed_lowered|call_cpacked_lowered|tvm_call_packed\w*)\(")


@dataclass(frozen=True)
class Idempotence:
    idempotent: bool
    reason: str


@dataclass
class _Access:
    readers: set[str]
    writers: set[str]
    initialised_by: set[str]  # blocks with T.init() writing it, or decomposed init blocks


def analyze(func) -> Idempotence:
    """The verdict for one PrimFunc, with the first reason it is not idempotent."""
    text = func.script()
    if match := _ATOMIC.search(text):
        return Idempotence(False, f"uses an atomic operation ({match.group(0)})")
    if match := _OPAQUE.search(text):
        return Idempotence(False, f"makes an opaque call (T.{match.group(1)}) whose side effects are unknown")
    params = {_var_key(p): p.name for p in func.params}
    access = {key: _Access(set(), set(), set()) for key in params}
    blocks = list(_blocks(func.body))
    if not any(block.name_hint != "root" for block in blocks):
        return Idempotence(False, "has no blocks declaring reads and writes: nothing can be proven")
    for block in blocks:
        reads = {_var_key(r.source) for r in block.reads}
        writes = {_var_key(w.source) for w in block.writes}
        for key in reads & access.keys():
            access[key].readers.add(block.name_hint)
        for key in writes & access.keys():
            access[key].writers.add(block.name_hint)
            if block.init is not None or (block.name_hint.endswith("_init") and key not in reads):
                access[key].initialised_by.add(block.name_hint)
    for key, acc in access.items():
        if not (acc.readers and acc.writers):
            continue
        accumulating = acc.readers <= acc.writers
        if not (accumulating and acc.initialised_by):
            return Idempotence(False, f"reads and writes parameter {params[key]!r} without initialising it in the kernel")
    return Idempotence(True, "writes only its outputs, each fully recomputed from unchanged inputs")


def _var_key(var) -> int:
    """Identity of a buffer variable (FFI objects compare by handle)."""
    import tvm_ffi

    return tvm_ffi.core.Object.__hash__(var)


def _blocks(stmt):
    """Every SBlock under `stmt`, outermost first."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        block = getattr(node, "block", None)
        if block is not None:
            stack.append(block)
            continue
        if hasattr(node, "iter_vars") and hasattr(node, "reads"):  # an SBlock
            yield node
            stack.extend([node.body, node.init])
            continue
        for attr in ("body", "then_case", "else_case"):
            stack.append(getattr(node, attr, None))
        stack.extend(getattr(node, "seq", None) or [])
