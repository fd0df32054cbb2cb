"""Preempt-flag instrumentation: kernels check a host-set flag and skip their remaining work.

The pass adds a last parameter `preempt_flags` (int32[FLAG_LEN]; host memory on CPU, device memory
on GPU). The host sets slots 0..FLAG_SLOTS-1 together to preempt. Where the checks go:
- GPU, idempotent kernel ("blocks"): at the start of every thread block; a block that sees the flag
  does nothing, so a queued or running kernel ends within one block. It is re-run later.
  With `loops=K` ("loops"), also at K evenly spaced iterations (every ceil(extent / K)-th, the first included) of
  the outermost serial loop that all threads of a block run alike (under the thread bindings, constant extent): a
  running block stops within about 1/K of its loop, which bounds a single-wave kernel's remaining time (its blocks have all started, so block-start checks cannot stop it). The
  threads read the flag through `__syncthreads_or`, one barrier that gives every thread of the block the same
  answer: a plain read could differ between threads and leave some waiting at a later `__syncthreads`. The
  iteration number is the same in every thread, so all of them take the check or none does. The engine keeps
  such a model's flag in device memory (a read that stays in the GPU's L2, not one across PCIe: docs/preemption.md).
- CPU, idempotent kernel ("parallel"): at the start of every iteration of each parallel loop;
  kernels without one ("loop") check at every iteration of the first loop of each loop nest with
  more than one iteration. Iteration i reads slot i % FLAG_SLOTS: a loop-varying address keeps
  the compiler from hoisting the load out of the loop.
- CPU, non-idempotent kernel ("entry"): one check before any work; a kernel that passes it marks
  slot STARTED_SLOT and runs to the end, so it is either not run at all or run exactly once.
- GPU, non-idempotent kernel ("none"): blocks read the flag at different times, so any in-kernel
  check could leave it half done: it has no check and is only held back before launch.

TVM 0.27 has no Python IR mutators, so the pass edits the function's TVMScript syntax tree and
parses it back (see docs/tvm-pitfalls.md).
"""

from __future__ import annotations

import ast

FLAG_SLOTS = 64
STARTED_SLOT = FLAG_SLOTS
FLAG_LEN = FLAG_SLOTS + 1
PARAM = "preempt_flags"
SERIAL_ITERS = {"range", "serial", "grid"}


def instrument(func, *, idempotent: bool, gpu: bool, loops: int = 0):
    """(instrumented PrimFunc, where it checks: "blocks" | "loops" | "parallel" | "loop" | "entry" | "none").

    loops: K > 0: GPU idempotent kernels also check K times through their blocks' outermost uniform serial loop,
    at evenly spaced iterations (module docstring); 0: they do not."""
    import tvm

    loops = int(loops)
    if loops < 0:
        raise ValueError(f"loops must be 0 (no loop checks) or K >= 1 checks per loop, not {loops}")

    tree = ast.parse(func.script())
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef))
    fn.args.args.append(ast.arg(arg=PARAM, annotation=_expr(f'T.Buffer(({FLAG_LEN},), "int32")')))
    body = _root_body(fn)
    if gpu:
        check = "blocks" if idempotent and _wrap_block_loops(body) else "none"
        if check == "blocks" and loops and _wrap_uniform_serial_loops(body, loops):
            check = "loops"
    elif not idempotent:
        _wrap_entry(body)
        check = "entry"
    elif _wrap_parallel_loops(body):
        check = "parallel"
    else:
        _wrap_loop_nests(body)
        check = "loop"
    source = ast.unparse(ast.fix_missing_locations(tree))
    instrumented = tvm.script.from_source(source)
    for key, value in func.attrs.items() if func.attrs is not None else ():
        instrumented = instrumented.with_attr(key, value)
    return instrumented, check


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def _flag_clear(index: str) -> ast.expr:
    return _expr(f"{PARAM}[{index}] == 0")


def _root_body(fn: ast.FunctionDef) -> list:
    """The statement list under the root block (explicit `with T.sblock("root")` or the function body)."""
    for stmt in fn.body:
        if isinstance(stmt, ast.With) and ast.unparse(stmt.items[0].context_expr).replace("'", '"') == 'T.sblock("root")':
            return stmt.body
    return fn.body


