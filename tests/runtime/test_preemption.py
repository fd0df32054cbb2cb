"""Preemption on CPU: kernel queues, the submitter, preempt/resume, priorities; outputs stay bit-identical."""

import os
import random
import re
import time

import numpy as np
import pytest
from tvm.script import tirx as T

from tests.test_artifact import rewrite_member
from tvmsched import __version__, models
from tvmsched.lower import kernels
from tvmsched.artifact.format import Artifact, Binding, Candidate, Layer, Manifest, TensorSpec
from tvmsched.errors import TvmschedError
from tvmsched.passes.idempotence import analyze
from tvmsched.passes.preempt_flag import FLAG_LEN, instrument
from tvmsched.runtime import Executor, native
from tvmsched.runtime.preemption import Priorities, Task
from tvmsched.lower.targets import make_target

N = 1 << 18


@T.prim_func(s_tir=True)
def slow_copy(x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
    for r, i in T.grid(8, N):
        with T.sblock("copy"):
            vr, vi = T.axis.remap("SS", [r, i])
            y[vi] = x[vi] + T.float32(0) * T.float32(vr)


@T.prim_func(s_tir=True)
def count_runs(y: T.Buffer((N,), "float32"), counter: T.Buffer((1,), "int32")):
    for i in range(1):
        with T.sblock("count"):
            vi = T.axis.remap("S", [i])
            counter[vi] = counter[vi] + 1


def counting_artifact() -> Artifact:
    """copy x -> a (idempotent), counter += 1 (NOT idempotent), copy a -> b (idempotent)."""
    funcs = {"copy_in": slow_copy, "count": count_runs, "copy_out": slow_copy}
    built, candidates = {}, {}
    for name, func in funcs.items():
        verdict = analyze(func)
        symbol = kernels.kernel_symbol(name, 0)
        built[symbol], check = instrument(func, idempotent=verdict.idempotent, gpu=False)
        candidates[name] = Candidate(0, symbol, "handwritten", idempotent=verdict.idempotent,
                                     idempotence=verdict.reason, preempt_check=check)
    assert candidates["count"].preempt_check == "entry" and candidates["copy_in"].preempt_check == "loop"
    tensors = {"x": TensorSpec((N,), "float32", "input"), "a": TensorSpec((N,), "float32", "activation"),
               "counter": TensorSpec((1,), "int32", "activation"), "b": TensorSpec((N,), "float32", "activation")}
    io = [("copy_in", ("x",), ("a",)), ("count", ("a",), ("counter",)), ("copy_out", ("a",), ("b",))]
    layers = tuple(Layer(i, name, ins, outs, 0.0, 0, (candidates[name],)) for i, (name, ins, outs) in enumerate(io))
    manifest = Manifest("counting", {"kind": "llvm"}, "cpu", "native", (Binding("x", "x"),),
                        (Binding("counter", "counter"), Binding("b", "b")), tensors, layers, __version__, "test",
                        preempt_flags=FLAG_LEN)
    return Artifact(manifest, kernels.build_library(built, make_target("llvm")), {})


def test_a_non_idempotent_kernel_runs_exactly_once_per_request_under_preemption():
    executor = Executor(counting_artifact())
    task = Task(executor, "counting")
    x = np.random.default_rng(0).standard_normal(N).astype("float32")
    futures = [task.submit({"x": x}) for _ in range(20)]
    rng = random.Random(1)
    while not futures[-1].done():
        time.sleep(rng.uniform(0, 0.002))
        task.preempt()
        time.sleep(rng.uniform(0, 0.001))
        task.resume()
    outputs = [f.result(timeout=60) for f in futures]
    counts = np.array([o["counter"][0] for o in outputs], dtype="int64")  # starts from uninitialised memory
    assert np.diff(counts).tolist() == [1] * 19  # one run per request: never repeated, never skipped
    assert all(np.array_equal(o["b"], x) for o in outputs)
    assert task.reruns > 0  # preemption did hit running kernels
    task.close()


def test_a_waiting_preempt_after_one_that_did_not_wait_waits_for_the_running_launch():
    """preempt(wait=False) pauses and returns while a kernel runs on (abort=False: it is not stopped); a waiting
    preempt() after it returns only once that launch has returned (before, on CPU it returned at once: the stream was
    already paused). After it, no launch ends until resume()."""
    executor = Executor(counting_artifact())
    task = Task(executor, "counting")
    x = np.random.default_rng(0).standard_normal(N).astype("float32")
    futures = [task.submit({"x": x}) for _ in range(12)]
    rng = random.Random(2)
    for _ in range(8):
        time.sleep(rng.uniform(0.0005, 0.002))  # inside a request (each kernel copies 8 x 1 MiB)
        task.preempt(abort=False, wait=False)
        assert task.preempt(abort=False).seconds == 0.0  # paused already: it reports no pause of its own
        launches = task.launches
        time.sleep(0.02)
        assert task.launches == launches  # the launch left running had returned; nothing ran since
        task.resume()
    outputs = [f.result(timeout=60) for f in futures]
    counts = np.array([o["counter"][0] for o in outputs], dtype="int64")
    assert np.diff(counts).tolist() == [1] * 11 and all(np.array_equal(o["b"], x) for o in outputs)
    task.close()


def test_a_resume_that_does_not_wait_resumes_after_the_drain_and_a_preempt_before_it_cancels_it():
    """resume(wait=False) right after preempt(wait=False), while the launches left in flight still run: the caller
    does not wait, the stream resumes once drained (on a GPU, or the CPU's asynchronous mode; on CPU it is a plain
    resume), and a preempt() before that drain cancels it: the stream stays paused. Every request runs its
    non-idempotent kernel exactly once, outputs bit-identical (the preemption group releases this way)."""
    task = Task(Executor(counting_artifact()), "counting")
    x = np.random.default_rng(0).standard_normal(N).astype("float32")
    futures = [task.submit({"x": x}) for _ in range(12)]
    assert _until(lambda: task.launches > 0)
    for cancel in (False, True):
        task.preempt(abort=False, wait=False)  # the launches in flight run on: a drain to wait for on a GPU
        task.resume(wait=False)
        if cancel:
            task.preempt(abort=False, wait=False)
            task.preempt(abort=False)  # its drain is done
            launches = task.launches
            time.sleep(0.05)
            assert task.paused and task.launches == launches  # the resume was cancelled: nothing ran
            task.resume()
        assert _until(lambda: not task.paused)
    outputs = [f.result(timeout=60) for f in futures]
    counts = np.array([o["counter"][0] for o in outputs], dtype="int64")
    assert np.diff(counts).tolist() == [1] * 11 and all(np.array_equal(o["b"], x) for o in outputs)
    task.close()


@pytest.fixture(scope="module")
def zoo_tasks(compiled):
    built = []
    for name in ("mlp", "resnet18-small", "bert-tiny"):
        model = models.build(name)
        artifact = compiled.artifact(name)
        inputs = models.random_inputs(model, seed=4)
        expected = Executor(artifact).run(inputs)
        built.append((name, artifact, inputs, expected))
    return built


def test_instrumented_kernels_match_plain_ones_bit_for_bit(zoo_tasks, compiled):
    for name, artifact, inputs, expected in zoo_tasks:
        plain = compiled.artifact(name, preempt_checks=False)
        assert plain.manifest.preempt_flags == 0 and artifact.manifest.preempt_flags == FLAG_LEN
        assert all(c.idempotent and c.preempt_check in ("loop", "parallel") for l in artifact.manifest.layers for c in l.candidates)
        outputs = Executor(plain).run(inputs)
        assert all(np.array_equal(outputs[k], expected[k]) for k in expected), name


def test_a_thousand_preempt_resume_cycles_keep_outputs_bit_identical(zoo_tasks):
    rng = random.Random(7)
    tasks = [(Task(Executor(artifact), name), inputs, expected) for name, artifact, inputs, expected in zoo_tasks]
    futures = [(task.submit(inputs), expected) for task, inputs, expected in tasks for _ in range(12)]
    for cycle in range(1000):
        task = tasks[cycle % len(tasks)][0]
        time.sleep(rng.uniform(0, 0.0005))
        task.preempt()
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.0005))
        task.resume()
    for future, expected in futures:
        outputs = future.result(timeout=120)
        assert all(np.array_equal(outputs[k], expected[k]) for k in expected)
    assert sum(task.reruns for task, _, _ in tasks) > 0
    for task, _, _ in tasks:
        task.close()


