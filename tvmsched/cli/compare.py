"""tvmsched and onnxruntime latency side by side: the same inputs, the same thread count.

onnxruntime runs on CPU with `intra_op_num_threads` = the runtime's threads, one inter-op thread and
sequential execution, the configuration that matches the engine running one layer after another.
Used by `tvmsched run --check M.onnx --repeat N` and by bench/speed.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from tvmsched.errors import TvmschedError, one_line


def latency_summary(seconds: Sequence[float]) -> dict:
    """p50/p99/mean/min/max in milliseconds of per-run times given in seconds."""
    ms = np.asarray(seconds, dtype=float) * 1e3
    if ms.size == 0:
        raise ValueError("no runs to summarise")
    return {"runs": int(ms.size), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "max_ms": float(ms.max())}


def runtime_threads(device: str = "cpu") -> int:
    """The compute units the engine runs a layer on: CPU threads (TVM_NUM_THREADS, else all cores)."""
    from tvmsched.runtime import native

    return int(native.device_info(device)["total_units"])


def onnxruntime_session(model: str | bytes, threads: int):
    """A CPU session of `model` (a path, or the serialized model) with `threads` intra-op threads, one inter-op
    thread, sequential execution."""
    try:
        import onnxruntime
    except ImportError:
        raise TvmschedError("comparing with onnxruntime needs onnxruntime (pip install onnxruntime)") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    try:
        return onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                            providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001  (onnxruntime raises its own types)
        raise TvmschedError(f"onnxruntime cannot load {'the model' if isinstance(model, bytes) else model}: "
                            f"{one_line(err)}") from None


def time_onnxruntime(session, inputs: dict[str, np.ndarray], repeat: int, warmup: int = 2,
                     name: str = "the model") -> list[float]:
    """Seconds per `session.run` of an `onnxruntime_session` on `inputs` (after `warmup` untimed runs); `name`
    names the model in an error."""
    feeds = {i.name: inputs[i.name] for i in session.get_inputs() if i.name in inputs}
    try:
        for _ in range(warmup):
            session.run(None, feeds)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001
        raise TvmschedError(f"onnxruntime cannot run {name}: {one_line(err)}") from None
    return times


def side_by_side(tvmsched_seconds: Sequence[float], onnxruntime_seconds: Sequence[float], threads: int) -> dict:
    """Both engines' latency summaries and the tvmsched/onnxruntime ratios of p50 and p99."""
    ours, theirs = latency_summary(tvmsched_seconds), latency_summary(onnxruntime_seconds)
    return {"threads": int(threads), "tvmsched": ours, "onnxruntime": theirs,
            "ratio_p50": ours["p50_ms"] / theirs["p50_ms"] if theirs["p50_ms"] > 0 else float("inf"),
            "ratio_p99": ours["p99_ms"] / theirs["p99_ms"] if theirs["p99_ms"] > 0 else float("inf")}


def format_table(comparison: dict) -> list[str]:
    """A short text table of `side_by_side`'s result."""
    ours, theirs = comparison["tvmsched"], comparison["onnxruntime"]
    threads = comparison["threads"]
    return [
        f"side by side over {ours['runs']} runs, same inputs, {threads} thread{'s' if threads != 1 else ''} each:",
        f"  {'':22s} {'p50 ms':>10s} {'p99 ms':>10s}",
        f"  {'tvmsched':22s} {ours['p50_ms']:10.3f} {ours['p99_ms']:10.3f}",
        f"  {'onnxruntime':22s} {theirs['p50_ms']:10.3f} {theirs['p99_ms']:10.3f}",
        f"  {'tvmsched/onnxruntime':22s} {comparison['ratio_p50']:9.2f}x {comparison['ratio_p99']:9.2f}x",
    ]


def compare_with_onnxruntime(executor, session, inputs: dict[str, np.ndarray], repeat: int, threads: int,
                             name: str = "the model") -> dict:
    """Time `executor` (anything with `time_runs(inputs, repeat)`, in seconds) and then onnxruntime (an
    `onnxruntime_session` made with `threads`, the engine's) on the same inputs; `side_by_side` of both."""
    ours = executor.time_runs(inputs, repeat)
    theirs = time_onnxruntime(session, inputs, repeat, name=name)
    return side_by_side(ours, theirs, threads)
