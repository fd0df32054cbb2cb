"""tvmsched serve and the C++ server against the runtime they embed, side by side in one run: Triton's clients
(REST JSON, REST binary, gRPC; the C++ server build/cpp/tvmsched_server has REST only) at concurrency 1/4/16
against direct Runtime.submit on the same models (resnet18-small, bert-tiny).

    python bench/serving.py [--seconds 1.5] [--out bench/results/serving.md] [--h11-asyncio]
    python bench/serving.py --stacks 8 --seconds 0.5

Each cell is a closed loop of C threads for --seconds (each thread its own client, one request in flight). The
direct runs (a Runtime in this process, the server not started yet) come first, then the server (a subprocess,
both models warmed up) and the clients. Server overhead per request p50 = the client's p50 minus the direct p50 at
the same concurrency (network stack, protocol, Python on both sides); "inside the server" is Triton's statistics'
(success ns - queue ns - compute ns) / count over the cell: what the server adds around the engine's queue and run.
"direct-asyncio" awaits each request in an asyncio loop as the server does: its overhead is the hand-off from the
engine's thread to the event loop, a floor under both protocols. The C++ server (cpp-*; built by `make cpp` when
missing) runs after tvmsched serve, with the same models and the same client code. --h11-asyncio serves Python with
uvicorn's h11 and asyncio's own loop even where httptools and uvloop are installed (the baseline they replace);
--stacks ROUNDS runs only an interleaved A/B of the three stacks (h11 + asyncio, httptools + asyncio, httptools +
uvloop) at C=1 and prints it.
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
MODES = ("direct", "direct-asyncio", "rest-json", "rest-binary", "grpc", "cpp-rest-json", "cpp-rest-binary")
PYTHON_MODES, CPP_MODES = MODES[2:5], MODES[5:]
CPP_SERVER = ROOT / "build/cpp/tvmsched_server"
# tvmsched serve with some of httptools and uvloop hidden: uvicorn falls back to h11 and asyncio's own loop
STACKS = {"h11-asyncio": ("httptools", "uvloop"), "httptools-asyncio": ("uvloop",), "httptools-uvloop": ()}
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
        binary = not mode.endswith("json")
        if mode == "grpc":
            tensor.set_data_from_numpy(array)
            outputs = [tc.InferRequestedOutput("output")]
        else:
            tensor.set_data_from_numpy(array, binary_data=binary)
            outputs = [tc.InferRequestedOutput("output", binary_data=binary)]
        return lambda: client.infer(name, [tensor], outputs=outputs).as_numpy("output")
    return make


def server_cells(paths, inputs, seconds, port: int, plain_stack: bool = False) -> dict:
    """tvmsched serve's cells (HTTP on `port`, gRPC on port + 1)."""
    command = serve_command(paths, port, STACKS["h11-asyncio"] if plain_stack else ())
    return _cells_of(command, "tvmsched serve", PYTHON_MODES, paths, inputs, seconds, port)


def serve_command(paths, port: int, hidden=()) -> list[str]:
    """tvmsched serve (HTTP on `port`, gRPC on port + 1) with the modules `hidden` made unimportable."""
    prelude = "".join(f"sys.modules[{m!r}] = None; " for m in hidden)
    return [sys.executable, "-c", f"import sys; {prelude}from tvmsched.cli.main import main; main()", "serve",
            "--port", str(port), "--grpc-port", str(port + 1), "--max-queue", "1024",
            *[f"--model={n}={p}" for n, p in paths.items()]]


