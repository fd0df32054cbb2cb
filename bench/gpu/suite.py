"""The GPU suite's driver (bench/gpu/suite.sh runs it on the GPU machine; docs/gpu.md says how to read it).

    python3 -P bench/gpu/suite.py --artifacts .gpu [--device cuda|cpu] [--budget-s 400] [--out bench/results/gpu.md]

For every artifact carried in `--artifacts` (bench/gpu/prepare.py wrote it and its suite.json), a worker
process: rebuilds the seeded ONNX model, restores the artifact from its slim form (weights regenerated,
bench/gpu/slim.py), checks tvmsched's outputs against onnxruntime (CPU), times the engine (`time_runs`:
every layer launched and the device synchronised, timed in the engine), builds the model's PyTorch twin
from the same ONNX weights (bench/gpu/twins.py; TF32 off, float32 matmul precision "highest") and times it
eagerly and replayed from a CUDA graph, then reads every kernel's GPU time with CUPTI (torch.profiler) for
both engines, and the host time one run takes to issue its launches. A second pass times `torch.compile`
of each twin, while the time budget lasts. Each worker records after every step, so a failure or a kill
at the budget loses only what was not done yet; its cells read "failed: <why>" or "skipped: <why>".
The report (markdown, every number side by side) goes to `--out`, the raw results to `--json`.

Rows at fp16 or at another batch size (prepare.py --rows) run the model rebatched (tvmsched.frontend.batching)
and its twin at that precision (`.half()`), each compared with onnxruntime in float32: fp16 within the bound of
`tvmsched run --check` (2e-2 · max(1, max |ref|)). Each such row has its own PyTorch columns.

`--device cpu` runs the same flow on CPU artifacts (prepare.py --target llvm): no CUDA graph, no CUPTI.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

GOAL_MODELS = ("resnet18", "bert-tiny", "mobilenetv2")
UNTUNED_BUSY_GOAL = 1.5  # untuned GPU busy time <= 1.5x PyTorch eager's kernels
TUNED_EAGER_GOAL = 1.0  # tuned end-to-end <= 1.0x PyTorch eager
TUNED_GRAPH_GOAL = 1.2  # tuned end-to-end <= 1.2x eager + CUDA graph
STEPS = ("build", "restore", "reference", "tvmsched", "twin", "eager", "cuda_graph", "profile_tvmsched",
         "profile_eager", "compile")
TOLERANCE = 1e-4  # max |out - onnxruntime| <= TOLERANCE * max(1, max |onnxruntime|)
FP16_GOAL_MODELS = ("resnet50", "bert-base")  # fp16 at batch 8: <= 1.5x PyTorch fp16 eager's kernels, >= 2x own fp32
FP16_EAGER_GOAL, FP16_OWN_GOAL = 1.5, 2.0


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if "error:" in text.lower() or not text:
        return (text or type(err).__name__)[:200]
    return f"{type(err).__name__}: {text}"[:200]


def stem_of(entry: dict) -> str:
    return entry["model"] if entry.get("variant", "default") == "default" else f"{entry['model']}.{entry['variant']}"


def row_key(entry: dict) -> tuple[str, str, int]:
    """What a row's PyTorch columns depend on: its model, precision and batch size (variants sharing them share them)."""
    return entry["model"], entry.get("precision", "fp32"), int(entry.get("batch", 1))


# ------------------------------------------------------------------------------------------------------
# worker: one model in one process


def percentiles(seconds: list[float]) -> dict:
    import numpy as np

    ms = np.asarray(seconds, dtype=float) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "runs": int(ms.size)}


def time_calls(fn, sync, repeat: int, warmup: int) -> list[float]:
    """Seconds per call of `fn` followed by `sync` (host clock), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def enqueue_times(fn, sync, repeat: int) -> list[float]:
    """Host seconds `fn` takes to issue one run (the GPU is idle before each; it finishes after)."""
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    sync()
    return times


def max_error(outputs: dict, reference: dict) -> tuple[float, float]:
    """(max |out - ref| over every output, max |ref|)."""
    import numpy as np

    missing = sorted(set(reference) - set(outputs))
    if missing:
        raise RuntimeError(f"outputs missing: {', '.join(missing)}")
    err = max(float(np.max(np.abs(np.asarray(outputs[k], dtype=np.float64) - v))) if v.size else 0.0
              for k, v in reference.items())
    scale = max(float(np.max(np.abs(v))) if v.size else 0.0 for v in reference.values())
    return err, scale


def numpy_of(tensor):
    """A torch output as a float32 (or integer) numpy array."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.is_floating_point() else tensor).numpy()


def error_record(outputs: dict, reference: dict, precision: str = "fp32") -> dict:
    """fp16 rows against `tvmsched run --check`'s fp16 bound (tvmsched.lower.precision), others against TOLERANCE."""
    from tvmsched.lower.precision import FP16_TOLERANCE

    err, scale = max_error(outputs, reference)
    tol = (FP16_TOLERANCE if precision == "fp16" else TOLERANCE) * max(1.0, scale)
    return {"max_abs_err": err, "ref_max_abs": scale, "tol": tol, "ok": bool(err <= tol)}


