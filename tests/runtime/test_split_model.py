"""A model split across devices (issue 40, step 2: mechanism D executed on CPU devices standing for GPUs;
docs/multi-device.md, tvmsched/split.h): each device prepares only its own group of layers and holds only its
group's weights; a request runs the groups in order, the activations crossing devices copied through the host; the
outputs are the bits one device's run gives. A lost device fails the request in one line."""

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import switch_footprint
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Executor, SplitExecutor, native

DEVICES = ("cpu:0", "cpu:1")


@pytest.mark.parametrize("name", ["mlp", "resnet18-small", "bert-tiny"])
def test_a_split_model_gives_the_bits_of_one_devices_run_and_each_device_holds_its_own_weights(compiled, name):
    path = compiled(name)
    alone = Executor(str(path))
    split = SplitExecutor(path, DEVICES)
    layers = split.layers
    assert len(layers) == 2 and layers[0][0] == 0 and layers[1][0] == layers[0][1] + 1
    assert layers[1][1] == len(alone.manifest.layers) - 1
    assert split.crossing_bytes > 0
    for seed in (0, 1):
        inputs = alone.random_inputs(seed)
        want, got = alone.run(inputs), split.run(inputs)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    memory = split.memory()
    weights = sum(m["weight_bytes"] for m in memory)
    assert all(0 < m["weight_bytes"] < weights for m in memory), memory  # neither device holds every weight
    if name == "resnet18-small":  # weights dominate: each device's whole footprint is below the model's weights
        assert all(m["in_use"] < weights for m in memory), memory


def test_a_lost_device_fails_the_split_models_requests_in_one_line(compiled):
    path = compiled("mlp")
    alone = Executor(str(path))
    inputs = alone.random_inputs(0)
    split = SplitExecutor(path, DEVICES)
    second = split.native.parts()[1]
    native.func("inject_fault")(second, split.layers[1][0], True)  # its first layer faults, the device is lost
    with pytest.raises(TvmschedError, match="an injected fault") as first:
        split.run(inputs)
    assert "\n" not in str(first.value).strip()
    with pytest.raises(TvmschedError, match=r"^the cpu device is lost: ") as later:
        split.run(inputs)
    assert "\n" not in str(later.value).strip()


@pytest.mark.parametrize("devices,line", [
    (("cpu:0",), r"^a split model needs at least two devices$"),
    (("cpu:0", "cpu:0"), r"^device cpu:0 is listed twice or is not a device number$"),
    (("cpu:0", "cuda:1"), r"^a runtime's devices are all of one kind, not cpu and cuda$"),
])
def test_a_bad_device_list_is_one_line(compiled, devices, line):
    with pytest.raises(TvmschedError, match=line):
        SplitExecutor(compiled("mlp"), devices)


# ---- a split model in the Runtime: one rule decides split or whole (docs/multi-device.md) ----

def _answers_bits(rt, model, path, seeds=(0, 1, 2, 3)):
    """Concurrent requests, each answered with the bits of one device's run."""
    alone = Executor(str(path))
    inputs = {seed: alone.random_inputs(seed) for seed in seeds}
    futures = {seed: rt.submit(model, inputs[seed]) for seed in seeds for _ in range(2)}
    for seed, future in futures.items():
        want, got = alone.run(inputs[seed]), future.result(timeout=60)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_a_model_larger_than_every_devices_budget_runs_split_in_the_runtime_and_a_small_one_whole(compiled):
    from tvmsched.runtime import Runtime
    from tvmsched.runtime.tiering import TierTask

    path = compiled("resnet18-small")
    whole = switch_footprint(path)
    parts = [m["in_use"] for m in SplitExecutor(path, DEVICES).memory()]
    budget = max(parts) + 256 * 1024  # each part fits, the whole model fits no device
    assert budget < whole, (parts, whole)
    with Runtime(devices=DEVICES, memory_budget=budget) as rt:
        big = rt.load(str(path))
        small = rt.load(str(compiled("tiny")))  # (beside a part on either device)
        assert big.placement == "split" and big.split == DEVICES
        assert small.placement != "split" and len(rt.stats()[small.name]["devices"]) == 1
        stats = rt.stats()[big.name]
        assert stats["placement"] == "split" and stats["devices"] == list(DEVICES)
        assert all(big.name in d["models"] for d in rt.devices())
        assert all(0 < d["in_use"] <= budget for d in rt.devices()), rt.devices()
        # its groups are the memory planner's (runtime/tiering.py split_layers): a plan for it agrees with its load
        parts = [int(m.num_layers()) for m in rt._engine.engine_models(big.name)]  # (each part a model of its own)
        assert parts == [b - a for a, b in TierTask.from_artifact(path, 2).layer_ranges]
        _answers_bits(rt, big, path)
        _answers_bits(rt, small, compiled("tiny"), seeds=(0,))
        assert rt.stats()[big.name]["requests"] == rt.stats()[big.name]["executions"] == 8
        assert rt.stats()[big.name]["errors"] == 0
        assert big.tasks == () and rt.stats()[big.name]["p50_ms"] > 0
        with pytest.raises(TvmschedError, match=rf"^model {big.name} is split across devices: its requests are not"):
            rt.preempt(big)
        rt.unload(big)
        assert rt.models.keys() == {small.name} and all(big.name not in d["models"] for d in rt.devices())


