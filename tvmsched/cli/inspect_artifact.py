"""Human-readable description of an artifact's manifest (`tvmsched inspect`)."""

from __future__ import annotations

from tvmsched.artifact.format import Manifest
from tvmsched.errors import printable


def describe(manifest: Manifest) -> str:
    tensors = manifest.tensors
    weights = sum(spec.nbytes for spec in tensors.values() if spec.kind == "weight")
    lines = [
        f"model {manifest.model_name}  schema v{manifest.schema_version}  tvmsched {manifest.tvmsched_version}  tvm {manifest.tvm_version}",
        f"target {manifest.target}  device {manifest.device} ({manifest.device_code})"
        + (f"  tiled for {manifest.gpu_sms} SMs (waves: blocks / SMs)" if manifest.gpu_sms else ""),
        "inputs  " + ", ".join(f"{b.name} {_shape(tensors[b.tensor])}" for b in manifest.inputs),
        "outputs " + ", ".join(f"{b.name} {_shape(tensors[b.tensor])}" for b in manifest.outputs),
        *([f"QoS target {manifest.qos_ms} ms"] if manifest.qos_ms else []),
        *_precision_lines(manifest),
        *_batch_lines(manifest),
        f"{len(manifest.layers)} layers, weights {weights / 1e6:.2f} MB, "
        f"total {sum(layer.flops for layer in manifest.layers) / 1e9:.3f} GFLOP",
        *_tuning_lines(manifest.tuning),
        "",
        f"{'#':>3}  {'layer':40s} {'out shape':22s} {'MFLOP':>9} {'KB':>9}  candidates",
    ]
    for layer in manifest.layers:
        out = " ".join(_shape(tensors[t]) for t in layer.outputs)
        cands = ", ".join(_candidate(c, manifest.gpu_sms) for c in layer.candidates)
        bound = "" if layer.qos_bound_us is None else f"  [bound {layer.qos_bound_us:.3g} us; at units " + ", ".join(
            f"{k}: {t:.3g}" for k, t in (layer.unit_latency_us or {}).items()) + " us]"
        lines.append(f"{layer.index:>3}  {layer.func[:40]:40s} {out:22s} {layer.flops / 1e6:9.3f} {layer.bytes / 1e3:9.1f}  {cands}{bound}")
    lines += _path_lines(manifest)
    return "\n".join(map(printable, lines))  # names from the manifest cannot add lines or drive the terminal


def _path_lines(manifest: Manifest) -> list[str]:
    """GPU artifacts: each path's share of the FLOPs (matmul-like layers: tensor cores / split-K / SIMT; row reductions:
    a warp or a block per row), then each such layer's path (its default candidate's), share and reason."""
    total = sum(layer.flops for layer in manifest.layers) or 1.0
    layers = [(layer, layer.candidates[0]) for layer in manifest.layers if layer.candidates and layer.candidates[0].path]
    if not layers:
        return []
    shares: dict[str, list[float]] = {}
    for layer, c in layers:
        shares.setdefault(c.path, []).append(layer.flops / total)
    lines = ["", "GPU paths of matmul-like layers and row reductions (share of the model's FLOPs): " + ", ".join(
        f"{path} {100 * sum(s):.1f}% ({len(s)} layers)" for path, s in sorted(shares.items(), key=lambda kv: -sum(kv[1])))]
    for layer, c in layers:
        lines.append(f"{layer.index:>3}  {layer.func[:40]:40s} {c.path:12s} {100 * layer.flops / total:5.1f}%  {c.path_reason}")
    return lines


def _precision_lines(manifest: Manifest) -> list[str]:
    """fp16: the precision and how many layers compute in each dtype (each layer's line shows its output's)."""
    if manifest.precision == "fp32":
        return []
    from collections import Counter

    dtypes = Counter(manifest.tensors[layer.outputs[0]].dtype for layer in manifest.layers if layer.outputs)
    return [f"precision {manifest.precision} (inputs and outputs as the model declares them), layers: "
            + ", ".join(f"{n} {dtype}" for dtype, n in dtypes.most_common())]


