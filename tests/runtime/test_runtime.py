"""Multi-tenant runtime on CPU: scheduler rules, progress bitmap, concurrent tenants, timeline, colocation profile."""

import asyncio
import json
import random
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_cli
from tvmsched import models
from tvmsched.artifact.format import Artifact
from tvmsched.errors import TvmschedError
from tvmsched.tune.kit_build import build_kit, import_results
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor, Runtime
from tvmsched.runtime.colocation import load_table
from tvmsched.tune.kit_run import measure_kit
from tvmsched.runtime.preemption import Task
from tvmsched.runtime.preemption import StreamState
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, LayerScheduler, StreamView, remaining_work, stream_work
from tvmsched.runtime.switching import footprint

FULL = 8


def cand(units, latency, key=None):
    return CandidateInfo(units, latency, key or f"m/{units}u")


LAYERS = [[cand(FULL, 100.0), cand(4, 130.0), cand(2, 220.0)], [cand(FULL, 50.0), cand(4, 60.0)]]


def test_idle_device_gets_the_fastest_candidate_of_every_layer():
    decision = LayerScheduler(ColocationTable(FULL)).choose("m", LAYERS, qos_ms=1.0, others=[])
    assert decision.candidate_ids == (0, 0) and decision.meets_qos
    assert decision.estimated_ms == pytest.approx(0.150)


def test_contended_device_picks_the_cheaper_colocation():
    other = StreamView("o", (cand(4, 1000.0, "o/4u"),))  # another stream holds 4 of 8 units for a while
    # fallback: all units beside 4 -> overhead (8 + 4 - 8) / 12 = 1/3, i.e. 1.5x slower; 4 units beside 4 -> 0
    decision = LayerScheduler(ColocationTable(FULL)).choose("m", LAYERS, qos_ms=1.0, others=[other])
    assert decision.candidate_ids == (1, 1)  # 130 < 100 x 1.5 and 60 < 50 x 1.5
    assert decision.estimated_ms == pytest.approx(0.190)
    # a profiled table overrides the fallback: here the full-unit kernel barely suffers (100 / 0.9 < 130)
    table = ColocationTable(FULL, {("m/8u", "o/4u"): 0.1})
    assert LayerScheduler(table).choose("m", LAYERS, qos_ms=1.0, others=[other]).candidate_ids == (0, 0)


def test_a_profile_covers_unprofiled_pairs_with_the_same_unit_counts():
    table = ColocationTable(FULL, {("m/8u", "o/4u"): 0.3, ("m/big", "o/4u"): 0.1})
    assert table.overhead(cand(FULL, 1.0, "m/other"), cand(4, 1.0, "o/other")) == pytest.approx(1 / 3)  # units unknown: fallback
    table.add_candidates([cand(FULL, 1.0, "m/8u"), cand(FULL, 1.0, "m/big"), cand(4, 1.0, "o/4u")])
    assert table.overhead(cand(FULL, 1.0, "m/other"), cand(4, 1.0, "o/other")) == pytest.approx(0.2)  # mean of both
    assert table.overhead(cand(FULL, 1.0, "m/8u"), cand(4, 1.0, "o/4u")) == 0.3  # the pair itself first
    assert table.overhead(cand(4, 1.0, "m/4u"), cand(4, 1.0, "o/x")) == 0.0  # no profile for (4, 4): fallback


def test_a_heavy_measured_interference_slows_the_estimate_without_bound():
    # measured r = 0.98: a fully overlapped run takes latency / (1 - r) = 50x longer
    table = ColocationTable(FULL, {("m/8u", "o/4u"): 0.98})
    assert table.colocated_us(cand(FULL, 100.0), [cand(4, 1.0, "o/4u")]) == pytest.approx(5000.0)
    assert table.colocated_us(cand(FULL, 100.0), [cand(4, 1.0, "o/4u")] * 2) == pytest.approx(100.0 / 0.01)  # capped


def test_other_streams_are_followed_through_time_and_qos_is_checked():
    # the other stream finishes after 120 us: the second layer runs alone, so it takes the fastest candidate
    other = StreamView("o", (cand(4, 120.0, "o/4u"),))
    decision = LayerScheduler(ColocationTable(FULL)).choose("m", LAYERS, qos_ms=0.1, others=[other])
    assert decision.candidate_ids == (1, 0)
    assert not decision.meets_qos  # 130 + 50 us > 100 us: reported at risk


