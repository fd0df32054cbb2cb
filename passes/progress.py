"""Progress counters: kernels report how many of their blocks have completed.

The pass adds a last parameter `progress_counter` (int32[1]; the runtime passes each layer its own
slot of the request stream's counter array) and adds to it, atomically, when a block's work is done:
- GPU: every thread of a thread block does `atomicAdd(progress_counter, 1)` at the end of the
  block; completed blocks = counter / threads per block.
- CPU: a block is one iteration of an outermost parallel loop (run by one worker thread); it calls
  `tvmsched_progress_add(progress_counter, 1)` at its end, a C function linked into the kernel
  library (CPU_SOURCE: `__atomic_fetch_add`, as TVM's LLVM backend emits no atomics). A kernel
  without a parallel loop counts one block when it returns.
Blocks that left early on the preempt flag do not count.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from tvmsched.passes.preempt_flag import PARAM as FLAG_PARAM
from tvmsched.passes.script_edit import const, expr, function_tree, iter_kind, outermost_loops, parse_back, root_body

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

    tree, fn = function_tree(func)
    body = root_body(fn)
    if gpu:
        threads = _count_gpu_blocks(fn, body)
        if threads is None:
            return Counted(func, None, None)
        from tvmsched.passes.launch_geometry import launch_blocks

        launched = launch_blocks(tvm.IRModule({"main": func}))
        blocks = None if launched is None else sum(launched)
    else:
        threads = 1
        flagged = any(arg.arg == FLAG_PARAM for arg in fn.args.args)
        blocks = _count_cpu_blocks(body, _count_call(CPU_ADD), flagged)
    # offset_factor=1: the runtime passes a view of its per-layer counter array (non-zero byte offset)
    fn.args.args.append(ast.arg(arg=PARAM, annotation=expr('T.Buffer((1,), "int32", offset_factor=1)')))
    counted = parse_back(tree, func)
    return Counted(counted, threads, blocks)


def _count_gpu_blocks(fn: ast.FunctionDef, body: list) -> int | None:
    """Add the per-thread atomicAdd at the end of every thread block; threads per block (None: no blocks)."""

    def thread(loop) -> str:
        return next((k.value.value for k in loop.iter.keywords if k.arg == "thread"), "")

    def is_block_loop(stmt) -> bool:
        return isinstance(stmt, ast.For) and iter_kind(stmt) == "thread_binding" and thread(stmt).startswith("blockIdx")

    loops = outermost_loops(body, lambda s: is_block_loop(s) and not (len(s.body) == 1 and is_block_loop(s.body[0])))
    if not loops:
        return None
    extents = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and iter_kind(node) == "thread_binding" and thread(node).startswith("threadIdx"):
            extent = node.iter.args[0]
            value = extent.value if isinstance(extent, ast.Constant) else extent.args[0].value
            extents.setdefault(thread(node), int(value))
    for loop in loops:
        loop.body.append(_count_call("atomicAdd"))
    return math.prod(extents.values()) or 1


def _count_call(function: str) -> ast.stmt:
    """`function(&progress_counter[0], 1)`: the statement that counts one completed block (per thread on GPU)."""
    return ast.Expr(expr(f'T.evaluate(T.call_extern("int32", "{function}", T.address_of({PARAM}[0]), 1))'))


def _count_cpu_blocks(body: list, count: ast.stmt, flagged: bool) -> int | None:
    """Add `count` at the end of every parallel iteration (or of the call); the blocks one call counts."""
    loops = _parallel_loops(body, 1)
    if not loops:  # serial kernel: one block, counted at its end unless a preempt check skipped work
        last = body[-1] if body else None
        if isinstance(last, ast.If) and FLAG_PARAM in ast.unparse(last.test):  # the entry check wraps the body
            last.body.append(count)
        else:
            body.append(ast.If(test=expr(f"{FLAG_PARAM}[0] == 0"), body=[count], orelse=[]) if flagged else count)
        return 1
    blocks = 0
    for loop, repeats in loops:
        inner = loop.body
        if len(inner) == 1 and isinstance(inner[0], ast.If) and FLAG_PARAM in ast.unparse(inner[0].test):
            inner = inner[0].body  # the per-iteration preempt check: count only iterations that ran
        inner.append(count)
        extent = _trip_count(loop)
        blocks = None if blocks is None or repeats is None or extent is None else blocks + repeats * extent
    return blocks


def _parallel_loops(stmts: list, repeats: int | None) -> list[tuple[ast.For, int | None]]:
    """Outermost parallel loops with how often each runs per call (the product of enclosing loop extents)."""
    found = []
    for stmt in stmts:
        if isinstance(stmt, ast.For) and iter_kind(stmt) == "parallel":
            found.append((stmt, repeats))
            continue
        inner_repeats = repeats
        if isinstance(stmt, ast.For):
            trips = _trip_count(stmt)
            inner_repeats = None if repeats is None or trips is None else repeats * trips
        for field in ("body", "orelse"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                found += _parallel_loops(inner, inner_repeats)
    return found


def _trip_count(loop: ast.For) -> int | None:
    """Iterations of a serial / grid / unrolled / vectorised TVMScript loop; None when symbolic."""
    args = [const(a) for a in loop.iter.args]
    if any(a is None for a in args) or not args:
        return None
    if iter_kind(loop) == "grid":
        return math.prod(args)
    return args[-1] - args[0] if len(args) > 1 else args[0]
