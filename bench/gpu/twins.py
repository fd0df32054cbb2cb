"""PyTorch twins of ONNX models: an `nn.Module` built from an ONNX graph and its initializers.

The GPU suite (bench/gpu/suite.py) times tvmsched against PyTorch on the same architecture, shapes and
weights: the twin runs one PyTorch op per ONNX node, as a hand-written PyTorch model would (a
convolution, then its batch norm, then its ReLU: batch norms are not folded), with two exceptions that
hand-written models have too: a MatMul by a constant matrix (plus the Add of a constant bias that alone
consumes it) is one `F.linear`, as `nn.Linear` is, and the erf form of GELU is one `F.gelu`. Eager
mode, CUDA-graph capture and `torch.compile` all run the same module.

    model = onnx.load("m.onnx")
    twin = build_twin(model, input_shapes={"x": (1, 3, 224, 224)}).eval().to("cuda")
    outputs = twin(*tensors)  # graph inputs in ONNX order; a tuple in graph-output order

Before the graph is read, its shape arithmetic (dynamic-axes exports: Shape -> Gather -> Concat ->
Reshape, ...) is folded with the input shapes fixed (tvmsched.frontend.fold, what onnxruntime's basic
optimizer does too); weights are untouched. Ops used by the zoo and the real models the suite carries
are covered (`SUPPORTED`); any other op raises `TwinError` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import nn

__all__ = ["SUPPORTED", "Twin", "TwinError", "build_twin", "fold_shapes"]


class TwinError(RuntimeError):
    """The ONNX graph uses something the twin builder does not cover."""


_DTYPES = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32, onnx.TensorProto.INT16: torch.int16,
    onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool,
}


def fold_shapes(model: onnx.ModelProto, input_shapes: dict | None = None) -> onnx.ModelProto:
    """The model with its compile-time shape arithmetic folded (input shapes fixed), weights untouched."""
    from tvmsched.frontend import loader as frontend
    from tvmsched.frontend.fold import fold_constants

    return fold_constants(model, frontend.input_signature(model, input_shapes))


def build_twin(model: onnx.ModelProto, input_shapes: dict | None = None) -> Twin:
    """A PyTorch module computing `model` (see the module docstring); `input_shapes` fixes dynamic inputs."""
    return Twin(fold_shapes(model, input_shapes))


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _pair_pads(pads, rank: int):
    """ONNX pads (all begins, then all ends) as (symmetric padding per axis, or None, F.pad list)."""
    pads = list(pads or [0] * (2 * rank))
    begins, ends = pads[:rank], pads[rank:]
    if begins == ends:
        return tuple(begins), None
    flat = []
    for b, e in zip(reversed(begins), reversed(ends)):  # F.pad: last axis first
        flat += [b, e]
    return (0,) * rank, flat


class Twin(nn.Module):
    """One model: initializers as buffers, nodes as steps (built by `build_twin`)."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        graph = model.graph
        self.opset = _opset(model)
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [v.name for v in graph.input if v.name not in inits]
        self.output_names = [v.name for v in graph.output]
        self._consts: dict[str, np.ndarray] = dict(inits)  # values known at build time
        self._buffers_of: dict[int, tuple] = {}
        self._steps: list[tuple[Callable, list, list[str]]] = []
        nodes = list(graph.node)
        self._consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in nodes:
            for name in node.input:
                self._consumers.setdefault(name, []).append(node)
        self._producers = {out: node for node in nodes for out in node.output if out}
        self._graph_outputs = set(self.output_names)
        skip: set[int] = set()  # nodes a fused step already computes
        index_of = {id(n): i for i, n in enumerate(nodes)}
        for i, node in enumerate(nodes):
            if i in skip:
                continue
            if node.domain not in ("", "ai.onnx"):
                raise TwinError(f"no PyTorch twin for op {node.op_type} (domain {node.domain})")
            if node.op_type == "Constant":
                self._consts[node.output[0]] = _constant_value(node)
                continue
            fused = self._fuse(node)
            if fused is not None:
                covered, step = fused
                skip.update(index_of[id(n)] for n in covered)
                self._steps.append(step)
                continue
            handler = _HANDLERS.get(node.op_type)
            if handler is None:
                raise TwinError(f"no PyTorch twin for op {node.op_type} (node {node.name or node.output[0]!r})")
            self._steps.append(handler(self, node, _attrs(node)))
        self._frees = self._plan_frees()
        self._buffers_of = self._consts = self._consumers = self._producers = None  # build-time only

    # -- references to values -------------------------------------------------------------------------

    def ref(self, name: str):
        """A step input: a graph value, a buffer (constant tensor) or None (an omitted optional input)."""
        if not name:
            return (2, None)
        if name in self._consts:
            return (1, self.buffer(self._consts[name]))
        return (0, name)

    def buffer(self, value: np.ndarray) -> str:
        """The buffer holding `value` (one per array object: a weight two nodes read is stored once)."""
        key = id(value)
        if key not in self._buffers_of:
            attr = f"c{len(self._buffers_of)}"
            array = np.ascontiguousarray(value)
            self.register_buffer(attr, torch.from_numpy(array.copy()) if array.size else torch.empty(array.shape, dtype=_torch_dtype(array)))
            self._buffers_of[key] = (value, attr)  # the array kept alive while building: its id stays unique
        return self._buffers_of[key][1]

    def const(self, name: str) -> np.ndarray | None:
        return self._consts.get(name) if name else None

    def scalar_or_ref(self, name: str, other_rank: int | None = None):
        """A one-element float constant as a Python float (no tensor read on the device), else `ref`."""
        value = self.const(name)
        if value is not None and value.size == 1 and value.dtype.kind == "f" and other_rank is not None \
                and value.ndim <= other_rank:
            return (2, float(value.reshape(())))
        return self.ref(name)

    def sole_consumer(self, name: str) -> onnx.NodeProto | None:
        users = self._consumers.get(name, [])
        if len(users) == 1 and name not in self._graph_outputs:
            return users[0]
        return None

    # -- fusions as hand-written PyTorch models have them ---------------------------------------------

    def _fuse(self, node: onnx.NodeProto):
        if node.op_type == "MatMul":
            return self._fuse_linear(node)
        if node.op_type == "Erf":
            return self._fuse_gelu(node)
        return None

    def _fuse_linear(self, node: onnx.NodeProto):
        weight = self.const(node.input[1])
        if weight is None or weight.ndim != 2 or weight.dtype.kind != "f" or node.input[0] in self._consts:
            return None
        transposed = np.ascontiguousarray(weight.T)  # nn.Linear's [out, in] layout
        add, bias = self.sole_consumer(node.output[0]), None
        if add is not None and add.op_type == "Add":
            other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            value = self.const(other)
            if value is not None and value.ndim == 1 and value.shape[0] == weight.shape[1] and add.input[0] != add.input[1]:
                bias = value
        ins = [(0, node.input[0]), (1, self.buffer(transposed))]
        if bias is None:
            return [node], (F.linear, ins, [node.output[0]])
        return [node, add], (F.linear, ins + [(1, self.buffer(bias))], [add.output[0]])

    def _fuse_gelu(self, erf: onnx.NodeProto):
        """x * 0.5 * (1 + erf(x / sqrt(2))) in the orders exporters write it -> F.gelu(x)."""
        scale = self._producer(erf.input[0])
        if scale is None or scale.op_type not in ("Div", "Mul"):
            return None
        factor = self.const(scale.input[1])
        want = math.sqrt(2.0) if scale.op_type == "Div" else 1 / math.sqrt(2.0)
        if factor is None or factor.size != 1 or not math.isclose(float(factor.reshape(())), want, rel_tol=1e-6):
            return None
        x = scale.input[0]
        add = self.sole_consumer(erf.output[0])
        if self.sole_consumer(scale.output[0]) is not erf or add is None or add.op_type != "Add" or not self._is_one(add, erf.output[0]):
            return None
        mul = self.sole_consumer(add.output[0])
        if mul is None or mul.op_type != "Mul":
            return None
        other = mul.input[1] if mul.input[0] == add.output[0] else mul.input[0]
        if other == x:  # (x * (1 + erf)) * 0.5
            half = self.sole_consumer(mul.output[0])
            if half is not None and half.op_type == "Mul" and self._is_half(half, mul.output[0]):
                return [scale, erf, add, mul, half], (F.gelu, [(0, x)], [half.output[0]])
            return None
        producer = self._producer(other)  # (x * 0.5) * (1 + erf)
        if producer is not None and producer.op_type == "Mul" and x in producer.input and self._is_half(producer, x) \
                and self.sole_consumer(producer.output[0]) is mul:
            return [scale, erf, add, producer, mul], (F.gelu, [(0, x)], [mul.output[0]])
        return None

    def _producer(self, name: str) -> onnx.NodeProto | None:
        return self._producers.get(name)

    def _is_one(self, node: onnx.NodeProto, other: str) -> bool:
        value = self.const(node.input[1] if node.input[0] == other else node.input[0])
        return value is not None and value.size == 1 and float(value.reshape(())) == 1.0

    def _is_half(self, node: onnx.NodeProto, other: str) -> bool:
        value = self.const(node.input[1] if node.input[0] == other else node.input[0])
        return value is not None and value.size == 1 and float(value.reshape(())) == 0.5

    # -- running ---------------------------------------------------------------------------------------

    def _plan_frees(self) -> list[list[str]]:
        last: dict[str, int] = {}
        for i, (_, ins, _) in enumerate(self._steps):
            for kind, name in ins:
                if kind == 0:
                    last[name] = i
        frees = [[] for _ in self._steps]
        for name, i in last.items():
            if name not in self._graph_outputs:
                frees[i].append(name)
        return frees

    def forward(self, *args):
        if len(args) != len(self.input_names):
            raise TypeError(f"the twin takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), got {len(args)}")
        env = dict(zip(self.input_names, args))
        for (fn, ins, outs), frees in zip(self._steps, self._frees):
            values = [env[r] if k == 0 else (getattr(self, r) if k == 1 else r) for k, r in ins]
            result = fn(*values)
            if len(outs) == 1:
                env[outs[0]] = result
            else:
                for name, value in zip(outs, result):
                    env[name] = value
            for name in frees:
                del env[name]
        return tuple(env[name] for name in self.output_names)