def test_the_monitor_keeps_the_unfinished_share_of_a_running_layer():
    # layer 0 done, layer 1 has 3 of 4 blocks done, layer 2 not started; candidate 1 chosen for layer 1
    layers = [[cand(FULL, 100.0)], [cand(FULL, 40.0), cand(4, 80.0)], [cand(FULL, 10.0)]]
    remaining = remaining_work(layers, np.array([5, 3, 0]), np.array([5, 4, 2]), [0, 1, 0])
    assert [(c.units, c.latency_us) for c in remaining] == [(4, 20.0), (FULL, 10.0)]
    assert remaining_work(layers, np.array([5, 9, 2]), np.array([5, 4, 2]), None) == ()  # re-run blocks: capped
    # queued requests follow the running one, each with its own candidates, up to the lookahead
    state = StreamState(np.array([5, 3, 0]), np.array([5, 4, 2]), [0, 1, 0], [[0, 0, 0], None, [0, 1, 0]])
    work = stream_work(layers, state, lookahead=2)
    assert [c.latency_us for c in work] == [20.0, 10.0, 100.0, 40.0, 10.0, 100.0, 40.0, 10.0]


def test_a_request_behind_its_own_stream_is_estimated_from_when_it_starts():
    # the other stream holds 4 units for 200 us; this stream's earlier work ends at 150 us
    other = StreamView("o", (cand(4, 200.0, "o/4u"),))
    decision = LayerScheduler(ColocationTable(FULL)).choose("m", LAYERS, qos_ms=1.0, others=[other], start_us=150.0)
    assert decision.candidate_ids == (1, 0)  # first layer beside the other (150..280 us), second alone
    assert decision.estimated_ms == pytest.approx((150.0 + 130.0 + 50.0) / 1e3)


@pytest.fixture(scope="module")
def kit_artifacts(_cache, tmp_path_factory):
    """`kit_artifacts(name, progress_counters=False)`: the path of mlp or resnet18-small compiled with a 2-thread and a
    1-thread candidate per layer from the records of a CPU kit measured at 1 and 2 threads (candidates from measured kit
    records are what these tests read). ~1 min on 2 cores with the kits, once per run: the kits' databases and the
    artifacts are shared cache entries, so test_engine_runtime and the asynchronous pass of `make test` take them (it
    tests the engine, not the kit)."""
    tmp = tmp_path_factory.mktemp("rt")

    def database(name: str) -> str:
        def make(path: Path) -> None:
            kit = tmp_path_factory.mktemp("kit") / name
            build_kit(models.build(name), kit, target="llvm", samples=2, progress=False)
            import_results(kit, measure_kit(kit, [1, 2], repeat=2, progress=False), f"sqlite:///{kit}.db")
            with sqlite3.connect(f"{kit}.db") as source, sqlite3.connect(path) as copy:
                source.backup(copy)  # one file, whatever the store's journal left beside it

        mine = tmp / f"{name}.db"  # a writable copy (the cache's entries are read only)
        if not mine.exists():
            shutil.copyfile(_cache.derived(f"test_runtime: {name}'s kit of 2 samples measured at [1, 2] threads", ".db",
                                           make), mine)
            mine.chmod(0o644)
        return f"sqlite:///{mine}"

    def kit_artifact(name: str, progress_counters: bool = False) -> Path:
        def make(path: Path) -> None:
            compile_model(models.build(name), name=name, qos_ms=1000.0, database=database(name),
                          progress_counters=progress_counters).save(path)

        return _cache.derived(f"test_runtime: {name} from a kit of 2 samples measured at [1, 2] threads, "
                              f"qos_ms=1000, progress_counters={progress_counters}", ".tvms", make)

    return kit_artifact


@pytest.fixture(scope="module")
def artifacts(kit_artifacts):
    """{name: (model, artifact)} of mlp and resnet18-small from `kit_artifacts`."""
    return {name: (models.build(name), Artifact.load(kit_artifacts(name))) for name in ("mlp", "resnet18-small")}