def test_preempting_an_idle_task_and_double_resume_are_harmless(zoo_tasks):
    name, artifact, inputs, expected = zoo_tasks[0]
    task = Task(Executor(artifact), name)
    report = task.preempt()
    assert report.rerun == () and task.paused
    assert task.preempt().seconds == 0.0  # already paused
    future = task.submit(inputs)
    time.sleep(0.05)
    assert not future.done()  # paused: nothing runs
    task.resume()
    task.resume()
    outputs = future.result(timeout=60)
    assert all(np.array_equal(outputs[k], expected[k]) for k in expected)
    task.close()


def test_a_bad_request_fails_alone(zoo_tasks):
    name, artifact, inputs, expected = zoo_tasks[0]
    task = Task(Executor(artifact), name)
    bad = task.submit({"nope": np.zeros(3)})
    wrong_ids = task.submit(inputs, candidate_ids=[5])
    good = task.submit(inputs)
    with pytest.raises(TvmschedError, match="input names do not match"):
        bad.result(timeout=60)
    with pytest.raises(TvmschedError, match="candidate ids"):
        wrong_ids.result(timeout=60)
    assert all(np.array_equal(good.result(timeout=60)[k], expected[k]) for k in expected)
    task.close()


def test_realtime_requests_preempt_best_effort_work_and_it_resumes(zoo_tasks):
    _, be_artifact, be_inputs, be_expected = zoo_tasks[1]
    _, rt_artifact, rt_inputs, rt_expected = zoo_tasks[0]
    priorities = Priorities()
    best_effort, realtime = Task(Executor(be_artifact), "be"), Task(Executor(rt_artifact), "rt")
    priorities.add_best_effort(best_effort)
    be_futures = [best_effort.submit(be_inputs) for _ in range(400)]  # still queued while the real-time requests come
    rt_results = []
    for _ in range(10):
        time.sleep(0.003)
        future = priorities.submit_realtime(realtime, rt_inputs)
        rt_results.append(future.result(timeout=60))
    assert priorities.preempted  # best-effort work was running and got preempted
    for outputs in rt_results:
        assert all(np.array_equal(outputs[k], rt_expected[k]) for k in rt_expected)
    for future in be_futures:  # completing at all shows best-effort work resumed after the real-time requests
        outputs = future.result(timeout=120)
        assert all(np.array_equal(outputs[k], be_expected[k]) for k in be_expected)
    assert not best_effort.paused
    best_effort.close()
    realtime.close()


