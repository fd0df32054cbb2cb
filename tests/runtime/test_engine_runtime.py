"""The engine's multi-tenant Runtime (tvmsched/runtime.h) through its tvm-ffi door: requests queue on their model and
the policy decides when a stream takes one; time limits, queue caps, admission by latency target, real-time
preemption, the serial baseline, unloading. Run in both CPU modes (`make test`'s asynchronous pass)."""

import re
import time

import numpy as np
import pytest

from tests.helpers import wait_until
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Executor, native
from tvmsched.runtime.executor import from_engine, to_engine
from tests.runtime.test_runtime import kit_artifacts  # noqa: F401 (the fixture: artifacts with 1- and 2-thread candidates)

WAIT_S = 30.0


def finished(request) -> dict:
    assert request.wait(WAIT_S, 0.0), "the request did not finish"
    assert not str(request.error()), str(request.error())
    return from_engine(request.outputs())


def failure(request) -> str:
    assert request.wait(WAIT_S, 0.0), "the request did not finish"
    return str(request.error())


@pytest.fixture
def runtime():
    made = []

    def make(**options):
        made.append(native.create_runtime(options))
        return made[-1]

    yield make
    for rt in made:
        rt.shutdown()


def test_requests_queue_on_their_model_and_any_of_its_streams_runs_them_bit_identically(runtime, mlp, mlp_run):
    inputs, want = mlp_run
    rt = runtime()
    assert rt.load(mlp, {"streams": 3, "warmup": True}) == "mlp"
    requests = [rt.submit("mlp", to_engine(inputs), -1, -1.0) for _ in range(60)]
    for request in requests:
        got = finished(request)
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    stats = rt.stats()["mlp"]
    warmup = 3  # one request per candidate count (1) on each of the 3 streams
    assert stats["requests"] == 60 + warmup and stats["errors"] == 0 and stats["queued"] == 0
    served = [int(s.counts()["completed"]) for s in rt.streams("mlp")]
    assert sum(served) == 60 + warmup and [str(s.name()) for s in rt.streams("mlp")] == ["mlp", "mlp#1", "mlp#2"]


def test_bad_options_and_bad_requests_are_one_line_and_queue_nothing(runtime, mlp, mlp_run):
    with pytest.raises(TvmschedError, match="a runtime: unknown option 'polcy'"):
        native.create_runtime({"polcy": "fcfs"})
    with pytest.raises(TvmschedError, match=r"policy must be one of .*not 'lottery'"):
        native.create_runtime({"policy": "lottery"})
    rt = runtime()
    with pytest.raises(TvmschedError, match="a model: unknown option 'stream'"):
        rt.load(mlp, {"stream": 2})
    with pytest.raises(TvmschedError, match="timeout_action is reject or delay, not drop"):
        rt.load(mlp, {"timeout_action": "drop"})
    rt.load(mlp, {})
    with pytest.raises(TvmschedError, match="already loaded"):
        rt.load(mlp, {})
    with pytest.raises(TvmschedError, match=r"no model named 'nope' is loaded \(loaded: mlp\)"):
        rt.submit("nope", to_engine(mlp_run[0]), -1, -1.0)
    with pytest.raises(TvmschedError, match="input"):
        rt.submit("mlp", {}, -1, -1.0)
    assert rt.stats()["mlp"]["queued"] == 0


def test_a_request_queued_past_its_timeout_is_rejected_and_the_next_one_runs(runtime, mlp, mlp_run):
    inputs, want = mlp_run
    rt = runtime()
    rt.load(mlp, {"default_timeout_us": 2000.0})
    (stream,) = rt.streams("mlp")
    stream.preempt(True, True)  # nothing is taken from the queue while its only stream is paused
    late = rt.submit("mlp", to_engine(inputs), -1, -1.0)  # the model's default: 2 ms
    patient = rt.submit("mlp", to_engine(inputs), -1, 0.0)  # its own: none
    assert re.fullmatch(r"model mlp: the request did not start within its deadline \(queued \d+ us, \d+ us past it\)",
                        failure(late))
    stream.resume(True)
    got = finished(patient)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    stats = rt.stats()["mlp"]
    assert (stats["timed_out"], stats["errors"], stats["requests"]) == (1, 1, 1)