def test_progress_bitmap_holds_the_blocks_each_layer_launched(artifacts):
    _, artifact = artifacts["resnet18-small"]
    executor = Executor(artifact)
    task = Task(executor, "t")
    ids = [len(layer.candidates) - 1 for layer in artifact.manifest.layers]
    blocks = [artifact.manifest.layers[i].candidates[c].blocks for i, c in enumerate(ids)]
    futures = [task.submit(executor.random_inputs(0), ids) for _ in range(6)]
    rng, prefixes = random.Random(3), set()
    while not futures[-1].done():  # paused mid-request: completed layers hold their blocks, the rest 0
        time.sleep(rng.uniform(0, 0.003))
        task.preempt()
        state = task.state()
        if state is not None and (state.done >= 0).all():
            k = int((state.done > 0).sum())
            assert state.done[:k].tolist() == blocks[:k] and not state.done[k:].any() and state.ids == ids
            assert state.blocks.tolist() == blocks
            prefixes.add(k)
        task.resume()
    assert len(prefixes) > 1  # seen at several points of a request
    assert task.state() is None  # finished: no running request, entries invalid
    task.close()


def test_kernel_counters_fill_the_bitmap_with_the_blocks_each_layer_ran(kit_artifacts, reference):
    model, artifact = models.build("resnet18-small"), Artifact.load(kit_artifacts("resnet18-small", progress_counters=True))
    executor = Executor(artifact)
    task = Task(executor, "t")
    counted, states = [], []
    original = executor.run_layer

    def spy(index, candidate_id=0):
        counted.append(executor.completed_blocks(ids))  # what the kernels themselves wrote so far
        states.append(task.state())
        original(index, candidate_id)

    executor.run_layer = spy
    ids = [i % len(layer.candidates) for i, layer in enumerate(artifact.manifest.layers)]
    inputs = models.random_inputs(model, seed=4)
    outputs = task.submit(inputs, ids).result(timeout=60)
    blocks = [artifact.manifest.layers[i].candidates[c].progress_blocks for i, c in enumerate(ids)]
    assert max(blocks) > 1  # tuned kernels: parallel loops, one count per iteration
    for index, (kernel_counts, state) in enumerate(zip(counted, states)):
        assert kernel_counts[:index] == blocks[:index] and not any(kernel_counts[index:])
        assert state.done[:index].tolist() == blocks[:index] and state.blocks.tolist() == blocks and state.queued == []
    assert executor.completed_blocks(ids) == blocks
    for name, want in reference(model, inputs).items():
        np.testing.assert_allclose(outputs[name], want, rtol=1e-4, atol=1e-4)
    task.close()


def test_tenants_on_several_threads_all_get_correct_outputs_and_a_bad_one_fails_alone(artifacts, tmp_path, reference):
    rt = Runtime("cpu", timeline=True)
    handles = {name: rt.load(artifact, qos_ms=1000.0, priority="realtime" if name == "mlp" else "best_effort")
               for name, (_, artifact) in artifacts.items()}
    expected = {}
    for name, (model, _) in artifacts.items():
        inputs = models.random_inputs(model, seed=5)
        expected[name] = (inputs, reference(model, inputs))
    failures, bad = [], []

    def client(name, n):
        inputs, reference = expected[name]
        for _ in range(n):
            outputs = rt.submit(handles[name], inputs).result(timeout=120)
            for key, value in reference.items():
                if not np.allclose(outputs[key], value, rtol=1e-4, atol=1e-5):
                    failures.append(name)

    def bad_client():
        for _ in range(3):
            try:
                rt.submit(handles["mlp"], {"wrong": np.zeros(2)}).result(timeout=60)
            except TvmschedError as err:
                bad.append(str(err))

    threads = [threading.Thread(target=client, args=(name, 6)) for name in artifacts for _ in range(2)]
    threads.append(threading.Thread(target=bad_client))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and len(bad) == 3 and "input names do not match" in bad[0]
    outputs = asyncio.run(rt.infer("mlp", expected["mlp"][0]))
    assert np.allclose(outputs["output"], expected["mlp"][1]["output"], rtol=1e-4, atol=1e-5)
    stats = rt.stats()
    assert stats["mlp"]["requests"] == 13 and stats["mlp"]["errors"] == 3 and stats["resnet18-small"]["requests"] == 12
    # one decision per launched request (a stream asks the policy when it takes one): the bad ones never queued
    assert stats["_scheduler"]["decisions"] == 25 and stats["_scheduler"]["p99_us"] > 0
    events = rt.export_timeline(tmp_path / "trace.json", tmp_path / "trace.png")
    trace = json.loads((tmp_path / "trace.json").read_text())
    completed = sum(s["launches"] - s["reruns"] for k, s in stats.items() if not k.startswith("_"))  # aborted runs are not drawn
    assert events == len(trace["traceEvents"])
    assert len([e for e in trace["traceEvents"] if e["cat"] != "switch"]) == completed  # + the stages of each load
    assert {e["tid"] for e in trace["traceEvents"] if e["cat"] != "switch"} == {"mlp", "resnet18-small"} and (tmp_path / "trace.png").stat().st_size > 0
    rt.shutdown()
    with pytest.raises(TvmschedError, match="shut down"):
        rt.submit("mlp", expected["mlp"][0])