def test_a_model_loaded_with_the_planners_plan_runs_its_sub_tasks_on_the_plans_gpus(compiled):
    from tvmsched.runtime import Runtime
    from tvmsched.runtime.tiering import Gpu, Tier, TierTask, Topology, plan_memory

    big, small = compiled("resnet18-small"), compiled("mlp")
    # (the planner names a task by its file; the shared cache's files are named by hash: the models' names here)
    tasks = [replace(TierTask.from_artifact(big, 2), name="resnet18-small"),
             replace(TierTask.from_artifact(small, 2), name="mlp")]
    # the larger task's sub-tasks go forward (GPU 0, then 1), the next task's start one GPU further on (1, then 0)
    plan = plan_memory(Topology((Gpu(0, 1 << 30), Gpu(1, 1 << 30)), (Tier("dram", 1 << 30),)), tasks)
    assert [(p.subtask, p.gpu) for p in plan.placements if p.task == "mlp"] == [(0, 1), (1, 0)]
    with Runtime(devices=DEVICES) as rt:
        model = rt.load(str(small), plan=plan, name="mlp", streams=2)  # (each part on two streams of its device)
        assert model.split == ("cpu:1", "cpu:0")
        parts = [int(m.num_layers()) for m in rt._engine.engine_models(model.name)]  # (a model per part and stream)
        assert parts == [b - a for a, b in tasks[1].layer_ranges for _ in range(2)]
        assert len(rt._engine.streams(model.name)) == 4
        _answers_bits(rt, model, small, seeds=(0, 1))
        with pytest.raises(TvmschedError, match=r"^the plan has no task named 'other' \(its tasks: mlp, "):
            rt.load(str(small), plan=plan, name="other")
        three = plan_memory(Topology((Gpu(0, 1 << 30), Gpu(1, 1 << 30), Gpu(5, 1 << 30))), [
            replace(TierTask.from_artifact(small, 3), name="mlp3")])
        with pytest.raises(TvmschedError, match=r"^the plan puts mlp3 sub-task 2 on GPU 5, which the runtime does not "):
            rt.load(str(small), plan=three, name="mlp3")


@pytest.mark.parametrize("options,line", [
    ({"split": True, "preferred_batch_sizes": [1]}, r"^a split model runs at one batch size: it takes no preferred_"),
    ({"split_layers": [[0, 0]]}, r"^a split model has one group of layers per device: 1 groups for 2 devices$"),
    ({"split_layers": [[0, 1], [3, 99]]}, r"groups of layers run consecutively from layer 0 to layer \d+, none empty: "
                                         r"group \[3, 99\] should start at layer 2"),
    ({"split": True, "devices": [0]}, r"^a split model needs at least two devices in service, not 1$"),
])
def test_a_split_load_the_runtime_cannot_honour_is_one_line_and_leaves_nothing_loaded(compiled, options, line):
    from tvmsched.runtime import Runtime

    with Runtime(devices=DEVICES) as rt:
        with pytest.raises(TvmschedError, match=line) as err:
            rt._engine.load(str(compiled("mlp")), options)
        assert "\n" not in str(err.value).strip()
        assert list(rt._engine.models()) == [] and all(d["in_use"] == 0 for d in rt.devices())