def test_under_delay_a_timed_out_request_runs_after_those_that_still_have_time(runtime, mlp, mlp_run):
    inputs, _ = mlp_run
    rt = runtime()
    rt.load(mlp, {"timeout_action": "delay"})
    (stream,) = rt.streams("mlp")
    stream.preempt(True, True)
    late = rt.submit("mlp", to_engine(inputs), -1, 1000.0)
    time.sleep(0.02)  # past its timeout: delayed
    on_time = [rt.submit("mlp", to_engine(inputs), -1, 0.0) for _ in range(3)]
    stream.resume(True)
    finished(late)
    for request in on_time:
        finished(request)
    assert late.started_us > max(r.started_us for r in on_time)
    assert rt.stats()["mlp"]["timed_out"] == 1 and rt.stats()["mlp"]["errors"] == 0


def test_a_full_queue_refuses_at_submit(runtime, mlp, mlp_run):
    rt = runtime()
    rt.load(mlp, {"max_queue_size": 2})
    (stream,) = rt.streams("mlp")
    stream.preempt(True, True)
    queued = [rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0) for _ in range(2)]
    with pytest.raises(TvmschedError, match=r"model mlp: its queue is full \(2 requests queued, max_queue_size 2\)"):
        rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0)
    stream.resume(True)
    for request in queued:
        finished(request)
    assert rt.stats()["mlp"]["refused"] == 1


def test_admission_refuses_a_request_that_would_finish_past_the_latency_target(runtime, mlp, mlp_run):
    rt = runtime()
    rt.load(mlp, {"qos_ms": 1e-6})  # any wait misses it
    (stream,) = rt.streams("mlp")
    stream.preempt(True, True)
    first = rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0)  # nobody ahead: admitted (it may still miss)
    with pytest.raises(TvmschedError, match=r"model mlp: the request would finish in about .* ms \(1 requests ahead "
                                            r"of it\), past its latency target of 1e-06 ms: refused"):
        rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0)
    stream.resume(True)
    finished(first)
    stats = rt.stats()["mlp"]
    assert stats["refused"] == 1 and stats["qos_violations"] == 1


def test_a_real_time_request_preempts_the_best_effort_streams_until_it_is_done(runtime, mlp, mlp_run):
    rt = runtime()
    rt.load(mlp, {"name": "be", "streams": 2})
    rt.load(mlp, {"name": "rt", "realtime": True})
    (realtime,) = rt.streams("rt")
    realtime.preempt(True, True)  # its request stays queued: the best-effort streams stay preempted meanwhile
    request = rt.submit("rt", to_engine(mlp_run[0]), -1, -1.0)
    assert all(s.paused() for s in rt.streams("be"))
    queued_be = rt.submit("be", to_engine(mlp_run[0]), -1, -1.0)
    time.sleep(0.01)
    assert not queued_be.done()  # best-effort work waits for the real-time request
    realtime.resume(True)
    finished(request)
    wait_until(lambda: not any(s.paused() for s in rt.streams("be")), "the best-effort streams resumed")
    finished(queued_be)
    # a best-effort model's request that asks for real time preempts the others but not its own model's streams
    (other,) = [s for s in rt.streams("rt")]
    other.preempt(True, True)
    held = rt.submit("rt", to_engine(mlp_run[0]), 0, -1.0)  # best-effort: preempts nothing
    assert not any(s.paused() for s in rt.streams("be"))
    own = rt.submit("be", to_engine(mlp_run[0]), 1, -1.0)
    finished(own)
    other.resume(True)
    finished(held)


def test_the_serial_policy_runs_one_request_at_a_time_in_arrival_order(runtime, mlp, mlp_run):
    rt = runtime(policy="fcfs")
    for name in ("a", "b"):
        rt.load(mlp, {"name": name})
    requests = [rt.submit("ab"[i % 2], to_engine(mlp_run[0]), -1, -1.0) for i in range(20)]
    for request in requests:
        finished(request)
    spans = [(r.started_us, r.finished_us) for r in requests]
    assert [s for s, _ in spans] == sorted(s for s, _ in spans)  # arrival order
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))  # never two at once


