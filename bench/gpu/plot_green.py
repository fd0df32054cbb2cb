"""Plot and tabulate the H100 green-context curves (bench/gpu/green_contexts.py output) into bench/results.

    python bench/gpu/plot_green.py bench/results/raw/green_contexts_resnet18_h100.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def main(raw: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(raw.read_text())
    fig, seen = plt.figure(figsize=(9, 5.5)), set()
    for name, layer in data["curves"].items():
        func = name.split(":", 1)[1]
        if func in seen:
            continue
        seen.add(func)
        sms = sorted(int(k) for k in layer["latency_us"])
        plt.plot(sms, [layer["latency_us"][str(k)] for k in sms], marker="o", linewidth=1, label=f"{func} ({layer['blocks']} blocks)")
    plt.xscale("log", base=2)
    plt.yscale("log")
    plt.xlabel("SMs (green context)")
    plt.ylabel("layer latency (us, log)")
    plt.title(f"ResNet-18 layers on H100 (dlight default schedules) vs SMs; device granularity {data['granularity']} SMs")
    plt.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(RESULTS / "resnet18-h100-sms.png", dpi=110)
    rows = ["| layer | blocks | " + " | ".join(f"{k} SMs" for k in sorted(int(k) for k in next(iter(data["curves"].values()))["latency_us"])) + " |"]
    rows.append("|---|---|" + "---|" * (len(rows[0].split("|")) - 4))
    for name, layer in data["curves"].items():
        sms = sorted(int(k) for k in layer["latency_us"])
        rows.append(f"| {name} | {layer['blocks']} | " + " | ".join(f"{layer['latency_us'][str(k)]:.1f}" for k in sms) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
