"""Target parsing: short names, CPU levels, TVM target tags and JSON target dicts.

`--target llvm` compiles for the CPU of the machine that compiles (LLVM's name for it, e.g. "znver5"):
without an `mcpu`, LLVM emits generic x86-64 code (SSE2, no AVX). `--target llvm:LEVEL` picks a
portable level instead: `llvm:portable` (no `mcpu`, any CPU of the architecture), `llvm:x86-64-v2`,
`llvm:x86-64-v3` (AVX2, FMA), `llvm:x86-64-v4` (AVX-512) or any CPU name LLVM knows
(`llvm:skylake-avx512`). The artifact records the CPU and the CPU features its kernels need
(`cpu_requirements`); the engine refuses to load it on a CPU that lacks them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from tvmsched.errors import TvmschedError, whole_number_from_env

# The GPU this project is benchmarked on; `--target cuda` means this tag.
DEFAULT_CUDA_TAG = "nvidia/nvidia-h100"

# SMs of the data-centre GPU of each CUDA architecture (TVM's targets carry no SM count): the default
# schedules tile each layer to launch at least one block per SM. TVMSCHED_GPU_SMS overrides it (an
# H100 PCIe has 114, an RTX 4090 128, an L4 58).
GPU_SMS = {"sm_70": 80, "sm_75": 40, "sm_80": 108, "sm_86": 84, "sm_89": 142, "sm_90": 132, "sm_90a": 132, "sm_100": 148,
           "sm_100a": 148, "sm_120": 170}
GPU_SMS_FALLBACK = 132  # an architecture not listed: the H100's

# `llvm:LEVEL` names that mean "no mcpu": generic code for the target architecture.
PORTABLE_LEVELS = ("portable", "generic")
# `llvm:LEVEL` names (and JSON "mcpu" values) that mean the CPU of the compiling machine.
HOST_LEVELS = ("host", "native")
# The x86-64 micro-architecture levels, most capable first (what an error suggests instead).
X86_LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64-v2")

# LLVM's x86 features that the kernels can need at run time and that the engine checks before loading
# an artifact (runtime/native/src/cpu_features.cc holds the same list, with each feature's CPUID bit):
# the instruction-set extensions LLVM emits from ordinary code. Left out: the x86-64 baseline (sse,
# sse2, cmov, ...: every x86-64 CPU has them), tuning flags ("fast-*", "slow-*"), crypto, system and
# AMX instructions (only emitted from intrinsics), and AVX10 (it implies the AVX-512 features listed).
X86_RUNTIME_FEATURES = (
    "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "popcnt", "cx16", "sahf", "movbe", "lzcnt", "bmi", "bmi2",
    "f16c", "fma", "fma4", "xop", "avx", "avx2", "avxvnni", "avxifma", "avxvnniint8", "avxneconvert",
    "avxvnniint16", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512vbmi2", "avx512vnni", "avx512bitalg", "avx512vpopcntdq", "avx512bf16", "avx512fp16",
    "avx512vp2intersect", "gfni", "adx",
)


def _llvm_config(level: str) -> dict:
    """The target dict of `llvm` / `llvm:LEVEL`; the host CPU stays the marker "host" (see target_json)."""
    config = {"kind": "llvm"}
    level = level.strip()
    if not level or level in HOST_LEVELS:
        config["mcpu"] = "host"
    elif level not in PORTABLE_LEVELS:
        config["mcpu"] = level
    config["num-cores"] = os.cpu_count() or 1
    return config


def _parse(spec: str) -> dict:
    """`target_json` with the host CPU left as the marker "host" (no TVM import)."""
    spec = spec.strip()
    if spec == "llvm" or spec.startswith("llvm:"):
        return _llvm_config(spec[len("llvm:"):] if spec.startswith("llvm:") else "")
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
            if config.get("mcpu") in HOST_LEVELS:  # LLVM rejects "native" in the wheel's triple
                config["mcpu"] = "host"
        return config
    return {"tag": spec}


@functools.lru_cache(maxsize=1)
def host_cpu() -> str | None:
    """LLVM's name for this machine's CPU (e.g. "znver5"), or None where LLVM knows it only as generic."""
    import tvm

    name = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    return None if name in ("", "generic") else name


@functools.lru_cache(maxsize=1)
def host_mattr() -> tuple[str, ...]:
    """"-feature" for each checked feature the host CPU's model has but this machine lacks (a VM that
    hides AVX-512 from a Skylake-SP guest still reports skylake-avx512): the host target turns them off,
    so an artifact compiled for this machine always loads on it. Empty on most machines."""
    import tvm

    cpu = host_cpu()
    if cpu is None:
        return ()
    _, needed, unchecked = cpu_requirements(tvm.target.Target({"kind": "llvm", "mcpu": cpu}))
    if unchecked:  # not x86-64
        return ()
    return tuple(f"-{name}" for name in sorted(set(needed) - set(host_cpu_features())))


def target_json(spec: str) -> dict:
    """Normalise a `--target` value to a TVM target dict.

    Args:
        spec: "llvm" (this machine's CPU), "llvm:LEVEL" (a portable level or an LLVM CPU name, e.g.
            "llvm:x86-64-v3", "llvm:portable"), "cuda", a JSON dict, or a TVM target tag such as
            "nvidia/nvidia-h100". Only the host CPU's name needs TVM (imported then).
    """
    config = _parse(spec)
    if config.get("mcpu") == "host":
        cpu = host_cpu()
        if cpu is None:
            del config["mcpu"]
        else:
            config["mcpu"] = cpu
            if host_mattr():
                config["mattr"] = [*config.get("mattr", ()), *host_mattr()]
    return config


def is_cuda_spec(spec: str) -> bool:
    """Whether a `--target` value names a CUDA target (checked before TVM is imported)."""
    config = _parse(spec)
    return config.get("kind") == "cuda" or "nvidia" in config.get("tag", "") or config.get("tag") == "cuda"


def make_target(spec: str):
    """Build a `tvm.target.Target` from a `--target` value; unknown names are a TvmschedError."""
    import tvm

    config = target_json(spec)
    try:
        target = tvm.target.Target(config["tag"] if set(config) == {"tag"} else config)
    except Exception as err:  # TVM raises several types for bad targets
        first_line = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise TvmschedError(f"unknown target {spec!r}: {first_line}") from None
    _check_cpu_name(spec, target)
    return target


def _check_cpu_name(spec: str, target) -> None:
    """An llvm target's `mcpu` must be a CPU LLVM knows for its triple (LLVM itself falls back to
    generic code with a warning)."""
    if not describe(target).cpu or "mcpu" not in target.attrs:
        return
    cpu = str(target.attrs["mcpu"])
    known = _known_cpus(str(target.attrs["mtriple"]) if "mtriple" in target.attrs else "")
    if known and cpu not in known:
        levels = [level for level in X86_LEVELS if level in known]
        hint = f" (portable levels: {', '.join(['portable', *reversed(levels)])})" if levels else ""
        raise TvmschedError(f"unknown target {spec!r}: LLVM knows no CPU named {cpu!r}{hint}")


@functools.lru_cache(maxsize=8)
def _known_cpus(mtriple: str) -> frozenset[str]:
    """LLVM's CPU names for a triple ("": the default one), asked of a target without an mcpu (LLVM
    warns on stderr about an unknown mcpu whenever it meets one)."""
    import tvm

    plain = tvm.target.Target({"kind": "llvm", **({"mtriple": mtriple} if mtriple else {})})
    return frozenset(str(name) for name in tvm.get_global_func("target.llvm_get_cpu_archlist")(plain))


def llvm_triple(target) -> str:
    """An llvm target's triple: its `mtriple`, else the host's (what LLVM compiles for without one)."""
    import tvm

    if "mtriple" in target.attrs:
        return str(target.attrs["mtriple"])
    return str(tvm.get_global_func("target.llvm_get_system_triple")())


def is_x86_64(triple: str) -> bool:
    return triple.split("-", 1)[0] in ("x86_64", "amd64")


def cpu_requirements(target) -> tuple[str | None, tuple[str, ...], str | None]:
    """(CPU, features, unchecked) of what a target's kernels need from the CPU they run on.

    CPU: the llvm target's `mcpu` ("generic" without one; None for non-llvm targets). features: the
    sorted LLVM feature names among X86_RUNTIME_FEATURES that LLVM enables for that CPU (with the
    target's `mattr`). unchecked: None when the features are checked at load time, else why not
    (targets other than x86-64).
    """
    if not describe(target).cpu:
        return None, (), None
    cpu = str(target.attrs["mcpu"]) if "mcpu" in target.attrs else "generic"
    triple = llvm_triple(target)
    if not is_x86_64(triple):
        return cpu, (), f"CPU features are checked for x86-64 targets only (this one is {triple})"
    return cpu, tuple(sorted(enabled_cpu_features(target) & set(X86_RUNTIME_FEATURES))), None


def enabled_cpu_features(target) -> set[str]:
    """The LLVM feature names an llvm target enables (its mcpu's, with its `mattr`)."""
    import tvm

    return {str(name) for name in tvm.get_global_func("target.llvm_get_cpu_features")(target)}


def host_cpu_features() -> tuple[str, ...]:
    """The X86_RUNTIME_FEATURES this machine has, as LLVM detects them (CPUID and the OS's XSAVE state);
    the engine's own check (runtime/native/src/cpu_features.cc) must agree."""
    import tvm

    found = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
    return tuple(sorted(str(k) for k, on in dict(found).items() if on and str(k) in X86_RUNTIME_FEATURES))


def check_cpu_features(manifest, what: str) -> None:
    """Refuse kernels that need CPU features this CPU lacks, for an artifact that is not a file yet: the
    engine's own check (runtime/native/src/cpu_features.cc, run when it loads an artifact file), with
    `what` naming the artifact in the error."""
    if not manifest.cpu_features:
        return
    from tvmsched.runtime import native

    native.check_cpu_features(manifest.cpu or "", list(manifest.cpu_features), what)


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """A compile target described by what it supports: the compiler asks this (`describe(target)`), and no module
    but this one reads the target's kind name.

    device: the engine device its kernels run on ("cpu" or "cuda"). gpu: kernels launch as grids of thread blocks
    (schedules bind threads; preempt checks go per block; a restricted candidate is a green context of fewer
    SMs). cpu: kernels are native code for this machine's kind of CPU (llvm; restricted candidates use fewer
    threads). Neither: a kind TVM knows that the engine does not run (no default schedule).
    """

    kind: str
    device: str
    gpu: bool
    cpu: bool
    unit: str  # what a compute unit is: "cpu_thread" or "gpu_sm"
    mechanism: str  # how a candidate gets fewer units: "cpu_threads" or "green_context"

    @property
    def default_schedule(self) -> str:
        """The MetaSchedule space kind of an untuned layer ("dlight" rules on a GPU, TVM's default elsewhere)."""
        return "dlight" if self.gpu else "default"

    def units(self, target) -> int:
        """All of its compute units, an explicit count: the CPU's cores (num-cores), or the SMs the GPU kernels are
        tiled for."""
        return int(target.attrs.get("num-cores", 1)) if self.cpu else gpu_sms(target)


def describe(target) -> TargetInfo:
    """What `target` (a tvm.target.Target) supports."""
    kind = str(target.kind.name)
    if kind == "cuda":
        return TargetInfo(kind, "cuda", gpu=True, cpu=False, unit="gpu_sm", mechanism="green_context")
    return TargetInfo(kind, "cpu", gpu=False, cpu=kind == "llvm", unit="cpu_thread", mechanism="cpu_threads")


def device_kind(target) -> str:
    """'cuda' or 'cpu': the runtime device a target's kernels run on."""
    return describe(target).device


def gpu_sms(target) -> int:
    """The SM count a CUDA target's kernels are tiled for: TVMSCHED_GPU_SMS, else its architecture's
    data-centre GPU (GPU_SMS)."""
    return whole_number_from_env("TVMSCHED_GPU_SMS", GPU_SMS.get(str(target.attrs.get("arch", "")), GPU_SMS_FALLBACK),
                                 1, 1024, "SMs")
