"""The wheel as a user installs it: `make setup` builds it once into build/wheelhouse/ with the wheels of its run-time
dependencies; here it is installed offline (`--no-index --find-links`) into a fresh virtual environment without
extras, and `tvmsched models build`, `compile`, `inspect`, `run` and `serve` (health and one inference through
tritonclient, HTTP and gRPC) run on the zoo's mlp with `python -P -m tvmsched.cli` from the repository root (-P: the
source folder ./tvmsched must not shadow the installed package). Neither torch, nor grpcio-tools, nor the packages of
the `tune` and `db` extras may be installed there.

About 60-90 s on 2 cores (over the 60 s aim): ~15 s for the offline install (`--no-compile`: byte-compiling
apache-tvm's modules took it to 60 s; that wheel alone unpacks ~300 MB), the rest five CLI processes that each import
TVM, and the server's start.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, free_port, onnxruntime_outputs, start_server, stop_server

WHEELHOUSE = ROOT / "build" / "wheelhouse"
# what the core install must not bring: torch (collectives, models), the build's generator, the tune and db extras
ABSENT = ("torch", "grpcio-tools", "cloudpickle", "tornado", "xgboost-cpu", "xgboost", "psycopg", "psycopg-binary",
          "httpx")


def _offline_env() -> dict[str, str]:
    """pip sees the wheelhouse alone: no configuration file, no index or find-links from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel and its dependencies installed from the wheelhouse alone."""
    wheels = sorted(WHEELHOUSE.glob("tvmsched-*.whl"))
    if len(wheels) != 1 or not (WHEELHOUSE / ".deps").is_file():
        pytest.fail(f"{WHEELHOUSE} lacks the tvmsched wheel or its dependencies' wheels: run `make setup`")
    folder = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    # this environment's pip installs into the new one (--python): no pip inside it, and no network
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                           "--no-index", "--find-links", str(WHEELHOUSE), str(wheels[0])],
                          capture_output=True, text=True, env=_offline_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def _cli(venv: Path, *args) -> subprocess.CompletedProcess:
    """`python -P -m tvmsched.cli ARGS` with the venv's interpreter, from the repository root."""
    return subprocess.run([str(venv / "bin" / "python"), "-P", "-m", "tvmsched.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=_offline_env())


def _assert_lacks_the_extras(venv: Path) -> None:
    """Neither the extras' packages nor the build's generator are installed, nor asked for by tvmsched's core."""
    script = """
import importlib.metadata as m, json, sys
names = json.loads(sys.argv[1])
installed = sorted(n for n in names if any(True for _ in m.distributions(name=n)))
requires = [r for r in m.requires("tvmsched") if "extra ==" not in r]
print(json.dumps({"installed": installed, "requires": requires}))
"""
    done = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", script, json.dumps(ABSENT)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["installed"] == [], found["installed"]
    assert not [r for r in found["requires"] if r.split(";")[0].split("=")[0].split(">")[0].strip() in ABSENT]


def test_core_install_runs_cli_and_server(venv, tmp_path):
    """One test (one venv, whichever pytest-xdist worker runs it)."""
    _assert_lacks_the_extras(venv)
    where = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", "import tvmsched.runtime.native as n, "
                            "tvmsched.serve.grpc_stubs as g; g.stubs(); print(n.library_path())"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the installed engine, not the checkout's

    onnx_path, artifact = tmp_path / "mlp.onnx", tmp_path / "mlp.tvms"
    for args in (("models", "build", "mlp", "-o", onnx_path), ("compile", onnx_path, "-o", artifact)):
        done = _cli(venv, *args)
        assert done.returncode == 0, (args, done.stderr[-3000:])
    done = _cli(venv, "inspect", artifact, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["layers"]

    import onnx

    model = onnx.load(onnx_path)
    x = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    want = onnxruntime_outputs(model, {"input": x})["output"]
    np.savez(tmp_path / "in.npz", input=x)
    done = _cli(venv, "run", artifact, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "out.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["output"], want, rtol=1e-4, atol=1e-5)

    http, grpc = free_port(), free_port()
    server = start_server([str(venv / "bin" / "python"), "-P", "-m", "tvmsched.cli", "serve", "--model",
                           f"mlp={artifact}", "--port", str(http), "--grpc-port", str(grpc)],
                          f"http://127.0.0.1:{http}", ready="/v2/health/ready")
    try:
        import tritonclient.grpc as triton_grpc
        import tritonclient.http as triton

        client = triton.InferenceServerClient(f"127.0.0.1:{http}")
        assert client.is_server_live() and client.is_model_ready("mlp")
        tensor = triton.InferInput("input", [1, 784], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("mlp", [tensor]).as_numpy("output"), want, rtol=1e-4, atol=1e-5)
        client.close()
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc}")  # the stubs generated at build time
        assert client.is_server_ready()
        client.close()
    finally:
        code = stop_server(server)
    assert code == 0, server.stderr.read()[-3000:]


def test_wheel_holds_the_engine_not_its_sources():
    import zipfile

    wheel = next(WHEELHOUSE.glob("tvmsched-*.whl"), None)
    if wheel is None:
        pytest.fail(f"no tvmsched wheel in {WHEELHOUSE}: run `make setup`")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("tvmsched/lib/libtvmsched_engine.so", "tvmsched/include/tvmsched/engine.h",
                 "tvmsched/cmake/tvmsched-config.cmake", "tvmsched/serve/grpc_service_pb2.py",
                 "tvmsched/serve/grpc_service_pb2_grpc.py", "tvmsched/serve/proto/grpc_service.proto",
                 "tvmsched/runtime/native.py", "tvmsched/runtime/collectives/data/host_count_traces.json",
                 "tvmsched/tuning_db/migrations/script.py.mako", "tvmsched/passes/__init__.py",
                 "tvmsched/models/__init__.py"):
        assert name in names, name
    assert not [n for n in names if n.startswith("tvmsched/runtime/native/") or n.endswith(".cc")]
    assert importlib.metadata.version("tvmsched") in wheel.name
