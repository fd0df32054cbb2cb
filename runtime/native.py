"""The native engine (runtime/native, C++ on tvm-ffi): where it is built, and loading it into Python.

    python -m tvmsched.runtime.native --cmakedir      # for a C++ build: find_package(tvmsched) -> tvmsched::engine
    python -m tvmsched.runtime.native --includedir | --libdir | --lib

Python reaches the engine's objects (tvmsched.Model, tvmsched.Stream, tvmsched.Request) and functions
(tvmsched.engine.*) through tvm-ffi's own registration; `engine()` loads the library once.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import functools
import importlib.resources
import importlib.util
import os
import threading
from pathlib import Path

import tvm_ffi

from tvmsched.errors import TvmschedError

LIB_NAME = "libtvmsched_engine.so"
_lock = threading.Lock()
_loaded = False


def package_path(*parts: str) -> Path:
    """A file or folder of the installed package that the build put there (lib/, include/, cmake/: CMake's install
    step, pyproject.toml [tool.scikit-build]), found through the package's resources: the one package folder of a
    wheel or an unzipped wheel (the GPU kit), or in an editable install the folder that holds it among the source
    folder and site-packages (importlib.resources gives a multiplexed path there)."""
    node = importlib.resources.files("tvmsched")
    for part in parts:
        node = node / part  # a multiplexed path picks the folder where the child exists
    if isinstance(node, Path):
        return node
    # still several folders (editable: a source folder of the same name): the first, the one the build installed to
    folders = [Path(p) for p in getattr(node, "_paths", ())]
    return folders[0] if folders else Path(str(node))


def library_path() -> Path:
    """The engine library: $TVMSCHED_ENGINE_LIB, else the package's lib/ (installed there by the build)."""
    env = os.environ.get("TVMSCHED_ENGINE_LIB")
    return Path(env) if env else package_path("lib", LIB_NAME)


def tvm_libdir() -> str:
    """TVM's runtime libraries (libtvm_runtime.so, which the kernel libraries call into)."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or spec.origin is None:
        raise TvmschedError("TVM is not installed (pip install apache-tvm)")
    return str(Path(spec.origin).parent / "lib")


class NativeModel(tvm_ffi.Object):
    """A loaded artifact (C++ ModelObj): methods as registered in runtime/native/src/registry.cc."""


class NativeStream(tvm_ffi.Object):
    """One tenant's request stream (C++ StreamObj)."""


class NativeRequest(tvm_ffi.Object):
    """One queued request (C++ RequestObj)."""


tvm_ffi.register_error("TvmschedError", TvmschedError)


def _register_types() -> None:
    """Bind the engine's object types to the classes above (after the library registered them)."""
    for key, cls in (("tvmsched.Model", NativeModel), ("tvmsched.Stream", NativeStream), ("tvmsched.Request", NativeRequest)):
        tvm_ffi.register_object(key)(cls)


def engine():
    """Load the engine library once; returns the `tvm_ffi` module for calling its global functions."""
    global _loaded
    with _lock:
        if not _loaded:
            path = library_path()
            if not path.is_file():
                raise TvmschedError(f"the native engine is not built ({path} missing): run `make setup` (or pip install .)")
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            tvm_ffi.get_global_func("tvmsched.engine.set_tvm_libdir")(tvm_libdir())
            _register_types()
            # completion callbacks (Python ones) run on the engine's callback thread: it ends before the interpreter
            atexit.register(tvm_ffi.get_global_func("tvmsched.engine.stop_deferred_callbacks"), 10.0)
            _loaded = True
    return tvm_ffi


@functools.cache  # looked up once: some are called per request
def func(name: str):
    """A global function of the engine (`tvmsched.engine.<name>`)."""
    engine()
    return tvm_ffi.get_global_func(f"tvmsched.engine.{name}")


# ---- the engine's functions, typed (runtime/native/src/registry.cc) ----------------------------------------------
# Python reaches every engine function through these (tests and benchmarks may use `func` directly). Objects
# (NativeModel, NativeStream, NativeRequest, switchers, memory scopes) carry their own methods.

def now_us() -> float:
    """The engine's monotonic clock in µs (the clock of every timestamp it records)."""
    return float(func("now_us")())


def device_info(kind: str) -> dict:
    """A device's name, total_units, granularity and abilities: launches_async, host_memory (opening it: a missing
    CUDA driver is one error line; "cpu" is the mode TVMSCHED_CPU_LAUNCHES names, sync or async)."""
    return dict(func("device_info")(kind))


