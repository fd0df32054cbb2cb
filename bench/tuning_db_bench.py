"""Tuning-database benchmark, side by side in one run:

1. commit throughput and top-k latency for N records on SQLite, PostgreSQL (pgserver) and the HTTP
   service (uvicorn on 127.0.0.1 over a SQLite file);
2. first compile vs re-compile of a zoo model with a fixed trial budget against one database.

    python bench/tuning_db_bench.py [--records 10000] [--model resnet18-small] [--trials 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TARGET = json.dumps({"kind": "llvm", "num-cores": os.cpu_count()})


def commit_and_query(store, n_records: int, n_queries: int = 300) -> dict:
    """Commit `n_records` distinct records of one workload one by one, then time top-k queries."""
    workload = store.commit_workload("1234567890", json.dumps({"bench": "workload"}), "bench")
    start = time.perf_counter()
    for i in range(n_records):
        store.commit_record(
            workload.id, target_json=TARGET, units=(i % 4) + 1, unit_kind="cpu_thread",
            trace_json=json.dumps([[["SampleTile", [], {"i": i}, [i, 4]]], []]),
            run_secs=[1e-4 * (1 + (i * 7919) % n_records / n_records)], blocks=i % 64, args_info_json="[]",
        )
    commit_s = time.perf_counter() - start
    latencies = []
    for q in range(n_queries):
        t = time.perf_counter()
        rows = store.top_k(workload.id, 8, units=(q % 4) + 1)
        latencies.append(time.perf_counter() - t)
        assert len(rows) == 8 and rows[0].mean_latency_s <= rows[-1].mean_latency_s
    ms = np.array(latencies) * 1e3
    return {"commits_per_s": n_records / commit_s, "commit_s": commit_s,
            "topk_p50_ms": float(np.percentile(ms, 50)), "topk_p99_ms": float(np.percentile(ms, 99))}


def start_pg(folder: str) -> tuple[object, str]:
    import pgserver
    from sqlalchemy.engine import make_url

    server = pgserver.get_server(folder, cleanup_mode="stop")
    return server, make_url(server.get_uri()).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def start_service(sqlite_url: str) -> tuple[object, str]:
    import uvicorn

    from tvmsched.tuning_db.service import create_app
    from tvmsched.tuning_db.store import SQLStore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(SQLStore(sqlite_url)), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def store_rows(n_records: int, folder: Path) -> list[dict]:
    from tvmsched.tuning_db.client import RemoteStore
    from tvmsched.tuning_db.store import SQLStore

    rows = [{"backend": "SQLite (file, WAL)", **commit_and_query(SQLStore(f"sqlite:///{folder / 'a.db'}"), n_records)}]
    pg_dir = tempfile.mkdtemp(prefix="tvms-pg-")
    pg, pg_url = start_pg(pg_dir)
    try:
        rows.append({"backend": "PostgreSQL 16 (pgserver, unix socket)", **commit_and_query(SQLStore(pg_url), n_records)})
    finally:
        pg.cleanup()
    server, url = start_service(f"sqlite:///{folder / 'svc.db'}")
    try:
        rows.append({"backend": "HTTP service (uvicorn, SQLite behind)", **commit_and_query(RemoteStore(url), n_records)})
    finally:
        server.should_exit = True
    return rows


def compile_rows(model: str, trials: int, folder: Path) -> dict:
    from tvmsched import models
    from tvmsched.pipeline import compile_file

    onnx_path, db = folder / f"{model}.onnx", f"sqlite:///{folder / 'tune.db'}"
    models.save(model, onnx_path)
    times, trial_counts = [], []
    for _ in range(2):
        start = time.perf_counter()
        artifact = compile_file(onnx_path, tune_trials=trials, database=db, progress=True)
        times.append(time.perf_counter() - start)
        trial_counts.append(sum(layer["trials"] for layer in artifact.manifest.tuning["layers"].values()))
    statuses = [layer["status"] for layer in artifact.manifest.tuning["layers"].values()]
    return {"model": model, "trials_per_layer": trials, "first_s": times[0], "recompile_s": times[1],
            "ratio": times[1] / times[0], "first_trials": trial_counts[0], "recompile_trials": trial_counts[1],
            "layers": len(statuses), "fallback_layers": statuses.count("fallback")}


def write_markdown(out: Path, args, rows: list[dict], comp: dict) -> None:
    import sqlalchemy
    import tvm

    lines = [
        "# Tuning database benchmark", "",
        f"Command: `python bench/tuning_db_bench.py --records {args.records} --model {args.model} --trials {args.trials}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; python {platform.python_version()}, "
        f"tvm {tvm.__version__}, SQLAlchemy {sqlalchemy.__version__}; date {time.strftime('%Y-%m-%d')}.", "",
        f"## Commit throughput and top-k latency ({args.records} records of one workload, one transaction per commit)", "",
        "Top-k: k=8 best records filtered by units (a quarter of the records match), 300 queries.", "",
        "| backend | commits/s | total commit s | top-k p50 ms | top-k p99 ms |", "|---|---|---|---|---|",
    ]
    lines += [f"| {r['backend']} | {r['commits_per_s']:.0f} | {r['commit_s']:.1f} | {r['topk_p50_ms']:.2f} | {r['topk_p99_ms']:.2f} |" for r in rows]
    lines += [
        "", f"## First compile vs re-compile ({comp['model']}, {comp['trials_per_layer']} trials per layer, SQLite)", "",
        "| first compile s | new trials | re-compile s | new trials | re-compile / first |", "|---|---|---|---|---|",
        f"| {comp['first_s']:.1f} | {comp['first_trials']} | {comp['recompile_s']:.1f} | {comp['recompile_trials']} | {comp['ratio'] * 100:.1f}% |",
        "", f"{comp['layers']} layers, {comp['fallback_layers']} fell back to the default schedule. Goal: re-compile <= 5% of the first.",
    ]
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--model", default="resnet18-small")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tuning_db.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tvmsched-dbbench-") as tmp:
        rows = store_rows(args.records, Path(tmp))
        print(json.dumps(rows), flush=True)
        comp = compile_rows(args.model, args.trials, Path(tmp))
        print(json.dumps(comp), flush=True)
    write_markdown(args.out, args, rows, comp)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
