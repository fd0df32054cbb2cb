"""Time per request inside the servers at concurrency 1 (issue 38's goals): build/cpp/tvmsched_server (an adapter over
the engine's Runtime) and `tvmsched serve` (REST binary and gRPC) beside a direct `Runtime.submit` in this process, on
one or more models, in interleaved rounds.

    python bench/cpp_server_overhead.py mlp.tvms bert-tiny.tvms resnet18-small.tvms [--rounds 10] [--requests 200]
        [--h2load]

Both servers serve every model (named by the artifact's file name). Each round sends REQUESTS requests, one at a time,
for each model and way in turn: `direct` (Runtime.submit(...).result() in this process, no server), `cpp` and `rest`
(the binary-tensor body tritonclient sends, on one keep-alive http.client connection), `grpc` (tritonclient.grpc,
raw input contents). Two measures per model and server way, medians over the rounds:
- inside: Triton's statistics over the round, (success - queue - compute_infer) ns / count: the server's own time
  around the Runtime. The C++ server counts a success after encoding its answer, tvmsched serve before.
- overhead: the round's client p50 minus the same round's direct p50 (protocol, client, server, network stack).
The C++ server also times decoding (compute_input) and encoding (compute_output) apart. Prints a table and the load
average.

With --h2load, three more ways send the same requests from nghttp2's h2load (`apt-get install nghttp2-client`), a C
client, one request at a time on one connection: `cpp·h2load` and `rest·h2load` (HTTP/1.1, the same binary body),
`grpc·h2load` (HTTP/2, the ModelInferRequest tritonclient.grpc sends, framed as gRPC). Their client p50 is read from
h2load's per-request log. They show the overhead without a Python client's own time on the same 2 cores; the
servers' statistics must count every request a success (h2load does not read gRPC's status trailer). The `live` ways
are the floor of each: h2load asking the same server's liveness (GET /v2/health/live, gRPC ServerLive) the same way,
a round trip through the client, the network stack and the server's protocol layer that runs no model.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port, start_server, stop_server  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from serve_split import binary_body, grpc_message  # noqa: E402

WAYS = ("direct", "cpp", "rest", "grpc")
H2LOAD_WAYS = ("cpp·h2load", "rest·h2load", "grpc·h2load", "cpp·h2load live", "rest·h2load live", "grpc·h2load live")


def model_io(path: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """An artifact's inputs (Executor.random_inputs, seeded) and output names."""
    from tvmsched.runtime import Executor

    executor = Executor(str(path))
    return executor.random_inputs(0), [b.name for b in executor.manifest.outputs]


def stats(conn: http.client.HTTPConnection, model: str) -> dict:
    conn.request("GET", f"/v2/models/{model}/stats")
    return json.loads(conn.getresponse().read())["model_stats"][0]["inference_stats"]


