"""One model on one device, run layer by layer by the native engine (runtime/native: ModelObj).

The engine loads the artifact itself (manifest, weights, kernels), allocates weights, activations
(the liveness plan), the preempt flag and progress counters, and launches the kernels; this class
converts between numpy and the engine and keeps the manifest for the policies.
"""

from __future__ import annotations

import operator
import tempfile
from pathlib import Path

import numpy as np
import tvm_ffi

from tvmsched.artifact.format import Artifact, Manifest
from tvmsched.errors import TvmschedError, one_line
from tvmsched.runtime import native
from tvmsched.lower.targets import check_cpu_features

def to_engine(inputs: dict[str, np.ndarray]) -> dict:
    """Host arrays as tvm-ffi tensors (zero-copy for C-contiguous numpy arrays); a tvm-ffi map of tensors as it is."""
    if isinstance(inputs, tvm_ffi.Map):
        return inputs
    if not isinstance(inputs, dict):
        raise TvmschedError(f"inputs must be a dict of arrays keyed by input name, not {type(inputs).__name__}")
    converted = {}
    for name, value in inputs.items():
        try:
            converted[str(name)] = tvm_ffi.from_dlpack(np.asarray(value, order="C"))
        except (TypeError, ValueError, BufferError, RuntimeError) as err:
            raise TvmschedError(f"input {name!r} is not a numeric array ({one_line(err)})") from None
    return converted


def candidate_list(candidate_ids) -> list[int]:
    """A candidate-ID list as the engine takes it (one int per layer; None or empty: candidate 0)."""
    if candidate_ids is None:
        return []
    if isinstance(candidate_ids, tvm_ffi.Array):  # already the engine's (a Runtime converts each list once)
        return candidate_ids
    try:
        ids = [operator.index(i) for i in candidate_ids]
    except TypeError:
        raise TvmschedError(f"candidate ids must be a list of integers, one per layer, not {candidate_ids!r:.80}") from None
    return ids


