"""Preempt-flag instrumentation: where checks go, and what a set flag does."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvmsched import models
from tvmsched.lower import kernels
from tvmsched.passes.preempt_flag import FLAG_LEN, STARTED_SLOT, instrument
from tvmsched.pipeline import lower_model
from tvmsched.lower.targets import make_target


@T.prim_func(s_tir=True)
def scale(A: T.Buffer((4, 16), "float32"), B: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(4, 16):
        with T.sblock("b"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


@T.prim_func(s_tir=True)
def accumulate(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            B[vi] = B[vi] + A[vi]


def _run(func, flags, *arrays):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), make_target("llvm"))
    args = [tvm.runtime.tensor(a) for a in (*arrays, flags)]
    lib["main"](*args)
    return [a.numpy() for a in args]


def test_idempotent_cpu_kernel_checks_each_outer_iteration_and_skips_when_flagged():
    func, check = instrument(scale, idempotent=True, gpu=False)
    assert check == "loop" and "preempt_flags[i % 64] == 0" in func.script()
    a = np.arange(64, dtype="float32").reshape(4, 16)
    _, out, _ = _run(func, np.zeros(FLAG_LEN, "int32"), a, np.zeros_like(a))
    np.testing.assert_array_equal(out, a * 2)
    _, out, _ = _run(func, np.ones(FLAG_LEN, "int32"), a, np.zeros_like(a))
    np.testing.assert_array_equal(out, np.zeros_like(a))  # every iteration skipped


def test_parallel_loops_check_every_iteration():
    sch = tvm.s_tir.Schedule(scale)
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    func, check = instrument(sch.mod["main"], idempotent=True, gpu=False)
    assert check == "parallel" and "preempt_flags[i % 64] == 0" in func.script()


def test_non_idempotent_cpu_kernel_runs_whole_or_not_at_all_and_marks_its_start():
    func, check = instrument(accumulate, idempotent=False, gpu=False)
    assert check == "entry"
    a, b = np.ones(16, "float32"), np.full(16, 5, "float32")
    _, out, flags = _run(func, np.zeros(FLAG_LEN, "int32"), a, b)
    np.testing.assert_array_equal(out, b + 1)
    assert flags[STARTED_SLOT] == 1
    _, out, flags = _run(func, np.ones(FLAG_LEN, "int32") * (np.arange(FLAG_LEN) < 64), a, b)
    np.testing.assert_array_equal(out, b)
    assert flags[STARTED_SLOT] == 0


def test_gpu_kernels_return_early_per_thread_block_and_still_compile():
    _, funcs, target = lower_model(models.build("mlp"), "cuda")
    scheduled = kernels.default_schedule(funcs, target)
    name, func = next(iter(scheduled.items()))
    instrumented, check = instrument(func, idempotent=True, gpu=True)
    assert check == "blocks"
    with target:
        executable = tvm.compile(tvm.IRModule({"main": instrumented.with_attr("global_symbol", "main")}), target)
    source = executable.mod.imports[0].inspect_source()
    assert "if (preempt_flags_ptr[0] != 0) {\n    return;" in source
    assert instrument(func, idempotent=False, gpu=True)[1] == "none"


def test_gpu_loop_checks_stop_a_running_block_within_one_iteration_with_one_uniform_read():
    """--loop-checks K (64: every iteration here): the outermost serial loop under a convolution's thread bindings
    checks the flag: the block's
    first thread reads it (uncached), __syncthreads_or gives every thread of the block its answer (so none waits at a
    later barrier); a loop
    nested in a condition or data-dependent path gets no check; non-idempotent kernels stay unchecked."""
    _, funcs, target = lower_model(models.build("resnet18-small"), "cuda")
    scheduled = kernels.default_schedule(funcs, target)
    name = [n for n in scheduled if "conv" in n][3]
    instrumented, check = instrument(scheduled[name], idempotent=True, gpu=True, loops=64)
    assert check == "loops"
    script = instrumented.script()
    assert script.count("__syncthreads_or") == 2  # its two kernels (rfactor, then the reduction), one loop each
    assert "__ldcv" in script and "preempt_flags[ax3_1_0 % T.int64(64)]" in script and "preempt_flags[ax3_0 % T.int64(64)]" in script
    with target:
        executable = tvm.compile(tvm.IRModule({"main": instrumented.with_attr("global_symbol", "main")}), target)
    source = executable.mod.imports[0].inspect_source()
    entry = source.index("if (preempt_flags_ptr[0] != 0) {\n    return;")
    only_first = source.index("if ((((int)threadIdx.y) == 0) && (((int)threadIdx.x) == 0)) {\n    condval = ((int)(__ldcv(")
    inner = source.index("if (__syncthreads_or(condval) != 0)")  # the first thread's answer, for all
    assert only_first < inner
    assert entry < inner < source.index("__syncthreads();")  # before the loop body's own barrier
    assert instrument(scheduled[name], idempotent=False, gpu=True, loops=64)[1] == "none"
    # an elementwise kernel has no serial loop in its blocks: block-start checks only
    flat = next(n for n in scheduled if "conv" not in n and "pool" not in n)
    assert instrument(scheduled[flat], idempotent=True, gpu=True, loops=64)[1] in ("blocks", "loops")
    # K checks per loop, evenly spaced: this kernel's loops run 2 and 5 iterations; K=2 checks every iteration of the
    # first and every 3rd of the second (0 and 3). The iteration number is the same in every thread: all of them
    # reach the barrier or none does
    spaced, check = instrument(scheduled[name], idempotent=True, gpu=True, loops=2)
    script = spaced.script()
    assert check == "loops" and script.count("__syncthreads_or") == 2
    assert "if ax3_0 % T.int64(3) == T.int64(0):" in script and "ax3_1_0 % " not in script.replace("ax3_1_0 % T.int64(64)", "")
    with target:  # (the CUDA compiler unrolls the 2-iteration loop: one check per iteration, then 1 for the other)
        sources = {k: tvm.compile(tvm.IRModule({"main": instrument(scheduled[name], idempotent=True, gpu=True, loops=k)[0]
                                                .with_attr("global_symbol", "main")}), target).mod.imports[0].inspect_source()
                   for k in (1, 64)}
    assert sources[64].count("__syncthreads_or(") == 3 and sources[1].count("__syncthreads_or(") == 2  # 1: iteration 0
    with pytest.raises(ValueError, match="K >= 1 checks per loop"):
        instrument(scheduled[name], idempotent=True, gpu=True, loops=-1)


@T.prim_func(s_tir=True)
def nested_sum(A: T.Buffer((64, 16, 4), "float32"), B: T.Buffer((64,), "float32")):
    for bx in T.thread_binding(8, thread="blockIdx.x"):
        for tx in T.thread_binding(8, thread="threadIdx.x"):
            for k, u in T.grid(16, 4):
                with T.sblock("b"):
                    vi = T.axis.spatial(64, bx * 8 + tx)
                    vk, vu = T.axis.remap("RR", [k, u])
                    with T.init():
                        B[vi] = T.float32(0)
                    B[vi] = B[vi] + A[vi, vk, vu]


def test_a_serial_loop_holding_another_gets_its_loop_checks_and_the_input_is_left_alone():
    """The pass edits statements, not printed TVMScript: a serial loop whose body is another serial loop (printed
    together as one T.grid) is an outermost uniform serial loop like any other, and the function given is unchanged
    (the edit copies the path it changes)."""
    before = nested_sum.script()
    instrumented, check = instrument(nested_sum, idempotent=True, gpu=True, loops=4)
    assert check == "loops" and nested_sum.script() == before
    script = instrumented.script()
    assert "if k % 4 == 0:" in script and script.count("__syncthreads_or") == 1 and "preempt_flags[k % 64]" in script
    assert "for u in range(4):" in script  # the inner loop is the check's body, unchecked
    target = make_target("cuda")
    with target:
        source = tvm.compile(tvm.IRModule({"main": instrumented.with_attr("global_symbol", "main")}), target).mod.imports[0].inspect_source()
    assert source.count("__syncthreads_or(") == 1 and "if (preempt_flags_ptr[0] != 0) {" in source
