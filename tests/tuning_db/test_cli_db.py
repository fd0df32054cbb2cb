"""`tvmsched db ...` and `compile --db` through the CLI, against a service started by `tvmsched db serve`."""

import json
import socket
import subprocess
import sys
import time

import httpx
import onnx
import pytest

from tests.helpers import assert_user_error, run_cli
from tvmsched import models

TOKEN = "s3cret-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`tvmsched db serve` on a free loopback port with a token: (url, sqlite url, token file)."""
    folder = tmp_path_factory.mktemp("served")
    token_file, db = folder / "token", f"sqlite:///{folder / 'svc.db'}"
    token_file.write_text(TOKEN + "\n")
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "tvmsched.cli", "db", "serve", "--db", db, "--port", url.rsplit(":", 1)[1], "--token-file", token_file]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"tvmsched db serve did not come up: {proc.stderr.read()[-2000:]}")
    yield url, db, token_file
    proc.terminate()
    proc.wait(10)


def test_compile_through_the_service_then_recompile_from_it(served, tmp_path):
    url, db, token_file = served
    model = tmp_path / "tiny.onnx"
    onnx.save(models.build("tiny"), model)
    first = run_cli("compile", model, "--tune-trials", "4", "--db", url, "--db-token-file", token_file)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 layers tuned" in first.stdout
    remote = json.loads(run_cli("db", "stats", "--db", url, "--json").stdout)
    assert remote == json.loads(run_cli("db", "stats", "--db", db, "--json").stdout)
    assert remote["workloads"] == 1 and remote["records"] >= 1
    # reads need no token: re-compiling from the service runs zero new trials
    again = run_cli("compile", model, "--tune-trials", "4", "--db", url)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "1 from the database" in again.stdout and "0 new trials" in again.stdout


def test_writes_without_the_token_are_a_user_error(served, tmp_path):
    url, db, _ = served
    model = tmp_path / "mlp.onnx"
    onnx.save(models.build("mlp"), model)
    before = run_cli("db", "stats", "--db", db, "--json").stdout
    assert_user_error(run_cli("compile", model, "--tune-trials", "4", "--db", url), "needs a valid token", after_progress=True)
    assert run_cli("db", "stats", "--db", db, "--json").stdout == before


def test_database_url_errors(tmp_path):
    model = tmp_path / "tiny.onnx"
    onnx.save(models.build("tiny"), model)
    assert_user_error(run_cli("compile", model, "--tune-trials", "2", "--db", "ftp://nowhere"), "unsupported database URL")
    assert_user_error(run_cli("db", "stats", "--db", "http://127.0.0.1:1"), "cannot reach")
    assert_user_error(run_cli("db", "serve", "--token-file", tmp_path / "missing"), "token")
    assert_user_error(run_cli("compile", model, "--tune-trials", "-1"), "--tune-trials")


def test_export_then_import_round_trip(served, tmp_path):
    _, db, _ = served
    exported = run_cli("db", "export", tmp_path / "ms", "--db", db)
    assert exported.returncode == 0, exported.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"
    for _ in range(2):  # the second import adds nothing
        imported = run_cli("db", "import", tmp_path / "ms", "--db", other, "--units", "2", "--unit-kind", "cpu_thread")
        assert imported.returncode == 0, imported.stderr
    assert run_cli("db", "stats", "--db", other, "--json").stdout == run_cli("db", "stats", "--db", db, "--json").stdout
