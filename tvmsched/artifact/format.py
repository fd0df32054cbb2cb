"""The artifact: one versioned file holding the manifest, the kernel library and the weights.

On disk it is a zip archive (stored, not compressed) with `manifest.json`, `kernels.so`,
`weights.npz` and `checksums.json` (SHA-256 of each other member). Every layer holds a list of
candidate kernels; candidate 0 is the default one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import math
import types
import typing
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError, printable
from tvmsched.lower.layers import TensorSpec

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Candidate:
    """One compiled implementation of a layer."""

    id: int
    kernel: str  # symbol in the kernel library
    schedule: str  # how it was scheduled: "default", "dlight", later "tuned"
    units: int | None = None  # compute units it was built for (None: all)
    blocks: int | None = None  # thread-block count / parallel extent, when known
    latency_us: float | None = None  # isolated latency, when measured
    memory_bytes: int | None = None  # arguments plus workspace
    mechanism: str | None = None  # how its units are restricted: "cpu_threads" or "green_context"
    idempotent: bool | None = None  # safe to re-run after a partial run (passes.idempotence)
    idempotence: str | None = None  # the analysis' reason
    preempt_check: str | None = None  # where it checks the preempt flag (passes.preempt_flag); None: no flag
    threads: int | None = None  # counter increments per block (GPU threads per block; 1 on CPU) when it counts progress
    progress_blocks: int | None = None  # blocks its kernels count in all when the layer is done (every launch)
    path: str | None = None  # GPU: "tensor cores", "split-K", "SIMT", "warp per row", "block per row" (lower.gpu_schedule)
    path_reason: str | None = None  # why it takes that path


@dataclass(frozen=True)
class Layer:
    index: int
    func: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: float
    bytes: int
    candidates: tuple[Candidate, ...]
    qos_bound_us: float | None = None  # this layer's share of the model's QoS target
    unit_latency_us: dict[str, float] | None = None  # full-unit best measured at each unit count


@dataclass(frozen=True)
class Binding:
    """A model input or output: its ONNX name and the tensor id behind it."""

    name: str
    tensor: str


@dataclass(frozen=True)
class IndexCheck:
    """A node whose run-time indices are bounds-checked (tvmsched.frontend.index_checks): the engine fails a
    request whose flag (bit `bit` of the int32 scalar `tensor`) is set after the run, with `message`."""

    tensor: str
    bit: int
    op: str
    node: str
    indices: str  # the ONNX tensor holding the indices
    bounds: tuple[int, ...]  # sizes of the indexed axes (valid values: -n .. n-1)
    message: str


@dataclass(frozen=True)
class BatchVariant:
    """The model compiled at one more batch size (an artifact compiled at several, tvmsched.frontend.batching): its own
    program (bindings, tensors, layers with their candidates, index checks) over the artifact's kernel library and
    weights; a weight it shares with the manifest's program has the same id and bytes (stored once)."""

    batch_size: int
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    tensors: dict[str, TensorSpec]
    layers: tuple[Layer, ...]
    index_checks: tuple[IndexCheck, ...] = ()
    latency_us: float | None = None  # one run at candidate 0, measured at compile time (None: not measured here)


