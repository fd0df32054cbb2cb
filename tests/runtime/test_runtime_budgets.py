"""Budgets per Runtime (issue 28, items 1 and 2): a Runtime's memory budget covers its own models only.

The hang of ../shared/repro/switching_hang.py: a Runtime with a budget set the device's process-wide budget,
which outlived it; the next Runtime's switcher took that budget as its own while the first Runtime's models
still held it, found nothing of its own to evict and waited for ever. Now each Runtime has a budget of its
own, and a switcher that cannot make room fails the request with one line instead of waiting.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.helpers import held_mid_request, switch_footprint
from tvmsched.errors import TvmschedError
from tvmsched.runtime.native import func
from tvmsched.runtime import Executor, Runtime, load
from tvmsched.runtime.switching import SwitchSettings, footprint, footprint_of


@pytest.fixture(scope="module")
def zoo(compiled):
    return {name: compiled(name) for name in ("resnet18-small", "mobilenetv2", "bert-tiny")}  # shared, read only


def _direct(path, inputs):
    return load(path).run(inputs)


def test_the_switching_hang_repro_completes(zoo):
    """../shared/repro/switching_hang.py with small zoo models (its budget: the largest model's footprint and a
    fifth, where the repro's was 1.5x resnet18's weights), in a fresh process with a deadline: a budgeted Runtime
    serves 40 requests over 4 models (one artifact under two names), then a plain Runtime serves 40."""
    script = textwrap.dedent(f"""
        import faulthandler, sys
        import numpy as np
        from tvmsched.runtime import Executor, Runtime, load
        from tvmsched.runtime.switching import SwitchSettings, footprint_of
        faulthandler.dump_traceback_later(240, exit=True)
        paths = [{str(zoo['resnet18-small'])!r}] * 2 + [{str(zoo['mobilenetv2'])!r}, {str(zoo['bert-tiny'])!r}]
        names = ["A", "A2", "S1", "S2"]
        inputs = [load(p).random_inputs(seed=i) for i, p in enumerate(paths)]
        budget = int(max(footprint_of(p, SwitchSettings().max_groups) for p in paths) * 1.2)  # one model at a time
        with Runtime("cpu", memory_budget=budget) as rt:
            models = [rt.load(p, qos_ms=10_000, name=n) for p, n in zip(paths, names)]
            for i in np.random.default_rng(11).integers(0, 4, 40):
                rt.submit(models[i], inputs[i]).result()
        print("budgeted runtime: 40 requests done", flush=True)
        with Runtime("cpu") as rt:
            a, b = rt.load(paths[0], qos_ms=10_000, name="A"), rt.load(paths[1], qos_ms=10_000, name="A2")
            for _ in range(20):
                rt.submit(a, inputs[0]).result(); rt.submit(b, inputs[1]).result()
        print("plain runtime: 40 requests done", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["budgeted runtime: 40 requests done", "plain runtime: 40 requests done"]


def test_every_request_switches_under_a_budget_and_outputs_match(zoo):
    """A budget that holds one model at a time: every request after the first switches, outputs bit-identical."""
    paths = [zoo["resnet18-small"], zoo["mobilenetv2"], zoo["bert-tiny"]]
    budget = max(switch_footprint(p) for p in paths) + 4096
    gc.collect()
    inputs = [load(p).random_inputs(seed=i) for i, p in enumerate(paths)]
    want = [_direct(p, x) for p, x in zip(paths, inputs)]
    with Runtime("cpu", memory_budget=budget) as rt:
        handles = [rt.load(p, qos_ms=10_000) for p in paths]
        for i in [0, 1, 2, 0, 2, 1, 1, 0, 2, 0]:
            got = rt.submit(handles[i], inputs[i]).result(timeout=120)
            for name, value in want[i].items():
                np.testing.assert_array_equal(got[name], value)
        evictions = sum(e.stage == "evict" for e in rt.switch_events())
        assert evictions >= 7  # one model fits: each change of model evicted the last one
        assert rt.memory()["peak"] <= budget


def test_a_budget_covers_its_runtime_only(zoo):
    """Issue 28 item 2: a plain load beside a budgeted Runtime is not charged to it; a Runtime's budget may
    be below what the rest of the process holds."""
    path = zoo["bert-tiny"]
    need = switch_footprint(path)
    others = [Executor(zoo["mobilenetv2"]), Executor(zoo["resnet18-small"])]  # held by other code of the process
    held = int(func("device_memory")("cpu")["in_use"])
    assert held > need + 4096
    with Runtime("cpu", memory_budget=need + 4096) as rt:  # below what the process already holds
        model = rt.load(path, qos_ms=10_000)
        mine = rt.memory()["in_use"]
        assert 0 < mine <= need and rt.memory()["budget"] == need + 4096
        plain = load(zoo["resnet18-small"])  # beside it: counted by the device, not by the Runtime
        assert rt.memory()["in_use"] == mine
        inputs = plain.random_inputs(seed=1)
        np.testing.assert_array_equal(plain.run(inputs)["output"], others[1].run(inputs)["output"])
        rt.submit(model, load(path).random_inputs(seed=2)).result(timeout=120)
    with Runtime("cpu") as plain_rt:  # a Runtime without a budget does not inherit one
        assert plain_rt.memory()["budget"] == 0
        plain_rt.load(zoo["resnet18-small"])
        plain_rt.load(zoo["resnet18-small"], name="again")
    del others


def test_a_runtime_budget_too_small_for_a_model_fails_with_one_line(zoo):
    with Runtime("cpu", memory_budget=1 << 16) as rt:
        with pytest.raises(TvmschedError) as err:
            rt.load(zoo["resnet18-small"], qos_ms=10_000)
        assert "\n" not in str(err.value) and "budget" in str(err.value)
        assert rt.memory()["in_use"] == 0
    with pytest.raises(TvmschedError, match="memory budget must be a positive"):
        Runtime("cpu", memory_budget=-5)


def test_a_switch_that_cannot_find_room_fails_instead_of_waiting(zoo):
    """Memory of a Runtime's budget held where its switcher cannot evict it (the model loaded straight into
    the budget), and the model registered again under another name: alone it fits the budget, beside the
    resident copy it does not. Its request fails with one line naming the switch-in (it used to wait for
    ever: nothing running would free memory)."""
    path = zoo["resnet18-small"]
    budget = switch_footprint(path)
    with Runtime("cpu", memory_budget=budget) as rt:
        blocker = Executor(path, memory_scope=rt.memory_scope)  # counts against the budget, not the switcher's
        assert 0 < rt.memory()["in_use"] <= budget
        other = rt.load(path, qos_ms=10_000, name="other", resident=False)
        with pytest.raises(TvmschedError) as err:
            rt.submit(other, load(path).random_inputs(seed=0)).result(timeout=120)
        assert "cannot be switched in" in str(err.value) and "\n" not in str(err.value), str(err.value)
        del blocker


def test_the_watchdog_fails_a_request_stuck_waiting_for_a_switch_in(zoo):
    """A best-effort model preempted mid-request holds its one sub-task; another model's switch-in waits for
    that memory. With a 1 s stall timeout the waiting request fails with one line naming the stage; the
    preempted request, resumed, still gives the direct run's outputs."""
    # the held model is the larger one on one sub-task (which one that is changed when the compiler fused
    # mobilenetv2's ReLU6 into its convolutions), so that the waiting one's stage 1 fits
    held, waiting = sorted((zoo["mobilenetv2"], zoo["resnet18-small"]), key=lambda path: -footprint_of(path, 1))
    settings = SwitchSettings(max_groups=1)
    probe = Executor(waiting, register_groups=1)
    assert footprint(probe) < footprint_of(held, 1)
    budget = footprint_of(held, 1) + int(probe.native.env_bytes()) + 4096  # its stage 1 fits
    del probe
    x_held, x_waiting = load(held).random_inputs(seed=4), load(waiting).random_inputs(seed=5)
    want = _direct(held, x_held)
    with Runtime("cpu", memory_budget=budget, switching=settings, stall_timeout_s=1) as rt:
        a = rt.load(held, qos_ms=10_000, name="held")
        b = rt.load(waiting, qos_ms=10_000, name="waiting", resident=False)
        task = rt.models["held"].task
        future = held_mid_request(rt, a, x_held)  # paused mid-request: it keeps its one sub-task
        with pytest.raises(TvmschedError) as err:
            rt.submit(b, x_waiting).result(timeout=60)
        message = str(err.value)
        assert "watchdog" in message and "switched in" in message and "\n" not in message, message
        task.resume()
        got = future.result(timeout=60)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)
        rt.submit(b, x_waiting).result(timeout=60)  # with the memory free again, it switches in


def test_the_stall_timeout_setting_is_checked(monkeypatch):
    from tvmsched.runtime.preemption import default_stall_timeout_s

    monkeypatch.setenv("TVMSCHED_STALL_TIMEOUT_S", "2.5")
    assert default_stall_timeout_s() == 2.5
    monkeypatch.setenv("TVMSCHED_STALL_TIMEOUT_S", "soon")
    with pytest.raises(TvmschedError, match="TVMSCHED_STALL_TIMEOUT_S"):
        default_stall_timeout_s()
    monkeypatch.delenv("TVMSCHED_STALL_TIMEOUT_S")
    assert default_stall_timeout_s() == 60
