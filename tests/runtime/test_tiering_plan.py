"""The memory-tiering planner (mechanism D): sub-task placement (forward, serpentine reverse), each
GPU's extra memory, its shares of DRAM, CXL and disk (remaining capacity / GPUs not yet assigned) and
what it takes of them; no tier over capacity; a shortfall is one error naming the GPU and the bytes.
Pure Python on made-up topologies, plus one real artifact and the CLI."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from tests.helpers import assert_user_error, run_cli
from tvmsched.errors import TvmschedError
from tvmsched.runtime import tiering
from tvmsched.runtime.tiering import (Gpu, Plan, TierTask, Tier, Topology, format_plan, gpu_position, parse_bytes,
                                      plan_memory, split_layers)

KINDS = ("dram", "cxl", "disk")
GiB = 2**30


def topology(gpu_memory: list[int], dram: int = 0, cxl: int | list[int] = 0, disk: int = 0) -> Topology:
    cxl_nodes = cxl if isinstance(cxl, list) else [cxl]
    tiers = [Tier("dram", dram), *(Tier("cxl", c, numa_node=2 + i) for i, c in enumerate(cxl_nodes)),
             Tier("disk", disk, path="/scratch")]
    return Topology(tuple(Gpu(10 + i, m) for i, m in enumerate(gpu_memory)), tuple(tiers))


def loads(plan: Plan) -> dict[int, int]:
    out = {g.id: 0 for g in plan.gpus}
    for p in plan.placements:
        out[p.gpu] += p.bytes
    return out


def reference_walk(top: Topology, extras: list[int]) -> list[tuple[dict, dict]]:
    """The method as stated: shares = a kind's remaining capacity // GPUs not yet assigned; take only
    what is needed, DRAM first, then CXL, then disk."""
    remaining = {k: sum(t.capacity_bytes for t in top.tiers if t.kind == k) for k in KINDS}
    out = []
    for i, extra in enumerate(extras):
        shares = {k: remaining[k] // (len(extras) - i) for k in KINDS}
        need, uses = max(extra, 0), {}
        for k in KINDS:
            uses[k] = min(need, shares[k])
            need -= uses[k]
            remaining[k] -= uses[k]
        out.append((shares, uses))
    return out


def check_invariants(plan: Plan) -> None:
    """Every GPU's extra covered, uses within shares, per-tier split matching the uses, no tier over capacity."""
    tiers = plan.topology.tiers
    used = [0] * len(tiers)
    for g in plan.gpus:
        assert g.extra_bytes == loads(plan)[g.id] - g.memory_bytes == g.load_bytes - g.memory_bytes
        assert sum(g.uses.values()) == max(g.extra_bytes, 0)
        assert all(0 <= g.uses[k] <= g.shares[k] for k in KINDS)
        for kind in KINDS:
            assert sum(b for i, b in g.tiers if tiers[i].kind == kind) == g.uses[kind]
        for i, b in g.tiers:
            assert b > 0
            used[i] += b
    assert all(u <= t.capacity_bytes for u, t in zip(used, tiers))


# ---- sizes and tasks ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("1048576", 1048576), ("512MiB", 512 * 2**20), ("2GiB", 2 * GiB),
                                         ("1.5GB", 1_500_000_000), ("3 kb", 3000), ("0.5KiB", 512), ("7B", 7),
                                         ("1TiB", 2**40), (12, 12), ("1.7B", 1)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-5", "1.2.3", "5 XB", "GiB", "1e9", "2 GiBs", -3])
def test_parse_bytes_rejects_and_names_the_value(text):
    with pytest.raises(TvmschedError, match=f"bad size {repr(text) if isinstance(text, str) else text}"):
        parse_bytes(text)


def test_plain_sizes_split_evenly_remainder_to_the_first():
    task = TierTask.from_bytes("a", 10, 4)
    assert task.subtask_bytes == (3, 3, 2, 2) and task.need == 10 and task.layer_ranges == ()
    assert TierTask.from_bytes("b", 2, 4).subtask_bytes == (1, 1, 0, 0)
    with pytest.raises(TvmschedError, match="at least one sub-task"):
        TierTask.from_bytes("c", 10, 0)


@pytest.mark.parametrize("sizes, parts", [([5, 1, 1, 1, 1, 1], 3), ([1] * 10, 4), ([100, 1, 1, 1, 100], 2),
                                          ([3, 9, 2, 7, 7, 1, 4], 7), ([0, 0, 0], 2), ([8, 1], 1)])
