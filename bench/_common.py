"""Helpers shared by the CPU benchmarks (compile_bench.py, speed.py): each engine timed in a fresh child
process, compiling in a child, the machine's description, raw JSON written atomically.

bench/ is not a package: scripts put their own folder on sys.path and `import _common`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# One engine in a fresh process: argv = engine, path, repeat, threads[, inputs.npz[, max_seconds]].
# Both engines read the inputs file when it exists (the same inputs); where it does not, tvmsched draws seeded
# inputs (the executor's random_inputs, seed 0) and saves them there, and onnxruntime draws its own from the model.
# max_seconds > 0 caps the timed runs at about that many seconds (at least 3 runs) for slow models.
CHILD = r"""
import json, os, sys, time
import numpy as np
engine, path, repeat, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
inputs_path = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] else None
max_seconds = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
def rss_mb():  # VmHWM: peak RSS of this process image (ru_maxrss would include the parent's, kept across exec)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
def runs(one_run_s):
    return repeat if max_seconds <= 0 else max(3, min(repeat, int(max_seconds / max(one_run_s, 1e-9))))
if engine == "tvmsched":
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import tvm, tvmsched.runtime
    base = rss_mb()
    ex = tvmsched.runtime.load(path)
    if inputs_path and os.path.exists(inputs_path):
        with np.load(inputs_path) as saved:
            inputs = {name: saved[name] for name in saved.files}
    else:
        inputs = ex.random_inputs(seed=0)
        if inputs_path:
            np.savez(inputs_path, **inputs)
    start = time.perf_counter(); ex.run(inputs); first = time.perf_counter() - start
    times = ex.time_runs(inputs, runs(first), warmup=3 if first < 1 else 1)
else:
    from tvmsched import models
    from tvmsched.cli.compare import onnxruntime_session, time_onnxruntime
    import onnx
    base = rss_mb()
    sess = onnxruntime_session(path, threads)
    if inputs_path and os.path.exists(inputs_path):
        with np.load(inputs_path) as saved:
            inputs = {i.name: saved[i.name] for i in sess.get_inputs()}
    else:
        inputs = models.random_inputs(onnx.load(path, load_external_data=False), seed=0)
    (first,) = time_onnxruntime(sess, inputs, 1, warmup=0, name=path)
    times = time_onnxruntime(sess, inputs, runs(first), warmup=2 if first < 1 else 0, name=path)
from tvmsched.cli.compare import latency_summary
summary = latency_summary(times)
print(json.dumps({"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "runs": summary["runs"],
                  "peak_rss_mb": rss_mb(), "model_rss_mb": rss_mb() - base}))
"""

# Build (if missing) and compile one model in a fresh process: argv = json of {"name", "registry": "zoo"|"real",
# "onnx", "artifact", "target", "seed", "inputs"}. A zoo model is written to "onnx"; a real one (tvmsched.models.real)
# is built into that registry's cache and compiled from there with its static input shapes, and its seeded feeds
# (ids in range, attention masks) are saved to "inputs" for both engines. The first compile_file of a process also
# initialises TVM: a warm-up compile of the zoo's "tiny" runs first, untimed. Prints the compile's numbers.
COMPILE_CHILD = r"""
import json, os, sys, time
import numpy as np
spec = json.loads(sys.argv[1])
from tvmsched import models
from tvmsched.pipeline import compile_file, compile_model
shapes = None
if spec["registry"] == "real":
    onnx_path = str(models.real_model_path(spec["name"], spec["seed"]))
    shapes = dict(models.REAL_MODELS[spec["name"]].input_shapes)
    if spec.get("inputs"):
        np.savez(spec["inputs"], **models.real_inputs(spec["name"], spec["seed"]))
else:
    onnx_path = spec["onnx"]
    if not os.path.exists(onnx_path):
        models.save(spec["name"], onnx_path, seed=spec["seed"])
compile_model(models.build("tiny"), target=spec["target"], name="warmup")
start = time.perf_counter()
artifact = compile_file(onnx_path, target=spec["target"], input_shapes=shapes)
compile_s = time.perf_counter() - start
artifact.save(spec["artifact"])
m = artifact.manifest
result = {"compile_s": compile_s, "layers": len(m.layers), "device": m.device, "cpu": m.cpu,
          "artifact_mb": os.path.getsize(spec["artifact"]) / 1e6}
