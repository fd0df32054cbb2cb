"""ONNX-level rewrites applied before import, for forms TVM's importer would convert wrongly."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvmsched.frontend.validate import Facts, default_opset, per_channel_prelu

log = logging.getLogger(__name__)


def expand_layernorm_statistics(model: onnx.ModelProto) -> onnx.ModelProto:
    """Compute LayerNormalization's optional Mean / InvStdDev outputs with primitive ops.

    TVM's importer returns zeros for them; Y stays a LayerNormalization node.
    """
    if not any(n.op_type == "LayerNormalization" and len([o for o in n.output if o]) > 1 for n in model.graph.node):
        return model
    ranks = {name: len(dims) for name, (_, dims) in Facts.of(model, strip_outputs=False).types.items() if dims is not None}
    opset = default_opset(model) or 17
    nodes, initializers = [], list(model.graph.initializer)
    for index, node in enumerate(model.graph.node):
        if node.op_type != "LayerNormalization" or len([o for o in node.output if o]) == 1:
            nodes.append(node)
            continue
        y = helper.make_node("LayerNormalization", node.input, [node.output[0]], name=node.name, **_attrs(node))
        stats, consts = _statistics(node, ranks[node.input[0]], opset, prefix=f"_tvmsched_ln{index}")
        nodes += [y, *stats]
        initializers += consts
    return with_graph(model, nodes, initializers)


def clip_as_where(model: onnx.ModelProto) -> onnx.ModelProto:
    """Clip with constant, non-NaN bounds as Where(Less(x, lo), lo, x), then Where(Greater(., hi), hi, .): the same
    values, NaN staying NaN (for --precision fp16).

    TVM's importer makes TIR kernels of Clip (call_tir of TE max/min), which TVM's mixed-precision pass cannot read;
    Less, Greater and Where import as elementwise Relax ops it casts, the bounds staying scalars (ONNX Max and Min
    would not do: TVM imports them as a concatenation of operands broadcast to the data's shape, which constant
    folding stores as activation-sized weights). A Clip whose bounds are computed at run time is left as it is (at fp16
    its kernels compute in fp32: tvmsched.lower.precision.to_precision).
    """
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    if not clips:
        return model
    weights = {init.name: init for init in model.graph.initializer}
    types = {name: elem for name, (elem, _) in Facts.of(model, strip_outputs=False).types.items()}
    nodes, initializers = [], list(model.graph.initializer)
    for index, node in enumerate(model.graph.node):
        bounds = _clip_bounds(node, weights, types) if node.op_type == "Clip" else None
        if bounds is None:
            nodes.append(node)
            continue
        value, present = node.input[0], [(op, b) for op, b in zip(("Less", "Greater"), bounds) if b is not None]
        for k, (compare, bound) in enumerate(present):
            prefix = f"_tvmsched_clip{index}_{compare.lower()}"
            if not isinstance(bound, str):  # a Clip-6 attribute: an initializer of the data's dtype
                dtype = onnx.helper.tensor_dtype_to_np_dtype(types[node.input[0]])
                initializers.append(numpy_helper.from_array(np.asarray(bound, dtype=dtype), f"{prefix}_bound"))
                bound = f"{prefix}_bound"
            out = node.output[0] if k == len(present) - 1 else f"{prefix}_out"
            nodes += [helper.make_node(compare, [value, bound], [f"{prefix}_mask"]),
                      helper.make_node("Where", [f"{prefix}_mask", bound, value], [out])]
            value = out
        if not present:
            nodes.append(helper.make_node("Identity", [value], [node.output[0]], name=node.name))
    return with_graph(model, nodes, initializers)


def sum_as_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """Sum of n operands as n - 1 Adds, left to right (one operand: Identity); Sum-6 and later, which broadcast as Add
    does (Sum-6 as Add-6: equal shapes).

    TVM's importer makes a Sum a concatenation of its operands broadcast to one shape, then a reduction over them:
    two copies of the activation, the reduction's own layer, and no fusion with what comes before or after. A residual
    Sum followed by Relu (ResNet-50 as the ONNX model zoo exports it) took about 28% of that model's time on a CPU;
    as an Add it joins the convolution's epilogue. Two operands are added exactly as the reduction added them.
    """
    if (default_opset(model) or 1) < 6 or not any(n.op_type == "Sum" and n.domain in ("", "ai.onnx")
                                                   for n in model.graph.node):
        return model
    nodes = []
    for index, node in enumerate(model.graph.node):
        operands = [i for i in node.input if i]
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or not operands:
            nodes.append(node)
            continue
        if len(operands) == 1:
            nodes.append(helper.make_node("Identity", operands, [node.output[0]], name=node.name))
            continue
        total = operands[0]
        for k, operand in enumerate(operands[1:], start=1):
            out = node.output[0] if k == len(operands) - 1 else f"_tvmsched_sum{index}_{k}"
            nodes.append(helper.make_node("Add", [total, operand], [out], name=f"{node.name}_{k}" if node.name else ""))
            total = out
    return with_graph(model, nodes)


def _clip_bounds(node, weights: dict, types: dict):
    """(lo, hi) of a Clip: an initializer's name, a float (Clip-6 attributes), or None for no bound; None when a bound
    is computed at run time, is NaN, or the data is not a float."""
    if types.get(node.input[0]) not in _FLOATS:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len(node.input) == 1 and attrs:  # Clip-6: bounds as attributes
        lo, hi = attrs.get("min"), attrs.get("max")
        return None if any(b is not None and np.isnan(b) for b in (lo, hi)) else (lo, hi)
    bounds = []
    for name in list(node.input[1:3]) + [""] * (3 - len(node.input)):
        if not name:
            bounds.append(None)
        elif name in weights and not np.isnan(numpy_helper.to_array(weights[name])).any():
            bounds.append(name)
        else:
            return None
    return tuple(bounds)


_NAN_DROPPING = {"Clip": 1, "Max": None, "Min": None}  # op -> how many leading inputs are data (None: all)
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def propagate_nan(model: onnx.ModelProto) -> onnx.ModelProto:
    """Clip, Max and Min give NaN where a data operand is NaN (ONNX / IEEE, as onnxruntime does).

    TVM's importer emits them as max/min kernels, which drop a NaN operand (maxnum: Clip(NaN) = lo).
    Each such float node gets `Where(IsNaN(a), a, ...)` around its result, one per data operand.
    """
    if not any(n.op_type in _NAN_DROPPING for n in model.graph.node):
        return model
    types = {name: elem for name, (elem, _) in Facts.of(model, strip_outputs=False).types.items()}
    nodes = []
    for index, node in enumerate(model.graph.node):
        data = [i for i in node.input[: _NAN_DROPPING.get(node.op_type) or len(node.input)] if i]
        if node.op_type not in _NAN_DROPPING or types.get(node.output[0]) not in _FLOATS:
            nodes.append(node)
            continue
        result = f"_tvmsched_nan{index}_result"
        inner = onnx.NodeProto()  # the node itself (all its attributes: Clip-6 keeps min and max), renamed output
        inner.CopyFrom(node)
        inner.output[0] = result
        nodes.append(inner)
        for k, operand in enumerate(data):
            mask, out = f"_tvmsched_nan{index}_isnan{k}", node.output[0] if k == len(data) - 1 else f"_tvmsched_nan{index}_{k}"
            nodes += [helper.make_node("IsNaN", [operand], [mask]), helper.make_node("Where", [mask, operand, result], [out])]
            result = out
    return with_graph(model, nodes)


def _statistics(node, rank: int, opset: int, prefix: str):
    attrs = _attrs(node)
    axis = attrs.get("axis", -1) % rank
    epsilon = attrs.get("epsilon", 1e-5)
    axes = list(range(axis, rank))
    x, mean_out, inv_out = node.input[0], node.output[1], (node.output[2] if len(node.output) > 2 else "")
    nodes = [helper.make_node("Cast", [x], [f"{prefix}_x"], to=onnx.TensorProto.FLOAT)]
    consts = [numpy_helper.from_array(np.array(epsilon, np.float32), f"{prefix}_eps")]
    if opset >= 18:
        consts.append(numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}_axes"))
    mean = mean_out or f"{prefix}_mean"
    nodes += [
        _reduce_mean(f"{prefix}_x", mean, axes, opset, prefix),
        helper.make_node("Sub", [f"{prefix}_x", mean], [f"{prefix}_d"]),
        helper.make_node("Mul", [f"{prefix}_d", f"{prefix}_d"], [f"{prefix}_d2"]),
        _reduce_mean(f"{prefix}_d2", f"{prefix}_var", axes, opset, prefix),
        helper.make_node("Add", [f"{prefix}_var", f"{prefix}_eps"], [f"{prefix}_ve"]),
        helper.make_node("Sqrt", [f"{prefix}_ve"], [f"{prefix}_std"]),
    ]
    if inv_out:
        nodes.append(helper.make_node("Reciprocal", [f"{prefix}_std"], [inv_out]))
    return nodes, consts


def _reduce_mean(source: str, out: str, axes: list[int], opset: int, prefix: str):
    if opset >= 18:
        return helper.make_node("ReduceMean", [source, f"{prefix}_axes"], [out], keepdims=1)
    return helper.make_node("ReduceMean", [source], [out], axes=axes, keepdims=1)


def with_graph(model: onnx.ModelProto, nodes, initializers=None, outputs=None) -> onnx.ModelProto:
    """A copy of `model` whose graph has these nodes (and initializers, outputs, when given); everything
    else kept (opsets, IR version, metadata, local functions); value_info dropped (inference redoes it)."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    del graph.value_info[:]
    for field, values in (("node", nodes), ("initializer", initializers), ("output", outputs)):
        if values is not None:
            del getattr(graph, field)[:]
            getattr(graph, field).extend(values)
    return rewritten


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in ("axis", "epsilon", "stash_type")}


