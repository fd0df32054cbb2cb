"""Deploying on KServe (issue 40, step 6; docs/deploy.md): deploy/kserve's ServingRuntime and InferenceService are
valid against KServe's CRD OpenAPI schemas (vendored in deploy/kserve/crd, the version in its VERSION file) and agree
with each other; the ServingRuntime's container command, run against a folder laid out as KServe mounts the storageUri
(/mnt/models, a repository in Triton's layout), answers tritonclient over REST and gRPC as onnxruntime does."""

from __future__ import annotations

import copy
import gzip
import json
import sys

import numpy as np
import pytest

from tests.helpers import ROOT, free_port, start_server, stop_server
from tvmsched import models

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
ort = pytest.importorskip("onnxruntime")

KSERVE = ROOT / "deploy" / "kserve"
BROKEN = {  # a field of the wrong type in each manifest: the schema check must catch it
    "servingruntime.yaml": lambda doc: doc["spec"]["containers"][0].update(ports="8080"),
    "inferenceservice.yaml": lambda doc: doc["spec"]["predictor"].update(minReplicas="one"),
}


def _manifest(name: str) -> dict:
    return yaml.safe_load((KSERVE / name).read_text())


def _errors(doc: dict) -> list[str]:
    """The schema errors of a manifest against the vendored CRD of its apiVersion and kind."""
    group, version = doc["apiVersion"].split("/")
    path = KSERVE / "crd" / f"{doc['kind']}.{version}.json.gz"
    assert path.exists(), f"no vendored CRD schema for {doc['kind']} {version}"
    crd = json.loads(gzip.decompress(path.read_bytes()))
    assert crd["group"] == group
    # a CRD's structural schema is OpenAPI v3 (JSON Schema keywords; the x-kubernetes-* extensions are annotations)
    validator = jsonschema.Draft7Validator(crd["openAPIV3Schema"])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_manifests_are_valid_against_kserves_crd_schemas(name):
    doc = _manifest(name)
    assert _errors(doc) == []
    broken = copy.deepcopy(doc)
    BROKEN[name](broken)
    assert _errors(broken), "the schema check caught nothing"
    assert (KSERVE / "crd" / "VERSION").read_text().startswith("kserve v")


def test_the_inference_service_names_the_runtime_its_format_and_a_protocol_it_speaks():
    runtime, service = _manifest("servingruntime.yaml"), _manifest("inferenceservice.yaml")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


def test_the_runtimes_container_command_serves_a_folder_laid_out_as_kserve_mounts_it(tmp_path, compiled):
    container = _manifest("servingruntime.yaml")["spec"]["containers"][0]
    argv = container["command"] + container["args"]
    models_dir = tmp_path / "mnt" / "models"  # KServe's storage initializer: the storageUri's repository here
    (models_dir / "mlp" / "1").mkdir(parents=True)
    (models_dir / "mlp" / "config.pbtxt").write_text('backend: "tvmsched"\nmax_batch_size: 8\n'
                                                      "dynamic_batching { max_queue_delay_microseconds: 500 }\n")
    (models_dir / "mlp" / "1" / "model.tvms").symlink_to(compiled("mlp", batch_size=[1, 2, 4, 8]))
    http, grpc = free_port(), free_port()
    # what differs here from the cluster: the mount's path, the host, free ports, and CPU for the GPU
    swap = {"/mnt/models": str(models_dir), "0.0.0.0": "127.0.0.1", "8080": str(http), "8081": str(grpc),
            "cuda": "cpu"}
    assert set(swap) <= set(argv) and argv[0] == "tvmsched", argv
    command = [sys.executable, "-m", "tvmsched.cli", *(swap.get(a, a) for a in argv[1:])]
    ready = container["readinessProbe"]["httpGet"]["path"]
    process = start_server(command, f"http://127.0.0.1:{http}", ready=ready)
    try:
        session = ort.InferenceSession(models.build("mlp").SerializeToString(), providers=["CPUExecutionProvider"])
        rows = np.random.default_rng(6).standard_normal((3, 784)).astype(np.float32)
        for module, url in ((tritonclient_http, f"127.0.0.1:{http}"), (tritonclient_grpc, f"127.0.0.1:{grpc}")):
            client = module.InferenceServerClient(url)
            assert client.is_server_live() and client.is_model_ready("mlp")
            tensor = module.InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            want = np.concatenate([session.run(None, {"input": rows[i : i + 1]})[0] for i in range(len(rows))])
            np.testing.assert_allclose(client.infer("mlp", [tensor]).as_numpy("output"), want, rtol=1e-4, atol=1e-5)
            client.close()
    finally:
        assert stop_server(process) == 0
