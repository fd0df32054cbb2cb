"""tvmsched serve against the runtime it embeds, side by side in one run: Triton's clients (REST JSON, REST binary,
gRPC) at concurrency 1/4/16 against direct Runtime.submit on the same models (resnet18-small, bert-tiny).

    python bench/serving.py [--seconds 1.5] [--out bench/results/serving.md]

Each cell is a closed loop of C threads for --seconds (each thread its own client, one request in flight). The
direct runs (a Runtime in this process, the server not started yet) come first, then the server (a subprocess,
both models warmed up) and the clients. Server overhead per request p50 = the client's p50 minus the direct p50 at
the same concurrency (network stack, protocol, Python on both sides); "inside the server" is Triton's statistics'
(success ns - queue ns - compute ns) / count over the cell: what the server adds around the engine's queue and run.
"direct-asyncio" awaits each request in an asyncio loop as the server does: its overhead is the hand-off from the
engine's thread to the event loop, a floor under both protocols.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"resnet18-small": "input", "bert-tiny": "hidden_states"}
MODES = ("direct", "direct-asyncio", "rest-json", "rest-binary", "grpc")
CONCURRENCY = (1, 4, 16)


def compile_models(folder: Path) -> dict[str, Path]:
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    paths = {}
    for name in MODELS:
        paths[name] = folder / f"{name}.tvms"
        compile_model(models.build(name), name=name).save(paths[name])
    return paths


def closed_loop(make_call, threads: int, seconds: float) -> list[float]:
    """Latencies (µs) of `threads` loops each calling its own make_call() result for `seconds`."""
    latencies: list[float] = []
    lock = threading.Lock()
    start_line = threading.Barrier(threads)

    def loop():
        call = make_call()
        call()  # a first request outside the measurement (connections, caches)
        start_line.wait()
        mine, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter_ns()
            call()
            mine.append((time.perf_counter_ns() - t0) / 1e3)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return latencies


def direct_cells(paths, inputs, seconds) -> dict:
    from tvmsched.runtime import Runtime

    cells = {}
    with Runtime("cpu") as rt:
        for name, path in paths.items():
            model = rt.load(path, name=name, warmup=True)
            for c in CONCURRENCY:
                cells[(name, "direct", c)] = {"latencies": closed_loop(lambda m=model, n=name: (
                    lambda: rt.submit(m, inputs[n]).result()), c, seconds)}
            cells[(name, "direct-asyncio", 1)] = {"latencies": asyncio.run(_awaited(rt, model, inputs[name], seconds))}
    return cells


async def _awaited(rt, model, inputs, seconds) -> list[float]:
    """One loop awaiting each request as the server does (asyncio.wrap_future: the engine's completion wakes the
    event loop): the server's floor before any protocol."""
    await asyncio.wrap_future(rt.submit(model, inputs))
    latencies, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns()
        await asyncio.wrap_future(rt.submit(model, inputs))
        latencies.append((time.perf_counter_ns() - t0) / 1e3)
    return latencies


def client_call(mode: str, url: str, name: str, array: np.ndarray):
    def make():
        if mode == "grpc":
            import tritonclient.grpc as tc
        else:
            import tritonclient.http as tc
        client = tc.InferenceServerClient(url)
        tensor = tc.InferInput(MODELS[name], list(array.shape), "FP32")
        binary = mode != "rest-json"
        if mode == "grpc":
            tensor.set_data_from_numpy(array)
            outputs = [tc.InferRequestedOutput("output")]
        else:
            tensor.set_data_from_numpy(array, binary_data=binary)
            outputs = [tc.InferRequestedOutput("output", binary_data=binary)]
        return lambda: client.infer(name, [tensor], outputs=outputs).as_numpy("output")
    return make