def test_profile_coloc_writes_a_table_the_scheduler_reads(artifacts, tmp_path, cli):
    paths = []
    for name, (_, artifact) in artifacts.items():
        artifact.save(tmp_path / f"{name}.tvms")
        paths.append(tmp_path / f"{name}.tvms")
    db = f"sqlite:///{tmp_path / 'tuning.db'}"
    out = cli("profile-coloc", *paths, "-o", tmp_path / "coloc.json", "--db", db, "--seconds", "0.05")
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "coloc.json").read_text())
    heavy = {name: max(a.manifest.layers, key=lambda l: l.candidates[0].latency_us) for name, (_, a) in artifacts.items()}
    assert len(rows) == 2 * len(heavy["mlp"].candidates) * len(heavy["resnet18-small"].candidates)
    assert all(r["colocated_us"] > 0 and r["isolated_us"] > 0 and r["overhead_per_unit_time"] >= 0 for r in rows)
    table = load_table(tmp_path / "coloc.json", total_units=2)
    assert len(table.measured) == len(rows)
    stored = Runtime("cpu", colocation=db).scheduler.table  # the profile as stored in the tuning database
    assert stored.measured == pytest.approx(table.measured)
    from_file = Runtime("cpu", colocation=str(tmp_path / "coloc.json")).scheduler.table  # the JSON alone (the GPU kit)
    assert from_file.measured == pytest.approx(table.measured)
    assert run_cli("profile-coloc", paths[0], "--db", db).returncode == 2
    nodb = cli("profile-coloc", *paths, "--no-store", "-o", tmp_path / "only.json", "--seconds", "0.05")
    assert nodb.returncode == 0 and "to " in nodb.stdout and len(json.loads((tmp_path / "only.json").read_text())) == len(rows)
    assert run_cli("profile-coloc", *paths, "--no-store").returncode == 2  # it would go nowhere
    with pytest.raises(TvmschedError, match="no colocation profile at"):
        Runtime("cpu", colocation=str(tmp_path / "missing.json"))


def test_example_server_answers_on_127_0_0_1(artifacts, tmp_path, reference):
    import sys

    import httpx

    from tests.helpers import free_port, start_server, stop_server

    model, artifact = artifacts["mlp"]
    artifact.save(tmp_path / "mlp.tvms")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server([sys.executable, "examples/server.py", "--model", f"mlp={tmp_path / 'mlp.tvms'}:1000",
                           "--port", str(port), "--colocation", f"sqlite:///{tmp_path / 'coloc.db'}"], base)
    try:
        inputs = models.random_inputs(model, seed=6)
        reply = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {k: v.tolist() for k, v in inputs.items()}}, timeout=60)
        assert reply.status_code == 200
        expected = reference(model, inputs)["output"]
        assert np.allclose(np.array(reply.json()["outputs"]["output"]), expected, rtol=1e-4, atol=1e-5)
        bad = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {"nope": [1, 2]}}, timeout=60)
        assert bad.status_code == 400 and "input names do not match" in bad.json()["detail"]
        assert httpx.post(f"{base}/v1/models/none/infer", json={"inputs": {}}, timeout=60).status_code == 404
        assert httpx.get(f"{base}/v1/stats", timeout=10).json()["mlp"]["requests"] == 1
    finally:
        stop_server(server)


