"""Human-readable description of an artifact's manifest (`tvmsched inspect`)."""

from __future__ import annotations

from tvmsched.artifact import Manifest


def describe(manifest: Manifest) -> str:
    tensors = manifest.tensors
    weights = sum(spec.nbytes for spec in tensors.values() if spec.kind == "weight")
    lines = [
        f"model {manifest.model_name}  schema v{manifest.schema_version}  tvmsched {manifest.tvmsched_version}  tvm {manifest.tvm_version}",
        f"target {manifest.target}  device {manifest.device} ({manifest.device_code})",
        "inputs  " + ", ".join(f"{b.name} {_shape(tensors[b.tensor])}" for b in manifest.inputs),
        "outputs " + ", ".join(f"{b.name} {_shape(tensors[b.tensor])}" for b in manifest.outputs),
        *([f"QoS target {manifest.qos_ms} ms"] if manifest.qos_ms else []),
        f"{len(manifest.layers)} layers, weights {weights / 1e6:.2f} MB, "
        f"total {sum(layer.flops for layer in manifest.layers) / 1e9:.3f} GFLOP",
        *_tuning_lines(manifest.tuning),
        "",
        f"{'#':>3}  {'layer':40s} {'out shape':22s} {'MFLOP':>9} {'KB':>9}  candidates",
    ]
    for layer in manifest.layers:
        out = " ".join(_shape(tensors[t]) for t in layer.outputs)
        cands = ", ".join(_candidate(c) for c in layer.candidates)
        bound = "" if layer.qos_bound_us is None else f"  [bound {layer.qos_bound_us:.3g} us; at units " + ", ".join(
            f"{k}: {t:.3g}" for k, t in (layer.unit_latency_us or {}).items()) + " us]"
        lines.append(f"{layer.index:>3}  {layer.func[:40]:40s} {out:22s} {layer.flops / 1e6:9.3f} {layer.bytes / 1e3:9.1f}  {cands}{bound}")
    return "\n".join(lines)


def _shape(spec) -> str:
    return "x".join(map(str, spec.shape)) + f" {spec.dtype}"


def _tuning_lines(tuning: dict | None) -> list[str]:
    if not tuning:
        return ["tuning: none (default schedules)"]
    statuses = [layer["status"] for layer in tuning["layers"].values()]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("tuned", "cached", "fallback") if s in statuses)
    return [f"tuning: {tuning['trials_per_layer']} trials/layer into {tuning['database']}: {counts}"]


def _candidate(c) -> str:
    preempt = "" if c.preempt_check is None else f", {'idempotent' if c.idempotent else 'NOT idempotent'}, checks: {c.preempt_check}"
    if c.units is None:
        return f"{c.id}:{c.kernel} ({c.schedule}{preempt})"
    return f"{c.id}: {c.units}u {c.blocks}b {c.latency_us:.3g}us ({c.schedule}{preempt})"
