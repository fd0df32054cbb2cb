"""A model repository in Triton's layout (issue 39, part 5): `NAME/config.pbtxt` parsed with Triton's model_config.proto,
version folders, dynamic batching over an artifact compiled at several batch sizes; tritonclient (HTTP and gRPC)
sends concurrent requests of several rows and every answer is checked against onnxruntime, through tvmsched serve and
through the C++ server (which parses the same proto with libprotobuf). A Triton field tvmsched does not implement, or a
config that does not parse, is refused by both with the same line giving FILE:LINE."""

from __future__ import annotations

import re
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
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

SIZES = [1, 2, 4, 8]
ROWS = [1, 3, 2, 1, 4, 1, 2, 8, 1, 1, 2, 3, 1, 5, 1, 2, 6, 1] * 2  # per request
CONFIG = """name: "mlp"
backend: "tvmsched"
max_batch_size: 8
# inputs and outputs left out: filled from the artifact (Triton's auto-complete)
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 2000
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 60000000 max_queue_size: 64 }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "qos_ms" value: { string_value: "60000" } }
"""


def _folder(root, compiled, config: str = CONFIG, versions=(1, 3), name: str = "mlp"):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / str(version)).mkdir()
        (folder / str(version) / "model.tvms").symlink_to(compiled("mlp", batch_size=SIZES))  # shared, read only
    return folder


@pytest.fixture(scope="module")
def repository(tmp_path_factory, compiled):
    root = tmp_path_factory.mktemp("triton")
    _folder(root, compiled)
    _folder(root, compiled, 'backend: "tvmsched"\nmax_batch_size: 4\n', versions=(1,), name="mlp4")  # below 8
    return root


@pytest.fixture(scope="module")
def server(repository):
    process, base, grpc = start_serve("--model-repository", str(repository))
    yield base.removeprefix("http://"), grpc
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def cpp_server(cpp_build, repository):  # noqa: F811
    process, base = start_cpp_server(cpp_build / "tvmsched_server", "--model-repository", str(repository))
    yield base.removeprefix("http://"), None
    assert stop_server(process) == 0


PROTOCOLS = ["http", "grpc", "cpp-http"]  # tvmsched serve's two; the C++ server's REST


def _client(request, protocol: str):
    """(tritonclient module, URL, as_json arguments) of the server `protocol` names."""
    if protocol == "cpp-http":
        return tritonclient_http, request.getfixturevalue("cpp_server")[0], {}
    server = request.getfixturevalue("server")
    if protocol == "grpc":
        return tritonclient_grpc, server[1], {"as_json": True}
    return tritonclient_http, server[0], {}


def _alone(rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(models.build("mlp").SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": rows[i : i + 1]})[0] for i in range(len(rows))])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_triton_layout_repository_batches_concurrent_requests_answered_as_each_row_alone(request, protocol):
    module, url, as_json = _client(request, protocol)
    client = module.InferenceServerClient(url)
    config = client.get_model_config("mlp", **as_json)
    config = config.get("config", config)
    assert int(config["max_batch_size"]) == 8 and [int(d) for d in config["input"][0]["dims"]] == [784]
    assert [int(n) for n in config["dynamic_batching"]["preferred_batch_size"]] == [4, 8]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    policy = config["dynamic_batching"]["default_queue_policy"]  # as loaded (Triton's model config shows it; gRPC's
    # JSON leaves out a field at its default, as protobuf's does)
    assert (policy.get("timeout_action", "REJECT"), int(policy["default_timeout_microseconds"]),
            int(policy["max_queue_size"]), policy.get("allow_timeout_override", False)) == ("REJECT", 60000000, 64, False)
    assert client.get_model_metadata("mlp", **as_json)["versions"] == ["3"]  # the latest version folder
    assert client.is_model_ready("mlp", "3") and not client.is_model_ready("mlp", "1")
    rng = np.random.default_rng(1)
    sent = [rng.standard_normal((n, 784)).astype(np.float32) for n in ROWS]

    def infer(rows: np.ndarray) -> np.ndarray:
        own = module.InferenceServerClient(url)  # one per thread (the HTTP client's loop is per thread)
        try:
            tensor = module.InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            return own.infer("mlp", [tensor], model_version="3").as_numpy("output")
        finally:
            own.close()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(infer, sent))
    for rows, got in zip(sent, answers):
        np.testing.assert_allclose(got, _alone(rows), rtol=1e-4, atol=1e-5)
    stats = client.get_inference_statistics("mlp", **as_json)["model_stats"][0]
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(r * n for r, n in batches.items()) == int(stats["inference_count"]) >= sum(ROWS)
    assert int(stats["execution_count"]) == sum(batches.values()) < int(stats["inference_count"])
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_max_batch_size_below_the_compiled_size_bounds_the_rows_of_a_request(request, protocol):
    module, url, as_json = _client(request, protocol)
    client = module.InferenceServerClient(url)
    config = client.get_model_config("mlp4", **as_json)
    assert int(config.get("config", config)["max_batch_size"]) == 4
    for rows in (4, 5):
        tensor = module.InferInput("input", [rows, 784], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 784), np.float32))
        if rows == 4:
            np.testing.assert_allclose(client.infer("mlp4", [tensor]).as_numpy("output"),
                                       _alone(np.ones((4, 784), np.float32)), rtol=1e-4, atol=1e-5)
            continue
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp4", [tensor])
        assert "input 'input' has 5 rows: the model takes 1 to 4 rows per request (max_batch_size)" in str(refused.value)
    client.close()