def _batch_lines(manifest: Manifest) -> list[str]:
    """The batch sizes: each one's run at candidate 0 measured at compile time and the memory it adds to the weights."""
    if not manifest.batch_size:
        return []
    if not manifest.variants:
        return [f"batch size {manifest.batch_size} (every input's first dimension)"]
    lines = [f"batch sizes {', '.join(map(str, manifest.batch_sizes))} (every input's first dimension; one program each, "
             "the weights stored once)"]
    for size in manifest.batch_sizes:
        program = manifest.at_batch(size)
        own = sum(spec.nbytes for spec in program.tensors.values() if spec.kind != "weight")
        if program.batch_latency_us is None:
            run = "run not measured at compile time (the runtime measures it at load)"
        else:
            run = f"run {program.batch_latency_us:.1f} us ({program.batch_latency_us / size:.1f} us per row)"
        lines.append(f"  batch {size:>4}: {run}, tensors {own / 1e6:.2f} MB besides the weights, "
                     f"{len(program.layers)} layers")
    return lines


def _shape(spec) -> str:
    return "x".join(map(str, spec.shape)) + f" {spec.dtype}"


def tuning_workloads(tuning: dict) -> dict[str, dict]:
    """The tuning summary's entries of distinct workloads (PrimFuncs sharing a workload point at its first)."""
    return {name: v for name, v in tuning["layers"].items() if v.get("workload", name) in ("", name)}


def _tuning_lines(tuning: dict | None) -> list[str]:
    if not tuning:
        return ["tuning: none (default schedules)"]
    workloads = tuning_workloads(tuning)
    statuses = [v["status"] for v in workloads.values()]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("tuned", "cached", "default-kept", "fallback", "skipped") if s in statuses)
    budget = []
    if tuning.get("tune_minutes") is not None:
        budget.append(f"{tuning['tune_minutes']:g} min budget" + (" (deadline hit)" if tuning.get("deadline_hit") else ""))
    if tuning.get("trials_per_layer"):
        budget.append(f"{tuning['trials_per_layer']} trials/workload" + (" at most" if budget else ""))
    lines = [f"tuning: {', '.join(budget) or 'records only'} into {tuning['database']}: {counts}"]
    if "workloads" not in tuning:  # an artifact from before per-workload summaries
        return lines
    lines.append(
        f"  {tuning['workloads']} distinct workloads in {tuning['layer_count']} layers; {tuning['trials']} new trials in "
        f"{tuning['tuning_seconds']:.0f} s ({tuning['trials_per_minute']:.1f} trials/min), stage {tuning['seconds']:.0f} s, "
        f"{tuning['seeded']} searches seeded with the default schedule"
    )
    lines.append(f"  {'workload':40s} {'layers':>6} {'status':>12} {'trials':>6} {'s':>7} {'default us':>11} {'tuned us':>11}  kernel")
    us = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    for name, v in workloads.items():
        lines.append(
            f"  {name[:40]:40s} {v['layers']:>6} {v['status']:>12} {v['trials']:>6} {v['seconds']:>7.1f} "
            f"{us(v['default_us']):>11} {us(v['tuned_us']):>11}  {v['kernel']}"
        )
    return lines


def _candidate(c, sms: int | None = None) -> str:
    preempt = "" if c.preempt_check is None else f", {'idempotent' if c.idempotent else 'NOT idempotent'}, checks: {c.preempt_check}"
    units = c.units or sms  # a GPU candidate's waves: its blocks over the SMs it runs on
    waves = f" {c.blocks / units:.2f}w" if sms and c.blocks and units else ""
    if c.units is None:
        blocks = f" {c.blocks}b{waves}" if sms and c.blocks else ""
        return f"{c.id}:{c.kernel}{blocks} ({c.schedule}{preempt})"
    latency = "-" if c.latency_us is None else f"{c.latency_us:.3g}"
    return f"{c.id}: {c.units}u {c.blocks}b{waves} {latency}us ({c.schedule}{preempt})"
