"""Editing TIR statements directly (passes.preempt_flag, passes.progress): the path from the root to each
changed statement is rebuilt with tvm-ffi's copy-on-write structural mutator, new statements come from TIR's
constructors, the rest is shared (Vars and buffers keep their identity). TVM 0.27 has no Python IR mutator of its
own, and printing and parsing TVMScript (passes.script_edit) costs ~0.1-0.2 s a kernel (docs/tvm-pitfalls.md)."""

from __future__ import annotations


def innermost_block_loop(stmt) -> bool:
    return is_thread_loop(stmt, "blockIdx") and not is_thread_loop(stmt.body, "blockIdx")


def buffer_param(name: str, length: int, *, any_offset: bool = False):
    """A new int32[length] buffer parameter, equal to what TVMScript declares for `name: T.Buffer((length,), "int32")`,
    or with `any_offset` for `T.Buffer((length,), "int32", offset_factor=1)`: a buffer that may start anywhere in its
    allocation (the runtime passes a view at a non-zero byte offset)."""
    import tvm

    return tvm.tirx.decl_buffer(
        (length,), "int32", name=name, scope="global", elem_offset=None if any_offset else 0, data_alignment=64,
        offset_factor=1, layout=None,
    )


def root_body(func):
    """The statements under the root block (or the function's body when it has none)."""
    root = func.body
    if type(root).__name__ == "SBlockRealize" and root.block.name_hint == "root":
        return root.block.body
    return root


def with_root_body(func, body, param):
    """`func` with `body` under its root block and `param` as its last parameter (attributes kept)."""
    import tvm

    root = func.body
    if type(root).__name__ == "SBlockRealize" and root.block.name_hint == "root":
        body = replace(root, block=replace(root.block, body=body))
    return tvm.tirx.PrimFunc([*func.params, param], body, func.ret_type, func.attrs)


def map_outermost(stmt, matches, wrap):
    """(`stmt` with `wrap(loop)` in place of each outermost loop for which `matches` holds, not looking inside a
    match; how many `wrap` changed). The rest is shared, not copied (tvm-ffi's copy-on-write structural mutator)."""
    import tvm
    import tvm_ffi

    changed = 0

    def visit(loop, mutator):
        nonlocal changed
        if not matches(loop):
            return mutator.default_mutate(loop)
        wrapped = wrap(loop)
        changed += not wrapped.same_as(loop)
        return wrapped

    return tvm_ffi.structural_mutate(stmt, [(tvm.tirx.For, visit)]), changed


def replace(node, **fields):
    """`node` with new values for some of its child statements (`node` itself is left alone)."""
    import tvm_ffi

    for name, new in fields.items():
        old = getattr(node, name)
        if not new.same_as(old):
            node = tvm_ffi.structural_mutate(node, [(type(old), _swap(old, new))])
    return node


def _swap(old, new):
    """A structural_mutate callback putting `new` where `old` was (a callback's third parameter, if any, is the
    mutator's in-place mode: the pair cannot be bound as default arguments)."""

    def swap(value, mutator):
        return new if value.same_as(old) else mutator.default_mutate(value)

    return swap


def seq(stmts: list, like=None):
    """One statement of `stmts` (nested statement lists flattened, as TVMScript prints and parses them)."""
    import tvm

    flat = []
    for stmt in stmts:
        flat += list(stmt.seq) if type(stmt).__name__ == "SeqStmt" else [stmt]
    if like is not None and len(flat) == len(like.seq) and all(a.same_as(b) for a, b in zip(flat, like.seq)):
        return like
    return flat[0] if len(flat) == 1 else tvm.tirx.SeqStmt(flat)


def thread_return():
    import tvm

    return tvm.tirx.Evaluate(tvm.tirx.op.thread_return())


def all_of(conditions: list):
    import tvm

    result = conditions[0]
    for condition in conditions[1:]:
        result = tvm.tirx.And(result, condition)
    return result


def int32(value: int):
    import tvm

    return tvm.tirx.const(value, "int32")


def zero(expr):
    """0 of `expr`'s type."""
    import tvm

    return tvm.tirx.const(0, expr.ty.dtype)


def loop_kind(stmt) -> str:
    """"serial", "parallel", "vectorized", "unrolled", "thread_binding" of a For; "" for other statements."""
    if type(stmt).__name__ != "For":
        return ""
    return {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled", 4: "thread_binding"}.get(int(stmt.kind), "")


def is_thread_loop(stmt, axis: str) -> bool:
    return loop_kind(stmt) == "thread_binding" and stmt.thread_binding is not None and axis in stmt.thread_binding.thread_tag


def const(expr) -> int | None:
    """The value of an integer immediate; None when not constant."""
    return int(expr.value) if type(expr).__name__ == "IntImm" else None