def _spec(tmp_path, compiled, config: str, **folder):
    from tvmsched.serve import triton_config

    path = _folder(tmp_path, compiled, config, **folder)
    return triton_config.spec(path.name, path)


def test_the_config_becomes_the_model_spec(tmp_path, compiled):
    spec = _spec(tmp_path, compiled, CONFIG)
    assert (spec.version, spec.max_batch_size, spec.preferred_batch_sizes, spec.max_queue_delay_us) == ("3", 8, (4, 8), 2000)
    assert (spec.qos_ms, spec.priority, spec.streams, spec.max_queue) == (60000.0, "best_effort", 1, 64)
    assert spec.queue_policy == {"timeout_action": "reject", "default_timeout_us": 60000000, "allow_timeout_override": False}
    assert spec.path.endswith("/3/model.tvms") and spec.refresh_sizes is False
    refreshed = _spec(tmp_path / "b", compiled,
                      CONFIG + 'parameters { key: "refresh_sizes" value: { string_value: "true" } }\n')
    assert refreshed.refresh_sizes is True and refreshed.qos_ms == 60000.0


REFUSED = {
    "sequence batching": ('name: "mlp"\nbackend: "tvmsched"\nmax_batch_size: 8\n\nsequence_batching {\n'
                          '  max_sequence_idle_microseconds: 5\n}\n', r":5: sequence_batching is not supported"),
    "an optimization": (CONFIG + 'optimization { execution_accelerators { cpu_execution_accelerator : [ { name : '
                        '"openvino" } ] } }\n', r":12: optimization is not supported by the tvmsched backend"),
    "a response cache": (CONFIG + "response_cache { enable: true }\n", r":12: response_cache is not supported"),
    "an instance's profile": (CONFIG.replace("count: 1 kind", 'count: 1 profile: "x" kind'),
                              r":10: instance_group.profile is not supported"),
    "a queue policy field": (CONFIG.replace("max_queue_size: 64", "max_queue_size: 64 } priority_queue_policy { key: 1 "
                                            "value { max_queue_size: 2 }"),
                             r":8: dynamic_batching.priority_queue_policy is not supported"),
    "a syntax error": (CONFIG.replace("max_batch_size: 8", "max_batch_size 8"), r":3: "),
    "an unknown field": (CONFIG.replace("max_batch_size: 8", "max_batch_size: 8\nmax_batch: 4"), r":4: "),
    "another backend": (CONFIG.replace('backend: "tvmsched"', 'backend: "onnxruntime"'),
                        r':2: backend must be "tvmsched", not \'onnxruntime\''),
    "too many rows": (CONFIG.replace("max_batch_size: 8", "max_batch_size: 16"),
                      r":3: max_batch_size 16: the artifact is compiled for up to 8 rows"),
    "a wrong input": (CONFIG + 'input [ { name: "input" data_type: TYPE_FP32 dims: [ 783 ] } ]\n',
                      r":12: input 'input' has dims \[784\] in the artifact \(without the batch\), not \[783\]"),
    "a wrong type": (CONFIG + 'output [ { name: "output" data_type: TYPE_INT64 dims: [ 10 ] } ]\n',
                     r":12: output 'output' is TYPE_FP32 in the artifact, not TYPE_INT64"),
    "another device": (CONFIG.replace("kind: KIND_CPU", "kind: KIND_GPU gpus: [ 1 ]"),
                       r":10: instance_group gpus \[1\]: the server has 1 device \(cpu\)$"),
    "another kind of device": (CONFIG.replace("kind: KIND_CPU", "kind: KIND_GPU"),
                               r":10: instance_group kind KIND_GPU cannot run on this server's device \(cpu\): use "
                               "KIND_CPU or KIND_AUTO$"),
    "an unknown parameter": (CONFIG + 'parameters { key: "threads" value: { string_value: "4" } }\n',
                             r":12: parameters 'threads' is not one the tvmsched backend reads"),
    "a refresh_sizes not a bool": (CONFIG + 'parameters { key: "refresh_sizes" value: { string_value: "yes" } }\n',
                                   r":12: parameters refresh_sizes is true or false, not 'yes'$"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_config_tvmsched_cannot_honour_is_refused_in_one_line_giving_file_and_line(tmp_path, compiled, case):
    config, pattern = REFUSED[case]
    with pytest.raises(TvmschedError) as refused:
        _spec(tmp_path, compiled, config)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "mlp" / "config.pbtxt")), message
    assert re.search(pattern, message), message


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_cpp_server_refuses_the_same_configs_with_the_same_line(cpp_build, tmp_path, compiled, case):  # noqa: F811
    config, pattern = REFUSED[case]
    _folder(tmp_path, compiled, config)
    done = subprocess.run([str(cpp_build / "tvmsched_server"), "--model-repository", str(tmp_path), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    message = done.stderr.removeprefix("error: ").strip()
    assert "\n" not in message and message.startswith(str(tmp_path / "mlp" / "config.pbtxt")), message
    assert re.search(pattern, message), message


def test_serve_refuses_a_bad_config_at_start_and_a_preferred_size_that_is_not_compiled(tmp_path, compiled):
    def serve(config: str) -> subprocess.CompletedProcess:
        root = tmp_path / f"repo{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        _folder(root, compiled, config)
        return subprocess.run([sys.executable, "-m", "tvmsched.cli", "serve", "--model-repository", str(root), "--port",
                               str(free_port()), "--grpc-port", str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=300)

    done = serve(CONFIG.replace("preferred_batch_size: [ 4, 8 ]", "preferred_batch_size: [ 3 ]"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "preferred_batch_size 3 is not one of its compiled batch sizes (1, 2, 4, 8)" in done.stderr
    done = serve(CONFIG + "model_warmup [ { name: \"w\" batch_size: 1 } ]\n")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "config.pbtxt:12: model_warmup is not supported by the tvmsched backend" in done.stderr


HOSTILE_FOLDER_CONFIGS = {  # tvmsched's own layout: each one line naming the file, read by the engine for both servers
    "nested 100 deep": ("config.json", "[" * 100 + "]" * 100, r"config\.json: nests deeper than 64 levels$"),
    "not an object": ("config.json", "[1, 2]", r"config\.json must hold an object$"),
    "a NaN qos_ms": ("config.toml", "qos_ms = nan\n", r"config\.toml: Out of range float values"),
    "TOML that does not parse": ("config.toml", "streams = [oops\n", r"cannot read .*config\.toml: "),
    "a bool for an int": ("config.json", '{"max_queue": true}', r"config\.json: max_queue has the wrong type \(bool\)$"),
    "a wrong preferred size": ("config.json", '{"preferred_batch_sizes": [0]}',
                               r"preferred_batch_sizes must be a list of row counts from 1 to 1048576$"),
    "a string for a bool": ("config.json", '{"refresh_sizes": "true"}',
                            r"config\.json: refresh_sizes has the wrong type \(str\)$"),
}


def test_a_folder_config_turns_on_the_sizes_figures_following_the_launches(tmp_path, compiled):
    from tvmsched.serve.repository import Repository

    for name, text in (("on", '{"refresh_sizes": true}'), ("off", "{}")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "m.tvms").symlink_to(compiled("mlp"))
        (tmp_path / name / "config.json").write_text(text)
    assert (Repository(tmp_path).spec("on").refresh_sizes, Repository(tmp_path).spec("off").refresh_sizes) == (True, False)


@pytest.mark.parametrize("case", list(HOSTILE_FOLDER_CONFIGS))
def test_a_hostile_folder_config_is_one_line(tmp_path, compiled, case):
    from tvmsched.serve.repository import Repository

    name, text, pattern = HOSTILE_FOLDER_CONFIGS[case]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "m.tvms").symlink_to(compiled("mlp"))
    (tmp_path / "m" / name).write_text(text)
    with pytest.raises(TvmschedError) as refused:
        Repository(tmp_path).spec("m")
    message = str(refused.value)
    assert "\n" not in message and re.search(pattern, message), message
