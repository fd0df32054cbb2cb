"""GET /metrics for `tvmsched serve`: Triton's metric names, NVML GPU gauges, and tvmsched's own.

Read at scrape time from the service's counters and the runtime (one collector, its own registry):
- per model and version (Triton's, written by the engine for both servers: tvmsched/serving.h): nv_inference_request_success,
  nv_inference_request_failure, nv_inference_count, nv_inference_exec_count, nv_inference_request_duration_us,
  nv_inference_queue_duration_us, nv_inference_compute_input/infer/output_duration_us (counters; durations cumulative
  µs) and the gauge nv_inference_pending_request_count (admitted, not answered yet).
- per GPU, when NVML finds one (absent otherwise; an NVML failure is silent): nv_gpu_utilization (0-1),
  nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes, nv_gpu_power_usage (watts).
- tvmsched's: per model tvmsched_preemptions_total (times its stream was preempted by real-time work),
  tvmsched_qos_violations_total (answered slower than its qos_ms, submit to finish in the engine),
  tvmsched_launches_total, tvmsched_reruns_total (launches run again after a preemption),
  tvmsched_model_resident (1: on the device now, 0: switched out or streamed); per switching stage
  tvmsched_switch_stages_total{stage} (stage1, stage2, exec, clean, evict, stream: docs/switching.md);
  per tiered model and tier tvmsched_tier_bytes{model,tier} (bytes of its weights placed there) and
  tvmsched_streamed_bytes_total{model} (bytes streamed from the tiers so far).
"""

from __future__ import annotations

import collections
import logging

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tvmsched.runtime import native
from tvmsched.serve.service import InferenceService

log = logging.getLogger(__name__)


def exposition(service: InferenceService, gpus: GpuCollector | None = None) -> bytes:
    """The /metrics text: Triton's families written as Triton writes them (counters without a _total suffix; the
    engine's, as the C++ server writes them), then tvmsched's own through prometheus_client."""
    lines = []
    for name, kind, text, samples in gpus.families() if gpus else ():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{','.join(f'{k}={_quote(v)}' for k, v in labels.items())}}} {float(value)!r}"
                  for labels, value in samples]
    own = CollectorRegistry()
    own.register(OwnCollector(service))
    triton = native.func("served_triton_metrics")([served.book for served in list(service.models.values())])
    return str(triton).encode() + ("\n".join(lines) + "\n" if lines else "").encode() + generate_latest(own)


def _quote(value) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'


class OwnCollector:
    """tvmsched's metrics (module docstring), read from the runtime at scrape time."""

    def __init__(self, service: InferenceService):
        self.service = service

    def collect(self):
        own = lambda name, text: CounterMetricFamily(name, text, labels=["model"])
        preemptions = own("tvmsched_preemptions", "Times the model's stream was preempted by real-time work")
        violations = own("tvmsched_qos_violations", "Requests slower than the model's QoS target")
        launches = own("tvmsched_launches", "Kernel launches of the model (re-runs included)")
        reruns = own("tvmsched_reruns", "Launches run again after a preemption")
        resident = GaugeMetricFamily("tvmsched_model_resident", "1: the model is on the device now", labels=["model"])
        tier_bytes = GaugeMetricFamily("tvmsched_tier_bytes", "Bytes of a tiered model's weights placed on each tier",
                                       labels=["model", "tier"])
        streamed = own("tvmsched_streamed_bytes", "Bytes a tiered model streamed from its tiers")
        runtime = self.service.runtime
        for name, served in list(self.service.models.items()):
            counts = collections.Counter()  # over the model's streams (Runtime.load(streams=))
            for task in served.model.tasks:
                counts.update(task.counts())
            preemptions.add_metric([name], counts["preemptions"])
            violations.add_metric([name], served.book.qos_violations())
            launches.add_metric([name], counts["launches"])
            reruns.add_metric([name], counts["reruns"])
            resident.add_metric([name], int(served.model.resident))
            if served.model.tiered:
                for tier in runtime.tiering(served.model)["tiers"]:
                    tier_bytes.add_metric([name, tier["kind"]], tier["used_bytes"])
                streamed.add_metric([name], sum(e.bytes for e in runtime.tier_events() if e.model == name))
        stages = CounterMetricFamily("tvmsched_switch_stages", "Switching stages run (docs/switching.md)", labels=["stage"])
        for stage, count in sorted(collections.Counter(e.stage for e in runtime.switch_events()).items()):
            stages.add_metric([stage], count)
        yield from (preemptions, violations, launches, reruns, resident, tier_bytes, streamed, stages)


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
