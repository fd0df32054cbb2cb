"""Restricted-unit candidates with per-layer QoS bounds (FineCo offline method) on CPU."""

import numpy as np
import pytest

from tvmsched import models
from tvmsched.tune.candidates import kept_units, qos_bounds
from tvmsched.errors import TvmschedError
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor

QOS_MS = 50.0  # generous for mlp (well under 1 ms with all units), so every unit count is kept
TRIALS = 4


def test_bounds_split_the_target_by_time_share():
    bounds = qos_bounds([("a", 100.0), ("b", 300.0), ("a", 100.0)], qos_ms=1.0)
    assert bounds == {"a": pytest.approx(200.0), "b": pytest.approx(600.0)}


def test_infeasible_target_names_achievable_latency_and_slowest_layers():
    with pytest.raises(TvmschedError, match=r"infeasible: with all units the model takes 0\.5 ms; slowest layers: b \(0\.3 ms\), a"):
        qos_bounds([("a", 200.0), ("b", 300.0)], qos_ms=0.4)


def test_unit_counts_over_the_bound_are_dropped():
    curve = {1: 900.0, 2: 480.0, 3: 350.0, 4: 300.0}
    assert kept_units(curve, bound_us=500.0, full=4) == [2, 3]
    assert kept_units(curve, bound_us=250.0, full=4) == []


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """mlp tuned with restricted-unit candidates twice into one database (~1 min on 2 cores: the tuning is the
    subject; the second compile checks that finished work is skipped), and the database's record count in between."""
    from tvmsched.tuning_db import open_store

    db = f"sqlite:///{tmp_path_factory.mktemp('cand') / 'tuning.db'}"
    model = models.build("mlp")
    first = compile_model(model, tune_trials=TRIALS, database=db, qos_ms=QOS_MS)
    records = open_store(db).stats()["records"]
    second = compile_model(model, tune_trials=TRIALS, database=db, qos_ms=QOS_MS)
    return model, db, first, second, records


def test_candidate_sets_follow_the_rules(planned):
    _, _, artifact, _, _ = planned
    layers = artifact.manifest.layers
    full = max(c.units for layer in layers for c in layer.candidates)
    total_us = sum(layer.candidates[0].latency_us for layer in layers)
    assert sum(layer.qos_bound_us for layer in layers) == pytest.approx(QOS_MS * 1e3, rel=1e-3)
    for layer in layers:
        ids = [c.id for c in layer.candidates]
        assert ids == list(range(len(ids)))
        assert layer.candidates[0].units == full
        assert layer.qos_bound_us == pytest.approx(QOS_MS * 1e3 * layer.candidates[0].latency_us / total_us, rel=1e-3)
        units = [c.units for c in layer.candidates[1:]]
        assert units == sorted(units, reverse=True) and all(k < full for k in units)
        for c in layer.candidates:
            assert c.latency_us <= layer.qos_bound_us and c.blocks and c.blocks >= 1 and c.memory_bytes > 0
    assert any(len(layer.candidates) > 1 for layer in layers)  # the generous target keeps restricted units


def test_every_candidate_matches_onnxruntime(planned, reference):
    model, _, artifact, _, _ = planned
    executor = Executor(artifact)
    inputs = models.random_inputs(model, seed=2)
    expected = reference(model, inputs)["output"]
    widest = max(len(layer.candidates) for layer in artifact.manifest.layers)
    for choice in range(widest):
        ids = [min(choice, len(layer.candidates) - 1) for layer in artifact.manifest.layers]
        np.testing.assert_allclose(executor.run(inputs, ids)["output"], expected, rtol=1e-4, atol=1e-5)


def test_rerun_skips_finished_work_and_keeps_ids(planned):
    _, db, first, second, records_after_first = planned
    assert all(layer["status"] == "cached" for layer in second.manifest.tuning["layers"].values())
    from tvmsched.tuning_db import open_store

    assert records_after_first > 0
    assert open_store(db).stats()["records"] == records_after_first  # the rerun re-tuned at no unit count
    assert [[(c.id, c.units) for c in l.candidates] for l in first.manifest.layers] == [
        [(c.id, c.units) for c in l.candidates] for l in second.manifest.layers
    ]
