"""Build-here / measure-there tuning (tune kit -> tune measure -> tune import -> compile --qos-ms), on CPU."""

import json

import numpy as np
import pytest

from tests.helpers import assert_user_error, run_cli
from tvmsched import models
from tvmsched.errors import TvmschedError
from tvmsched.tune.kit_build import build_kit, import_results, record_units
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor
from tvmsched.tune.kit_run import default_unit_counts, measure_kit
from tvmsched.tuning_db import open_store

SAMPLES = 3
QOS_MS = 50.0  # generous for mlp: every unit count is kept


def test_default_gpu_unit_counts_are_partition_multiples():
    assert default_unit_counts(132, 8) == [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 132]
    assert default_unit_counts(2, 1) == [1, 2]


def test_all_sms_are_stamped_as_zero_like_metaschedule_tuning():
    assert record_units(132, 132, "gpu_sm") == 0 and record_units(64, 132, "gpu_sm") == 64
    assert record_units(2, 2, "cpu_thread") == 2


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kit")
    model = models.build("mlp")
    kit = build_kit(model, tmp / "kit", target="llvm", samples=SAMPLES, progress=False)
    results = measure_kit(tmp / "kit", [1, 2], repeat=3, progress=False)
    db = f"sqlite:///{tmp / 'tuning.db'}"
    stored = import_results(tmp / "kit", results, db)
    return model, tmp, kit, results, db, stored


def test_every_sample_is_measured_at_every_unit_count_and_stored(measured):
    _, _, kit, results, db, stored = measured
    assert results["units"] == [1, 2] and results["unit_kind"] == "cpu_thread"
    times = [t for entry in kit["funcs"] for s in entry["samples"] for t in results["times_us"][entry["func"]][s["symbol"]].values()]
    assert len(times) == 2 * sum(len(entry["samples"]) for entry in kit["funcs"]) and all(t > 0 for t in times)
    assert stored == len(times) == open_store(db).stats()["records"]
    assert all(1 <= len(entry["samples"]) <= SAMPLES for entry in kit["funcs"])


def test_candidates_from_measured_records_follow_the_rules_and_match_onnxruntime(measured, reference):
    model, tmp, _, results, db, _ = measured
    artifact = compile_model(model, qos_ms=QOS_MS, database=db)
    layers = artifact.manifest.layers
    for layer in layers:
        times = results["times_us"][layer.func]
        assert [c.id for c in layer.candidates] == list(range(len(layer.candidates)))
        full = layer.candidates[0]
        assert full.units == 2 and full.latency_us == pytest.approx(min(t["2"] for t in times.values()))
        for c in layer.candidates[1:]:  # the fastest sample measured at its units
            assert c.units == 1 and c.latency_us == pytest.approx(min(t["1"] for t in times.values()))
        assert all(c.latency_us <= layer.qos_bound_us and c.mechanism == "cpu_threads" for c in layer.candidates)
    assert sum(layer.qos_bound_us for layer in layers) == pytest.approx(QOS_MS * 1e3, rel=1e-3)
    executor = Executor(artifact)
    inputs = models.random_inputs(model, seed=3)
    expected = reference(model, inputs)["output"]
    for choice in (0, 1):
        ids = [min(choice, len(layer.candidates) - 1) for layer in layers]
        np.testing.assert_allclose(executor.run(inputs, ids)["output"], expected, rtol=1e-4, atol=1e-5)
    assert open_store(db).stats()["records"] == measured[5]  # planning stores nothing


def test_results_of_another_kit_are_refused_and_store_nothing(measured, tmp_path):
    _, tmp, _, results, db, stored = measured
    with pytest.raises(TvmschedError, match="kit id mismatch"):
        import_results(tmp / "kit", {**results, "kit": "0" * 32}, db)
    assert open_store(db).stats()["records"] == stored


def test_qos_without_measured_records_is_a_clear_error(tmp_path):
    with pytest.raises(TvmschedError, match="no measured record at all units.*tune kit"):
        compile_model(models.build("tiny"), qos_ms=5.0, database=f"sqlite:///{tmp_path / 'empty.db'}")


def test_cli_round_trip_and_bad_inputs(measured, tmp_path, cli):
    _, tmp, _, results, _, _ = measured
    model = tmp_path / "tiny.onnx"
    models.save("tiny", model)
    kit = tmp_path / "kit"
    out = cli("tune", "kit", model, "--target", "llvm", "--samples", "2", "--fresh", "-o", kit)
    assert out.returncode == 0 and "1 layers" in out.stdout, out.stderr
    out = cli("tune", "measure", kit, "-o", tmp_path / "r.json", "--units", "1")
    assert out.returncode == 0 and json.loads((tmp_path / "r.json").read_text())["units"] == [1], out.stderr
    assert_user_error(run_cli("tune", "measure", kit, "-o", tmp_path / "x.json", "--units", "0,1"), "outside 1..")
    assert_user_error(run_cli("tune", "measure", tmp_path, "-o", tmp_path / "x.json"), "not a measurement kit")
    (tmp_path / "bad.json").write_text("{")
    assert_user_error(run_cli("tune", "import", kit, tmp_path / "bad.json"), "cannot read results")
    assert_user_error(run_cli("compile", model, "--target", "cuda", "--qos-ms", "1", "--tune-trials", "2"), "tune kit")