def server_cells(paths, inputs, seconds, port: int) -> dict:
    import httpx

    command = [sys.executable, "-m", "tvmsched.cli", "serve", "--port", str(port), "--grpc-port", str(port + 1),
               "--max-queue", "1024", *[f"--model={n}={p}" for n, p in paths.items()]]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("tvmsched serve did not start")
        cells = {}
        for name in paths:
            for mode in MODES[2:]:
                url = f"127.0.0.1:{port + 1}" if mode == "grpc" else f"127.0.0.1:{port}"
                for c in CONCURRENCY:
                    before = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                    latencies = closed_loop(client_call(mode, url, name, inputs[name][MODELS[name]]), c, seconds)
                    after = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                    cells[(name, mode, c)] = {"latencies": latencies, "inside_us": _inside_us(before, after)}
        return cells
    finally:
        server.terminate()
        server.wait(timeout=60)


def _inside_us(before: dict, after: dict) -> float:
    delta = lambda key: after["inference_stats"][key]["ns"] - before["inference_stats"][key]["ns"]
    count = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    return (delta("success") - delta("queue") - delta("compute_infer")) / max(count, 1) / 1e3


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{model}, nproc {os.cpu_count()}, {platform.platform()}, python {platform.python_version()}"


def report(cells, seconds, command) -> str:
    import grpc
    import importlib.metadata

    lines = ["# tvmsched serve: Triton's clients against direct Runtime.submit (CPU)", "",
             f"Command: `{command}`", "",
             f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the end. tritonclient "
             f"{importlib.metadata.version('tritonclient')}, grpcio {grpc.__version__}. "
             f"Date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. No GPU.", "",
             f"Closed loops of C client threads for {seconds} s per cell, one request in flight per thread, the client "
             f"and the server on the same {os.cpu_count()} cores. Overhead = client p50 - direct p50 at the same C; inside = "
             "the server's own time per request around the engine (Triton statistics: success - queue - compute_infer); "
             "direct-asyncio: Runtime.submit awaited in an asyncio loop as the server does (its overhead: the engine's "
             "completion waking the event loop, a floor under both protocols).", "",
             "| model | mode | C | req/s | p50 µs | p99 µs | overhead p50 µs | inside the server µs |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (name, mode, c), cell in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2], MODES.index(kv[0][1]))):
        lat = np.array(cell["latencies"])
        p50 = np.percentile(lat, 50)
        direct = np.percentile(cells[(name, "direct", c)]["latencies"], 50)
        overhead = "" if mode == "direct" else f"{p50 - direct:.0f}"  # direct-asyncio: the hand-off to the loop
        inside = f"{cell['inside_us']:.0f}" if "inside_us" in cell else ""
        lines.append(f"| {name} | {mode} | {c} | {len(lat) / seconds:.0f} | {p50:.0f} | {np.percentile(lat, 99):.0f} | "
                     f"{overhead} | {inside} |")
    lines += ["", "| goal | result |", "|---|---|"]
    for mode in ("rest-binary", "grpc"):
        overhead = {name: np.percentile(cells[(name, mode, 1)]["latencies"], 50)
                    - np.percentile(cells[(name, "direct", 1)]["latencies"], 50) for name in MODELS}
        inside = {name: cells[(name, mode, 1)]["inside_us"] for name in MODELS}
        met = all(v <= 100 for v in overhead.values())
        lines.append(f"| {mode}: server overhead per request p50 <= 100 µs (C=1) | {'met' if met else '**not met**'}: "
                     + ", ".join(f"{n} {overhead[n]:.0f} µs end to end, {inside[n]:.0f} µs inside the server"
                                 for n in MODELS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.5, help="per cell")
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--out", default=str(ROOT / "bench/results/serving.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = compile_models(Path(tmp))
        from tvmsched.runtime import Executor

        inputs = {n: Executor(p).random_inputs(0) for n, p in paths.items()}
        cells = direct_cells(paths, inputs, args.seconds)
        cells.update(server_cells(paths, inputs, args.seconds, args.port))
    text = report(cells, args.seconds, "python bench/serving.py " + " ".join(sys.argv[1:]))
    Path(args.out).write_text(text)
    raw = {"|".join(map(str, k)): {"p50_us": float(np.percentile(v["latencies"], 50)), "n": len(v["latencies"]),
                                   "inside_us": v.get("inside_us")} for k, v in cells.items()}
    print(text)
    print(json.dumps(raw)[:200])


if __name__ == "__main__":
    main()
