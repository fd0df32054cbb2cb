"""The liveness plan never lets two live tensors share storage, and it saves memory."""

from dataclasses import dataclass

import pytest

from tvmsched.lower.layers import TensorSpec
from tests.memory_plan import plan_activations


@dataclass(frozen=True)
class FakeLayer:
    index: int
    inputs: tuple
    outputs: tuple


def lifetimes(layers):
    spans = {}
    for layer in layers:
        for t in layer.outputs:
            spans[t] = [layer.index, layer.index]
        for t in layer.inputs:
            if t in spans:
                spans[t][1] = layer.index
    return spans


def assert_no_live_overlap(layers, plan, keep):
    spans = lifetimes(layers)
    for t in keep:
        spans[t][1] = len(layers)
    ids = sorted(plan.assignment)
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            if plan.assignment[a] == plan.assignment[b]:
                (s1, e1), (s2, e2) = spans[a], spans[b]
                assert e1 < s2 or e2 < s1, f"{a} {spans[a]} and {b} {spans[b]} share block {plan.assignment[a]}"


def test_chain_reuses_two_blocks():
    spec = TensorSpec((256,), "float32", "activation")
    layers = [FakeLayer(i, (f"t{i - 1}",) if i else ("in",), (f"t{i}",)) for i in range(6)]
    tensors = {f"t{i}": spec for i in range(6)}
    plan = plan_activations(layers, tensors, keep={"t5"})
    assert_no_live_overlap(layers, plan, {"t5"})
    assert len(plan.storage_bytes) == 3  # ping-pong pair + the kept output


@pytest.mark.parametrize("name", ["resnet18-small", "bert-tiny", "mobilenetv2"])
def test_zoo_plans_are_safe_and_smaller(name, compiled):
    manifest = compiled.artifact(name).manifest
    keep = {b.tensor for b in manifest.outputs}
    plan = plan_activations(manifest.layers, manifest.tensors, keep)
    assert_no_live_overlap(manifest.layers, plan, keep)
    naive = sum(s.nbytes for s in manifest.tensors.values() if s.kind == "activation")
    assert plan.total_bytes < 0.6 * naive
    for tensor_id, block in plan.assignment.items():
        assert plan.storage_bytes[block] >= manifest.tensors[tensor_id].nbytes


@pytest.mark.parametrize("distance", [2, 8])
def test_reuse_distance_keeps_inputs_of_the_last_layers_intact(distance):
    """Any `distance` consecutive layers can run again: no storage is reused within that window."""
    spec = TensorSpec((256,), "float32", "activation")
    layers = [FakeLayer(i, (f"t{i - 1}",) if i else ("in",), (f"t{i}",)) for i in range(20)]
    tensors = {f"t{i}": spec for i in range(20)}
    plan = plan_activations(layers, tensors, keep={"t19"}, reuse_distance=distance)
    spans = lifetimes(layers)
    for t, block in plan.assignment.items():
        for u, other in plan.assignment.items():
            if t < u and block == other:
                (s1, e1), (s2, e2) = sorted([spans[t], spans[u]])
                assert s2 > e1 + distance - 1, (t, u)
    assert len(plan.storage_bytes) == distance + 2  # the window, the one being written, the kept output
