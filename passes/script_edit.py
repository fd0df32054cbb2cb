"""Editing a PrimFunc as TVMScript: print it, change the Python syntax tree with `ast`, parse it back.

TVM 0.27 has no Python IR mutator of its own (docs/tvm-pitfalls.md). `passes.grid_limit` (GPU kits only) edits the
printed function this way; parsing costs ~0.1-0.2 s per kernel, which is why the passes a compile runs on every kernel
(`passes.preempt_flag`, `passes.progress`) edit the statements themselves (`passes.tir_edit`).
"""

from __future__ import annotations

import ast


def function_tree(func) -> tuple[ast.Module, ast.FunctionDef]:
    """The printed function's syntax tree and its function definition."""
    tree = ast.parse(func.script())
    return tree, next(node for node in tree.body if isinstance(node, ast.FunctionDef))


def parse_back(tree: ast.Module, like):
    """The PrimFunc `tree` describes, with the attributes of `like` (parsed functions come back without them)."""
    import tvm

    parsed = tvm.script.from_source(ast.unparse(ast.fix_missing_locations(tree)))
    for key, value in like.attrs.items() if like.attrs is not None else ():
        parsed = parsed.with_attr(key, value)
    return parsed


def expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def root_body(fn: ast.FunctionDef) -> list:
    """The statement list under the root block (explicit `with T.sblock("root")` or the function body)."""
    for stmt in fn.body:
        if isinstance(stmt, ast.With) and ast.unparse(stmt.items[0].context_expr).replace("'", '"') == 'T.sblock("root")':
            return stmt.body
    return fn.body


def iter_kind(loop: ast.For) -> str:
    """"grid", "serial", "range", "parallel", "thread_binding", ... of a TVMScript loop."""
    func = loop.iter.func if isinstance(loop.iter, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def outermost_loops(stmts: list, matches) -> list[ast.For]:
    """The loops for which `matches` holds, not looking inside a match."""
    found = []
    for stmt in stmts:
        if isinstance(stmt, ast.For) and matches(stmt):
            found.append(stmt)
            continue
        for field in ("body", "orelse"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                found += outermost_loops(inner, matches)
    return found


def const(node) -> int | None:
    """The value of an integer literal or T.int64(k) / T.int32(k); None when not constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
        return node.args[0].value if isinstance(node.args[0].value, int) else None
    return None
