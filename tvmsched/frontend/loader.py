"""Stage 1: load and validate an ONNX model, then import it into Relax."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import math
import re
import sys
from pathlib import Path

import onnx

from tvmsched.errors import TvmschedError, exception_reason, native_stderr, one_line
from tvmsched.frontend.validate import default_opset

log = logging.getLogger(__name__)

_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read an ONNX file and run `onnx.checker` on it."""
    path = Path(path)
    if not path.is_file():
        raise TvmschedError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as err:
        raise TvmschedError(f"{path} is not an ONNX model: {one_line(err)}") from None
    if not model.graph.node and not model.graph.output:
        raise TvmschedError(f"{path} is not an ONNX model: it holds no graph")
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        raise TvmschedError(f"{path} fails the ONNX checker: {one_line(err)}") from None
    return model


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs of a graph (older exporters also list initializers as inputs)."""
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def input_signature_names(model: onnx.ModelProto) -> list[str]:
    return [value.name for value in graph_inputs(model)]


def input_signature(
    model: onnx.ModelProto, overrides: dict[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Static shape and dtype of every graph input, with `--input-shape` overrides applied.

    Raises a TvmschedError naming the input whose shape is not static and not overridden.
    """
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(input_signature_names(model)))
    if unknown:
        known = ", ".join(input_signature_names(model)) or "none"
        raise TvmschedError(f"--input-shape names unknown input(s) {unknown}; the inputs are: {known}")
    signature = {}
    for value in graph_inputs(model):
        tensor_type = value.type.tensor_type
        dtype = _ONNX_DTYPES.get(tensor_type.elem_type)
        if dtype is None:
            raise TvmschedError(f"input {value.name!r} has an unsupported element type {tensor_type.elem_type}")
        if value.name in overrides:
            signature[value.name] = (tuple(overrides[value.name]), dtype)
            continue
        dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim]
        if any(d is None or d <= 0 for d in dims):
            shown = ",".join("?" if d is None or d <= 0 else str(d) for d in dims)
            raise TvmschedError(
                f"input {value.name!r} has a dynamic shape ({shown}); fix it with --input-shape {value.name}=..."
            )
        signature[value.name] = (tuple(dims), dtype)
    return signature


def check_supported_ops(model: onnx.ModelProto) -> None:
    """Fail on the first node whose op the Relax ONNX frontend cannot convert."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    for index, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in supported:
            name = node.name or f"#{index}"
            domain = f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""
            raise TvmschedError(f"unsupported op {node.op_type}{domain} at node {name!r}")
        variant = _unsupported_variant(node)
        if variant:
            raise TvmschedError(f"unsupported {node.op_type} variant at node {node.name or f'#{index}'!r}: {variant}")


def _unsupported_variant(node: onnx.NodeProto) -> str | None:
    """Forms of supported ops that TVM's importer would convert wrongly (silently), or None."""
    outputs = [name for name in node.output if name]
    if node.op_type == "BatchNormalization":
        training = any(a.name == "training_mode" and a.i for a in node.attribute)
        if training or len(outputs) > 1:
            return "training mode (batch statistics, running-mean outputs) is not supported"
    return None


def to_relax(model: onnx.ModelProto, signature: dict[str, tuple[tuple[int, ...], str]]):
    """Import a checked ONNX model into a Relax IRModule with its weights as constants (indices unchecked)."""
    return import_model(model, signature, check_indices=False)[0]


