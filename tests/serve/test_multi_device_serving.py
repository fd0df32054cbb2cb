"""Serving on several devices (issue 40, steps 1 and 3; docs/multi-device.md): `tvmsched serve --devices cpu:0,cpu:1`
and the C++ server's `--devices` read Triton's `instance_group { count, gpus }` (count streams on each device named;
a group naming none runs on every device; no instance_group: the server places the model on one device). tritonclient
sends concurrent requests to every model and each answer is checked against onnxruntime."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.helpers import ROOT, free_port, start_cpp_server, start_serve, stop_server
from tests.test_cpp_examples import cpp_build  # noqa: F401 (the fixture: `make cpp` once)
from tvmsched import models
from tvmsched.errors import TvmschedError

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
ort = pytest.importorskip("onnxruntime")

DEVICES = "cpu:0,cpu:1"
BASE = 'backend: "tvmsched"\nmax_batch_size: 0\nparameters { key: "qos_ms" value: { string_value: "60000" } }\n'
CONFIGS = {  # model name -> config.pbtxt
    "both": BASE + "instance_group [ { count: 1 kind: KIND_CPU gpus: [ 0, 1 ] } ]\n",
    "every": BASE + "instance_group [ { count: 2 kind: KIND_CPU } ]\n",  # no gpus: every device, 2 streams each
    "one": BASE + "instance_group [ { count: 1 kind: KIND_CPU gpus: [ 1 ] } ]\n",
    "placed": BASE,  # no instance_group: the server places it
}
GPUS = {"both": [0, 1], "every": [0, 1], "one": [1]}


def _repository(root, compiled, configs: dict[str, str]):
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.tvms").symlink_to(compiled("mlp"))  # shared, read only
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory, compiled):
    return _repository(tmp_path_factory.mktemp("devices"), compiled, CONFIGS)


@pytest.fixture(scope="module")
def server(repository):
    process, base, grpc = start_serve("--devices", DEVICES, "--model-repository", str(repository))
    yield base.removeprefix("http://"), grpc
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def cpp_server(cpp_build, repository):  # noqa: F811
    process, base = start_cpp_server(cpp_build / "tvmsched_server", "--devices", DEVICES, "--model-repository",
                                     str(repository))
    yield base.removeprefix("http://"), None
    assert stop_server(process) == 0


@pytest.mark.parametrize("protocol", ["http", "grpc", "cpp-http"])
def test_each_model_runs_on_the_devices_its_config_names_and_answers_concurrent_requests_right(request, protocol):
    if protocol == "cpp-http":
        module, url, as_json = tritonclient_http, request.getfixturevalue("cpp_server")[0], {}
    else:
        server = request.getfixturevalue("server")
        module, url, as_json = ((tritonclient_grpc, server[1], {"as_json": True}) if protocol == "grpc"
                                else (tritonclient_http, server[0], {}))
    client = module.InferenceServerClient(url)
    placed = None
    for name in CONFIGS:
        config = client.get_model_config(name, **as_json)
        group = config.get("config", config)["instance_group"][0]
        gpus = [int(g) for g in group["gpus"]]
        if name == "placed":
            placed = gpus
        else:
            assert gpus == GPUS[name], (name, group)
        assert int(group["count"]) == (2 if name == "every" else 1)
    assert placed in ([0], [1])  # whole, on one device
    session = ort.InferenceSession(models.build("mlp").SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    sent = [(name, rng.standard_normal((1, 784)).astype(np.float32)) for name in CONFIGS for _ in range(12)]

    def infer(item) -> np.ndarray:
        name, x = item
        own = module.InferenceServerClient(url)  # one per thread
        try:
            tensor = module.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            return own.infer(name, [tensor]).as_numpy("output")
        finally:
            own.close()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(infer, sent))
    for (_, x), got in zip(sent, answers):
        np.testing.assert_allclose(got, session.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)
    client.close()


def test_instance_groups_are_read_against_the_servers_devices(tmp_path, compiled):
    from tvmsched.serve import triton_config

    def spec(config: str, devices=("cpu:0", "cpu:1")):
        root = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        _repository(root, compiled, {"m": config})
        return triton_config.spec("m", root / "m", devices)

    assert spec(CONFIGS["both"]).devices == (0, 1) and spec(CONFIGS["one"]).devices == (1,)
    assert (spec(CONFIGS["every"]).devices, spec(CONFIGS["every"]).streams) == ((0, 1), 2)
    assert spec(CONFIGS["placed"]).devices == () and spec(CONFIGS["every"], ("cpu",)).devices == ()  # one device
    two_groups = BASE + "instance_group [ { count: 1 gpus: [ 0 ] }, { count: 1 gpus: [ 1 ] } ]\n"
    assert (spec(two_groups).devices, spec(two_groups).streams) == ((0, 1), 1)
    with pytest.raises(TvmschedError, match=r"config.pbtxt:4: instance_group counts differ between devices "
                                            r"\(cpu:0: 1, cpu:1: 3\): a model runs the same streams on each"):
        spec(BASE + "instance_group [ { count: 1 gpus: [ 0 ] }, { count: 3 gpus: [ 1 ] } ]\n")
    with pytest.raises(TvmschedError, match=r"config.pbtxt:4: instance_group gpus \[2\]: the server has 2 devices "
                                            r"\(cpu:0, cpu:1\)$"):
        spec(BASE + "instance_group [ { count: 1 gpus: [ 2 ] } ]\n")


@pytest.mark.parametrize("devices,line", [
    ("cpu:0,gpu:1", "error: a device is cpu, cpu:N, cuda or cuda:N, not 'gpu:1'"),
    ("all", "error: --devices all: no CUDA driver on this machine (libcuda.so.1 not found)"),  # (no GPU here)
])
def test_both_servers_refuse_devices_they_cannot_serve_in_one_line(cpp_build, tmp_path, compiled, devices, line):  # noqa: F811
    root = _repository(tmp_path, compiled, {"m": BASE})
    for command in ([sys.executable, "-m", "tvmsched.cli", "serve", "--grpc-port", "0"],
                    [str(cpp_build / "tvmsched_server")]):
        done = subprocess.run([*command, "--devices", devices, "--model-repository", str(root), "--port",
                               str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.strip() == line, done.stderr


@pytest.mark.parametrize("which", ["python", "cpp"])
def test_a_model_larger_than_each_devices_budget_is_served_split_across_them(request, tmp_path, compiled, which):
    """The engine's rule (docs/multi-device.md): under a budget that holds each part of resnet18-small but not the
    whole model, both servers run it split across cpu:0 and cpu:1, and its answers are one device's bits."""
    from tvmsched.runtime import Executor, SplitExecutor

    artifact = compiled("resnet18-small")
    budget = max(m["in_use"] for m in SplitExecutor(artifact, DEVICES.split(",")).memory()) + 256 * 1024
    (tmp_path / "big" / "1").mkdir(parents=True)
    (tmp_path / "big" / "config.pbtxt").write_text(BASE)
    (tmp_path / "big" / "1" / "model.tvms").symlink_to(artifact)
    args = ("--devices", DEVICES, "--memory-budget", str(budget), "--model-repository", str(tmp_path))
    if which == "cpp":
        process, base = start_cpp_server(request.getfixturevalue("cpp_build") / "tvmsched_server", *args)
    else:
        process, base, _ = start_serve(*args)
    try:
        client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
        assert client.get_model_config("big")["instance_group"][0]["gpus"] == [0, 1]
        alone = Executor(str(artifact))
        for seed in (0, 1):
            inputs = alone.random_inputs(seed)
            sent = []
            for name, x in inputs.items():
                sent.append(tritonclient_http.InferInput(name, list(x.shape), "FP32"))
                sent[-1].set_data_from_numpy(x)
            got = client.infer("big", sent)
            for name, want in alone.run(inputs).items():
                np.testing.assert_array_equal(got.as_numpy(name), want)
        client.close()
    finally:
        assert stop_server(process) == 0
