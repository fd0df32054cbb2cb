"""Preemption benchmark: instrumentation overhead, preemption latency, and a DISB-like real-time + best-effort mix.

CPU (compiles the artifacts first):
    python bench/preemption.py --compile --out bench/results/raw/preemption_cpu.json
GPU machine (artifacts compiled here with --target cuda, carried in ARTIFACT_DIR):
    python3 bench/preemption.py --device cuda --artifact-dir .gpu/preempt --out $OUT/preemption_h100.json
ARTIFACT_DIR holds MODEL.tvms (instrumented, the default) and MODEL.plain.tvms (--no-preempt-checks).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import threading
import time
from pathlib import Path

import numpy as np

OVERHEAD_MODELS = ["mlp", "resnet18-small", "mobilenetv2", "bert-tiny"]


def compile_all(out_dir: Path, models_: list[str], target: str) -> None:
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in models_:
        model = models.build(name)
        compile_model(model, name=name, target=target).save(out_dir / f"{name}.tvms")
        compile_model(model, name=name, target=target, preempt_checks=False).save(out_dir / f"{name}.plain.tvms")
        print(f"compiled {name}", flush=True)


def overhead(artifact_dir: Path, name: str, device: str, rounds: int, repeat: int, flag_memory: str = "auto") -> dict:
    """Whole-model latency, instrumented vs plain, interleaved rounds (p50 of all runs)."""
    p50, runs, flags = interleaved_p50({"instrumented": artifact_dir / f"{name}.tvms",
                                        "plain": artifact_dir / f"{name}.plain.tvms"}, device, rounds, repeat, flag_memory)
    return {"model": name, "plain_ms_p50": p50["plain"], "instrumented_ms_p50": p50["instrumented"],
            "overhead": p50["instrumented"] / p50["plain"] - 1, "runs": runs, "flag_memory": flags}


def interleaved_p50(artifacts: dict[str, Path], device: str, rounds: int, repeat: int,
                    flag_memory: str = "auto") -> tuple[dict[str, float], int, dict[str, str]]:
    """({label: p50 ms of whole-model runs}, runs each, {label: where its preempt flag was}): the artifacts timed in
    alternating rounds."""
    from tvmsched.runtime import Executor

    executors = {label: Executor(path, device, flag_memory=flag_memory) for label, path in artifacts.items()}
    inputs = next(iter(executors.values())).random_inputs(0)
    times = {label: [] for label in executors}
    for _ in range(rounds):
        for label, executor in executors.items():
            times[label] += executor.time_runs(inputs, repeat, warmup=1)
    flags = {label: executor.flag_memory for label, executor in executors.items()}
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}, rounds * repeat, flags


def preemption_latency(artifact_dir: Path, name: str, device: str, samples: int, seed: int = 0,
                       flag_memory: str = "auto", probe: str | None = None) -> dict:
    """preempt() durations on a busy best-effort task, against waiting for the kernel / the request; with `probe` (a
    small real-time model), also what preemption costs a real-time request: the best-effort task is preempted without
    waiting and the probe's request submitted at once on a high-priority stream; its engine latency (submit to
    finish) minus its median alone is the delay the best-effort work still caused ("realtime_delay", GPreempt's
    preemption latency as the real-time request sees it)."""
    from tvmsched.runtime import Executor
    from tvmsched.runtime.preemption import Task

    executor = Executor(artifact_dir / f"{name}.tvms", device, flag_memory=flag_memory)
    inputs = executor.random_inputs(0)
    task = Task(executor, name, priority="low")
    rng = random.Random(seed)
    modes = ["preempt", "wait_kernel", "wait_request"]
    realtime = None
    if probe and (artifact_dir / f"{probe}.tvms").is_file():
        realtime = Task(Executor(artifact_dir / f"{probe}.tvms", device, flag_memory=flag_memory), probe, priority="high")
        probe_inputs = realtime.executor.random_inputs(1)
        alone_us = float(np.median([_engine_us(realtime.submit(probe_inputs)) for _ in range(50)]))
        modes.append("realtime_delay")
    results = {mode: [] for mode in modes}
    request_s = _request_seconds(task, inputs)
    for i in range(samples):
        futures = [task.submit(inputs) for _ in range(3)]
        time.sleep(rng.uniform(0.1, 1.5) * request_s)
        mode = modes[i % len(modes)]
        if mode == "realtime_delay":
            task.preempt(abort=True, wait=False)
            results[mode].append((_engine_us(realtime.submit(probe_inputs)) - alone_us) / 1e6)
            task.resume()
        elif mode == "wait_request":
            start = time.perf_counter()
            running = [f for f in futures if not f.done()]
            if running:
                running[0].result()
            results[mode].append(time.perf_counter() - start)
        else:
            results[mode].append(task.preempt(abort=mode == "preempt").seconds)
            task.resume()
        for future in futures:
            future.result()
    task.close()
    summary = {"model": name, "request_ms": request_s * 1e3, "reruns": task.reruns, "flag_memory": executor.flag_memory}
    if realtime:
        realtime.close()
        summary["probe"] = {"model": probe, "alone_us": alone_us}
    for mode, values in results.items():
        us = np.array(values) * 1e6
        summary[mode] = {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
                         "max_us": float(us.max()), "n": len(us)}
    return summary


def _engine_us(future) -> float:
    """A request's latency on the engine's clock (submit to finish), once it is done."""
    future.result(timeout=60)
    return future.request.finished_us - future.request.submitted_us


def _request_seconds(task, inputs, n: int = 5) -> float:
    task.submit(inputs).result()
    start = time.perf_counter()
    for _ in range(n):
        task.submit(inputs).result()
    return (time.perf_counter() - start) / n


def mix(artifact_dir: Path, realtime: str, best_effort: str, device: str, seconds: float, load: float, seed: int = 0,
        flag_memory: str = "auto", rt_streams: int = 1) -> dict:
    """Real-time requests with Poisson arrivals (rate = load / RT latency) plus a closed-loop best-effort stream; a
    real-time request's latency is the engine's, from its submit to its finish."""
    from tvmsched.runtime import Executor
    from tvmsched.runtime.preemption import Priorities, Task, least_pending

    # the real-time model on `rt_streams` streams (a copy each; each request to the one with the fewest pending)
    rt_execs = [Executor(artifact_dir / f"{realtime}.tvms", device, flag_memory=flag_memory) for _ in range(rt_streams)]
    be_exec = Executor(artifact_dir / f"{best_effort}.tvms", device, flag_memory=flag_memory)
    rt_inputs, be_inputs = rt_execs[0].random_inputs(1), be_exec.random_inputs(2)
    probe = Task(rt_execs[0], "rt")
    rt_alone_s = _request_seconds(probe, rt_inputs, 20)
    probe.close()
    probe = Task(be_exec, "be")
    be_alone_s = _request_seconds(probe, be_inputs, 5)
    probe.close()
    rate = load / rt_alone_s
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, size=int(seconds * rate * 1.5) + 10))
    arrivals = arrivals[arrivals < seconds]

    def run(mode: str) -> dict:
        # preemption: the Runtime's stream priorities (real-time high, best-effort low); the others: equal streams
        ranked = mode == "preemption"
        rt_tasks = [Task(e, f"rt{i}", priority="high" if ranked else "normal") for i, e in enumerate(rt_execs)]
        be_task = Task(be_exec, "be", priority="low" if ranked else "normal")
        priorities = Priorities() if mode == "preemption" else None
        if priorities:
            priorities.add_best_effort(be_task)
        stop, be_done = threading.Event(), [0]

        def best_effort_loop():
            while not stop.is_set():
                be_task.submit(be_inputs).result()
                be_done[0] += 1

        be_thread = threading.Thread(target=best_effort_loop) if mode != "alone" else None
        if be_thread:
            be_thread.start()
        start = time.perf_counter()
        pending = []
        for at in arrivals:
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            rt_task = least_pending(rt_tasks)
            pending.append(priorities.submit_realtime(rt_task, rt_inputs) if priorities else rt_task.submit(rt_inputs))
        for future in pending:
            future.result()
        elapsed = time.perf_counter() - start
        stop.set()
        if be_thread:
            be_thread.join()
        for task in [*rt_tasks, be_task]:
            task.close()
        # the engine's clock, submit to finish: no probe of ours on the streams (a done-callback per request ran on the
        # real-time stream's submitter thread before 476eb1e and waited for the GIL there)
        ms = np.array([f.request.finished_us - f.request.submitted_us for f in pending]) / 1e3
        return {"rt_p50_ms": float(np.percentile(ms, 50)), "rt_p99_ms": float(np.percentile(ms, 99)),
                "rt_requests": len(ms), "be_requests": be_done[0], "be_per_s": be_done[0] / elapsed,
                "preemptions": priorities.preempted if priorities else 0}

    results = {mode: run(mode) for mode in ("alone", "preemption", "shared")}
    rt_busy = len(arrivals) * rt_alone_s / seconds  # fraction of time the RT stream needs alone
    results.update({
        "realtime": realtime, "best_effort": best_effort, "load": load, "seconds": seconds, "rt_streams": rt_streams,
        "rt_alone_ms": rt_alone_s * 1e3, "be_alone_ms": be_alone_s * 1e3,
        "be_per_s_one_after_the_other": (1 - rt_busy) / be_alone_s,
    })
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--artifact-dir", type=Path, default=Path("build/preempt"))
    parser.add_argument("--compile", action="store_true", help="Compile the artifacts into --artifact-dir first.")
    parser.add_argument("--models", nargs="+", default=OVERHEAD_MODELS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--mix-seconds", type=float, default=20.0)
    parser.add_argument("--realtime", default="resnet18-small")
    parser.add_argument("--best-effort", default="bert-tiny")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.2, 0.4])
    parser.add_argument("--sections", nargs="+", default=["overhead", "latency", "mix"], choices=["overhead", "latency", "mix"])
    parser.add_argument("--rt-streams", type=int, default=1,
                        help="mix: the real-time model on this many streams (a copy each, Runtime.load(streams=))")
    parser.add_argument("--flag-memory", default="auto", choices=["auto", "host_mapped", "device"],
                        help="CUDA: where the preempt flag goes (auto: device memory for kernels with loop checks, "
                        "else the faster to set)")
    parser.add_argument("--probe", default="mlp",
                        help="latency: a small real-time model whose request follows each preempt() (skipped when its "
                        "artifact is missing)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.compile:
        compile_all(args.artifact_dir, sorted({*args.models, args.realtime, args.best_effort}), "cuda" if args.device == "cuda" else "llvm")
    report = {"device": args.device, "machine": f"{platform.machine()}, {platform.node()}", "overhead": [], "latency": [], "mix": []}
    flags = args.flag_memory
    jobs = [("overhead", name, lambda name=name: overhead(args.artifact_dir, name, args.device, args.rounds, args.repeat,
                                                          flags)) for name in args.models]
    jobs += [("latency", name, lambda name=name: preemption_latency(args.artifact_dir, name, args.device, args.samples,
                                                                    flag_memory=flags, probe=args.probe))
             for name in (args.realtime, args.best_effort)]
    jobs += [("mix", load, lambda load=load: mix(args.artifact_dir, args.realtime, args.best_effort, args.device,
                                                 args.mix_seconds, load, flag_memory=flags, rt_streams=args.rt_streams))
             for load in args.loads]
    for section, _, job in jobs:
        if section not in args.sections:
            continue
        report[section].append(job())
        print(json.dumps(report[section][-1]), flush=True)
        if args.out:  # written after every measurement, so a cut-off run keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
    main()
