"""Soak an example server with a real load generator (locust; issue 28).

    python bench/soak.py                                   # examples/server.py, 10 minutes of load
    python bench/soak.py --server cpp --load-s 600         # build/cpp/tvmsched_server (`make cpp`)
    python bench/soak.py --server both --load-s 120 --json bench/results/raw/soak.json

Four zoo models compiled for this CPU (mlp and mobilenetv2 real-time, resnet18-small and bert-tiny best-effort;
artifacts kept in --artifacts and reused) are served on 127.0.0.1; locust users (bench/soak_locust.py, a process
of their own) send valid requests to all four and a share of bad ones (wrong shape, malformed JSON, unknown
model, wrong input name), each with a unique X-Request-Id, for --load-s seconds, then SIGTERM the server while
requests are in flight. Meanwhile this process samples the server's resident memory (psutil). Checked:

- every request has exactly one answer, carrying its own id (none lost, duplicated or crossed); valid requests
  got their own outputs (each body of the pool has its expected outputs), bad ones their 4xx with one line;
- resident memory after warm-up (the first --warmup-s) is flat: growth and the least-squares slope;
- latency p50/p99 and rate per window of --window-s;
- SIGTERM: the requests the server held were answered, and it exits 0.

`run_soak()` is the library form (tests/test_soak.py runs it for 30 s and 20 s); `markdown()` the table of
bench/results/reliability.md. Only 127.0.0.1; the load is bounded by --load-s and --users.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

# name -> (QoS ms, priority, share of the valid requests)
MODELS = {
    "mlp": (50, "realtime", 0.35),
    "mobilenetv2": (200, "realtime", 0.2),
    "resnet18-small": (200, "best_effort", 0.25),
    "bert-tiny": (500, "best_effort", 0.2),
}
BAD_KINDS = {  # kind of bad request -> the statuses that are right for it
    "shape": {400},  # an input of the wrong shape
    "json": {400, 422},  # a malformed body
    "model": {404},  # a model the server does not have
    "name": {400},  # an input name the model does not have
}
CPP_SERVER = ROOT / "build" / "cpp" / "tvmsched_server"
POOL_SIZE = 8  # distinct valid bodies per model (each with its own expected outputs)


def compile_models(folder: Path, names=tuple(MODELS)) -> dict[str, Path]:
    """The zoo models compiled for this CPU into `folder` (kept: an artifact already there is reused)."""
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        path = folder / f"{name}.tvms"
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            compile_model(models.build(name), name=name).save(tmp)
            os.replace(tmp, path)
        paths[name] = path
    return paths


def make_pool(artifacts: dict[str, Path], path: Path) -> None:
    """Request bodies for the load generator: per model POOL_SIZE valid ones, each with the outputs the
    engine computes for it here (its reference), and one body per kind of bad request."""
    from tvmsched.runtime import Executor

    pool = {}
    for index, (name, artifact) in enumerate(sorted(artifacts.items())):
        executor = Executor(artifact)
        valid = []
        for seed in range(POOL_SIZE):
            inputs = executor.random_inputs(1000 * index + seed)
            body = json.dumps({"inputs": {k: v.tolist() for k, v in inputs.items()}}).encode()
            valid.append((body, executor.run(inputs)))
        first = sorted(inputs)[0]
        url = f"/v1/models/{name}/infer"
        pool[name] = {"valid": valid, "bad": {
            "shape": (url, json.dumps({"inputs": {**{k: v.tolist() for k, v in inputs.items()}, first: [[0.5] * 3]}}).encode()),
            "json": (url, b'{"inputs": {"' + first.encode() + b'": [[0.1, 0.2'),
            "model": (f"/v1/models/no-{name}/infer", body),
            "name": (url, json.dumps({"inputs": {"no_such_input": [[0.5] * 3]}}).encode()),
        }}
        del executor
    with open(path, "wb") as f:
        pickle.dump(pool, f)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(kind: str, artifacts: dict[str, Path], port: int, log_path: Path) -> subprocess.Popen:
    """examples/server.py ("python") or tvmsched_server ("cpp") on 127.0.0.1:port with the four models; returns
    once GET /v1/models answers (raises if it exits or stays silent for 120 s)."""
    import httpx

    specs = [f"--model={name}={artifacts[name]}:{qos}:{priority}" for name, (qos, priority, _) in MODELS.items()]
    if kind == "python":
        command = [sys.executable, "examples/server.py", *specs, "--host", "127.0.0.1", "--port", str(port)]
    elif kind == "cpp":
        if not CPP_SERVER.exists():
            raise SystemExit(f"error: {CPP_SERVER} is not built (make cpp)")
        command = [str(CPP_SERVER), *specs, "--host", "127.0.0.1", "--port", str(port)]
    else:
        raise ValueError(kind)
    log = open(log_path, "w")
    server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {server.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"{kind} server did not answer within 120 s: {log_path.read_text()[-2000:]}")


def sample_rss(pid: int, every_s: float, out: list, stop: threading.Event) -> None:
    """(time.time(), RSS bytes) of process `pid` every `every_s` until `stop` or the process is gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        while not stop.is_set():
            out.append((time.time(), process.memory_info().rss))
            stop.wait(every_s)
    except psutil.Error:
        pass


