"""Tuning whole models: each distinct workload tuned once, a time budget (--tune-minutes), the default
schedule as the search's seed and as the floor (tuning never ends slower than the default)."""

import functools
import itertools
import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import assert_user_error, run_cli
from tvmsched import models, pipeline
from tvmsched.tune import search as tuning
from tvmsched.tune import worker_pools
from tvmsched.models.common import GraphBuilder, dense, make_model
from tvmsched.runtime import Executor

TRIALS = 8
REPEATS = 4  # identical Gemm+Relu layers


def repeated_model(repeats: int = REPEATS, width: int = 64) -> onnx.ModelProto:
    """`repeats` Gemm+Relu layers of the same shape (different weights), then Softmax: two workloads."""
    g = GraphBuilder(0)
    x = "input"
    for i in range(repeats):
        x = g.op("Relu", [dense(g, x, f"fc{i}", width, width)], f"fc{i}.relu")
    g.op("Softmax", [x], "output", axis=-1)
    return make_model(g, "repeated", {"input": [1, width]}, {"output": [1, width]})


def stand_in_seed(func, target):
    """A default schedule to seed with that does not depend on tvmsched.lower.cpu_schedule's current rules."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.parallel", 2)
    return sch


def fake_timer(default_us: float, tuned_us: float):
    """`_layer_timer` stand-in: tune_model measures a workload's default schedule first, then its tuned one."""
    calls = defaultdict(itertools.count)
    return lambda graph, target: lambda name, func: default_us if next(calls[name]) == 0 else tuned_us


def check_against_onnxruntime(artifact, model, reference) -> None:
    inputs = models.random_inputs(model, seed=3)
    expected = reference(model, inputs)["output"]
    np.testing.assert_allclose(Executor(artifact).run(inputs)["output"], expected, rtol=1e-4, atol=1e-5)


# ---- no tuning needed ---------------------------------------------------------------------------------------


def test_equal_primfuncs_group_into_one_workload():
    import tvm

    model = repeated_model()
    graph, funcs, _ = pipeline.lower_model(model)
    (fc,) = [name for name in funcs if "matmul" in name]
    copy = tvm.ir.load_json(tvm.ir.save_json(funcs[fc])).with_attr("global_symbol", "another_name")
    groups = tuning.group_workloads({**funcs, "fc_copy": copy}, {fc: 4, "fc_copy": 2})
    assert [(w.name, w.members, w.layers) for w in groups] == [(fc, (fc, "fc_copy"), 6), ("softmax", ("softmax",), 1)]
    assert len(graph.layers) == REPEATS + 1  # Relax already shares one PrimFunc among the identical layers


def test_two_schedules_of_a_layer_are_timed_cold_side_by_side():
    """The keep-or-drop timing flushes the caches of all but the first argument before every run (TVM's
    cache_flush_cpu_non_first_arg): each kernel gets COLD_RUNS single-run samples, warm or cold alike valid."""
    from tvmsched.tune.candidates import cpu_units
    from tvmsched.lower.layers import arg_specs

    graph, funcs, target = pipeline.lower_model(repeated_model(width=256))
    defaults = pipeline.kernels.default_schedule(funcs, target)
    name = next(iter(funcs))
    entries = [(defaults[name], arg_specs(graph)[name]), (funcs[name], arg_specs(graph)[name])]
    from tvmsched.tune.local_timing import measure_together

    cold = measure_together(entries, target, cpu_units(target), repeat=3, cold=True)
    warm = measure_together(entries, target, cpu_units(target), repeat=3)
    assert all(math.isfinite(us) and us > 0 for us in cold + warm), (cold, warm)
    timer = pipeline._layer_timer(graph, target)
    assert timer.COLD_RUNS >= 10 and all(us > 0 for us in timer.pair(name, defaults[name], funcs[name]))


