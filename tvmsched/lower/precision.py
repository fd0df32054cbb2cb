"""The compute precision of a compile (`tvmsched compile --precision`): fp32, or fp16 with fp32 accumulation.

fp16 is TVM's automatic mixed precision (`relax.transform.ToMixedPrecision`) on the imported Relax module, before
fusion: convolutions, matmuls and attention compute in fp16 and accumulate in fp32, ops that need the range (softmax,
the normalizations' statistics) stay in fp32, and the weights those ops read become fp16 constants (stored so in the
artifact: half the bytes). The model's inputs and outputs keep the dtypes the ONNX model declares. An ONNX model
already in fp16 compiles as it is, at either precision.

bf16 is refused: TVM 0.27 has no bf16 tensor-core intrinsics, so a bf16 artifact would run without tensor cores,
slower than fp16 on a GPU (docs/precision.md).
"""

from __future__ import annotations

from tvmsched.errors import TvmschedError

PRECISIONS = ("fp32", "fp16")

# A layer computes in fp16 beside fp32 inputs (max|Δ| against onnxruntime in fp32, relative to the output's scale):
# the tolerance `run --check` and the tests hold an fp16 artifact to (issue 41: 2e-2 · max(1, max|ref|)).
FP16_TOLERANCE = 2e-2


def fp16_bound(reference) -> float:
    """The largest |out - ref| an fp16 output may have against onnxruntime's fp32 `reference`: FP16_TOLERANCE *
    max(1, max|ref|) over its finite values."""
    import numpy as np

    reference = np.asarray(reference)
    return FP16_TOLERANCE * max(1.0, float(np.max(np.abs(reference)[np.isfinite(reference)], initial=0.0)))


def check_precision(precision: str) -> str:
    """`precision` if tvmsched compiles at it, else one line naming what it does."""
    if precision == "bf16":
        raise TvmschedError("--precision bf16: TVM 0.27 has no bf16 tensor-core path, so bf16 is not compiled; "
                            "use fp16 (tensor cores, fp32 accumulation) or fp32")
    if precision not in PRECISIONS:
        raise TvmschedError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return precision


def recorded_precision(model, precision: str) -> str:
    """The precision an artifact records: fp16 when compiled at it, or when the ONNX model is itself in fp16 (a float16
    input, output or weight: it computes in fp16 at either --precision), else fp32."""
    from onnx import TensorProto

    values = [*model.graph.input, *model.graph.output]
    declared = any(v.type.tensor_type.elem_type == TensorProto.FLOAT16 for v in values) or any(
        init.data_type == TensorProto.FLOAT16 for init in model.graph.initializer)
    return "fp16" if precision == "fp16" or declared else precision


def to_precision(mod, precision: str):
    """The imported Relax module computing at `precision` (fp32: unchanged), its signature unchanged.

    TIR kernels that TVM's ONNX importer made of some ops (call_tir of TE: a reflect or edge Pad, Tile, Einsum, a Clip
    with run-time bounds) compute in fp32, with casts around them, as softmax does: TVM 0.27's pass stops at a call_tir
    ("Expected TensorType, but got R.Callable": it takes the callee for an argument), so each is handed to it as a call
    of a Relax function it cannot see into, whose arguments it casts back to their declared fp32, and is put back after."""
    if precision == "fp32":
        return mod
    from tvm import relax

    before = _signature(mod)
    mod, hidden = _hide_tir_calls(mod)
    try:
        mod = relax.transform.ToMixedPrecision(out_dtype="float32")(mod)
    except Exception as err:  # noqa: BLE001 (TVM's InternalError, its first line)
        raise TvmschedError(f"--precision {precision}: TVM's mixed-precision pass cannot read this model "
                            f"({str(err).strip().splitlines()[-1][:200]}); compile it at fp32") from None
    mod = _restore_tir_calls(mod, hidden)
    mod = relax.transform.FoldConstant()(mod)  # the weights' casts: fp16 constants, which the CPU layouts then pack
    mod = relax.transform.EliminateCommonSubexpr()(mod)  # a tensor read by several fp16 ops: cast once, not per reader
    after = _signature(mod)
    if after != before:  # not expected of the pass: a model whose boundary it changed is refused, never reinterpreted
        raise TvmschedError(f"--precision {precision}: the mixed-precision pass changed the model's inputs or outputs "
                            f"({before} -> {after}); compile it at fp32")
    return mod


HIDDEN_PREFIX = "tvmsched_fp32_"  # the Relax functions that stand for TIR kernels while the mixed-precision pass runs


def _hide_tir_calls(mod):
    """`mod` with main's `call_tir(kernel, (args...))` bindings as calls `tvmsched_fp32_<kernel>(args...)` of Relax
    functions that are not in the module (the pass visits every Relax function it holds), and {name: the call}."""
    from tvm import relax

    hidden: dict = {}

    def hide(builder, call):
        if not (call.op.same_as(_call_tir()) and len(call.args) == 2 and isinstance(call.args[1], relax.Tuple)):
            return call
        kernel, args = call.args[0], list(call.args[1].fields)
        params = [relax.Var(f"a{i}", arg.ty) for i, arg in enumerate(args)]
        stand_in = relax.Function(params, relax.Call(_call_tir(), [kernel, relax.Tuple(params)], call.attrs,
                                                     call.ty_args), call.ty, is_pure=True)
        gv = builder.add_func(stand_in, f"{HIDDEN_PREFIX}{kernel.name_hint}")
        hidden[gv.name_hint] = (gv, call)
        return relax.Call(gv, args)

    out = _rewrite_calls_in_main(mod, hide)
    if not hidden:
        return mod, {}
    for gv, _ in hidden.values():
        del out[gv]
    return out, {name: call for name, (_, call) in hidden.items()}


def _restore_tir_calls(mod, hidden: dict):
    """`mod` with each stand-in call of `_hide_tir_calls` the call_tir it stood for, on the (fp32) arguments it has now."""
    from tvm import ir, relax

    def restore(builder, call):
        if not (isinstance(call.op, ir.GlobalVar) and call.op.name_hint in hidden):
            return call
        was = hidden[call.op.name_hint]
        return relax.Call(_call_tir(), [was.args[0], relax.Tuple(list(call.args))], was.attrs, was.ty_args)

    return _rewrite_calls_in_main(mod, restore) if hidden else mod


def _call_tir():
    from tvm import ir

    return ir.Op.get("relax.call_tir")


def _rewrite_calls_in_main(mod, rewrite):
    """`mod` with every call in main replaced by `rewrite(block_builder, call)` (its arguments rewritten first); the
    builder holds `mod`, and what `rewrite` adds to it stays in the module returned."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):
            return rewrite(self.builder_, super().visit_call_(call))

    mutator = Rewrite(mod)
    main = mutator.visit_expr(mod["main"])
    out = mutator.builder_.get()
    out["main"] = main
    return out


def _signature(mod) -> str:
    main = mod["main"]
    return str([p.ty for p in main.params]) + " -> " + str(main.body.body.ty)  # (TVM 0.27: `ty`, was struct_info)
