"""The engine's policies (tvmsched/policy.h) against the Python ones they replace: the same candidate-ID lists, and
the colocation estimate bit for bit, on random mixes of models, candidates, profiles and monitors (the recorded
decisions of real runs are replayed in test_policy_golden.py)."""

import math
import random
import sys

import pytest

from tests.helpers import ROOT
from tvmsched.errors import TvmschedError
from tvmsched.runtime import native, policies
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView

sys.path.insert(0, str(ROOT / "bench"))
import golden_decisions as golden  # noqa: E402

UNITS = 8


def random_mix(rng: random.Random, big: bool = False):
    """Three models whose layers have 1-3 candidates on 1-8 units, and a profile of some of their pairs; `big`: the
    third has 360 layers of 3, more profile keys than the engine resolves into its dense table (1024), so every pair
    is looked up as the profile gives it."""
    models = {}
    for name in "abc":
        layers = 360 if big and name == "c" else rng.randint(2, 14)
        models[name] = [[CandidateInfo(units, rng.uniform(5, 800), f"{name}/k{i}u{units}")
                         for units in rng.sample([1, 2, 4, UNITS], 3 if layers == 360 else rng.randint(1, 3))]
                        for i in range(layers)]
    keys = [c.key for layers in models.values() for cands in layers for c in cands] + ["gone/k0u2"]  # one never loaded
    profile = [(rng.choice(keys), rng.choice(keys), rng.random() * 0.6) for _ in range(rng.randint(0, 40))]
    profile += profile[:2]  # a pair given twice keeps its first place and takes the later value
    return models, profile


def random_monitor(rng: random.Random, models) -> list[StreamView]:
    """Busy streams (the models and a second copy of one): a running request's tail, its first layer partly done,
    then queued requests."""
    views = []
    for name in [*models, "a#1"]:
        if rng.random() < 0.35:
            continue
        layers = models[name.split("#")[0]]
        work = [rng.choice(cands) for cands in layers][rng.randrange(len(layers)):]
        if rng.random() < 0.5:
            work[0] = CandidateInfo(work[0].units, work[0].latency_us * rng.random(), work[0].key)
        for _ in range(rng.randint(0, 2)):
            work += [rng.choice(cands) for cands in layers]
        views.append(StreamView(name, tuple(work)))
    return views


@pytest.mark.parametrize("kind,big", [(kind, False) for kind in policies.KINDS] + [("colocation", True)])
def test_the_engine_policy_decides_as_the_python_one_on_random_mixes(kind, big):
    rng = random.Random(kind)
    decided = 0
    for _ in range(20):
        models, profile = random_mix(rng, big)
        table = ColocationTable(UNITS, {(first, second): value for first, second, value in profile})
        python = policies.create(kind, table=table, total_units=UNITS)
        engine = native.create_policy(kind, UNITS, profile)
        requests = {}
        for name, layers in models.items():
            qos_ms = rng.choice([None, 0.5, 2.0, 8.0])
            if python.kind == "colocation":
                python.scheduler.table.add_candidates(c for cands in layers for c in cands)
            native.policy_add_model(engine, name, layers, qos_ms)
            requests[name] = (layers, qos_ms)
        for _ in range(60):
            name = rng.choice([*models, "a#1"])
            model = name.split("#")[0]
            layers, qos_ms = requests[model]
            views = random_monitor(rng, models)
            loaded = rng.randint(1, 4)
            request = policies.Request(model, layers, qos_ms, lambda views=views: {v.name: v for v in views}, UNITS,
                                       loaded, tuple(policies.fastest_ids(layers)),
                                       choice=any(len(c) > 1 for c in layers), stream=name)
            ids = python.choose(request)
            got = native.policy_decide(engine, model, name, loaded, views)
            assert got["candidate_ids"] == ids, (kind, name, views)
            if kind == "colocation" and request.choice:
                want = python.scheduler.decisions[-1]
                assert (got["estimated_ms"], got["meets_qos"], got["streams"]) == \
                    (want.estimated_ms, want.meets_qos, want.streams)  # exact: the port keeps the float operations
                decided += 1
    if kind == "colocation":
        assert decided > 500


def test_an_unknown_policy_is_one_line_naming_the_kinds():
    with pytest.raises(TvmschedError, match=r"policy must be one of \('colocation', 'fastest', 'partition', 'fcfs'\), "
                                            r"not 'lottery'"):
        native.create_policy("lottery", UNITS)


def test_the_engine_fcfs_policy_is_serial_and_the_others_are_not():
    assert {kind: bool(native.create_policy(kind, UNITS).serial()) for kind in policies.KINDS} == \
        {kind: policies.create(kind, total_units=UNITS).serial for kind in policies.KINDS}


def engine_replay(doc: dict) -> list[str]:
    """Every run of a golden decisions file (tests/data/golden/README.md) through a fresh engine policy, in order; the
    snapshots whose decision differs (candidate ids; the estimate with ==, meets_qos, other streams; whether the
    monitor was read: the engine says whether it estimated), as lines."""
    bad = []
    for run in doc["runs"]:
        table = run["table"] or {"measured": []}
        engine = native.create_policy(run["policy"], run["total_units"], [tuple(row) for row in table["measured"]])
        for name in run["models"]:
            native.policy_add_model(engine, name, golden.decode_model(doc["models"][name]), doc["models"][name]["qos_ms"])
        for index, snap in enumerate(run["snapshots"]):
            views = golden.decode_monitor(snap["monitor"] or [], doc["models"], run["stream_model"])
            got = native.policy_decide(engine, snap["model"], snap["stream"], snap["loaded_models"], list(views.values()))
            want = {k: snap[k] for k in ("ids", "estimated_ms", "meets_qos", "streams") if k in snap}
            mine = {"ids": got["candidate_ids"]}
            if got["estimated"]:
                mine.update(estimated_ms=got["estimated_ms"], meets_qos=got["meets_qos"], streams=got["streams"])
            if mine != want:
                bad.append(f"{run['name']} #{index}: recorded {want}, the engine {mine}")
    return bad


@pytest.mark.parametrize("name", ["decisions_mix3.json.gz", "decisions_mix2.json.gz"])
def test_the_engine_policies_reproduce_every_golden_decision_exactly(name):
    doc = golden.read_gzip(ROOT / "tests" / "data" / "golden" / name)
    assert sum(len(run["snapshots"]) for run in doc["runs"]) > 5000
    bad = engine_replay(doc)
    assert not bad, f"{len(bad)} decisions differ, the first: " + "\n".join(bad[:5])
    # the check can fail: one estimate an ulp away is one mismatch
    run = next(r for r in doc["runs"] if r["policy"] == "colocation" and any(s.get("streams") for s in r["snapshots"]))
    index = next(i for i, s in enumerate(run["snapshots"]) if s.get("streams"))
    moved = dict(run["snapshots"][index], estimated_ms=math.nextafter(run["snapshots"][index]["estimated_ms"], 1e300))
    assert len(engine_replay(dict(doc, runs=[dict(run, snapshots=run["snapshots"][:index] + [moved])]))) == 1