def test_under_the_serial_policy_a_real_time_request_waits_its_turn_and_preempts_nothing(runtime, mlp, mlp_run):
    """Stress seed 1: a real-time request under fcfs held the preemption group, which paused the best-effort streams
    whose older requests it waited behind — the queue stopped for good. One at a time, nothing runs beside it."""
    rt = runtime(policy="fcfs")
    rt.load(mlp, {"name": "be"})
    rt.load(mlp, {"name": "rt", "realtime": True})
    older = [rt.submit("be", to_engine(mlp_run[0]), -1, -1.0) for _ in range(3)]
    realtime = rt.submit("rt", to_engine(mlp_run[0]), -1, -1.0)
    assert not any(s.paused() for s in rt.streams("be"))
    for request in [*older, realtime]:
        np.testing.assert_array_equal(finished(request)["output"], mlp_run[1]["output"])
    assert realtime.started_us >= max(r.finished_us for r in older)  # in arrival order


def test_colocation_decides_when_a_stream_takes_a_request_against_the_busy_streams(runtime, kit_artifacts):  # noqa: F811
    rt = runtime(policy="colocation", total_units=2)
    for name in ("mlp", "resnet18-small"):
        rt.load(str(kit_artifacts(name)), {})
    inputs = {name: Executor(str(kit_artifacts(name))).random_inputs(0) for name in ("mlp", "resnet18-small")}
    requests = [rt.submit(name, to_engine(inputs[name]), -1, -1.0) for _ in range(15) for name in inputs]
    for request in requests:
        finished(request)
    d = {str(k): float(v) for k, v in rt.decisions().items()}
    assert int(d["decided"]) == len(requests) and 0 < d["p50_us"] <= d["p99_us"]
    # reading the monitor is a part of each decision: below it at every percentile
    assert 0 < d["monitor_p50_us"] <= d["p50_us"] and d["monitor_p50_us"] <= d["monitor_p99_us"] <= d["p99_us"]
    layers = {name: len(Executor(str(kit_artifacts(name))).manifest.layers) for name in inputs}
    for request, name in zip(requests, [name for _ in range(15) for name in inputs]):
        assert len(request.candidate_ids()) == layers[name]  # chosen when a stream took it


def test_over_two_devices_the_decision_times_are_every_device_s_decisions_pooled(runtime, kit_artifacts):  # noqa: F811
    """A Runtime over cpu:0 and cpu:1 decides per device; its decision statistics pool them. Only cpu:1 holds a model,
    so every recorded decision is cpu:1's: the count, the wall-clock, monitor and CPU-time percentiles and the disturbed
    share all show them (the first device's alone would have none)."""
    rt = runtime(policy="colocation", devices=["cpu:0", "cpu:1"])
    assert rt.load(str(kit_artifacts("mlp")), {"name": "chooses", "devices": [1]}) == "chooses"
    x = to_engine(Executor(str(kit_artifacts("mlp"))).random_inputs(0))
    requests = [rt.submit("chooses", x, -1, -1.0) for _ in range(12)]
    for request in requests:
        finished(request)
    d = {str(k): float(v) for k, v in rt.decisions().items()}
    assert int(d["decided"]) == len(requests) and 0 < d["p50_us"] <= d["p99_us"]
    assert 0 < d["monitor_p50_us"] <= d["monitor_p99_us"]
    assert 0 < d["cpu_p50_us"] <= d["cpu_p99_us"] and 0 <= d["disturbed_share"] <= 1
    assert d["undisturbed_p99_us"] > 0 or d["disturbed_share"] == 1


