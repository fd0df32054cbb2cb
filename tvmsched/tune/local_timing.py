"""Isolated latency of one layer kernel at a given number of compute units (CPU threads)."""

from __future__ import annotations

import threading

import numpy as np

from tvmsched.errors import TvmschedError


def measure_at_units(func, target, arg_specs, units_list: list[int], *, repeat: int = 5, min_repeat_ms: int = 20) -> dict[int, float]:
    """Median latency in microseconds of `func` run with k units, for each k in `units_list`.

    Args:
        func: a scheduled PrimFunc.
        target: its tvm Target (CPU only here; GPU measurement needs a device).
        arg_specs: (shape, dtype) of each argument, in the PrimFunc's parameter order.
    """
    import tvm

    from tvmsched.lower.targets import describe

    info = describe(target)
    if not info.cpu:
        raise TvmschedError(f"measuring {info.kind} kernels at restricted units needs that device here")
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(_random(rng, shape, dtype), dev) for shape, dtype in arg_specs]
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def run() -> float:
        timer(*args)  # warm-up
        return float(np.median(timer(*args).results)) * 1e6

    return {k: in_thread(run, k, name=f"measure-{k}u") for k in units_list}  # TVM thread pools are per Python thread


def measure_together(entries: list, target, units: int, *, repeat: int = 5, min_repeat_ms: int = 10,
                     cold: bool = False) -> list[float]:
    """Median latency in microseconds of each (scheduled PrimFunc, arg_specs) of `entries`, built as one module
    and timed at `units` in turns, one batch of each per round (a drifting machine slows all of them alike).

    `cold`: each round is one run after the CPU caches are flushed of every argument but the first (the
    input a previous layer just wrote), as a layer runs inside a model whose weights do not stay in cache;
    warm repeats of one layer keep its weights in L2 and favour schedules that need them there."""
    import tvm

    mod = tvm.IRModule({tvm.ir.GlobalVar(f"k{i}"): f.with_attr("global_symbol", f"k{i}") for i, (f, _) in enumerate(entries)})
    lib, dev, rng = tvm.compile(mod, target).mod, tvm.cpu(), np.random.default_rng(0)

    batch = {"min_repeat_ms": 0, "f_preproc": "cache_flush_cpu_non_first_arg"} if cold else {"min_repeat_ms": min_repeat_ms}

    def run() -> list[float]:
        timers = []
        for i, (_, specs) in enumerate(entries):
            args = [tvm.runtime.tensor(_random(rng, shape, dtype), dev) for shape, dtype in specs]
            timers.append((lib.time_evaluator(f"k{i}", dev, number=1, repeat=1, **batch), args))
        samples = [[] for _ in entries]
        for _ in range(repeat):
            for i, (timer, args) in enumerate(timers):
                samples[i].extend(timer(*args).results)
        return [float(np.median(s)) * 1e6 for s in samples]

    return in_thread(run, units, name="measure-together")


def in_thread(fn, units: int, name: str = "measure"):
    """fn() in a fresh thread whose TVM pool has `units` threads; its result, or its exception re-raised here."""
    from tvmsched.tune.cpu_units import set_cpu_units

    result: dict[str, object] = {}

    def run() -> None:
        try:
            set_cpu_units(units)
            result["value"] = fn()
        except Exception as err:  # re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _random(rng, shape, dtype) -> np.ndarray:
    if np.issubdtype(np.dtype(dtype), np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)
