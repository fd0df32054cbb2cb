"""Grid limiting: restrict a GPU kernel to about k SMs without green contexts.

The kernel is launched with only the thread blocks that k SMs hold at once; each block then loops
over the original block indices it stands for:

    for bx in T.thread_binding(N, thread="blockIdx.x"): body(bx)
becomes
    for bx_lim in T.thread_binding(B, thread="blockIdx.x"):
        for bx_iter in T.serial(ceil(N / B)):
            if bx_iter * B + bx_lim >= N: T.thread_return()     # only the last round overhangs
            body(bx_iter * B + bx_lim)

with B = k x (blocks one SM holds, from the block's thread count; registers and shared memory are
not counted) divided by the other grid dimensions. It edits the printed TVMScript (passes.script_edit).
"""

from __future__ import annotations

import ast
import math

from tvmsched.passes.script_edit import const, expr, function_tree, iter_kind, parse_back, root_body


def grid_limit(func, units: int, *, sm_max_threads: int = 2048, sm_max_blocks: int = 32):
    """(PrimFunc launching at most ~`units` SMs' worth of blocks, its new blockIdx.x extent or None if unchanged)."""

    tree, fn = function_tree(func)
    loops = _bound_loops(root_body(fn))
    block_x = [loop for loop in loops if _thread(loop) == "blockIdx.x"]
    if len(block_x) != 1:
        return func, None
    loop = block_x[0]
    extent = const(loop.iter.args[0])
    threads = math.prod(const(l.iter.args[0]) or 1 for l in loops if _thread(l).startswith("threadIdx"))
    others = math.prod(const(l.iter.args[0]) or 1 for l in loops if _thread(l).startswith("blockIdx") and l is not loop)
    per_sm = max(1, min(sm_max_blocks, sm_max_threads // max(threads, 1)))
    limit = max(1, units * per_sm // max(others, 1))
    if extent is None or limit >= extent or not isinstance(loop.target, ast.Name):
        return func, None
    var = loop.target.id
    lim, it = f"{var}_lim", f"{var}_iter"
    int_type = "T.int64" if "int64" in ast.unparse(loop.iter.args[0]) else "T.int32"  # keep the index dtype
    index = expr(f"({it} * {int_type}({limit}) + {lim})")
    extents = _loop_extents(tree)
    body = [_Substitute(var, index, extents).visit(stmt) for stmt in loop.body]
    leave = ast.If(test=expr(f"{ast.unparse(index)} >= {int_type}({extent})"), body=[ast.Expr(expr("T.thread_return()"))], orelse=[])
    rounds = ast.For(target=ast.Name(it, ast.Store()), iter=expr(f"T.serial({int_type}({-(-extent // limit)}))"),
                     body=[leave, *body] if extent % limit else body, orelse=[])
    loop.target = ast.Name(lim, ast.Store())
    loop.iter.args[0] = expr(f"{int_type}({limit})")
    loop.body = [rounds]
    limited = parse_back(tree, func)
    return limited, limit


def _thread(loop: ast.For) -> str:
    for keyword in loop.iter.keywords:
        if keyword.arg == "thread" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return ""


def _bound_loops(stmts: list) -> list[ast.For]:
    found = []
    for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
        if isinstance(node, ast.For) and iter_kind(node) == "thread_binding":
            found.append(node)
    return found


def _loop_extents(tree) -> dict[str, ast.expr]:
    """Loop variable -> its extent expression, for every loop of the function."""
    extents = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and node.iter.args:
            names = [t.id for t in node.target.elts] if isinstance(node.target, ast.Tuple) else [getattr(node.target, "id", "")]
            args = node.iter.args if len(names) > 1 else node.iter.args[-1:]
            extents.update(zip(names, args))
    return extents


class _Substitute(ast.NodeTransformer):
    """Replace a loop variable by an expression; `T.axis.remap` (variables only) becomes one binding per axis."""

    def __init__(self, name: str, replacement: ast.expr, extents: dict[str, ast.expr]):
        self.name, self.replacement, self.extents = name, replacement, extents

    def visit_Name(self, node: ast.Name):
        if node.id == self.name and isinstance(node.ctx, ast.Load):
            return ast.copy_location(expr(ast.unparse(self.replacement)), node)
        return node

    def visit_Assign(self, node: ast.Assign):
        call = node.value
        is_remap = isinstance(call, ast.Call) and ast.unparse(call.func) == "T.axis.remap"
        if not is_remap or self.name not in {getattr(v, "id", None) for v in call.args[1].elts}:
            return self.generic_visit(node)
        kinds = call.args[0].value
        targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
        bindings = []
        for target, kind, value in zip(targets, kinds, call.args[1].elts):
            axis = {"S": "spatial", "R": "reduce"}[kind]
            text = f"{target.id} = T.axis.{axis}({ast.unparse(self.extents[value.id])}, {ast.unparse(self.visit(value))})"
            bindings.append(ast.parse(text).body[0])
        return bindings
