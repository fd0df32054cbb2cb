"""Target parsing: short names, TVM target tags and JSON target dicts."""

from __future__ import annotations

import json
import os

from tvmsched.errors import TvmschedError

# The GPU this project is benchmarked on; `--target cuda` means this tag.
DEFAULT_CUDA_TAG = "nvidia/nvidia-h100"


def target_json(spec: str) -> dict:
    """Normalise a `--target` value to a TVM target dict without importing TVM.

    Args:
        spec: "llvm", "cuda", a JSON dict, or a TVM target tag such as "nvidia/nvidia-h100".
    """
    spec = spec.strip()
    if spec == "llvm":
        return {"kind": "llvm", "num-cores": os.cpu_count() or 1}
    if spec == "cuda":
        return {"tag": DEFAULT_CUDA_TAG}
    if spec.startswith("{"):
        try:
            config = json.loads(spec)
        except json.JSONDecodeError as err:
            raise TvmschedError(f"--target is not valid JSON: {err}") from None
        if not isinstance(config, dict) or "kind" not in config:
            raise TvmschedError('--target JSON must be an object with a "kind", e.g. {"kind": "llvm"}')
        if config["kind"] == "llvm":
            config.setdefault("num-cores", os.cpu_count() or 1)
        return config
    return {"tag": spec}


def is_cuda_spec(spec: str) -> bool:
    """Whether a `--target` value names a CUDA target (checked before TVM is imported)."""
    config = target_json(spec)
    return config.get("kind") == "cuda" or "nvidia" in config.get("tag", "") or config.get("tag") == "cuda"


def make_target(spec: str):
    """Build a `tvm.target.Target` from a `--target` value; unknown names are a TvmschedError."""
    import tvm

    config = target_json(spec)
    try:
        return tvm.target.Target(config["tag"] if set(config) == {"tag"} else config)
    except Exception as err:  # TVM raises several types for bad targets
        first_line = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise TvmschedError(f"unknown target {spec!r}: {first_line}") from None


def device_kind(target) -> str:
    """'cuda' or 'cpu': the runtime device a target's kernels run on."""
    return "cuda" if target.kind.name == "cuda" else "cpu"