def test_layer_groups_are_consecutive_non_empty_and_closest_to_the_targets(sizes, parts):
    ranges = split_layers(sizes, parts)
    assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == len(sizes)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # consecutive, covering every layer
    assert all(stop > start for start, stop in ranges)
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    for i, (_, stop) in enumerate(ranges[:-1]):  # no other allowed end is closer to its target
        target = prefix[-1] * (i + 1) / parts
        allowed = range(ranges[i][0] + 1, len(sizes) - (parts - 2 - i))
        assert abs(prefix[stop] - target) == min(abs(prefix[e] - target) for e in allowed)


def test_a_group_ends_at_the_closest_sum_not_the_first_past_the_target():
    assert split_layers([4, 4, 1, 1], 2) == ((0, 1), (1, 4))  # 4 is 1 short of 5, 8 is 3 past
    assert split_layers([1, 1, 1, 10], 2) == ((0, 3), (3, 4))  # no sum before the last layer reaches 6.5


def test_fewer_layers_than_gpus_leaves_the_last_sub_tasks_empty():
    assert split_layers([4, 5], 4) == ((0, 1), (1, 2), (2, 2), (2, 2))


# ---- placement ------------------------------------------------------------------------------------

def test_forward_when_tasks_do_not_outnumber_gpus():
    top = topology([GiB] * 4)
    tasks = [TierTask.from_bytes("small", 40, 4), TierTask.from_bytes("big", 400, 4), TierTask.from_bytes("b-tie", 100, 4),
             TierTask.from_bytes("a-tie", 100, 4)]
    plan = plan_memory(top, tasks)
    assert plan.order == "forward"
    ordered = ["big", "a-tie", "b-tie", "small"]  # largest first, ties by name
    ids = [g.id for g in top.gpus]
    for k, name in enumerate(ordered):
        got = [p.gpu for p in plan.placements if p.task == name]
        assert got == [ids[(k + j) % 4] for j in range(4)]
    firsts = [p.gpu for p in plan.placements if p.subtask == 0]
    assert len(set(firsts)) == len(firsts) == 4
    assert [p.task for p in plan.placements][::4] == ordered


@pytest.mark.parametrize("n_gpus, n_tasks", [(2, 3), (3, 7), (4, 9), (8, 20)])
def test_reverse_is_a_serpentine_walk_when_tasks_outnumber_gpus(n_gpus, n_tasks):
    top = topology([GiB] * n_gpus)
    tasks = [TierTask.from_bytes(f"t{k:02d}", 1000 - k, n_gpus) for k in range(n_tasks)]  # already largest first
    plan = plan_memory(top, tasks)
    assert plan.order == "reverse"
    position = {g.id: i for i, g in enumerate(top.gpus)}
    for k in range(n_tasks):
        got = [position[p.gpu] for p in plan.placements if p.task == f"t{k:02d}"]
        round_, p = divmod(k, n_gpus)
        step = 1 if round_ % 2 == 0 else -1
        first = p if step == 1 else n_gpus - 1 - p  # even rounds from GPU 0 up, odd rounds from the last GPU down
        assert got == [(first + step * j) % n_gpus for j in range(n_gpus)]
        assert sorted(got) == list(range(n_gpus))  # one sub-task on every GPU
    firsts = [position[p.gpu] for p in plan.placements if p.subtask == 0]
    for start in range(0, n_tasks, n_gpus):  # the first N tasks, and every later round, start on distinct GPUs
        chunk = firsts[start:start + n_gpus]
        assert len(set(chunk)) == len(chunk)


def test_reverse_balances_uneven_sub_tasks_where_a_modular_or_mirrored_walk_does_not():
    n, sizes = 4, [(80 - 8 * k, 10, 10, 10) for k in range(8)]  # big first sub-tasks, tasks largest first
    tasks = [TierTask(f"t{k}", s) for k, s in enumerate(sizes)]
    plan = plan_memory(topology([GiB] * n), tasks)

    def max_load(position) -> int:
        load = [0] * n
        for k, s in enumerate(sizes):
            for j, b in enumerate(s):
                load[position(k, j)] += b
        return max(load)

    modular = max_load(lambda k, j: (k + j) % n)  # forward through every round
    mirrored = max_load(lambda k, j: (n - 1 - k - j) % n)  # every task from the last GPU back
    assert max(loads(plan).values()) == max_load(lambda k, j: gpu_position(k, j, len(sizes), n))
    assert max(loads(plan).values()) < modular == mirrored
    assert max(loads(plan).values()) - min(loads(plan).values()) == 0  # serpentine: 164 bytes on every GPU


