"""Each scheduling policy on made-up requests and monitors: policies decide and never touch a device."""

import pytest

from tvmsched.errors import TvmschedError
from tvmsched.runtime import policies
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView

ALL = 8
# two layers, each with a full-unit candidate and a 2-unit one that is slower alone
LAYERS = [[CandidateInfo(ALL, 100.0, "m/l0c0"), CandidateInfo(2, 150.0, "m/l0c1")],
          [CandidateInfo(ALL, 50.0, "m/l1c0"), CandidateInfo(2, 70.0, "m/l1c1")]]


def request(monitor=dict, loaded=1, layers=LAYERS, qos_ms=None, model="m") -> policies.Request:
    return policies.Request(model, layers, qos_ms, monitor, ALL, loaded)


def busy_monitor():
    """Another stream runs full-unit layers for the next 10 ms."""
    return {"other": StreamView("other", tuple(CandidateInfo(ALL, 1000.0, f"o/l{i}c0") for i in range(10)))}


def test_create_lists_the_kinds_on_a_bad_one():
    assert {policies.create(k, total_units=ALL).kind for k in policies.KINDS} == set(policies.KINDS)
    with pytest.raises(TvmschedError, match="colocation.*fastest.*partition.*fcfs"):
        policies.create("lottery")


def test_fastest_takes_the_fastest_candidate_of_every_layer_whatever_runs():
    assert policies.create("fastest").choose(request(busy_monitor)) == [0, 0]


def test_fcfs_is_serial_with_the_fastest_candidates():
    policy = policies.create("fcfs")
    assert policy.serial and policy.choose(request()) == [0, 0]
    assert not policies.create("fastest").serial


def test_partition_keeps_each_model_within_its_share_of_the_units():
    policy = policies.create("partition")
    assert policy.choose(request(loaded=1)) == [0, 0]  # the whole device: full-unit candidates fit
    assert policy.choose(request(loaded=4)) == [1, 1]  # a share of 2 units: the 2-unit candidates
    only_full = [[CandidateInfo(ALL, 100.0, "m/x")]]
    assert policy.choose(request(loaded=4, layers=only_full, model="big")) == [0]  # nothing fits: the fastest anyway


def test_colocation_takes_the_fastest_on_an_idle_device_and_avoids_oversubscription_beside_others():
    policy = policies.create("colocation", table=ColocationTable(ALL), total_units=ALL)
    assert policy.choose(request()) == [0, 0]
    # beside a full-unit stream (fallback rule r = excess demand / demand): full-unit candidates get
    # r = 8/16 (100 -> 200 us, 50 -> 100 us), the 2-unit ones r = 2/10 (150 -> 187.5 us, 70 -> 87.5 us)
    assert policy.choose(request(busy_monitor)) == [1, 1]
    decision = policy.scheduler.decisions[-1]
    assert decision.streams == 1 and decision.meets_qos


def test_colocation_waits_for_its_own_stream_and_reads_the_monitor_only_when_asked():
    reads = []

    def monitor():
        reads.append(1)
        return {"m": StreamView("m", (CandidateInfo(ALL, 5000.0, "m/l0c0"),)), **busy_monitor()}

    policy = policies.create("colocation", total_units=ALL)
    policy.choose(request(monitor, qos_ms=1.0))
    assert len(reads) == 1
    decision = policy.scheduler.decisions[-1]
    assert decision.estimated_ms > 5.0 and not decision.meets_qos  # its own queued 5 ms come first
    policies.create("fastest").choose(request(monitor))
    assert len(reads) == 1  # the fastest policy never reads the monitor


def test_the_serial_policy_runs_requests_one_at_a_time_through_a_runtime(tmp_path, compiled):
    """fcfs end to end: answers are right and its latencies are counted from submit() in Python."""
    import numpy as np

    from tvmsched import models
    from tvmsched.runtime import Executor, Runtime

    path = compiled("mlp")  # shared, read only
    x = models.random_inputs(models.build("mlp"), seed=1)
    expected = Executor(path).run(x)
    with Runtime("cpu", policy="fcfs") as rt:
        rt.load(path, qos_ms=1000.0)
        futures = [rt.submit("mlp", x) for _ in range(5)]
        assert all(np.array_equal(f.result(timeout=60)["output"], expected["output"]) for f in futures)
        stats = rt.stats()["mlp"]
    assert stats["requests"] == 5 and stats["errors"] == 0 and stats["qos_violations"] == 0


def test_colocation_reads_no_monitor_when_no_layer_has_a_choice():
    """One candidate per layer (artifacts compiled without a QoS target): nothing to decide. The policy used to read
    every stream's state and run its greedy pass anyway, which under load cost more than the requests (the colocation
    row of bench/results/sharing-cpu.md at 2000 req/s; the H200 run's 300 against fastest's 1000 req/s)."""
    def monitor():
        raise AssertionError("the monitor was read")

    single = [[cands[1]] for cands in LAYERS]
    policy = policies.create("colocation", total_units=ALL)
    plain = policies.Request("m", single, 1.0, monitor, ALL, 2, choice=False)
    assert policy.choose(plain) == [0, 0]
    with pytest.raises(AssertionError, match="monitor was read"):  # with a choice it does read it
        policy.choose(policies.Request("m", LAYERS, 1.0, monitor, ALL, 2))