def _iter_kind(loop: ast.For) -> str:
    """"grid", "serial", "range", "parallel", "thread_binding", ... of a TVMScript loop."""
    func = loop.iter.func if isinstance(loop.iter, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _outermost_loops(stmts: list, matches) -> list[ast.For]:
    """The loops for which `matches` holds, not looking inside a match."""
    found = []
    for stmt in stmts:
        if isinstance(stmt, ast.For) and matches(stmt):
            found.append(stmt)
            continue
        for field in ("body", "orelse"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                found += _outermost_loops(inner, matches)
    return found


def _wrap_parallel_loops(body: list) -> bool:
    loops = _outermost_loops(body, lambda s: _iter_kind(s) == "parallel" and isinstance(s.target, ast.Name))
    for loop in loops:
        loop.body = [ast.If(test=_flag_clear(f"{loop.target.id} % {FLAG_SLOTS}"), body=loop.body, orelse=[])]
    return bool(loops)


def _wrap_block_loops(body: list) -> bool:
    """An early exit at the start of the innermost blockIdx loop of every nest; False if there is none."""

    def is_block_loop(stmt) -> bool:
        return isinstance(stmt, ast.For) and _iter_kind(stmt) == "thread_binding" and "blockIdx" in ast.unparse(stmt.iter)

    innermost = lambda s: is_block_loop(s) and not (len(s.body) == 1 and is_block_loop(s.body[0]))
    loops = _outermost_loops(body, innermost)
    for loop in loops:
        # an early return, not an if around the body: TVM cannot put __syncthreads in a condition
        leave = ast.If(test=_expr(f"{PARAM}[0] != 0"), body=[ast.Expr(_expr("T.thread_return()"))], orelse=[])
        loop.body = [leave, *loop.body]
    return bool(loops)


def _wrap_uniform_serial_loops(body: list, checks: int) -> bool:
    """Block-uniform checks at `checks` evenly spaced iterations (every ceil(extent / checks)-th, the first included)
    of the outermost serial loops under each innermost blockIdx loop."""
    blocks = _outermost_loops(body, lambda s: _is_thread_loop(s, "blockIdx") and not (len(s.body) == 1 and _is_thread_loop(s.body[0], "blockIdx")))
    wrapped = False
    for block in blocks:
        for loop, threads, extent in _uniform_serial_loops(block.body, []):
            slot = f"{loop.target.id} % {FLAG_SLOTS}"  # a loop-varying slot: the load cannot be hoisted
            # __ldcv: a load the caches cannot answer from a copy made before the host set the flag (inside one
            # kernel a plain load of a read-only __restrict__ pointer may come from the non-coherent cache). Only
            # the block's first thread reads (one uncached load per block and iteration, not one per thread: every
            # thread reading host-mapped flags cost 76-190x on an H100, bench/results/gpu.md); __syncthreads_or
            # hands its answer to all.
            read = f'T.Cast("int32", T.call_extern("int32", "__ldcv", T.address_of({PARAM}[{slot}])) != 0)'
            if threads:
                first = " and ".join(f"{name} == 0" for name in threads)
                read = f"T.if_then_else({first}, {read}, 0)"  # lazily evaluated: the others do not load
            seen = _expr(f'T.call_extern("int32", "__syncthreads_or", {read}) != 0')
            check = ast.If(test=seen, body=[ast.Expr(_expr("T.thread_return()"))], orelse=[])
            every = -(-extent // checks)
            if every > 1:  # the same iteration number in every thread of the block: all check, or none
                check = ast.If(test=_expr(f"{loop.target.id} % {every} == 0"), body=[check], orelse=[])
            loop.body = [check, *loop.body]
            wrapped = True
    return wrapped


def _is_thread_loop(stmt, axis: str) -> bool:
    return isinstance(stmt, ast.For) and _iter_kind(stmt) == "thread_binding" and axis in ast.unparse(stmt.iter)


def _uniform_serial_loops(stmts: list, threads: list[str]) -> list[tuple[ast.For, list[str], int]]:
    """Serial loops of constant extent > 1 that every thread of the block reaches alike, each with the threadIdx
    loop variables around it and its extent: looking through thread bindings only (not into conditions, blocks or other loops,
    whose paths may differ between threads)."""
    found = []
    for stmt in stmts:
        if _is_thread_loop(stmt, "threadIdx") and isinstance(stmt.target, ast.Name):
            found += _uniform_serial_loops(stmt.body, [*threads, stmt.target.id])
        elif _is_thread_loop(stmt, "vthread"):
            found += _uniform_serial_loops(stmt.body, threads)
        elif isinstance(stmt, ast.For) and _iter_kind(stmt) in ("range", "serial") and isinstance(stmt.target, ast.Name):
            args = stmt.iter.args
            extent = _const(args[-1]) if len(args) == 1 else None
            if extent is not None and extent > 1:
                found.append((stmt, threads, extent))
    return found


def _wrap_entry(body: list) -> None:
    """One check before any work; passing it marks the started slot."""
    first = next((i for i, stmt in enumerate(body) if not _is_declaration(stmt)), len(body))
    mark = ast.parse(f"{PARAM}[{STARTED_SLOT}] = 1").body[0]
    body[first:] = [ast.If(test=_flag_clear("0"), body=[mark, *body[first:]], orelse=[])]


def _is_declaration(stmt) -> bool:
    """func_attr calls and buffer allocations, which must stay at the top of the root block."""
    text = ast.unparse(stmt)
    return text.startswith("T.func_attr") or "alloc_buffer" in text or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))


def _wrap_loop_nests(body: list) -> None:
    """Check at every iteration of each top-level nest's first loop with more than one iteration."""
    for index, stmt in enumerate(list(body)):
        if isinstance(stmt, ast.For):
            body[index] = _check_nest(stmt)


def _check_nest(loop: ast.For) -> ast.stmt:
    kind = _iter_kind(loop)
    if kind not in SERIAL_ITERS:  # vectorised / unrolled / bound loops: check once before the nest
        return ast.If(test=_flag_clear("0"), body=[loop], orelse=[])
    names = [t.id for t in loop.target.elts] if isinstance(loop.target, ast.Tuple) else [loop.target.id]
    extents = loop.iter.args[-1:] if kind in ("range", "serial") and len(loop.iter.args) > 1 else loop.iter.args
    split = next((i for i, extent in enumerate(extents) if _const(extent) != 1), None)
    if split is None:  # all unit loops: look one nest further in
        if len(loop.body) == 1 and isinstance(loop.body[0], ast.For):
            loop.body = [_check_nest(loop.body[0])]
            return loop
        return ast.If(test=_flag_clear("0"), body=[loop], orelse=[])
    if kind != "grid":
        loop.body = [ast.If(test=_flag_clear(f"{names[0]} % {FLAG_SLOTS}"), body=loop.body, orelse=[])]
        return loop
    inner_body = loop.body
    if split + 1 < len(names):
        inner_body = [_grid(names[split + 1:], extents[split + 1:], loop.body)]
    checked = [ast.If(test=_flag_clear(f"{names[split]} % {FLAG_SLOTS}"), body=inner_body, orelse=[])]
    return _grid(names[: split + 1], extents[: split + 1], checked)


def _grid(names: list[str], extents: list, body: list) -> ast.For:
    if len(names) == 1:
        return ast.For(target=ast.Name(names[0], ast.Store()), iter=ast.Call(_expr("T.serial"), [extents[0]], []), body=body, orelse=[])
    target = ast.Tuple([ast.Name(n, ast.Store()) for n in names], ast.Store())
    return ast.For(target=target, iter=ast.Call(_expr("T.grid"), list(extents), []), body=body, orelse=[])


def _const(node) -> int | None:
    """The value of an integer literal or T.int64(k) / T.int32(k); None when not constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
        return node.args[0].value if isinstance(node.args[0].value, int) else None
    return None