def _torch_dtype(array: np.ndarray):
    return torch.from_numpy(np.zeros(1, dtype=array.dtype)).dtype


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    value = helper.get_attribute_value(attr)
    if attr.name == "value_float":
        return np.array(value, dtype=np.float32)
    if attr.name == "value_floats":
        return np.array(list(value), dtype=np.float32)
    if attr.name == "value_int":
        return np.array(value, dtype=np.int64)
    if attr.name == "value_ints":
        return np.array(list(value), dtype=np.int64)
    raise TwinError(f"Constant with attribute {attr.name} is not supported")


def _static_ints(twin: Twin, node: onnx.NodeProto, index: int, what: str) -> list[int] | None:
    """A constant integer input (shape, axes, ...) as a list; None when the input is omitted."""
    if len(node.input) <= index or not node.input[index]:
        return None
    value = twin.const(node.input[index])
    if value is None:
        raise TwinError(f"{node.op_type} node {node.name or node.output[0]!r}: its {what} are computed at run time")
    return [int(v) for v in value.reshape(-1)]


# --------------------------------------------------------------------------------------------------
# one handler per ONNX op: (twin, node, attributes) -> (fn, input refs, output names)

def _unary(fn):
    return lambda twin, node, a: (fn, [twin.ref(node.input[0])], [node.output[0]])