def timed(call, n: int) -> float:
    """The median µs of `n` calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def round_(way: str, port: int, grpc_port: int, model: str, io, n: int, clients: dict) -> tuple[float, float, float, float]:
    """(inside µs, client p50 µs, compute_input µs, compute_output µs) of one round of `way` on `model` (statistics
    from the HTTP `port`; gRPC requests to `grpc_port`)."""
    inputs, outputs = io
    if way.endswith(" live"):
        return float("nan"), h2load_p50(way, port, grpc_port, model, io, n), 0.0, 0.0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    before = stats(conn, model)
    if way.endswith("·h2load"):
        p50 = h2load_p50(way, port, grpc_port, model, io, n)
    elif way == "grpc":
        import tritonclient.grpc as tc

        client = clients.setdefault(grpc_port, tc.InferenceServerClient(f"127.0.0.1:{grpc_port}"))
        tensors = []
        for k, v in inputs.items():
            tensors.append(tc.InferInput(k, list(v.shape), tc.np_to_triton_dtype(v.dtype)))
            tensors[-1].set_data_from_numpy(v)
        requested = [tc.InferRequestedOutput(o) for o in outputs]
        p50 = timed(lambda: client.infer(model, tensors, outputs=requested), n)
    elif way in ("cpp", "rest"):
        headers, data = binary_body(inputs, outputs)

        def call():
            conn.request("POST", f"/v2/models/{model}/infer", body=data, headers=headers)
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200

        p50 = timed(call, n)
    after = stats(conn, model)
    conn.close()
    delta = {k: (after[k]["ns"] - before[k]["ns"], after[k]["count"] - before[k]["count"]) for k in after}
    if delta["success"][1] != n or delta["fail"][1]:
        raise SystemExit(f"error: {way} on {model}: the server counted {delta['success'][1]} successes and "
                         f"{delta['fail'][1]} failures of {n} requests")
    inside = (delta["success"][0] - delta["queue"][0] - delta["compute_infer"][0]) / delta["success"][1]
    per = lambda key: delta[key][0] / max(delta[key][1], 1) / 1e3  # µs per request (0: the server does not time it)
    return inside / 1e3, p50, per("compute_input"), per("compute_output")


def h2load_p50(way: str, port: int, grpc_port: int, model: str, io, n: int) -> float:
    """The client p50 µs of `n` requests sent by h2load one at a time on one connection."""
    inputs, outputs = io
    with tempfile.TemporaryDirectory() as tmp:
        body, log = Path(tmp) / "body", Path(tmp) / "log"
        body_args = ["-d", str(body)]
        if way.startswith("grpc"):
            live = way.endswith(" live")
            from tritonclient.grpc import service_pb2  # (the grpc way's client has registered its protos)

            message = b"" if live else grpc_message(model, inputs, outputs, service_pb2)
            body.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)  # gRPC's framing
            url = f"http://127.0.0.1:{grpc_port}/inference.GRPCInferenceService/{'ServerLive' if live else 'ModelInfer'}"
            extra = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        elif way.endswith(" live"):
            url, extra, body_args = f"http://127.0.0.1:{port}/v2/health/live", ["--h1"], []
        else:
            headers, data = binary_body(inputs, outputs)
            body.write_bytes(data)
            url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
            extra = ["--h1", *[a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]]
        done = subprocess.run(["h2load", "-n", str(n), "-c", "1", "-t", "1", "-m", "1", *body_args,
                               f"--log-file={log}", *extra, url], capture_output=True, text=True, timeout=120)
        rows = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
        if done.returncode or len(rows) != n or any(r[1] != "200" for r in rows):
            raise SystemExit(f"error: h2load on {url} answered {len(rows)} of {n} with 200: {done.stdout[-300:]}")
        return statistics.median(int(r[2]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--h2load", action="store_true", help="also the ways of a C client (nghttp2's h2load)")
    args = parser.parse_args()
    ways = WAYS + (H2LOAD_WAYS if args.h2load else ())
    from tvmsched.runtime import Runtime

    names = [p.stem for p in args.artifacts]
    specs = [f"{n}={p}" for n, p in zip(names, args.artifacts)]
    cpp, serve, grpc = free_port(), free_port(), free_port()
    load = [os.getloadavg()[0]]
    servers = {}  # each stopped at the end, also when a later one fails to start
    commands = {
        "cpp": ([str(ROOT / "build/cpp/tvmsched_server"), "--port", str(cpp),
                 *[a for s in specs for a in ("--model", s)]], f"http://127.0.0.1:{cpp}", "/v2/health/ready"),
        "serve": ([sys.executable, "-m", "tvmsched.cli", "serve", "--port", str(serve), "--grpc-port", str(grpc),
                   *[a for s in specs for a in ("--model", s)]], f"http://127.0.0.1:{serve}", "/v2/health/ready"),
    }
    port = {"cpp": cpp, "rest": serve, "grpc": serve}
    port.update({f"{w}·h2load{live}": port[w] for w in ("cpp", "rest", "grpc") for live in ("", " live")})
    io = {n: model_io(p) for n, p in zip(names, args.artifacts)}
    results = {(n, w): [] for n in names for w in ways}
    clients: dict = {}
    try:
        for way, (command, base, ready) in commands.items():
            servers[way] = start_server(command, base, ready=ready)
        with Runtime("cpu") as rt:
            for n, p in zip(names, args.artifacts):
                rt.load(str(p), name=n)
            direct = {n: (lambda n=n: rt.submit(n, io[n][0]).result(timeout=60)) for n in names}
            for r in range(args.rounds + 1):  # round 0 warms every way up and is not counted
                for n in names:
                    for w in ways:
                        if w == "direct":
                            row = (0.0, timed(direct[n], args.requests if r else 50), 0.0, 0.0)
                        else:
                            row = round_(w, port[w], grpc, n, io[n], args.requests if r else 50, clients)
                        if r:
                            results[(n, w)].append(row)
        load.append(os.getloadavg()[0])
    finally:
        for proc in servers.values():
            stop_server(proc)
    print(f"load average (1 min): {load[0]:.2f} at the start, {load[-1]:.2f} at the end; {args.rounds} interleaved "
          f"rounds of {args.requests} requests per model and way")
    print("| model | way | inside µs (min / max of rounds) | client p50 µs | overhead = client p50 - direct p50 µs "
          "| decode / encode µs |")
    print("|---|---|---:|---:|---:|---:|")
    for n in names:
        for w in ways:
            rows = results[(n, w)]
            client = statistics.median(r[1] for r in rows)
            if w == "direct" or w.endswith(" live"):
                print(f"| {n} | {w} | | {client:.1f} | | |")
                continue
            overhead = statistics.median(r[1] - d[1] for r, d in zip(rows, results[(n, "direct")]))
            inside = statistics.median(r[0] for r in rows)
            split = (f"{statistics.median(r[2] for r in rows):.1f} / {statistics.median(r[3] for r in rows):.1f}"
                     if w == "cpp" else "")
            print(f"| {n} | {w} | {inside:.1f} ({min(r[0] for r in rows):.1f} / {max(r[0] for r in rows):.1f}) | "
                  f"{client:.1f} | {overhead:.1f} | {split} |")


if __name__ == "__main__":
    main()
