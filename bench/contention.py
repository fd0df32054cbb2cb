"""CPU contention benchmark (issue 28, item 3; bench/results/contention.md): each model alone and beside a
neighbour whose onnxruntime workers spin on the same cores, for each way of running the engine's parallel loops,
side by side in one run.

    python bench/contention.py [--models squeezenet,resnet18,bert-tiny] [--rounds 8] [--seconds 0.6]
    python bench/contention.py --configs engine,tvm-30000 --modes alone,process      # a subset
    python bench/contention.py --report                                               # markdown from the raw JSON

Per model, one long-lived child process per configuration loads the artifact (the configuration is its
environment, read when TVM's runtime and the engine start); in each of --rounds rounds every child in turn
(shuffled) measures a window of back-to-back runs in each neighbour mode, back to back, so that a configuration's
alone and neighbour windows see the same machine a second apart (the machine may be shared: its load moves). The
runs of a cell's windows are pooled into p50/p99; the slowdown is the median over rounds of each round's ratio.
Each window runs on a fresh thread of its child that is joined before the next window starts: a thread's pool is
joined when the thread exits, so no configuration's workers still spin (TVM's spin up to 300000 yields) while
another one is measured alone.

Neighbour modes:
  alone       nothing else of ours runs (other users of the machine may: see the load averages)
  process     another process runs an onnxruntime session of --neighbour in a loop, default options (intra-op
              threads = the cores, spinning on): its workers spin on the same cores
  in-process  the same loop in a thread of the measuring process (tenants sharing one process)

Configurations (the names of --configs):
  engine        the engine's pool (the fix: slices claimed; idle workers spin TVMSCHED_CPU_POOL_SPIN_US, 50 us,
                then sleep)
  engine-adaptive  the engine's pool, no spinning while the machine is contended (TVMSCHED_CPU_POOL_ADAPT=1)
  engine-spin0  the engine's pool, workers sleep at once (TVMSCHED_CPU_POOL_SPIN_US=0)
  engine-chunks4  the engine's pool, 4 slices per thread (TVMSCHED_CPU_POOL_CHUNKS=4)
  tvm-30000     TVM's pool as the engine ran it before: workers spin 30000 yields (the engine's default then)
  tvm-300000    TVM's pool with TVM's own default spin count
  tvm-0         TVM's pool, workers sleep at once (TVM_THREAD_POOL_SPIN_COUNT=0)
  tvm-unpinned  TVM's pool with its threads not bound to cores (TVM_BIND_THREADS=0)
  1-thread      one thread (TVM_NUM_THREADS=1): no pool
  onnxruntime   the model in onnxruntime with --threads intra-op threads (sequential), for reference
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import compile_in_child, machine_info, machine_line, write_json_atomic  # noqa: E402

HERE = Path(__file__).parent
RESULTS = HERE / "results"
GOAL = 1.5  # p50 beside a spinning neighbour <= 1.5x the p50 alone
BEFORE = "tvm-30000"  # how the engine ran kernels before its own pool

CONFIGS = {
    "engine": {},
    "engine-spin0": {"TVMSCHED_CPU_POOL_SPIN_US": "0"},
    "engine-adaptive": {"TVMSCHED_CPU_POOL_ADAPT": "1"},
    "engine-chunks4": {"TVMSCHED_CPU_POOL_CHUNKS": "4"},
    "tvm-30000": {"TVMSCHED_CPU_POOL": "tvm"},
    "tvm-300000": {"TVMSCHED_CPU_POOL": "tvm", "TVM_THREAD_POOL_SPIN_COUNT": "300000"},
    "tvm-0": {"TVMSCHED_CPU_POOL": "tvm", "TVM_THREAD_POOL_SPIN_COUNT": "0"},
    "tvm-unpinned": {"TVMSCHED_CPU_POOL": "tvm", "TVM_BIND_THREADS": "0"},
    "1-thread": {"TVMSCHED_CPU_POOL": "tvm", "TVM_NUM_THREADS": "1"},
    "onnxruntime": {},
}
DEFAULT_CONFIGS = ("engine,engine-adaptive,engine-spin0,engine-chunks4,tvm-30000,tvm-300000,tvm-0,tvm-unpinned,"
                   "1-thread,onnxruntime")
MODES = ("alone", "process", "in-process")
POOL_ENV = ("TVMSCHED_CPU_POOL", "TVMSCHED_CPU_POOL_SPIN_US", "TVMSCHED_CPU_POOL_CHUNKS", "TVMSCHED_CPU_POOL_ADAPT",
            "TVM_THREAD_POOL_SPIN_COUNT",
            "TVM_BIND_THREADS")

# The neighbour: an onnxruntime session with its default options (intra-op threads = cores, workers spinning
# between and inside runs) running `path` in a loop; it writes how many runs it finished to `count_path`.
NEIGHBOUR = r"""
import os, sys, threading, time
import numpy as np, onnx, onnxruntime
from tvmsched import models
path, count_path = sys.argv[1], sys.argv[2]
inputs = {k: v for k, v in np.load(sys.argv[3]).items()} if len(sys.argv) > 3 and sys.argv[3] else \
    models.random_inputs(onnx.load(path, load_external_data=False), seed=1)
sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
runs = 0
def report():
    while True:
        tmp = count_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(runs))
        os.replace(tmp, count_path)
        time.sleep(0.05)
sess.run(None, inputs)
threading.Thread(target=report, daemon=True).start()
print("ready", flush=True)
while True:
    sess.run(None, inputs)
    runs += 1
"""

# One configuration of one model, kept alive: reads JSON commands on stdin, answers one JSON line each.
#   {"measure": seconds, "max_runs": n}  -> {"ms": [...], "neighbour_runs": k (in-process neighbour's runs meanwhile)}
#   {"neighbour": "on" | "off"}          -> {"ok": true}   (the in-process neighbour: a thread running NEIGHBOUR's loop)
CHILD = r"""
import json, os, sys, threading, time
import numpy as np
kind, path, inputs_path, neighbour_path, threads = sys.argv[1:6]
if kind == "tvmsched":
    import tvmsched.runtime
    from tvmsched.runtime import native
    ex = tvmsched.runtime.load(path)
    if inputs_path and os.path.exists(inputs_path):
        with np.load(inputs_path) as saved:
            inputs = {name: saved[name] for name in saved.files}
    else:
        inputs = ex.random_inputs(seed=0)
    def timed(n, warmup):
        return [t * 1e3 for t in ex.time_runs(inputs, n, warmup=warmup)]
    pool = native.cpu_pool()
else:
    import onnx
    from tvmsched import models
    from tvmsched.cli.compare import onnxruntime_session
    sess = onnxruntime_session(path, int(threads))
    if inputs_path and os.path.exists(inputs_path):
        with np.load(inputs_path) as saved:
            inputs = {i.name: saved[i.name] for i in sess.get_inputs()}
    else:
        inputs = models.random_inputs(onnx.load(path, load_external_data=False), seed=0)
    def timed(n, warmup):
        for _ in range(warmup):
            sess.run(None, inputs)
        out = []
        for _ in range(n):
            start = time.perf_counter(); sess.run(None, inputs); out.append((time.perf_counter() - start) * 1e3)
        return out
    pool = {}
warm = threading.Thread(target=timed, args=(3, 1))
warm.start(); warm.join()
neighbour = {"thread": None, "go": threading.Event(), "idle": threading.Event(), "runs": 0}
def neighbour_loop():
    import onnx, onnxruntime
    from tvmsched import models
    sess = onnxruntime.InferenceSession(neighbour_path, providers=["CPUExecutionProvider"])
    feed = models.random_inputs(onnx.load(neighbour_path, load_external_data=False), seed=1)
    while True:
        neighbour["idle"].set()
        neighbour["go"].wait()
        neighbour["idle"].clear()
        while neighbour["go"].is_set():
            sess.run(None, feed)
            neighbour["runs"] += 1