@dataclass(frozen=True)
class Manifest:
    model_name: str
    target: dict
    device: str  # "cpu" | "cuda"
    device_code: str  # "native" (CPU), "fatbin" or "source" (CUDA)
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    tensors: dict[str, TensorSpec]
    layers: tuple[Layer, ...]
    tvmsched_version: str
    tvm_version: str
    tuning: dict | None = None  # {"trials_per_layer": N, "database": URL, "layers": {func: ...}} when tuned
    qos_ms: float | None = None  # the model's latency target, when candidates were built for one
    preempt_flags: int = 0  # length of the int32 flag array every kernel takes last (0: not instrumented)
    progress_counters: bool = False  # kernels take a progress counter after the flags (passes.progress)
    index_checks: tuple[IndexCheck, ...] = ()  # run-time index bounds checks (empty: none, or compiled unchecked)
    # The CPU the kernels were compiled for (LLVM's name: "znver5", "x86-64-v3", "generic"; None: not
    # recorded, an artifact older than the field, which is compiled generic) and the CPU features they
    # need (LLVM's names, tvmsched.lower.targets.X86_RUNTIME_FEATURES): the engine refuses to load the
    # artifact on a CPU that lacks one. cpu_features_unchecked: why they are not recorded (non-x86-64).
    cpu: str | None = None
    cpu_features: tuple[str, ...] = ()
    cpu_features_unchecked: str | None = None
    # CUDA: the SM count the default schedules were tiled for (tvmsched.lower.targets.gpu_sms; None: a CPU artifact,
    # or one older than the field). A candidate's waves are its blocks over its units, or over these SMs.
    gpu_sms: int | None = None
    # The rows every input's first dimension holds when compiled with a batch size (tvmsched.frontend.batching; None:
    # the shapes the model gave, or an artifact older than the field).
    batch_size: int | None = None
    # Compiled at several batch sizes: the manifest's own program is the largest (footprints, switching and tiering
    # plans use it); each smaller size is a variant, smallest first. batch_latency_us: the largest size's run at
    # candidate 0 measured at compile time (None: not measured, a GPU artifact compiled without its device).
    variants: tuple[BatchVariant, ...] = ()
    batch_latency_us: float | None = None
    # The compute precision (tvmsched.lower.precision): "fp32", or "fp16" (fp16 compute, fp32 accumulation; the inputs
    # and outputs as the model declares them). An artifact older than the field is fp32.
    precision: str = "fp32"
    schema_version: int = SCHEMA_VERSION

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The compiled batch sizes, smallest first (empty: not compiled for a batch)."""
        if self.batch_size is None:
            return ()
        return (*(v.batch_size for v in self.variants), self.batch_size)

    def at_batch(self, batch_size: int | None) -> Manifest:
        """The manifest of the program compiled at `batch_size` (the engine's SelectBatch): a variant's program in place
        of the largest, with no variants; itself for its own size, or for None or 0 (the largest)."""
        if not batch_size or batch_size == self.batch_size:
            return self
        for variant in self.variants:
            if variant.batch_size == batch_size:
                fields = {f.name: getattr(variant, f.name) for f in dataclasses.fields(variant) if f.name != "latency_us"}
                return dataclasses.replace(self, **fields, variants=(), batch_latency_us=variant.latency_us)
        raise TvmschedError(f"{self.model_name} is not compiled at batch size {batch_size} "
                            f"(its sizes: {', '.join(map(str, self.batch_sizes)) or 'none'})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def verified(cls, path: str | Path, trusted_keys=()) -> Manifest:
        """The manifest of an artifact file as the engine's loader checks it (with `trusted_keys`, its
        signature too), without loading its code."""
        from tvmsched.runtime import native

        return cls.parse(str(native.verify_artifact(str(path), [str(k) for k in trusted_keys])["manifest_json"]), path)

    @classmethod
    def parse(cls, text: str, path: str | Path) -> Manifest:
        """A manifest from the JSON the engine verified (`path` names the artifact in errors)."""
        try:
            return cls.from_json(json.loads(text))
        except (KeyError, TypeError, ValueError, RecursionError) as err:
            raise TvmschedError(f"{path} is a corrupt artifact: bad manifest ({printable(str(err).strip())})") from None

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        """The manifest of `data` (a manifest.json), every field checked against its type: a ValueError
        or TypeError naming the first field that is not what it claims (the engine checks the ranges of
        the numbers it reads; here every number must be finite and >= 0)."""
        _check_json(data, cls, "manifest")
        if data.get("tuning") is not None:
            _check_tuning_summary(data["tuning"])
        return cls(
            **{
                **data,
                **_program(data),
                "cpu_features": tuple(data.get("cpu_features", ())),
                "variants": tuple(BatchVariant(**{**v, **_program(v)}) for v in data.get("variants", ())),
            }
        )


def _program(data: dict) -> dict:
    """The fields of a program (a manifest's or a BatchVariant's) as dataclasses, from their JSON."""
    layers = tuple(
        Layer(
            **{
                **layer,
                "inputs": tuple(layer["inputs"]),
                "outputs": tuple(layer["outputs"]),
                "candidates": tuple(Candidate(**c) for c in layer["candidates"]),
            }
        )
        for layer in data["layers"]
    )
    return {
        "inputs": tuple(Binding(**b) for b in data["inputs"]),
        "outputs": tuple(Binding(**b) for b in data["outputs"]),
        "tensors": {k: TensorSpec(tuple(v["shape"]), v["dtype"], v["kind"]) for k, v in data["tensors"].items()},
        "layers": layers,
        "index_checks": tuple(IndexCheck(**{**c, "bounds": tuple(c["bounds"])}) for c in data.get("index_checks", ())),
    }


@functools.cache
def _type_hints(cls) -> dict:
    """A dataclass's field annotations, resolved once (typing.get_type_hints evaluates each string annotation again on
    every call: most of a manifest's parse before)."""
    return typing.get_type_hints(cls)