# ---- shares and uses ------------------------------------------------------------------------------

def test_shares_are_remaining_capacity_over_unassigned_gpus_and_unused_share_flows_on():
    top = topology([100] * 4, dram=1000, cxl=[300, 100], disk=10_000)
    # extras: 0 (uses nothing), 400 (DRAM + CXL), 200 (DRAM), -50 (room to spare)
    tasks = [TierTask("a", (100, 500, 300, 50))]
    plan = plan_memory(top, tasks)
    extras = [g.extra_bytes for g in plan.gpus]
    assert extras == [0, 400, 200, -50]
    want = reference_walk(top, extras)
    assert [(g.shares, g.uses) for g in plan.gpus] == want
    # by hand: GPU 0 takes nothing, so GPU 1's DRAM share is 1000 // 3 = 333 (not 1000 // 4 = 250)
    assert plan.gpus[0].shares == {"dram": 250, "cxl": 100, "disk": 2500} and plan.gpus[0].uses == {"dram": 0, "cxl": 0, "disk": 0}
    assert plan.gpus[1].shares == {"dram": 333, "cxl": 133, "disk": 3333}
    assert plan.gpus[1].uses == {"dram": 333, "cxl": 67, "disk": 0}
    assert plan.gpus[2].shares == {"dram": 333, "cxl": 166, "disk": 5000} and plan.gpus[2].uses["dram"] == 200
    assert plan.gpus[3].shares == {"dram": 467, "cxl": 333, "disk": 10_000} and sum(plan.gpus[3].uses.values()) == 0
    assert plan.gpu(11).tiers == ((0, 333), (1, 67))  # CXL nodes fill in topology order
    check_invariants(plan)


def test_several_cxl_nodes_are_pooled_and_filled_in_order():
    top = topology([0, 0], dram=0, cxl=[30, 50], disk=0)
    plan = plan_memory(top, [TierTask("a", (40, 40))])
    assert [g.shares["cxl"] for g in plan.gpus] == [40, 40]
    assert plan.gpus[0].tiers == ((1, 30), (2, 10)) and plan.gpus[1].tiers == ((2, 40),)
    node = {i: t.numa_node for i, t in enumerate(top.tiers)}
    assert [node[i] for i, _ in plan.gpus[0].tiers] == [2, 3]
    check_invariants(plan)


@pytest.mark.parametrize("over, uses", [
    (0, {"dram": 500, "cxl": 0, "disk": 0}),  # exactly the DRAM share: DRAM alone
    (1, {"dram": 500, "cxl": 1, "disk": 0}),  # one byte more: DRAM + CXL
    (200, {"dram": 500, "cxl": 200, "disk": 0}),  # exactly DRAM + CXL shares: no disk
    (201, {"dram": 500, "cxl": 200, "disk": 1}),  # one byte more: DRAM + CXL + disk
    (2200, {"dram": 500, "cxl": 200, "disk": 2000}),  # exactly every share
])
def test_tier_boundaries_sit_exactly_at_the_shares(over, uses):
    top = topology([1000, 1000], dram=1000, cxl=400, disk=4000)  # shares of GPU 0: 500, 200, 2000
    plan = plan_memory(top, [TierTask("a", (1500 + over, 1000))])  # sub-task 0 on GPU 10, its extra 500 + over
    first = plan.gpus[0]
    assert first.shares == {"dram": 500, "cxl": 200, "disk": 2000}
    assert first.extra_bytes == 500 + over and first.uses == uses
    check_invariants(plan)


def test_one_byte_beyond_every_share_is_an_error_naming_the_gpu_and_the_bytes():
    top = topology([1000, 1000], dram=1000, cxl=400, disk=4000)
    with pytest.raises(TvmschedError) as err:
        plan_memory(top, [TierTask("a", (1000 + 2701, 1000))])
    message = str(err.value)
    assert "GPU 10 lacks 1 bytes" in message and "GPU 11" not in message and "\n" not in message