def import_model(model: onnx.ModelProto, signature: dict[str, tuple[tuple[int, ...], str]], *, check_indices: bool = True,
                 mixed_precision: bool = False, relax_forms: bool = False):
    """Import a checked ONNX model into Relax: (IRModule, index checks).

    First, with the input shapes of `signature` fixed, what is computable at compile time (the shape
    arithmetic of dynamic-axes exports) is folded into constants (tvmsched.frontend.fold), and forms TVM's
    importer lacks are rewritten (tvmsched.frontend.rewrites). A refusal of TVM's importer names the node.

    With `check_indices`, run-time indices are bounds-checked (tvmsched.frontend.index_checks): `main` then
    returns one int32 flag per check after the model's own outputs, in the order of the checks.

    With `mixed_precision` (--precision fp16), Clip with constant bounds imports as Less, Greater and Where, a
    constant-mode Pad as nn.pad and an Einsum that is a matrix product as matmul: Relax ops the mixed-precision pass
    reads (rewrites.clip_as_where, _importer, einsum_as_matmul). With `relax_forms` (CPU targets) Clip and Pad
    import so too: Relax ops that the conversion to NHWC convolutions moves into their layout
    (tvmsched.lower.relax._sink_transposes), where TVM's Clip and Pad kernels stay in the model's layout between two
    transposes (MobileNet-v2's ReLU6, EfficientNet's padding before each depthwise convolution).
    """
    from tvmsched.frontend.index_checks import guard_indices
    from tvmsched.frontend.fold import fold_constants
    from tvmsched.frontend.rewrites import (
        clip_as_where,
        expand_layernorm_statistics,
        fold_batchnorm_into_conv,
        propagate_nan,
        sum_as_add,
        upgrade_legacy_forms,
    )

    model = fold_constants(model, signature)  # the shape arithmetic of dynamic-axes exports, with the shapes fixed
    model = upgrade_legacy_forms(model)  # Slice-1 attributes, per-channel PRelu slopes
    model = sum_as_add(fold_batchnorm_into_conv(expand_layernorm_statistics(model)))
    if mixed_precision or relax_forms:
        model = clip_as_where(model)  # NaN stays NaN: before propagate_nan, which then leaves these Clips alone
    model = propagate_nan(model)
    checks = []
    if check_indices:
        model, checks = guard_indices(model, signature)
    shapes = {name: list(shape) for name, (shape, _) in signature.items()}
    dtypes = {name: dtype for name, (_, dtype) in signature.items()}
    failure = None
    with native_stderr() as native, contextlib.redirect_stdout(io.StringIO()):  # it prints a failing node's inputs
        importer = _importer(mixed_precision, relax_pads=mixed_precision or relax_forms, shape_dict=shapes,
                             dtype_dict=dtypes)
        try:
            mod = importer.from_onnx(model.graph, default_opset(model) or 1)
        except Exception as err:  # noqa: BLE001 - the importer raises many types; all are the model's problem
            failure = exception_reason(err)
            node = importer.tvmsched_node
        del importer
        gc.collect()  # a failed import's BlockBuilder warns when freed: here, not after our error line
    if failure is not None:
        if node is None:
            raise TvmschedError(f"the ONNX importer rejected the model: {failure}")
        where = f"node {node.name!r}" if node.name else f"node writing {node.output[0]!r}"  # rewrites renumber nodes
        raise TvmschedError(f"the ONNX importer rejected the model at {node.op_type} {where}: {failure}")
    sys.stderr.write(native[0])  # a successful import's warnings stay visible
    return mod, checks


def _importer(mixed_precision: bool = False, relax_pads: bool = False, **options):
    """TVM's ONNX graph importer, remembering the node it converts (for the one-line error naming it).

    `from_onnx` without its wrapper: the wrapper only re-runs onnx's checker (validate does it)
    and reads the opset. With `relax_pads`, a constant-mode Pad (opset 11 and newer, constant pads, none negative)
    becomes Relax's nn.pad; with `mixed_precision` a matrix-product Einsum becomes a matmul (`einsum_as_matmul`):
    Relax ops that TVM's mixed-precision pass and layout conversion read, not the TIR kernels TVM's converter makes.
    """
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, Pad

    def relax_pad(inputs, params):
        try:
            before, after, value = Pad._parse_pads_and_axes(inputs, params)
        except ValueError:  # run-time pads or axes: TVM's converter says so
            return None
        if min(before + after, default=0) < 0:  # a negative pad crops: left to TVM's converter
            return None
        return relax.op.nn.pad(inputs[0], [w for pair in zip(before, after) for w in pair], "constant", value)

    class Importer(ONNXGraphImporter):
        tvmsched_node: onnx.NodeProto | None = None

        def _sanitize_name(self, name: str) -> str:
            """An input's variable name: a C identifier. TVM's own replaces only dots, and a name such as ResNet-50's
            "gpu_0/data_0" reaches the CUDA source as a kernel parameter (the cast of an fp16 model's input), which
            nvcc refuses. The artifact keeps the ONNX names (input_signature_names), bound by position."""
            return super()._sanitize_name(re.sub(r"\W", "_", name, flags=re.ASCII) if name else name)

        def _convert_operator(self, op_name, inputs, attrs, opset):
            mode = attrs.get("mode", "constant")
            if relax_pads and op_name == "Pad" and opset >= 11 and mode in ("constant", b"constant"):
                padded = relax_pad(inputs, [self._nodes, self._params])
                if padded is not None:
                    return self.bb.normalize(padded)
            if mixed_precision and op_name == "Einsum":
                product = einsum_as_matmul(attrs.get("equation", b""), inputs)
                if product is not None:
                    return self.bb.normalize(product)
            return super()._convert_operator(op_name, inputs, attrs, opset)

        def _parse_value_proto(self, value_proto):  # called once per node, before its conversion
            if isinstance(value_proto, onnx.NodeProto):
                self.tvmsched_node = value_proto
            return super()._parse_value_proto(value_proto)

        def _construct_nodes(self, graph):
            super()._construct_nodes(graph)
            self.tvmsched_node = None  # what fails after the last node is the model's, not that node's

    return Importer(keep_params_in_input=False, sanitize=True, **options)