print(json.dumps({"ready": True, "pool": pool}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if "neighbour" in cmd:
        if cmd["neighbour"] == "on":
            if neighbour["thread"] is None:
                neighbour["thread"] = threading.Thread(target=neighbour_loop, daemon=True)
                neighbour["thread"].start()
            runs = neighbour["runs"]
            neighbour["go"].set()
            while neighbour["runs"] < runs + 2:
                time.sleep(0.005)
        else:
            neighbour["go"].clear()
            if neighbour["thread"] is not None:
                neighbour["idle"].wait()
        print(json.dumps({"ok": True}), flush=True)
        continue
    # each window runs on a thread of its own, joined before answering: a thread's pool (TVM's or the engine's) is
    # joined when the thread exits, so no worker of this configuration still spins during another's window
    window = {}
    def measure():
        timed(2, 0)  # this thread's pool starts
        before = neighbour["runs"]
        (first,) = timed(1, 0)
        n = max(3, min(int(cmd["max_runs"]), int(cmd["measure"] * 1e3 / max(first, 1e-3))))
        window["ms"] = [first] + timed(n - 1, 0)
        window["neighbour_runs"] = neighbour["runs"] - before
    thread = threading.Thread(target=measure)
    thread.start(); thread.join()
    print(json.dumps(window), flush=True)
"""


class Child:
    """One configuration of one model in its own process."""

    def __init__(self, config: str, kind: str, path: Path, inputs: Path | None, neighbour: Path, threads: int):
        env = {k: v for k, v in os.environ.items() if k not in POOL_ENV}
        env.update({"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)})
        env.update(CONFIGS[config])
        self.config = config
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, kind, str(path), str(inputs or ""), str(neighbour), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._reply()
        self.pool = self.ready.get("pool", {})

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"configuration {self.config}: its process exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class NeighbourProcess:
    """Another process running onnxruntime in a loop, with its run counter."""

    def __init__(self, onnx_path: Path, inputs: Path | None):
        self.count_path = Path(tempfile.mkstemp(prefix="tvmsched-neighbour-", suffix=".count")[1])
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(onnx_path), str(self.count_path),
                                      str(inputs or "")], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the neighbour process exited ({self.proc.wait()})")
        time.sleep(0.5)  # its workers settle into their loop

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def runs(self) -> int:
        try:
            return int(self.count_path.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        self.proc.kill()
        self.proc.send_signal(signal.SIGCONT)
        self.proc.wait()
        self.count_path.unlink(missing_ok=True)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def prepare(name: str, work: Path, threads: int) -> tuple[Path, Path, Path | None]:
    """(ONNX file, artifact, inputs or None): the model built and compiled (default schedules) into `work`."""
    from tvmsched import models

    registry = "zoo" if name in models.MODELS else "real"
    onnx_path, artifact, inputs = work / f"{name}.onnx", work / f"{name}.tvms", work / f"{name}.inputs.npz"
    meta = work / f"{name}.json"
    if not artifact.exists() or not meta.exists():
        result = compile_in_child(name, registry, onnx_path, artifact, threads=threads, inputs_path=inputs)
        meta.write_text(json.dumps(result))
    onnx_file = Path(json.loads(meta.read_text())["onnx"])
    return onnx_file, artifact, inputs if inputs.exists() else None


def neighbour_onnx(name: str, work: Path) -> Path:
    from tvmsched import models

    if name in models.MODELS:
        path = work / f"{name}.onnx"
        if not path.exists():
            models.save(name, str(path), seed=1)
        return path
    return Path(models.real_model_path(name, 0))


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def measure_model(name: str, configs: list[str], modes: list[str], args, work: Path, neighbour: Path) -> dict:
    onnx_path, artifact, inputs = prepare(name, work, args.threads)
    children = {}
    try:
        for config in configs:
            kind, path = ("onnxruntime", onnx_path) if config == "onnxruntime" else ("tvmsched", artifact)
            children[config] = Child(config, kind, path, inputs, neighbour, args.threads)
        cells = {config: {mode: {"ms": [], "p50s": [], "neighbour_runs_per_s": [], "load": []} for mode in modes}
                 for config in configs}
        proc = NeighbourProcess(neighbour, None) if "process" in modes else None
        try:
            if proc:
                proc.pause()
            rng = random.Random(0)
            for round_index in range(args.rounds):
                shuffled = list(configs)
                rng.shuffle(shuffled)
                for position, config in enumerate(shuffled):
                    child = children[config]
                    shift = (round_index + position) % len(modes)
                    for mode in modes[shift:] + modes[:shift]:  # a configuration's modes back to back
                        if mode == "process":
                            proc.resume()
                            time.sleep(0.3)  # its workers are back in their loop
                        elif mode == "in-process":
                            child.ask({"neighbour": "on"})
                            time.sleep(0.2)
                        before, start = proc.runs() if proc else 0, time.perf_counter()
                        answer = child.ask({"measure": args.seconds, "max_runs": args.max_runs})
                        elapsed = time.perf_counter() - start
                        if mode == "process":
                            proc.pause()
                            runs = proc.runs() - before
                        elif mode == "in-process":
                            child.ask({"neighbour": "off"})
                            runs = answer["neighbour_runs"]
                        cell = cells[config][mode]
                        cell["ms"] += answer["ms"]
                        cell["p50s"].append(percentile(answer["ms"], 0.5))
                        if mode != "alone":
                            cell["neighbour_runs_per_s"].append(runs / elapsed)
                        cell["load"].append(loadavg())
                        time.sleep(0.2)  # onnxruntime's own workers (the reference's, the neighbour's) stop spinning
                        print(f"  {name} round {round_index + 1} {mode:10s} {config:18s} p50 "
                              f"{cell['p50s'][-1]:8.3f} ms ({len(answer['ms'])} runs)", flush=True)
        finally:
            if proc:
                proc.close()
        pools = {config: child.pool for config, child in children.items()}
    finally:
        for child in children.values():
            child.close()
    out = {"configs": {}, "pools": pools}
    for config in configs:
        out["configs"][config] = {}
        for mode in modes:
            cell = cells[config][mode]
            alone = cells[config].get("alone", {}).get("p50s")
            ratios = [p50 / base for p50, base in zip(cell["p50s"], alone)] if alone else []
            out["configs"][config][mode] = {
                "p50_ms": percentile(cell["ms"], 0.5), "p99_ms": percentile(cell["ms"], 0.99), "runs": len(cell["ms"]),
                "window_p50s_ms": cell["p50s"],
                "ratio_median": percentile(ratios, 0.5) if ratios else None,
                "neighbour_runs_per_s": (sum(cell["neighbour_runs_per_s"]) / len(cell["neighbour_runs_per_s"])
                                         if cell["neighbour_runs_per_s"] else None),
                "load": sum(cell["load"]) / len(cell["load"])}
    return out


def report(raw: dict) -> str:
    info = raw["machine"]
    lines = ["# CPU contention (issue 28, item 3)", "",
             f"Command: `{raw['command']}`", "", machine_line(info), "",
             f"Neighbour: onnxruntime {info.get('onnxruntime')} running `{raw['neighbour']}` in a loop with its "
             f"default session options (intra-op threads = the {info['cores']} cores, spinning), in another process "
             f"(`process`, stopped with SIGSTOP between its windows) or in a thread of the measuring process "
             f"(`in-process`). Every configuration of a model ran in its own long-lived process; in each of "
             f"{raw['rounds']} rounds the configurations took turns (shuffled), each measuring its modes back to back "
             f"in windows of about {raw['seconds']} s (at least 3 runs). p50 is the median of the windows' p50s, p99 "
             f"pools every window's runs; `x alone` is the median over the rounds of a window's p50 over the same "
             f"round's alone p50 (goal <= {GOAL}x); `nb/s` is the neighbour's runs per second meanwhile; "
             f"`alone x {BEFORE}` is the median over the "
             f"rounds of the alone p50 over {BEFORE}'s alone p50 in the same round (no loss alone: <= 1.0x); `load` is "
             f"the mean 1-minute load average (other users of the machine included).", ""]
    modes = raw["modes"]
    others = [m for m in modes if m != "alone"]
    before = "alone" in modes and all(BEFORE in r["configs"] for r in raw["models"].values())
    header = ["model", "configuration", *[f"{m} p50 / p99 ms" for m in modes], *[f"{m} x alone" for m in others],
              *[f"{m} nb/s" for m in others], *([f"alone x {BEFORE}"] if before else []), "load"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, result in raw["models"].items():
        for config, row in result["configs"].items():
            cells = [name, config]
            cells += [f"{percentile(row[m]['window_p50s_ms'], 0.5):.3f} / {row[m]['p99_ms']:.3f}" for m in modes]
            cells += [f"{row[m]['ratio_median']:.2f}x" if row[m].get("ratio_median") else "-" for m in others]
            cells += [f"{row[m]['neighbour_runs_per_s']:.0f}" if row[m]["neighbour_runs_per_s"] else "-"
                      for m in others]
            if before:  # the alone p50 over the configuration the engine ran before, in the same round
                base = result["configs"][BEFORE]["alone"]["window_p50s_ms"]
                ratios = [a / b for a, b in zip(row["alone"]["window_p50s_ms"], base)]
                cells.append(f"{percentile(ratios, 0.5):.2f}x")
            cells.append(f"{sum(row[m]['load'] for m in modes) / len(modes):.1f}")
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def write_report(raw: dict, out: Path) -> None:
    """The markdown, keeping the hand-written "## Reading" section of an earlier `out` (if any) after the table."""
    reading = ""
    if out.exists() and "\n## Reading" in out.read_text():
        reading = "\n## Reading" + out.read_text().split("\n## Reading", 1)[1]
    out.write_text(report(raw) + reading)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="squeezenet,resnet18,bert-tiny")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--neighbour", default="squeezenet",
                        help="the model onnxruntime runs beside (a zoo or real model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.6, help="about how long each window of runs lasts")
    parser.add_argument("--max-runs", type=int, default=500)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tvmsched-contention")
    parser.add_argument("--raw", type=Path, default=RESULTS / "raw" / "contention.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "contention.md")
    parser.add_argument("--report", action="store_true", help="write the markdown from --raw and stop")
    args = parser.parse_args()
    if args.report:
        raw = json.loads(args.raw.read_text())
        write_report(raw, args.out)
        print(args.out.read_text())
        return
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [c for c in configs if c not in CONFIGS] + [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"unknown configurations or modes {unknown}; configurations: {', '.join(CONFIGS)}; "
                 f"modes: {', '.join(MODES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    neighbour = neighbour_onnx(args.neighbour, args.work)
    raw = {"command": "python bench/contention.py " + " ".join(sys.argv[1:]), "machine": machine_info(),
           "neighbour": args.neighbour, "rounds": args.rounds, "seconds": args.seconds, "modes": modes, "models": {}}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"{name}:", flush=True)
        raw["models"][name] = measure_model(name, configs, modes, args, args.work, neighbour)
        write_json_atomic(args.raw, raw)
    write_report(raw, args.out)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
