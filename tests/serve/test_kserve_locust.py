"""A bounded locust run against `tvmsched serve` (4 users, 5 s, headless): every request answered right, and the
server counted exactly the requests locust sent (no response lost)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import ROOT
from tests.serve import kserve_server
from tests.serve.kserve_server import mlp_input


@pytest.fixture(scope="module")
def server(tmp_path_factory, compiled, reference):
    served = kserve_server.start(tmp_path_factory.mktemp("kserve_locust"), compiled=compiled, reference=reference)
    yield served
    kserve_server.stop(served)


def success_count(server) -> float:
    text = httpx.get(f"http://{server.http}/metrics", timeout=10).text
    return float(re.search(r'^nv_inference_request_success{model="mlp",version="1"} (\S+)$', text, re.M).group(1))


def test_locust_load_loses_no_response(server, tmp_path):
    x = mlp_input(9)
    data = tmp_path / "data.npz"
    np.savez(data, model="mlp", input_name="input", input=x, output=server.reference("mlp", {"input": x})["output"])
    before = success_count(server)
    run = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "bench/locust_kserve.py"), "--headless",
                          "-u", "4", "-r", "4", "-t", "5s", "--host", f"http://{server.http}", "--csv", str(tmp_path / "run"),
                          "--only-summary", "--stop-timeout", "10"],
                         env={**_env(), "KSERVE_LOCUST_DATA": str(data), "KSERVE_LOCUST_COUNTS": str(tmp_path / "counts.json")}, capture_output=True, text=True, timeout=120)
    rows = {row["Name"]: row for row in csv.DictReader(Path(f"{tmp_path}/run_stats.csv").open())}
    total = rows["Aggregated"]
    assert int(total["Failure Count"]) == 0, run.stderr[-2000:]
    assert int(total["Request Count"]) > 20 and int(rows["binary"]["Request Count"]) > 0 and int(rows["json"]["Request Count"]) > 0
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert counts["sent"] == counts["right"] and counts["wrong"] == 0, counts  # every request answered, right
    assert success_count(server) - before == counts["sent"]  # and the server counted exactly those


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