def _until(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()


def test_the_engine_preempts_best_effort_streams_while_real_time_requests_run_and_resumes_them(zoo_tasks):
    """The priority policy's mechanism, the engine's preemption group, on real streams: the first real-time request
    pauses every best-effort stream (the busy one counted as preempted, the idle one paused too, so that a request it
    gets meanwhile waits); they resume when the last real-time request is done, on the engine's own thread; a stream
    joining while real-time work runs is paused at once. Outputs stay bit-identical."""
    _, be_artifact, be_inputs, be_expected = zoo_tasks[2]
    _, rt_artifact, rt_inputs, rt_expected = zoo_tasks[0]
    priorities = Priorities()
    busy, idle, late = (Task(Executor(be_artifact), name) for name in ("busy", "idle", "late"))
    realtime = Task(Executor(rt_artifact), "rt")
    for task in (busy, idle):
        priorities.add_best_effort(task)
    be_futures = [busy.submit(be_inputs) for _ in range(20)]
    assert _until(lambda: busy.launches > 0)  # running
    realtime.preempt(abort=False)  # held back: the real-time requests stay queued, the group held
    first, second = (priorities.submit_realtime(realtime, rt_inputs) for _ in range(2))
    assert busy.paused and idle.paused and priorities.realtime_active == 2
    assert priorities.preempted == 1 and busy.preemptions == 1  # counted once: the first real-time request
    waiting = idle.submit(be_inputs)
    priorities.add_best_effort(late)
    assert late.paused
    time.sleep(0.05)
    assert not waiting.done() and not be_futures[-1].done()
    realtime.resume()
    for future in (first, second):
        outputs = future.result(timeout=60)
        assert all(np.array_equal(outputs[k], rt_expected[k]) for k in rt_expected)
    if not native.device_info("cpu")["launches_async"]:  # released before the last result could be seen
        assert not (busy.paused or idle.paused or late.paused)
    assert _until(lambda: not (busy.paused or idle.paused or late.paused))  # (asynchronous: once each drained)
    assert priorities.realtime_active == 0
    for future in [*be_futures, waiting]:
        outputs = future.result(timeout=120)
        assert all(np.array_equal(outputs[k], be_expected[k]) for k in be_expected)
    priorities.remove_best_effort(late)
    priorities.submit_realtime(realtime, rt_inputs).result(timeout=60)
    assert not late.paused and late.preemptions == 1  # a removed stream is preempted no more
    for task in (busy, idle, late, realtime):
        task.close()


def test_uninstrumented_artifacts_cannot_be_preempted(compiled):
    artifact = compiled.artifact("tiny", preempt_checks=False)
    executor = Executor(artifact)
    assert executor.flag_memory == "none"  # no flag at all (an instrumented one's on CPU: host memory, below)
    with pytest.raises(TvmschedError, match="compiled with preempt checks"):
        Task(executor)
    instrumented = Executor(compiled.artifact("tiny"))
    assert instrumented.flag_memory == "host_mapped"
    assert Executor(compiled.artifact("tiny"), flag_memory="device").flag_memory == "host_mapped"  # CPU


def test_a_model_with_loop_checks_asks_for_its_flag_in_device_memory(tmp_path, compiled):
    """Loop checks read the flag often: "auto" asks for device memory then (a host-mapped read crosses PCIe each
    time); an explicit choice stands. The CPU device keeps it in host memory whatever is asked."""

    path = compiled.copy("tiny", tmp_path / "tiny.tvms")  # rewritten below: a copy of the shared one
    assert native.flag_memory_wanted(Executor(path).native) == "auto"
    rewrite_member(path, "manifest.json", lambda d: re.sub(rb'"preempt_check": "(loop|parallel)"', b'"preempt_check": "loops"',
                                                           d, count=1), fix_checksum=True)
    looped = Executor(path)
    assert native.flag_memory_wanted(looped.native) == "device" and looped.flag_memory == "host_mapped"
    assert native.flag_memory_wanted(Executor(path, flag_memory="host_mapped").native) == "host_mapped"


def _queue_threads() -> dict[str, set[int]]:
    """This process's launch-queue threads (the CPU's asynchronous mode), by name, and their nice values."""
    out: dict[str, set[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith("tvms-q"):
            nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of proc(5), counted after the name
            out.setdefault(name, set()).add(nice)
    return out


def test_real_time_streams_launch_above_best_effort_ones(zoo_tasks, monkeypatch):
    """Real-time tenants' kernels go to high-priority device streams, best-effort ones' to low (CUDA: stream
    priorities; the CPU's asynchronous mode: a best-effort queue thread runs at nice 10)."""
    from tvmsched.runtime import Runtime

    monkeypatch.setenv("TVMSCHED_CPU_LAUNCHES", "async")
    _, art, inputs, want = zoo_tasks[0]
    with Runtime("cpu") as rt:
        rt.load(art, name="rt", qos_ms=10_000, priority="realtime")
        rt.load(art, name="be", priority="best_effort")
        for name in ("rt", "be"):
            got = rt.submit(name, inputs).result(timeout=60)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])
        threads = _queue_threads()
        assert threads.get("tvms-q-high") == {0} and threads.get("tvms-q-low") == {10}, threads
    with pytest.raises(TvmschedError, match="stream priority"):
        Task(Executor(art), priority="urgent")
