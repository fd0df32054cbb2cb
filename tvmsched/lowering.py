"""Stage 2: legalize Relax ops to TIR and fuse them into layers (one PrimFunc per layer)."""

from __future__ import annotations

import logging

from tvmsched.errors import TvmschedError, one_line

log = logging.getLogger(__name__)


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
        if cpu:
            mod = to_cpu_layouts(mod)
        with target:
            return passes(mod)
    except Exception as err:
        raise TvmschedError(f"lowering the model to TIR failed: {one_line(err)}") from None


# Convolutions on CPU: NHWC data, HWIO weights (transposed once, at compile time, by FoldConstant), so a
# vector of output channels is contiguous in the weights and the output (cpu_schedule.TiledReduction).
CPU_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def to_cpu_layouts(mod):
    """Convolutions in NHWC/HWIO (CPU_LAYOUTS), when the model has any.

    ConvertLayout's layout inference for `stack` crashes (IndexError, or SIGFPE on other shapes), so
    stacks become expand_dims + concat first; a model it still rejects keeps its layouts.
    """
    import tvm
    from tvm import relax

    ops = _ops(mod)
    if not ops & set(CPU_LAYOUTS):
        return mod
    if "relax.stack" in ops:
        mod = _unstack(mod)
    try:
        return relax.transform.ConvertLayout(CPU_LAYOUTS)(mod)
    except (tvm.error.TVMError, IndexError, ValueError) as err:  # a layout inference bug: keep NCHW
        log.warning("keeping the model's conv layouts: ConvertLayout failed: %s", one_line(err))
        return mod


def _ops(mod) -> set[str]:
    from tvm import relax

    names = set()

    @relax.expr_functor.visitor
    class Ops(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm_op()):
                names.add(call.op.name)
            super().visit_call_(call)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            Ops().visit_expr(func)
    return names


def tvm_op():
    import tvm

    return tvm.ir.Op


def _unstack(mod):
    """relax.stack(xs, axis) → concat([expand_dims(x, axis) ...], axis)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Unstack(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm_op()) and call.op.name == "relax.stack"):
                return call
            axis = int(call.attrs.axis)
            fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else None
            if fields is None:
                return call
            expanded = [self.builder_.emit(relax.op.expand_dims(x, axis)) for x in fields]
            return relax.op.concat(expanded, axis=axis)

    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator = Unstack(mod)
            mod[gv] = mutator.visit_expr(func)
    return mod


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