def test_every_short_gpu_is_named_in_one_line():
    top = topology([100, 100, 100], dram=30, disk=0)
    with pytest.raises(TvmschedError) as err:
        plan_memory(Topology(top.gpus, top.tiers[:1]), [TierTask("a", (150, 100, 170))])
    message = str(err.value)
    assert "GPU 10 lacks 40 bytes" in message and "GPU 12 lacks 50 bytes" in message and "GPU 11" not in message


def test_an_exhausted_tier_passes_its_gpus_to_the_next():
    top = topology([100, 100], dram=0, cxl=50, disk=1000)  # no DRAM at all
    plan = plan_memory(top, [TierTask("a", (130, 140))])
    assert [g.uses for g in plan.gpus] == [{"dram": 0, "cxl": 25, "disk": 5}, {"dram": 0, "cxl": 25, "disk": 15}]
    check_invariants(plan)
    # extras that fill every tier to the byte leave nothing anywhere
    top = topology([100, 100], dram=200, cxl=100, disk=300)
    plan = plan_memory(top, [TierTask("a", (400, 400))])
    used = [sum(b for g in plan.gpus for i, b in g.tiers if i == t) for t in range(len(top.tiers))]
    assert used == [t.capacity_bytes for t in top.tiers]
    check_invariants(plan)
    with pytest.raises(TvmschedError, match="GPU 11 lacks 1 bytes"):
        plan_memory(top, [TierTask("a", (400, 401))])


def test_one_gpu_gets_every_sub_task_and_the_whole_tiers():
    top = topology([100], dram=50, cxl=30, disk=1000)
    plan = plan_memory(top, [TierTask.from_bytes("a", 150, 1), TierTask.from_bytes("b", 60, 1)])
    assert plan.order == "reverse" and {p.gpu for p in plan.placements} == {10}
    assert plan.gpus[0].shares == {"dram": 50, "cxl": 30, "disk": 1000}
    assert plan.gpus[0].uses == {"dram": 50, "cxl": 30, "disk": 30}
    assert plan.to_json()["gpus"] == [{"id": 10, "extra_bytes": 110, "shares": {"dram": 50, "cxl": 30, "disk": 1000},
                                       "uses": {"dram": 50, "cxl": 30, "disk": 30}}]


@pytest.mark.parametrize("n_tasks", [5, 8, 20])
def test_eight_gpus_against_the_reference(n_tasks):
    rng = np.random.default_rng(n_tasks)
    top = topology([int(m) for m in rng.integers(1, 8, 8) * GiB], dram=40 * GiB, cxl=[12 * GiB, 9 * GiB], disk=400 * GiB)
    tasks = [TierTask(f"t{k}", tuple(int(b) for b in rng.integers(0, 4 * GiB, 8))) for k in range(n_tasks)]
    plan = plan_memory(top, tasks)
    assert plan.order == ("forward" if n_tasks <= 8 else "reverse")
    assert len(plan.placements) == 8 * n_tasks
    ordered = sorted(tasks, key=lambda t: (-t.need, t.name))
    assert [p.task for p in plan.placements if p.subtask == 0] == [t.name for t in ordered]
    firsts = [p.gpu for p in plan.placements if p.subtask == 0][:8]
    assert len(set(firsts)) == len(firsts)
    assert [(g.shares, g.uses) for g in plan.gpus] == reference_walk(top, [g.extra_bytes for g in plan.gpus])
    check_invariants(plan)


def test_random_topologies_keep_every_rule():
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        top = topology([int(m) for m in rng.integers(0, 100, n)], dram=int(rng.integers(0, 400)),
                       cxl=[int(c) for c in rng.integers(0, 200, int(rng.integers(1, 3)))], disk=int(rng.integers(0, 800)))
        tasks = [TierTask(f"t{k}", tuple(int(b) for b in rng.integers(0, 60, n))) for k in range(int(rng.integers(1, 12)))]
        extras = [sum(p.bytes for p in _placements(top, tasks) if p.gpu == g.id) - g.memory_bytes for g in top.gpus]
        want = reference_walk(top, extras)
        missing = [max(e, 0) - sum(u.values()) for e, (_, u) in zip(extras, want)]
        if any(missing):
            with pytest.raises(TvmschedError) as err:
                plan_memory(top, tasks)
            for gpu, m in zip(top.gpus, missing):
                assert (f"GPU {gpu.id} lacks {m} bytes" in str(err.value)) == (m > 0)
        else:
            plan = plan_memory(top, tasks)
            assert [(g.shares, g.uses) for g in plan.gpus] == want
            check_invariants(plan)


