"""Progress counters (passes.progress): GPU kernels compiled here and counted on a GPU
(bench/gpu/progress_check.py); CPU kernels counted here."""

import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm.script import tirx as T

from tvmsched import models
from tvmsched.lower import kernels
from tvmsched.lower.targets import make_target
from tvmsched.passes.preempt_flag import FLAG_LEN, instrument
from tvmsched.passes.progress import CPU_ADD, CPU_SOURCE, PARAM, count_progress
from tvmsched.pipeline import compile_model, lower_model


def test_every_thread_counts_its_block_once_at_the_end():
    _, funcs, target = lower_model(models.build("mlp"), "cuda")
    scheduled = kernels.default_schedule(funcs, target)
    name, func = next(iter(scheduled.items()))
    counted = count_progress(func)
    assert f'T.call_extern("int32", "atomicAdd", T.address_of({PARAM}[0]), 1)' in counted.func.script()
    assert counted.threads == 256  # the dlight GEMV of mlp's first layer: 256 threads per block
    assert count_progress(funcs[name]).threads is None  # no thread blocks: left alone


@T.prim_func(s_tir=True)
def two_launches(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("first"):
                vi = T.axis.spatial(256, bx * 64 + tx)
                B[vi] = A[vi] * T.float32(2)
    for bx in T.thread_binding(16, thread="blockIdx.x"):
        for tx in T.thread_binding(16, thread="threadIdx.x"):
            with T.sblock("second"):
                vi = T.axis.spatial(256, bx * 16 + tx)
                A[vi] = B[vi] + T.float32(1)


def test_launches_of_different_block_sizes_count_every_block_alike():
    """A function that launches 4 blocks of 64 threads, then 16 of 16: threads = lcm(64, 16) = 64, and the second
    launch's threads add 4 each, so every finished block adds 64 whichever launch it belongs to (before, the first
    threadIdx extents found made threads = 64 and the second launch's blocks counted a quarter)."""
    counted = count_progress(two_launches)
    assert counted.threads == 64 and counted.blocks == 4 + 16
    script = counted.func.script()
    for amount in (1, 4):
        assert f'T.call_extern("int32", "atomicAdd", T.address_of({PARAM}[0]), {amount})' in script
    target = make_target("cuda")
    with target:
        source = tvm.compile(tvm.IRModule({"main": counted.func.with_attr("global_symbol", "main")}), target)
    source = source.mod.imports[0].inspect_source()
    assert source.count("atomicAdd(") == 2 and ", 4);" in source  # (4 x 64 x 1 + 16 x 16 x 4) / 64 = 20 blocks


def test_cuda_artifacts_carry_counters_and_threads_per_block():
    artifact = compile_model(models.build("mlp"), target="cuda", progress_counters=True)
    assert artifact.manifest.progress_counters
    candidates = [c for layer in artifact.manifest.layers for c in layer.candidates]
    assert all(c.threads and c.threads > 0 and c.preempt_check == "blocks" for c in candidates)
    assert all(c.progress_blocks >= c.blocks for c in candidates)  # every launch of the layer, >= the largest


@T.prim_func
def _repeated_parallel(a: T.Buffer((3, 8, 4), "float32"), b: T.Buffer((3, 8, 4), "float32")):
    for n in range(3):
        for i in T.parallel(8):
            for j in range(4):
                b[n, i, j] = a[n, i, j] + T.float32(1)


def _cpu_library(func, check="parallel"):
    """(counted kernel, Counted) built for llvm with the counters' C source linked in."""
    flagged, where = instrument(func.with_attr("global_symbol", "k"), idempotent=True, gpu=False)
    assert where == check
    counted = count_progress(flagged, gpu=False)
    library = kernels.build_library({"k": counted.func}, tvm.target.Target("llvm"), {"progress.cc": CPU_SOURCE})
    return _load_library(library)["k"], counted


def _load_library(data: bytes):
    """A kernel library loaded straight into TVM (these tests call one kernel by hand)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.so"
        path.write_bytes(data)
        return tvm.runtime.load_module(str(path))


def test_cpu_kernels_count_every_parallel_iteration_that_ran():
    kernel, counted = _cpu_library(_repeated_parallel)
    assert counted.threads == 1 and counted.blocks == 3 * 8  # the parallel loop runs once per n
    assert CPU_ADD in counted.func.script()
    a = np.random.default_rng(0).standard_normal((3, 8, 4)).astype("float32")
    args = [tvm.runtime.tensor(a), tvm.runtime.empty((3, 8, 4), "float32")]
    flags = tvm.runtime.tensor(np.zeros(FLAG_LEN, "int32"))
    counter = tvm.runtime.tensor(np.array([0, 0], "int32"))
    kernel(*args, flags, counter._create_view((1,), "int32", 4))
    kernel(*args, flags, counter._create_view((1,), "int32", 4))
    np.testing.assert_array_equal(args[1].numpy(), a + 1)
    assert counter.numpy().tolist() == [0, 2 * 24]  # two calls into the second slot, the first untouched
    flags.copyfrom(np.ones(FLAG_LEN, "int32"))  # preempted: every iteration skips its work and its count
    kernel(*args, flags, counter._create_view((1,), "int32", 4))
    assert counter.numpy().tolist() == [0, 2 * 24]


def test_cpu_artifacts_count_the_blocks_of_every_layer(compiled, reference):
    model = models.build("mlp")
    artifact = compiled.artifact("mlp", progress_counters=True)
    from tvmsched.runtime import Executor

    executor = Executor(artifact)
    inputs = models.random_inputs(model, seed=3)
    executor.reset_progress()
    outputs = executor.run(inputs)
    expected = [layer.candidates[0].progress_blocks for layer in artifact.manifest.layers]
    assert executor.completed_blocks() == expected and all(b >= 1 for b in expected)
    for name, want in reference(model, inputs).items():
        np.testing.assert_allclose(outputs[name], want, rtol=1e-4, atol=1e-4)


@T.prim_func
def _serial(a: T.Buffer((8, 4), "float32"), b: T.Buffer((8, 4), "float32")):
    for i, j in T.grid(8, 4):
        b[i, j] = a[i, j] * T.float32(2)


def test_a_kernel_without_parallel_loops_counts_one_block_unless_preempted():
    kernel, counted = _cpu_library(_serial, check="loop")
    assert counted.blocks == 1
    a = np.arange(32, dtype="float32").reshape(8, 4)
    args = [tvm.runtime.tensor(a), tvm.runtime.empty((8, 4), "float32")]
    flags, counter = tvm.runtime.tensor(np.zeros(FLAG_LEN, "int32")), tvm.runtime.tensor(np.zeros(1, "int32"))
    kernel(*args, flags, counter)
    np.testing.assert_array_equal(args[1].numpy(), a * 2)
    assert counter.numpy().tolist() == [1]
    flags.copyfrom(np.ones(FLAG_LEN, "int32"))
    kernel(*args, flags, counter)
    assert counter.numpy().tolist() == [1]
