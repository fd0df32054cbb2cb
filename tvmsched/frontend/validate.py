"""Strict validation of an ONNX model before import: what onnxruntime rejects, tvmsched must not compile.

TVM's Relax importer trusts its input: it converts invalid models (negative Conv pads, an int32
Reshape shape, Split sizes that do not add up, a Pad that crops past the tensor, ...) into
*something*, and the artifact then computes garbage or reads out of bounds. `check_model` refuses
them with one line naming the node and the problem:

1. structure: at least one graph output; a default-domain opset in the supported range;
2. explicit checks on shapes and types inferred (with data propagation) from the inputs and
   constants alone: input types against the op schema, Conv kernel_shape against the weight,
   BatchNormalization parameters against the channel count, Pad against the tensor it crops,
   no negative dimension anywhere, declared graph outputs against what the model computes;
3. `onnx.checker.check_model(full_check=True)` and strict shape inference with data propagation
   (`check_type`, `strict_mode`, `data_prop`), for everything else ONNX itself knows is invalid.

`check_tensor_sizes` refuses a model whose tensors need more memory than there is where they live:
constants computed at compile time (ConstantOfShape, Expand, Tile of constants, ...) on this
machine, the rest on the device the artifact runs on, and no tensor over what the engine allocates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvmsched.errors import TvmschedError, one_line

# TVM's Relax converters implement the semantics of opset 7 on (numpy-style broadcasting); for an
# older opset they fall back to their oldest converter and ignore legacy attributes (Add-1..6's
# `broadcast`/`axis`, BatchNormalization-1..6's `spatial`, Reshape-1..4's `shape` attribute): a
# silent mis-conversion. onnxruntime too guarantees only opset 7 and newer.
MIN_OPSET = 7
# The runtime engine refuses an artifact with a tensor over 1 TiB (runtime/native/src/artifact.cc, CheckInvariants).
ENGINE_MAX_TENSOR_BYTES = 1 << 40


def supported_opsets() -> tuple[int, int]:
    """(oldest, newest) default-domain opset tvmsched compiles.

    The newest is the installed onnx's: the checker and shape inference know every op up to it, and
    TVM's importer converts newer opsets than its newest converters (opset 23 in TVM 0.27) with those
    (the later op versions extend types); an opset beyond onnx's is one nothing here can check.
    """
    return MIN_OPSET, onnx.defs.onnx_opset_version()


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def check_model(model: onnx.ModelProto) -> None:
    """Raise a one-line TvmschedError if the model is invalid ONNX (see the module doc)."""
    if not model.graph.output:
        raise TvmschedError("the model declares no graph outputs (an ONNX graph needs at least one)")
    opset = default_opset(model)
    low, high = supported_opsets()
    if opset is not None and not low <= opset <= high:
        raise TvmschedError(
            f"the model uses ONNX opset {opset} (default domain); supported opsets are {low} to {high} "
            f"(TVM's Relax ONNX importer converts opset {low} and newer; onnx {onnx.__version__} defines up to {high})"
        )
    for full_check in (False, True):  # the structure first: the explicit checks rely on it
        try:
            onnx.checker.check_model(model, full_check=full_check)
        except Exception as err:  # ValidationError, InferenceError
            raise TvmschedError(f"the model fails the ONNX checker: {_onnx_message(err)}") from None
        if not full_check:
            _explicit_checks(model, Facts.of(model, strip_outputs=True))
    try:
        onnx.shape_inference.infer_shapes(_without_weights(model), check_type=True, strict_mode=True, data_prop=True)
    except Exception as err:
        raise TvmschedError(f"the model fails ONNX shape inference: {_onnx_message(err)}") from None


def check_tensor_sizes(model: onnx.ModelProto, signature: dict, tvm_target=None) -> None:
    """Refuse a tensor that needs more memory than where it lives (see the module doc).

    Args:
        signature: input name -> (static shape, dtype), --input-shape overrides applied.
        tvm_target: the compile target (its device's memory bounds the run-time tensors).
    """
    facts = Facts.of(model, strip_outputs=True, signature=signature)
    host, host_name = host_memory_bytes(), "this machine's memory"
    device, device_name = _device_memory(tvm_target)
    constant = facts.compile_time_tensors()
    for name, (elem, dims) in facts.types.items():
        nbytes = _nbytes(elem, dims)
        if nbytes is None:
            continue
        limits = [(ENGINE_MAX_TENSOR_BYTES, "the 1 TiB per tensor the tvmsched engine allocates")]
        if name in constant:
            limits.append((host, host_name))
        if device is not None:
            limits.append((device, device_name))
        limit, where = min(limits)
        if nbytes > limit:
            what = facts.describe(name, constant)
            raise TvmschedError(
                f"tensor {name!r} ({what}, {_dtype_name(elem)}{list(dims)}) needs {nbytes} bytes ({_human(nbytes)}), "
                f"more than {where} ({limit} bytes)"
            )


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _device_memory(tvm_target) -> tuple[int | None, str]:
    from tvmsched.lower.targets import describe

    info = describe(tvm_target) if tvm_target is not None else None
    if info is None or info.cpu:
        return host_memory_bytes(), "this machine's memory"
    kind = info.kind
    try:
        import tvm

        device = tvm.device(kind, 0)
        total = int(device.total_global_memory or 0) if device.exist else 0
        if total > 0:
            return total, f"the memory of {kind} device 0 ({device.device_name})"
    except Exception:  # no such device here (compiled for a device machine): the engine checks at load
        pass
    return None, ""


@dataclass
class Facts:
    """What inference (non-strict, with data propagation) says about every tensor of a model."""

    model: onnx.ModelProto  # inferred; the large initializers as graph inputs of their type (no data)
    opset: int
    types: dict  # tensor name -> (elem type, dims: list of int or None (unknown)) or (elem type, None) (no shape)
    constants: dict  # tensor name -> TensorProto (initializers, Constant node values)
    producers: dict  # tensor name -> (index, node)
    initializers: frozenset = frozenset()  # the initializers' names

    @classmethod
    def of(cls, model: onnx.ModelProto, *, strip_outputs: bool, signature: dict | None = None) -> Facts:
        """Inference on a copy without the weights, its graph inputs fixed to `signature`'s shapes if given."""
        probe = _without_weights(model, signature)
        if strip_outputs:  # infer outputs from the inputs alone, to compare with what is declared
            for value in probe.graph.output:
                value.ClearField("type")
        try:
            probe = onnx.shape_inference.infer_shapes(probe, data_prop=True)
        except Exception:  # non-strict inference still raises on some broken models: the strict pass reports them
            pass
        types = {}
        for value in (*probe.graph.input, *probe.graph.value_info, *probe.graph.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types[value.name] = (value.type.tensor_type.elem_type, _dims(value.type.tensor_type))
        constants = {}
        for init in model.graph.initializer:
            types[init.name] = (init.data_type, list(init.dims))
            constants[init.name] = init
        producers = {}
        for index, node in enumerate(probe.graph.node):
            for out in node.output:
                producers[out] = (index, node)
            if node.op_type == "Constant" and node.output and node.domain in ("", "ai.onnx"):
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    constants[node.output[0]] = value
        return cls(probe, default_opset(probe) or 1, types, constants, producers,
                   frozenset(init.name for init in model.graph.initializer))

    def shape(self, name: str) -> list | None:
        return self.types.get(name, (0, None))[1]

    def constant(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        if tensor is None:
            return None
        try:
            return numpy_helper.to_array(tensor)
        except Exception:
            return None

    def compile_time_tensors(self) -> set[str]:
        """Tensors computed from constants only: TVM folds them at compile time, on this machine."""
        known = set(self.constants)
        for node in self.model.graph.node:
            if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute) and all(
                name in known for name in node.input if name
            ) and not node.op_type.startswith("Random"):
                known.update(name for name in node.output if name)
        return known

    def describe(self, name: str, constant: set[str]) -> str:
        if name in self.initializers:
            return "an initializer"
        if name in {v.name for v in self.model.graph.input}:
            return "a graph input"
        index, node = self.producers.get(name, (None, None))
        where = f"{node.op_type} node {_node_name(node, index)}" if node is not None else "a node"
        return f"computed at compile time by {where}" if name in constant else f"the output of {where}"


SHOWN_ELEMENTS = 4096  # initializers up to this size are given to shape inference with their values


def _without_weights(model: onnx.ModelProto, signature: dict | None = None) -> onnx.ModelProto:
    """A copy for shape inference: the initializers above SHOWN_ELEMENTS become graph inputs of their type and
    shape (inference needs the values of shape-like tensors only), no value_info; the graph inputs fixed to
    `signature`'s shapes. Copying and serializing a model's weights cost most of a compile's validation
    (BERT-base: 2-3 s each time)."""
    probe = model_shell(model)
    graph = model.graph
    probe.graph.node.extend(graph.node)
    probe.graph.input.extend(fixed_input(value, signature or {}) for value in graph.input)
    listed = {v.name for v in graph.input}
    for init in graph.initializer:
        if math.prod(init.dims) <= SHOWN_ELEMENTS:
            probe.graph.initializer.append(init)
        elif init.name not in listed:
            probe.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return probe


def _explicit_checks(model: onnx.ModelProto, facts: Facts) -> None:
    """Checks with clearer messages than strict inference's, and some it does not make."""
    for init in model.graph.initializer:
        _check_initializer(init)
    for index, node in enumerate(facts.model.graph.node):
        if node.domain not in ("", "ai.onnx") or not node.input:
            continue
        where = f"{node.op_type} node {_node_name(node, index)}"
        _check_input_types(node, where, facts)
        if node.op_type in ("Conv", "ConvTranspose"):
            _check_conv(node, where, facts)
        elif node.op_type == "BatchNormalization":
            _check_batchnorm(node, where, facts)
        elif node.op_type == "Pad":
            _check_pad(node, where, facts)
        elif node.op_type == "PRelu":
            _check_prelu(node, where, facts)
        for out in node.output:
            dims = facts.shape(out) if out else None
            if dims and any(d is not None and d < 0 for d in dims):
                raise TvmschedError(f"{where}: its output {out!r} would have the negative shape {_shown(dims)}")
    declared = {value.name: value for value in model.graph.output}
    for name, value in declared.items():
        tensor_type = value.type.tensor_type
        computed = facts.types.get(name)
        if computed is None or not value.type.HasField("tensor_type"):
            continue
        elem, dims = computed
        if tensor_type.elem_type and elem and tensor_type.elem_type != elem:
            raise TvmschedError(
                f"graph output {name!r} is declared {_dtype_name(tensor_type.elem_type)} but the model computes "
                f"{_dtype_name(elem)} there"
            )
        want = _dims(tensor_type)
        if want is not None and dims is not None and (
            len(want) != len(dims) or any(a is not None and b is not None and a != b for a, b in zip(want, dims))
        ):
            raise TvmschedError(f"graph output {name!r} is declared with shape {_shown(want)} but the model computes {_shown(dims)}")


def _check_initializer(init: onnx.TensorProto) -> None:
    """The data an initializer holds fits its dims (the checker does not look)."""
    from onnx import numpy_helper

    try:
        numpy_helper.to_array(init)
    except Exception as err:  # noqa: BLE001 - onnx raises ValueError/TypeError for data that does not fit
        raise TvmschedError(f"initializer {init.name!r} (dims {list(init.dims)}) does not hold data of that shape: "
                            f"{_onnx_message(err)}") from None


def _check_input_types(node: onnx.NodeProto, where: str, facts: Facts) -> None:
    """Every input's element type must be one the op's schema allows at that position."""
    try:
        schema = onnx.defs.get_schema(node.op_type, facts.opset, node.domain)
    except Exception:  # unknown op: check_supported_ops names it
        return
    if not schema.inputs:
        return
    allowed_by_param = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for position, name in enumerate(node.input):
        if not name or name not in facts.types:
            continue
        formal = schema.inputs[min(position, len(schema.inputs) - 1)]
        allowed = allowed_by_param.get(formal.type_str, {formal.type_str})
        tensors = {t for t in allowed if t.startswith("tensor(")}
        actual = f"tensor({_dtype_name(facts.types[name][0], onnx_style=True)})"
        if tensors and actual not in tensors:
            shown = sorted(tensors)
            options = shown[0] if len(shown) == 1 else "one of " + ", ".join(shown[:6]) + (", ..." if len(shown) > 6 else "")
            shown_name = repr(formal.name) if formal.name == name else f"{formal.name!r} ({name!r})"
            raise TvmschedError(
                f"{where}: input {shown_name} is {actual}, but {node.op_type}-{schema.since_version} takes {options}"
            )


def _check_conv(node: onnx.NodeProto, where: str, facts: Facts) -> None:
    kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), None)
    weight = facts.shape(node.input[1]) if len(node.input) > 1 else None
    if kernel is None or weight is None or any(d is None for d in weight[2:]):
        return
    if kernel != weight[2:]:
        raise TvmschedError(
            f"{where}: kernel_shape {kernel} does not match the weight {node.input[1]!r} of shape {_shown(weight)} "
            f"(kernel {weight[2:]})"
        )