def run_soak(kind: str = "python", load_s: float = 600, users: int = 8, bad_share: float = 0.1,
             warmup_s: float | None = None, window_s: float = 30, artifacts: Path | None = None, seed: int = 0,
             work: Path | None = None) -> dict:
    """One soak (see the module docstring): the server's exit status, per-request checks, windows, RSS."""
    work = Path(work or tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    paths = compile_models(Path(artifacts or work / "artifacts"))
    pool = work / "pool.pkl"
    if not pool.exists():
        make_pool(paths, pool)
    warmup_s = min(30.0, load_s / 5) if warmup_s is None else warmup_s
    port = _free_port()
    server = start_server(kind, paths, port, work / f"{kind}-server.log")
    config = {"host": f"http://127.0.0.1:{port}", "users": users, "load_s": load_s, "bad_share": bad_share,
              "seed": seed, "server_pid": server.pid, "pool": str(pool), "records": str(work / f"{kind}-records.jsonl"),
              "summary": str(work / f"{kind}-locust.json"), "request_timeout_s": 60.0, "drain_timeout_s": 60.0,
              "weights": {name: share for name, (_, _, share) in MODELS.items()}}
    (work / "locust-config.json").write_text(json.dumps(config))
    rss, stop = [], threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(server.pid, 0.5, rss, stop), daemon=True)
    sampler.start()
    started = time.time()
    try:
        load = subprocess.run([sys.executable, str(Path(__file__).with_name("soak_locust.py")), str(work / "locust-config.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=load_s + 180)
        if load.returncode != 0:
            raise RuntimeError(f"the load generator failed ({load.returncode}): {load.stderr[-3000:]}")
        try:
            exit_code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            exit_code = None  # it did not stop: a failure
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        stop.set()
        sampler.join()
    result = summarize(kind, [json.loads(line) for line in open(config["records"])], json.loads(open(config["summary"]).read()),
                       rss, started, warmup_s, window_s)
    result.update(exit_code=exit_code, users=users, load_s=load_s, bad_share=bad_share,
                  server_log=(work / f"{kind}-server.log").read_text()[-2000:])
    return result


def summarize(kind: str, records: list, locust: dict, rss: list, started: float, warmup_s: float, window_s: float) -> dict:
    """Checks and numbers from the per-request records ([id, kind, model, start, end, status, echoed, verdict,
    note]) and the RSS samples."""
    sigterm = locust["sigterm"]
    ids = [r[0] for r in records]
    before = [r for r in records if r[3] < sigterm]
    after = [r for r in records if r[3] >= sigterm]
    in_flight = [r for r in before if r[4] >= sigterm]  # sent before SIGTERM, answered (or not) after it
    answered = lambda rs: [r for r in rs if r[5] != 0]
    failures = [r for r in before if r[7] != "ok"]
    by_kind: dict[str, dict] = {}
    for r in before:
        entry = by_kind.setdefault(r[1], {"requests": 0, "ok": 0, "statuses": {}})
        entry["requests"] += 1
        entry["ok"] += r[7] == "ok"
        entry["statuses"][str(r[5])] = entry["statuses"].get(str(r[5]), 0) + 1
    windows = []
    edges = np.arange(started, sigterm + 1e-9, window_s)
    for lo in edges:
        hi = min(lo + window_s, sigterm)
        if hi - lo < window_s / 2:
            continue
        ended = [r for r in before if lo <= r[4] < hi]
        valid_ms = np.array([(r[4] - r[3]) * 1e3 for r in ended if r[1] == "valid" and r[7] == "ok"])
        in_window = [b for t, b in rss if lo <= t < hi]
        windows.append({"from_s": round(lo - started, 1), "to_s": round(hi - started, 1),
                        "rate_per_s": round(len(ended) / (hi - lo), 1),
                        "p50_ms": round(float(np.percentile(valid_ms, 50)), 2) if len(valid_ms) else None,
                        "p99_ms": round(float(np.percentile(valid_ms, 99)), 2) if len(valid_ms) else None,
                        "errors": sum(r[7] != "ok" for r in ended),
                        "rss_mb": round(max(in_window) / 2**20, 1) if in_window else None})
    steady = [(t, b) for t, b in rss if started + warmup_s <= t < sigterm]
    span = min(5.0, (sigterm - started - warmup_s) / 4)
    head = [b for t, b in steady if t < started + warmup_s + span]
    tail = [b for t, b in steady if t >= sigterm - span]
    rss_start = float(np.median(head)) if head else None
    rss_end = float(np.median(tail)) if tail else None
    def slope(samples) -> float | None:  # least squares, MB per minute
        if len(samples) < 4:
            return None
        t = np.array([s[0] for s in samples]) - samples[0][0]
        return round(float(np.polyfit(t, np.array([s[1] for s in samples]) / 2**20, 1)[0] * 60), 3)

    valid_ms = np.array([(r[4] - r[3]) * 1e3 for r in before if r[1] == "valid" and r[7] == "ok"])
    steady_requests = sum(1 for r in before if r[4] >= started + warmup_s)
    return {
        "server": kind,
        "requests": len(records), "unique_ids": len(set(ids)),
        "answers_with_other_id": sum(1 for r in records if r[5] != 0 and r[6] != r[0]),
        "before_sigterm": len(before), "failures_before_sigterm": len(failures),
        "failure_examples": [r[:2] + r[5:] for r in failures[:10]],
        "in_flight_at_sigterm": len(in_flight), "in_flight_answered": len([r for r in in_flight if r[7] == "ok"]),
        "in_flight_failures": [r[:2] + r[5:] for r in in_flight if r[7] != "ok"][:10],
        "after_sigterm": len(after), "after_sigterm_answered": len(answered(after)),
        "after_sigterm_wrong": [r[:2] + r[5:] for r in after if r[5] != 0 and r[7] != "ok"][:10],
        "by_kind": by_kind,
        "valid_ok_by_model": {m: sum(1 for r in before if r[1] == "valid" and r[2] == m and r[7] == "ok") for m in MODELS},
        "p50_ms": round(float(np.percentile(valid_ms, 50)), 2) if len(valid_ms) else None,
        "p99_ms": round(float(np.percentile(valid_ms, 99)), 2) if len(valid_ms) else None,
        "rate_per_s": round(len(before) / (sigterm - started), 1),
        "windows": windows,
        "warmup_s": warmup_s,
        "rss_start_mb": None if rss_start is None else round(rss_start / 2**20, 1),
        "rss_end_mb": None if rss_end is None else round(rss_end / 2**20, 1),
        "rss_growth_mb": None if rss_start is None or rss_end is None else round((rss_end - rss_start) / 2**20, 2),
        "rss_slope_mb_per_min": slope(steady),  # a leak keeps its slope; warming up (allocator arenas) flattens out
        "rss_slope_second_half_mb_per_min": slope(steady[len(steady) // 2:]),
        "rss_peak_mb": round(max(b for _, b in rss) / 2**20, 1) if rss else None,
        "steady_requests": steady_requests,
        "rss_growth_bytes_per_request": None if rss_start is None or rss_end is None or not steady_requests
        else round((rss_end - rss_start) / steady_requests, 1),
        "locust": locust["locust"], "users_left_at_deadline": locust["users_left_at_deadline"],
    }


def problems(result: dict, max_growth_mb: float = 50, max_growth_ratio: float = 0.2) -> list[str]:
    """What makes a soak fail (empty: passed)."""
    out = []
    if result["unique_ids"] != result["requests"]:
        out.append(f"{result['requests'] - result['unique_ids']} duplicated request ids")
    if result["answers_with_other_id"]:
        out.append(f"{result['answers_with_other_id']} answers carried another request's id")
    if result["failures_before_sigterm"]:
        out.append(f"{result['failures_before_sigterm']} requests before SIGTERM failed: {result['failure_examples']}")
    if result["in_flight_failures"]:
        out.append(f"requests in flight at SIGTERM failed: {result['in_flight_failures']}")
    if result["after_sigterm_wrong"]:
        out.append(f"wrong answers after SIGTERM: {result['after_sigterm_wrong']}")
    if result["exit_code"] != 0:
        out.append(f"the server exited with {result['exit_code']} after SIGTERM: {result['server_log'][-500:]}")
    if result["users_left_at_deadline"]:
        out.append(f"{result['users_left_at_deadline']} users still waiting 60 s after SIGTERM")
    growth, start = result["rss_growth_mb"], result["rss_start_mb"]
    if growth is None:
        out.append("too few RSS samples")
    elif growth > max_growth_mb or growth > max_growth_ratio * start:
        out.append(f"RSS grew by {growth} MB after warm-up (from {start} MB)")
    for kind, entry in result["by_kind"].items():
        if entry["ok"] != entry["requests"]:
            out.append(f"{kind}: {entry['requests'] - entry['ok']} of {entry['requests']} not as expected ({entry['statuses']})")
    return out


def markdown(results: list[dict]) -> str:
    """The soak section's tables."""
    lines = []
    for r in results:
        errors = ", ".join(f"{kind} {e['requests']} ({'/'.join(f'{s}: {n}' for s, n in sorted(e['statuses'].items()))})"
                           for kind, e in sorted(r["by_kind"].items()))
        lines += [f"**{'examples/server.py' if r['server'] == 'python' else 'build/cpp/tvmsched_server'}**: "
                  f"{r['users']} users, {r['load_s']:.0f} s of load, {r['before_sigterm']} requests "
                  f"({r['rate_per_s']}/s), p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; requests by kind (status: "
                  f"count): {errors}. Failures before SIGTERM: {r['failures_before_sigterm']}; answers carrying "
                  f"another id: {r['answers_with_other_id']}; ids {r['unique_ids']} unique of {r['requests']}. "
                  f"RSS after {r['warmup_s']:.0f} s of warm-up {r['rss_start_mb']} MB, at the end {r['rss_end_mb']} MB "
                  f"(growth {r['rss_growth_mb']} MB, {r['rss_growth_bytes_per_request']} B per request; slope "
                  f"{r['rss_slope_mb_per_min']} MB/min, {r['rss_slope_second_half_mb_per_min']} MB/min in the second half; peak {r['rss_peak_mb']} MB). SIGTERM: {r['in_flight_at_sigterm']} "
                  f"requests in flight, {r['in_flight_answered']} answered right; {r['after_sigterm']} sent after it "
                  f"({r['after_sigterm_answered']} answered, the rest refused); exit code {r['exit_code']}.", "",
                  "| window (s) | requests/s | p50 ms | p99 ms | errors | RSS MB (max) |", "|---|---|---|---|---|---|"]
        lines += [f"| {w['from_s']:.0f}-{w['to_s']:.0f} | {w['rate_per_s']} | {w['p50_ms']} | {w['p99_ms']} | {w['errors']} | "
                  f"{w['rss_mb']} |" for w in r["windows"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["python", "cpp", "both"], default="python")
    parser.add_argument("--load-s", type=float, default=600, help="seconds of load before SIGTERM")
    parser.add_argument("--users", type=int, default=8, help="concurrent locust users (each sends back to back)")
    parser.add_argument("--bad-share", type=float, default=0.1, help="share of bad requests")
    parser.add_argument("--warmup-s", type=float, help="RSS is flat after this (default: load/5, at most 30)")
    parser.add_argument("--window-s", type=float, default=30, help="latency and rate windows")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "out" / "soak", help="compiled models (reused)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not 0 < args.load_s <= 3600 or not 1 <= args.users <= 64:
        raise SystemExit("error: --load-s must be in (0, 3600] and --users in [1, 64]")
    import _common

    info = _common.machine_info()
    kinds = ["python", "cpp"] if args.server == "both" else [args.server]
    results = []
    for kind in kinds:
        result = run_soak(kind, args.load_s, args.users, args.bad_share, args.warmup_s, args.window_s, args.artifacts)
        result["problems"] = problems(result)
        results.append(result)
        print(f"{kind}: {'PASS' if not result['problems'] else 'FAIL: ' + '; '.join(result['problems'])}", flush=True)
    print(_common.machine_line(info))
    print(f"`python bench/soak.py --server {args.server} --load-s {args.load_s:g} --users {args.users}`\n")
    print(markdown(results))
    if args.json:
        _common.write_json_atomic(args.json, {"machine": info, "results": results})
    sys.exit(1 if any(r["problems"] for r in results) else 0)


if __name__ == "__main__":
    main()
