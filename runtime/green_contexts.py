"""CUDA green contexts (cuda-python driver API): streams whose kernels may use only k SMs.

The device's SM resource is split by count once per SM count; each green context gets one stream.
Kernels of TVM modules launch on such a stream through `tvm_ffi.use_raw_stream` (checked on an
H100: identical outputs, latency scaling with the SMs granted).
"""

from __future__ import annotations

from tvmsched.errors import TvmschedError


def _check(result):
    """cuda-python returns (CUresult, *values): raise on errors, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")
    return values[0] if len(values) == 1 else values


class GreenContexts:
    """SM partitions of one device: `sm_count`, `granularity`, and a stream per SM count."""

    def __init__(self, device_id: int = 0):
        try:
            from cuda.bindings import driver
        except ImportError:
            raise TvmschedError("restricting SMs needs cuda-python (pip install cuda-bindings)") from None
        self.drv = driver
        _check(driver.cuInit(0))
        self.device = _check(driver.cuDeviceGet(device_id))
        self.sm = _check(driver.cuDeviceGetDevResource(self.device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        self.sm_count = int(self.sm.sm.smCount)
        self.granularity = int(self._split(1).sm.smCount)  # the smallest group the device grants
        self._streams: dict[int, tuple[int, int, object]] = {}  # requested k -> (stream, granted, ctx)

    def _split(self, k: int):
        groups, _, _ = _check(self.drv.cuDevSmResourceSplitByCount(1, self.sm, 0, k))
        return groups[0]

    def stream(self, k: int) -> tuple[int, int]:
        """(raw stream handle, SMs granted) of a green context of about k SMs (rounded up by the device)."""
        if k not in self._streams:
            drv = self.drv
            group = self.sm if k >= self.sm_count else self._split(k)
            desc = _check(drv.cuDevResourceGenerateDesc([group], 1))
            ctx = _check(drv.cuGreenCtxCreate(desc, self.device, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            stream = _check(drv.cuGreenCtxStreamCreate(ctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            self._streams[k] = (int(stream), int(group.sm.smCount), ctx)
        stream, granted, _ = self._streams[k]
        return stream, granted

    def synchronize(self, stream: int) -> None:
        _check(self.drv.cuStreamSynchronize(self.drv.CUstream(stream)))