def test_budget_split_follows_the_weights():
    assert tuning.budget_share(60, 3, 4, 1.0) == (45, 45.0)  # 3/4 of the minute at one trial per second
    assert tuning.budget_share(60, 1, 4, 1.0) == (15, 15.0)
    assert tuning.budget_share(60, 1, 100, 1.0)[0] == tuning.MIN_TRIALS  # a small share still gets the minimum
    assert tuning.budget_share(600, 1, 1, 1.0, cap=32) == (32, 600.0)  # --tune-trials caps it


def test_search_stops_before_an_iteration_that_would_pass_the_deadline():
    import time

    now = time.monotonic()
    assert tuning._Stopper(now - 1, None, 16)() is True  # the deadline has passed: not even one iteration
    fresh = tuning._Stopper(now + 60, now + 30, 16)
    assert fresh() is False  # the first iteration always runs
    fresh.started, fresh.measured = now - 20, 16  # 20 s for 16 trials: the next iteration ends at ~+20 s
    assert fresh() is False
    fresh.started = now - 40  # ... at ~+40 s, past its share (+30 s)
    assert fresh() is True and fresh.stopped_by == "share"
    late = tuning._Stopper(now + 10, None, 16)
    late.started, late.measured = now - 20, 16  # ends at ~+20 s, past the model's deadline
    assert late() is True and late.stopped_by == "deadline"