def place_sm_windows(groups: int, needs: list[int], prefix: bool = False) -> list[int]:
    """The CUDA device's SM placement (sm_windows.h) on `groups` SM groups, run without a GPU: each n > 0 in `needs`
    takes a window of n groups (its first group is returned), each -i gives back the i-th window taken."""
    return [int(v) for v in func("place_sm_windows")(groups, list(needs), prefix)]


def cpu_pool() -> dict:
    """The engine's CPU pool (cpu_pool.cc): whether it runs the kernels' parallel loops, its threads and counters."""
    return dict(func("cpu_pool")())


def device_memory(kind: str) -> dict[str, int]:
    """The device's accounting of what every model of the process allocated: in_use, peak, budget (0: none)."""
    return {str(k): int(v) for k, v in func("device_memory")(kind).items()}


def set_memory_budget(kind: str, nbytes: int) -> None:
    func("set_memory_budget")(kind, int(nbytes))


def device_faults(kind: str) -> dict:
    """The device's fault state machine (docs/faults.md): health, generation, faults, recoveries, ..."""
    return {str(k): (str(v) if isinstance(v, str) else v) for k, v in func("device_faults")(kind).items()}


def create_preemption_group():
    """The engine's preemption group (tvmsched/preemption.h): member streams stopped while held requests run, and
    resumed when the last is done, by the engine (no Python on the request's path or its completion)."""
    return func("create_preemption_group")()


def create_policy(kind: str, total_units: int, profile: list[tuple[str, str, float]] = ()):
    """A scheduling policy of the engine (tvmsched/policy.h): "colocation", "fastest", "partition" or "fcfs";
    `profile`: the colocation table's measured pairs (first key, second key, interference per unit time), in order."""
    profile = list(profile)
    return func("create_policy")(kind, int(total_units), [r[0] for r in profile], [r[1] for r in profile],
                                 [float(r[2]) for r in profile])


def policy_add_model(policy, name: str, layers, qos_ms: float | None) -> None:
    """Tell an engine policy of a model: `layers[i][c]`, candidate c of layer i (units, latency_us, key)."""
    func("policy_add_model")(policy, name, [[int(c.units) for c in cands] for cands in layers],
                             [[float(c.latency_us) for c in cands] for cands in layers],
                             [[c.key for c in cands] for cands in layers],
                             -1.0 if qos_ms is None else float(qos_ms))


def policy_decide(policy, model: str, stream: str, loaded_models: int, views) -> dict:
    """One decision of an engine policy for a request of `model` to `stream`, the monitor being `views`
    (StreamViews, the request's own stream included)."""
    ids, estimated_ms, meets, streams, estimated, seconds = func("policy_decide")(
        policy, model, stream, int(loaded_models),
        [[v.name, [int(c.units) for c in v.remaining], [float(c.latency_us) for c in v.remaining],
          [c.key for c in v.remaining]] for v in views])
    return {"candidate_ids": [int(i) for i in ids], "estimated_ms": float(estimated_ms), "meets_qos": bool(meets),
            "streams": int(streams), "estimated": bool(estimated), "seconds": float(seconds)}


def create_runtime(options: dict):
    """The engine's multi-tenant Runtime (tvmsched/runtime.h): `options` as tvmsched.engine.create_runtime reads them
    (device, memory_budget, policy, total_units, colocation rows, max_in_flight, idle_spin_us, progress_interval_ms,
    stall_timeout_s, trusted_keys, max_groups, threshold1, threshold2, preset_count, retain, tiers,
    tier_buffer_bytes; an unknown key is one error line)."""
    return func("create_runtime")(dict(options))


def create_memory_scope(budget: int):
    """A budget that the models loaded into it count against (a Runtime's; 0: none, still counted)."""
    return func("create_memory_scope")(int(budget))


def memory_scope_stats(scope) -> dict[str, int]:
    return {str(k): int(v) for k, v in func("memory_scope_stats")(scope).items()}


def load_model(path: str, device: str, flag_memory: str, trusted_key_files: list, scope=None,
               batch_size: int | None = None) -> NativeModel:
    """A resident model (weights in device memory); an artifact compiled at several batch sizes at `batch_size`
    (None: its largest)."""
    return func("load_model")(path, device, flag_memory, trusted_key_files, scope, int(batch_size or 0))


