"""Progress counters: GPU kernels report how many of their thread blocks have completed.

The pass adds a last parameter `progress_counter` (int32[1]; the runtime passes each layer its own
slot of the request stream's bitmap) and, at the end of every thread block's work, each thread does
`atomicAdd(progress_counter, 1)`: completed blocks = counter / threads per block. Blocks that left
early on the preempt flag do not count. CPU kernels are not instrumented (the LLVM backend has no
atomics here): the runtime records their progress when a launch returns.
"""

from __future__ import annotations

import ast
import math

from tvmsched.passes.preempt_flag import _expr, _iter_kind, _outermost_loops, _root_body

PARAM = "progress_counter"


def count_progress(func):
    """(instrumented GPU PrimFunc, threads per block), or (func, None) when it has no thread blocks."""
    import tvm

    tree = ast.parse(func.script())
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef))
    body = _root_body(fn)

    def thread(loop) -> str:
        return next((k.value.value for k in loop.iter.keywords if k.arg == "thread"), "")

    def is_block_loop(stmt) -> bool:
        return isinstance(stmt, ast.For) and _iter_kind(stmt) == "thread_binding" and thread(stmt).startswith("blockIdx")

    loops = _outermost_loops(body, lambda s: is_block_loop(s) and not (len(s.body) == 1 and is_block_loop(s.body[0])))
    if not loops:
        return func, None
    extents = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and _iter_kind(node) == "thread_binding" and thread(node).startswith("threadIdx"):
            extent = node.iter.args[0]
            value = extent.value if isinstance(extent, ast.Constant) else extent.args[0].value
            extents.setdefault(thread(node), int(value))
    # offset_factor=1: the runtime passes a view of its per-layer counter array (non-zero byte offset)
    fn.args.args.append(ast.arg(arg=PARAM, annotation=_expr('T.Buffer((1,), "int32", offset_factor=1)')))
    for loop in loops:
        done = _expr(f'T.call_extern("int32", "atomicAdd", T.address_of({PARAM}[0]), 1)')
        loop.body.append(ast.Expr(_expr(f"T.evaluate({ast.unparse(done)})")))
    counted = tvm.script.from_source(ast.unparse(ast.fix_missing_locations(tree)))
    for key, value in func.attrs.items() if func.attrs is not None else ():
        counted = counted.with_attr(key, value)
    return counted, math.prod(extents.values()) or 1
