"""The artifact: one versioned file holding the manifest, the kernel library and the weights.

On disk it is a zip archive (stored, not compressed) with `manifest.json`, `kernels.so`,
`weights.npz` and `checksums.json` (SHA-256 of each other member). Every layer holds a list of
candidate kernels; candidate 0 is the default one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError, one_line
from tvmsched.layers import TensorSpec

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
    """A node whose run-time indices are bounds-checked (tvmsched.index_checks): the engine fails a
    request whose flag (bit `bit` of the int32 scalar `tensor`) is set after the run, with `message`."""

    tensor: str
    bit: int
    op: str
    node: str
    indices: str  # the ONNX tensor holding the indices
    bounds: tuple[int, ...]  # sizes of the indexed axes (valid values: -n .. n-1)
    message: str


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
    # need (LLVM's names, tvmsched.targets.X86_RUNTIME_FEATURES): the engine refuses to load the
    # artifact on a CPU that lacks one. cpu_features_unchecked: why they are not recorded (non-x86-64).
    cpu: str | None = None
    cpu_features: tuple[str, ...] = ()
    cpu_features_unchecked: str | None = None
    # CUDA: the SM count the default schedules were tiled for (tvmsched.targets.gpu_sms; None: a CPU artifact,
    # or one older than the field). A candidate's waves are its blocks over its units, or over these SMs.
    gpu_sms: int | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def verified(cls, path: str | Path, trusted_keys=()) -> Manifest:
        """The manifest of an artifact file as the engine's loader checks it (with `trusted_keys`, its
        signature too), without loading its code."""
        from tvmsched.native import func

        return cls.parse(str(func("verify_artifact")(str(path), [str(k) for k in trusted_keys])["manifest_json"]), path)

    @classmethod
    def parse(cls, text: str, path: str | Path) -> Manifest:
        """A manifest from the JSON the engine verified (`path` names the artifact in errors)."""
        try:
            return cls.from_json(json.loads(text))
        except (KeyError, TypeError, ValueError, RecursionError) as err:
            raise TvmschedError(f"{path} is a corrupt artifact: bad manifest ({one_line(err)})") from None

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
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
        return cls(
            **{
                **data,
                "inputs": tuple(Binding(**b) for b in data["inputs"]),
                "outputs": tuple(Binding(**b) for b in data["outputs"]),
                "tensors": {k: TensorSpec(tuple(v["shape"]), v["dtype"], v["kind"]) for k, v in data["tensors"].items()},
                "layers": layers,
                "index_checks": tuple(IndexCheck(**{**c, "bounds": tuple(c["bounds"])}) for c in data.get("index_checks", ())),
                "cpu_features": tuple(data.get("cpu_features", ())),
            }
        )


@dataclass(frozen=True)
class Artifact:
    manifest: Manifest
    library: bytes
    weights: dict[str, np.ndarray]

    def save(self, path: str | Path, signing_key=None) -> None:
        """Write the artifact; with `signing_key` (tvmsched.signing.load_private_key), sign it."""
        members = {
            "manifest.json": json.dumps(self.manifest.to_json(), indent=1).encode(),
            "kernels.so": self.library,
            "weights.npz": _pack_weights(self.weights),
        }
        checksums = json.dumps({name: hashlib.sha256(data).hexdigest() for name, data in members.items()}, indent=1).encode()
        members["checksums.json"] = checksums
        if signing_key is not None:
            from tvmsched.signing import SIGNATURE_MEMBER, sign

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
