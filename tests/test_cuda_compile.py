"""The CUDA target compiles here without a GPU; the artifact runs where a GPU exists."""

import json
import shutil

import numpy as np
import onnx
import pytest

from tests.helpers import cuda_available, onnxruntime_outputs, run_cli
from tvmsched import models


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda")
    model_path, artifact = folder / "m.onnx", folder / "m.tvms"
    onnx.save(models.build("resnet18-small"), model_path)
    result = run_cli("compile", model_path, "--target", "cuda", "-o", artifact)
    assert result.returncode == 0, result.stderr
    return model_path, artifact


def test_cuda_artifact_manifest(cuda_artifact, cli):
    _, artifact = cuda_artifact
    manifest = json.loads(cli("inspect", artifact, "--json").stdout)
    assert manifest["device"] == "cuda"
    assert manifest["target"] == {"tag": "nvidia/nvidia-h100"}
    # each layer names the dlight rule that scheduled it (the first of tvmsched.lower.gpu_schedule.default_rules that
    # takes it): the matmuls our wave-filling one, the rest dlight's own
    rules = {layer["func"]: layer["candidates"][0]["schedule"] for layer in manifest["layers"]}
    assert set(rules.values()) <= {"dlight:WaveMatmul", "dlight:GEMV", "dlight:Reduction", "dlight:RowReduction",
                                   "dlight:Fallback"}, rules
    assert all(rule == "dlight:WaveMatmul" for func, rule in rules.items() if "conv2d" in func), rules
    assert rules["fused_matmul_add9"] == "dlight:Reduction"  # the classifier, one row: the matmul rules decline it
    assert rules["mean"] in ("dlight:Reduction", "dlight:RowReduction"), rules
    # with nvcc on PATH the compile embeds a fatbin (through the libcuda stub on driverless machines)
    expected = "fatbin" if shutil.which("nvcc") else "source"
    assert manifest["device_code"] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cuda_artifact_matches_onnxruntime(cuda_artifact):
    from tvmsched.runtime import Executor

    model_path, artifact = cuda_artifact
    executor = Executor(artifact)
    inputs = executor.random_inputs(seed=3)
    reference = onnxruntime_outputs(onnx.load(model_path), inputs)
    for name, value in executor.run(inputs).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-4)
