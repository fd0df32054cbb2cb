"""The engine's device-memory accounting (the base of issue 13's switching): every allocation a model
makes is counted and checked against the device's budget; a load past it fails with one line and
leaves nothing allocated."""

from __future__ import annotations

import gc

import pytest

from tvmsched.errors import TvmschedError
from tvmsched.runtime.native import func
from tvmsched.runtime import Executor
from tests.memory_plan import plan_activations


@pytest.fixture(scope="module")
def mlp(compiled):
    return compiled("mlp")  # shared, read only


@pytest.fixture
def cpu_memory():
    """The CPU device's accounting, its budget restored afterwards (it is process-wide)."""
    before = dict(func("device_memory")("cpu"))
    yield lambda: {k: int(v) for k, v in func("device_memory")("cpu").items()}
    func("set_memory_budget")("cpu", int(before["budget"]))


def _model_bytes(executor) -> int:
    """What a loaded model should hold: weights, inputs and the activation plan's storage blocks (planned for the
    launches a stream keeps in flight on an asynchronous device: its reuse distance)."""
    manifest = executor.manifest
    tensors = manifest.tensors
    keep = {b.tensor for b in manifest.outputs} | {c.tensor for c in manifest.index_checks}
    plan = plan_activations(manifest.layers, tensors, keep, executor.reuse_distance)
    fixed = sum(spec.nbytes for spec in tensors.values() if spec.kind in ("weight", "input"))
    return fixed + plan.total_bytes


def test_a_loaded_model_is_counted_exactly_and_released_when_freed(mlp, cpu_memory):
    gc.collect()
    baseline = cpu_memory()["in_use"]
    executor = Executor(mlp)
    held = cpu_memory()["in_use"] - baseline
    assert held == _model_bytes(executor) > 0
    assert cpu_memory()["peak"] >= baseline + held
    del executor
    gc.collect()
    assert cpu_memory()["in_use"] == baseline


def test_a_load_past_the_budget_fails_with_one_line_and_holds_nothing(mlp, cpu_memory):
    gc.collect()
    baseline = cpu_memory()["in_use"]
    need = _model_bytes(Executor(mlp))
    gc.collect()
    func("set_memory_budget")("cpu", baseline + need - 1)
    with pytest.raises(TvmschedError) as err:
        Executor(mlp)
    assert "cannot load model mlp:" in str(err.value) and "of the budget of" in str(err.value)
    assert "\n" not in str(err.value)
    gc.collect()
    assert cpu_memory()["in_use"] == baseline  # what the failed load had allocated is released
    func("set_memory_budget")("cpu", baseline + need)  # exactly enough
    executor = Executor(mlp)
    assert cpu_memory()["in_use"] == baseline + need == cpu_memory()["budget"]
    with pytest.raises(TvmschedError, match="below the .* bytes already in use"):
        func("set_memory_budget")("cpu", baseline + need - 1)
    del executor
