"""Time per request inside the server at concurrency 1: build/cpp/tvmsched_server (an adapter over the engine's
Runtime) beside `tvmsched serve`, on one model, interleaved rounds (issue 38, step 5).

    python bench/cpp_server_overhead.py ARTIFACT.tvms [--rounds 10] [--requests 200]

Each round sends REQUESTS binary-tensor requests (tritonclient's body, one keep-alive http.client connection, one at a
time) to each server in turn. Inside = Triton's statistics over the round: (success - queue - compute_infer) ns /
count, the server's own time around the Runtime; client p50 is the round's median round trip; the C++ server also
times decoding (compute_input) and encoding (compute_output). Its success time ends after the answer is encoded,
tvmsched serve's before: the C++ server's "inside" includes encoding, tvmsched serve's does not. Prints the medians over
the rounds and the load average.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port, start_server, stop_server  # noqa: E402


def body(shape) -> tuple[bytes, int]:
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(shape),
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    return header + x.tobytes(), len(header)


def stats(conn: http.client.HTTPConnection) -> dict:
    conn.request("GET", "/v2/models/mlp/stats")
    return json.loads(conn.getresponse().read())["model_stats"][0]["inference_stats"]


def round_(port: int, data: bytes, header: int, n: int) -> tuple[float, float, float, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    before, times = stats(conn), []
    for _ in range(n):
        start = time.perf_counter_ns()
        conn.request("POST", "/v2/models/mlp/infer", body=data, headers={"Inference-Header-Content-Length": str(header)})
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200
        times.append(time.perf_counter_ns() - start)
    after = stats(conn)
    conn.close()
    delta = {k: (after[k]["ns"] - before[k]["ns"], after[k]["count"] - before[k]["count"]) for k in after}
    inside = (delta["success"][0] - delta["queue"][0] - delta["compute_infer"][0]) / delta["success"][1]
    per = lambda key: delta[key][0] / max(delta[key][1], 1) / 1e3  # µs per request (0: the server does not time it)
    return inside / 1e3, statistics.median(times) / 1e3, per("compute_input"), per("compute_output")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    cpp, serve = free_port(), free_port()
    servers = {
        "cpp": start_server([str(ROOT / "build/cpp/tvmsched_server"), "--port", str(cpp), "--model",
                             f"mlp={args.artifact}"], f"http://127.0.0.1:{cpp}"),
        "serve": start_server([sys.executable, "-m", "tvmsched.cli", "serve", "--port", str(serve), "--grpc-port", "0",
                               "--model", f"mlp={args.artifact}"], f"http://127.0.0.1:{serve}", ready="/v2/health/ready"),
    }
    ports = {"cpp": cpp, "serve": serve}
    data, header = body((1, 784))
    load = [os.getloadavg()[0]]
    results = {name: [] for name in servers}
    try:
        for name in servers:  # warm both
            round_(ports[name], data, header, 50)
        for _ in range(args.rounds):
            for name in servers:
                results[name].append(round_(ports[name], data, header, args.requests))
        load.append(os.getloadavg()[0])
    finally:
        for proc in servers.values():
            stop_server(proc)
    print(f"load average (1 min): {load[0]:.2f} at the start, {load[-1]:.2f} at the end; {args.rounds} rounds of "
          f"{args.requests} requests")
    for name, rows in results.items():
        inside = statistics.median(r[0] for r in rows)
        client = statistics.median(r[1] for r in rows)
        print(f"{name}: inside the server p50-of-rounds {inside:.1f} µs (min {min(r[0] for r in rows):.1f}, "
              f"max {max(r[0] for r in rows):.1f}); client round trip {client:.1f} µs; of it, decoding the request "
              f"{statistics.median(r[2] for r in rows):.1f} µs (compute_input; 0: not timed apart), encoding the answer "
              f"{statistics.median(r[3] for r in rows):.1f} µs (compute_output)")


if __name__ == "__main__":
    main()
