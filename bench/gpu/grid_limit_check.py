"""Check grid limiting on a GPU: every grid-limited kernel gives the original kernel's outputs bit for bit.

Here:  python bench/gpu/grid_limit_check.py build --model resnet18 --units 8 16 32 -o .gpu/gridcheck
There: python3 bench/gpu/grid_limit_check.py run .gpu/gridcheck --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def build(model_name: str, units: list[int], out: Path) -> None:
    from tvmsched.lower.cuda_toolchain import prepare_cuda_build

    prepare_cuda_build()
    from tvmsched import models
    from tvmsched.lower import kernels
    from tvmsched.lower.layers import arg_specs
    from tvmsched.passes.grid_limit import grid_limit
    from tvmsched.pipeline import lower_model

    graph, funcs, target = lower_model(models.build(model_name), "cuda")
    scheduled = kernels.default_schedule(funcs, target)
    specs, entries, symbols = arg_specs(graph), [], {}
    for name, func in scheduled.items():
        variants = {}
        for k in units:
            limited, extent = grid_limit(func, k)
            if extent is not None:
                variants[str(k)] = {"symbol": f"{name}__g{k}", "blocks_x": extent}
                symbols[f"{name}__g{k}"] = limited
        if variants:
            symbols[f"{name}__orig"] = func
            entries.append({"func": name, "args": [[list(s), d] for s, d in specs[name]], "variants": variants})
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.so").write_bytes(kernels.build_library(symbols, target))
    (out / "index.json").write_text(json.dumps(entries))
    print(f"{len(entries)} kernels limited, {len(symbols)} symbols")


def run(folder: Path, out: Path | None) -> None:
    import tvm

    from tvmsched.runtime.devices import tvm_device

    dev = tvm_device("cuda")
    lib = tvm.runtime.load_module(str(folder / "kernels.so"))
    results = []
    for entry in json.loads((folder / "index.json").read_text()):
        rng = np.random.default_rng(0)
        host = [rng.standard_normal(s).astype(d) for s, d in entry["args"]]

        def call(symbol):
            args = [tvm.runtime.tensor(a, dev) for a in host]
            lib[symbol](*args)
            dev.sync()
            start = time.perf_counter()
            for _ in range(20):
                lib[symbol](*args)
            dev.sync()
            return args[-1].numpy(), (time.perf_counter() - start) / 20 * 1e6

        reference, base_us = call(f"{entry['func']}__orig")
        for k, variant in entry["variants"].items():
            output, us = call(variant["symbol"])
            results.append({"func": entry["func"], "units": int(k), "blocks_x": variant["blocks_x"],
                            "identical": bool(np.array_equal(output, reference)), "us": us, "original_us": base_us})
            print(json.dumps(results[-1]), flush=True)
    print("all identical:", all(r["identical"] for r in results))
    if out:
        out.write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--model", default="resnet18")
    b.add_argument("--units", type=int, nargs="+", default=[8, 16, 32])
    b.add_argument("-o", "--output", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.cmd == "build":
        build(args.model, args.units, args.output)
    else:
        run(args.folder, args.out)


if __name__ == "__main__":
    main()
