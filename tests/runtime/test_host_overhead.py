"""The request path from Python (issue 28, item 4): no garbage collection starts inside a request with
`Runtime(freeze_gc=True)` (the default), the heap is frozen after a load and thawed at shutdown, the collector
still frees garbage between requests, outputs and callbacks are unchanged, the scheduler's history is bounded.
Behaviour only: the timings are bench/host_overhead.py's."""

import asyncio
import gc
import time
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model
from tvmsched.runtime import Executor, Runtime
from tvmsched.runtime import runtime as runtime_module
from tvmsched.runtime.scheduler import DECISION_HISTORY, CandidateInfo, ColocationTable, LayerScheduler

LIVE = 200_000  # tracked objects alive before loading: a server's heap


def chain(layers: int = 4, size: int = 8):
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32) / 3, f"W{i}"))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [out]))
        x = out
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], weights)


@pytest.fixture(scope="module")
def artifact(compiled):
    return compiled(chain(), name="chain")  # shared, read only


class Collections:
    """Every automatic collection's start (gc.callbacks), while in a `with`."""

    def __init__(self):
        self.starts: list[float] = []

    def __call__(self, phase, info):
        if phase == "start":
            self.starts.append(time.perf_counter())

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def _cyclic_garbage(n: int) -> weakref.ref:
    """n self-referencing objects dropped at once (only the collector frees them); a weak reference to the last."""
    class Node:
        pass

    for _ in range(n):
        node = Node()
        node.me = node
    return weakref.ref(node)


