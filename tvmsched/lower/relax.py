"""Stage 2: legalize Relax ops to TIR and fuse them into layers (one PrimFunc per layer)."""

from __future__ import annotations

import logging

from tvmsched.errors import TvmschedError, one_line

log = logging.getLogger(__name__)


def legalize_and_fuse(mod, target, clamp_take: bool = True):
    """(CPU: ConvertLayout to NHWC, then pack_weights) → FoldBatchnormToConv2D → DecomposeOpsForInference → LegalizeOps → AnnotateTIROpPattern → FoldConstant → FuseOps → FuseTIR → DCE, under `target`.

    With `clamp_take`, `take` (ONNX Gather) clamps its indices instead of TVM's unchecked "fast" mode,
    which reads out of bounds on a bad index: memory-safe on its own, beside the index checks.
    """
    import tvm
    from tvm import relax

    from tvmsched.lower.targets import describe

    cpu = describe(target).cpu
    legalizations = {**nan_propagating_legalizations(), **(clamped_take() if clamp_take else {}),
                     **(vectorizable_math() if cpu else {})}
    passes = tvm.ir.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.LegalizeOps(customize_legalize_map=legalizations),
            relax.transform.AnnotateTIROpPattern(),
            tvm.ir.transform.module_pass(_reshaping_as_injective, opt_level=0, name="tvmsched.ReshapingAsInjective"),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    try:
        if cpu:
            mod = pack_weights(to_cpu_layouts(mod), target)
        with target:
            return passes(mod)
    except Exception as err:
        failing = _failing_legalization(mod, target, legalizations)
        raise TvmschedError(f"lowering the model to TIR failed: {failing or one_line(err)}") from None


ELEMWISE, BROADCAST, INJECTIVE = 0, 1, 2  # TVM's OpPatternKind values (relay/op_attr_types.h)