def einsum_as_matmul(equation: str | bytes, inputs):
    """A two-operand Einsum that is a (batched) matrix product, as Relax's permute_dims, reshape and matmul: letters in
    both operands and the output are the batch, in both operands only the contraction, in one operand and the output
    that operand's rows or columns. None for any other form (an ellipsis, a repeated letter, a letter summed in one
    operand alone, more or fewer operands, shapes not static): TVM's converter (a TIR kernel of TE's einsum) then.

    With --precision fp16 the product is then a matmul that TVM's mixed-precision pass computes in fp16 with fp32
    accumulation (tensor cores on CUDA), where the TIR kernel would stay in fp32 (tvmsched.lower.precision)."""
    from tvm import relax, tirx

    text = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    if len(inputs) != 2 or "." in text or text.count("->") != 1:
        return None
    operands, out = text.split("->")
    parts = operands.split(",")
    if len(parts) != 2 or not all(p.isalpha() for p in (*parts, out) if p):
        return None
    a, b = parts
    if any(len(set(word)) != len(word) for word in (a, b, out)) or not set(out) <= set(a) | set(b):
        return None
    if (set(a) ^ set(b)) - set(out):  # a letter summed in one operand alone
        return None
    dims: dict[str, int] = {}  # each letter's extent (a letter in both operands has one: else not a matrix product)
    for value, word in zip(inputs, (a, b)):
        shape = getattr(getattr(value, "ty", None), "shape", None)
        if shape is None or len(shape) != len(word) or not all(isinstance(d, tirx.IntImm) for d in shape):
            return None
        for letter, d in zip(word, shape):
            if dims.setdefault(letter, int(d)) != int(d):
                return None
    batch = [c for c in out if c in a and c in b]
    rows, cols = [c for c in out if c in a and c not in b], [c for c in out if c in b and c not in a]
    inner = [c for c in a if c in b and c not in out]

    def arranged(value, word, order, groups):  # permuted to `order`, then (batch, *groups) each flattened to one axis
        if list(word) != order:
            value = relax.op.permute_dims(value, [word.index(c) for c in order])
        return relax.op.reshape(value, [math.prod(dims[c] for c in group) for group in (batch, *groups)])

    product = relax.op.matmul(arranged(inputs[0], a, batch + rows + inner, (rows, inner)),
                              arranged(inputs[1], b, batch + inner + cols, (inner, cols)))
    order = batch + rows + cols
    product = relax.op.reshape(product, [dims[c] for c in order])
    return product if order == list(out) else relax.op.permute_dims(product, [order.index(c) for c in out])


def parse_input_shapes(values: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--input-shape name=1,3,224,224` options."""
    shapes = {}
    for value in values:
        name, sep, dims = value.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise TvmschedError(f"--input-shape {value!r} is not of the form NAME=D1,D2,... with positive dims")
        shapes[name] = shape
    return shapes