def test_the_monitor_read_while_streams_run_shows_each_stream_s_remaining_layers_never_a_torn_mix(runtime, kit_artifacts):  # noqa: F811,E501
    # every view is the running request's layers from the first not done (that one possibly part done, at a share of
    # its latency), then whole queued requests: read without the streams' locks, it must never mix two requests
    rt = runtime(policy="colocation", total_units=2)
    names = ("mlp", "resnet18-small")
    layers = {}
    for name in names:
        rt.load(str(kit_artifacts(name)), {"streams": 2})
        manifest = Executor(str(kit_artifacts(name))).manifest
        layers[name] = [{(min(c.units or 2, 2), c.latency_us) for c in layer.candidates} for layer in manifest.layers]
    inputs = {name: to_engine(Executor(str(kit_artifacts(name))).random_inputs(0)) for name in names}
    views, requests = 0, []
    for _ in range(5):  # a loaded machine may run a whole round before this thread reads once: another round then
        round_ = [rt.submit(name, inputs[name], -1, -1.0) for _ in range(12) for name in names]
        requests += round_
        while not all(r.done() for r in round_):
            views += _check_views(rt.monitor(), layers)
        if views:
            break
    for request in requests:
        finished(request)
    assert views > 0 and len(rt.monitor()) == 0  # seen busy; idle at the end


def _check_views(monitor, layers) -> int:
    """Checks each stream's view of the work left (`layers`: per model, each layer's candidates); how many it read."""
    views = 0
    for stream, work in monitor:
        cands = layers[str(stream).split("#")[0]]
        n = len(cands)
        work = [(int(u), float(lat)) for u, lat in work]
        first = n - len(work) % n if len(work) % n else 0  # the running request's first layer not done
        assert len(work) <= 5 * n
        for k, (units, latency) in enumerate(work):
            layer = (first + k) % n
            if k == 0 and first > 0 and (units, latency) not in cands[layer]:  # part done: a share of its latency
                assert any(units == u and 0 < latency < lat for u, lat in cands[layer]), (stream, k, work)
            else:
                assert (units, latency) in cands[layer], (stream, k, work)
        views += 1
    return views


def test_a_batched_model_packs_the_queued_requests_that_fit_into_one_launch_each_getting_its_rows(runtime, compiled):
    path = str(compiled("mlp", batch_size=8))  # (tests/test_batching.py: compiled for 8 rows, checked against ORT)
    executor = Executor(path)
    rt = runtime()
    rt.load(path, {})
    (stream,) = rt.streams("mlp")
    stream.preempt(True, True)  # everything queues, then the stream takes what fits into 8 rows, oldest first
    rows = [3, 3, 3, 1, 8, 2, 2, 2, 2]  # -> launches of 3+3, 3+1, 8 (whole: not packed), 2+2+2+2
    sent = [{k: v[:n].copy() for k, v in executor.random_inputs(seed).items()} for seed, n in enumerate(rows)]
    requests = [rt.submit("mlp", to_engine(inputs), -1, -1.0) for inputs in sent]
    stream.resume(True)
    for inputs, request, n in zip(sent, requests, rows):
        got = finished(request)
        padded = {k: np.concatenate([v, np.zeros((8 - n, *v.shape[1:]), v.dtype)]) for k, v in inputs.items()}
        alone = executor.run(padded)  # the same rows at the top of a launch of their own: the same bits
        assert all(got[k].shape[0] == n and np.array_equal(got[k], alone[k][:n]) for k in alone)
    stats = rt.stats()["mlp"]
    assert (stats["requests"], stats["executions"], stats["errors"]) == (9, 4, 0)
    launches = sorted((int(rows), int(count)) for rows, count, _ in stats["batches"])  # by the rows they brought
    assert launches == [(4, 1), (6, 1), (8, 2)] and all(int(ns) > 0 for _, _, ns in stats["batches"])
    with pytest.raises(TvmschedError, match=r"^input 'input' has 9 rows: the model takes 1 to 8 rows per request"):
        rt.submit("mlp", to_engine({"input": np.zeros((9, 784), np.float32)}), -1, -1.0)
    with pytest.raises(TvmschedError, match=r"input 'input' has shape \(2, 783\), expected \(8, 784\)"):
        rt.submit("mlp", to_engine({"input": np.zeros((2, 783), np.float32)}), -1, -1.0)