def _reshaping_as_injective(mod, _ctx):
    """AnnotateTIROpPattern's element-wise and broadcast kernels whose operands and result are not broadcasts of one
    shape marked injective instead. TVM calls a padding (`nn.pad`: out[i] = in[i] inside, else the pad value)
    element-wise from its index pattern, so FuseOps made it a convolution's epilogue (conv2d + pad, as when
    EfficientNet's padding for the next convolution follows one); scheduled per output tile of the convolution, the
    padded border was never written. As injective it fuses into the next layer instead, as that layer's input."""
    from tvm import relax

    def one_shape(shapes) -> bool:  # every static shape a (right-aligned) broadcast of one
        for axis in range(1, max(map(len, shapes), default=0) + 1):
            if len({s[-axis] for s in shapes if len(s) >= axis} - {1}) > 1:
                return False
        return True

    reshaping = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not (isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.call_tir"):
                    continue
                callee = mod[call.args[0]]
                if int((callee.attrs or {}).get("op_pattern", INJECTIVE)) not in (ELEMWISE, BROADCAST):
                    continue
                operands = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else []
                shapes = [_static_shape(getattr(x.ty, "shape", None)) for x in (*operands, binding.var)]
                if None not in shapes and not one_shape(shapes):
                    reshaping.add(call.args[0])
    for gv in reshaping:
        mod.update_func(gv, mod[gv].with_attr("op_pattern", INJECTIVE))
    return mod


def _failing_legalization(mod, target, legalizations: dict) -> str | None:
    """After a failed lowering: LegalizeOps again with every op's legalization wrapped, to name the op that
    fails and its operands ("unsupported relax.nn.prelu(...): reason"); None when legalization passes."""
    import tvm
    from tvm import relax

    from tvmsched.errors import exception_reason

    failures: list[str] = []

    def wrap(name, func):
        def legalize(bb, call):
            try:
                return func(bb, call)
            except Exception as err:
                if not failures:
                    operands = ", ".join(" ".join(str(arg.ty).split()) for arg in call.args)
                    failures.append(f"unsupported {name}({operands}): {exception_reason(err)}")
                raise

        return legalize

    wrapped = {}
    for name in tvm.ir.Op.list_op_names():
        op = tvm.ir.Op.get(name)
        func = legalizations.get(name) or (op.get_attr("FLegalize") if op.has_attr("FLegalize") else None)
        if func is not None:
            wrapped[name] = wrap(name, func)
    try:
        with target:
            tvm.ir.transform.Sequential([relax.transform.FoldBatchnormToConv2D(), relax.transform.DecomposeOpsForInference(),
                                         relax.transform.LegalizeOps(customize_legalize_map=wrapped)])(mod)
    except Exception:  # noqa: BLE001 - the failure is reported by the caller; this only names it
        pass
    return failures[0] if failures else None


# Convolutions on CPU: NHWC data, HWIO weights (transposed once, at compile time, by FoldConstant), so a
# vector of output channels is contiguous in the weights and the output (cpu_schedule.TiledReduction).
CPU_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def to_cpu_layouts(mod):
    """Convolutions in NHWC/HWIO (CPU_LAYOUTS), when the model has any.

    ConvertLayout's layout inference for `stack` crashes (IndexError, or SIGFPE on other shapes) and
    rejects `dropout`'s tuple, so stacks become expand_dims + concat and dropouts (identity at inference)
    their input first; a model it still rejects keeps its layouts.
    """
    from tvm import relax

    ops = _ops(mod)
    if not ops & set(CPU_LAYOUTS):
        return mod
    if ops & {"relax.stack", "relax.nn.dropout"}:
        mod = _unstack(mod)
    try:
        mod = relax.transform.ConvertLayout(CPU_LAYOUTS)(mod)
    except (RuntimeError, IndexError, ValueError) as err:  # a layout inference bug (InternalError is a RuntimeError): keep NCHW
        log.warning("keeping the model's conv layouts: ConvertLayout failed: %s", one_line(err))
        return mod
    return _pad_groups(_fold_weight_layouts(_sink_transposes(mod)))


# Element-wise Relax ops: applied to operands whose axes are all permuted alike (scalars aside), they give the result
# of the unpermuted operands, permuted the same way.
ELEMENTWISE = frozenset(f"relax.{op}" for op in (
    "where", "clip", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "isnan", "isinf",
    "logical_and", "logical_or", "logical_not", "add", "subtract", "multiply", "divide", "maximum", "minimum",
    "negative", "abs", "exp", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "astype"))


def _sink_transposes(mod):
    """Element-wise ops and paddings that ConvertLayout leaves in the model's layout (`where`, `clip`, `nn.pad`: it has
    no layout rule for them) moved into the convolutions' layout: op(permute(a, p), scalar...) -> permute(op(a,
    scalar...), p) (a padding's widths permuted with its axes); a permute of a permute that undoes it dropped; a zero
    padding of H and W before a convolution made the convolution's own. A new module.

    A ReLU6 (ONNX Clip, imported as Less and Where: `clip_as_where`) between two NHWC convolutions was NHWC -> NCHW ->
    clip -> NHWC, two copies of the activation in a layer of its own (29% of MobileNet-v2's time on a CPU); it is now
    the convolution's epilogue. EfficientNet's padding before each depthwise convolution was such a layer too; now the
    convolution pads.
    """
    import tvm
    from tvm import relax

    def bound(mutator, expr, op: str):  # the call of `op` that a var is bound to (through aliases), else None
        while isinstance(expr, relax.Var):
            expr = mutator.lookup_binding(expr)
        return expr if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == op else None

    def permuted(mutator, expr):  # (source, axes) of a var bound to permute_dims with explicit axes, else None
        value = bound(mutator, expr, "relax.permute_dims")
        if value is not None and value.attrs.axes is not None:
            return value.args[0], tuple(int(a) for a in value.attrs.axes)
        return None

    def repad(pad, data, axes):  # `pad` (an nn.pad call) of `data`: its widths taken as permute_dims(., axes) takes axes
        widths = [int(w) for w in pad.attrs.pad_width]
        return relax.op.nn.pad(data, [w for axis in axes for w in widths[2 * axis:2 * axis + 2]], pad.attrs.pad_mode,
                               float(pad.attrs.pad_value))

    def padded_conv(mutator, conv):  # conv2d(pad(x)) with zeros on H and W only -> conv2d(x) padding those too
        pad, attrs = bound(mutator, conv.args[0], "relax.nn.pad"), conv.attrs
        if pad is None or pad.attrs.pad_mode != "constant" or float(pad.attrs.pad_value) != 0.0:
            return None
        widths = [int(w) for w in pad.attrs.pad_width]
        h, w = attrs.data_layout.index("H"), attrs.data_layout.index("W")
        if any(widths[2 * axis:2 * axis + 2] != [0, 0] for axis in range(len(widths) // 2) if axis not in (h, w)):
            return None
        top, left, bottom, right = (int(p) for p in attrs.padding)
        padding = [top + widths[2 * h], left + widths[2 * w], bottom + widths[2 * h + 1], right + widths[2 * w + 1]]
        return relax.op.nn.conv2d(pad.args[0], conv.args[1], attrs.strides, padding, attrs.dilation, int(attrs.groups),
                                  attrs.data_layout, attrs.kernel_layout, attrs.out_layout, attrs.out_dtype or None)

    @relax.expr_functor.mutator
    class SinkTransposes(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
            if name == "relax.permute_dims" and call.attrs.axes is not None:
                inner = permuted(self, call.args[0])
                outer = tuple(int(a) for a in call.attrs.axes)
                if inner is not None and tuple(inner[1][q] for q in outer) == tuple(range(len(outer))):
                    return inner[0]
                pad = bound(self, call.args[0], "relax.nn.pad")
                if pad is None:
                    return call  # permute(pad(x)) -> pad(permute(x)): the convolution's input, padded
                return repad(pad, self.builder_.emit(relax.op.permute_dims(pad.args[0], list(outer))), outer)
            if name == "relax.nn.conv2d":
                folded = padded_conv(self, call)
                return call if folded is None else folded
            if name == "relax.nn.pad":
                source = permuted(self, call.args[0])
                if source is None:
                    return call
                axes = source[1]
                inverse = [axes.index(axis) for axis in range(len(axes))]  # the source's axis j is the permuted one's
                return relax.op.permute_dims(self.builder_.emit(repad(call, source[0], inverse)), list(axes))
            if name not in ELEMENTWISE or _static_rank(call.ty) is None:
                return call
            args, axes = [], None
            for arg in call.args:
                if not isinstance(arg.ty, relax.TensorType) or _static_rank(arg.ty) == 0:
                    args.append(arg)  # a PrimValue bound (clip's), a scalar operand: the same in any layout
                    continue
                source = permuted(self, arg)
                if source is None or _static_rank(arg.ty) != _static_rank(call.ty) or axes not in (None, source[1]):
                    return call
                args.append(source[0])
                axes = source[1]
            if axes is None:
                return call
            inner = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            return relax.op.permute_dims(inner, list(axes))

    return relax.transform.DeadCodeElimination()(_rewritten(mod, SinkTransposes))


def _fold_weight_layouts(mod):
    """ConvertLayout's permute_dims and reshapes of constant weights and biases, done here in numpy: FoldConstant
    would legalize, build and run one kernel for each (~40 ms apiece; two per convolution). A new module."""
    import numpy as np
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class FoldWeights(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.args and isinstance(call.args[0], tvm.ir.Constant)):
                return call
            value = call.args[0].value.numpy()
            if call.op.name == "relax.permute_dims":
                axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
                return relax.const(np.ascontiguousarray(np.transpose(value, axes)), str(value.dtype))
            dims = _static_shape(getattr(call.ty, "shape", None))
            if call.op.name == "relax.reshape" and dims is not None:
                return relax.const(value.reshape(dims), str(value.dtype))
            return call

    return _rewritten(mod, FoldWeights)


def pack_weights(mod, target):
    """Matmuls by a constant 2-D weight, and NHWC/HWIO convolutions (one group) by a constant weight, read it
    packed with the output channels split as `n / tv, ..., tv`: [K, N] → [N / tv, K, tv] (TOPI's dense_pack
    layout), [KH, KW, CI, CO] → [CO / tv, KH, KW, CI, tv]; `tv` is the widest vector tile that
    `cpu_schedule.TiledReduction` puts on the output channels. Packed here once, in numpy: the weights of one
    output tile are then contiguous, not `tv` values every N. Each layer computes the same op (same name,
    shape and epilogues). A new module; the caller's stays.

    One layer, both layouts, the same schedule, side by side: bench/results/weight_packing.md."""
    import numpy as np
    import tvm
    from tvm import relax

    from tvmsched.lower.cpu_schedule import vector_factors, vector_lanes

    def tile(weight) -> int | None:
        """The vector tile on the weight's output channels (its last axis) for its dtype's lanes, or None."""
        lanes = max(vector_lanes(target, weight.dtype.itemsize * 8), 4)  # as TiledReduction's tile
        factors = vector_factors(weight.shape[-1], lanes)
        return factors[0] if factors else None

    @relax.expr_functor.mutator
    class PackWeights(relax.PyExprMutator):
        def weight(self, call, out_dtype):
            """The call's constant float weight (its second operand) of the data's dtype, or None."""
            weight = _constant_value(self, call.args[1])
            if weight is None or "float" not in str(weight.dtype) or str(call.args[0].ty.dtype) != str(weight.dtype):
                return None
            return weight if str(out_dtype or "") in ("", "void", str(weight.dtype)) else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
            if name == "relax.matmul":
                return self.matmul(call)
            if name == "relax.nn.conv2d":
                return self.conv2d(call)
            return call

        def matmul(self, call):
            weight = self.weight(call, call.attrs.out_dtype)
            rank = _static_rank(call.args[0].ty)
            if weight is None or weight.ndim != 2 or rank is None or rank < 2:
                return call
            (k, n), tv = weight.shape, tile(weight)
            if tv is None:
                return call
            packed = np.ascontiguousarray(weight.reshape(k, n // tv, tv).transpose(1, 0, 2))
            return self.builder_.call_te(_packed_matmul, call.args[0], relax.const(packed, str(weight.dtype)),
                                         primfunc_name_hint="matmul")

        def conv2d(self, call):
            attrs = call.attrs
            layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
            weight = self.weight(call, attrs.out_dtype)
            if weight is None or int(attrs.groups) != 1 or layouts != ("NHWC", "HWIO", "NHWC") or weight.ndim != 4:
                return call
            kh, kw, ci, co = weight.shape
            tv = tile(weight)
            if _static_shape(call.args[0].ty.shape) is None or tv is None:
                return call
            packed = np.ascontiguousarray(weight.reshape(kh, kw, ci, co // tv, tv).transpose(3, 0, 1, 2, 4))
            ints = lambda values: [int(v) for v in values]  # noqa: E731
            return self.builder_.call_te(_packed_conv, call.args[0], relax.const(packed, str(weight.dtype)),
                                         ints(attrs.strides), ints(attrs.padding), ints(attrs.dilation),
                                         primfunc_name_hint="conv2d")

    return _rewritten(mod, PackWeights)


def _packed_matmul(x, packed):
    """The matmul of pack_weights: x [..., K] by a weight packed [N / tv, K, tv]."""
    from tvm import te

    tv = packed.shape[-1]
    k = te.reduce_axis((0, packed.shape[1]), name="k")
    return te.compute((*x.shape[:-1], packed.shape[0] * tv),
                      lambda *i: te.sum(x[(*i[:-1], k)] * packed[i[-1] // tv, k, i[-1] % tv], axis=k), name="matmul")


def _packed_conv(x, packed, strides, padding, dilation):
    """The NHWC convolution of pack_weights by a weight packed [CO / tv, KH, KW, CI, tv]."""
    from tvm import te, topi

    n, h, w, _ = x.shape
    _, kh, kw, ci, tv = packed.shape
    (sh, sw), (dh, dw), (top, left, bottom, right) = strides, dilation, padding
    if any(padding):
        x = topi.nn.pad(x, [0, top, left, 0], [0, bottom, right, 0], name="pad_temp")
    rh, rw, rc = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw"), te.reduce_axis((0, ci), "rc")
    out_h = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + left + right - dw * (kw - 1) - 1) // sw + 1
    return te.compute((n, out_h, out_w, packed.shape[0] * tv),
                      lambda b, y, z, c: te.sum(x[b, y * sh + rh * dh, z * sw + rw * dw, rc]
                                                * packed[c // tv, rh, rw, rc, c % tv], axis=[rh, rw, rc]),
                      name="conv2d_nhwc")


def _static_rank(ty) -> int | None:
    """A Relax tensor type's rank, or None when unknown (or not a tensor)."""
    ndim = getattr(ty, "ndim", -1)
    return None if ndim is None or ndim < 0 else int(ndim)


def _static_shape(shape) -> list[int] | None:
    """A Relax shape's dims as ints, or None if it has a symbolic one (or is no shape)."""
    import tvm

    dims = getattr(shape, "values", None)
    return None if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims) else [int(d) for d in dims]


GROUP_WIDTH_MULTIPLE = 8  # output channels per group: a tile of 8 lanes at least (a 4-lane tile uses a quarter of AVX-512)


def _pad_groups(mod):
    """Grouped NHWC convolutions whose groups have a width no wide vector tile divides (ShuffleNet's 34 and
    68 channels per group) compute each group padded to a multiple of GROUP_WIDTH_MULTIPLE with zero filters
    (constant weights padded here, others by the graph), then drop the padding: conv2d(x, w) → reshape(slice(
    reshape(conv2d(x, pad(w))))). The convolution then vectorizes across a group's channels. A new module."""
    import numpy as np
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class PadGroups(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
                return call
            attrs = call.attrs
            groups = int(attrs.groups)
            layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout)
            w_shape, out_shape = _static_shape(call.args[1].ty.shape), _static_shape(call.ty.shape)
            if groups <= 1 or layouts != ("NHWC", "HWIO", "NHWC") or w_shape is None or out_shape is None:
                return call
            width = w_shape[3] // groups
            padded = padded_group_width(width)
            if padded is None:
                return call
            kh, kw, cin = w_shape[:3]
            emit = self.builder_.emit
            known = _constant_value(self, call.args[1])
            if known is not None:  # padded here: FoldConstant builds and runs a kernel per op (~40 ms each)
                pads = [(0, 0)] * 4 + [(0, padded - width)]
                weight = relax.const(np.pad(known.reshape(kh, kw, cin, groups, width), pads).reshape(kh, kw, cin, groups * padded))
            else:
                weight = emit(relax.op.reshape(call.args[1], [kh, kw, cin, groups, width]))
                weight = emit(relax.op.nn.pad(weight, [0, 0] * 4 + [0, padded - width]))
                weight = emit(relax.op.reshape(weight, [kh, kw, cin, groups * padded]))
            conv = emit(relax.op.nn.conv2d(call.args[0], weight, attrs.strides, attrs.padding, attrs.dilation, groups,
                                           "NHWC", "HWIO", "NHWC", attrs.out_dtype or None))
            n, h, w, _ = out_shape
            wide = emit(relax.op.reshape(conv, [n, h, w, groups, padded]))
            kept = emit(relax.op.strided_slice(wide, axes=[4], begin=[0], end=[width]))
            return relax.op.reshape(kept, out_shape)

    return _rewritten(mod, PadGroups)


def padded_group_width(width: int) -> int | None:
    """The width a group of `width` output channels is computed at (`_pad_groups`), or None: kept as it is."""
    if width <= 1 or width == 4 or width % GROUP_WIDTH_MULTIPLE == 0:
        return None
    multiple = 4 if width < 4 else GROUP_WIDTH_MULTIPLE  # 2 channels: 4, not 8 (half the waste)
    return -(-width // multiple) * multiple


def _ops(mod) -> set[str]:
    import tvm
    from tvm import relax

    names = set()

    @relax.expr_functor.visitor
    class Ops(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                names.add(call.op.name)
            super().visit_call_(call)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            Ops().visit_expr(func)
    return names


def _unstack(mod):
    """relax.stack(xs, axis) → concat([expand_dims(x, axis) ...], axis); dropout(x) → (x, x). A new module."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Unstack(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
            if name == "relax.nn.dropout":
                return relax.Tuple([call.args[0], call.args[0]])  # inference: identity (the mask unused)
            if name != "relax.stack" or not isinstance(call.args[0], relax.Tuple):
                return call
            axis = int(call.attrs.axis)
            expanded = [self.builder_.emit(relax.op.expand_dims(x, axis)) for x in call.args[0].fields]
            return relax.op.concat(expanded, axis=axis)

    return _rewritten(mod, Unstack)


def _rewritten(mod, mutator):
    """A new module whose Relax functions are rewritten by `mutator` (a PyExprMutator class), with the PrimFuncs
    its builder added (`builder_.call_te`); the caller's module stays."""
    from tvm import relax

    rewriter = mutator(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def _constant_value(mutator, expr):
    """The numpy value of a constant operand seen by `mutator` (a PyExprMutator): a constant, a var bound to
    one, or a transposed constant (a Gemm's transB weight, folded here); else None."""
    import numpy as np
    import tvm
    from tvm import relax

    if isinstance(expr, relax.Var):
        expr = mutator.lookup_binding(expr)
    if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.permute_dims":
        value = _constant_value(mutator, expr.args[0])
        axes = None if expr.attrs.axes is None else [int(a) for a in expr.attrs.axes]
        return None if value is None else np.transpose(value, axes)
    return expr.value.numpy() if isinstance(expr, tvm.ir.Constant) else None


def vectorizable_math() -> dict:
    """Erf, Exp, Sigmoid and Softmax with TOPI's polynomial approximations (what onnxruntime's MLAS does too):
    LLVM vectorizes them; libm calls stay scalar. fast_erf is within 4e-7, fast_exp within 5e-6 relative. On fp16
    tensors (`--precision fp16`) they compute in fp32 and round once.
    The approximations clamp their input, so NaN stays NaN (and exp(x > 88.72) inf) explicitly: a NaN in a
    softmax row makes the whole row NaN, as the exact one does."""
    from tvm import te, tirx, topi

    def exact_dtype(call) -> bool:
        return str(call.args[0].ty.dtype) != "float32"

    def clamped_exp(x):
        big = tirx.const(88.72283935546875, x.dtype)
        inf = tirx.const(float("inf"), x.dtype)
        approx = topi.fast_exp(x)
        return te.compute(x.shape, lambda *i: tirx.Select(x(*i) > big, inf, approx(*i)), name="exp")

    fast_exp, fast_erf = _nan_first(clamped_exp), _nan_first(topi.fast_erf)

    def sigmoid(x):
        negated = topi.negative(x)
        e = fast_exp(negated)
        one = tirx.const(1.0, x.dtype)
        return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid")

    def softmax(x, axis: int):
        """TOPI's softmax blocks (max, exp of the difference, sum, divide), the exp vectorizable."""
        axis %= len(x.shape)
        row = lambda i, k: i[:axis] + (k,) + i[axis:]  # noqa: E731  (the reduced axis put back)
        rest = lambda i: i[:axis] + i[axis + 1:]  # noqa: E731
        reduced = [d for i, d in enumerate(x.shape) if i != axis]
        k1, k2 = te.reduce_axis((0, x.shape[axis]), name="k"), te.reduce_axis((0, x.shape[axis]), name="k")
        max_elem = te.compute(reduced, lambda *i: te.max(x[row(i, k1)], axis=k1), name="T_softmax_maxelem")
        delta = te.compute(x.shape, lambda *i: x(*i) - max_elem(*rest(i)), name="T_softmax_delta")
        e = fast_exp(delta)
        expsum = te.compute(reduced, lambda *i: te.sum(e[row(i, k2)], axis=k2), name="T_softmax_expsum")
        return te.compute(x.shape, lambda *i: e(*i) / expsum(*rest(i)), name="T_softmax_norm", attrs={"axis": axis})

    def in_fp32(fast):
        """`fast` on an fp16 tensor computed in fp32 (LLVM has no fp16 erf, and MLAS widens fp16 math the same way)."""
        def compute(x, *attrs):
            return topi.cast(fast(topi.cast(x, "float32"), *attrs), x.dtype)
        return compute

    def legalize(exact, fast, name, attrs=lambda call: ()):
        def lower(bb, call):
            dtype = str(call.args[0].ty.dtype)
            te_func = in_fp32(fast) if dtype == "float16" else exact if exact_dtype(call) else fast
            return bb.call_te(te_func, call.args[0], *attrs(call), primfunc_name_hint=name)
        return lower

    return {"relax.erf": legalize(topi.erf, fast_erf, "erf"), "relax.exp": legalize(topi.exp, fast_exp, "exp"),
            "relax.sigmoid": legalize(topi.sigmoid, sigmoid, "sigmoid"),
            "relax.nn.softmax": legalize(topi.nn.softmax, softmax, "softmax", lambda call: (int(call.attrs.axis),))}


def nan_propagating_legalizations() -> dict:
    """Relu, Clip, Max and Min as ONNX / IEEE define them on NaN: a NaN operand gives NaN.

    TVM lowers them to max/min, which LLVM and CUDA implement as maxnum/minnum (a NaN operand is dropped:
    Relu(NaN) = 0). Each float result takes the NaN of any float tensor operand (broadcast like the op).
    """
    from tvm import topi

    def nan_first(te_func, name: str):
        return lambda bb, call: bb.call_te(_nan_first(te_func), *call.args, primfunc_name_hint=name)

    return {"relax.nn.relu": nan_first(topi.nn.relu, "relu"), "relax.clip": nan_first(topi.clip, "tir_clip"),
            "relax.maximum": nan_first(topi.maximum, "maximum"), "relax.minimum": nan_first(topi.minimum, "minimum")}


def _nan_first(te_func):
    """`te_func` (a TE compute) whose float result takes the NaN of any float tensor operand (broadcast like it)."""
    from tvm import te, topi

    def compute(*args):
        result = te_func(*args)
        if "float" not in str(result.dtype):
            return result
        for arg in args:
            if isinstance(arg, te.Tensor) and "float" in str(arg.dtype):
                result = topi.where(topi.isnan(arg), arg, result)
        return result

    return compute


def clamped_take() -> dict:
    """`take` in TOPI's "clip" mode: every index clamped into range (never out of bounds)."""
    from tvm import topi

    def legalize(bb, call):
        axis = call.attrs.axis
        return bb.call_te(topi.take, call.args[0], call.args[1], axis=None if axis is None else int(axis), mode="clip",
                          primfunc_name_hint="take")

    return {"relax.take": legalize}
