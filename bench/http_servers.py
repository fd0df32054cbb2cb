"""Closed-loop HTTP load on the two example servers (examples/server.py and build/cpp/tvmsched_server), side by side.

    python bench/http_servers.py --seconds 5 --concurrency 1,2,4,8 --out bench/results/raw/http_servers_cpu.json [--quick]

Each server serves mlp and resnet18-small (best_effort, QoS targets from --qos). Per concurrency level C, C client
threads (one keep-alive http.client connection each) cycle through --mix with seeded inputs prepared as JSON bodies,
for --seconds. Per model: requests/s, client-side p50/p99 (ms), errors, p99 <= QoS. Throughput at QoS: the highest
total requests/s over the levels where every model has no errors and p99 inside its QoS.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "out" / "bench-http"
SERVERS = ("python", "cpp")


def artifacts(names: list[str], cache: Path = CACHE) -> dict[str, Path]:
    """The compiled zoo artifacts `names` in `cache` (compiled there unless already present)."""
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    cache.mkdir(parents=True, exist_ok=True)
    paths = {name: cache / f"{name}.tvms" for name in names}
    [compile_model(models.build(name), name=name).save(path) for name, path in paths.items() if not path.exists()]
    return paths


def request_bodies(names: list[str], count: int = 8, seed: int = 0) -> dict[str, list[bytes]]:
    """`count` JSON bodies {"inputs": ...} per model, with seeded standard-normal inputs."""
    from tvmsched import models

    def body(model, seed: int) -> bytes:
        return json.dumps({"inputs": {k: v.tolist() for k, v in models.random_inputs(model, seed=seed).items()}}).encode()

    return {name: [body(model, seed + i) for i in range(count)] for name in names for model in [models.build(name)]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(kind: str, paths: dict[str, Path], qos: dict[str, float], port: int, log: Path,
                 wait_s: float = 120) -> tuple[subprocess.Popen, float]:
    """Start server `kind` on 127.0.0.1:`port` (output to `log`); wait until GET /v1/models answers 200. -> (process, seconds)."""
    specs = [arg for name, path in paths.items() for arg in ("--model", f"{name}={path}:{qos[name]:g}")]
    command = ([sys.executable, "examples/server.py"] if kind == "python" else [str(ROOT / "build/cpp/tvmsched_server")])
    command += [*specs, "--host", "127.0.0.1", "--port", str(port)]
    started = time.monotonic()
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        while time.monotonic() - started < wait_s:
            if server.poll() is not None:
                raise RuntimeError(f"{kind} server exited with {server.returncode}: {log.read_text()[-2000:]}")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return server, time.monotonic() - started
            except OSError:
                time.sleep(0.1)
            finally:
                conn.close()
        raise RuntimeError(f"{kind} server did not answer within {wait_s:g} s")
    except BaseException:
        stop_server(server)
        raise


def stop_server(server: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL after 30 s. -> exit status."""
    server.terminate()
    try:
        return server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def client(port: int, mix: list[str], bodies: dict[str, list[bytes]], start: int, deadline: float, max_requests: int,
           timeout: float, out: list) -> None:
    """One closed-loop client: append (model, latency_ms or None, error) to `out` until `deadline` or `max_requests`."""
    conn, headers = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout), {"Content-Type": "application/json"}
    try:
        for i in range(start, start + max_requests):
            if time.monotonic() >= deadline:
                break
            name, t0 = mix[i % len(mix)], time.perf_counter()
            try:
                conn.request("POST", f"/v1/models/{name}/infer", bodies[name][i % len(bodies[name])], headers)
                reply = conn.getresponse()
                data = reply.read()
                ms = (time.perf_counter() - t0) * 1e3
                ok = reply.status == 200 and data.startswith(b'{"outputs"')
                out.append((name, ms if ok else None, None if ok else f"HTTP {reply.status}: {data[:200].decode(errors='replace')}"))
            except (OSError, http.client.HTTPException) as err:
                out.append((name, None, f"{type(err).__name__}: {err}"))
                conn.close()  # reconnects on the next request
    finally:
        conn.close()


