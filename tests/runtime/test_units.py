"""Candidates run on their own compute units: CPU thread counts here, green-context SMs on a GPU."""

import dataclasses
import os

import numpy as np
import pytest

from tests.helpers import cuda_available
from tvmsched import models
from tvmsched.artifact.format import Artifact
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor


def with_limited_candidate(artifact: Artifact, units: int) -> Artifact:
    """Give every layer a candidate 1: the same kernel as candidate 0, restricted to `units`."""
    layers = tuple(
        dataclasses.replace(l, candidates=(l.candidates[0], dataclasses.replace(l.candidates[0], id=1, units=units)))
        for l in artifact.manifest.layers
    )
    return Artifact(dataclasses.replace(artifact.manifest, layers=layers), artifact.library, artifact.weights)


def test_cpu_candidates_set_the_thread_pool_size():
    from tvmsched.runtime import native

    def num_threads():  # the calling thread's parallel loops: the engine's pool (runtime/native/src/cpu_pool.cc)
        return native.cpu_pool()["threads"]

    model = models.build("mlp")
    executor = Executor(with_limited_candidate(compile_model(model), units=1))
    inputs = models.random_inputs(model)
    full = executor.run(inputs, [0] * len(executor.manifest.layers))
    assert num_threads() == int(os.environ["TVM_NUM_THREADS"])
    limited = executor.run(inputs, [1] * len(executor.manifest.layers))
    assert num_threads() == 1
    np.testing.assert_allclose(limited["output"], full["output"], rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cuda_candidates_run_in_green_contexts():
    model = models.build("resnet18-small")
    executor = Executor(with_limited_candidate(compile_model(model, target="cuda"), units=16))
    inputs = models.random_inputs(model)
    n = len(executor.manifest.layers)
    full = executor.run(inputs, [0] * n)
    for ids in ([1] * n, [i % 2 for i in range(n)]):
        np.testing.assert_array_equal(executor.run(inputs, ids)["output"], full["output"])
