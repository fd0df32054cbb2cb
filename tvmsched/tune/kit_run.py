"""Measure-there: time every sampled kernel of a measurement kit at each compute-unit count.

Runs with a runtime-only TVM (the GPU machine has no TVM compiler) and the engine's kernel timer.
CUDA: each unit count is a green context of that many SMs; the SM count and partition granularity
come from the device. CPU: each unit count is a TVM thread pool of that many threads. Kits are made by
`tvmsched tune kit` (tvmsched.tune.kit_build), results go back with `tvmsched tune import`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError, one_line

KIT_FILE = "kit.json"
KIT_VERSION = 1
MIN_BATCH_US = 2000.0  # each timed batch of launches lasts at least this long


def read_kit(kit_dir: str | Path) -> dict:
    """The kit's index, checked."""
    from tvmsched.tuning_db.json_limits import loads as bounded_loads

    path = Path(kit_dir) / KIT_FILE
    try:
        kit = bounded_loads(path.read_text())  # refuses JSON nested too deeply to parse
    except FileNotFoundError:
        raise TvmschedError(f"{kit_dir} is not a measurement kit (no {KIT_FILE})") from None
    except (OSError, ValueError) as err:
        raise TvmschedError(f"cannot read {path}: {one_line(err)}") from None
    if not isinstance(kit, dict) or kit.get("version") != KIT_VERSION or not isinstance(kit.get("funcs"), list):
        raise TvmschedError(f"{path} is not a version-{KIT_VERSION} measurement kit")
    return kit




def default_unit_counts(full: int, granularity: int) -> list[int]:
    """Multiples of the partition granularity below the full count, then the full count."""
    return [*range(granularity, full, granularity), full]


def measure_kit(kit_dir: str | Path, units: list[int] | str | None = None, *, repeat: int = 5, progress: bool = True) -> dict:
    """Median latency (us) of every sample of every function at each unit count.

    units: the unit counts (None: partition multiples on GPUs, 1..all on CPUs; "all": only all units, as a
    tuning round needs).
    Returns the results document `tvmsched tune import` reads: kit id, device facts, unit counts,
    and times_us[func][symbol][units] (None where a kernel failed).
    """
    import tvm
    from tqdm import tqdm

    from tvmsched.runtime.devices import tvm_device

    kit_dir = Path(kit_dir)
    kit = read_kit(kit_dir)
    dev = tvm_device(kit["device"])
    tvm.runtime.empty((1,), "float32", dev)  # creates the device's context before any driver call
    timer = _EngineTimer(kit["device"])
    full, granularity, kind = timer.device_units()  # queried from the device
    if units == "all":
        units = [full]
    grid_limited = kit.get("mechanism") == "grid_limit"
    if grid_limited:  # the kernels restrict themselves: only the counts they were built for
        units = sorted({*(units or kit["grid_limit_units"]), full})
        if missing := [k for k in units if k != full and str(k) not in kit["funcs"][0]["samples"][0]["grid_limited"]]:
            raise TvmschedError(f"the kit has no grid-limited kernels for {missing} SMs")
    counts = sorted(set(units or default_unit_counts(full, granularity)))
    if bad := [k for k in counts if not 1 <= k <= full]:
        raise TvmschedError(f"unit counts {bad} outside 1..{full} on this device")
    times: dict[str, dict[str, dict[str, float | None]]] = {}
    total = sum(len(entry["samples"]) for entry in kit["funcs"])
    with tqdm(total=total, desc="measuring", unit="kernel", disable=not progress, file=sys.stderr) as bar:
        for entry in kit["funcs"]:
            lib = load_library(kit, kit_dir, entry)
            args = [tvm.runtime.tensor(_random(shape, dtype), dev) for shape, dtype in entry["args"]]
            per_func = times.setdefault(entry["func"], {})
            for sample in entry["samples"]:
                if grid_limited:  # each count has its own kernel, timed on the whole device
                    symbols = {k: sample["symbol"] if k == full else sample["grid_limited"][str(k)] for k in counts}
                    per_func[sample["symbol"]] = {str(k): timer.median_us(lib, sym, args, full, repeat) for k, sym in symbols.items()}
                else:
                    per_func[sample["symbol"]] = {str(k): timer.median_us(lib, sample["symbol"], args, k, repeat) for k in counts}
                bar.update()
    return {
        "kit": kit["id"], "device": kit["device"], "device_name": timer.name, "unit_kind": kind,
        "full_units": full, "granularity": granularity, "units": counts,
        "mechanism": "grid_limit" if grid_limited else timer.mechanism,
        "times_us": times,
    }