def test_warm_up_runs_every_candidate_kernel_once_before_the_first_request(artifacts):
    model, artifact = artifacts["mlp"]
    layers = artifact.manifest.layers
    assert max(len(layer.candidates) for layer in layers) >= 2  # the 2-thread and 1-thread kernels
    with Runtime("cpu", timeline=True) as rt:
        cold = rt.load(artifact, name="cold")
        warm = rt.load(artifact, name="warm", warmup=True)
        assert warm.warm and not cold.warm and cold.task.timeline == []
        ran = {(layer, cand) for _, layer, cand, _, _ in warm.task.timeline}
        assert ran == {(layer.index, c) for layer in layers for c in range(len(layer.candidates))}
        x = warm.task.executor.random_inputs(3)
        want = Executor(artifact).run(x)
        got = rt.submit("warm", x).result(timeout=60)
        # the policy may pick another candidate than Executor.run's first (1 vs 2 threads: another summation order)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_model_on_several_streams_serves_concurrent_requests_side_by_side(artifacts):
    """Runtime.load(streams=2): a real-time model's requests submitted together go to the stream with the fewest
    pending, so they run on both (each with its own activations, both reading one copy of the weights: the model is
    resident, outside the switcher); answers are the plain run's (the fastest policy: the same candidates);
    unloading frees all of it, though the caller still holds the model."""
    _, artifact = artifacts["resnet18-small"]
    executor = Executor(artifact)
    inputs = [executor.random_inputs(seed) for seed in range(3)]
    with Runtime("cpu", policy="fastest") as rt:
        base = rt.memory()["in_use"]
        served = rt.load(artifact, name="rt", priority="realtime", streams=2, warmup=True)
        assert len(served.tasks) == 2 and served.placement == "resident"
        assert base < rt.memory()["in_use"] < base + 1.5 * footprint(Executor(artifact, register_groups=1))  # one copy
        want = [executor.run(x, list(served.fastest)) for x in inputs]
        futures = [rt.submit(served, inputs[i % 3]) for i in range(30)]
        for i, future in enumerate(futures):
            got = future.result(timeout=120)
            for k in want[i % 3]:
                np.testing.assert_array_equal(got[k], want[i % 3][k])
        warm_runs = max(len(cands) for cands in served.layers)  # each stream's warm-up requests
        completed = [task.counts()["completed"] - warm_runs for task in served.tasks]
        assert sum(completed) == 30 and min(completed) > 0, completed
        rt.unload(served)
        assert rt.memory()["in_use"] == base
        for streams in (0, 65, 1.5, True):
            with pytest.raises(TvmschedError, match="streams must be a whole number from 1 to 64"):
                rt.load(artifact, name="bad", streams=streams)


def test_requests_queue_on_their_model_and_a_free_stream_of_it_takes_them(artifacts):
    """A model on two streams (rt, rt#1): requests queue on the model, not on a stream chosen at submit, so with rt
    paused every request runs on rt#1 and none waits for rt's resume; the colocation policy decides each when rt#1 takes
    it (one decision per request; its choices with other streams busy match the Python policies': test_policies_engine)."""
    _, artifact = artifacts["resnet18-small"]
    executor = Executor(artifact)
    x = executor.random_inputs(0)
    with Runtime("cpu", policy="colocation") as rt:
        served = rt.load(artifact, name="rt", streams=2)
        assert any(len(cands) > 1 for cands in served.layers)  # a choice to make: the policy reads the monitor
        served.tasks[0].preempt(abort=False)  # rt paused while idle
        decided = rt.stats()["_scheduler"]["decisions"]
        futures = [rt.submit(served, x) for _ in range(3)]
        want = executor.run(x)
        for future in futures:  # all three finish while rt is still paused
            got = future.result(timeout=60)
            for k in want:  # the policy may choose other candidates (1 or 2 threads): another summation order
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
        assert served.tasks[0].paused
        assert [task.counts()["completed"] for task in served.tasks] == [0, 3]
        assert rt.stats()["_scheduler"]["decisions"] == decided + 3
        served.tasks[0].resume()
        rt.submit(served, x).result(timeout=60)
