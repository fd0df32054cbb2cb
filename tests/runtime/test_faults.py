"""Device faults on the CPU device (issue 28, GPU item; docs/faults.md): the state machine a CUDA context's sticky
errors need, driven by an injected fault (`tvmsched.engine.inject_fault`: the next run of a layer reports a fault to
its device and fails, as a faulting kernel). The faulting tenant's request fails with one line naming its layer;
every launch of the device parks while the device recovers; requests of other tenants that started before the
recovery run again from their first layer, bit-identical; a model that keeps faulting is quarantined; a device that
cannot be recreated is lost and every request then fails with one line (in a child process: the CPU device is the
process's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tests.helpers import held_mid_request
from tvmsched.errors import TvmschedError
from tvmsched.runtime.native import func
from tvmsched.runtime import Runtime, load

DEADLINE_S = 60


@pytest.fixture(scope="module")
def zoo(compiled):
    out = {}
    for name in ("mlp", "resnet18-small", "bert-tiny"):
        path = compiled(name)  # shared, read only
        direct = load(path)
        inputs = [direct.random_inputs(seed=k) for k in range(2)]
        out[name] = (path, inputs, [direct.run(x) for x in inputs])
    return out


def _same(got, want):
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)


def _inject(model, layer: int, fail_recreate: bool = False) -> None:
    func("inject_fault")(model.task.executor.native, layer, fail_recreate)


def test_a_fault_fails_its_tenants_request_and_the_others_run_again_bit_identical(zoo):
    path_f, x_f, want_f = zoo["mlp"]
    path_p, x_p, want_p = zoo["resnet18-small"]
    path_b, x_b, want_b = zoo["bert-tiny"]
    before = dict(func("device_faults")("cpu"))
    with Runtime("cpu") as rt:
        faulty = rt.load(path_f, name="faulty", qos_ms=10_000)
        paused = rt.load(path_p, name="paused", qos_ms=10_000)
        busy = rt.load(path_b, name="busy", qos_ms=10_000)
        # a request of another tenant started before the fault and is still running (paused mid-request)
        held = held_mid_request(rt, paused, x_p[0])
        # and a third tenant under steady load throughout
        stop, results, errors = threading.Event(), [], []

        def load_busy():
            k = 0
            while not stop.is_set():
                try:
                    results.append((k % 2, rt.submit(busy, x_b[k % 2]).result(timeout=DEADLINE_S)))
                except Exception as err:  # noqa: BLE001
                    errors.append(err)
                k += 1

        thread = threading.Thread(target=load_busy, daemon=True)
        thread.start()
        layer = 1
        _inject(faulty, layer)
        with pytest.raises(TvmschedError) as err:
            rt.submit(faulty, x_f[0]).result(timeout=DEADLINE_S)
        message = str(err.value)
        assert "\n" not in message and f"model faulty: layer {layer} (candidate " in message, message
        assert "faulted on cpu: an injected fault" in message and "the device recovered in" in message, message
        _same(rt.submit(faulty, x_f[1]).result(timeout=DEADLINE_S), want_f[1])  # its next request runs
        paused.task.resume()
        _same(held.result(timeout=DEADLINE_S), want_p[0])  # started before the recovery: run again from layer 0
        stop.set()
        thread.join(DEADLINE_S)
        stats = rt.stats()
    assert not errors, errors[:3]
    assert results
    for k, got in results:
        _same(got, want_b[k])
    after = dict(func("device_faults")("cpu"))
    assert after["health"] == "healthy" and after["recoveries"] == before["recoveries"] + 1
    assert after["generation"] == before["generation"] + 1 and after["faults"] == before["faults"] + 1
    assert stats["faulty"]["faults"] == 1 and stats["faulty"]["errors"] == 1
    assert stats["paused"]["fault_restarts"] >= 1 and stats["paused"]["errors"] == 0
    assert stats["busy"]["errors"] == 0 and stats["_device"]["recoveries"] == after["recoveries"]


def test_a_model_that_keeps_faulting_is_quarantined_and_the_others_serve(zoo):
    path_f, x_f, want_f = zoo["mlp"]
    path_b, x_b, want_b = zoo["bert-tiny"]
    with Runtime("cpu") as rt:
        faulty = rt.load(path_f, name="faulty", qos_ms=10_000)
        other = rt.load(path_b, name="other", qos_ms=10_000)
        lines = []
        for _ in range(3):  # the default fault limit: 3 within 60 s
            _inject(faulty, 0)
            with pytest.raises(TvmschedError) as err:
                rt.submit(faulty, x_f[0]).result(timeout=DEADLINE_S)
            lines.append(str(err.value))
            _same(rt.submit(other, x_b[0]).result(timeout=DEADLINE_S), want_b[0])
        assert all("faulted on cpu" in line and "\n" not in line for line in lines)
        assert "quarantined" not in lines[1] and "model faulty is quarantined: 3 device faults within 60" in lines[2]
        with pytest.raises(TvmschedError, match="model faulty is quarantined"):
            rt.submit(faulty, x_f[0]).result(timeout=DEADLINE_S)
        again = rt.load(path_f, name="again", qos_ms=10_000)  # loaded again: a model of its own, not quarantined
        _same(rt.submit(again, x_f[1]).result(timeout=DEADLINE_S), want_f[1])
        _same(rt.submit(other, x_b[1]).result(timeout=DEADLINE_S), want_b[1])


LOST = textwrap.dedent("""
    import sys, time
    from tvmsched.errors import TvmschedError
    from tvmsched.runtime.native import func
    from tvmsched.runtime import Runtime, load
    faulty_path, other_path = sys.argv[1:3]
    with Runtime("cpu") as rt:
        faulty, other = rt.load(faulty_path, name="faulty"), rt.load(other_path, name="other")
        x_f, x_o = load(faulty_path).random_inputs(0), load(other_path).random_inputs(0)
        rt.submit(other, x_o).result(timeout=60)
        func("inject_fault")(faulty.task.executor.native, 0, True)  # and the device cannot be recreated
        for model, x in ((faulty, x_f), (other, x_o), (other, x_o)):
            start = time.monotonic()
            try:
                rt.submit(model, x).result(timeout=60)
                print("ran")
            except TvmschedError as err:
                print(f"{time.monotonic() - start:.1f} {err}")
        print(dict(func("device_faults")("cpu"))["health"])
""")


def test_a_device_that_cannot_be_recreated_is_lost_and_every_request_fails_with_one_line(zoo):
    done = subprocess.run([sys.executable, "-c", LOST, str(zoo["mlp"][0]), str(zoo["bert-tiny"][0])],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4, done.stdout
    assert "faulted on cpu: an injected fault" in lines[0] and "the device is lost: recreating it failed" in lines[0]
    for line in lines[1:3]:  # every later launch of the device fails at once
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 30 and message.startswith("the cpu device is lost"), line
    assert lines[3] == "lost"
