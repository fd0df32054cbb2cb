"""Progress counters: kernels report how many of their blocks have completed.

The pass adds a last parameter `progress_counter` (int32[1]; the runtime passes each layer its own
slot of the request stream's counter array) and adds to it, atomically, when a block's work is done:
- GPU: every thread of a thread block does `atomicAdd(progress_counter, w)` at the end of the block;
  completed blocks = counter / threads. A function that launches blocks of different sizes (several kernels)
  counts with threads = the least common multiple of its launches' threads per block and w = threads / the
  launch's own (so each block adds `threads`, whichever launch it belongs to); one launch: w = 1.
- CPU: a block is one iteration of an outermost parallel loop (run by one worker thread); it calls
  `tvmsched_progress_add(progress_counter, 1)` at its end, a C function linked into the kernel
  library (CPU_SOURCE: `__atomic_fetch_add`, as TVM's LLVM backend emits no atomics). A kernel
  without a parallel loop counts one block when it returns.
Blocks that left early on the preempt flag do not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvmsched.passes.preempt_flag import PARAM as FLAG_PARAM
from tvmsched.passes.preempt_flag import flag_clear
from tvmsched.passes.tir_edit import (
    buffer_param, const, innermost_block_loop, int32, is_thread_loop, loop_kind, map_outermost, replace, root_body, seq,
    with_root_body,
)

PARAM = "progress_counter"
CPU_ADD = "tvmsched_progress_add"
CPU_SOURCE = f"""#include <stdint.h>
extern "C" int32_t {CPU_ADD}(int32_t* counter, int32_t n) {{
  return __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}}
"""


@dataclass(frozen=True)
class Counted:
    func: object  # the instrumented PrimFunc (the input when nothing was counted)
    threads: int | None  # counter increments per block (GPU threads per block; 1 on CPU); None: not counted
    blocks: int | None  # blocks one call completes (the counter's final value / threads); None: symbolic


def count_progress(func, *, gpu: bool = True) -> Counted:
    """Instrument a PrimFunc (after the preempt-flag pass, if any) to count its completed blocks."""
    import tvm

    counter = buffer_param(PARAM, 1, any_offset=True)  # the runtime passes a view of its per-layer counter array
    body = root_body(func)
    if gpu:
        nests = _block_nests(body)
        if not nests:
            return Counted(func, None, None)
        threads = math.lcm(*(own for _, own in nests))

        def count_at_the_end(loop):
            own = next(own for nest, own in nests if nest.same_as(loop))
            return replace(loop, body=seq([loop.body, _count_call("atomicAdd", counter, threads // own)]))

        body, _ = map_outermost(body, innermost_block_loop, count_at_the_end)
        from tvmsched.passes.launch_geometry import launch_blocks

        launched = launch_blocks(tvm.IRModule({"main": func}))
        blocks = None if launched is None else sum(launched)
    else:
        threads = 1
        flags = next((p for p in func.params if p.name == FLAG_PARAM), None)
        body, blocks = _count_cpu_blocks(body, _count_call(CPU_ADD, counter, 1), flags)
    return Counted(with_root_body(func, body, counter), threads, blocks)


def _block_nests(body) -> list[tuple[object, int]]:
    """(innermost blockIdx loop, threads per block) of each kernel launch the function makes."""
    import tvm
    import tvm_ffi

    nests = []

    def visit(loop):
        if not innermost_block_loop(loop):
            return tvm_ffi.WalkResult.ADVANCE
        nests.append((loop, _threads(loop)))
        return tvm_ffi.WalkResult.SKIP

    tvm_ffi.structural_walk(body, [(tvm.tirx.For, visit)], order="pre")
    return nests


def _threads(block_loop) -> int:
    """Threads per block of one launch: the product of its threadIdx extents (the first loop of each axis)."""
    import tvm
    import tvm_ffi

    extents = {}

    def visit(loop):
        if is_thread_loop(loop, "threadIdx") and const(loop.extent) is not None:
            extents.setdefault(loop.thread_binding.thread_tag, const(loop.extent))

    tvm_ffi.structural_walk(block_loop.body, [(tvm.tirx.For, visit)], order="pre")
    return math.prod(extents.values()) or 1


def _count_call(function: str, counter, amount: int):
    """`function(&progress_counter[0], amount)`: the statement that counts a completed block (per thread on GPU)."""
    import tvm

    address = tvm.tirx.address_of(tvm.tirx.BufferLoad(counter, [int32(0)]))
    return tvm.tirx.Evaluate(tvm.tirx.call_extern("int32", function, address, int32(amount)))


def _count_cpu_blocks(body, count, flags):
    """(`body` with `count` at the end of every parallel iteration (or of the call), the blocks one call counts)."""
    import tvm

    loops = _parallel_loops(body, 1)
    if not loops:  # serial kernel: one block, counted at its end unless a preempt check skipped work
        stmts = list(body.seq) if type(body).__name__ == "SeqStmt" else [body]
        last = stmts[-1]
        if _checks_flag(last, flags):  # the entry check wraps the body
            stmts[-1] = replace(last, then_case=seq([last.then_case, count]))
        else:
            stmts.append(count if flags is None else tvm.tirx.IfThenElse(flag_clear(flags, 0), count, None))
        return seq(stmts), 1

    def wrap(loop):
        inner = loop.body
        if _checks_flag(inner, flags):  # the per-iteration preempt check: count only iterations that ran
            return replace(loop, body=replace(inner, then_case=seq([inner.then_case, count])))
        return replace(loop, body=seq([inner, count]))

    counted = [loop for loop, _ in loops]
    body, _ = map_outermost(body, lambda loop: any(loop.same_as(c) for c in counted), wrap)
    blocks = 0
    for loop, repeats in loops:
        extent = const(loop.extent)
        blocks = None if blocks is None or repeats is None or extent is None else blocks + repeats * extent
    return body, blocks


def _checks_flag(stmt, flags) -> bool:
    """Whether `stmt` is a condition without an else that reads the preempt flags (a check of passes.preempt_flag)."""
    import tvm
    import tvm_ffi

    if flags is None or type(stmt).__name__ != "IfThenElse" or stmt.else_case is not None:
        return False
    found = []
    tvm_ffi.structural_walk(stmt.condition, [(tvm.ir.Var, lambda var: found.append(var.same_as(flags)))])
    return any(found)


def _parallel_loops(stmt, repeats: int | None) -> list[tuple[object, int | None]]:
    """Outermost parallel loops with how often each runs per call (the product of enclosing loop extents)."""
    node = type(stmt).__name__
    if node == "For" and loop_kind(stmt) == "parallel":
        return [(stmt, repeats)]
    if node == "For":
        trips = const(stmt.extent)
        return _parallel_loops(stmt.body, None if repeats is None or trips is None else repeats * trips)
    children = {
        "SeqStmt": lambda: list(stmt.seq), "SBlockRealize": lambda: [stmt.block],
        "SBlock": lambda: [s for s in (stmt.init, stmt.body) if s is not None],
        "IfThenElse": lambda: [s for s in (stmt.then_case, stmt.else_case) if s is not None],
        "AttrStmt": lambda: [stmt.body], "LetStmt": lambda: [stmt.body], "While": lambda: [stmt.body],
    }.get(node, list)()
    return [found for child in children for found in _parallel_loops(child, repeats)]
