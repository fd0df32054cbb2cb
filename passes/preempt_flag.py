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

Every compile runs this pass, so it edits the function's statements directly rather than printing and parsing
TVMScript back (that round trip was ~35 % of a default compile): passes.tir_edit. TVM 0.27 has no Python IR
mutator of its own, but tvm-ffi's structural mutator rebuilds the path from the root to each statement the pass
changes and shares the rest (copy-on-write; docs/tvm-pitfalls.md).
"""

from __future__ import annotations

from tvmsched.passes.tir_edit import (
    all_of, buffer_param, const, innermost_block_loop, int32, is_thread_loop, loop_kind, map_outermost, replace, root_body,
    seq, thread_return, with_root_body, zero,
)

FLAG_SLOTS = 64
STARTED_SLOT = FLAG_SLOTS
FLAG_LEN = FLAG_SLOTS + 1
PARAM = "preempt_flags"
DECLARATIONS = ("AllocBuffer", "DeclBuffer")  # must stay ahead of an entry check


def instrument(func, *, idempotent: bool, gpu: bool, loops: int = 0):
    """(instrumented PrimFunc, where it checks: "blocks" | "loops" | "parallel" | "loop" | "entry" | "none").

    loops: K > 0: GPU idempotent kernels also check K times through their blocks' outermost uniform serial loop,
    at evenly spaced iterations (module docstring); 0: they do not."""
    loops = int(loops)
    if loops < 0:
        raise ValueError(f"loops must be 0 (no loop checks) or K >= 1 checks per loop, not {loops}")
    edit = _Checks(_flag_param())
    body = root_body(func)
    if gpu:
        check = "none"
        if idempotent:
            body, blocks = edit.block_starts(body)
            check = "blocks" if blocks else "none"
        if check == "blocks" and loops:
            looped, wrapped = edit.uniform_serial_loops(body, loops)
            if wrapped:
                body, check = looped, "loops"
    elif not idempotent:
        body, check = edit.entry(body), "entry"
    else:
        body, parallel = edit.parallel_loops(body)
        if parallel:
            check = "parallel"
        else:
            body, check = edit.loop_nests(body), "loop"
    return with_root_body(func, body, edit.flags), check


class _Checks:
    """The checks on one function's flag buffer; each method returns new statements and leaves its input alone."""

    def __init__(self, flags):
        self.flags = flags

    def clear(self, slot):
        return flag_clear(self.flags, slot)

    def load(self, slot):
        return flag_load(self.flags, slot)

    def parallel_loops(self, body):
        """A check at the start of every iteration of each outermost parallel loop."""
        import tvm

        def wrap(loop):
            return replace(loop, body=tvm.tirx.IfThenElse(self.clear(_loop_slot(loop)), loop.body, None))

        return map_outermost(body, lambda s: loop_kind(s) == "parallel", wrap)

    def block_starts(self, body):
        """An early exit at the start of the innermost blockIdx loop of every nest (an early return, not a
        condition around the body: TVM cannot put __syncthreads in a condition)."""
        import tvm

        def wrap(loop):
            leave = tvm.tirx.IfThenElse(tvm.tirx.NE(self.load(0), int32(0)), thread_return(), None)
            return replace(loop, body=seq([leave, loop.body]))

        return map_outermost(body, innermost_block_loop, wrap)

    def uniform_serial_loops(self, body, checks: int):
        """Block-uniform checks at `checks` evenly spaced iterations (every ceil(extent / checks)-th, the first
        included) of the outermost serial loops under each innermost blockIdx loop."""

        def wrap(block):
            checked = self._uniform(block.body, [], checks)
            return block if checked.same_as(block.body) else replace(block, body=checked)

        new, count = map_outermost(body, innermost_block_loop, wrap)
        return new, count > 0

    def _uniform(self, stmt, threads: list, checks: int):
        """`stmt` with a check in each serial loop of constant extent > 1 that every thread of the block reaches
        alike: looking through thread bindings and statement lists only (not into conditions, blocks or other
        loops, whose paths may differ between threads)."""
        import tvm

        kind = type(stmt).__name__
        if kind == "SeqStmt":
            return seq([self._uniform(s, threads, checks) for s in stmt.seq], like=stmt)
        if kind != "For":
            return stmt
        if is_thread_loop(stmt, "threadIdx"):
            return replace(stmt, body=self._uniform(stmt.body, [*threads, stmt.loop_var], checks))
        if is_thread_loop(stmt, "vthread"):
            return replace(stmt, body=self._uniform(stmt.body, threads, checks))
        extent = const(stmt.extent)
        if loop_kind(stmt) != "serial" or const(stmt.min) != 0 or extent is None or extent <= 1:
            return stmt
        # __ldcv: a load the caches cannot answer from a copy made before the host set the flag (inside one
        # kernel a plain load of a read-only __restrict__ pointer may come from the non-coherent cache). Only
        # the block's first thread reads (one uncached load per block and iteration, not one per thread: every
        # thread reading host-mapped flags cost 76-190x on an H100, bench/results/gpu.md); __syncthreads_or
        # hands its answer to all.
        address = tvm.tirx.address_of(self.load(_loop_slot(stmt)))
        read = tvm.tirx.Cast("int32", tvm.tirx.NE(tvm.tirx.call_extern("int32", "__ldcv", address), int32(0)))
        if threads:
            first = [tvm.tirx.EQ(var, zero(var)) for var in threads]
            read = tvm.tirx.if_then_else(all_of(first), read, int32(0))  # lazily evaluated: the others do not load
        seen = tvm.tirx.NE(tvm.tirx.call_extern("int32", "__syncthreads_or", read), int32(0))
        check = tvm.tirx.IfThenElse(seen, thread_return(), None)
        every = -(-extent // checks)
        if every > 1:  # the same iteration number in every thread of the block: all check, or none
            iteration = stmt.loop_var % every
            check = tvm.tirx.IfThenElse(tvm.tirx.EQ(iteration, zero(iteration)), check, None)
        return replace(stmt, body=seq([check, stmt.body]))

    def entry(self, body):
        """One check before any work; passing it marks the started slot."""
        import tvm

        stmts = list(body.seq) if type(body).__name__ == "SeqStmt" else [body]
        first = next((i for i, s in enumerate(stmts) if type(s).__name__ not in DECLARATIONS), len(stmts))
        mark = tvm.tirx.BufferStore(self.flags, int32(1), [int32(STARTED_SLOT)])
        checked = tvm.tirx.IfThenElse(self.clear(0), seq([mark, *stmts[first:]]), None)
        return seq([*stmts[:first], checked])

    def loop_nests(self, body):
        """A check at every iteration of each top-level nest's first loop with more than one iteration."""
        if type(body).__name__ == "SeqStmt":
            return seq([self.nest(s) if type(s).__name__ == "For" else s for s in body.seq], like=body)
        return self.nest(body) if type(body).__name__ == "For" else body

    def nest(self, loop):
        import tvm

        if loop_kind(loop) != "serial":  # vectorised / unrolled / bound loops: check once before the nest
            return tvm.tirx.IfThenElse(self.clear(0), loop, None)
        if const(loop.extent) != 1:
            return replace(loop, body=tvm.tirx.IfThenElse(self.clear(_loop_slot(loop)), loop.body, None))
        if type(loop.body).__name__ == "For":  # a unit loop: look one loop further in
            return replace(loop, body=self.nest(loop.body))
        return tvm.tirx.IfThenElse(self.clear(0), loop, None)


def flag_load(flags, slot):
    """flags[slot] (`slot`: an int or an index expression)."""
    import tvm

    return tvm.tirx.BufferLoad(flags, [int32(slot) if isinstance(slot, int) else slot])


def flag_clear(flags, slot):
    """flags[slot] == 0: the flag is not set (what a check tests before running on)."""
    import tvm

    return tvm.tirx.EQ(flag_load(flags, slot), int32(0))


def _loop_slot(loop):
    """A loop-varying slot (loop var % FLAG_SLOTS): the load cannot be hoisted out of the loop."""
    return loop.loop_var % FLAG_SLOTS


def _flag_param():
    """The flag buffer parameter, as TVMScript declares `preempt_flags: T.Buffer((FLAG_LEN,), "int32")`."""
    return buffer_param(PARAM, FLAG_LEN)