def test_a_split_model_on_a_lost_device_fails_in_one_line_and_whole_models_keep_serving(compiled):
    from tvmsched.runtime import Runtime

    path = compiled("mlp")
    with Runtime(devices=DEVICES) as rt:
        split = rt.load(str(path), split=True)
        whole = rt.load(str(path), name="whole", devices=(0,))
        second = rt._engine.engine_models(split.name)[1]
        native.func("inject_fault")(second, 0, True)  # device 1's part faults, the device cannot recover: lost
        inputs = Executor(str(path)).random_inputs(0)
        with pytest.raises(TvmschedError, match="an injected fault") as first:
            rt.submit(split, inputs).result(timeout=60)
        assert "\n" not in str(first.value).strip() and rt.devices()[1]["lost"]
        with pytest.raises(TvmschedError, match=rf"^model {split.name} is split across cpu:0,cpu:1, and cpu:1 is out of "
                                                r"service: "):
            rt.submit(split, inputs).result(timeout=60)
        _answers_bits(rt, whole, path, seeds=(0,))
        # the failed run and the refused request
        assert rt.stats()[split.name]["errors"] == 2 and rt.stats()[split.name]["requests"] == 0


def test_a_part_larger_than_its_devices_budget_streams_from_that_devices_tier_shares(compiled):
    """Mechanism D across devices, from the memory planner's plan: under a budget between resnet18-small's two parts,
    the first part runs on cpu:0 within its budget and the second streams its weights from cpu:1's share of DRAM, with
    one device's bits. Each device's share is its GPU's planned use plus an even part of what no GPU's use takes (the
    engine streams more than the planner's extra: two stream buffers, page rounding); with a tier too small for
    that, the load is one line and leaves nothing loaded."""
    from tvmsched.runtime import Runtime
    from tvmsched.runtime.tiering import Gpu, Tier, TierSettings, TierTask, Topology, device_shares, plan_memory

    path = compiled("resnet18-small")
    first, second = (m["in_use"] for m in SplitExecutor(path, DEVICES).memory())
    budget = (first + second) // 2
    assert first < budget < second
    task = replace(TierTask.from_artifact(path, 2), name="resnet18-small")
    plan = plan_memory(Topology((Gpu(0, budget), Gpu(1, budget)), (Tier("dram", 64 << 20),)), [task])
    use = plan.gpu(1).uses["dram"]
    assert plan.gpu(0).uses["dram"] == 0 < use
    tiering = TierSettings(topology=plan.topology, plan=plan)
    share = device_shares(tiering, 1)[0][1]
    assert share == use + ((64 << 20) - use) // 2  # its use, and half of what no GPU uses
    with Runtime(devices=DEVICES, memory_budget=budget, tiering=tiering) as rt:
        model = rt.load(str(path), plan=plan, name="resnet18-small")
        parts = rt._engine.engine_models(model.name)
        placements = [Executor.over(p, str(path)).placement for p in parts]
        assert placements[0] in ("resident", "staged") and placements[1] == "streamed", placements
        placed = native.tiering_info(parts[1])["tiers"]
        assert placed[0]["kind"] == "dram" and use < int(placed[0]["used_bytes"]) <= share, (placed, use, share)
        _answers_bits(rt, model, path, seeds=(0, 1))
    tight = plan_memory(Topology((Gpu(0, budget), Gpu(1, budget)), (Tier("dram", use + 4096),)), [task])
    tiering = TierSettings(topology=tight.topology, plan=tight)
    cap = device_shares(tiering, 1)[0][1]
    with Runtime(devices=DEVICES, memory_budget=budget, tiering=tiering) as rt:
        with pytest.raises(TvmschedError, match=rf"but this device's tier shares hold {cap} bytes \(dram {cap} bytes\)"
                                                r": short by at least .* \(model resnet18-small/1 is larger than") as err:
            rt.load(str(path), plan=tight, name="resnet18-small")
        assert "\n" not in str(err.value).strip() and list(rt._engine.models()) == []
        assert all(d["in_use"] == 0 for d in rt.devices())
