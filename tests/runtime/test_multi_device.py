"""A Runtime over several devices (issue 40, steps 1, 3 and 4; docs/multi-device.md): CPU devices standing for GPUs,
each its share of the cores (its streams' threads pinned to them), its own memory budget and fault state; a model placed
whole on one device or a replica on each device named, each request routed to the replica predicted to finish it
first; a lost device out of service while the others keep serving."""

import os
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import wait_until
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Executor, Runtime, native

DEVICES = ("cpu:0", "cpu:1")


def _shares() -> list[set[int]]:
    """Each device's cores as the engine splits the process's (OpenCpuShare): [i * n / 2, (i + 1) * n / 2)."""
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores)
    return [set(cores[: n // 2]), set(cores[n // 2 :])] if n >= 2 else [set(cores), set(cores)]


def _cores(text: str) -> set[int]:
    out = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def _threads_cores() -> list[set[int]]:
    """The cores each thread of this process may run on (/proc: Cpus_allowed_list)."""
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # (a thread that just ended)
            continue
        line = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        out.append(_cores(line.split(":", 1)[1].strip()))
    return out


@pytest.fixture(scope="module")
def mlp(compiled):
    path = compiled("mlp")
    executor = Executor(str(path))
    inputs = executor.random_inputs(0)
    return path, inputs, executor.run(inputs)["output"]


def _completed(model) -> list[int]:
    """Requests each of a model's streams finished (its replicas' in device order)."""
    return [int(task.counts()["completed"]) for task in model.tasks]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to give each device its own")
def test_each_cpu_device_runs_its_streams_on_its_own_share_of_the_cores(mlp):
    path, inputs, want = mlp
    rt = Runtime(devices=DEVICES)
    try:
        shares = _shares()
        assert [d["name"] for d in rt.devices()] == list(DEVICES)
        assert [d["units"] for d in rt.devices()] == [len(s) for s in shares]
        rt.load(str(path), name="a", devices=(0,))
        rt.load(str(path), name="b", devices=(1,))
        for name in ("a", "b"):
            np.testing.assert_array_equal(rt.submit(name, inputs).result(timeout=30)["output"], want)
        pinned = _threads_cores()
        assert shares[0] in pinned and shares[1] in pinned, (shares, pinned)
        assert set(os.sched_getaffinity(0)) == shares[0] | shares[1]  # (the thread that loaded them is not pinned)
        assert [d["models"] for d in rt.devices()] == [["a"], ["b"]]
    finally:
        rt.shutdown()


def test_a_model_goes_whole_where_most_memory_is_left_and_replicas_where_named(mlp):
    """The budget counts per device: a model placed with no devices named goes to the device with the most memory
    left; one named on both runs a replica on each, and a request goes to the replica predicted to finish it first:
    while device 0's replica is paused with a request, every later one goes to device 1. Every answer is the bits a
    single-device run gives."""
    path, inputs, want = mlp
    rt = Runtime(devices=DEVICES, memory_budget=1 << 30)
    try:
        rt.load(str(path), name="x", devices=(0,))
        rt.load(str(path), name="y")  # device 1 has more left
        assert [d["models"] for d in rt.devices()] == [["x"], ["y"]]
        assert rt.stats()["y"]["devices"] == ["cpu:1"] and rt.memory()["in_use"] == sum(
            d["in_use"] for d in rt.devices())
        model = rt.load(str(path), name="r", devices=(0, 1))
        assert rt.stats()["r"]["devices"] == ["cpu:0", "cpu:1"] and len(model.tasks) == 2
        burst = [rt.submit("r", inputs) for _ in range(64)]
        for future in burst:
            np.testing.assert_array_equal(future.result(timeout=60)["output"], want)
        before = _completed(model)
        model.tasks[0].preempt()  # device 0's replica paused: the first request below waits there
        held = rt.submit("r", inputs)
        for _ in range(20):  # each alone on device 1 finishes sooner than behind the held one
            np.testing.assert_array_equal(rt.submit("r", inputs).result(timeout=30)["output"], want)
        model.tasks[0].resume()
        np.testing.assert_array_equal(held.result(timeout=30)["output"], want)
        after = _completed(model)
        assert [a - b for a, b in zip(after, before)] == [1, 20], (before, after)
        assert rt.stats()["r"]["requests"] == 85
    finally:
        rt.shutdown()


def test_a_model_goes_to_the_less_busy_device_when_memory_does_not_decide(mlp, compiled):
    """No budget, one model on each device: memory and model counts tie, so the measured load decides. After a burst
    of resnet18-small on device 0 (its runs most of the time since the last placement), a new model goes to device 1
    (by memory and counts alone: device 0, the lowest number)."""
    path, _, _ = mlp
    heavy = compiled("resnet18-small")
    executor = Executor(str(heavy))
    x = executor.random_inputs(0)
    want = executor.run(x)
    rt = Runtime(devices=DEVICES)
    try:
        rt.load(str(heavy), name="busy", devices=(0,))
        rt.load(str(heavy), name="idle", devices=(1,))
        rt.load(str(path), name="first")  # a placement samples each device's work: a tie, so the lowest number
        assert rt.stats()["first"]["devices"] == ["cpu:0"]
        rt.unload("first")
        burst = [rt.submit("busy", x) for _ in range(200)]
        for future in burst:
            for name, value in future.result(timeout=120).items():
                np.testing.assert_array_equal(value, want[name])
        rt.load(str(path), name="placed")
        assert rt.stats()["placed"]["devices"] == ["cpu:1"]
    finally:
        rt.shutdown()


def test_a_lost_device_is_out_of_service_and_the_other_keeps_serving(mlp):
    """A fault on device 0 that cannot be recovered: its request fails with one line, the device is lost; the model's
    replica on device 1 serves every later request, a model held only by device 0 is refused in one line, and new
    models go to device 1."""
    path, inputs, want = mlp
    rt = Runtime(devices=DEVICES)
    try:
        model = rt.load(str(path), name="r", devices=(0, 1))
        rt.load(str(path), name="only0", devices=(0,))
        native.func("inject_fault")(model.tasks[0].executor.native, 0, True)
        with pytest.raises(TvmschedError, match="an injected fault"):  # both idle: device 0 is first
            rt.submit("r", inputs).result(timeout=60)
        wait_until(lambda: rt.devices()[0]["lost"], "device 0 lost")
        for _ in range(10):
            np.testing.assert_array_equal(rt.submit("r", inputs).result(timeout=30)["output"], want)
        with pytest.raises(TvmschedError, match=r"^model only0: every device holding it is out of service \(cpu:0\)$"):
            rt.submit("only0", inputs).result(timeout=30)
        with pytest.raises(TvmschedError, match=r"^device cpu:0 is out of service: "):
            rt.load(str(path), name="later", devices=(0,))
        rt.load(str(path), name="placed")
        assert rt.stats()["placed"]["devices"] == ["cpu:1"] and not rt.devices()[1]["lost"]
    finally:
        rt.shutdown()


@pytest.mark.parametrize("devices,line", [
    (("cpu:0", "cuda:1"), r"^a runtime's devices are all of one kind, not cpu and cuda$"),
    (("cpu:0", "cpu:0"), r"^device cpu:0 is listed twice or is not a device number$"),
    (("cpu:0", "cpu:x"), r"^a device is cpu, cpu:N, cuda or cuda:N, not 'cpu:x'$"),
    (("cpu:0", "cpu:2"), r"^cpu:2 is not one of 2 CPU devices$"),
])
def test_a_bad_device_list_is_one_line(devices, line):
    with pytest.raises(TvmschedError, match=line):
        Runtime(devices=devices)


def test_a_bad_placement_is_one_line_and_nothing_stays_loaded(mlp):
    path, _, _ = mlp
    rt = Runtime(devices=DEVICES)
    try:
        with pytest.raises(TvmschedError, match=r"^device 2 is not one of the runtime's devices \(0 to 1: cpu:0,cpu:1\)$"):
            rt.load(str(path), name="m", devices=(2,))
        with pytest.raises(TvmschedError, match=r"^device 1 is named twice for one model$"):
            rt.load(str(path), name="m", devices=(1, 1))
        rt.load(str(path), name="m", devices=(1,))
        with pytest.raises(TvmschedError, match=r"^a model named 'm' is already loaded$"):
            rt.load(str(path), name="m", devices=(0,))
        assert [d["models"] for d in rt.devices()] == [[], ["m"]]
    finally:
        rt.shutdown()


def test_the_requests_queued_on_a_device_that_is_lost_run_on_another_replica(mlp):
    """Both replicas paused with requests queued on each; device 0 faults on its first launch and cannot be recovered.
    Its faulting request fails with its one line; the others queued there never ran and run on device 1: every
    other request is answered, right."""
    path, inputs, want = mlp
    rt = Runtime(devices=DEVICES)
    try:
        model = rt.load(str(path), name="r", devices=(0, 1))
        for task in model.tasks:
            task.preempt()
        futures = [rt.submit("r", inputs) for _ in range(8)]  # routed by predicted finish: 4 queued on each
        assert [d["queued"] for d in rt.devices()] == [4, 4]
        native.func("inject_fault")(model.tasks[0].executor.native, 0, True)
        model.tasks[0].resume()
        wait_until(lambda: rt.devices()[0]["lost"], "device 0 lost")
        model.tasks[1].resume()
        failed = []
        for future in futures:
            try:
                np.testing.assert_array_equal(future.result(timeout=60)["output"], want)
            except TvmschedError as err:
                failed.append(str(err))
        assert len(failed) == 1 and "an injected fault" in failed[0], failed
        assert _completed(model)[1] == 7
    finally:
        rt.shutdown()
