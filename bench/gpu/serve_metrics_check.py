"""On a GPU machine: tvmsched serve's NVML gauges (tvmsched/serve/metrics.py) as /metrics writes them.

    python3 bench/gpu/serve_metrics_check.py      # prints the nv_gpu_* lines; exit 1 if NVML shows no GPU

Needs only numpy, prometheus-client and nvidia-ml-py (the GPU image has them); no model is loaded: the service
has none, so only the GPU families and tvmsched's empty ones are written.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tvmsched.serve.metrics import GpuCollector, exposition  # noqa: E402
from tvmsched.serve.service import InferenceService  # noqa: E402


class NoModels:
    """A runtime with no model (the service reads its switch events only)."""

    def switch_events(self):
        return []


gpus = GpuCollector()
text = exposition(InferenceService(NoModels()), gpus).decode()
lines = [line for line in text.splitlines() if line.startswith("nv_gpu_")]
print("\n".join(lines) or "no nv_gpu_* lines")
sys.exit(0 if gpus.handles and len(lines) >= 4 else 1)
