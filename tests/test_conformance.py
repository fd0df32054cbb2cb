"""ONNX backend node-test conformance (tvmsched.cli.conformance): no case in the baseline may regress."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import onnx
import pytest

from tvmsched.cli.conformance import SUPPORTED_OPS, collect_cases, run_case, run_sweep

BASELINE = Path(__file__).parent / "data" / "conformance_baseline.json"
RECORD = "re-record with `python bench/conformance.py --write-baseline` only if the change is intended"


class _Poison:
    """A fake case whose unpickling in the worker runs `call` (crash or hang the worker on purpose)."""

    def __init__(self, name: str, call: tuple):
        self.name, self._call = name, call

    def __reduce__(self) -> tuple:
        return self._call


def _real_case(name: str = "test_add"):
    return next(case for case in collect_cases() if case.name == name)


def _perturbed(case):
    """A copy of `case` whose first expected output of the first data set is off by +1."""
    inputs, outputs = case.data_sets[0]
    return dataclasses.replace(case, data_sets=[(inputs, [outputs[0] + 1, *outputs[1:]])])


def test_run_case_compares_outputs() -> None:
    case = _real_case()
    assert run_case(case).status == "pass"

    wrong_values = run_case(_perturbed(case))
    assert wrong_values.status == "fail", wrong_values
    assert "Mismatched elements" in wrong_values.message and "\n" not in wrong_values.message

    inputs, outputs = case.data_sets[0]
    wrong_shape = run_case(dataclasses.replace(case, data_sets=[(inputs, [outputs[0].reshape(-1)])]))
    assert wrong_shape.status == "fail" and "shape" in wrong_shape.message, wrong_shape


def test_sweep_survives_crashing_and_hanging_workers() -> None:
    """Independent of the machine's speed: a case's clock starts when its worker is ready (a fresh worker's
    start is not counted), the poisons crash or hang at once, and the real case, a TVM compile that a loaded
    2-core machine may take many seconds over, gets a deadline only a real hang reaches."""
    crash, hang = _Poison("crash", (os._exit, (3,))), _Poison("hang", (time.sleep, (3600,)))
    first, hung, after_hang = run_sweep([crash, hang, crash], workers=1, progress=False, timeout_s=5)
    assert (first.status, first.message) == ("error", "worker crashed (exit code 3)")
    assert (hung.status, hung.message) == ("error", "timed out after 5 s")
    assert (after_hang.status, after_hang.message) == ("error", "worker crashed (exit code 3)")  # a new worker
    after_crash, wrong = run_sweep([crash, _perturbed(_real_case())], workers=1, progress=False, timeout_s=1800)
    assert (after_crash.status, after_crash.message) == ("error", "worker crashed (exit code 3)")
    assert wrong.status == "fail", wrong


@pytest.mark.slow
def test_baseline_cases_still_pass() -> None:
    baseline = json.loads(BASELINE.read_text())
    expected = set(baseline["passing"])
    assert expected and len(expected) == baseline["count"], f"{BASELINE} is empty or inconsistent"
    cases = collect_cases()
    assert cases, f"no onnx node test case uses only {sorted(SUPPORTED_OPS)}"

    results = {r.name: r for r in run_sweep(cases, workers=2, progress=False)}
    passed = {name for name, r in results.items() if r.status == "pass"}
    print(f"{len(passed)} passed, {len(results) - len(passed)} failed/errored of {len(results)} supported cases")
    if passed - expected:
        print(f"newly passing (not in the baseline): {sorted(passed - expected)}")

    missing = sorted(expected - results.keys())
    assert not missing, f"baseline cases not collected from onnx {onnx.__version__}: {missing}; {RECORD}"
    regressed = [f"{n}: {results[n].status}: {results[n].message}" for n in sorted(expected - passed)]
    assert not regressed, "baseline cases no longer pass:\n" + "\n".join(regressed)