def _check_json(value, hint, where: str) -> None:
    """Raise ValueError naming `where` unless the JSON `value` has the type `hint` (a field's annotation:
    a dataclass is an object of its fields, a tuple a list; numbers finite and >= 0)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        hints = _type_hints(hint)
        for key, item in value.items():
            if key in hints:  # an unknown field is refused when the dataclass is built
                _check_json(item, hints[key], f"{where}.{key}")
    elif hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} is not a boolean")
    elif hint in (int, float):
        number = isinstance(value, int) or (hint is float and isinstance(value, float))
        if isinstance(value, bool) or not number:
            raise ValueError(f"{where} is not {'an integer' if hint is int else 'a number'}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where} is {value}, not a finite number >= 0")
    elif hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} is not a string")
    elif tuple in (hint, origin):
        if not isinstance(value, (list, tuple)):  # JSON's list, or the tuple of a to_json() not yet serialized
            raise ValueError(f"{where} is not a list")
        for i, item in enumerate(value):
            _check_json(item, args[0] if args else typing.Any, f"{where}[{i}]")
    elif dict in (hint, origin):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        for key, item in value.items():
            if args:
                _check_json(item, args[1], f"{where}.{key}")


# The tuning summary (tvmsched.pipeline) that inspect shows: each field's type; the second set, the fields
# a summary with per-workload totals ("workloads") always has.
_TUNING_SUMMARY = {"database": str, "layers": dict, "trials_per_layer": int | None, "tune_minutes": float | None,
                   "records_only": bool | None, "deadline_hit": bool | None, "workloads": int, "layer_count": int,
                   "trials": int, "tuning_seconds": float, "seconds": float, "trials_per_minute": float, "seeded": int}
_TUNING_ENTRY = {"status": str, "trials": int, "seconds": float, "message": str | None, "workload": str | None,
                 "layers": int, "planned_trials": int | None, "seeded": bool | None, "default_us": float | None,
                 "tuned_us": float | None, "best_us": float | None, "kernel": str}
_WORKLOAD_ERA = ({"layer_count", "trials", "tuning_seconds", "seconds", "trials_per_minute", "seeded"},
                 {"trials", "seconds", "layers", "default_us", "tuned_us", "kernel"})


def _check_tuning_summary(tuning) -> None:
    def check(value, fields: dict, required: set, where: str) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        for key in sorted(required - value.keys()):
            raise ValueError(f"{where} lacks {key}")
        for key, hint in fields.items():
            if key in value:
                _check_json(value[key], hint, f"{where}.{key}")

    per_workload = isinstance(tuning, dict) and "workloads" in tuning
    check(tuning, _TUNING_SUMMARY, {"database", "layers"} | (_WORKLOAD_ERA[0] if per_workload else set()), "manifest.tuning")
    for name, entry in tuning["layers"].items():
        check(entry, _TUNING_ENTRY, {"status"} | (_WORKLOAD_ERA[1] if per_workload else set()), f"manifest.tuning.layers.{name}")


@dataclass(frozen=True)
class Artifact:
    manifest: Manifest
    library: bytes
    weights: dict[str, np.ndarray]

    def save(self, path: str | Path, signing_key=None) -> None:
        """Write the artifact; with `signing_key` (tvmsched.artifact.signing.load_private_key), sign it."""
        members = {
            "manifest.json": json.dumps(self.manifest.to_json(), indent=1).encode(),
            "kernels.so": self.library,
            "weights.npz": _pack_weights(self.weights),
        }
        checksums = json.dumps({name: hashlib.sha256(data).hexdigest() for name, data in members.items()}, indent=1).encode()
        members["checksums.json"] = checksums
        if signing_key is not None:
            from tvmsched.artifact.signing import SIGNATURE_MEMBER, sign

            members[SIGNATURE_MEMBER] = sign(checksums, signing_key)
        tmp = Path(f"{path}.tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as archive:
                for name, data in members.items():
                    archive.writestr(name, data)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise TvmschedError(f"cannot write {path}: {err.strerror or err}") from None
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Artifact:
        """Read an artifact file, checked by the engine's loader (the one implementation of every check:
        stored members, sizes, checksums, schema, manifest invariants, weights), its code not loaded."""
        manifest = Manifest.verified(path)
        with zipfile.ZipFile(path) as archive:  # stored members whose checksums the engine just matched
            return cls(manifest, archive.read("kernels.so"), _unpack_weights(archive.read("weights.npz")))


def _pack_weights(weights: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **weights)
    return buffer.getvalue()


def _unpack_weights(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