def stack_rounds(paths, inputs, seconds, port: int, rounds: int) -> str:
    """An A/B of tvmsched serve's HTTP parser and event loop: one server per STACKS entry, all running, cells at
    C=1 interleaved (the order rotating each round) so that every stack sees the same drift of the machine's load."""
    import httpx

    servers = {stack: _start(serve_command(paths, port + 10 * i, hidden), "tvmsched serve", port + 10 * i)
               for i, (stack, hidden) in enumerate(STACKS.items())}
    results: dict = {}
    try:
        for r in range(rounds):
            order = list(servers)[r % len(servers):] + list(servers)[:r % len(servers)]
            for name in MODELS:
                for mode in ("rest-binary", "grpc"):
                    for stack in order:
                        base = servers[stack][2]
                        url = f"127.0.0.1:{int(base.rsplit(':', 1)[1]) + (mode == 'grpc')}"
                        before = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                        lat = closed_loop(client_call(mode, url, name, inputs[name][MODELS[name]]), 1, seconds)
                        after = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                        results.setdefault((name, mode, stack), []).append(
                            (np.percentile(lat, 50), len(lat) / seconds, _inside_us(before, after)))
    finally:
        for server in servers.values():
            _stop(server)
    lines = [f"Medians over {rounds} rounds of {seconds} s per cell, C=1:", "",
             "| model | mode | stack | req/s | p50 µs | inside the server µs | p50 per round µs |",
             "|---|---|---|---:|---:|---:|---|"]
    for (name, mode, stack), values in sorted(results.items()):
        v = np.array(values)
        rate, p50, inside = np.median(v[:, 1]), np.median(v[:, 0]), np.median(v[:, 2])
        lines.append(f"| {name} | {mode} | {stack} | {rate:.0f} | {p50:.0f} | {inside:.0f} | "
                     + " ".join(f"{x:.0f}" for x in v[:, 0]) + " |")
    return "\n".join(lines) + "\n"


def cpp_server_cells(paths, inputs, seconds, port: int) -> dict:
    """The C++ server's cells (REST on `port`; it has no gRPC)."""
    if not CPP_SERVER.exists():
        subprocess.run(["make", "cpp"], cwd=ROOT, check=True)
    command = [str(CPP_SERVER), "--port", str(port), "--device", "cpu", "--max-queue", "1024",
               *[f"--model={n}={p}" for n, p in paths.items()]]
    return _cells_of(command, "tvmsched_server", CPP_MODES, paths, inputs, seconds, port)


def _start(command, what, port: int):
    """The server started by `command` once /v2/health/ready answers 200 on `port`: (process, its log, base URL)."""
    import httpx

    log = tempfile.TemporaryFile("w+")  # not a pipe: a server that writes much would block on a full one
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if server.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{what} exited {server.returncode}: {log.read()[-2000:]}")
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                return server, log, base
        except httpx.TransportError:
            time.sleep(0.1)
    _stop((server, log, base))
    raise RuntimeError(f"{what} did not start")


def _stop(started) -> None:
    server, log, _ = started
    server.terminate()
    server.wait(timeout=60)
    log.close()


def _cells_of(command, what, modes, paths, inputs, seconds, port: int) -> dict:
    import httpx

    started = _start(command, what, port)
    base = started[2]
    try:
        cells = {}
        for name in paths:
            for mode in modes:
                url = f"127.0.0.1:{port + 1}" if mode == "grpc" else f"127.0.0.1:{port}"
                for c in CONCURRENCY:
                    before = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                    latencies = closed_loop(client_call(mode, url, name, inputs[name][MODELS[name]]), c, seconds)
                    after = httpx.get(f"{base}/v2/models/{name}/stats").json()["model_stats"][0]
                    cells[(name, mode, c)] = {"latencies": latencies, "inside_us": _inside_us(before, after)}
        return cells
    finally:
        _stop(started)


def _inside_us(before: dict, after: dict) -> float:
    delta = lambda key: after["inference_stats"][key]["ns"] - before["inference_stats"][key]["ns"]
    count = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    return (delta("success") - delta("queue") - delta("compute_infer")) / max(count, 1) / 1e3


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{model}, nproc {os.cpu_count()}, {platform.platform()}, python {platform.python_version()}"