def _binary(fn):
    def handler(twin, node, a):
        left, right = node.input[0], node.input[1]
        if twin.const(left) is not None and twin.const(right) is None:
            return (fn, [twin.ref(left), twin.ref(right)], [node.output[0]])
        return (fn, [twin.ref(left), twin.scalar_or_ref(right, other_rank=_rank_hint(twin, left))], [node.output[0]])

    return handler


def _rank_hint(twin: Twin, name: str) -> int | None:
    """A graph value's rank is unknown here; a Python scalar broadcasts like a 0-d tensor, which is
    right whenever the constant is 0-d or [1] against a value of rank >= 1 (all activations)."""
    value = twin.const(name)
    return value.ndim if value is not None else 1


def _div(a, b):
    if isinstance(a, torch.Tensor) and not a.is_floating_point() and (not isinstance(b, torch.Tensor) or not b.is_floating_point()):
        return torch.div(a, b, rounding_mode="trunc")
    return a / b


def _sum(twin, node, a):
    def add_all(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    return (add_all, [twin.ref(n) for n in node.input], [node.output[0]])


def _conv(twin, node, a):
    weight = twin.const(node.input[1])
    rank = weight.ndim - 2 if weight is not None else len(a["kernel_shape"])
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise TwinError(f"Conv auto_pad={a['auto_pad']!r} is not supported")
    padding, pad = _pair_pads(a.get("pads"), rank)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    strides, dilations, groups = tuple(a.get("strides", [1] * rank)), tuple(a.get("dilations", [1] * rank)), a.get("group", 1)

    def run(x, w, b=None):
        if pad is not None:
            x = F.pad(x, pad)
        return conv(x, w, b, strides, padding, dilations, groups)

    ins = [twin.ref(node.input[0]), twin.ref(node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        ins.append(twin.ref(node.input[2]))
    return (run, ins, [node.output[0]])


def _batch_norm(twin, node, a):
    if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        raise TwinError("BatchNormalization in training mode is not supported")
    eps = float(a.get("epsilon", 1e-5))

    def run(x, scale, bias, mean, var):
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)

    return (run, [twin.ref(n) for n in node.input[:5]], [node.output[0]])


def _pool(kind):
    def handler(twin, node, a):
        kernel = tuple(a["kernel_shape"])
        rank = len(kernel)
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            raise TwinError(f"{node.op_type} auto_pad={a['auto_pad']!r} is not supported")
        strides = tuple(a.get("strides", [1] * rank))
        padding, pad = _pair_pads(a.get("pads"), rank)
        ceil = bool(a.get("ceil_mode", 0))
        if kind == "max":
            dilations = tuple(a.get("dilations", [1] * rank))
            pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]

            def run(x):
                if pad is not None:
                    x = F.pad(x, pad, value=float("-inf"))
                return pool(x, kernel, strides, padding, dilations, ceil)
        else:
            if pad is not None:
                raise TwinError("AveragePool with asymmetric pads is not supported")
            include = bool(a.get("count_include_pad", 0))
            pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank]

            def run(x):
                return pool(x, kernel, strides, padding, ceil, include)
        if len([o for o in node.output if o]) > 1:
            raise TwinError("MaxPool's Indices output is not supported")
        return (run, [twin.ref(node.input[0])], [node.output[0]])

    return handler