def load_library(kit: dict, kit_dir: str | Path, entry: dict):
    """A kit layer's kernel library, loaded into this process.

    A CUDA library built without nvcc carries CUDA source that TVM compiles when it is loaded, through its
    `tvm_callback_cuda_compile`; TVM's own callback (tvm.support.nvcc) asks the compiler library for the
    current target (`Target.current`, which a runtime-only TVM lacks: "module 'tvm.target._ffi_api' has no
    attribute 'TargetCurrent'"), so the load compiles through `cuda_source_compiler` instead, for the kit's
    target architecture.
    """
    import tvm

    path = Path(kit_dir) / entry["library"]
    try:
        with cuda_source_compiler(kit.get("target", {}).get("arch") if kit.get("device") == "cuda" else None):
            return tvm.runtime.load_module(str(path))
    except TvmschedError:
        raise
    except Exception as err:  # noqa: BLE001  (a library that does not load is the kit's fault, stated in one line)
        raise TvmschedError(f"cannot load the kit's library {path}: {one_line(err)}") from None


@contextlib.contextmanager
def cuda_source_compiler(arch: str | None):
    """While the block runs, CUDA source that TVM loads is compiled by `compile_cuda_source(code, arch)` (nvcc
    on the PATH, no TVM compiler library needed) instead of TVM's callback. No-op without `arch`."""
    import tvm_ffi

    name = "tvm_callback_cuda_compile"
    if not arch:
        yield
        return
    previous = tvm_ffi.get_global_func(name, allow_missing=True)
    tvm_ffi.register_global_func(name, lambda code, *_: compile_cuda_source(code, arch), override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)


# what TVM's nvcc build passes besides the architecture (tvm.support.nvcc._compile_cuda_nvcc), so a kernel
# compiled where it is loaded is the kernel a build here would have embedded
NVCC_FLAGS = [
    "-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
]


def compile_cuda_source(code: str, arch: str) -> bytearray:
    """A fatbin of CUDA source for `arch` (e.g. "sm_90a"), by nvcc."""
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else None)
    if nvcc is None or not os.path.exists(nvcc):
        raise TvmschedError("the kit's CUDA kernels are source code (the kit was built without nvcc) and this machine "
                            "has no nvcc to compile them: rebuild the kit with `tvmsched tune kit` where nvcc is on the PATH")
    with tempfile.TemporaryDirectory(prefix="tvmsched-cuda-") as tmp:
        source, target = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.fatbin")
        Path(source).write_text(code)
        ptxas = f"--ptxas-options=--register-usage-level={os.environ.get('TVM_CUDA_PTXAS_REG_LEVEL', '10')}"
        done = subprocess.run([nvcc, "--fatbin", "-arch", arch, *NVCC_FLAGS, ptxas, "-o", target, source],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise TvmschedError(f"nvcc could not compile the kit's CUDA kernels for {arch}: {one_line(RuntimeError(done.stderr or done.stdout))}")
        return bytearray(Path(target).read_bytes())


class _EngineTimer:
    """The engine's kernel timer (runtime/native timer.h): batches of calls lasting >= MIN_BATCH_US on k
    units — a CPU thread whose pool has k threads, or a stream of a CUDA green context of about k SMs —
    timed on the host around a synchronisation of that stream (kernels shorter than a launch are
    launch-bound either way)."""

    def __init__(self, kind: str):
        from tvmsched.runtime import native

        self.kind, self._time = kind, native.time_kernel()
        info = native.device_info(kind)
        self.name, self._full, self._granularity = str(info["name"]), int(info["total_units"]), int(info["granularity"])
        self.mechanism = "green_context" if kind == "cuda" else "cpu_threads"

    def device_units(self) -> tuple[int, int, str]:
        """(all units, smallest partition, unit kind), queried from the device."""
        return self._full, self._granularity, "gpu_sm" if self.kind == "cuda" else "cpu_thread"

    def median_us(self, lib, symbol, args, k, repeat) -> float | None:
        try:
            timing = self._time(self.kind, lib[symbol], list(args), k, repeat, MIN_BATCH_US)
            return float(np.median(list(timing["us_per_call"])))
        except Exception:  # noqa: BLE001  (a failing sample is recorded as such)
            return None


def _random(shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    if np.issubdtype(np.dtype(dtype), np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def write_results(results: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(results, indent=1))