def register_model(path: str, device: str, flag_memory: str, trusted_key_files: list, max_groups: int,
                   scope=None) -> NativeModel:
    """A model registered for switching (weights in pinned host memory, sub-tasks prepared on demand)."""
    return func("register_model")(path, device, flag_memory, trusted_key_files, int(max_groups), scope)


def measure_model(path: str, device: str, max_groups: int, batch: int = 0) -> int:
    """The bytes a model holds resident as registered with `max_groups` sub-tasks (its environment and every
    sub-task), read and laid out only: no weights held, no kernels loaded."""
    return int(func("measure_model")(path, device, int(max_groups), int(batch)))


def load_tiered(path: str, device: str, flag_memory: str, trusted_key_files: list, device_bytes: int,
                buffer_bytes: int, tiers, in_flight: int = 8, scope=None) -> NativeModel:
    """A model streamed from the memory tiers: `device_bytes` of device memory, `tiers` its shares (runtime/tiering.py);
    its activations planned for `in_flight` launches in flight where launches are asynchronous."""
    return func("load_tiered")(path, device, flag_memory, trusted_key_files, int(device_bytes), int(buffer_bytes), tiers,
                               int(in_flight), scope)


def tiering_info(model: NativeModel) -> dict:
    return dict(func("tiering_info")(model))


def tiering_events(model: NativeModel):
    return func("tiering_events")(model)


def flag_memory(model: NativeModel) -> str:
    """Where the model's preempt flag is: "host_mapped" (on CPU, host memory), "device" or "none" (model.h)."""
    return str(func("flag_memory")(model))


def flag_memory_wanted(model: NativeModel) -> str:
    """Where the model asks its device to put the preempt flag: "auto", "host_mapped" or "device" (model.h)."""
    return str(func("flag_memory_wanted")(model))


def release_tiers(model: NativeModel) -> None:
    func("release_tiers")(model)


def tier_copy_floor(model: NativeModel, repeat: int):
    return func("tier_copy_floor")(model, int(repeat))


def copy_floor(model: NativeModel, repeat: int) -> float:
    """Seconds to copy a registered model's weights into device memory allocated beforehand (the fastest copy)."""
    return float(func("copy_floor")(model, int(repeat)))


def create_switcher(device: str, budget: int, threshold1: int, threshold2: int, preset_count: int, retain: bool,
                    scope=None):
    return func("create_switcher")(device, int(budget), int(threshold1), int(threshold2), int(preset_count),
                                   bool(retain), scope)


STREAM_PRIORITIES = {"low": -1, "normal": 0, "high": 1}  # the engine's StreamPriority


def create_stream(model: NativeModel, name: str, max_in_flight: int, idle_spin_us: float, progress_interval_ms: float,
                  stall_timeout_s: float, priority: str = "normal") -> NativeStream:
    """A stream over `model`; `priority` ("low", "normal", "high") of the device streams its kernels launch on."""
    return func("create_stream")(model, name, int(max_in_flight), float(idle_spin_us), float(progress_interval_ms),
                                 float(stall_timeout_s), STREAM_PRIORITIES[priority])


def verify_artifact(path: str, trusted_key_files: list) -> dict:
    """Everything loading checks (the signature first), without loading the kernels: manifest_json, signer."""
    return dict(func("verify_artifact")(str(path), [str(k) for k in trusted_key_files]))


def check_cpu_features(cpu: str, features: list, what: str) -> None:
    """One error line when this CPU lacks features the artifact's kernels were compiled for."""
    func("check_cpu_features")(cpu, list(features), what)


def plan_activation_storage(layers: list, nbytes: dict, keep: list, reuse_distance: int):
    """The engine's activation storage plan (tests/memory_plan.py)."""
    return func("plan_memory")(layers, nbytes, keep, int(reuse_distance))


def time_kernel():
    """The engine's kernel timer (kind, kernel, args, units, repeat, min_batch_us) -> seconds per run."""
    return func("time_kernel")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tvmsched.runtime.native", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmakedir", action="store_true", help="folder of tvmsched-config.cmake")
    group.add_argument("--includedir", action="store_true", help="folder of the public headers (tvmsched/engine.h)")
    group.add_argument("--libdir", action="store_true", help="folder of libtvmsched_engine.so")
    group.add_argument("--lib", action="store_true", help="the engine library itself")
    args = parser.parse_args()
    if args.cmakedir:
        print(package_path("cmake"))
    elif args.includedir:
        print(package_path("include"))
    elif args.libdir:
        print(library_path().parent)
    else:
        print(library_path())


if __name__ == "__main__":
    main()