def _global_average_pool(twin, node, a):
    def run(x):
        if x.dim() == 4:
            return F.adaptive_avg_pool2d(x, 1)
        return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _global_max_pool(twin, node, a):
    return (lambda x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True), [twin.ref(node.input[0])], [node.output[0]])


def _gemm(twin, node, a):
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    trans_a, trans_b = int(a.get("transA", 0)), int(a.get("transB", 0))
    b = twin.const(node.input[1])
    c = twin.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    has_c = len(node.input) > 2 and bool(node.input[2])
    if b is not None and alpha == 1.0 and (not has_c or (beta == 1.0 and c is not None and c.size == (b.shape[0] if trans_b else b.shape[1]))):
        weight = b if trans_b else np.ascontiguousarray(b.T)  # [out, in]
        ins = [twin.ref(node.input[0]), (1, twin.buffer(weight))]
        if has_c:
            ins.append((1, twin.buffer(np.ascontiguousarray(c.reshape(-1)))))
        fn = (lambda x, w, bias=None: F.linear(x.t(), w, bias)) if trans_a else F.linear
        return (fn, ins, [node.output[0]])

    def run(x, w, bias=None):
        x = x.t() if trans_a else x
        w = w.t() if trans_b else w
        if bias is None:
            return alpha * (x @ w)
        return torch.addmm(bias, x, w, beta=beta, alpha=alpha)

    ins = [twin.ref(node.input[0]), twin.ref(node.input[1])] + ([twin.ref(node.input[2])] if has_c else [])
    return (run, ins, [node.output[0]])


def _matmul(twin, node, a):
    return (torch.matmul, [twin.ref(node.input[0]), twin.ref(node.input[1])], [node.output[0]])


def _softmax_like(kind):
    def handler(twin, node, a):
        fn = torch.softmax if kind == "softmax" else torch.log_softmax
        if twin.opset >= 13:
            axis = int(a.get("axis", -1))
            return (lambda x: fn(x, axis), [twin.ref(node.input[0])], [node.output[0]])
        axis = int(a.get("axis", 1))  # before opset 13: the input flattened to 2-D at `axis`

        def run(x):
            ax = axis % x.dim()
            if ax == x.dim() - 1:
                return fn(x, -1)
            shape = x.shape
            return fn(x.reshape(math.prod(shape[:ax]), -1), 1).reshape(shape)

        return (run, [twin.ref(node.input[0])], [node.output[0]])

    return handler


