"""GET /metrics for `tvmsched serve`: Triton's metric names, NVML GPU gauges, and tvmsched's own.

Read at scrape time; the model families are written by the engine for both servers (tvmsched/serving.h, the C++ server
writes the same):
- per model and version (Triton's): nv_inference_request_success, nv_inference_request_failure, nv_inference_count,
  nv_inference_exec_count, nv_inference_request_duration_us, nv_inference_queue_duration_us,
  nv_inference_compute_input/infer/output_duration_us (counters; durations cumulative µs) and the gauge
  nv_inference_pending_request_count (admitted, not answered yet).
- per GPU, when NVML finds one (absent otherwise; an NVML failure is silent): nv_gpu_utilization (0-1),
  nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes, nv_gpu_power_usage (watts). Python's own (pynvml).
- tvmsched's: per model tvmsched_requests_total, tvmsched_errors_total (refusals included),
  tvmsched_qos_violations_total (answered slower than its qos_ms, submit to finish in the engine),
  tvmsched_preemptions_total (times its streams were preempted by real-time work), tvmsched_launches_total,
  tvmsched_reruns_total (launches run again after a preemption), tvmsched_model_resident (1: on the device now, 0:
  switched out or streamed), the histogram tvmsched_request_latency_seconds; per switching stage
  tvmsched_switch_stages_total{stage} (stage1, stage2, exec, clean, evict: docs/switching.md); per tiered model and
  tier tvmsched_tier_bytes{model,tier} (bytes of its weights placed there) and tvmsched_streamed_bytes_total{model}
  (bytes streamed from the tiers so far); per device tvmsched_busy_streams.
"""

from __future__ import annotations

import logging

from tvmsched.runtime import native
from tvmsched.serve.service import InferenceService

log = logging.getLogger(__name__)


def exposition(service: InferenceService, gpus: GpuCollector | None = None) -> bytes:
    """The /metrics text: Triton's families and tvmsched's, written by the engine (as the C++ server writes them;
    counters as Triton writes them, without a _total suffix), and the GPUs' as NVML reads them."""
    lines = []
    for name, kind, text, samples in gpus.families() if gpus else ():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{','.join(f'{k}={_quote(v)}' for k, v in labels.items())}}} {float(value)!r}"
                  for labels, value in samples]
    books = [served.book for served in list(service.models.values())]
    triton, own = native.func("served_triton_metrics")(books), native.func("served_tvmsched_metrics")(books)
    return str(triton).encode() + ("\n".join(lines) + "\n" if lines else "").encode() + str(own).encode()


def _quote(value) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'


class GpuCollector:
    """NVML's view of every GPU; no handles (and no metrics) where NVML cannot start."""

    def __init__(self):
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no driver, no GPU, no library: no GPU metrics
            log.debug("NVML unavailable: no GPU metrics")

    def families(self):
        """(name, kind, help, [(labels, value)]) of every GPU gauge; nothing without NVML."""
        if not self.handles:
            return []
        nvml = self.nvml
        rows = {"util": [], "total": [], "used": [], "power": []}
        for handle in self.handles:
            try:
                uuid = nvml.nvmlDeviceGetUUID(handle)
                labels = {"gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid}
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                rows["util"].append((labels, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100))
                rows["total"].append((labels, memory.total))
                rows["used"].append((labels, memory.used))
                rows["power"].append((labels, nvml.nvmlDeviceGetPowerUsage(handle) / 1e3))
            except Exception:  # a GPU that stops answering drops out of this scrape
                continue
        return [("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", rows["util"]),
                ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", rows["total"]),
                ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", rows["used"]),
                ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", rows["power"])]