def _placements(top: Topology, tasks: list[TierTask]):
    """Placements as the rule states them (independent of plan_memory's error path)."""
    ordered = sorted(tasks, key=lambda t: (-t.need, t.name))
    return [tiering.Placement(t.name, j, top.gpus[gpu_position(k, j, len(ordered), len(top.gpus))].id, b)
            for k, t in enumerate(ordered) for j, b in enumerate(t.subtask_bytes)]


def test_tasks_must_match_the_gpus_and_have_distinct_names():
    top = topology([100, 100])
    with pytest.raises(TvmschedError, match="task a has 3 sub-tasks for 2 GPU"):
        plan_memory(top, [TierTask("a", (1, 1, 1))])
    with pytest.raises(TvmschedError, match="two tasks are named a"):
        plan_memory(top, [TierTask("a", (1, 1)), TierTask("a", (2, 2))])


def test_json_schema_and_readable_table():
    top = topology([100, 100], dram=1000, cxl=100, disk=1000)
    plan = plan_memory(top, [TierTask.from_bytes("a", 300, 2), TierTask.from_bytes("b", 20, 2)])
    data = json.loads(json.dumps(plan.to_json()))
    assert set(data) == {"order", "placements", "gpus"}
    assert all(set(p) == {"task", "subtask", "gpu", "bytes"} for p in data["placements"])
    assert all(set(g) == {"id", "extra_bytes", "shares", "uses"} and set(g["shares"]) == set(g["uses"]) == set(KINDS)
               for g in data["gpus"])
    assert data["placements"][0] == {"task": "a", "subtask": 0, "gpu": 10, "bytes": 150}
    assert plan.gpu(11).uses == data["gpus"][1]["uses"]
    with pytest.raises(TvmschedError, match="no GPU 3"):
        plan.gpu(3)
    text = format_plan(plan)
    assert "order forward" in text and "a#0 150 B" in text and "tier 1 cxl node 2" in text and "tier 2 disk /scratch" in text


# ---- topology files and discovery -----------------------------------------------------------------

GOOD = {"gpus": [{"id": 0, "memory_bytes": 80 * GiB}, {"id": 1, "memory_bytes": 80 * GiB}],
        "tiers": [{"kind": "dram", "capacity_bytes": 512 * GiB}, {"kind": "cxl", "capacity_bytes": 256 * GiB, "numa_node": 2},
                  {"kind": "disk", "capacity_bytes": 2048 * GiB, "path": "/scratch"}]}


def test_topology_json_round_trip():
    top = Topology.from_json(GOOD)
    assert top.gpus == (Gpu(0, 80 * GiB), Gpu(1, 80 * GiB)) and top.tiers[1] == Tier("cxl", 256 * GiB, numa_node=2)
    assert top.to_json() == GOOD and Topology.from_json(top.to_json()) == top


def _with(path: str, value) -> dict:
    data = json.loads(json.dumps(GOOD))
    *keys, last = path.split(".")
    target = data
    for key in keys:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is _DELETE:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("data, fragment", [
    (_with("gpus", _DELETE), "missing 'gpus'"),
    (_with("gpus", []), "'gpus' must be a non-empty list"),
    (_with("gpus.1.id", 0), "gpus[1]: duplicate GPU id 0"),
    (_with("gpus.0.memory_bytes", -1), "gpus[0].memory_bytes must be a non-negative integer, not -1"),
    (_with("gpus.0.memory_bytes", 1.5), "gpus[0].memory_bytes must be a non-negative integer, not 1.5"),
    (_with("gpus.0.memory_bytes", "8GiB"), "gpus[0].memory_bytes must be a non-negative integer"),
    (_with("gpus.1.memory_bytes", _DELETE), "gpus[1] has no memory_bytes"),
    (_with("gpus.0.memroy", 1), "gpus[0] has an unknown field 'memroy'"),
    (_with("tiers.0.kind", "hbm"), "tiers[0].kind must be one of dram, cxl, disk, not 'hbm'"),
    (_with("tiers.1.numa_node", _DELETE), "tiers[1] has no numa_node"),
    (_with("tiers.2.path", _DELETE), "tiers[2] (disk) needs a path"),
    (_with("tiers.2.capacity_bytes", -3), "tiers[2].capacity_bytes must be a non-negative integer, not -3"),
    (_with("tiers.0.numa_node", 2), "tiers[1]: NUMA node 2 appears twice"),
    (_with("tiers", {}), "'tiers' must be a list"),
    ([1, 2], "the topology must be an object"),
])
def test_each_bad_topology_field_is_one_error_naming_it(data, fragment):
    with pytest.raises(TvmschedError) as err:
        Topology.from_json(data, "t.json")
    assert str(err.value).startswith("t.json: ") and fragment in str(err.value) and "\n" not in str(err.value)