def _check_batchnorm(node: onnx.NodeProto, where: str, facts: Facts) -> None:
    x = facts.shape(node.input[0])
    channels = x[1] if x and len(x) > 1 else None
    for role, name in zip(("scale", "B", "input_mean", "input_var"), node.input[1:5]):
        dims = facts.shape(name) if name else None
        if dims is None or channels is None or any(d is None for d in dims):
            continue
        if dims != [channels]:
            raise TvmschedError(
                f"{where}: {role} {name!r} has shape {_shown(dims)} but its input {node.input[0]!r} has {channels} channels "
                "(scale, B, mean and var need one value per channel)"
            )


def per_channel_prelu(x: list | None, slope: list | None) -> bool:
    """A PRelu slope of shape [C] meant per channel of an input of rank >= 3 (onnx_rewrites.upgrade_legacy_forms
    rewrites it to [C, 1, ...])."""
    return (x is not None and slope is not None and len(x) >= 3 and len(slope) == 1 and slope[0] not in (1, None)
            and x[1] == slope[0] and x[-1] != slope[0])


def _check_prelu(node: onnx.NodeProto, where: str, facts: Facts) -> None:
    """The slope broadcasts against the input by ONNX's rule, or is the per-channel form old exporters wrote
    (onnx_rewrites.upgrade_legacy_forms applies it per channel); TVM's lowering asserts on anything else."""
    if len(node.input) < 2:
        return
    x, slope = facts.shape(node.input[0]), facts.shape(node.input[1])
    if x is None or slope is None or _broadcasts(slope, x) or per_channel_prelu(x, slope):
        return
    raise TvmschedError(
        f"{where}: its slope {node.input[1]!r} of shape {_shown(slope)} does not broadcast against its input "
        f"{node.input[0]!r} of shape {_shown(x)} (ONNX aligns the slope with the input's last axes)"
    )


