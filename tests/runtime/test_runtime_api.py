"""The Python Runtime as a typed wrapper over the engine's (runtime/runtime.py): its public API (submit, infer,
several streams, unload, deadlines, stats, timeline) in both CPU modes."""

import asyncio
import json

import numpy as np
import pytest

from tvmsched.errors import TvmschedError
from tvmsched.runtime import Runtime


def test_submit_and_infer_on_several_streams_match_a_direct_run_bit_for_bit(mlp, mlp_run, tmp_path):
    inputs, want = mlp_run
    with Runtime("cpu", timeline=True) as rt:
        model = rt.load(mlp, streams=2, warmup=True)
        assert [t.name for t in model.tasks] == ["mlp", "mlp#1"] and model.placement == "resident"  # (held: shared)
        futures = [rt.submit(model, inputs) for _ in range(30)]
        outputs = [f.result(timeout=60) for f in futures] + [asyncio.run(rt.infer("mlp", inputs))]
        assert all(np.array_equal(o["output"], want["output"]) for o in outputs)
        stats = rt.stats()
        assert stats["mlp"]["requests"] == 31 + 2 and stats["mlp"]["errors"] == 0  # + one warm-up per stream
        assert stats["_scheduler"]["decisions"] == 0  # one candidate per layer: nothing to decide
        bad = rt.submit(model, {"wrong": np.zeros(2)})
        with pytest.raises(TvmschedError, match="input names do not match"):
            bad.result(timeout=60)
        assert rt.stats()["mlp"]["errors"] == 1
        events = rt.export_timeline(tmp_path / "trace.json")
        trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        launches = [e for e in trace if e["cat"] != "switch"]
        assert events == len(trace) and len(launches) == 33 * len(model.layers)  # the warm-ups' launches included


def test_a_request_queued_past_start_within_us_fails_with_the_deadline_line(mlp, mlp_run):
    inputs, want = mlp_run
    with Runtime("cpu") as rt:
        model = rt.load(mlp)
        rt.preempt(model)  # its only stream takes nothing while paused
        late = rt.submit(model, inputs, start_within_us=2000)
        roomy = rt.submit(model, inputs, start_within_us=60e6)
        with pytest.raises(TvmschedError, match=r"model mlp: the request did not start within its deadline"):
            late.result(timeout=60)
        rt.resume(model)
        assert np.array_equal(roomy.result(timeout=60)["output"], want["output"])


def test_unload_frees_the_name_and_bad_arguments_are_one_line(mlp, mlp_run):
    with Runtime("cpu") as rt:
        with pytest.raises(TvmschedError, match="priority must be one of"):
            rt.load(mlp, priority="urgent")
        with pytest.raises(TvmschedError, match="streams must be a whole number from 1 to 64"):
            rt.load(mlp, streams=0)
        model = rt.load(mlp)
        with pytest.raises(TvmschedError, match="priority must be one of"):
            rt.submit(model, mlp_run[0], priority="urgent")
        futures = [rt.submit(model, mlp_run[0]) for _ in range(10)]
        rt.unload(model)
        assert all(f.done() for f in futures)
        with pytest.raises(TvmschedError, match=r"no model named 'mlp' is loaded \(loaded: none\)"):
            rt.submit("mlp", mlp_run[0])
        assert rt.load(mlp).name == "mlp"  # the name is free again
    with pytest.raises(TvmschedError, match="policy must be one of"):
        Runtime("cpu", policy="lottery")


def test_a_scrape_racing_an_unload_describes_the_models_still_loaded(mlp, mlp_run):
    """/metrics and /v1/stats are written from a list of served models taken before the scrape; one unloaded meanwhile
    is left out of what needs the engine's model (streams, residency), not an error for the whole scrape."""
    from tvmsched.runtime import native

    inputs, want = mlp_run
    with Runtime("cpu") as rt:
        kept, gone = rt.load(mlp, name="kept"), rt.load(mlp, name="gone")
        books = [rt.served(kept), rt.served(gone)]
        assert np.array_equal(rt.submit(kept, inputs).result(timeout=60)["output"], want["output"])
        rt.unload(gone)
        metrics = str(native.func("served_tvmsched_metrics")(books))
        assert 'tvmsched_launches_total{model="kept"} ' in metrics and 'tvmsched_launches_total{model="gone"} 0' in metrics
        assert 'tvmsched_model_resident{model="gone"} 0' in metrics
        stats = json.loads(str(native.func("served_v1_stats")(books)))
        assert stats["kept"]["requests"] == 1 and stats["gone"]["streams"] == 0 and stats["_device"]["health"] == "healthy"


def test_a_latency_target_or_deadline_that_is_not_a_positive_number_is_one_error_line(mlp, mlp_run):
    """qos_ms and start_within_us: a negative, zero, NaN or infinite value, a bool or a string is refused (one line);
    before, -5 and NaN were taken as "no target", True as 1 ms and "20" as 20 ms, and a negative deadline as none."""
    inputs, want = mlp_run
    with Runtime("cpu") as rt:
        for bad in (-5, 0, float("nan"), float("inf"), True, "20"):
            with pytest.raises(TvmschedError, match=r"^qos_ms must be a finite number of milliseconds above 0 \(None: "):
                rt.load(mlp, qos_ms=bad, name="bad")
        assert "bad" not in rt.stats()
        model = rt.load(mlp, qos_ms=np.float32(60000))
        assert model.qos_ms == 60000.0 and rt.stats()["mlp"]["qos_ms"] == 60000.0
        for bad in (-1, 0, float("nan"), float("inf"), False, "5"):
            with pytest.raises(TvmschedError, match=r"^start_within_us must be a finite number of microseconds above 0"):
                rt.submit(model, inputs, start_within_us=bad)
            with pytest.raises(TvmschedError, match="^start_within_us must be"):
                asyncio.run(rt.infer(model, inputs, start_within_us=bad))
        assert np.array_equal(rt.submit(model, inputs, start_within_us=60e6).result(timeout=60)["output"],
                              want["output"])
        assert rt.stats()["mlp"]["errors"] == 0  # refused before reaching the engine
