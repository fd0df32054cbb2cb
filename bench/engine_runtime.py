"""The engine Runtime (tvmsched/runtime.h) against today's paths, side by side in one run (issue 38's benchmarks).

    python bench/engine_runtime.py --rounds 10 --requests 400 --out bench/results/raw/engine_runtime.json

1. Host cost per request on bench/engine.py's 64-layer chain (~0.1 µs of work a layer: a run is almost all host
   cost), one request at a time, the ways interleaved in rounds of rotating order:
     direct     Executor.run on the calling thread (no stream, no policy)
     stream     the engine stream's own hand-off: Stream.submit + Request.wait
     engine_rt  the engine Runtime: Runtime.submit + Request.wait (queued on the model, the policy at launch)
     python_rt  tvmsched.runtime.Runtime.submit(...).result() (today's Python runtime)
   p50 and p99 of each round; the report gives the median over rounds, and p99 / p50.
2. Policy decisions on a three-model mix with restricted-unit candidates: mlp, bert-tiny and resnet18-small compiled
   with 1- and 2-thread candidates from a CPU kit measured here (as tests/runtime/test_runtime.py builds them), on the
   engine Runtime with the colocation policy; three client threads submit Poisson arrivals; the decision times (the
   monitor's read of every stream included) p50 / p99, and the QoS of each model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _common  # noqa: E402  (bench/ is not a package)

WAYS = ("direct", "stream", "engine_rt", "python_rt")


def host_cost(chain: Path, rounds: int, requests: int) -> dict:
    from tvmsched.runtime import Executor, Runtime, native
    from tvmsched.runtime.executor import to_engine

    executor = Executor(str(chain))
    inputs = executor.random_inputs(0)
    engine_inputs = to_engine(inputs)
    stream = native.create_stream(native.load_model(str(chain), "", "auto", [], None), "chain", 8, 200.0, 1.0, 60.0,
                                  "normal")
    engine_rt = native.create_runtime({"policy": "colocation"})
    chain_name = str(engine_rt.load(str(chain), {}))
    python_rt = Runtime("cpu")
    model = python_rt.load(str(chain))

    def one(way: str) -> None:
        if way == "direct":
            executor.run(inputs)
        elif way == "stream":
            request = stream.submit(engine_inputs, [])
            request.wait(60.0, 200.0)
            request.outputs()
        elif way == "engine_rt":
            request = engine_rt.submit(chain_name, engine_inputs, -1, -1.0)
            request.wait(60.0, 200.0)
            request.outputs()
        else:
            python_rt.submit(model, inputs).result()

    for way in WAYS:  # warm-up
        for _ in range(100):
            one(way)
    per_round = {way: [] for way in WAYS}
    for r in range(rounds):
        order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
        for way in order:
            times = []
            for _ in range(requests):
                start = time.perf_counter()
                one(way)
                times.append(time.perf_counter() - start)
            us = np.array(times) * 1e6
            per_round[way].append({"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))})
    python_rt.shutdown()
    engine_rt.shutdown()
    stream.close()
    out = {}
    for way, rows in per_round.items():
        p50 = statistics.median(row["p50_us"] for row in rows)
        p99 = statistics.median(row["p99_us"] for row in rows)
        ratios = [row["p99_us"] / row["p50_us"] for row in rows]
        out[way] = {"p50_us": p50, "p99_us": p99, "p99_over_p50_median": statistics.median(ratios), "rounds": rows}
    return out


def candidate_artifacts(out_dir: Path, names: list[str]) -> dict[str, Path]:
    """Each model compiled with 1- and 2-thread candidates from a CPU kit measured here (cached in `out_dir`)."""
    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.tune.kit_build import build_kit, import_results
    from tvmsched.tune.kit_run import measure_kit

    paths = {}
    for name in names:
        path = out_dir / f"{name}-candidates.tvms"
        if not path.exists():
            kit, db = out_dir / f"{name}-kit", f"sqlite:///{out_dir / name}.db"
            build_kit(models.build(name), kit, target="llvm", samples=2, progress=False)
            import_results(kit, measure_kit(kit, [1, 2], repeat=2, progress=False), db)
            compile_model(models.build(name), name=name, qos_ms=1000.0, database=db).save(path)
        paths[name] = path
    return paths


def decisions(paths: dict[str, Path], seconds: float, rate: float, seed: int) -> dict:
    from tvmsched.runtime import Executor, native
    from tvmsched.runtime.executor import to_engine

    rt = native.create_runtime({"policy": "colocation", "total_units": 2})
    inputs = {}
    for name, path in paths.items():
        rt.load(str(path), {"warmup": True})
        inputs[name] = to_engine(Executor(str(path)).random_inputs(0))
    requests: list = []
    lock = threading.Lock()

    def client(name: str, seed: int) -> None:
        rng = random.Random(seed)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            time.sleep(rng.expovariate(rate))
            request = rt.submit(name, inputs[name], -1, -1.0)
            with lock:
                requests.append(request)

    threads = [threading.Thread(target=client, args=(name, seed + i)) for i, name in enumerate(paths)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for request in requests:
        request.wait(60.0, 0.0)
    # the decisions' times; of those, reading every stream's state (monitor); their thread's CPU time, the p99 of the
    # ones whose thread kept its core, and the share that did not
    d = {str(k): float(v) for k, v in rt.decisions().items()}
    # (the engine's own stats: its lists of batches and sizes are tvm-ffi arrays, kept out of the JSON)
    stats = {str(name): {str(k): v for k, v in dict(s).items() if isinstance(v, (int, float, str))}
             for name, s in rt.stats().items()}
    rt.shutdown()
    return {"decisions": int(d["decided"]), "decision_p50_us": d["p50_us"], "decision_p99_us": d["p99_us"],
            "monitor_p50_us": d["monitor_p50_us"], "monitor_p99_us": d["monitor_p99_us"],
            "cpu_p50_us": d["cpu_p50_us"], "cpu_p99_us": d["cpu_p99_us"], "undisturbed_p99_us": d["undisturbed_p99_us"],
            "off_core_share": d["disturbed_share"],
            "requests": len(requests), "per_model": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=400, help="requests per way per round")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the three-model mix")
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second per model in the mix")
    parser.add_argument("--work", type=Path, default=Path("build/bench-engine-runtime"))
    parser.add_argument("--skip-mix", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from engine import compile_chain  # bench/engine.py

    report = {"machine": _common.machine_info(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv)}
    chain = compile_chain(args.work, 64, 8)
    report["host_cost"] = host_cost(chain, args.rounds, args.requests)
    print(json.dumps({w: {k: round(v, 1) for k, v in r.items() if k != "rounds"} for w, r in report["host_cost"].items()}),
          flush=True)
    if not args.skip_mix:
        paths = candidate_artifacts(args.work, ["mlp", "bert-tiny", "resnet18-small"])
        report["mix"] = decisions(paths, args.seconds, args.rate, seed=1)
        print(json.dumps({k: v for k, v in report["mix"].items() if k != "per_model"}), flush=True)
    report["load_average_after"] = os.getloadavg()
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
