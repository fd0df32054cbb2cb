"""Weight packing (issue 16, bench/results/weight_packing.md): one layer with its constant weight as the model has
it ([K, N] matmul weights, HWIO convolution weights) against the same layer after `lowering.pack_weights`
([N / tv, K, tv], [CO / tv, KH, KW, CI, tv]), both under the default CPU schedule, timed side by side.

    python bench/weight_packing.py [--repeat 20] [--out bench/results/weight_packing.md]

Shapes: the matmuls of llama-small, distilbert / bert-base and a 128-row LM head, and 3x3 convolutions of
ResNet-18 at 56x56 / 14x14 and of VGG-19. Each kernel is timed warm (the weights stay in cache across runs) and cold
(TVM's cache_flush_cpu_non_first_arg before every run: the weights come from DRAM, as inside a whole model);
the two layouts' runs alternate. The packed layer's output is checked against the other's (and numpy's, for matmuls).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, machine_line  # noqa: E402

HERE = Path(__file__).parent

# (label, kind, data shape, weight shape, conv padding)
CASES = [
    ("llama-small q/o projection", "matmul", (1, 128, 512), (512, 512), 0),
    ("llama-small gate/up", "matmul", (1, 128, 512), (512, 1408), 0),
    ("llama-small down", "matmul", (1, 128, 1408), (1408, 512), 0),
    ("bert-base / distilbert FFN up", "matmul", (1, 128, 768), (768, 3072), 0),
    ("bert-base / distilbert FFN down", "matmul", (1, 128, 3072), (3072, 768), 0),
    ("llama-small LM head", "matmul", (1, 128, 512), (512, 32000), 0),
    ("resnet18 3x3 conv, 56x56x64", "conv2d", (1, 56, 56, 64), (3, 3, 64, 64), 1),
    ("resnet18 3x3 conv, 14x14x256", "conv2d", (1, 14, 14, 256), (3, 3, 256, 256), 1),
    ("vgg19 3x3 conv, 28x28x512", "conv2d", (1, 28, 28, 256), (3, 3, 256, 512), 1),
]


def layer_module(kind: str, data_shape, weight: np.ndarray, padding: int):
    """A Relax module computing one layer of `kind` on a data input and the constant `weight`."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(data_shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(weight)
            if kind == "matmul":
                out = bb.emit(relax.op.matmul(x, w))
            else:
                out = bb.emit(relax.op.nn.conv2d(x, w, padding=[padding] * 4, data_layout="NHWC", kernel_layout="HWIO"))
            bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def build_layer(mod, target):
    """The module's one legalized PrimFunc under the default CPU schedule, the weight as it reads it, and
    the PrimFunc's (shape, dtype) arguments."""
    import tvm
    from tvm import relax

    from tvmsched.lower import cpu_schedule

    with target:
        mod = relax.transform.LegalizeOps()(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    weights = [b.value.numpy() for b in _constants(mod)]
    scheduled = cpu_schedule.default_schedule({"main": func}, target)["main"]
    return scheduled, weights[0], [([int(d) for d in p.shape], str(p.dtype)) for p in func.params]


def _constants(mod) -> list:
    """The constants the main function's calls take (call_tir's argument tuple included)."""
    import tvm
    from tvm import relax

    found = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            args = list(getattr(binding.value, "args", []))
            while args:
                arg = args.pop(0)
                if isinstance(arg, relax.Tuple):
                    args += list(arg.fields)
                elif isinstance(arg, tvm.ir.Constant):
                    found.append(arg)
    return found


def time_pair(funcs: dict, specs: dict, target, repeat: int) -> dict:
    """Median microseconds per layout, warm and cold, the layouts taking turns (tvmsched.tune.local_timing.measure_together,
    the keep-or-drop decision's timer): warm, `repeat` batches of at least 10 ms; cold, 5 x `repeat` single runs."""
    from tvmsched.tune.candidates import cpu_units
    from tvmsched.tune.local_timing import measure_together

    entries = [(funcs[name], specs[name]) for name in funcs]
    out = {}
    for mode, runs in (("warm", repeat), ("cold", 5 * repeat)):
        times = measure_together(entries, target, cpu_units(target), repeat=runs, cold=mode == "cold")
        out[mode] = dict(zip(funcs, times))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="Warm batches per layout (cold: 5x as many single runs).")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "weight_packing.md")
    args = parser.parse_args()

    import tvm

    from tvmsched.lower import relax as lowering
    from tvmsched.lower.targets import make_target

    target = make_target("llvm")
    rng = np.random.default_rng(0)
    rows = []
    for label, kind, data_shape, weight_shape, padding in CASES:
        data = rng.standard_normal(data_shape).astype(np.float32)
        weight = rng.standard_normal(weight_shape).astype(np.float32)
        mod = layer_module(kind, data_shape, weight, padding)
        funcs, specs, outputs = {}, {}, {}
        for name, layer in (("as the model has it", mod), ("packed", lowering.pack_weights(mod, target))):
            funcs[name], w, specs[name] = build_layer(layer, target)
            tensors = [tvm.runtime.tensor(data), tvm.runtime.tensor(w), tvm.runtime.tensor(np.zeros(specs[name][-1][0], np.float32))]
            tvm.compile(tvm.IRModule({"main": funcs[name]}), target=target)(*tensors)
            outputs[name] = tensors[-1].numpy()
        want = data @ weight if kind == "matmul" else None
        plain, packed = outputs.values()
        np.testing.assert_allclose(packed, plain, rtol=1e-4, atol=1e-3)
        if want is not None:
            np.testing.assert_allclose(packed, want, rtol=1e-4, atol=1e-3)
        times = time_pair(funcs, specs, target, args.repeat)
        rows.append((label, kind, data_shape, weight_shape, specs["packed"][1][0], times))
        print(f"{label}: warm {times['warm']['as the model has it'] / times['warm']['packed']:.2f}x, cold "
              f"{times['cold']['as the model has it'] / times['cold']['packed']:.2f}x faster packed", flush=True)
    write_report(args.out, rows, args.repeat)


def write_report(out: Path, rows, repeat: int) -> None:
    lines = ["# Weight packing: one layer, its weight as the model has it against packed (issue 16)", "",
             f"Command: `python bench/weight_packing.py --repeat {repeat}`  ", machine_line(machine_info()), "",
             "Both layouts under the same default CPU schedule (tvmsched/lower/cpu_schedule.py), built as one module and "
             "timed in turns by tvmsched.tune.local_timing.measure_together: warm, the median of "
             f"{repeat} batches of at least 10 ms; cold, the median of {5 * repeat} single runs, caches flushed of all "
             "but the input before each.", "",
             "| layer | data | weight | packed weight | warm us (model's) | warm us (packed) | warm speed-up "
             "| cold us (model's) | cold us (packed) | cold speed-up |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, _kind, data, weight, packed, t in rows:
        cells = []
        for mode in ("warm", "cold"):
            a, b = t[mode]["as the model has it"], t[mode]["packed"]
            cells += [f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}x"]
        shape = lambda s: "x".join(str(int(d)) for d in s)  # noqa: E731
        lines.append(f"| {label} | {shape(data)} | {shape(weight)} | {shape(packed)} | " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
