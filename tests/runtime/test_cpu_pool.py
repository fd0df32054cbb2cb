"""The engine runs the parallel loops of CPU kernels on its own pool (runtime/native/src/cpu_pool.cc,
docs/engine.md "The CPU thread pool"): slices are claimed rather than assigned, so a worker that is not running
never stalls a layer. With TVM's pool, beside a process whose threads spin on the same cores, bert-tiny went from
0.38 to 92 ms per run (issue 28; bench/results/contention.md has the side-by-side numbers). No timing is asserted
here: a worker that never runs is injected instead."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.runtime.test_units import with_limited_candidate
from tvmsched import models
from tvmsched.runtime import native
from tvmsched.runtime import Executor

THREADS = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)

# Runs an artifact `runs` times in a fresh process (the pool settings are read when the engine starts) and prints
# the seconds it took, the first output and this thread's pool as the engine reports it.
CHILD = r"""
import json, sys, time
import numpy as np
from tvmsched.runtime import native
from tvmsched.runtime import Executor
executor = Executor(sys.argv[1])
inputs = executor.random_inputs(0)
runs = int(sys.argv[2])
first = executor.run(inputs)
start = time.perf_counter()
for _ in range(runs):
    executor.run(inputs)
seconds = time.perf_counter() - start
np.save(sys.argv[3], next(iter(first.values())))
print(json.dumps({"seconds": seconds, "pool": native.cpu_pool()}))
"""


def cpu_pool() -> dict:
    return native.cpu_pool()


def run_child(path, runs: int, out, env: dict | None = None, timeout: float = 300) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, str(path), str(runs), str(out)], capture_output=True,
                            text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bert(compiled):
    return compiled("bert-tiny")  # shared, read only


def test_kernels_parallel_loops_run_on_the_engines_pool_with_each_candidates_threads(compiled):
    model = models.build("mlp")
    executor = Executor(with_limited_candidate(compiled.artifact("mlp"), units=1))
    inputs = models.random_inputs(model)
    before = cpu_pool()
    assert before["engine"] == 1 and before["chunks"] == 1 and before["spin_us"] > 0 and before["adapt"] == 0
    full = executor.run(inputs, [0] * len(executor.manifest.layers))
    pool = cpu_pool()
    assert pool["threads"] == THREADS
    assert pool["launches"] > before.get("launches", 0)  # the kernels' parallel loops came through the engine
    assert pool["tasks"] - before.get("tasks", 0) >= pool["launches"] - before.get("launches", 0)
    assert pool["workers"] == THREADS - 1 or THREADS == 1
    limited = executor.run(inputs, [1] * len(executor.manifest.layers))
    assert cpu_pool()["threads"] == 1
    np.testing.assert_allclose(limited["output"], full["output"], rtol=1e-6, atol=1e-7)


def test_tvms_pool_is_still_there_and_both_compute_the_same_bits(bert, tmp_path):
    engine = run_child(bert, 3, tmp_path / "engine.npy")
    tvm = run_child(bert, 3, tmp_path / "tvm.npy", {"TVMSCHED_CPU_POOL": "tvm"})
    assert engine["pool"]["engine"] == 1 and engine["pool"]["launches"] > 0
    assert tvm["pool"]["engine"] == 0 and "launches" not in tvm["pool"]
    np.testing.assert_array_equal(np.load(tmp_path / "engine.npy"), np.load(tmp_path / "tvm.npy"))


@pytest.mark.skipif(THREADS < 2, reason="a pool needs two threads")
def test_a_worker_that_never_runs_stalls_no_layer(bert, tmp_path):
    """Beside a process spinning on every core, TVM's pool needed a time slice per parallel loop: a launch waits
    until worker i has run slice i (bert-tiny 0.38 -> 92 ms per run; bench/contention.py measures it). Here the
    slices are claimed: with every worker stalled (TVMSCHED_CPU_POOL_STALL_WORKERS, a worker that is never
    scheduled), each launch still finishes, its thread running every slice, with the same bits."""
    run_child(bert, 3, tmp_path / "normal.npy")
    stalled = run_child(bert, 20, tmp_path / "stalled.npy", {"TVMSCHED_CPU_POOL_STALL_WORKERS": "1"}, timeout=120)
    pool = stalled["pool"]
    assert pool["workers"] == THREADS - 1 and pool["launches"] > 0
    assert pool["launcher_tasks"] == pool["tasks"] > pool["launches"]  # every slice ran on the launching thread
    np.testing.assert_array_equal(np.load(tmp_path / "stalled.npy"), np.load(tmp_path / "normal.npy"))


def test_an_error_in_a_slice_reaches_the_caller_and_the_pool_goes_on(tmp_path):
    """A kernel library loaded after the engine opened the CPU device runs on the engine's pool too; an assertion
    that fails in the second half of a parallel loop (slice 1: a worker's, or the launching thread's when no worker
    came) is the caller's error, and the next launches work."""
    import tvm
    from tvm.script import tirx as T

    native.func("device_info")("cpu")  # the engine's launcher is registered when TVM's runtime is loaded

    @T.prim_func
    def double(a: T.Buffer((1 << 16,), "float32"), b: T.Buffer((1 << 16,), "float32")):
        for i in T.parallel(1 << 16):
            assert a[i] >= T.float32(0), "a negative input"
            b[i] = a[i] * T.float32(2)

    tvm.compile(tvm.IRModule({"double": double}), target="llvm").export_library(str(tmp_path / "double.so"))
    func = tvm.runtime.load_module(str(tmp_path / "double.so"))["double"]
    good = np.arange(1 << 16, dtype="float32")
    bad = good.copy()
    bad[-1] = -1
    out = tvm.runtime.tensor(np.zeros(1 << 16, dtype="float32"))
    launches = cpu_pool()["launches"]
    for _ in range(20):
        with pytest.raises(Exception, match="a negative input"):
            func(tvm.runtime.tensor(bad), out)
        func(tvm.runtime.tensor(good), out)
        np.testing.assert_array_equal(out.numpy(), good * 2)
    assert cpu_pool()["launches"] == launches + 40