def test_with_a_queue_delay_a_free_stream_waits_for_a_full_batch_at_most_that_long(runtime, compiled):
    path = str(compiled("mlp", batch_size=8))
    rows = {k: v[:1].copy() for k, v in Executor(path).random_inputs(0).items()}
    four = {k: np.concatenate([v] * 4) for k, v in rows.items()}
    rt = runtime()
    rt.load(path, {"max_queue_delay_us": 1e6})
    short = [rt.submit("mlp", to_engine(rows), -1, -1.0) for _ in range(3)]  # 3 rows of 8: held up to 1 s
    time.sleep(0.1)
    assert not any(r.done() for r in short)
    for request in short:
        finished(request)
        assert request.finished_us - short[0].submitted_us >= 1e6  # launched once the oldest waited the delay
    assert rt.stats()["mlp"]["executions"] == 1
    full = [rt.submit("mlp", to_engine(four), -1, -1.0) for _ in range(2)]  # 8 rows: no reason to wait
    for request in full:
        finished(request)
    assert full[1].finished_us - full[0].submitted_us < 1e6 and rt.stats()["mlp"]["executions"] == 2
    with pytest.raises(TvmschedError, match="max_queue_delay_us is 0 to 60000000 microseconds"):
        rt.load(path, {"name": "other", "max_queue_delay_us": -1.0})


def test_the_open_loop_generator_submits_poisson_arrivals_and_times_them_from_their_schedule(runtime, mlp, mlp_run):
    rt = runtime()
    rt.load(mlp, {})
    open_loop = native.func("open_loop")  # (bench/batching.py's load: no Python between requests)
    result = open_loop(rt, "mlp", to_engine(mlp_run[0]), 400.0, 0.25, 7)
    latencies = [float(x) for x in result["latencies_us"]]
    assert 40 <= len(latencies) <= 200 and int(result["failed"]) == int(result["refused"]) == 0  # ~100 expected
    assert min(latencies) > 0 and rt.stats()["mlp"]["requests"] == len(latencies)
    with pytest.raises(TvmschedError, match="an open loop needs a positive rate"):
        open_loop(rt, "mlp", to_engine(mlp_run[0]), 0.0, 1.0, 7)
    # several models: one merged Poisson stream, each model's arrivals by its share of the rates (bench/batching.py's mix)
    rt.load(mlp, {"name": "other"})
    mix = native.func("open_loop_mix")(rt, ["mlp", "other"], [to_engine(mlp_run[0])] * 2, [300.0, 100.0], 0.5, 9)
    counts = {name: len(mix[name]["latencies_us"]) for name in ("mlp", "other")}
    assert 75 <= counts["mlp"] <= 300 and 15 <= counts["other"] <= 100 and counts["mlp"] > counts["other"], counts
    assert rt.stats()["other"]["requests"] == counts["other"] and float(mix[""]["late_us"]) >= 0
    with pytest.raises(TvmschedError, match="an open loop needs, per model, inputs and a positive rate"):
        native.func("open_loop_mix")(rt, ["mlp", "other"], [to_engine(mlp_run[0])], [1.0, 1.0], 1.0, 9)


def test_unload_lets_the_queued_requests_finish_then_frees_the_name(runtime, mlp, mlp_run):
    rt = runtime()
    rt.load(mlp, {"streams": 2})
    requests = [rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0) for _ in range(20)]
    rt.unload("mlp", 60.0)
    assert all(r.done() and not str(r.error()) for r in requests)
    with pytest.raises(TvmschedError, match=r"no model named 'mlp' is loaded \(loaded: none\)"):
        rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0)
    assert rt.load(mlp, {}) == "mlp"
    finished(rt.submit("mlp", to_engine(mlp_run[0]), -1, -1.0))


def test_a_model_larger_than_the_budget_is_switched_or_streamed_as_decided_at_load(runtime, mlp, mlp_run):
    inputs, want = mlp_run
    rt = runtime()
    rt.load(mlp, {})
    assert rt.stats()["mlp"]["placement"] == "staged"  # switched in by its requests if memory runs short
    footprint = int(rt.memory()["in_use"])
    budget = footprint * 9 // 10  # (mlp's largest layer needs most of it: a stream buffer of its weights)
    small = runtime(memory_budget=budget,
                    tiers=[{"kind": "dram", "capacity_bytes": 1 << 30, "numa_node": -1, "path": ""}])
    small.load(mlp, {})
    assert small.stats()["mlp"]["placement"] == "streamed"
    got = finished(small.submit("mlp", to_engine(inputs), -1, -1.0))
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert int(small.memory()["peak"]) <= budget < footprint
    # a model asking for more device memory than is left: one line, and nothing of it stays loaded
    with pytest.raises(TvmschedError) as err:
        small.load(mlp, {"name": "again", "device_bytes": budget})
    line = str(err.value)
    assert "\n" not in line and f"model again asks for {budget} bytes of device memory;" in line
    assert small.models() == ["mlp"]


