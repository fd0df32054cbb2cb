"""Mechanism E measured on 127.0.0.1 (issue 15): the agent's per-AllReduce overhead, consensus rounds,
and the JCT of three concurrent small DDP jobs under every policy, with the simulator's prediction.

    python bench/collectives.py --out bench/results/raw/collectives_measured.json [--steps 40]

1. Overhead: one Gloo rank (the agent's cost alone) and two (contending for this machine's 2 cores);
   blocks of plain `dist.all_reduce` and of the same AllReduce through an agent whose installed state makes `decide` do real work (three jobs' profiles, TDM) alternate, so
   noise hits both alike. Reported: per-op latency of each (p50/p99), the agent's own cost (hand-over
   to launch, when the queue was empty) and `decide` alone.
2. JCT: three jobs x 2 ranks train the example MLP (examples/ddp_train.py) at once under one
   controller and one aggregation service, per policy; the cluster link is emulated (--link-gbps: ring
   AllReduce 50 us + bytes/rate, the switch half of that) and each step adds --compute-ms of compute.
   Consensus round times come from the same runs. The simulator (simulate_jobs) predicts the same jobs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("none", "exclusive", "spatial", "mina", "tdm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- 1. overhead (runs inside each rank) -----------------------------------------------------------------

def overhead_worker(rank: int, world: int, port: int, ops: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from tvmsched.runtime.collectives.agent import Agent
    from tvmsched.runtime.collectives.decision import JobState, OpTiming, Profile, SwitchState, decide

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    now = time.time()
    prof = Profile(step_s=0.05, ops=tuple(OpTiming(i * 0.004, 1 << 20, 0.003, 0.0015) for i in range(8)), hosts=2)
    jobs = tuple(JobState(name, prof, ref_seq=0, ref_time=now + k * 0.01, eff_seq=0, lease_seq=1 << 40)
                 for k, name in enumerate(("me", "x", "y")))
    state = SwitchState(version=1, policy="tdm", jobs=jobs)
    agent = Agent("me")  # no controller, no switch: the decision is made, every path is ring
    agent.install(state)
    t = torch.ones(256)
    plain, through = [], []
    for block in range(2 * (ops // 200)):
        for _ in range(200):
            t0 = time.perf_counter()
            if block % 2:
                agent.all_reduce(t).wait()
                through.append(time.perf_counter() - t0)
            else:
                dist.all_reduce(t)
                plain.append(time.perf_counter() - t0)
    decide_s = []
    for seq in range(ops):
        t0 = time.perf_counter()
        decide(state, "me", seq)
        decide_s.append(time.perf_counter() - t0)
    Path(out).write_text(json.dumps({"plain": plain, "agent": through, "own": agent.overheads(), "decide": decide_s}))
    agent.close()
    dist.destroy_process_group()


def overhead(ops: int, world: int) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, __file__, "overhead-worker", str(r), str(world), str(port), str(ops), f"{tmp}/{r}.json"],
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in range(world)]
        for p in procs:
            p.wait(timeout=600)
        d = json.loads(Path(f"{tmp}/0.json").read_text())
    us = lambda xs, q: round(_pct(xs, q) * 1e6, 1)  # noqa: E731
    return {"world": world, "ops": len(d["plain"]), "bytes": 1024,
            **{f"{k}_p{int(q * 100)}_us": us(d[k], q) for k in ("plain", "agent", "own", "decide") for q in (0.5, 0.99)},
            "added_p50_us": round((_pct(d["agent"], 0.5) - _pct(d["plain"], 0.5)) * 1e6, 1),
            "added_p99_us": round((_pct(d["agent"], 0.99) - _pct(d["plain"], 0.99)) * 1e6, 1)}


# -- 2. JCT of three concurrent jobs per policy ------------------------------------------------------------

def jct_run(policy: str, steps: int, link_gbps: float, compute_ms: float, tmp: Path) -> dict:
    from tvmsched.runtime.collectives.controller import Controller
    from tvmsched.runtime.collectives.switch import SwitchServer

    switch = SwitchServer(mode="spatial" if policy == "spatial" else "tdm", slots=3 if policy == "spatial" else 1,
                          link_gbps=link_gbps, op_timeout_s=2.0)
    sport = switch.start()
    ctl = Controller(policy=policy, refresh_s=0.25, lease_s=2.0)
    cport = ctl.start()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    procs = []
    jobs = ("j0", "j1", "j2")
    try:
        for job in jobs:
            port = _free_port()
            for rank in range(2):
                procs.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--job", job, "--rank", str(rank), "--world", "2",
                     "--master-port", str(port), "--controller", f"127.0.0.1:{cport}", "--switch", f"127.0.0.1:{sport}",
                     "--steps", str(steps), "--link-gbps", str(link_gbps), "--compute-ms", str(compute_ms),
                     "--wait-state", "60", "--out", str(tmp / f"{policy}-{job}{rank}.json")], env=env))
        for p in procs:
            p.wait(timeout=600)
        reports = {(j, r): json.loads((tmp / f"{policy}-{j}{r}.json").read_text()) for j in jobs for r in range(2)}
        log, rounds = switch.log(), ctl.rounds
    finally:
        ctl.stop()
        switch.stop()
    jct = {j: max(reports[(j, r)]["jct_s"] for r in range(2)) for j in jobs}
    paths = {j: reports[(j, 0)]["stats"]["paths"] for j in jobs}
    committed = [r["seconds"] for r in rounds if r.get("seqs")]
    step_ops = reports[("j0", 0)]["stats"]["allreduces"] / steps
    return {"policy": policy, "avg_jct_s": statistics.mean(jct.values()), "jct_s": jct, "paths": paths,
            "innet_fraction": sum(p.get("innet", 0) for p in paths.values()) / sum(sum(p.values()) for p in paths.values()),
            "switch_done": sum(e["verdict"] == "done" for e in log), "switch_refused": sum(e["verdict"] == "refused" for e in log),
            "rounds": len(rounds), "rounds_committed": len(committed), "allreduces_per_step": step_ops,
            "round_p50_ms": _pct(committed, 0.5) * 1e3 if committed else None,
            "round_p99_ms": _pct(committed, 0.99) * 1e3 if committed else None,
            "errors": [r["error"] for r in reports.values() if r["error"]],
            "step_s": statistics.median(s for r in reports.values() for s in r["steps"][2:]),
            "step_bytes": reports[("j0", 0)]["stats"]["step_bytes"]}


def predicted(policy: str, steps: int, link_gbps: float, compute_s: float, bucket_bytes: list[int]) -> float:
    """The simulator's average JCT for the same three jobs on one switch (MINA's cost model at the
    emulated link rate; each step computes `compute_s`, then its buckets' AllReduces)."""
    from tvmsched.runtime.collectives.simulator import JobSpec, simulate_jobs

    specs = [JobSpec(name=f"j{k}", steps=steps, bucket_bytes=tuple(bucket_bytes), compute_s=compute_s, hosts=2) for k in range(3)]
    return simulate_jobs(specs, policy, link_gbps=link_gbps)["avg_jct_s"]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "overhead-worker":
        overhead_worker(*map(int, sys.argv[2:6]), sys.argv[6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/raw/collectives_measured.json"))
    ap.add_argument("--ops", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--link-gbps", type=float, default=1.0)
    ap.add_argument("--compute-ms", type=float, default=5.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    result = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
              "command": " ".join(["python", "bench/collectives.py", *sys.argv[1:]]),
              "overhead": [overhead(args.ops, 1), overhead(args.ops, 2)], "link_gbps": args.link_gbps, "compute_ms": args.compute_ms, "steps": args.steps}
    print(json.dumps(result["overhead"]), flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            runs.append(jct_run(policy, args.steps, args.link_gbps, args.compute_ms, Path(tmp)))
            print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("jct_s", "paths")}), flush=True)
    result["jct"] = runs
    # the simulator on the same jobs: compute per step = the measured step without AllReduces (policy none)
    none = next((r for r in runs if r["policy"] == "none"), None)
    if none is not None:
        buckets = none["step_bytes"]
        from tvmsched.runtime.collectives.workloads import LATENCY_S, transfer_s

        ring = sum(transfer_s(b, 2, args.link_gbps * 1e9 / 8, LATENCY_S) for b in buckets)
        compute_s = max(none["step_s"] - ring, 0.0)
        for r in runs:
            r["simulated_avg_jct_s"] = predicted(r["policy"], args.steps, args.link_gbps, compute_s, buckets)
        result["simulated_compute_s"] = compute_s
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
