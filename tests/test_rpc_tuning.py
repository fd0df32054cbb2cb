"""Tuning trials measured through TVM's RPC tracker and server (loopback), as for a remote GPU."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import onnx
import pytest

from tests.helpers import assert_user_error, run_cli
from tvmsched import models


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_key(port: int, key: str, timeout_s: float = 300) -> None:  # returns once registered
    from tvm import rpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            summary = rpc.connect_tracker("127.0.0.1", port).summary()
            if any(key in str(entry) for entry in summary.get("server_info", [])):
                return
        except Exception:  # the tracker is still starting
            pass
        time.sleep(0.1)
    pytest.fail(f"no RPC server registered key {key!r} with the tracker on port {port}")


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Returns once something listens on 127.0.0.1:`port` (the tracker `proc` started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the RPC tracker never listened on port {port} (exit status {proc.poll()})")


@pytest.fixture(scope="module")
def tracker():
    port, server_port, key = free_port(), free_port(), "tvmsched-test-cpu"
    # both need --port-end above --port (its default, 9199, makes a higher --port fail to bind)
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        _wait_for_port(port, procs[0])  # (a server that finds no tracker retries only after 5 s)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key,
             "--host", "127.0.0.1", "--port", str(server_port), "--port-end", str(server_port + 1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        ))
        wait_for_key(port, key)
        yield f"127.0.0.1:{port}:{key}"
    finally:  # each runs its server in a popen_worker child: the whole group goes (a lone terminate orphaned them)
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)


def test_tuning_measures_through_rpc(tracker, tmp_path, cli):
    model, db = tmp_path / "tiny.onnx", f"sqlite:///{tmp_path / 'rpc.db'}"
    onnx.save(models.build("tiny"), model)
    result = cli("compile", model, "--tune-trials", "4", "--db", db, "--rpc", tracker)
    assert result.returncode == 0, result.stderr[-3000:]
    # searched through the RPC runner: the tuned kernel, or the default where that measured faster (machine speed)
    assert "1 layers tuned" in result.stdout or "1 kept the faster default schedule" in result.stdout, result.stdout
    assert json.loads(cli("db", "stats", "--db", db, "--json").stdout)["records"] >= 1
    check = cli("run", tmp_path / "tiny.tvms", "--check", model)
    assert check.returncode == 0 and "-> OK" in check.stdout


def test_malformed_rpc_spec(tmp_path):
    model = tmp_path / "tiny.onnx"
    onnx.save(models.build("tiny"), model)
    assert_user_error(run_cli("compile", model, "--tune-trials", "2", "--rpc", "localhost:nine"), "HOST:PORT:KEY", after_progress=True)
    assert_user_error(run_cli("compile", model, "--rpc", "127.0.0.1:9190:cpu"), "--rpc")