def from_engine(outputs, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The engine's outputs as numpy arrays (zero-copy); `names`: the model's output names, read one by one
    (iterating the engine's map costs ~4 µs, a lookup ~0.4)."""
    if names is not None:
        return {name: np.from_dlpack(outputs[name]) for name in names}
    return {str(name): np.from_dlpack(value) for name, value in outputs.items()}


class Executor:
    """Runs one artifact on one device; not thread-safe (one request at a time).

    Args:
        artifact: the path of an artifact file, or an `Artifact` (written to a temporary file first).
        device: "cpu" or "cuda"; defaults to the device the artifact was compiled for.
        flag_memory: CUDA preempt flag in "host_mapped" or "device" memory; "auto" measures both.
        trusted_keys: Ed25519 public key files (PEM, `tvmsched keys generate`): load only an artifact
            file one of them signed, checked before anything is loaded (README, "Trust model").
        memory_scope: the budget its device memory counts against (a Runtime's, `native.create_memory_scope`);
            None: no budget but the device's capacity.
        batch_size: an artifact compiled at several batch sizes: the one to run (None: its largest; resident only).
    """

    def __init__(self, artifact: Artifact | str | Path, device: str | None = None, flag_memory: str = "auto",
                 trusted_keys: list[str | Path] | tuple = (), register_groups: int | None = None,
                 tiered: dict | None = None, memory_scope=None, batch_size: int | None = None):
        keys = [str(k) for k in trusted_keys]

        def load(path: str, keys: list[str]):
            if tiered is not None:  # larger than its device memory: weights streamed from host tiers (runtime/tiering.py)
                return native.load_tiered(path, device or "", flag_memory, keys, int(tiered["device_bytes"]),
                                           int(tiered.get("buffer_bytes", 0)), tiered["tiers"],
                                           int(tiered.get("in_flight", 8)), memory_scope)
            if register_groups is None:
                return native.load_model(path, device or "", flag_memory, keys, memory_scope, batch_size)
            if batch_size is not None:
                raise TvmschedError("a batch size other than the largest is loaded resident (no register_groups)")
            # registered: weights in pinned host memory, `register_groups` sub-tasks at most; a switcher
            # (runtime/switching.py) makes it resident
            return native.register_model(path, device or "", flag_memory, keys, int(register_groups), memory_scope)

        if isinstance(artifact, Artifact):
            if keys:
                raise TvmschedError("trusted keys check signed artifact files: pass the artifact's path, not an Artifact")
            # the engine checks files as it loads them; a temporary file's name would mean nothing in the error
            check_cpu_features(artifact.manifest, f"the artifact of model {artifact.manifest.model_name}")
            with tempfile.TemporaryDirectory(prefix="tvmsched-") as tmp:
                path = Path(tmp) / "model.tvms"
                artifact.save(path)
                self.native = load(str(path), [])
        else:
            self.native = load(str(artifact), keys)
        # the manifest the engine verified and loaded (never a second read of the file), at the size it loaded
        self.manifest: Manifest = Manifest.parse(str(self.native.manifest_json()), artifact).at_batch(
            int(self.native.batch_size()))
        self.device = self.native.device_kind()
        self.num_layers = self.native.num_layers()
        self.output_names = tuple(binding.name for binding in self.manifest.outputs)

    @classmethod
    def over(cls, native_model, artifact, parsed: dict | None = None) -> "Executor":
        """An executor over an engine model that is already loaded (one of the engine Runtime's); `artifact`: its
        file (for the manifest's view of it); `parsed`: manifests already parsed, by their text (a model's streams
        share one)."""
        executor = cls.__new__(cls)
        executor.native = native_model
        text = str(native_model.manifest_json())
        manifest = parsed.get(text) if parsed is not None else None
        if manifest is None:
            manifest = Manifest.parse(text, artifact)
            if parsed is not None:
                parsed[text] = manifest
        executor.manifest = manifest.at_batch(int(native_model.batch_size()))
        executor.device = native_model.device_kind()
        executor.num_layers = native_model.num_layers()
        executor.output_names = tuple(binding.name for binding in executor.manifest.outputs)
        return executor

    @property
    def flag_memory(self) -> str:
        """Where its preempt flag is now: "host_mapped" (CPU: host memory), "device" (CUDA, chosen for kernels with
        loop checks or by measuring), or "none" (not instrumented, or not on the device)."""
        return native.flag_memory(self.native)

    @property
    def resident(self) -> bool:
        """Whether its environment and every sub-task are on the device now."""
        return bool(self.native.resident())

    @property
    def placement(self) -> str:
        """Where its memory is (the engine's Placement): "resident" (prepared at load), "staged" (a switcher's:
        prepared when requests need it) or "streamed" (weights streamed from the memory tiers)."""
        return str(self.native.placement())

    @property
    def reuse_distance(self) -> int:
        return self.native.reuse_distance()

    def replan(self, reuse_distance: int) -> None:
        """(Re)allocate activations so that any `reuse_distance` consecutive layers can run again."""
        self.native.replan(reuse_distance)

    def set_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Copy inputs (keyed by ONNX input name) to the device, checking names, shapes and dtypes."""
        self.native.set_inputs(to_engine(inputs))

    def run_layer(self, index: int, candidate_id: int = 0) -> None:
        """Launch one layer's chosen candidate kernel on its units (asynchronous on GPU)."""
        self.native.run_layer(index, candidate_id)

    def run_layers(self, candidate_ids: list[int] | None = None) -> None:
        self.native.run_layers(candidate_list(candidate_ids))

    def synchronize(self) -> None:
        self.native.synchronize()

    def get_outputs(self) -> dict[str, np.ndarray]:
        return from_engine(self.native.get_outputs(), self.output_names)

    def run(self, inputs: dict[str, np.ndarray], candidate_ids: list[int] | None = None) -> dict[str, np.ndarray]:
        """Run the whole model once and return its outputs keyed by ONNX output name."""
        return from_engine(self.native.run(to_engine(inputs), candidate_list(candidate_ids)), self.output_names)

    def time_runs(self, inputs: dict[str, np.ndarray], repeat: int, warmup: int = 2) -> list[float]:
        """Seconds per whole-model run (layers only, device-synchronised, timed in the engine)."""
        self.set_inputs(inputs)
        return list(self.native.time_runs(repeat, warmup))

    def reset_progress(self) -> None:
        """Zero every layer's progress counter (before a request)."""
        self.native.reset_progress()

    def read_counters(self) -> np.ndarray:
        """The raw per-layer counters now, without waiting for running kernels."""
        return np.array(list(self.native.read_counters()), dtype="int32")

    def completed_blocks(self, candidate_ids: list[int] | None = None) -> list[int]:
        """Per layer, the blocks its kernel has completed since the last reset."""
        return [int(n) for n in self.native.completed_blocks(candidate_list(candidate_ids))]

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Standard-normal (floats) or integer inputs of the model's shapes; an input that indexes
        (an index check names it) is drawn from its valid range, other integers from {0, 1}."""
        rng = np.random.default_rng(seed)
        ranges = {}  # an input several nodes index: the smallest of their sizes
        for check in self.manifest.index_checks:
            ranges[check.indices] = min(ranges.get(check.indices, check.bounds[0]), *check.bounds)
        inputs = {}
        for binding in self.manifest.inputs:
            spec = self.manifest.tensors[binding.tensor]
            if np.issubdtype(np.dtype(spec.dtype), np.floating):
                inputs[binding.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
            else:
                inputs[binding.name] = rng.integers(0, ranges.get(binding.name, 2), spec.shape).astype(spec.dtype)
        return inputs


class SplitExecutor:
    """A model split across devices (mechanism D over several GPUs; docs/multi-device.md, tvmsched/split.h): its layers
    in consecutive groups (the memory planner's), each group a model of its own on one device, which holds that
    group's weights and no others'; a request runs the groups in order, the activations crossing devices copied out
    of one device as a part's outputs and into the next as its inputs. `devices`: at least two of one kind ("cuda:0", "cuda:1"; "cpu:0", "cpu:1": shares of the cores standing
    for GPUs). The outputs are the bits one device's run gives."""

    def __init__(self, path, devices, trusted_keys=()):
        self.devices = tuple(str(d) for d in devices)
        self.native = native.func("split_load")(str(path), list(self.devices), [str(k) for k in trusted_keys])

    def run(self, inputs: dict[str, np.ndarray], ids=()) -> dict[str, np.ndarray]:
        """One request (`ids`: a candidate per layer; empty: candidate 0): its outputs."""
        return from_engine(self.native.run(to_engine(inputs), [int(i) for i in ids]))

    @property
    def layers(self) -> list[tuple[int, int]]:
        """Per device: its first and last layer."""
        return [(int(a), int(b)) for a, b in self.native.layers()]

    @property
    def crossing_bytes(self) -> int:
        """Bytes copied between devices per request."""
        return int(self.native.crossing_bytes())

    def memory(self) -> list[dict[str, int]]:
        """Per device: its device memory in use and its group's weight bytes."""
        return [{"in_use": int(a), "weight_bytes": int(b)} for a, b in self.native.memory()]
