"""The soak of issue 28 (bench/soak.py), bounded: both example servers under locust with four models at mixed
priorities and bad requests mixed in, then SIGTERM with requests in flight. Checked: every request answered once
with its own id and its own outputs (bad ones: their 4xx, one line), resident memory flat after warm-up, the
requests the server held at SIGTERM answered, exit status 0. Longer runs: `python bench/soak.py` (10 minutes;
bench/results/reliability.md). Also: the per-request histories a long-running server keeps are bounded."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import soak  # noqa: E402

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, compiled):
    """The four models, copies of the session's shared artifacts (compiled once per test run) in this run's folder
    (pytest-xdist workers share it, under a lock); soak.compile_models finds them there and compiles nothing."""
    import fcntl
    import os

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "soak-artifacts"  # this run's only
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in soak.MODELS:
            if not (shared / f"{name}.tvms").exists():
                tmp = compiled.copy(name, shared / f"{name}.tvms.tmp")
                os.replace(tmp, shared / f"{name}.tvms")
        soak.compile_models(shared)
    return shared


def _soak(kind: str, artifacts, work, load_s: float) -> dict:
    result = soak.run_soak(kind, load_s=load_s, users=8, bad_share=0.1, window_s=10, artifacts=artifacts, work=work)
    assert soak.problems(result) == [], soak.problems(result)
    assert result["exit_code"] == 0
    assert result["in_flight_at_sigterm"] > 0 and result["in_flight_answered"] == result["in_flight_at_sigterm"]
    assert result["unique_ids"] == result["requests"] and result["answers_with_other_id"] == 0
    assert all(n > 0 for n in result["valid_ok_by_model"].values()), result["valid_ok_by_model"]
    assert set(result["by_kind"]) == {"valid", *soak.BAD_KINDS}, result["by_kind"]
    for kind_, entry in result["by_kind"].items():
        assert entry["ok"] == entry["requests"] > 0, (kind_, entry)
    assert result["rss_growth_mb"] < min(50, 0.2 * result["rss_start_mb"]), result
    return result


def test_soak_python_server(artifacts, tmp_path):
    _soak("python", artifacts, tmp_path, load_s=20)


def test_soak_cpp_server(artifacts, tmp_path):
    if not soak.CPP_SERVER.exists():
        pytest.skip("build/cpp/tvmsched_server is not built (make cpp; tests/test_cpp_examples.py builds it)")
    _soak("cpp", artifacts, tmp_path, load_s=15)


def test_latency_history_is_bounded(tmp_path, compiled):
    """A stream keeps the latest 8192 to 16384 latencies (it kept every one: a server's memory grew by each
    request); stats() still counts every request."""
    from tvmsched.runtime import Runtime

    total = (1 << 14) + 300
    with Runtime("cpu") as rt:
        model = rt.load(compiled("tiny"))
        inputs = model.task.executor.random_inputs(0)
        for start in range(0, total, 100):
            futures = [rt.submit(model, inputs) for _ in range(min(100, total - start))]
            for future in futures:
                future.result()
        kept = len(model.task.latencies_us())
        stats = rt.stats()["tiny"]
    assert (1 << 13) <= kept <= (1 << 14), kept
    assert stats["requests"] == total and stats["errors"] == 0 and stats["p99_ms"] is not None