def python_stack(plain: bool) -> str:
    import importlib.metadata
    import importlib.util

    def version(name):
        return importlib.metadata.version(name) if importlib.util.find_spec(name) and not plain else None

    http, loop = version("httptools"), version("uvloop")
    return (f"uvicorn {importlib.metadata.version('uvicorn')} with " + (f"httptools {http}" if http else "h11")
            + ", " + (f"uvloop {loop}" if loop else "asyncio's own loop"))


def report(cells, seconds, command, plain: bool, loads) -> str:
    import grpc
    import importlib.metadata

    lines = ["# tvmsched serve and the C++ server: Triton's clients against direct Runtime.submit (CPU)", "",
             f"Command: `{command}`", "",
             f"Machine: {machine()}; load average (1 min) {loads[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at "
             f"the end. tritonclient {importlib.metadata.version('tritonclient')}, grpcio {grpc.__version__}; "
             f"tvmsched serve on {python_stack(plain)}; the C++ server {CPP_SERVER.relative_to(ROOT)}. "
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
    for mode in ("rest-binary", "grpc", "cpp-rest-binary"):
        overhead = {name: np.percentile(cells[(name, mode, 1)]["latencies"], 50)
                    - np.percentile(cells[(name, "direct", 1)]["latencies"], 50) for name in MODELS}
        inside = {name: cells[(name, mode, 1)]["inside_us"] for name in MODELS}
        met = all(v <= 100 for v in overhead.values())
        lines.append(f"| {mode}: server overhead per request p50 <= 100 µs (C=1) | {'met' if met else '**not met**'}: "
                     + ", ".join(f"{n} {overhead[n]:.0f} µs end to end, {inside[n]:.0f} µs inside the server"
                                 for n in MODELS) + " |")
    rates = {(n, c): len(cells[(n, "cpp-rest-binary", c)]["latencies"]) / len(cells[(n, "rest-binary", c)]["latencies"])
             for n in MODELS for c in CONCURRENCY}
    lines.append("| C++ server >= Python server throughput at every concurrency (REST binary) | "
                 + ("met" if all(r >= 1 for r in rates.values()) else "**not met**") + ": C++/Python req/s "
                 + "; ".join(f"{n} " + ", ".join(f"C={c} {rates[(n, c)]:.2f}x" for c in CONCURRENCY) for n in MODELS)
                 + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.5, help="per cell")
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--out", default=str(ROOT / "bench/results/serving.md"))
    parser.add_argument("--h11-asyncio", action="store_true",
                        help="tvmsched serve on h11 and asyncio's loop even where httptools and uvloop are installed")
    parser.add_argument("--stacks", type=int, metavar="ROUNDS",
                        help="only the A/B of tvmsched serve's HTTP parser and event loop (STACKS), ROUNDS rounds "
                             "of --seconds per cell, printed")
    args = parser.parse_args()
    loads = os.getloadavg()
    if args.stacks:
        with tempfile.TemporaryDirectory() as tmp:
            paths = compile_models(Path(tmp))
            from tvmsched.runtime import Executor

            inputs = {n: Executor(p).random_inputs(0) for n, p in paths.items()}
            print(stack_rounds(paths, inputs, args.seconds, args.port, args.stacks))
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = compile_models(Path(tmp))
        from tvmsched.runtime import Executor

        inputs = {n: Executor(p).random_inputs(0) for n, p in paths.items()}
        cells = direct_cells(paths, inputs, args.seconds)
        cells.update(server_cells(paths, inputs, args.seconds, args.port, plain_stack=args.h11_asyncio))
        cells.update(cpp_server_cells(paths, inputs, args.seconds, args.port + 2))
    text = report(cells, args.seconds, " ".join(["python bench/serving.py", *sys.argv[1:]]), args.h11_asyncio, loads)
    Path(args.out).write_text(text)
    raw = {"|".join(map(str, k)): {"p50_us": float(np.percentile(v["latencies"], 50)), "n": len(v["latencies"]),
                                   "inside_us": v.get("inside_us")} for k, v in cells.items()}
    print(text)
    print(json.dumps(raw)[:200])


if __name__ == "__main__":
    main()