def _broadcasts(small: list, big: list) -> bool:
    """`small` broadcasts to `big` by ONNX's unidirectional rule (unknown dims are given the benefit of the doubt)."""
    if len(small) > len(big):
        return False
    return all(s in (1, None) or b is None or s == b for s, b in zip(reversed(small), reversed(big)))


def _check_pad(node: onnx.NodeProto, where: str, facts: Facts) -> None:
    x = facts.shape(node.input[0])
    if facts.opset < 11:
        pads = next((list(a.ints) for a in node.attribute if a.name in ("pads", "paddings")), None)
    else:
        pads = facts.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if x is None or pads is None:
        return
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = list(range(len(x)))
    if facts.opset >= 18 and len(node.input) > 3 and node.input[3]:
        given = facts.constant(node.input[3])
        if given is None:
            return
        axes = [int(a) % len(x) if len(x) else int(a) for a in np.asarray(given).reshape(-1)]
    if len(pads) != 2 * len(axes):
        return  # strict inference reports the length
    for k, axis in enumerate(axes):
        begin, end, dim = pads[k], pads[k + len(axes)], x[axis]
        if dim is not None and dim + begin + end < 0:
            raise TvmschedError(
                f"{where}: pads {begin} and {end} on axis {axis} crop more than the {dim} elements of {node.input[0]!r} "
                f"(the result would have {dim + begin + end})"
            )


