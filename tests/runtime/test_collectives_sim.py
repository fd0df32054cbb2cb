"""The collectives simulator (mechanism E at scale) and CalcScore: hand-computed cases, invariants, errors."""

import pytest

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives import fattree, score, workloads
from tvmsched.runtime.collectives.simulator import JobSpec, simulate, simulate_jobs

MB = 12_500_000  # at 100 Gb/s: ring 50 us + 1 ms, in-network 50 us + 0.5 ms


def one_bucket(name, steps=3, arrival=0.0, hosts=2):
    """Compute 10 ms, then one 12.5 MB AllReduce: a step is 11.05 ms ring, 10.55 ms in-network."""
    return JobSpec(name, steps, (MB,), 0.010, hosts=hosts, arrival_s=arrival)


# -- the fat tree -------------------------------------------------------------------------------------

def test_fat_tree_counts():
    t = fattree.FatTree(16)
    assert (t.hosts, t.edges, t.aggs, t.cores, t.switches) == (1024, 128, 128, 64, 320)
    t4 = fattree.FatTree(4)
    assert (t4.hosts, t4.edges, t4.aggs, t4.cores) == (16, 8, 8, 4)
    with pytest.raises(TvmschedError, match="even integer"):
        fattree.FatTree(5)


def test_trees_span_edge_pod_and_core():
    t = fattree.FatTree(4)  # 2 hosts per edge, 2 edges and 2 aggs per pod, 4 cores
    assert t.trees([3]) == []
    assert t.trees([0, 1]) == [(0,)]
    assert t.trees([0, 2]) == [(0, 1, 8), (0, 1, 9)]  # one of pod 0's two aggregation switches
    # pods 0 and 1: core c reaches aggregation switch c // 2 of each pod
    assert t.trees([1, 4]) == [(0, 2, 8, 10, 16), (0, 2, 8, 10, 17), (0, 2, 9, 11, 18), (0, 2, 9, 11, 19)]
    assert [t.layer(s) for s in (0, 8, 16)] == ["edge", "agg", "core"]


def test_placement_first_fit_and_locality():
    t = fattree.FatTree(4)
    hosts, load = fattree.Hosts(t), [0.0] * t.switches
    hosts.take([0, 2])  # edges 0 and 1 half used
    assert fattree.place("first-fit", hosts, 2, load) == [1, 3]
    assert fattree.place("locality", hosts, 2, load) == [4, 5]  # a whole edge switch, no tree across edges
    assert fattree.place("locality", hosts, 1, load) == [1]  # a single host fills a hole (best fit)
    assert fattree.place("locality", hosts, 4, load) == [4, 5, 6, 7]  # one pod, two edges
    assert fattree.place("first-fit", hosts, 15, load) is None


def test_tree_choice():
    cands = [(0, 1, 8), (0, 1, 9)]
    load = [0.0] * 20
    load[8] = 1.0
    assert fattree.choose_tree("first-fit", cands, load) == (0, 1, 8)
    assert fattree.choose_tree("least-load", cands, load) == (0, 1, 9)
    held = [-1] * 20
    held[8] = 5
    assert fattree.choose_tree("first-fit", cands, load, held) == (0, 1, 9)
    held[9] = 6
    assert fattree.choose_tree("first-fit", cands, load, held) is None


# -- workloads ----------------------------------------------------------------------------------------

def test_models_have_real_sizes_and_ddp_buckets():
    assert workloads.parameter_count("opt-125m") == 125_239_296
    assert workloads.parameter_count("bert-base") == 109_514_298
    p = workloads.profile("opt-125m")
    # DDP's buckets (gradient-ready order, 1 MiB then 25 MiB): the same bytes as MINA's measured trace
    assert (p.sizes[0], p.sizes[1], p.sizes[-1], len(p.sizes)) == (9_446_400, 28_351_488, 179_644_416, 13)
    assert sum(p.sizes) == 4 * 125_239_296
    assert 0 < p.starts[0] < p.starts[-1] < p.sync
    assert list(p.starts) == sorted(p.starts)


def test_step_time_and_transfer():
    p = workloads.Profile("x", 0, (MB, MB), (0.001, 0.0015), 0.004)
    ring = workloads.transfer_s(MB, 2, 12.5e9, 50e-6)
    assert ring == pytest.approx(1.05e-3)
    assert workloads.transfer_s(MB, 2, 12.5e9, 50e-6, speedup=2.0) == pytest.approx(0.55e-3)
    assert workloads.transfer_s(MB, 1, 12.5e9, 50e-6) == 50e-6
    # the first ends at 2.05 ms, the second queues behind it until 3.1 ms: the step ends with compute (4 ms)
    assert workloads.step_time(p, [ring, ring]) == pytest.approx(0.004)
    assert workloads.step_time(p, [ring, 0.003]) == pytest.approx(0.00505)


# -- CalcScore ----------------------------------------------------------------------------------------

