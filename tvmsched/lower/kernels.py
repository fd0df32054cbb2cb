"""Stage 4: schedule and compile the layers' PrimFuncs into one kernel library.

Each candidate of a layer is a kernel symbol `<func>__c<id>` in that library.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from tvmsched.errors import TvmschedError, one_line
from tvmsched.lower.targets import describe

log = logging.getLogger(__name__)


def kernel_symbol(func: str, candidate_id: int) -> str:
    return f"{func}__c{candidate_id}"


def layer_funcs(mod) -> dict[str, object]:
    """The fused PrimFuncs of a lowered module, by name."""
    import tvm

    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def default_schedule(funcs: dict[str, object], target) -> dict[str, object]:
    """Default schedules without search: dlight's rules tiled to fill the GPU (tvmsched.lower.gpu_schedule) on CUDA, ours
    (tvmsched.lower.cpu_schedule) on CPU."""
    info = describe(target)
    if info.cpu:
        from tvmsched.lower import cpu_schedule

        return cpu_schedule.default_schedule(funcs, target)
    if not info.gpu:
        return funcs
    from tvm import s_tir

    from tvmsched.lower.gpu_schedule import default_rules
    from tvmsched.lower.targets import gpu_sms

    rules = default_rules(gpu_sms(target))
    scheduled = {}
    with target:
        for name, func in funcs.items():  # as dlight's ApplyDefaultSchedule: the first rule that takes it
            scheduled[name] = func
            passed_on = None  # the path a rule that did not take the layer gives it (why a later rule schedules it)
            for rule in rules:
                # our rules give the layer's path with its schedule (gpu_schedule.GpuPath); dlight's, the schedule
                with_path = getattr(rule, "schedule_and_path", None)
                space, path = with_path(func, target, False) if with_path else (rule.apply(func, target, False), None)
                if space is None:
                    passed_on = passed_on or path
                else:
                    path = path or passed_on
                    sch = space if isinstance(space, s_tir.Schedule) else space[0]
                    done = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr(
                        RULE_ATTR, type(rule).__name__.lstrip("_"))
                    if path is not None:
                        done = done.with_attr(PATH_ATTR, path.path).with_attr(PATH_REASON_ATTR, path.reason)
                    scheduled[name] = done
                    break
    return scheduled


RULE_ATTR = "tvmsched.rule"  # a GPU default schedule's dlight rule (WaveMatmul, GEMV, Reduction, RowReduction, ...)
PATH_ATTR, PATH_REASON_ATTR = "tvmsched.path", "tvmsched.path_reason"  # a layer's GPU path and why (gpu_path)


def gpu_path(plain, scheduled) -> tuple[str | None, str | None]:
    """The GPU path of a layer's kernel and why (gpu_schedule.GpuPath: tensor cores, split-K or SIMT for a matmul-like
    layer, a warp or a block per row for a row reduction); (None, None) for the others. A default schedule records
    both; a tuned matmul-like kernel's path is read from its TIR."""
    from tvmsched.lower import gpu_schedule

    attrs = scheduled.attrs if scheduled.attrs is not None else {}
    if PATH_ATTR in attrs:
        return str(attrs[PATH_ATTR]), str(attrs[PATH_REASON_ATTR])
    if _calls_tensor_cores(scheduled):
        return gpu_schedule.TENSOR_CORES, "tuned (MetaSchedule's tensor-core rule)"
    if gpu_schedule.matmul_extents(plain) is None:
        return None, None
    return gpu_schedule.SIMT, "tuned (MetaSchedule)"


TENSOR_CORE_CALLS = frozenset({"tirx.tvm_mma_sync", "tirx.tvm_bmma_sync", "tirx.ptx_mma", "tirx.ptx_mma_sp"})


def _calls_tensor_cores(func) -> bool:
    """Whether a scheduled PrimFunc multiplies on tensor cores (a WMMA or MMA intrinsic call in its body)."""
    import tvm
    import tvm_ffi

    found = []

    def visit(call):
        if getattr(call.op, "name", None) in TENSOR_CORE_CALLS:
            found.append(call)

    tvm_ffi.structural_walk(func.body, (tvm.ir.Call, visit), order="post")
    return bool(found)


def schedule_name(func, default: str) -> str:
    """What scheduled `func`: `default` ("dlight", "default"), with the dlight rule that took it ("dlight:Reduction")."""
    rule = func.attrs.get(RULE_ATTR) if func.attrs is not None else None
    return f"{default}:{rule}" if rule else default


def build_library(kernels: dict[str, object], target, extra_sources: dict[str, str] | None = None) -> bytes:
    """Compile {symbol: PrimFunc} for `target` and return the exported shared library's bytes.

    extra_sources: {file name: C/C++ source} compiled and linked into the library (host code).
    """
    import tvm

    mod = tvm.IRModule({tvm.ir.GlobalVar(sym): f.with_attr("global_symbol", sym) for sym, f in kernels.items()})
    try:
        with target:
            executable = tvm.compile(mod, target)
    except Exception as err:
        raise TvmschedError(f"compiling the kernels for {describe(target).kind} failed: {one_line(err)}") from None
    with tempfile.TemporaryDirectory(prefix="tvmsched-build-") as tmp:
        path = Path(tmp) / "kernels.so"
        addons = []
        for file_name, source in (extra_sources or {}).items():
            addons.append(str(Path(tmp) / file_name))
            Path(addons[-1]).write_text(source)
        executable.export_library(str(path), addons=addons)
        return path.read_bytes()


def cuda_device_code() -> str:
    """How CUDA kernels get embedded by this process: 'fatbin' (nvcc ran) or 'source' (JIT where loaded)."""
    import tvm

    return "fatbin" if tvm.runtime.enabled("cuda") else "source"


def estimated_flops(func) -> float:
    """TVM's FLOP estimate of a PrimFunc; 0.0 where the estimator rejects its loop nest (FLOPs are informative only)."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - the estimator rejects some loop nests
        return 0.0