def test_unreadable_or_invalid_topology_files(tmp_path):
    with pytest.raises(TvmschedError, match="cannot read the topology"):
        Topology.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(TvmschedError, match="is not valid JSON"):
        Topology.load(tmp_path / "bad.json")
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    assert Topology.load(tmp_path / "good.json") == Topology.from_json(GOOD)


def _fake_node(root, index: int, cpus: str, total_kb: int, free_kb: int) -> None:
    node = root / f"node{index}"
    node.mkdir(parents=True)
    (node / "cpulist").write_text(cpus + "\n")
    (node / "meminfo").write_text(f"Node {index} MemTotal:       {total_kb} kB\nNode {index} MemFree:        {free_kb} kB\n")


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A sysfs with two CPU nodes, a CPU-less node with memory (CXL) and a CPU-less empty one; no NVML."""
    sysfs = tmp_path / "node"
    _fake_node(sysfs, 0, "0-7", 64 << 20, 10 << 20)
    _fake_node(sysfs, 1, "8-15", 64 << 20, 20 << 20)
    _fake_node(sysfs, 2, "", 128 << 20, 100 << 20)
    _fake_node(sysfs, 3, "", 0, 0)
    (sysfs / "possible").write_text("0-3\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       134217728 kB\nMemFree:         1000 kB\nMemAvailable:    3000 kB\n")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no GPUs
    return sysfs, meminfo


def test_discover_finds_dram_a_cpu_less_node_as_cxl_and_the_disk(fake_machine, tmp_path):
    sysfs, meminfo = fake_machine
    top = Topology.discover(tmp_path, sysfs=sysfs, meminfo=meminfo)
    assert top.gpus == (Gpu(0, 3000 * 1024),)  # no GPUs: the CPU engine's arena, MemAvailable
    dram, cxl, disk = top.tiers
    assert dram == Tier("dram", (30 << 20) * 1024)
    assert cxl == Tier("cxl", (100 << 20) * 1024, numa_node=2)
    assert disk.kind == "disk" and disk.path == str(tmp_path) and disk.capacity_bytes > 0
    assert Topology.from_json(top.to_json()) == top


def test_discover_without_sysfs_takes_dram_from_meminfo(fake_machine, tmp_path):
    _, meminfo = fake_machine
    top = Topology.discover(tmp_path, sysfs=tmp_path / "no-sysfs", meminfo=meminfo)
    assert [t.kind for t in top.tiers] == ["dram", "disk"] and top.tiers[0].capacity_bytes == 3000 * 1024
    with pytest.raises(TvmschedError, match="disk directory .* does not exist"):
        Topology.discover(tmp_path / "absent", sysfs=tmp_path, meminfo=meminfo)


def test_discover_reads_gpus_from_nvml(fake_machine, tmp_path, monkeypatch):
    sysfs, meminfo = fake_machine

    class NVMLError(Exception):
        pass

    calls = []
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=(h + 1) * GiB, total=80 * GiB))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert Topology.discover(tmp_path, sysfs=sysfs, meminfo=meminfo).gpus == (Gpu(0, GiB), Gpu(1, 2 * GiB))
    assert calls == ["init", "shutdown"]

    def no_driver():
        raise NVMLError("NVML Shared Library Not Found")

    fake.nvmlDeviceGetCount = no_driver  # NVML up, but a query fails: an error, not "no GPUs"
    with pytest.raises(TvmschedError, match="NVML cannot list the GPUs"):
        Topology.discover(tmp_path, sysfs=sysfs, meminfo=meminfo)
    assert calls[-1] == "shutdown"
    fake.nvmlInit = no_driver
    assert Topology.discover(tmp_path, sysfs=sysfs, meminfo=meminfo).gpus == (Gpu(0, 3000 * 1024),)


# ---- a real artifact and the CLI ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp(compiled, tmp_path_factory):
    # a copy of the shared artifact named mlp.tvms: a task is named by its artifact's file stem
    return compiled.copy("mlp", tmp_path_factory.mktemp("tiering") / "mlp.tvms")


def test_a_task_from_a_real_artifact(mlp):
    from tvmsched.artifact.format import Manifest

    manifest = Manifest.verified(mlp)
    tensors = manifest.tensors
    per_layer, seen = [], set()
    for layer in manifest.layers:  # the weights it reads first, plus its outputs
        fresh = [t for t in layer.inputs if tensors[t].kind == "weight" and t not in seen]
        seen.update(fresh)
        per_layer.append(sum(tensors[t].nbytes for t in fresh) + sum(tensors[t].nbytes for t in layer.outputs))
    weights = sum(s.nbytes for s in tensors.values() if s.kind == "weight")
    activations = sum(tensors[t].nbytes for layer in manifest.layers for t in layer.outputs)
    task = TierTask.from_artifact(mlp, 2)
    assert task.name == "mlp" and task.need == sum(per_layer) == weights + activations
    assert task.layer_ranges == split_layers(per_layer, 2)
    assert task.subtask_bytes == tuple(sum(per_layer[a:b]) for a, b in task.layer_ranges)
    wide = TierTask.from_artifact(mlp, 8)  # 4 layers on 8 GPUs: one layer each, then empty sub-tasks
    assert wide.subtask_bytes == (*per_layer, 0, 0, 0, 0) and wide.need == task.need
    top = topology([task.need // 4] * 2, dram=4 * task.need, disk=0)
    plan = plan_memory(top, [task, TierTask.from_bytes("other", 1000, 2)])
    check_invariants(plan)
    assert plan.order == "forward" and plan.placements[0] == tiering.Placement("mlp", 0, 10, task.subtask_bytes[0])


def test_cli_plan_memory_json(mlp, tmp_path, cli):
    (tmp_path / "top.json").write_text(json.dumps(GOOD))
    result = cli("plan-memory", "--topology", tmp_path / "top.json", "--task", mlp, "--task-bytes", "llm=100GiB",
                 "--task-bytes", "vit=70GiB", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["order"] == "reverse"  # three tasks on two GPUs
    assert [p["task"] for p in data["placements"] if p["subtask"] == 0] == ["llm", "vit", "mlp"]
    assert {p["gpu"] for p in data["placements"]} == {0, 1}
    gpus = {g["id"]: g for g in data["gpus"]}
    load = {i: sum(p["bytes"] for p in data["placements"] if p["gpu"] == i) for i in gpus}
    assert all(g["extra_bytes"] == load[i] - 80 * GiB for i, g in gpus.items())
    assert gpus[0]["shares"] == {"dram": 256 * GiB, "cxl": 128 * GiB, "disk": 1024 * GiB}
    assert all(sum(g["uses"].values()) == max(g["extra_bytes"], 0) and g["uses"]["cxl"] == 0 for g in gpus.values())
    text = cli("plan-memory", "--topology", "auto", "--disk-dir", tmp_path, "--task-bytes", "a=1MiB")
    assert text.returncode == 0 and "order forward" in text.stdout and f"disk {tmp_path}" in text.stdout, text.stderr


def test_cli_bad_input_is_one_error_line(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps(_with("gpus.0.memory_bytes", -1)))
    assert_user_error(run_cli("plan-memory", "--topology", tmp_path / "bad.json", "--task-bytes", "a=1"),
                      "gpus[0].memory_bytes must be a non-negative integer")
    assert_user_error(run_cli("plan-memory", "--task-bytes", "a=12 parsecs"), "bad size '12 parsecs'")
    assert_user_error(run_cli("plan-memory", "--task-bytes", "12GiB"), "--task-bytes '12GiB' is not NAME=BYTES")
    assert_user_error(run_cli("plan-memory", "--task", tmp_path / "none.tvms"), "no artifact at")
    assert_user_error(run_cli("plan-memory"), "at least one --task")
    (tmp_path / "top.json").write_text(json.dumps(GOOD))
    assert_user_error(run_cli("plan-memory", "--topology", tmp_path / "top.json", "--task-bytes", "x=8TiB"),
                      "GPU 0 lacks", "GPU 1 lacks")