def _layer_norm(twin, node, a):
    axis, eps = int(a.get("axis", -1)), float(a.get("epsilon", 1e-5))
    if len([o for o in node.output if o]) > 1:
        raise TwinError("LayerNormalization's Mean / InvStdDev outputs are not supported")

    def run(x, weight, bias=None):
        return F.layer_norm(x, x.shape[axis % x.dim():], weight, bias, eps)

    ins = [twin.ref(node.input[0]), twin.ref(node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        ins.append(twin.ref(node.input[2]))
    return (run, ins, [node.output[0]])


def _reshape(twin, node, a):
    shape = _static_ints(twin, node, 1, "target shape")
    allow_zero = int(a.get("allowzero", 0))

    def run(x):
        target = [x.shape[i] if s == 0 and not allow_zero else s for i, s in enumerate(shape)]
        return x.reshape(target)

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _flatten(twin, node, a):
    axis = int(a.get("axis", 1))

    def run(x):
        ax = axis % x.dim() if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:ax]), -1)

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _transpose(twin, node, a):
    perm = a.get("perm")
    return ((lambda x: x.permute(perm if perm is not None else tuple(reversed(range(x.dim()))))),
            [twin.ref(node.input[0])], [node.output[0]])


def _axes(twin, node, a, index: int = 1) -> list[int] | None:
    if "axes" in a:
        return list(a["axes"])
    return _static_ints(twin, node, index, "axes")


def _unsqueeze(twin, node, a):
    axes = _axes(twin, node, a)

    def run(x):
        rank = x.dim() + len(axes)
        for axis in sorted(ax % rank for ax in axes):
            x = x.unsqueeze(axis)
        return x

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _squeeze(twin, node, a):
    axes = _axes(twin, node, a)

    def run(x):
        if axes is None:
            return x.squeeze()
        return x.squeeze(tuple(ax % x.dim() for ax in axes))

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _cast(twin, node, a):
    dtype = _DTYPES.get(int(a["to"]))
    if dtype is None:
        raise TwinError(f"Cast to ONNX type {a['to']} is not supported")
    return ((lambda x: x.to(dtype)), [twin.ref(node.input[0])], [node.output[0]])


def _gather(twin, node, a):
    axis = int(a.get("axis", 0))
    indices = twin.const(node.input[1])
    data = twin.const(node.input[0])
    if indices is not None and indices.ndim == 0:
        index = int(indices)
        return ((lambda x: x.select(axis, index)), [twin.ref(node.input[0])], [node.output[0]])
    if data is not None and axis == 0 and data.ndim == 2 and indices is None:  # an embedding table
        return ((lambda ids, table: F.embedding(ids, table)), [twin.ref(node.input[1]), twin.ref(node.input[0])], [node.output[0]])

    def run(x, idx):
        ax = axis % x.dim()
        idx = torch.where(idx < 0, idx + x.shape[ax], idx)
        out = torch.index_select(x, ax, idx.reshape(-1))
        return out.reshape(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]))

    return (run, [twin.ref(node.input[0]), twin.ref(node.input[1])], [node.output[0]])


def _concat(twin, node, a):
    axis = int(a["axis"])
    return ((lambda *xs: torch.cat(xs, axis)), [twin.ref(n) for n in node.input], [node.output[0]])


def _reduce(kind):
    def handler(twin, node, a):
        # ReduceSum takes its axes as an input from opset 13, the others from opset 18
        axes = list(a["axes"]) if "axes" in a else _static_ints(twin, node, 1, "axes")
        keep = bool(a.get("keepdims", 1))
        noop = bool(a.get("noop_with_empty_axes", 0))

        def run(x):
            if not axes:
                if noop:
                    return x
                dims = tuple(range(x.dim()))
            else:
                dims = tuple(ax % x.dim() for ax in axes)
            if kind == "sum":
                return x.sum(dim=dims, keepdim=keep)
            if kind == "mean":
                return x.mean(dim=dims, keepdim=keep)
            if kind == "max":
                return x.amax(dim=dims, keepdim=keep)
            return x.amin(dim=dims, keepdim=keep)

        return (run, [twin.ref(node.input[0])], [node.output[0]])

    return handler


