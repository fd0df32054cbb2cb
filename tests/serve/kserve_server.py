"""Shared by tests/serve: a model repository (mlp, bert-tiny) and `tvmsched serve` over it on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.helpers import free_port, start_server, stop_server
from tvmsched import models

MODELS = {"mlp": {"qos_ms": 1000, "streams": 2}, "bert": {"max_queue": 2}}  # served name -> config.json
ZOO = {"mlp": "mlp", "bert": "bert-tiny"}


@dataclass
class Served:
    process: subprocess.Popen
    http: str  # host:port
    grpc: str
    repository: Path
    onnx: dict  # served name -> ModelProto
    references: object  # the session's `reference` fixture

    def reference(self, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.references(self.onnx[name], inputs)


def build_repository(folder: Path, compiled) -> dict:
    """The repository's artifacts: copies of the session's shared ones (`compiled`, the fixture)."""
    onnx = {}
    for name, config in MODELS.items():
        model = models.build(ZOO[name])
        (folder / name).mkdir(parents=True)
        compiled.copy(model, folder / name / f"{name}.tvms", name=name)
        (folder / name / "config.json").write_text(json.dumps(config))
        onnx[name] = model
    return onnx


def start(folder: Path, *extra: str, compiled, reference) -> Served:
    """Build the repository in `folder` and serve it; waits (at most 300 s) until /v2/health/ready answers 200.
    `compiled` and `reference`: the session's fixtures (the artifacts and onnxruntime outputs of the shared cache)."""
    onnx = build_repository(folder / "repo", compiled)
    http, grpc = free_port(), free_port()
    command = [sys.executable, "-m", "tvmsched.cli", "serve", "--model-repository", str(folder / "repo"),
               "--port", str(http), "--grpc-port", str(grpc), *extra]
    process = start_server(command, f"http://127.0.0.1:{http}", ready="/v2/health/ready")
    return Served(process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", folder / "repo", onnx, reference)


def stop(served: Served) -> None:
    """SIGTERM; the server drains and exits 0."""
    code = stop_server(served.process)
    assert code == 0, (code, served.process.stderr.read())


def mlp_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 784), dtype=np.float32)


def bert_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 128, 128)).astype(np.float32)