def fixed_input(value: onnx.ValueInfoProto, signature: dict) -> onnx.ValueInfoProto:
    """A copy of a graph input with the static shape `signature` (name -> (shape, dtype)) gives it, if any."""
    fixed = onnx.ValueInfoProto()
    fixed.CopyFrom(value)
    if value.name in signature and value.type.HasField("tensor_type"):
        shape = fixed.type.tensor_type.shape
        shape.ClearField("dim")
        for d in signature[value.name][0]:
            shape.dim.add().dim_value = int(d)
    return fixed


def model_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose graph has no nodes, initializers, inputs or value_info (the weights of a large
    model are not copied only to be replaced)."""
    shell = onnx.ModelProto()
    _copy_fields(model, shell, skip=("graph",))
    _copy_fields(model.graph, shell.graph, skip=("node", "initializer", "input", "value_info"))
    return shell


def _copy_fields(source, target, skip: tuple[str, ...]) -> None:
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


_ONNX_NODE = re.compile(r"\(op_type:([^,)]+)(?:, node name: ([^)]*))?\):\s*(?:\[\w+\]\s*)?(.*)")


def _onnx_message(err: BaseException) -> str:
    """ONNX's message as one line: 'Op node NAME: what' when it names a node."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    match = _ONNX_NODE.search(text)
    if not match:
        return one_line(err)
    op, name, detail = match.groups()
    detail = re.sub(r"^\[\w+\]\s*", "", detail.strip())
    detail = re.sub(
        r"Inferred elem type differs from existing elem type: \((\d+)\) vs \((\d+)\)",
        lambda m: f"computes {_dtype_name(int(m.group(1)))} where {_dtype_name(int(m.group(2)))} is declared",
        detail,
    )
    return f"{op} node {name!r}: {detail}" if name else f"{op} node: {detail}"


def _node_name(node: onnx.NodeProto, index: int | None) -> str:
    return repr(node.name) if node.name else f"'#{index}'"


def _dims(tensor_type) -> list | None:
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]


def _shown(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _nbytes(elem: int, dims: list | None) -> int | None:
    if dims is None or any(d is None or d < 0 for d in dims):
        return None
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(elem).itemsize
    except Exception:  # strings, undefined
        return None
    count = 1
    for d in dims:
        count *= int(d)
    return count * itemsize


def _dtype_name(elem: int, onnx_style: bool = False) -> str:
    try:
        name = TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return f"type {elem}"
    if onnx_style:
        return name
    return {"float": "float32", "double": "float64"}.get(name, name)


def _human(nbytes: int) -> str:
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"
