"""Stage 2: legalize Relax ops to TIR and fuse them into layers (one PrimFunc per layer)."""

from __future__ import annotations

from tvmsched.errors import TvmschedError, one_line


def legalize_and_fuse(mod, target, clamp_take: bool = True):
    """FoldBatchnormToConv2D → DecomposeOpsForInference → ConvertLayout (CPU) → LegalizeOps → AnnotateTIROpPattern → FoldConstant → FuseOps → FuseTIR → DCE, under `target`.

    With `clamp_take`, `take` (ONNX Gather) clamps its indices instead of TVM's unchecked "fast" mode,
    which reads out of bounds on a bad index: memory-safe on its own, beside the index checks.
    """
    import tvm
    from tvm import relax

    cpu = target.kind.name == "llvm"
    passes = tvm.ir.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            *([relax.transform.ConvertLayout(CPU_LAYOUTS)] if cpu else []),
            relax.transform.LegalizeOps(customize_legalize_map={**nan_propagating_legalizations(),
                                                                **(clamped_take() if clamp_take else {}),
                                                                **(vectorizable_math() if cpu else {})}),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    try:
        with target:
            return passes(mod)
    except Exception as err:
        raise TvmschedError(f"lowering the model to TIR failed: {one_line(err)}") from None


# Convolutions on CPU: NHWC data, HWIO weights (transposed once, at compile time, by FoldConstant), so a
# vector of output channels is contiguous in the weights and the output (cpu_schedule.TiledReduction).
CPU_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def vectorizable_math() -> dict:
    """Erf as TOPI's polynomial `fast_erf` (what onnxruntime's MLAS does too): LLVM vectorizes it; the libm call does not."""
    from tvm import topi

    def erf(bb, call):
        x = call.args[0]
        if str(x.ty.dtype) not in ("float32", "float16"):
            return bb.call_te(topi.erf, x, primfunc_name_hint="erf")
        return bb.call_te(topi.fast_erf, x, primfunc_name_hint="erf")

    return {"relax.erf": erf}


def nan_propagating_legalizations() -> dict:
    """Relu, Clip, Max and Min as ONNX / IEEE define them on NaN: a NaN operand gives NaN.

    TVM lowers them to max/min, which LLVM and CUDA implement as maxnum/minnum (a NaN operand is dropped:
    Relu(NaN) = 0). Each float result takes the NaN of any float tensor operand (broadcast like the op).
    """
    from tvm import te, topi

    def nan_first(te_func, name: str):
        def compute(*args):
            result = te_func(*args)
            if "float" not in str(result.dtype):
                return result
            for arg in args:
                if isinstance(arg, te.Tensor) and "float" in str(arg.dtype):
                    result = topi.where(topi.isnan(arg), arg, result)
            return result

        return lambda bb, call: bb.call_te(compute, *call.args, primfunc_name_hint=name)

    return {"relax.nn.relu": nan_first(topi.nn.relu, "relu"), "relax.clip": nan_first(topi.clip, "tir_clip"),
            "relax.maximum": nan_first(topi.maximum, "maximum"), "relax.minimum": nan_first(topi.minimum, "minimum")}


def clamped_take() -> dict:
    """`take` in TOPI's "clip" mode: every index clamped into range (never out of bounds)."""
    from tvm import topi

    def legalize(bb, call):
        axis = call.attrs.axis
        return bb.call_te(topi.take, call.args[0], call.args[1], axis=None if axis is None else int(axis), mode="clip",
                          primfunc_name_hint="take")

    return {"relax.take": legalize}