def test_no_collection_starts_inside_a_request_and_garbage_is_still_freed(artifact):
    heap = [{"id": i, "tags": [i]} for i in range(LIVE // 2)]
    inputs = Executor(artifact).random_inputs(0)
    expected = Executor(artifact).run(inputs)
    windows, first_garbage = [], None
    with Runtime("cpu") as rt:  # freeze_gc=True is the default
        model = rt.load(artifact)
        assert gc.get_freeze_count() >= LIVE  # the heap existing at the load is frozen
        with Collections() as seen:
            for _i in range(400):
                garbage = _cyclic_garbage(40)  # the client's work between requests makes collections fall due
                first_garbage = first_garbage or garbage
                start = time.perf_counter()
                outputs = rt.submit(model, inputs).result()
                windows.append((start, time.perf_counter()))
                assert np.array_equal(outputs["y"], expected["y"])
        assert gc.isenabled()
    inside = [t for t in seen.starts if any(a <= t <= b for a, b in windows)]
    assert seen.starts and not inside  # collections ran, all of them between requests
    assert first_garbage() is None  # and they freed the client's cyclic garbage (memory stays bounded)
    if runtime_module._freezers == 0:  # no other freezing Runtime alive in this process
        assert gc.get_freeze_count() == 0  # shutdown thawed the heap
    del heap


def test_a_collection_due_while_result_polls_runs_after_it_returns(artifact):
    """With every tracked allocation making a collection due (threshold 1), none starts while result() polls for a
    request that ends within its spin and converts its outputs: the first allocation after the engine's wait ran
    the client's collections inside the request (bench/results/host_overhead.md). A wait that outlasts the spin
    sleeps with the collector on."""
    inputs = Executor(artifact).random_inputs(0)
    expected = Executor(artifact).run(inputs)
    thresholds = gc.get_threshold()
    windows = []
    with Runtime("cpu") as rt:
        model = rt.load(artifact)
        futures = [rt.submit(model, inputs) for _ in range(50)]
        try:
            with Collections() as seen:
                gc.set_threshold(1)
                for future in futures:
                    start = time.perf_counter()
                    outputs = future.result(timeout=60, spin_us=5e6)  # (queued behind the others: still polled)
                    windows.append((start, time.perf_counter()))
                    assert np.array_equal(outputs["y"], expected["y"])
        finally:
            gc.set_threshold(*thresholds)
        assert gc.isenabled()
    inside = [t for t in seen.starts if any(a <= t <= b for a, b in windows)]
    assert len(seen.starts) >= len(windows) // 4 and not inside  # due all the time, none started inside


def test_freeze_gc_false_leaves_the_collector_alone(artifact):
    before = gc.get_freeze_count()
    with Runtime("cpu", freeze_gc=False) as rt:
        model = rt.load(artifact)
        assert gc.get_freeze_count() == before
        rt.submit(model, Executor(artifact).random_inputs(0)).result()
        assert gc.isenabled()


def test_callbacks_asyncio_and_real_time_requests_still_resolve(artifact):
    inputs = Executor(artifact).random_inputs(1)
    expected = Executor(artifact).run(inputs)["y"]
    with Runtime("cpu") as rt:
        be = rt.load(artifact, name="be")
        rt_model = rt.load(artifact, name="rt", priority="realtime")
        called = []
        future = rt.submit(be, inputs)
        future.add_done_callback(lambda f: called.append(f.result()["y"]))  # from the engine thread, or now
        assert np.array_equal(future.result()["y"], expected)
        deadline = time.monotonic() + 10
        while not called and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(called) == 1 and np.array_equal(called[0], expected)
        assert np.array_equal(rt.submit(rt_model, inputs).result()["y"], expected)  # its completion resumes `be`
        assert np.array_equal(asyncio.run(rt.infer(be, inputs))["y"], expected)
        bad = rt.submit(be, {"x": np.zeros((2, 8), np.float32)})
        assert "shape" in str(bad.exception())
        # resumed as the real-time request finished (on an asynchronous device once its own thread drained: poll)
        deadline = time.monotonic() + 10
        while be.task.paused and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not be.task.paused and (rt.stats()["be"]["requests"], rt.stats()["be"]["errors"]) == (2, 1)


def test_a_python_callback_never_holds_up_the_stream(artifact):
    """A Python done-callback runs on the engine's callback thread, not on the stream's submitter: one that blocks
    (as one waiting for the GIL does while a server's event loop holds it) leaves the requests queued behind its
    request running (before, the submitter ran it and waited before its next launch: the next request never ran)."""
    import threading

    from tvmsched.runtime.preemption import Task

    inputs = Executor(artifact).random_inputs(2)
    expected = Executor(artifact).run(inputs)["y"]
    task = Task(Executor(artifact), "callbacks")
    release, entered, order = threading.Event(), threading.Event(), []

    def blocking(future):
        entered.set()
        release.wait(30)
        order.append(("first", future.result()["y"]))

    task.preempt(abort=False)  # held until the callbacks are in place
    first = task.submit(inputs)
    first.add_done_callback(blocking)
    behind = [task.submit(inputs) for _ in range(5)]
    task.resume()
    try:
        for future in behind:  # they run while the callback blocks
            assert np.array_equal(future.result(timeout=10)["y"], expected)
        assert entered.wait(10) and not order
        task.preempt(abort=False)
        later = task.submit(inputs)
        later.add_done_callback(lambda f: order.append(("later", f.result()["y"])))  # queued behind the blocked one
        task.resume()
        assert np.array_equal(later.result(timeout=10)["y"], expected)
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while len(order) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sorted(name for name, _ in order) == ["first", "later"]  # each once (result() may run `later`'s itself)
    assert all(np.array_equal(y, expected) for _, y in order)
    task.close()


def test_the_scheduler_keeps_its_latest_decisions_only():
    scheduler = LayerScheduler(ColocationTable(2))
    layers = [[CandidateInfo(2, 10.0, "m/a")]]
    for _ in range(DECISION_HISTORY + 5):
        scheduler.choose("m", layers, qos_ms=None, others=[])
    assert len(scheduler.decisions) == DECISION_HISTORY and scheduler.decided == DECISION_HISTORY + 5
    assert scheduler.decisions[-1].candidate_ids == (0,)