def _clip(twin, node, a):
    if twin.opset < 11:
        low, high = a.get("min"), a.get("max")
    else:
        low = twin.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        high = twin.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if (len(node.input) > 1 and node.input[1] and low is None) or (len(node.input) > 2 and node.input[2] and high is None):
            raise TwinError("Clip with run-time bounds is not supported")
        low = float(low) if low is not None else None
        high = float(high) if high is not None else None
    if low == 0.0 and high == 6.0:
        return (F.relu6, [twin.ref(node.input[0])], [node.output[0]])
    return ((lambda x: torch.clamp(x, low, high)), [twin.ref(node.input[0])], [node.output[0]])


def _slice(twin, node, a):
    if twin.opset < 10:
        starts, ends, axes, steps = list(a["starts"]), list(a["ends"]), a.get("axes"), None
    else:
        starts, ends = _static_ints(twin, node, 1, "starts"), _static_ints(twin, node, 2, "ends")
        axes, steps = _static_ints(twin, node, 3, "axes"), _static_ints(twin, node, 4, "steps")
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    if any(s <= 0 for s in steps):
        raise TwinError("Slice with non-positive steps is not supported")

    def run(x):
        index = [slice(None)] * x.dim()
        for start, end, axis, step in zip(starts, ends, axes, steps):
            n = x.shape[axis]
            start = max(0, min(n, start + n if start < 0 else start))
            end = max(0, min(n, end + n if end < 0 else end))
            index[axis % x.dim()] = slice(start, end, step)
        return x[tuple(index)]

    return (run, [twin.ref(node.input[0])], [node.output[0]])


def _expand(twin, node, a):
    shape = _static_ints(twin, node, 1, "shape")
    return ((lambda x: x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))), [twin.ref(node.input[0])], [node.output[0]])


def _identity(twin, node, a):
    if len([o for o in node.output if o]) > 1:
        raise TwinError("Dropout's mask output is not supported")
    return ((lambda x: x), [twin.ref(node.input[0])], [node.output[0]])


def _leaky_relu(twin, node, a):
    slope = float(a.get("alpha", 0.01))
    return ((lambda x: F.leaky_relu(x, slope)), [twin.ref(node.input[0])], [node.output[0]])


def _where(twin, node, a):
    return (torch.where, [twin.ref(n) for n in node.input], [node.output[0]])


def _pow(twin, node, a):
    exponent = twin.const(node.input[1])
    if exponent is not None and exponent.size == 1:
        value = float(exponent.reshape(()))
        return ((lambda x: torch.pow(x, value)), [twin.ref(node.input[0])], [node.output[0]])
    return (torch.pow, [twin.ref(node.input[0]), twin.ref(node.input[1])], [node.output[0]])


_HANDLERS: dict[str, Callable] = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _binary(_div),
    "Pow": _pow, "Sum": _sum, "MatMul": _matmul, "Gemm": _gemm,
    "Relu": _unary(F.relu), "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh), "Erf": _unary(torch.erf),
    "Exp": _unary(torch.exp), "Log": _unary(torch.log), "Sqrt": _unary(torch.sqrt), "Neg": _unary(torch.neg),
    "Abs": _unary(torch.abs), "Reciprocal": _unary(torch.reciprocal), "Not": _unary(torch.logical_not),
    "LeakyRelu": _leaky_relu, "Clip": _clip,
    "Equal": _binary(torch.eq), "Less": _binary(torch.lt), "Greater": _binary(torch.gt), "Where": _where,
    "Conv": _conv, "BatchNormalization": _batch_norm, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global_average_pool, "GlobalMaxPool": _global_max_pool,
    "Softmax": _softmax_like("softmax"), "LogSoftmax": _softmax_like("log_softmax"),
    "LayerNormalization": _layer_norm,
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Cast": _cast, "Gather": _gather, "Concat": _concat, "Slice": _slice, "Expand": _expand,
    "ReduceSum": _reduce("sum"), "ReduceMean": _reduce("mean"), "ReduceMax": _reduce("max"), "ReduceMin": _reduce("min"),
    "Identity": _identity, "Dropout": _identity,
}

SUPPORTED = frozenset(_HANDLERS) | {"Constant"}
