"""Shared factories for the tests: small ONNX models, CLI runs, onnxruntime references."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ROOT = Path(__file__).resolve().parent.parent


def make_model(nodes, inputs, outputs, initializers=(), opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def relu_gemm_model(dims=("N", 8)) -> onnx.ModelProto:
    """y = Relu(x @ W); `dims` sets x's declared shape (strings are dynamic)."""
    weight = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(8, 4) / 32, "W")
    return make_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 4])],
        [weight],
    )


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `tvmsched ARGS...` in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "tvmsched.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=timeout,
    )


def _process_state() -> dict:
    """What an in-process command must leave as it found it."""
    import gc
    import logging
    import os
    import signal

    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    return {
        "gc freeze count": gc.get_freeze_count(),
        "signal handlers": {sig: signal.getsignal(sig) for sig in signal.valid_signals() if sig not in (signal.SIGKILL, signal.SIGSTOP)},
        "logging handlers": {logger.name: list(logger.handlers) for logger in loggers if logger.handlers},
        "logging levels": {logger.name: logger.level for logger in loggers if logger.level != logging.NOTSET},
        "environment": dict(os.environ),
    }


def cli_in_process(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`tvmsched ARGS...` run in this process (tvmsched.cli.main.main, its one-line errors and exit codes included),
    stdout and stderr captured as a subprocess's would be: what the `cli` fixture gives, for module-scoped fixtures.

    Each call checks: no gc.freeze() left, and the signal handlers, logging handlers and levels and os.environ as
    before."""
    import os

    from click.testing import CliRunner

    from tvmsched.cli.main import main

    # modules that set up their own logger when first imported (TVM's RPC server and tracker add a handler, SQLAlchemy
    # sets a level, alembic adds a NullHandler): imported first, so that the check below sees what a command leaves
    # behind, not what an import did once per process
    import alembic.command  # noqa: F401
    import sqlalchemy  # noqa: F401
    import tvm.rpc.server  # noqa: F401
    import tvm.rpc.tracker  # noqa: F401

    argv = [str(arg) for arg in args]
    previous, before = Path.cwd(), _process_state()
    with CliRunner().isolation() as (stdout, stderr, _):
        if cwd is not None:
            os.chdir(cwd)
        try:
            code = main(argv)
        finally:
            os.chdir(previous)
            out, err = stdout.getvalue(), stderr.getvalue()
    after = _process_state()
    # handlers left behind (a call that removes another's leftovers, as MetaSchedule's loggers do, leaves none)
    added = {name: [h for h in handlers if h not in before["logging handlers"].get(name, [])]
             for name, handlers in after.pop("logging handlers").items()}
    assert not any(added.values()), f"tvmsched {' '.join(argv)} left logging handlers behind: {added}"
    for what, value in after.items():
        assert value == before[what], f"tvmsched {' '.join(argv)} left its {what} changed: {before[what]} -> {value}"
    assert after["gc freeze count"] == 0, f"tvmsched {' '.join(argv)} left objects frozen (gc.freeze)"
    return subprocess.CompletedProcess(["tvmsched", *argv], code, out.decode(), err.decode())


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str, after_progress: bool = False) -> None:
    """Exit code 2, one stderr line starting with 'error:' that names the problem, no traceback.

    With `after_progress`, progress-bar lines may come before the error line, which must be last.
    """
    stderr = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 or after_progress, stderr
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], stderr
    stderr = lines[-1]
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)


def cuda_available() -> bool:
    """Whether a CUDA device can run our kernels here (never raises)."""
    try:
        from tvmsched.runtime.devices import tvm_device

        tvm_device("cuda")
        return True
    except Exception:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(command: list[str], base: str, ready: str = "/v1/models") -> subprocess.Popen:
    """Start an example server (run from the repository root) and wait, at most 300 s (a hang guard: it returns as
    soon as the server answers, and a loaded machine may take long to import and load), until it answers
    GET BASE+ready with 200; a server that exits or stays silent fails the test with its output."""
    import httpx
    import pytest

    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            out, err = server.communicate()
            pytest.fail(f"{command[0]} exited with {server.returncode}: {out} {err}")
        try:
            if httpx.get(f"{base}{ready}", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.kill()
    pytest.fail(f"{command[0]} did not answer within 300 s")


def start_serve(*args: str) -> tuple[subprocess.Popen, str, str]:
    """`tvmsched serve ARGS...` on free REST and gRPC ports: (process, REST base URL, gRPC host:port), once ready."""
    http, grpc = free_port(), free_port()
    base = f"http://127.0.0.1:{http}"
    process = start_server([sys.executable, "-m", "tvmsched.cli", "serve", *args, "--port", str(http), "--grpc-port",
                            str(grpc)], base, ready="/v2/health/ready")
    return process, base, f"127.0.0.1:{grpc}"


def start_cpp_server(binary, *args: str) -> tuple[subprocess.Popen, str]:
    """build/cpp/tvmsched_server ARGS... on a free port: (process, base URL), once ready."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    return start_server([str(binary), *args, "--port", str(port)], base), base


def stop_server(server: subprocess.Popen) -> int:
    """Terminate a server; its exit status (killed, and TimeoutExpired raised, if it does not stop in 30 s)."""
    server.terminate()
    try:
        return server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise


def wait_until(condition, what: str, timeout_s: float = 30.0, poll_s: float = 0.001) -> None:
    """Poll `condition` until it holds; fail naming `what` once `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)


def held_mid_request(rt, model, inputs, deadline_s: float = 60):
    """Submit a request of `model` (a Runtime's) and preempt it once it started, before it finished (a few tries at
    most: a busy machine may run it through first); its future. Two requests go in at a time, so that one of them is
    running for most of the window in which this thread polls; the second, if still queued, runs on resume."""
    import pytest

    seen = {"finished first": 0, "not started": 0}
    for _ in range(200):
        futures = [rt.submit(model, inputs) for _ in range(2)]
        while not futures[-1].done():  # started: its progress went from -1 to 0 (or more)
            state = model.task.state()
            if state is not None and state.done.min() >= 0:
                break
        model.task.preempt()
        state = model.task.state()
        running = next((f for f in futures if not f.done()), None)
        if running is not None and state is not None and state.done.min() >= 0:
            return running
        seen["finished first" if running is None else "not started"] += 1
        model.task.resume()
        for future in futures:
            future.result(timeout=deadline_s)
    pytest.fail(f"could not preempt the model mid-request: {seen}")


def triton_infer(url: str, name: str, x: np.ndarray):
    """One request of model `name` with input "input" through tritonclient HTTP (a client of its own): the output
    "output", or the error's text."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(url)
    try:
        tensor = http.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer(name, [tensor]).as_numpy("output")
    except InferenceServerException as err:
        return str(err)
    finally:
        client.close()


def ray_replica_counts(replicas: int = 2) -> list[dict]:
    """`tvmsched serve-ray`'s replicas' counts (loads, requests, models), asked through the deployment handle until
    `replicas` of them answered."""
    from ray import serve

    handle = serve.get_deployment_handle("TvmschedReplica", app_name="tvmsched")
    seen = {}
    for _ in range(60):
        counts = handle.counts.remote().result(timeout_s=30)
        seen[counts["replica"]] = counts
        if len(seen) == replicas:
            break
    return list(seen.values())


def switch_footprint(path) -> int:
    """What a Runtime's switcher needs to hold the model (its sub-tasks as a Runtime registers it): the footprint a
    Runtime compares with its memory budget."""
    from tvmsched.runtime.switching import SwitchSettings, footprint_of

    return footprint_of(path, SwitchSettings().max_groups)
