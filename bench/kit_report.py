"""Report a measured kit: per layer, latency vs units of the full-unit best and of the best at each count.

    python bench/kit_report.py RESULTS.json --artifact QOS.tvms --plot bench/results/resnet18-h100-kit.png
Prints a markdown table; the artifact (compiled with --qos-ms from the imported records) adds each
layer's bound and candidates (units, thread blocks, latency).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def curves(results: dict) -> dict[str, dict[str, dict[int, float]]]:
    """func -> {"full_unit_best": {k: us}, "best_at_k": {k: us}}."""
    full = str(results["full_units"])
    out = {}
    for func, samples in results["times_us"].items():
        measured = {s: t for s, t in samples.items() if t.get(full)}
        best = min(measured, key=lambda s: measured[s][full])
        units = [int(k) for k in results["units"]]
        out[func] = {
            "full_unit_best": {k: measured[best][str(k)] for k in units if measured[best].get(str(k))},
            "best_at_k": {k: min(t[str(k)] for t in measured.values() if t.get(str(k))) for k in units},
        }
    return out


def plot(data: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    funcs = list(data)
    cols = 5
    rows = math.ceil(len(funcs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, func in zip(axes.flat, funcs):
        for label, style in (("full_unit_best", "o-"), ("best_at_k", "s--")):
            ks = sorted(data[func][label])
            ax.plot(ks, [data[func][label][k] for k in ks], style, markersize=3, label=label.replace("_", " "))
        ax.set_title(func[:32], fontsize=7)
        ax.tick_params(labelsize=6)
        ax.set_xlabel("SMs", fontsize=6)
        ax.set_ylabel("us", fontsize=6)
    for ax in list(axes.flat)[len(funcs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--artifact", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    data = curves(results)
    if args.plot:
        plot(data, args.plot, f"{results['device_name'].strip(chr(0) + chr(32))}: latency vs SMs (green contexts)")
    layers = {}
    if args.artifact:
        from tvmsched.artifact.format import Artifact

        manifest = Artifact.load(args.artifact).manifest
        layers = {layer.func: layer for layer in manifest.layers}
        print(f"QoS target {manifest.qos_ms} ms; full-unit model {sum(l.candidates[0].latency_us for l in manifest.layers) / 1e3:.3f} ms\n")
    full = results["full_units"]
    print("| layer | full-unit best at 8/32/64/132 SMs (us) | best sample at 8/32/64 SMs (us) | bound us | candidates id: SMs (0 = all), blocks, us |")
    print("|---|---|---|---|---|")
    for func, curve in data.items():
        pick = lambda c: "/".join(f"{c[k]:.1f}" if k in c else "-" for k in (8, 32, 64, full))
        pick3 = lambda c: "/".join(f"{c[k]:.1f}" if k in c else "-" for k in (8, 32, 64))
        layer = layers.get(func)
        bound = f"{layer.qos_bound_us:.1f}" if layer else "-"
        cands = "; ".join(f"{c.id}: {c.units}, {c.blocks}b, {c.latency_us:.1f}" for c in layer.candidates) if layer else "-"
        print(f"| {func} | {pick(curve['full_unit_best'])} | {pick3(curve['best_at_k'])} | {bound} | {cands} |")


if __name__ == "__main__":
    main()