def test_bad_budgets_are_user_errors(tmp_path, capsys, monkeypatch):
    from tvmsched.cli.main import main

    model = tmp_path / "m.onnx"
    onnx.save(repeated_model(), model)
    cases = {
        ("--tune-minutes", "0"): "positive number of minutes",
        ("--tune-minutes", "nan"): "positive number of minutes",
        ("--tune-minutes", "inf"): "positive number of minutes",
        ("--tune-minutes", "soon"): "not a valid float",
        ("--tune-minutes", "1", "--qos-ms", "5"): "--qos-ms",
        ("--tune-trials", "-3"): "--tune-trials must be >= 0",
    }
    for args, fragment in cases.items():
        assert main(["compile", str(model), *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], (args, err)
    assert not list(tmp_path.glob("*.tvms"))
    assert_user_error(run_cli("compile", model, "--tune-minutes", "-1"), "--tune-minutes", "not -1")
    for bad in ("0", "ten", "-5"):  # how long MetaSchedule times each candidate
        monkeypatch.setenv("TVMSCHED_TUNE_MEASURE_MS", bad)
        assert main(["compile", str(model), "--tune-trials", "2"]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: TVMSCHED_TUNE_MEASURE_MS={bad!r} is not a whole number of milliseconds from 1 to 60000"], err


# ---- real MetaSchedule tuning into real SQLite databases ----------------------------------------------------


def test_each_workload_is_tuned_once_seeded_and_kept_only_when_faster(tmp_path, monkeypatch, reference):
    model, db = repeated_model(), f"sqlite:///{tmp_path / 'tuning.db'}"
    from tvmsched.tuning_db import open_store

    monkeypatch.setattr(tuning, "default_seed_schedule", lambda target: stand_in_seed)
    monkeypatch.setattr(tuning, "tune_model", functools.partial(tuning.tune_model, work_dir=str(tmp_path / "ms")))
    monkeypatch.setattr(pipeline, "_layer_timer", fake_timer(default_us=1e6, tuned_us=1.0))  # tuned wins
    first = pipeline.compile_model(model, tune_trials=TRIALS, database=db)
    summary = first.manifest.tuning
    assert (summary["workloads"], summary["layer_count"], summary["seeded"]) == (2, REPEATS + 1, 2)
    entries = list(summary["layers"].values())
    assert [(e["status"], e["kernel"], e["layers"]) for e in entries] == [("tuned", "tuned", REPEATS), ("tuned", "tuned", 1)]
    assert all(e["seeded"] and 0 < e["trials"] <= TRIALS and e["best_us"] == e["tuned_us"] == 1.0 for e in entries)
    stats = open_store(db).stats()
    assert stats == {**stats, "workloads": 2, "records": summary["trials"] + 2}  # each workload once, plus its seed
    assert [layer.candidates[0].schedule for layer in first.manifest.layers] == ["tuned"] * (REPEATS + 1)
    check_against_onnxruntime(first, model, reference)
    for workload in summary["layers"]:  # MetaSchedule's search started from the seeded default schedule
        log = "".join(p.read_text() for p in (tmp_path / "ms" / workload / "logs").glob("*task_0*"))
        assert "Picked top 1 candidate(s) from database" in log, workload

    monkeypatch.setattr(pipeline, "_layer_timer", fake_timer(default_us=1.0, tuned_us=2.0))  # now the default wins
    second = pipeline.compile_model(model, tune_trials=TRIALS, database=db)
    entries = list(second.manifest.tuning["layers"].values())
    assert [(e["status"], e["kernel"], e["trials"], e["best_us"]) for e in entries] == [("cached", "default", 0, 1.0)] * 2
    assert open_store(db).stats()["records"] == stats["records"]
    assert {layer.candidates[0].schedule for layer in second.manifest.layers} == {"default"}
    check_against_onnxruntime(second, model, reference)

    # the database alone (no trials, no budget): its records, kept where faster, and no search
    monkeypatch.setattr(pipeline, "_layer_timer", fake_timer(default_us=3.0, tuned_us=2.0))
    third = pipeline.compile_model(model, database=db)
    assert third.manifest.tuning["records_only"] and third.manifest.tuning["trials"] == 0
    entries = list(third.manifest.tuning["layers"].values())
    assert [(e["status"], e["kernel"], e["trials"], e["best_us"]) for e in entries] == [("cached", "tuned", 0, 2.0)] * 2
    assert open_store(db).stats()["records"] == stats["records"]
    assert {layer.candidates[0].schedule for layer in third.manifest.layers} == {"tuned"}
    check_against_onnxruntime(third, model, reference)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    fourth = pipeline.compile_model(model, database=empty)
    entries = list(fourth.manifest.tuning["layers"].values())
    assert [(e["status"], e["kernel"], e["message"]) for e in entries] == [("skipped", "default", "no tuned record in the database")] * 2
    assert open_store(empty).stats()["records"] == 0
    check_against_onnxruntime(fourth, model, reference)


def test_budget_stops_at_the_deadline_and_keeps_the_faster_kernel(tmp_path, cli, monkeypatch):
    model, db = tmp_path / "repeated.onnx", f"sqlite:///{tmp_path / 'budget.db'}"
    onnx.save(repeated_model(), model)
    monkeypatch.setenv("TVMSCHED_TUNE_MEASURE_MS", "100")  # MetaSchedule's default, not the suite's 10: the deadline bites
    worker_pools.shutdown_idle()  # and its build workers start in it, as in a `tvmsched compile` (none kept from before)
    budget_min = 0.1  # 6 s: about one search iteration on a 2-core machine
    result = cli("compile", model, "-o", tmp_path / "r.tvms", "--tune-minutes", budget_min, "--db", db)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads(cli("inspect", tmp_path / "r.tvms", "--json").stdout)
    summary = manifest["tuning"]
    assert summary["tune_minutes"] == budget_min and summary["trials_per_layer"] is None
    assert summary["deadline_hit"] and summary["workloads"] == 2
    entries = summary["layers"]
    assert {e["status"] for e in entries.values()} <= {"tuned", "default-kept", "fallback", "skipped"}
    assert any(e["status"] == "skipped" for e in entries.values()) or all(e["trials"] for e in entries.values())
    for e in entries.values():  # no workload ran past its first iteration
        assert e["trials"] <= min(e["planned_trials"], tuning.BUDGET_TRIALS_PER_ITER), e
    records = json.loads(cli("db", "stats", "--db", db, "--json").stdout)["records"]
    assert records == summary["trials"] + summary["seeded"] == sum(e["trials"] + e["seeded"] for e in entries.values())
    # no workload started after the deadline: every one that ran started before it, after the searches of those
    # that ran before it, so all searches but one (the last started, at most the longest) fit in the budget. Measured
    # by the searches' own times, not the wall clock: true however slow the machine (a slow one skips workloads)
    searched = [e["seconds"] for e in entries.values() if e["status"] != "skipped"]
    assert sum(searched) - max(searched, default=0) <= budget_min * 60 + 0.1, searched
    # the kernel kept is the faster one as measured (the default where tuning did not beat it or did not run)
    for name, e in entries.items():
        if e["tuned_us"] is not None and e["default_us"] is not None:
            assert e["kernel"] == ("tuned" if e["tuned_us"] < e["default_us"] else "default"), e
            assert math.isclose(e["best_us"], min(e["tuned_us"], e["default_us"]), rel_tol=1e-6)
        else:
            assert e["kernel"] == "default"
        schedules = {layer["candidates"][0]["schedule"] for layer in manifest["layers"] if layer["func"] == name}
        assert schedules == ({"tuned"} if e["kernel"] == "tuned" else {"default"}), (name, schedules)
    described = cli("inspect", tmp_path / "r.tvms").stdout
    assert "2 distinct workloads in 5 layers" in described and "trials/min" in described
    assert "for 2 distinct workloads in 5 layers" in result.stdout

    again = cli("compile", model, "-o", tmp_path / "again.tvms", "--db", db)  # --db alone: its records, no search
    assert again.returncode == 0, again.stderr[-3000:]
    replayed = json.loads(cli("inspect", tmp_path / "again.tvms", "--json").stdout)["tuning"]
    assert replayed["records_only"] and replayed["trials"] == 0 and replayed["tune_minutes"] is None
    assert json.loads(cli("db", "stats", "--db", db, "--json").stdout)["records"] == records
    expected = {"tuned": {"cached"}, "skipped": {"skipped"}, "default-kept": {"cached", "skipped"}}  # kept: maybe no record but the seed
    for name, e in entries.items():  # a workload whose search won has its records; a skipped one has none
        if e["status"] in expected:
            assert replayed["layers"][name]["status"] in expected[e["status"]], (e, replayed["layers"][name])
    skipped = sum(e["status"] == "skipped" for e in replayed["layers"].values())
    assert (f"{skipped} had no record" in again.stdout) == bool(skipped), again.stdout
    cached = [e for e in replayed["layers"].values() if e["status"] == "cached"]
    ran = sum(e["kernel"] == "tuned" for e in cached)
    assert not cached or f"{len(cached)} from the database ({ran} run a record's kernel" in again.stdout, again.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_busy_tuning_workers_die_with_a_killed_compile():
    """A compile killed (SIGKILL, a timeout) while a build worker is busy left that worker running under init
    until its job ended: found after CI runs. The workers now die with the process that started them."""
    script = textwrap.dedent("""
        import os, signal, time
        from tvmsched.tune import search as tuning
        builder = tuning.pooled_builder(max_workers=1)
        print(builder.pool.submit(os.getpid).result(), flush=True)
        builder.pool.submit(time.sleep, 120)  # the worker is busy when its parent dies
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    worker = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 300  # a hang guard: the loop ends as soon as the worker is gone
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.2)
    assert not _alive(worker), f"build worker {worker} outlived its parent"


def test_a_finished_tuning_s_build_workers_serve_the_next_one_and_stop_when_left_idle(monkeypatch):
    """A build pool given back (`close`) is taken by the next tuning in the process (the same worker process builds),
    a second pool at once gets workers of its own, and a pool left idle is shut down (its worker exits)."""
    import os

    monkeypatch.setattr(worker_pools, "IDLE_S", 1.0)
    first = tuning.pooled_builder(max_workers=1)
    worker = first.pool.submit(os.getpid).result()
    first.close()
    second = tuning.pooled_builder(max_workers=1)
    beside = tuning.pooled_builder(max_workers=1)  # taken while the second holds the kept one
    try:
        assert second.pool.submit(os.getpid).result() == worker
        other = beside.pool.submit(os.getpid).result()
        assert other not in (worker, os.getpid())
    finally:
        second.close()  # kept (nothing else of its kind is idle) ...
        beside.close()  # ... so this one is shut down at once
    deadline = time.monotonic() + 60  # a hang guard: the kept pool stops after about a second idle
    while time.monotonic() < deadline and (_alive(worker) or _alive(other)):
        time.sleep(0.1)
    assert not _alive(other) and not _alive(worker), f"idle build workers {worker}, {other} kept running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone (between the open and the read: ESRCH)
        return False


def test_metaschedule_leaves_the_process_logging_as_found(tmp_path):
    """Each tune runs MetaSchedule's create_loggers (tvm.s_tir.meta_schedule.logging.get_loggers_from_work_dir): it must
    not meet an unnamed handler (a second tune in one process crashed on one), and what it adds must not outlive the
    tune, while the host's own handlers come back."""
    import io
    import logging

    from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    host = logging.StreamHandler(io.StringIO())  # unnamed, as pytest's and most applications' handlers are
    logger.addHandler(host)
    try:
        before = (list(logger.handlers), logger.level, logger.propagate)
        for attempt in range(2):
            with tuning.ms_logging_isolated():
                (task,) = get_loggers_from_work_dir(str(tmp_path / str(attempt)), ["main"])
                assert host not in logger.handlers and logger.handlers and task.handlers
                files = [h for h in task.handlers if isinstance(h, logging.FileHandler)]
            assert files and all(h.stream is None for h in files)  # closed: no log file left open
            assert not task.handlers and (list(logger.handlers), logger.level, logger.propagate) == before
    finally:
        logger.removeHandler(host)


def test_the_getmodule_memo_answers_as_inspect_does_and_is_put_back():
    """tvmsched memoizes inspect.getmodule while TVM's TVMScript-defined tensor intrinsics load (45 s -> 7 s): same
    answers for frames of pseudo-files and of real files, nested uses share it, and inspect gets its own back."""
    import inspect

    original = inspect.getmodule
    here, scope = sys._getframe(), {}
    exec(compile("import sys\nframe = sys._getframe()", "<ast>", "exec"), scope)  # a frame as TVMScript's evaluator makes
    from tvmsched.lower.intrinsics import inspect_getmodule_memoized

    with inspect_getmodule_memoized():
        with inspect_getmodule_memoized():
            memoized = inspect.getmodule
            assert memoized is not original
            for _ in range(2):
                assert memoized(scope["frame"], "<ast>") is original(scope["frame"], "<ast>")
                assert memoized(here, here.f_code.co_filename) is original(here, here.f_code.co_filename) is sys.modules[__name__]
        assert inspect.getmodule is memoized
    assert inspect.getmodule is original


def test_the_cost_model_trains_only_once_its_predictions_are_used():
    """MetaSchedule's XGBModel predicts at random below `num_warmup_samples` measured candidates but trained after
    every batch anyway (~1 s each on 2 cores, for a model nobody used); tuning.cost_model keeps the data and trains
    once warm, whatever the adaptive-training rule says about the skipped rounds."""
    model = tuning.cost_model(1)
    rng = np.random.default_rng(0)
    xs, ys = [rng.random((4, 16), dtype="float32") for _ in range(8)], rng.random(8, dtype="float32")  # 8 candidates
    model._inst.data_size = model.num_warmup_samples - 1
    model._inst.last_train_size = model.data_size
    model._train(xs, ys)
    assert model.booster is None and model.last_train_size == 0
    model._inst.data_size = model.num_warmup_samples
    model._train(xs, ys)
    assert model.booster is not None