def fold_batchnorm_into_conv(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold inference BatchNormalization into the Conv that alone feeds it (weights in numpy).

    Relax's FoldConstant would do the same by compiling and running each folded op (~10 s for
    ResNet-18); folding here is instant. Only constant-parameter, single-consumer pairs change.
    """
    inits = {init.name: init for init in model.graph.initializer}
    consumers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    graph_outputs = {out.name for out in model.graph.output}
    producers = {node.output[0]: node for node in model.graph.node if node.op_type == "Conv"}
    folded: dict[str, tuple] = {}  # bn output -> (conv, new weight, new bias)
    for bn in model.graph.node:
        conv = producers.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
        if conv is None or consumers.get(conv.output[0]) != 1 or conv.output[0] in graph_outputs:
            continue
        if len([o for o in bn.output if o]) != 1 or not all(name in inits for name in (*bn.input[1:5], *conv.input[1:])):
            continue
        scale, bias, mean, var = (numpy_helper.to_array(inits[name]).astype(np.float64) for name in bn.input[1:5])
        epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        weight = numpy_helper.to_array(inits[conv.input[1]])
        conv_bias = numpy_helper.to_array(inits[conv.input[2]]) if len(conv.input) > 2 and conv.input[2] else 0.0
        channels = (weight.shape[0],) if weight.ndim else ()
        params = {"scale": scale, "B": bias, "mean": mean, "var": var, "the conv bias": conv_bias}
        wrong = [f"{role} has shape {list(np.shape(p))}" for role, p in params.items()
                 if np.shape(p) != channels and not (role == "the conv bias" and np.shape(p) == ())]
        if wrong:  # an invalid model (onnxruntime rejects it): never let numpy broadcast it
            from tvmsched.errors import TvmschedError

            raise TvmschedError(
                f"BatchNormalization node {bn.name or bn.output[0]!r} cannot fold into Conv {conv.name or conv.output[0]!r}: "
                f"{', '.join(wrong)}, but the Conv makes {channels[0] if channels else '?'} channels (one value per channel)"
            )
        factor = scale / np.sqrt(var + epsilon)
        new_weight = (weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))).astype(weight.dtype)
        new_bias = ((conv_bias - mean) * factor + bias).astype(weight.dtype)
        folded[bn.output[0]] = (conv, new_weight, new_bias)
    if not folded:
        return model
    return _apply_bn_folds(model, folded)


def _apply_bn_folds(model: onnx.ModelProto, folded: dict) -> onnx.ModelProto:
    nodes, initializers = [], list(model.graph.initializer)
    dropped = {conv.output[0] for conv, _, _ in folded.values()}
    for node in model.graph.node:
        if node.output and node.output[0] in dropped:
            continue
        if node.op_type == "BatchNormalization" and node.output[0] in folded:
            conv, weight, bias = folded[node.output[0]]
            names = (f"{node.output[0]}_folded_w", f"{node.output[0]}_folded_b")
            initializers += [numpy_helper.from_array(weight, names[0]), numpy_helper.from_array(bias, names[1])]
            attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
            node = helper.make_node("Conv", [conv.input[0], *names], [node.output[0]], name=conv.name, **attrs)
        nodes.append(node)
    used = {name for node in nodes for name in node.input}
    initializers = [init for init in initializers if init.name in used]
    return with_graph(model, nodes, initializers)


def upgrade_legacy_forms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Forms TVM's importer has no converter for, rewritten into ones it has (run after onnx_fold: the
    result is no longer valid ONNX for the model's opset, only for TVM's importer):

    * Slice-1 (opset < 10: starts / ends / axes attributes) becomes the Slice-10 form, with the three
      as int64 constant inputs (TVM converts Slice from its opset-13 form only).
    * PRelu whose slope is one value per channel, shape [C], on an input of rank >= 3 whose channel
      axis (1) has C entries but whose last axis does not: ONNX broadcasts the slope against the last
      axis (onnxruntime rejects such a model), old exporters (Caffe2, MXNet) meant per channel, and TVM
      asserts in lowering. The slope is reshaped to [C, 1, ..., 1] (per channel), with a warning.
    """
    if not any(n.op_type in ("Slice", "PRelu") and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    opset = default_opset(model) or 1
    facts = None  # inferred at the first PRelu
    nodes, initializers, changed = [], list(model.graph.initializer), False
    for index, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        if node.op_type == "Slice" and opset < 10 and len(node.input) == 1:
            prefix = f"_tvmsched_slice{index}"
            attrs = {a.name: list(a.ints) for a in node.attribute}
            names = []
            for key in ("starts", "ends", "axes"):
                if key in attrs:
                    names.append(f"{prefix}_{key}")
                    initializers.append(numpy_helper.from_array(np.array(attrs[key], np.int64), names[-1]))
            nodes.append(helper.make_node("Slice", [node.input[0], *names], list(node.output), name=node.name))
            changed = True
            continue
        if node.op_type == "PRelu" and len(node.input) == 2:
            facts = facts or Facts.of(model, strip_outputs=False)
            x, slope = facts.shape(node.input[0]), facts.shape(node.input[1])
            if per_channel_prelu(x, slope):
                log.warning(
                    "PRelu node %r: slope of shape [%d] does not broadcast against the input %s by ONNX's rules "
                    "(it would apply along the last axis; onnxruntime rejects it): applied per channel (axis 1), "
                    "as old exporters meant", node.name or f"#{index}", slope[0], list(x))
                shape_name = f"_tvmsched_prelu{index}_shape"
                sloped = f"_tvmsched_prelu{index}_slope"
                initializers.append(numpy_helper.from_array(np.array([slope[0]] + [1] * (len(x) - 2), np.int64),
                                                            shape_name))
                nodes += [helper.make_node("Reshape", [node.input[1], shape_name], [sloped]),
                          helper.make_node("PRelu", [node.input[0], sloped], list(node.output), name=node.name)]
                changed = True
                continue
        nodes.append(node)
    return with_graph(model, nodes, initializers) if changed else model
