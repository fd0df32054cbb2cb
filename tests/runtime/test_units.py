"""Candidates run on their own compute units: CPU thread counts here, green-context SMs on a GPU."""

import dataclasses
import os

import numpy as np
import pytest

from tests.helpers import cuda_available
from tvmsched import models
from tvmsched.artifact.format import Artifact
from tvmsched.runtime import Executor, native


def with_limited_candidate(artifact: Artifact, units: int) -> Artifact:
    """Give every layer a candidate 1: the same kernel as candidate 0, restricted to `units`."""
    layers = tuple(
        dataclasses.replace(l, candidates=(l.candidates[0], dataclasses.replace(l.candidates[0], id=1, units=units)))
        for l in artifact.manifest.layers
    )
    return Artifact(dataclasses.replace(artifact.manifest, layers=layers), artifact.library, artifact.weights)


def test_cpu_candidates_set_the_thread_pool_size(compiled):
    from tvmsched.runtime import native

    def num_threads():  # the calling thread's parallel loops: the engine's pool (runtime/native/src/cpu_pool.cc)
        return native.cpu_pool()["threads"]

    model = models.build("mlp")
    executor = Executor(with_limited_candidate(compiled.artifact("mlp"), units=1))
    inputs = models.random_inputs(model)
    full = executor.run(inputs, [0] * len(executor.manifest.layers))
    assert num_threads() == int(os.environ["TVM_NUM_THREADS"])
    limited = executor.run(inputs, [1] * len(executor.manifest.layers))
    assert num_threads() == 1
    np.testing.assert_allclose(limited["output"], full["output"], rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cuda_candidates_run_in_green_contexts(compiled):
    model = models.build("resnet18-small")
    executor = Executor(with_limited_candidate(compiled.artifact("resnet18-small", target="cuda"), units=16))
    inputs = models.random_inputs(model)
    n = len(executor.manifest.layers)
    full = executor.run(inputs, [0] * n)
    for ids in ([1] * n, [i % 2 for i in range(n)]):
        np.testing.assert_array_equal(executor.run(inputs, ids)["output"], full["output"])


def test_restricted_sm_streams_of_different_tenants_get_disjoint_sms():
    """The CUDA device's SM placement (sm_windows.h), run here without a GPU: 16 groups of 8 SMs (an H100's 132 SMs
    split by Hopper's granularity). Before windows, every k-SM green context was the device's first k SMs, so three
    tenants "partitioned" at 40 SMs each all ran on SMs 0-39 — the "prefix" rows."""
    place = native.place_sm_windows
    assert place(16, [8, 8]) == [0, 8]  # two halves: disjoint
    assert place(16, [5, 5, 5]) == [0, 5, 10]  # a partition of three tenants: disjoint, 1 group left idle
    assert place(16, [4, 4, 4, 4, 4]) == [0, 4, 8, 12, 0]  # a fifth quarter shares the least covered window
    assert place(16, [6, 6, 6]) == [0, 6, 10]  # the third overlaps by the fewest groups (2)
    assert place(16, [8, 8, -1, 8]) == [0, 8, 0]  # a destroyed stream's SMs are free again
    assert place(16, [2, 8]) == [0, 2]  # the lowest start of the least covered windows
    assert place(16, [20]) == [0]  # more than the device: all of it
    assert place(16, [5, 5, 5], prefix=True) == [0, 0, 0]
    with pytest.raises(Exception, match="no window 3 to give back"):
        place(16, [8, -3])