def test_calc_score_is_saving_per_switch_second():
    op = score.Op("1", ring_s=0.010, innet_s=0.004, exposed=0.5)
    assert score.calc_score(op) == pytest.approx(0.5 * 0.006 / 0.004)
    assert score.calc_score(score.Op("1", 0.010, 0.004, exposed=0.0)) == 0.0
    late = score.Op("1", 0.010, 0.004, wait_s=0.004)
    assert score.calc_score(late) == pytest.approx(0.006 / 0.008)
    assert score.mina_score(score.Op("1", 0.010, 0.004, hosts=8)) == pytest.approx(8 * 0.006 / 0.004)


def test_ranked_breaks_ties_by_remaining_then_job_id():
    a = score.Op("10", 0.01, 0.005)
    b = score.Op("2", 0.01, 0.005)
    c = score.Op("3", 0.01, 0.005, remaining_s=1.0)
    best = score.Op("9", 0.02, 0.005)
    assert [o.job for o in score.ranked([a, b, c, best])] == ["9", "3", "2", "10"]
    # MINA weights by hosts, we do not
    wide, narrow = score.Op("1", 0.01, 0.005, hosts=16), score.Op("2", 0.012, 0.005, hosts=2)
    assert score.ranked([wide, narrow])[0] is narrow
    assert score.ranked([wide, narrow], score.mina_score)[0] is wide


# -- small explicit cases on one switch -----------------------------------------------------------------

def test_one_job_hand_computed():
    jct = {p: simulate_jobs([one_bucket("a")], p)["jct_s"]["a"] for p in ("none", "tdm", "exclusive", "ideal")}
    assert jct["none"] == pytest.approx(3 * 11.05e-3)
    assert jct["tdm"] == pytest.approx(3 * 10.55e-3)
    assert jct["exclusive"] == jct["ideal"] == pytest.approx(jct["tdm"])


def test_two_jobs_exclusive_vs_tdm_hand_computed():
    jobs = [one_bucket("a"), one_bucket("b")]
    ex = simulate_jobs(jobs, "exclusive")["jct_s"]
    assert ex["a"] == pytest.approx(31.65e-3) and ex["b"] == pytest.approx(33.15e-3)  # b never aggregates
    # tdm: step 1 both ready at 10 ms, a wins the tie (job order), b runs ring and falls 0.5 ms behind;
    # step 2 b's op (21.05) is due inside a's window (20.55-21.10): a scores higher (no wait), b rings
    # again; step 3 b's op (32.10) comes after a's (31.10-31.65): the switch is free, b aggregates.
    r = simulate_jobs(jobs, "tdm")
    assert r["jct_s"]["a"] == pytest.approx(31.65e-3)
    assert r["jct_s"]["b"] == pytest.approx(32.65e-3)
    assert r["innet_ops"] == {"a": 3, "b": 1}
    assert r["avg_jct_s"] < simulate_jobs(jobs, "exclusive")["avg_jct_s"]
    # spatial: both share the switch at half rate every step (1.1 ms): slower than ring
    sp = simulate_jobs(jobs, "spatial")["jct_s"]
    assert sp["a"] == pytest.approx(3 * 11.10e-3) and sp["b"] == pytest.approx(sp["a"])


def test_hidden_allreduce_yields_to_exposed_one():
    # a's bucket (ready at 9.5 ms) is hidden under its 12 ms of compute; b's (ready at 9.8 ms, inside
    # a's in-network window 9.5-10.05) is exposed: a scores 0 and runs ring, b aggregates
    a = JobSpec("a", 1, (MB,), 0.012, starts_s=(0.0095,))
    b = JobSpec("b", 1, (MB,), 0.0098)
    r = simulate_jobs([a, b], "tdm")
    assert r["innet_ops"] == {"a": 0, "b": 1}
    assert r["jct_s"] == {"a": pytest.approx(12e-3), "b": pytest.approx(9.8e-3 + 0.55e-3)}
    greedy_first = simulate_jobs([a, JobSpec("b", 1, (MB,), 0.0098)], "exclusive")
    assert greedy_first["jct_s"]["b"] == pytest.approx(9.8e-3 + 1.05e-3)


def test_custom_durations_and_late_arrival():
    r = simulate_jobs([one_bucket("a", steps=2), one_bucket("b", steps=1, arrival=1.0)], "tdm",
                      ring_s=lambda n: 0.002, innet_s=lambda n: 0.001)
    assert r["jct_s"] == {"a": pytest.approx(0.022), "b": pytest.approx(0.011)}


def test_joining_job_reconstructs_a_step_exactly():
    # b arrives in the middle of a's step and only communicates long after a has finished: a's JCT is
    # the one-event value although its step was rebuilt op by op when b arrived
    p = workloads.profile("opt-125m")
    a = JobSpec("a", 3, p.sizes, p.sync, p.starts)
    alone = simulate_jobs([a], "tdm")["jct_s"]["a"]
    for policy in ("tdm", "mina", "greedy", "spatial"):
        late = JobSpec("b", 1, (MB,), 5.0, arrival_s=0.06)
        assert simulate_jobs([a, late], policy)["jct_s"]["a"] == pytest.approx(alone, rel=1e-12)