def test_streamed_models_that_cannot_all_be_in_memory_take_turns(runtime, mlp, mlp_run):
    """Two streamed copies of mlp in a budget that holds one: each plans for the whole budget (no device_bytes), and
    requests of both, alternating, are each model's bit-identical outputs; a turn ends only when its model is idle
    (park) and the next takes the memory (unpark), within the budget."""
    inputs, want = mlp_run
    probe = runtime()
    probe.load(mlp, {})
    footprint = int(probe.memory()["in_use"])
    budget = footprint * 9 // 10
    rt = runtime(policy="fcfs", memory_budget=budget,
                 tiers=[{"kind": "dram", "capacity_bytes": 1 << 30, "numa_node": -1, "path": ""}])
    rt.load(mlp, {"name": "a"})
    rt.load(mlp, {"name": "b"})
    assert rt.stats()["a"]["placement"] == rt.stats()["b"]["placement"] == "streamed"
    requests = [(name, rt.submit(name, to_engine(inputs), -1, -1.0)) for _ in range(6) for name in ("a", "b")]
    for name, request in requests:
        got = finished(request)
        assert all(np.array_equal(got[k], want[k]) for k in want), name
    assert int(rt.memory()["peak"]) <= budget
    events = {name: [str(e[1]) for e in native.tiering_events(rt.engine_models(name)[0])] for name in ("a", "b")}
    # fcfs runs them in the order they came, a, b, a, b ...: every request after the first is a turn change
    assert events["a"].count("unpark") == events["b"].count("unpark") == 6, events
    for name in ("a", "b"):  # each turn ends before the next begins: a model alternates park, unpark
        turns = [e for e in events[name] if e in ("park", "unpark")]
        assert all(x != y for x, y in zip(turns, turns[1:])), (name, turns)
    # a third takes turns too, and unloading one gives its turn away for good
    rt.load(mlp, {"name": "c"})
    rt.unload("a", 60.0)
    for name in ("b", "c", "b"):
        got = finished(rt.submit(name, to_engine(inputs), -1, -1.0))
        assert all(np.array_equal(got[k], want[k]) for k in want)
    assert int(rt.memory()["peak"]) <= budget


def test_a_switched_model_and_a_streamed_one_take_the_memory_the_other_holds_idle(runtime, compiled, mlp, mlp_run):
    """resnet18-small streams through the whole budget; mlp, loaded after it, is switched in by its requests: each one's
    request takes the memory the other holds idle (the streamed model parks, the switched one is evicted), in turns."""
    big = str(compiled("resnet18-small"))
    probe = runtime()
    probe.load(big, {})
    budget = int(probe.memory()["in_use"]) * 9 // 10
    rt = runtime(memory_budget=budget, tiers=[{"kind": "dram", "capacity_bytes": 1 << 30, "numa_node": -1, "path": ""}])
    rt.load(big, {"name": "big"})
    rt.load(mlp, {"name": "small"})
    assert [rt.stats()[n]["placement"] for n in ("big", "small")] == ["streamed", "staged"]
    big_inputs = Executor(big).random_inputs(1)
    big_want = Executor(big).run(big_inputs)
    inputs, want = mlp_run
    for _ in range(3):
        for name, given, expected in (("small", inputs, want), ("big", big_inputs, big_want)):
            got = finished(rt.submit(name, to_engine(given), -1, -1.0))
            assert all(np.array_equal(got[k], expected[k]) for k in expected), name
    assert int(rt.memory()["peak"]) <= budget
    turns = [str(e[1]) for e in native.tiering_events(rt.engine_models("big")[0])]
    assert turns.count("park") >= 3 and turns.count("unpark") >= 3, turns
    assert sum(str(e[1]) == "evict" for e in rt.switch_events()) >= 2