def run_level(port: int, mix: list[str], bodies: dict[str, list[bytes]], qos: dict[str, float], concurrency: int,
              seconds: float, timeout: float = 30.0) -> dict:
    """C closed-loop clients for `seconds`. -> {"concurrency", "seconds", "models": {name: stats}}."""
    results: list[list] = [[] for _ in range(concurrency)]
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(port, mix, bodies, c, deadline, int(seconds * 20000), timeout, results[c]),
                                daemon=True) for c in range(concurrency)]
    t0 = time.monotonic()
    [t.start() for t in threads]
    [t.join(max(0.0, deadline + timeout + 5 - time.monotonic())) for t in threads]
    elapsed, rows, models = time.monotonic() - t0, [r for rs in results for r in list(rs)], {}
    for name in dict.fromkeys(mix):
        ms = [r[1] for r in rows if r[0] == name and r[1] is not None]
        errors = [r[2] for r in rows if r[0] == name and r[2] is not None]
        p50, p99 = (float(np.percentile(ms, 50)), float(np.percentile(ms, 99))) if ms else (None, None)
        models[name] = {"requests": len(ms), "rps": len(ms) / elapsed, "p50_ms": p50, "p99_ms": p99, "qos_ms": qos[name],
                        "errors": len(errors), "first_error": errors[0] if errors else None,
                        "qos_ok": p99 is not None and p99 <= qos[name]}
    return {"concurrency": concurrency, "seconds": elapsed, "models": models,
            "stuck_clients": sum(t.is_alive() for t in threads)}


def bench_server(kind: str, paths: dict[str, Path], qos: dict[str, float], mix: list[str], bodies: dict[str, list[bytes]],
                 levels: list[int], seconds: float, warmup: int = 5, cache: Path = CACHE) -> dict:
    """Start server `kind`, warm it up (`warmup` requests per model), run every level, stop it (always)."""
    port = free_port()
    server, startup_s = start_server(kind, paths, qos, port, cache / f"{kind}-server.log")
    try:
        for name in dict.fromkeys(mix):
            out: list = []
            client(port, [name], bodies, 0, time.monotonic() + 60, warmup, 30.0, out)
            if any(r[2] for r in out):
                raise RuntimeError(f"{kind} server: warm-up of {name} failed: {next(r[2] for r in out if r[2])}")
        runs = [run_level(port, mix, bodies, qos, c, seconds) for c in levels]
    finally:
        status = stop_server(server)
    good = [sum(m["rps"] for m in r["models"].values()) for r in runs
            if all(m["qos_ok"] and m["errors"] == 0 for m in r["models"].values())]
    return {"server": kind, "port": port, "startup_s": startup_s, "exit_status": status, "levels": runs,
            "throughput_at_qos": max(good, default=0.0), "log_tail": (cache / f"{kind}-server.log").read_text()[-2000:]}


def machine() -> dict:
    """CPU name (/proc/cpuinfo), cores, date, git commit."""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    git = lambda *args: subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": git("rev-parse", "HEAD"), "git_dirty": git("status", "--porcelain", "--", "runtime", "examples", "tvmsched").splitlines(),
            "python": platform.python_version()}


def table(results: list[dict]) -> str:
    """Markdown table: server, concurrency, model, req/s, p50, p99, QoS ok (+ errors)."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    lines = ["| server | concurrency | model | req/s | p50 ms | p99 ms | QoS ms | QoS ok | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for run in res["levels"]:
            for name, m in run["models"].items():
                lines.append(f"| {res['server']} | {run['concurrency']} | {name} | {m['rps']:.1f} | {fmt(m['p50_ms'])} | "
                             f"{fmt(m['p99_ms'])} | {m['qos_ms']:g} | {'yes' if m['qos_ok'] else 'no'} | {m['errors']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="per concurrency level")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--mix", default="mlp,resnet18-small", help="model sequence each client cycles through")
    parser.add_argument("--qos", default="mlp=5,resnet18-small=50", help="NAME=MS,...")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="1 s per level, levels 1,2")
    args = parser.parse_args()
    seconds, levels = (1.0, [1, 2]) if args.quick else (args.seconds, [int(c) for c in args.concurrency.split(",")])
    mix = args.mix.split(",")
    qos = {k: float(v) for k, v in (item.split("=") for item in args.qos.split(","))}
    names = list(dict.fromkeys(mix))
    paths = artifacts(names)
    bodies = request_bodies(names, seed=args.seed)
    results = [bench_server(kind, paths, qos, mix, bodies, levels, seconds) for kind in args.servers.split(",")]
    print(table(results))
    at_qos = {r["server"]: r["throughput_at_qos"] for r in results}
    ratio = at_qos["cpp"] / at_qos["python"] if at_qos.get("python") and "cpp" in at_qos else None
    print("\n".join(f"{r['server']}: startup {r['startup_s']:.1f} s, throughput at QoS {r['throughput_at_qos']:.1f} req/s, "
                    f"exit status {r['exit_status']}" for r in results) + f"\ncpp/python throughput at QoS: {'-' if ratio is None else f'{ratio:.2f}x'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"machine": machine(), "seconds": seconds, "concurrency": levels, "mix": mix, "qos_ms": qos, "seed": args.seed,
                  "servers": results, "throughput_at_qos": at_qos, "cpp_over_python": ratio}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
