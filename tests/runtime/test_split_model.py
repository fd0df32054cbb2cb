"""A model split across devices (issue 40, step 2: mechanism D executed on CPU devices standing for GPUs;
docs/multi-device.md, tvmsched/split.h): each device prepares only its own group of layers and holds only its
group's weights; a request runs the groups in order, the activations crossing devices copied through the host; the
outputs are the bits one device's run gives. A lost device fails the request in one line."""

import numpy as np
import pytest

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