def test_a_library_whose_slices_wait_for_each_other_keeps_tvms_launcher(tmp_path):
    """Slices that meet at TVMBackendParallelBarrier must all run at once, which claiming does not promise: such a
    library (here a TIR pragma makes one) runs on TVM's pool, found even after its file is gone (as the engine's
    kernel libraries are)."""
    import tvm
    from tvm.script import tirx as T

    native.func("device_info")("cpu")

    @T.prim_func
    def fill_then_read(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        with T.attr(0, "pragma_parallel_launch_point", 1):
            with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                for i in T.parallel(64):
                    a[i] = T.float32(1)
            for j in T.parallel(64):
                b[j] = a[63 - j] + T.float32(1)

    path = tmp_path / "barrier.so"
    tvm.compile(tvm.IRModule({"fill_then_read": fill_then_read}), target="llvm").export_library(str(path))
    func = tvm.runtime.load_module(str(path))["fill_then_read"]
    path.unlink()
    a, b = (tvm.runtime.tensor(np.zeros(64, dtype="float32")) for _ in range(2))
    launches = cpu_pool().get("launches", 0)
    for _ in range(20):
        func(a, b)
    np.testing.assert_array_equal(b.numpy(), np.full(64, 2, dtype="float32"))
    assert cpu_pool().get("launches", 0) == launches


def test_sizing_tvms_pool_of_a_thread_sizes_the_engines():
    """The compiler measures kernels at k units through runtime.config_threadpool (tvmsched/tune/cpu_units.py); kernels loaded
    after the engine started run on its pool, so that call sizes the calling thread's engine pool too."""
    import threading

    import tvm

    native.func("device_info")("cpu")
    seen = []

    def sized(units: int) -> None:
        tvm.get_global_func("runtime.config_threadpool")(0, units)
        seen.append(cpu_pool()["threads"])

    for units in (1, 0):
        thread = threading.Thread(target=sized, args=(units,))
        thread.start()
        thread.join()
    assert seen == [1, THREADS]