# -- the cluster --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    return {p: simulate(3, p, jobs=60, seed=1) for p in ("none", "ideal", "exclusive", "tdm", "mina")}


def test_scores_and_ordering(small):
    assert small["none"]["jct_score"] == pytest.approx(0.0, abs=1e-9)
    assert small["ideal"]["jct_score"] == pytest.approx(1.0)
    assert small["none"]["avg_jct_s"] == pytest.approx(small["tdm"]["avg_jct_none_s"])
    assert small["ideal"]["avg_jct_s"] == pytest.approx(small["tdm"]["avg_jct_ideal_s"])
    for p in ("exclusive", "tdm", "mina"):
        r = small[p]
        assert r["avg_jct_ideal_s"] - 1e-9 <= r["avg_jct_s"] <= r["avg_jct_none_s"] + 1e-9
        assert 0.0 <= r["innet_fraction"] <= 1.0
    assert small["tdm"]["jct_score"] >= small["exclusive"]["jct_score"]
    assert set(small["tdm"]) >= {"policy", "trace", "jobs", "avg_jct_s", "jct_score", "avg_jct_none_s",
                                 "avg_jct_ideal_s", "innet_fraction", "placement", "tree", "link_gbps", "seed"}


def test_comm_heavy_and_link_override():
    r = simulate(1, "tdm", jobs=30, setting="comm-heavy", placement="first-fit", tree="first-fit")
    assert r["link_gbps"] == 25.0 and r["avg_jct_none_s"] > 1.4 * r["avg_jct_ideal_s"]
    slow = simulate(1, "none", jobs=30, link_gbps=10.0)
    assert slow["link_gbps"] == 10.0 and slow["avg_jct_none_s"] > simulate(1, "none", jobs=30)["avg_jct_none_s"]


def test_deterministic_with_a_seed():
    a = simulate(2, "tdm", jobs=40, seed=7, placement="first-fit", tree="first-fit")
    assert simulate(2, "tdm", jobs=40, seed=7, placement="first-fit", tree="first-fit") == a
    assert simulate(2, "tdm", jobs=40, seed=8, placement="first-fit", tree="first-fit") != a


def test_progress_is_reported():
    seen = []
    simulate(1, "none", jobs=5, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (5, 5) and len(seen) == 5


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "fifo"}, "policy 'fifo'; valid: tdm, exclusive, spatial, mina, greedy, none, ideal"),
    ({"trace": 0}, "trace must be an integer in 1..10"),
    ({"trace": 11}, "trace must be an integer in 1..10"),
    ({"jobs": 0}, "jobs must be a positive integer"),
    ({"placement": "random"}, "placement 'random'; valid: first-fit, locality"),
    ({"tree": "best"}, "tree choice 'best'; valid: first-fit, least-load"),
    ({"setting": "huge"}, "setting 'huge'; valid: mina, comm-heavy"),
    ({"link_gbps": -1.0}, "link_gbps must be a positive number"),
])
def test_bad_inputs_name_the_valid_choices(kwargs, message):
    args = {"trace": 1, "policy": "tdm", "jobs": 5, **kwargs}
    with pytest.raises(TvmschedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simulate(**args)


def test_bad_job_specs():
    with pytest.raises(TvmschedError, match="valid: tdm"):
        simulate_jobs([one_bucket("a")], "best")
    with pytest.raises(TvmschedError, match="distinct job names"):
        simulate_jobs([one_bucket("a"), one_bucket("a")], "tdm")
    with pytest.raises(TvmschedError, match="one time per bucket"):
        simulate_jobs([JobSpec("a", 1, (MB, MB), 0.01, starts_s=(0.0,))], "tdm")
    with pytest.raises(TvmschedError, match="steps must be a positive integer"):
        simulate_jobs([JobSpec("a", 0, (MB,), 0.01)], "tdm")
    with pytest.raises(TvmschedError, match="cannot read host-count traces"):
        simulate(1, "tdm", jobs=5, traces_path="/nonexistent/traces.json")


def test_cli_simulate_prints_the_issue_schema_and_rejects_bad_input(tmp_path):
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "tvmsched.cli", "collectives", "simulate", "--trace", "2", "--policy", "exclusive", "--jobs", "40"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert {"policy": "exclusive", "trace": 2, "jobs": 40}.items() <= res.items()
    assert res["avg_jct_ideal_s"] <= res["avg_jct_s"] <= res["avg_jct_none_s"] and 0 <= res["jct_score"] <= 1
    bad = subprocess.run([*cmd[:-2], "--jobs", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr
    traces = tmp_path / "t.json"
    traces.write_text("[[[2, 1]], \"x\"]")
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "TVMSCHED_HOST_TRACES": str(traces)})
    assert bad.returncode == 2 and bad.stderr.startswith("error:"), bad.stderr
