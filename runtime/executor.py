"""Our own layer-by-layer executor: load an artifact, allocate once, launch the layers in order."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from tvmsched.artifact import Artifact
from tvmsched.errors import TvmschedError, one_line
from tvmsched.runtime.devices import tvm_device
from tvmsched.runtime.memory_plan import plan_memory
from tvmsched.runtime.units import full_cpu_units, set_cpu_units

log = logging.getLogger(__name__)


class Executor:
    """Runs one artifact on one device; not thread-safe (one request at a time).

    Args:
        artifact: an `Artifact` or the path of an artifact file.
        device: "cpu" or "cuda"; defaults to the device the artifact was compiled for.
    """

    def __init__(self, artifact: Artifact | str | Path, device: str | None = None):
        import tvm

        self.artifact = artifact if isinstance(artifact, Artifact) else Artifact.load(artifact)
        self.manifest = manifest = self.artifact.manifest
        device = device or manifest.device
        if device != manifest.device:
            raise TvmschedError(f"the artifact was compiled for {manifest.device}, not {device}")
        self.device = tvm_device(device)
        self.library = _load_library(self.artifact.library)
        self.kernels = [[self.library[c.kernel] for c in layer.candidates] for layer in manifest.layers]
        # None / 0: all units; grid-limited CUDA kernels restrict themselves (default stream)
        self.units = [[None if c.mechanism == "grid_limit" else c.units for c in layer.candidates] for layer in manifest.layers]
        self._full_cpu_units = full_cpu_units()
        self._green = None  # GreenContexts, made when a CUDA candidate asks for fewer SMs
        self._stream = 0  # the raw CUDA stream the last layer ran on (0: none yet)
        self._own_stream = 0  # CUDA: this executor's stream for all-SM kernels (streams of tenants overlap)
        self.flags = None  # PreemptFlags, the last argument of every kernel of an instrumented artifact
        if manifest.preempt_flags:
            from tvmsched.runtime.preemption import PreemptFlags

            self.flags = PreemptFlags(self.device, manifest.preempt_flags)
        self.counters = None  # one int32 progress counter per layer (kernels add to it as blocks complete)
        self._host_counts = None  # CPU: a zero-copy numpy view of the counters
        self._copy_stream = None  # CUDA: a non-blocking stream for reading the counters while kernels run
        if manifest.progress_counters:
            self.counters = tvm.runtime.empty((len(manifest.layers),), "int32", self.device)
            if manifest.device == "cpu":
                self._host_counts = np.from_dlpack(self.counters)
            self.reset_progress()
        self.replan(reuse_distance=1)

    def replan(self, reuse_distance: int) -> None:
        """(Re)allocate activations so that any `reuse_distance` consecutive layers can run again."""
        import tvm

        manifest = self.manifest
        self.reuse_distance = reuse_distance
        self.plan = plan_memory(manifest.layers, manifest.tensors, {b.tensor for b in manifest.outputs}, reuse_distance)
        self.buffers = self._allocate(tvm)
        extra = [self.flags.tensor] if self.flags else []
        self.layer_args = [
            [*(self.buffers[t] for t in (*layer.inputs, *layer.outputs)), *extra,
             *([self.counters._create_view((1,), "int32", 4 * i)] if self.counters is not None else [])]
            for i, layer in enumerate(manifest.layers)
        ]

    def reset_progress(self) -> None:
        """Zero every layer's progress counter (before a request)."""
        if self._host_counts is not None:
            self._host_counts[:] = 0
        else:
            self.counters.copyfrom(np.zeros(len(self.manifest.layers), "int32"))

    def read_counters(self) -> np.ndarray:
        """The raw per-layer counters now, without waiting for running kernels (CPU: host memory;
        CUDA: copied on a stream of its own that does not wait for the kernels' streams)."""
        if self._host_counts is not None:
            return self._host_counts.copy()
        from cuda.bindings import driver

        from tvmsched.runtime.green_contexts import _check

        if not int(_check(driver.cuCtxGetCurrent())):  # a monitor thread: make TVM's (primary) context current
            device = _check(driver.cuDeviceGet(self.device.index))
            _check(driver.cuCtxSetCurrent(_check(driver.cuDevicePrimaryCtxRetain(device))))
        if self._copy_stream is None:
            self._copy_stream = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        counts = np.empty(len(self.manifest.layers), "int32")
        _check(driver.cuMemcpyDtoHAsync(counts.ctypes.data, self.counters.data_ptr(), counts.nbytes, self._copy_stream))
        _check(driver.cuStreamSynchronize(self._copy_stream))
        return counts

    def completed_blocks(self, candidate_ids: list[int] | None = None) -> list[int]:
        """Per layer, the blocks its kernel has completed since the last reset."""
        counts = self.read_counters()
        ids = candidate_ids or [0] * len(counts)
        threads = [layer.candidates[c].threads or 1 for layer, c in zip(self.manifest.layers, ids)]
        return [int(n) // t for n, t in zip(counts, threads)]

    def _allocate(self, tvm) -> dict:
        manifest, dev = self.manifest, self.device
        storage = [tvm.runtime.empty((size,), "uint8", dev) for size in self.plan.storage_bytes]
        buffers = {}
        for tensor_id, spec in manifest.tensors.items():
            if spec.kind == "weight":
                buffers[tensor_id] = tvm.runtime.tensor(self.artifact.weights[tensor_id], dev)
            elif spec.kind == "input":
                buffers[tensor_id] = tvm.runtime.empty(spec.shape, spec.dtype, dev)
            else:
                block = storage[self.plan.assignment[tensor_id]]
                buffers[tensor_id] = block._create_view(spec.shape, spec.dtype)
        return buffers

    def set_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Copy inputs (keyed by ONNX input name) to the device, checking names, shapes and dtypes."""
        expected = {b.name: b.tensor for b in self.manifest.inputs}
        unknown = sorted(set(inputs) - set(expected))
        missing = sorted(set(expected) - set(inputs))
        if unknown or missing:
            raise TvmschedError(
                f"input names do not match the model: unknown {unknown}, missing {missing}; expected {sorted(expected)}"
            )
        for name, tensor_id in expected.items():
            spec, value = self.manifest.tensors[tensor_id], np.asarray(inputs[name])
            if tuple(value.shape) != spec.shape:
                raise TvmschedError(f"input {name!r} has shape {tuple(value.shape)}, expected {spec.shape}")
            if str(value.dtype) != spec.dtype:
                raise TvmschedError(f"input {name!r} has dtype {value.dtype}, expected {spec.dtype}")
            self.buffers[tensor_id].copyfrom(value if value.flags.c_contiguous else value.copy(order="C"))

    def run_layer(self, index: int, candidate_id: int = 0) -> None:
        """Launch one layer's chosen candidate kernel on its units (asynchronous on GPU).

        CPU: the calling thread's pool gets the candidate's thread count. CUDA: a candidate with
        fewer SMs runs on a green-context stream of that many SMs; switching streams waits for the
        previous one, so layers stay in order.
        """
        units, kernel = self.units[index][candidate_id], self.kernels[index][candidate_id]
        if self.manifest.device == "cpu":
            set_cpu_units(units or self._full_cpu_units)
            kernel(*self.layer_args[index])
            return
        stream = self._full_stream() if not units else self._green_contexts().stream(units)[0]  # None or 0: all SMs
        if stream != self._stream:
            self.synchronize()
            self._stream = stream
        import tvm_ffi

        with tvm_ffi.use_raw_stream(self.device, stream):
            kernel(*self.layer_args[index])

    def _full_stream(self) -> int:
        if not self._own_stream:
            self._own_stream = int(self.device.create_raw_stream())
        return self._own_stream

    def _green_contexts(self):
        if self._green is None:
            from tvmsched.runtime.green_contexts import GreenContexts

            self._green = GreenContexts(self.device.index)
        return self._green

    def synchronize(self) -> None:
        """Wait until the layers launched so far have finished (CUDA: their stream; CPU: nothing pending)."""
        if self._stream:
            from cuda.bindings import driver

            driver.cuStreamSynchronize(driver.CUstream(self._stream))
        else:
            self.device.sync()

    def record_event(self):
        """CUDA: an event recorded on the stream the last layer ran on (to track that launch)."""
        from cuda.bindings import driver

        from tvmsched.runtime.green_contexts import _check

        event = _check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        _check(driver.cuEventRecord(event, driver.CUstream(self._stream)))
        return event

    @staticmethod
    def event_done(event) -> bool:
        from cuda.bindings import driver

        done = int(driver.cuEventQuery(event)[0]) == 0
        if done:
            driver.cuEventDestroy(event)
        return done

    @staticmethod
    def wait_event(event) -> None:
        from cuda.bindings import driver

        driver.cuEventSynchronize(event)
        driver.cuEventDestroy(event)

    def run_layers(self, candidate_ids: list[int] | None = None) -> None:
        for index in range(len(self.kernels)):
            self.run_layer(index, candidate_ids[index] if candidate_ids else 0)

    def get_outputs(self) -> dict[str, np.ndarray]:
        self.synchronize()
        return {b.name: self.buffers[b.tensor].numpy() for b in self.manifest.outputs}

    def run(self, inputs: dict[str, np.ndarray], candidate_ids: list[int] | None = None) -> dict[str, np.ndarray]:
        """Run the whole model once and return its outputs keyed by ONNX output name."""
        self.set_inputs(inputs)
        self.run_layers(candidate_ids)
        return self.get_outputs()

    def time_runs(self, inputs: dict[str, np.ndarray], repeat: int, warmup: int = 2) -> list[float]:
        """Seconds per whole-model run (layers only, device-synchronised), after `warmup` runs."""
        self.set_inputs(inputs)
        times = []
        for i in range(warmup + repeat):
            start = time.perf_counter()
            self.run_layers()
            self.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return times

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Standard-normal (floats) or small-integer inputs of the model's shapes."""
        rng = np.random.default_rng(seed)
        inputs = {}
        for binding in self.manifest.inputs:
            spec = self.manifest.tensors[binding.tensor]
            if np.issubdtype(np.dtype(spec.dtype), np.floating):
                inputs[binding.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
            else:
                inputs[binding.name] = rng.integers(0, 2, spec.shape).astype(spec.dtype)
        return inputs


def _load_library(data: bytes):
    import tvm

    with tempfile.TemporaryDirectory(prefix="tvmsched-lib-") as tmp:
        path = Path(tmp) / "kernels.so"
        path.write_bytes(data)
        try:
            return tvm.runtime.load_module(str(path))
        except Exception as err:
            raise TvmschedError(f"cannot load the artifact's kernel library: {one_line(err)}") from None