result.update(onnx=onnx_path, onnx_mb=os.path.getsize(onnx_path) / 1e6, input_shapes=shapes)
print(json.dumps(result))
"""


class ChildFailed(RuntimeError):
    """A child process exited non-zero (or ran out of time): its last stderr lines are the message."""


def run_child(argv: list[str], env: dict | None = None, timeout: float | None = None, cwd: str | None = None) -> dict:
    try:
        out = subprocess.run([sys.executable, "-c", *argv], capture_output=True, text=True, env=env, timeout=timeout,
                             cwd=cwd)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"timed out after {timeout:.0f} s") from None
    if out.returncode != 0:
        last = [line for line in out.stderr.strip().splitlines() if line.strip()][-1:] or ["(no stderr)"]
        raise ChildFailed(f"exit {out.returncode}: {last[0][-600:]}")  # the exception's own line
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_env(threads: int) -> dict:
    return {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


def measure_engine(engine: str, path: Path, repeat: int, threads: int, inputs_path: Path | None = None,
                   max_seconds: float = 0.0, timeout: float | None = None) -> dict:
    """p50/p99 ms, runs and peak RSS of `engine` ("tvmsched" on an artifact, "onnxruntime" on an ONNX file)
    in a fresh child process with `threads` threads."""
    argv = [CHILD, engine, str(path), str(repeat), str(threads), str(inputs_path or ""), str(max_seconds)]
    return run_child(argv, engine_env(threads), timeout)


def compile_in_child(name: str, registry: str, onnx_path: Path, artifact_path: Path, target: str = "llvm",
                     seed: int = 0, threads: int | None = None, timeout: float | None = None,
                     inputs_path: Path | None = None) -> dict:
    """Build `name` from its registry if missing, compile it (default schedules) into `artifact_path` in a fresh
    process; compile seconds (compile_file only), layers, sizes, and "onnx": the ONNX file it compiled (a real
    model's is in that registry's cache, not `onnx_path`)."""
    spec = {"name": name, "registry": registry, "onnx": str(onnx_path), "artifact": str(artifact_path),
            "target": target, "seed": seed, "inputs": str(inputs_path or "")}
    return run_child([COMPILE_CHILD, json.dumps(spec)], engine_env(threads) if threads else None, timeout)


X86_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def machine_info() -> dict:
    """CPU model, cores, the vector flags that matter for kernels, LLVM's name of the host CPU, versions, date."""
    info = {"machine": platform.machine(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    cpu_model, flags = platform.processor() or "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not cpu_model:
                cpu_model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    info["cpu_model"] = cpu_model
    info["flags"] = [f for f in X86_FLAGS if f in flags]
    from importlib import metadata

    for key, package in (("tvm", "apache-tvm"), ("onnxruntime", "onnxruntime"), ("onnx", "onnx"), ("torch", "torch")):
        try:
            info[key] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[key] = None
    try:
        import tvm

        info["llvm_cpu"] = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    except Exception:  # noqa: BLE001
        info["llvm_cpu"] = None
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).parent).stdout
        info["git"] = git("rev-parse", "--short", "HEAD").strip() or None
        if info["git"] and git("status", "--porcelain", "--untracked-files=no").strip():
            info["git"] += " + uncommitted changes"
    except OSError:
        info["git"] = None
    return info


def machine_line(info: dict) -> str:
    """One markdown line describing `machine_info()`."""
    flags = ", ".join(info["flags"]) or "none of the AVX family"
    llvm = f" (LLVM: {info['llvm_cpu']})" if info.get("llvm_cpu") else ""
    return (f"Machine: {info['cpu_model'] or info['machine']}{llvm}, {info['cores']} cores, flags {flags}; "
            f"{info['platform']}. Versions: python {info['python']}, tvm {info['tvm']}, onnxruntime {info['onnxruntime']}"
            f"{', torch ' + info['torch'] if info.get('torch') else ''}; tvmsched at {info.get('git') or '?'}. "
            f"Date {info['date']}.")


def write_json_atomic(path: Path, data) -> None:
    """Write JSON through a temporary file and a rename: an interrupted run never leaves a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
