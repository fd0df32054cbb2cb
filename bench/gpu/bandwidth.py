"""Pinned host <-> device copy bandwidth on the GPU machine, both directions (issue 30: tiering's copy floor).

    python3 -P bench/gpu/bandwidth.py [--mib 8 64 256] [--out FILE.json]
PyTorch (CUDA) copies between a page-locked host tensor and a device tensor on one stream, timed by CUDA events:
the median of 10 copies per size after 3 warm-ups. The engine's tier copies use the same path (cuMemcpy*Async from
pinned memory; bench/tiering.py's copy floor measures them through the engine itself).
"""

from __future__ import annotations

import argparse
import json
import statistics


def measure(mib: int, repeat: int = 10) -> dict:
    import torch

    n = mib * 2**20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    row = {"mib": mib}
    for name, copy in (("h2d", lambda: device.copy_(host, non_blocking=True)),
                       ("d2h", lambda: host.copy_(device, non_blocking=True))):
        times = []
        for i in range(repeat + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end) / 1e3)
        row[f"{name}_gbs"] = n / statistics.median(times) / 1e9
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = [measure(m) for m in args.mib]
    for row in rows:
        print(f"{row['mib']:5d} MiB pinned: host->device {row['h2d_gbs']:6.1f} GB/s, device->host {row['d2h_gbs']:6.1f} GB/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
