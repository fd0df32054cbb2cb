"""Golden decisions (tests/data/golden, written by bench/golden_decisions.py): what the scheduling policies decided
while real mixes ran, replayed offline through today's Python policies, and the priority policy's recorded
operations replayed on real engine streams. The C++ port of runtime/policies/ must match the same files exactly
(format: tests/data/golden/README.md)."""

from __future__ import annotations

import math
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import golden_decisions as golden  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"
DECISION_FILES = sorted(GOLDEN.glob("decisions_*.json.gz"))


@pytest.fixture(scope="module")
def decisions() -> dict:
    return {path.name: golden.read_gzip(path) for path in DECISION_FILES}


def test_the_golden_decisions_cover_every_policy_and_colocation_beside_busy_streams(decisions):
    assert {path.name for path in DECISION_FILES} == {"decisions_mix3.json.gz", "decisions_mix2.json.gz"}
    runs = [run for doc in decisions.values() for run in doc["runs"]]
    assert all(doc["format"] == golden.FORMAT for doc in decisions.values())
    assert {(run["policy"], run["table_kind"]) for run in runs} == {
        ("colocation", "measured"), ("colocation", "fallback"), ("fastest", None), ("partition", None), ("fcfs", None)}
    counts = {run["name"]: golden.count_snapshots(run) for run in runs}
    colocation = [counts[run["name"]] for run in runs if run["policy"] == "colocation"]
    assert sum(c["other_stream_busy"] for c in colocation) >= 1000  # the greedy least-co-located path
    assert sum(c["partial_layers"] for c in colocation) > 0 and sum(c["at_risk"] for c in colocation) > 0
    measured = [run for run in runs if run["table_kind"] == "measured"]
    assert all(run["table"]["measured"] for run in measured)
    mix3 = decisions["decisions_mix3.json.gz"]
    assert len(mix3["models"]) == 3 and all(  # restricted-unit candidates in every layer
        any(mix3["models"][m]["candidates"][c][0] < run["total_units"] for c in layer)
        for run in mix3["runs"] for m in run["models"] for layer in mix3["models"][m]["layers"])
    mix2 = decisions["decisions_mix2.json.gz"]
    assert len(mix2["models"]) == 2 and any(len(m["streams"]) > 1 for m in mix2["models"].values())
    assert any(not m["choice"] for m in mix2["models"].values())  # a model with one candidate per layer


@pytest.mark.parametrize("name", [path.name for path in DECISION_FILES])
def test_todays_policies_reproduce_every_recorded_decision_exactly(decisions, name):
    """Candidate IDs, the estimate (float equality), meets_qos, the other streams counted, and whether the monitor was
    read, for every snapshot in order."""
    bad = golden.mismatches(decisions[name])
    assert not bad, f"{len(bad)} decisions differ, the first: " + "\n".join(bad[:5])


def test_the_replay_catches_a_decision_one_ulp_or_one_candidate_away(decisions):
    """The check can fail: the first colocation decision beside a busy stream, its estimate moved by one ulp or its
    last layer's candidate changed, is the one mismatch the replay (of the run up to it) reports."""
    doc = decisions["decisions_mix3.json.gz"]
    run = next(r for r in doc["runs"] if r["table_kind"] == "measured")
    index = next(i for i, s in enumerate(run["snapshots"]) if s.get("streams"))
    original = run["snapshots"][index]
    assert not golden.mismatches(dict(doc, runs=[dict(run, snapshots=run["snapshots"][:index + 1])]))
    for change in ({"estimated_ms": math.nextafter(original["estimated_ms"], math.inf)},
                   {"ids": original["ids"][:-1] + [1 - original["ids"][-1]]}):
        snapshots = run["snapshots"][:index] + [dict(original, **change)]
        bad = golden.mismatches(dict(doc, runs=[dict(run, snapshots=snapshots)]))
        assert len(bad) == 1 and f"#{index}:" in bad[0]


def test_the_priority_policy_preempts_and_resumes_streams_as_recorded(compiled):
    """Each recorded sequence on real streams of a small model (golden.chain_model): after every operation, each
    stream's paused state, pending requests and the pauses the preemption group made, the group's preempted() and
    active(), and finish_started_of's count are what was recorded (in the CPU's asynchronous mode a stream resumes
    once its own thread has drained: each step waits up to 10 s for the recorded state)."""
    doc = golden.read_gzip(GOLDEN / "priority_sequences.json.gz")
    assert doc["format"] == golden.PRIORITY_FORMAT
    names = doc["streams"]
    harness = golden.PriorityHarness(compiled(golden.chain_model()), best_effort=sum(n.startswith("be") for n in names),
                                     realtime=sum(n.startswith("rt") for n in names))
    assert harness.names == names
    try:
        for sequence in doc["sequences"]:
            ops = [{k: v for k, v in step.items() if k != "after"} for step in sequence["steps"]]
            expected = [step["after"] for step in sequence["steps"]]
            seen = harness.play(ops, sequence["seed"], expected)
            step = len(seen) - 1
            assert seen == expected, (f"{sequence['name']} step {step} {ops[step]}: recorded {expected[step]}, "
                                      f"observed {seen[step]}")
    finally:
        harness.close()
    steps = [step for sequence in doc["sequences"] for step in sequence["steps"]]
    assert {step["op"] for step in steps} == {"add", "remove", "pause", "resume", "submit", "start", "hold",
                                              "finish_started_of"}
    assert any(step["after"].get("result") for step in steps)  # a started request finished for a switch-in