def profile_kernels(fn, sync, runs: int, trace: Path) -> dict:
    """Kernels per run, their GPU time per run and the busiest kernels, from CUPTI via torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
            sync()
    prof.export_chrome_trace(str(trace))
    data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]
    copies = [e for e in events if str(e.get("cat", "")).lower() in ("gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    trace.unlink(missing_ok=True)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(str(e.get("name", "?")), []).append(float(e.get("dur", 0.0)))
    top = sorted(((name, len(d) / runs, sum(d) / runs) for name, d in by_name.items()), key=lambda t: -t[2])
    if not kernels:
        raise RuntimeError("CUPTI recorded no kernel (torch.profiler's trace has no 'kernel' events)")
    return {
        "runs": runs, "kernels_per_run": len(kernels) / runs, "busy_us_per_run": sum(float(e.get("dur", 0)) for e in kernels) / runs,
        "copies_per_run": len(copies) / runs, "copy_us_per_run": sum(float(e.get("dur", 0)) for e in copies) / runs,
        "distinct_kernels": len(by_name),
        "top": [{"name": n, "calls_per_run": c, "us_per_run": u} for n, c, u in top[:15]],
    }


def environment(device: str) -> dict:
    import importlib.util

    import numpy
    import onnx
    import torch
    import tvm_ffi

    import tvmsched

    env = {"python": platform.python_version(), "numpy": numpy.__version__, "onnx": onnx.__version__,
           "torch": torch.__version__, "tvm_ffi": getattr(tvm_ffi, "__version__", "?"), "tvmsched": tvmsched.__version__,
           "tvmsched_path": str(Path(tvmsched.__file__).parent), "host": platform.node()}
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        env["onnxruntime"] = "missing"
    spec = importlib.util.find_spec("tvm")
    if spec is not None and spec.submodule_search_locations:
        tvm_dir = Path(list(spec.submodule_search_locations)[0])
        found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", (tvm_dir / "_version.py").read_text()) \
            if (tvm_dir / "_version.py").exists() else None
        env["tvm"] = found.group(1) if found else "?"
        env["tvm_path"] = str(tvm_dir)
        env["tvm_compiler_library_present"] = (tvm_dir / "lib" / "libtvm_compiler.so").exists()
    env["tvm_use_runtime_lib"] = os.environ.get("TVM_USE_RUNTIME_LIB", "")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   gpu_memory_mib=props.total_memory >> 20, torch_cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), cudnn_benchmark=torch.backends.cudnn.benchmark)
        smi = shutil.which("nvidia-smi")
        if smi:
            done = subprocess.run([smi, "--query-gpu=driver_version,clocks.max.sm,persistence_mode", "--format=csv,noheader"],
                                  capture_output=True, text=True)
            parts = [p.strip() for p in done.stdout.strip().splitlines()[0].split(",")] if done.stdout.strip() else []
            if len(parts) >= 3:
                env.update(driver=parts[0], max_sm_clock=parts[1], persistence=parts[2])
    else:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
        env.update(cpu=cpu, cores=os.cpu_count(), torch_threads=torch.get_num_threads())
    return env


def loaded_libraries() -> list[str]:
    try:
        return sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                       if ".so" in line and "tvm" in line.split()[-1]})
    except OSError:
        return []


class Worker:
    """One artifact's measurements, saved to `result` after every step."""

    def __init__(self, entry: dict, args):
        self.entry, self.args = entry, args
        self.device = args.device
        self.result = Path(args.result)
        self.precision, self.batch = entry.get("precision", "fp32"), int(entry.get("batch", 1))
        self.r = {"model": entry["model"], "variant": entry.get("variant", "default"), "file": entry["file"],
                  "precision": self.precision, "batch": self.batch, "device": self.device, "stage": args.worker}
        self.save()

    def save(self) -> None:
        tmp = self.result.with_name(self.result.name + ".tmp")
        tmp.write_text(json.dumps(self.r, indent=1))
        tmp.replace(self.result)

    @contextlib.contextmanager
    def step(self, key: str):
        record: dict = {}
        self.r[key] = record  # partial results are saved as the step goes (a kill keeps them)
        started = time.perf_counter()
        print(f"[{stem_of(self.entry)}] {key} ...", flush=True)
        try:
            yield record
        except Exception as err:  # noqa: BLE001 - every step's failure is a cell, not a crash
            traceback.print_exc()
            record.clear()
            record["failed"] = one_line(err)
        record["seconds"] = round(time.perf_counter() - started, 3)
        self.r[key] = record
        self.save()

    def skip(self, key: str, why: str) -> None:
        self.r[key] = {"skipped": why}
        self.save()

    # the pieces every stage needs

    def setup_torch(self):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        torch.set_grad_enabled(False)
        self.torch = torch
        self.sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

    def build(self):
        import numpy as np

        from tvmsched import models

        name, seed = self.entry["model"], int(self.entry.get("seed", 0))
        self.shapes = {k: tuple(v) for k, v in self.entry.get("input_shapes", {}).items()} or None
        with self.step("build") as rec:
            self.built = self.model = models.build(name, seed)  # `built`: as compiled, the weights the slim file takes
            if self.batch > 1:  # the model for `batch` rows, as `tvmsched compile --batch-sizes` rewrites it
                from tvmsched.frontend.batching import rebatch

                batched = rebatch(self.model, self.batch, self.shapes)
                self.model = batched.model
                self.shapes = batched.input_shapes if self.shapes else None
            if name in models.REAL_MODELS:  # each row its own seed
                rows = [models.real_inputs(name, seed=1 + i) for i in range(self.batch)]
                self.feeds = {k: np.concatenate([row[k] for row in rows]) for k in rows[0]}
            else:
                self.feeds = models.random_inputs(self.model, seed=1)
            rec.update(nodes=len(self.model.graph.node), inputs={k: list(v.shape) for k, v in self.feeds.items()})
        if "failed" in self.r["build"]:
            self.model = None

    def reference(self) -> dict | None:
        with self.step("reference") as rec:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3
            session = onnxruntime.InferenceSession(self.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            self.ref = dict(zip(names, session.run(names, self.feeds)))
            rec.update(onnxruntime=onnxruntime.__version__, outputs={k: list(v.shape) for k, v in self.ref.items()})
        return None if "failed" in self.r["reference"] else self.ref

    def twin(self):
        with self.step("twin") as rec:
            from twins import build_twin

            torch = self.torch
            twin = build_twin(self.model, self.shapes).eval().to(self.device)
            self.inputs = [torch.from_numpy(self.feeds[n]).to(self.device) for n in twin.input_names]
            if self.precision == "fp16":  # weights and float inputs in half, as a PyTorch user serves fp16
                twin = twin.half()
                self.inputs = [x.half() if x.is_floating_point() else x for x in self.inputs]
            started = time.perf_counter()
            outputs = twin(*self.inputs)
            self.sync()
            rec["first_run_s"] = time.perf_counter() - started
            self.twin_outputs = dict(zip(twin.output_names, [numpy_of(o) for o in outputs]))
            rec.update(error_record(self.twin_outputs, self.ref, self.precision), steps=len(twin._steps))
            self.twin_module = twin
        return None if "failed" in self.r["twin"] else self.twin_module

    # stage "base": restore, check and time the artifact; PyTorch eager and CUDA graph; CUPTI for both

    def run_base(self) -> None:
        a = self.args
        try:
            self.r["env"] = environment(self.device)
        except Exception as err:  # noqa: BLE001 - the versions are reported, not needed
            self.r["env"] = {"failed": one_line(err)}
        self.save()
        self.setup_torch()
        self.build()
        if self.model is None:
            return
        path = Path(a.work) / f"{stem_of(self.entry)}.tvms"
        with self.step("restore") as rec:
            from slim import unpack

            rec.update(unpack(Path(a.artifacts) / self.entry["file"], path, self.built))
        restored = "failed" not in self.r["restore"]
        if self.reference() is None:
            return
        executor = None
        if restored:
            with self.step("tvmsched") as rec:
                from tvmsched.runtime import Executor

                executor = Executor(path, self.device)
                rec.update(layers=executor.num_layers, device_code=executor.manifest.device_code)
                rec.update(error_record(executor.run(self.feeds), self.ref, self.precision))
                rec.update(percentiles(executor.time_runs(self.feeds, a.repeat, a.warmup)))
                if self.device == "cuda":
                    executor.set_inputs(self.feeds)
                    enqueue = enqueue_times(executor.run_layers, executor.synchronize, a.profile_runs)
                    rec["enqueue_us_p50"] = percentiles(enqueue)["p50_ms"] * 1e3
            if "failed" in self.r["tvmsched"]:
                executor = None
        else:
            self.skip("tvmsched", "the artifact was not restored")
        pytorch = a.pytorch
        twin = self.twin() if pytorch else None
        if not pytorch:
            self.skip("eager", "PyTorch ran with this model's other artifact")
        elif twin is None:
            for key in ("eager", "cuda_graph", "profile_eager"):
                self.skip(key, f"no PyTorch twin ({self.r['twin'].get('failed', '?')})")
        else:
            with self.step("eager") as rec:
                rec.update(percentiles(time_calls(lambda: twin(*self.inputs), self.sync, a.repeat, a.warmup)))
                if self.device == "cuda":
                    enqueue = enqueue_times(lambda: twin(*self.inputs), self.sync, a.profile_runs)
                    rec["enqueue_us_p50"] = percentiles(enqueue)["p50_ms"] * 1e3
            if self.device == "cuda":
                self.cuda_graph(twin)
            else:
                self.skip("cuda_graph", "no CUDA graphs on the CPU")
        if self.device != "cuda":
            self.skip("profile_tvmsched", "CUPTI needs a GPU")
            self.skip("profile_eager", "CUPTI needs a GPU")
            self.r["libraries"] = loaded_libraries()
            self.save()
            return
        trace = Path(a.work) / f"{stem_of(self.entry)}.trace.json"
        if executor is not None:
            with self.step("profile_tvmsched") as rec:
                executor.set_inputs(self.feeds)
                rec.update(profile_kernels(executor.run_layers, executor.synchronize, a.profile_runs, trace))
        if pytorch and twin is not None:
            with self.step("profile_eager") as rec:
                rec.update(profile_kernels(lambda: twin(*self.inputs), self.sync, a.profile_runs, trace))
        self.r["libraries"] = loaded_libraries()
        self.save()

    def cuda_graph(self, twin) -> None:
        a, torch = self.args, self.torch
        with self.step("cuda_graph") as rec:
            static = [x.clone() for x in self.inputs]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    twin(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = twin(*static)
            graph.replay()
            self.sync()
            rec.update(error_record(dict(zip(twin.output_names, [numpy_of(o) for o in captured])), self.ref, self.precision))
            rec.update(percentiles(time_calls(graph.replay, self.sync, a.repeat, a.warmup)))

    # stage "compile": torch.compile of the twin

    def run_compile(self) -> None:
        a = self.args
        self.setup_torch()
        self.build()
        if self.model is None or self.reference() is None:
            return
        twin = self.twin()
        if twin is None:
            return
        with self.step("compile") as rec:
            torch = self.torch
            rec["backend"] = a.compile_backend
            compiled = torch.compile(twin, backend=a.compile_backend)
            started = time.perf_counter()
            outputs = compiled(*self.inputs)
            self.sync()
            rec["compile_s"] = time.perf_counter() - started
            rec.update(error_record(dict(zip(twin.output_names, [numpy_of(o) for o in outputs])), self.ref, self.precision))
            self.save()
            rec.update(percentiles(time_calls(lambda: compiled(*self.inputs), self.sync, a.repeat, a.warmup)))


def worker_main(args) -> int:
    entry = json.loads(args.entry)
    worker = Worker(entry, args)
    if args.worker == "base":
        worker.run_base()
    else:
        worker.run_compile()
    return 0


# ------------------------------------------------------------------------------------------------------
# driver


def run_worker(stage: str, entry: dict, args, timeout: float, pytorch: bool = True) -> dict:
    work = Path(args.work)
    result = work / f"{stem_of(entry)}.{stage}.json"
    log = work / f"{stem_of(entry)}.{stage}.log"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--worker", stage, "--entry", json.dumps(entry),
           "--result", str(result), "--device", args.device, "--artifacts", str(args.artifacts), "--work", str(work),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--profile-runs", str(args.profile_runs),
           "--compile-backend", args.compile_backend]
    if not pytorch:
        cmd.append("--no-pytorch")
    env = dict(os.environ)
    env.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    env.setdefault("TVMSCHED_MODEL_CACHE", str(work / "models"))  # real models built once, for both passes
    started = time.perf_counter()
    killed = False
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (compile workers)
    seconds = time.perf_counter() - started
    try:
        data = json.loads(result.read_text())
    except (OSError, json.JSONDecodeError):
        data = {"model": entry["model"], "variant": entry.get("variant", "default"),
                "precision": entry.get("precision", "fp32"), "batch": int(entry.get("batch", 1))}
    tail = log.read_text(errors="replace").strip().splitlines()[-12:] if log.exists() else []
    for key, rec in data.items():  # a step the worker did not finish (killed, or the process died in it)
        if key in STEPS and isinstance(rec, dict) and not {"seconds", "failed", "skipped"} & set(rec):
            why = "killed at the time budget" if killed else f"the worker died (exit {proc.returncode})"
            data[key] = {"failed": f"{why} during this step", "partial": rec}
    data["worker"] = {"rc": proc.returncode, "seconds": round(seconds, 1), "killed": killed, "timeout_s": round(timeout, 1)}
    if proc.returncode != 0:
        data["worker"]["log_tail"] = tail
        print(f"  {stem_of(entry)} {stage}: exit {proc.returncode}{' (killed at the time budget)' if killed else ''}; log:",
              *("    " + line for line in tail), sep="\n", flush=True)
    return data


def merge(base: dict, extra: dict, stage_keys: tuple[str, ...]) -> None:
    for key in stage_keys:
        if key in extra:
            base[key] = extra[key]


def drive(args) -> int:
    started = time.time()
    deadline = started + args.budget_s
    artifacts = Path(args.artifacts)
    try:
        suite = json.loads((artifacts / "suite.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"error: cannot read {artifacts / 'suite.json'} ({err}): run bench/gpu/prepare.sh first", file=sys.stderr)
        return 2
    args.device = args.device or suite.get("device", "cuda")
    entries = [e for e in suite["artifacts"] if not args.models or e["model"] in args.models]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"suite: {len(entries)} artifacts on {args.device}, budget {args.budget_s:.0f} s", flush=True)
    results, seen_models = [], set()
    for i, entry in enumerate(entries):
        left = deadline - time.time()
        later = len(entries) - i - 1
        timeout = min(args.model_cap_s, left - args.reserve_s * later - 5)
        pytorch = row_key(entry) not in seen_models
        seen_models.add(row_key(entry))
        if timeout < min(10.0, args.model_cap_s):
            results.append({"model": entry["model"], "variant": entry.get("variant", "default"), "file": entry["file"],
                            "precision": entry.get("precision", "fp32"), "batch": int(entry.get("batch", 1)),
                            "worker": {"skipped": "time budget spent"}})
            print(f"  {stem_of(entry)}: skipped (time budget)", flush=True)
            continue
        data = run_worker("base", entry, args, timeout, pytorch)
        data["pytorch_here"] = pytorch
        results.append(data)
        print(f"  {stem_of(entry)}: {summary_line(data)} [{data['worker']['seconds']} s]", flush=True)
    for data, entry in zip(results, entries):
        if not data.get("pytorch_here"):
            continue
        left = deadline - time.time()
        if args.compile_backend == "none":
            data["compile"] = {"skipped": "--compile-backend none"}
            continue
        if "failed" in data.get("twin", {"failed": "-"}) or "twin" not in data:
            data["compile"] = {"skipped": "no PyTorch twin"}
            continue
        if left < args.min_compile_s:
            data["compile"] = {"skipped": f"time budget ({left:.0f} s left)"}
            continue
        extra = run_worker("compile", entry, args, left - 5)
        compile_rec = extra.get("compile")
        if compile_rec is None:
            why = "killed at the time budget" if extra["worker"].get("killed") else f"worker exit {extra['worker']['rc']}"
            compile_rec = {"failed": f"{why} after {extra['worker']['seconds']:.0f} s"}
        elif "partial" in compile_rec and "compile_s" in compile_rec["partial"]:
            compile_rec["failed"] += f" (compiled in {compile_rec['partial']['compile_s']:.0f} s, then killed while timing)"
        data["compile"] = compile_rec
        data["compile_worker"] = extra["worker"]
        print(f"  {stem_of(entry)}: torch.compile {cell_latency(compile_rec)} [{extra['worker']['seconds']} s]", flush=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "budget_s": args.budget_s, "elapsed_s": round(time.time() - started, 1), "device": args.device,
        "suite": {k: v for k, v in suite.items() if k != "artifacts"}, "entries": entries,
        "carried_bytes": sum(p.stat().st_size for p in artifacts.iterdir() if p.is_file()),
        "repeat": args.repeat, "warmup": args.warmup, "profile_runs": args.profile_runs,
        "compile_backend": args.compile_backend,
    }
    report = render(results, meta)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    raw = Path(args.json) if args.json else out.parent / "raw" / f"{out.stem}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.copy_to:
        dest = Path(args.copy_to)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, dest / out.name)
        shutil.copy(raw, dest / raw.name)
    print(report)
    print(f"wrote {out} and {raw}{' (copied to ' + str(args.copy_to) + ')' if args.copy_to else ''} "
          f"in {time.time() - started:.0f} s", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------------
# the report


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _state(rec: dict | None) -> str | None:
    """The cell for a step that did not produce numbers, or None when it did."""
    if rec is None:
        return "—"
    if "failed" in rec:
        return f"failed: {_esc(rec['failed'])}"
    if "skipped" in rec:
        return f"skipped: {_esc(rec['skipped'])}"
    return None


def cell_latency(rec: dict | None) -> str:
    state = _state(rec)
    if state is not None:
        return state
    if "p50_ms" not in rec:
        return "—"
    return f"{rec['p50_ms']:.3f} / {rec['p99_ms']:.3f}"


def cell_error(rec: dict | None) -> str:
    state = _state(rec)
    if state is not None:
        return state
    if "max_abs_err" not in rec:
        return "—"
    return f"{rec['max_abs_err']:.1e}{'' if rec['ok'] else ' (over ' + format(rec['tol'], '.0e') + ')'}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "—"
    return f"{a / b:.2f}×"


def p50(rec: dict | None) -> float | None:
    return rec.get("p50_ms") if isinstance(rec, dict) else None


def summary_line(data: dict) -> str:
    parts = []
    for key in ("restore", "tvmsched", "twin", "eager", "cuda_graph", "profile_tvmsched", "profile_eager"):
        rec = data.get(key)
        if rec is None:
            continue
        state = _state(rec)
        if state is not None and not state.startswith("skipped"):
            parts.append(f"{key} {state}")
        elif key in ("tvmsched", "eager", "cuda_graph") and state is None:
            parts.append(f"{key} {rec.get('p50_ms', float('nan')):.3f} ms")
        elif key.startswith("profile") and state is None:
            parts.append(f"{key} {rec['kernels_per_run']:.0f} kernels {rec['busy_us_per_run']:.0f} us")
    if "worker" in data and data["worker"].get("skipped"):
        parts.append(f"skipped: {data['worker']['skipped']}")
    return "; ".join(parts) or "nothing recorded"


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:.2f}"


def busy_us(rec: dict | None) -> float | None:
    return rec["busy_us_per_run"] if _state(rec) is None and rec.get("busy_us_per_run") else None


def fp16_goal_lines(results: list[dict], pytorch_of: dict) -> list[str]:
    """Goal rows of the fp16 rows at batch 8 (resnet50, bert-base): GPU busy ≤ 1.5× PyTorch fp16 eager's kernels and
    ≤ 1/2 of tvmsched's own fp32 row at that batch size."""
    lines = []
    for r in results:
        if r["model"] not in FP16_GOAL_MODELS or row_key(r)[1:] != ("fp16", 8):
            continue
        busy = busy_us(r.get("profile_tvmsched"))
        eager = busy_us(pytorch_of.get(row_key(r), {}).get("profile_eager"))
        own = next((busy_us(o.get("profile_tvmsched")) for o in results if row_key(o) == (r["model"], "fp32", 8)), None)
        for label, value, goal, met in (
                ("fp16 GPU busy ÷ PyTorch fp16 eager's kernels", busy / eager if busy and eager else None, f"≤ {FP16_EAGER_GOAL}×",
                 lambda v: v <= FP16_EAGER_GOAL),
                ("tvmsched fp32 GPU busy ÷ its fp16 (batch 8)", own / busy if busy and own else None, f"≥ {FP16_OWN_GOAL}×",
                 lambda v: v >= FP16_OWN_GOAL)):
            measured = "not measured" if value is None else f"{value:.2f}×"
            lines.append(f"| {label} | {r['model']} | {r.get('variant')} | {measured} | {goal} | "
                         f"{'—' if value is None else ('yes' if met(value) else 'no')} |")
    return lines


def render(results: list[dict], meta: dict) -> str:
    """The markdown report: every number of every engine side by side."""
    env = next((r["env"] for r in results if "env" in r), {})
    suite = meta.get("suite", {})
    pytorch_of = {row_key(r): r for r in results if r.get("pytorch_here")}
    gpu = meta["device"] == "cuda"
    lines = [f"# GPU suite: tvmsched against PyTorch ({meta['date']})", ""]
    if gpu:
        lines.append(f"- GPU: {env.get('gpu', '?')} (compute capability {env.get('capability', '?')}, {env.get('sms', '?')} SMs, "
                     f"{env.get('gpu_memory_mib', '?')} MiB), driver {env.get('driver', '?')}, max SM clock {env.get('max_sm_clock', '?')}, "
                     f"persistence {env.get('persistence', '?')}")
        lines.append(f"- CUDA (torch) {env.get('torch_cuda', '?')}, cuDNN {env.get('cudnn', '?')} (benchmark mode "
                     f"{env.get('cudnn_benchmark', '?')}), TF32 off, float32 matmul precision \"highest\"")
    else:
        lines.append(f"- CPU mode: {env.get('cpu', '?')}, {env.get('cores', '?')} cores, torch threads {env.get('torch_threads', '?')}")
    lines.append(f"- Python {env.get('python', '?')}, torch {env.get('torch', '?')}, onnxruntime {env.get('onnxruntime', '?')} (CPU), "
                 f"onnx {env.get('onnx', '?')}, numpy {env.get('numpy', '?')}, TVM runtime {env.get('tvm', '?')} "
                 f"(compiler library {'present' if env.get('tvm_compiler_library_present') else 'absent'}; "
                 f"TVM_USE_RUNTIME_LIB={env.get('tvm_use_runtime_lib') or 'unset'}), tvm-ffi {env.get('tvm_ffi', '?')}, "
                 f"tvmsched {env.get('tvmsched', '?')}")
    commit = suite.get("commit")
    lines.append(f"- Artifacts compiled {suite.get('created', '?')} from commit {commit[:12] if commit else '?'}"
                 f"{' (with uncommitted changes)' if suite.get('dirty') else ''}, target {suite.get('target', '?')}; "
                 f"suite ran {meta['elapsed_s']:.0f} s of its {meta['budget_s']:.0f} s budget")
    lines.append(f"- Timing: p50 / p99 of {meta['repeat']} runs after {meta['warmup']} warm-ups, at each row's batch size and "
                 f"precision (variant fp16 / b8: fp16 / 8 rows, PyTorch's twin likewise; otherwise batch as built, float32); "
                 f"tvmsched: the engine's `time_runs` (all layers launched, device synchronised); PyTorch: the twin's "
                 + (f"forward (or the CUDA graph's replay) then `torch.cuda.synchronize()`, host clock. CUPTI over "
                    f"{meta['profile_runs']} runs per engine." if gpu else "forward, host clock."))
    lines += ["", "## Carried", "",
              "| file | model | variant | artifact MB | carried MB | weights regenerated there MB | restore s |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        entry = next((e for e in meta.get("entries", []) if e["file"] == r.get("file")), {})
        restore = r.get("restore", {})
        lines.append(f"| {r.get('file', '?')} | {r['model']} | {r.get('variant', 'default')} | {_mb(entry.get('artifact_bytes'))} | "
                     f"{_mb(entry.get('carried_bytes'))} | {_mb(entry.get('regenerated_bytes'))} | "
                     f"{restore.get('seconds', '—') if 'failed' not in restore else 'failed: ' + _esc(restore['failed'])} |")
    kit = suite.get("kit", {})
    lines += ["", f"Kit ({kit.get('path', '.devkit')}): {_mb(kit.get('bytes'))} MB; carried artifacts folder: "
                  f"{_mb(meta.get('carried_bytes'))} MB; together {_mb((kit.get('bytes') or 0) + (meta.get('carried_bytes') or 0))} MB "
                  f"of the 67.11 MB (64 MiB) one call may carry."]

    lines += ["", "## Correctness (max |output − onnxruntime| in float32; ok when ≤ 1e-4 · max(1, max |onnxruntime|), "
                  "fp16 rows ≤ 2e-2 · max(1, max |onnxruntime|))", "",
              "| model | variant | tvmsched | PyTorch twin | eager + CUDA graph | torch.compile | tvmsched ok |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        p = pytorch_of.get(row_key(r), {})
        ok = r.get("tvmsched", {}).get("ok")
        lines.append(f"| {r['model']} | {r.get('variant', 'default')} | {cell_error(r.get('tvmsched'))} | {cell_error(p.get('twin'))} | "
                     f"{cell_error(p.get('cuda_graph'))} | {cell_error(p.get('compile'))} | "
                     f"{'yes' if ok else ('no' if ok is False else '—')} |")

    lines += ["", "## Latency (ms, p50 / p99)", "",
              "| model | variant | layers | tvmsched | PyTorch eager | eager + CUDA graph | torch.compile | torch.compile s "
              "| tvmsched ÷ eager | tvmsched ÷ CUDA graph | tvmsched ÷ torch.compile |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = pytorch_of.get(row_key(r), {})
        t = r.get("tvmsched")
        comp = p.get("compile")
        lines.append(f"| {r['model']} | {r.get('variant', 'default')} | {(t or {}).get('layers', '—')} | {cell_latency(t)} | "
                     f"{cell_latency(p.get('eager'))} | {cell_latency(p.get('cuda_graph'))} | {cell_latency(comp)} | "
                     f"{format(comp['compile_s'], '.1f') if isinstance(comp, dict) and 'compile_s' in comp else '—'} | "
                     f"{ratio(p50(t), p50(p.get('eager')))} | {ratio(p50(t), p50(p.get('cuda_graph')))} | {ratio(p50(t), p50(comp))} |")

    lines += ["", "## GPU kernels (CUPTI) and host cost per launch", "",
              "| model | variant | kernels / run: tvmsched | PyTorch eager | GPU busy µs / run: tvmsched | PyTorch eager "
              "| busy ratio | tvmsched host µs / run (p50 − busy) | host µs / launch | issue µs / launch: tvmsched | PyTorch eager |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = pytorch_of.get(row_key(r), {})
        pt, pe = r.get("profile_tvmsched"), p.get("profile_eager")
        t, e = r.get("tvmsched") or {}, p.get("eager") or {}
        cells = []
        for rec, key, fmt in ((pt, "kernels_per_run", ".0f"), (pe, "kernels_per_run", ".0f"), (pt, "busy_us_per_run", ".0f"),
                              (pe, "busy_us_per_run", ".0f")):
            state = _state(rec)
            cells.append(state if state is not None else format(rec[key], fmt))
        busy_t = pt.get("busy_us_per_run") if _state(pt) is None else None
        busy_e = pe.get("busy_us_per_run") if _state(pe) is None else None
        cells.append(ratio(busy_t, busy_e))
        host = (t["p50_ms"] * 1e3 - busy_t) if busy_t is not None and "p50_ms" in t else None
        launches_t = pt.get("kernels_per_run") if busy_t is not None else None
        launches_e = pe.get("kernels_per_run") if busy_e is not None else None
        cells.append(f"{host:.0f}" if host is not None else "—")
        cells.append(f"{host / launches_t:.2f}" if host is not None and launches_t else "—")
        cells.append(f"{t['enqueue_us_p50'] / launches_t:.2f}" if "enqueue_us_p50" in t and launches_t else "—")
        cells.append(f"{e['enqueue_us_p50'] / launches_e:.2f}" if "enqueue_us_p50" in e and launches_e else "—")
        lines.append(f"| {r['model']} | {r.get('variant', 'default')} | " + " | ".join(cells) + " |")

    lines += ["", "## Goals", "", "| goal | model | variant | measured | target | met |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.get("variant", "default") != "default" or r["model"] not in GOAL_MODELS:
            continue
        p = pytorch_of.get(row_key(r), {})
        pt, pe = r.get("profile_tvmsched"), p.get("profile_eager")
        if _state(pt) is None and _state(pe) is None and pe["busy_us_per_run"] > 0:
            value = pt["busy_us_per_run"] / pe["busy_us_per_run"]
            lines.append(f"| untuned GPU busy ÷ PyTorch eager's kernels | {r['model']} | default | {value:.2f}× | ≤ {UNTUNED_BUSY_GOAL}× | "
                         f"{'yes' if value <= UNTUNED_BUSY_GOAL else 'no'} |")
        else:
            lines.append(f"| untuned GPU busy ÷ PyTorch eager's kernels | {r['model']} | default | not measured | ≤ {UNTUNED_BUSY_GOAL}× | — |")
    lines += fp16_goal_lines(results, pytorch_of)
    tuned = [r for r in results if r.get("variant", "default") == "tuned"]
    for r in tuned:
        p = pytorch_of.get(row_key(r), {})
        t = p50(r.get("tvmsched"))
        for label, base, goal in (("tuned end-to-end ÷ PyTorch eager", p50(p.get("eager")), TUNED_EAGER_GOAL),
                                  ("tuned end-to-end ÷ eager + CUDA graph", p50(p.get("cuda_graph")), TUNED_GRAPH_GOAL)):
            if t is not None and base:
                lines.append(f"| {label} | {r['model']} | {r['variant']} | {t / base:.2f}× | ≤ {goal}× | {'yes' if t / base <= goal else 'no'} |")
            else:
                lines.append(f"| {label} | {r['model']} | {r['variant']} | not measured | ≤ {goal}× | — |")
    if not tuned:
        lines.append(f"| tuned ≤ {TUNED_EAGER_GOAL}× PyTorch eager, ≤ {TUNED_GRAPH_GOAL}× eager + CUDA graph | — | — | "
                     "no tuned artifact carried (prepare.py --db / --tuned) | — | — |")

    if gpu:
        lines += ["", "## Per-kernel GPU time (CUPTI; the busiest kernels of each engine, µs per run)", ""]
        for r in results:
            p = pytorch_of.get(row_key(r), {})
            pt, pe = r.get("profile_tvmsched"), p.get("profile_eager") if r.get("pytorch_here") else None
            if _state(pt) is not None and _state(pe) is not None:
                continue
            tops_t = pt.get("top", []) if _state(pt) is None else []
            tops_e = pe.get("top", []) if _state(pe) is None else []
            lines += [f"**{r['model']}** ({r.get('variant', 'default')})", "",
                      "| # | tvmsched kernel | calls | µs | PyTorch eager kernel | calls | µs |", "|---|---|---|---|---|---|---|"]
            for i in range(min(10, max(len(tops_t), len(tops_e)))):
                a = tops_t[i] if i < len(tops_t) else None
                b = tops_e[i] if i < len(tops_e) else None
                lines.append(f"| {i + 1} | " + (f"`{_esc(a['name'][:70])}` | {a['calls_per_run']:.0f} | {a['us_per_run']:.1f}" if a else " | | ")
                             + " | " + (f"`{_esc(b['name'][:70])}` | {b['calls_per_run']:.0f} | {b['us_per_run']:.1f}" if b else " | | ") + " |")
            lines.append("")

    notes = []
    for r in results:
        w = r.get("worker", {})
        if w.get("skipped"):
            notes.append(f"- {stem_of(r)}: skipped ({w['skipped']})")
        elif w.get("rc") not in (0, None):
            notes.append(f"- {stem_of(r)}: worker exit {w['rc']}{' (killed at the time budget)' if w.get('killed') else ''}"
                         + (f"; last line: `{_esc(w['log_tail'][-1][:160])}`" if w.get("log_tail") else ""))
    lines += ["", "## Reading", "",
              "- tvmsched rows are per carried artifact; PyTorch columns are per model (a twin built from the same ONNX "
              "weights: bench/gpu/twins.py), repeated on a model's tuned row.",
              "- GPU busy: the sum of kernel durations CUPTI recorded per run (copies and memsets excluded); host µs / run: "
              "tvmsched's p50 minus its GPU busy time (what the GPU spends waiting for the engine per run); host µs / launch: "
              "that divided by its kernels per run; issue µs / launch: the host time one run takes to return from issuing "
              "all its launches (p50, GPU idle at the start), divided by kernels per run, for both engines.",
              "- Goals: untuned GPU busy ≤ 1.5× PyTorch eager's kernels (resnet18, bert-tiny, mobilenetv2); tuned ≤ 1.0× "
              "PyTorch eager's end-to-end p50 and ≤ 1.2× eager + CUDA graph's; fp16 at batch 8 (resnet50, bert-base) ≤ 1.5× "
              "PyTorch fp16 eager's kernels and ≥ 2× faster on the GPU than tvmsched's own fp32 row at batch 8.",
              "- PyTorch columns are per model, precision and batch size: an fp16 or batch-8 row has its own twin run."]
    if notes:
        lines += ["", "## Failures", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", default=str(ROOT / ".gpu"), help="the carried folder (suite.json, *.slim)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: the device suite.json was prepared for")
    parser.add_argument("--models", nargs="+", help="only these models")
    parser.add_argument("--budget-s", type=float, default=400.0, help="the whole run's time budget (seconds)")
    parser.add_argument("--model-cap-s", type=float, default=150.0, help="the most one model's first pass may take")
    parser.add_argument("--reserve-s", type=float, default=20.0, help="first-pass time kept for each later model")
    parser.add_argument("--min-compile-s", type=float, default=30.0, help="start a torch.compile pass only with this much left")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile-runs", type=int, default=20)
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend; 'none' skips torch.compile")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.md"))
    parser.add_argument("--json", help="raw results (default: OUT's folder/raw/OUT-stem.json)")
    parser.add_argument("--copy-to", help="also copy the report and raw results here (the device tool's $OUT)")
    parser.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpu-suite-{os.getuid()}"),
                        help="restored artifacts, worker results and logs")
    parser.add_argument("--worker", choices=["base", "compile"], help=argparse.SUPPRESS)
    parser.add_argument("--entry", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--no-pytorch", dest="pytorch", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
