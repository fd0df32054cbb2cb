"""Progress counters in GPU kernels (passes.progress): compiled here, counted on a GPU (bench/gpu/progress_check.py)."""

import pytest

from tvmsched import models
from tvmsched.errors import TvmschedError
from tvmsched.passes.progress import PARAM, count_progress
from tvmsched.pipeline import compile_model, lower_model
from tvmsched import kernels


def test_every_thread_counts_its_block_once_at_the_end():
    _, funcs, target = lower_model(models.build("mlp"), "cuda")
    scheduled = kernels.default_schedule(funcs, target)
    name, func = next(iter(scheduled.items()))
    counted, threads = count_progress(func)
    script = counted.script()
    assert f'T.call_extern("int32", "atomicAdd", T.address_of({PARAM}[0]), 1)' in script
    assert threads == 256  # the dlight GEMV of mlp's first layer: 256 threads per block
    assert count_progress(funcs[name])[1] is None  # no thread blocks: left alone


def test_cuda_artifacts_carry_counters_and_threads_per_block():
    artifact = compile_model(models.build("mlp"), target="cuda", progress_counters=True)
    assert artifact.manifest.progress_counters
    candidates = [c for layer in artifact.manifest.layers for c in layer.candidates]
    assert all(c.threads and c.threads > 0 and c.preempt_check == "blocks" for c in candidates)
    assert all(c.progress_blocks >= c.blocks for c in candidates)  # every launch of the layer, >= the largest
    with pytest.raises(TvmschedError, match="needs --target cuda"):
        compile_model(models.build("tiny"), progress_counters=True)
