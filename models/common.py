"""Shared helpers for the bundled ONNX model zoo.

Every model is built with :class:`GraphBuilder` and finished with
:func:`make_model`, which pins the opset and IR version so that both
onnxruntime and TVM's Relax ONNX frontend accept the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8

Shape = Sequence[int]


class GraphBuilder:
    """Accumulates the nodes and initializers of one ONNX graph.

    Weights come from ``numpy.random.default_rng(seed)``, so a builder fed
    the same sequence of calls always produces the same graph.

    Args:
        seed: Seed for the weight generator.
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self._shared: dict[str, np.ndarray] = {}

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name!r}")
        self._names.add(name)
        return name

    def const(self, name: str, value: Any) -> str:
        """Adds an initializer; float64 data is stored as float32.

        Returns:
            The initializer name.
        """
        arr = np.asarray(value)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        self.initializers.append(numpy_helper.from_array(arr, self._claim(name)))
        return name

    def shared(self, name: str, value: Any) -> str:
        """Adds a constant initializer once; later calls with ``name`` reuse it.

        Returns:
            The initializer name.
        """
        if name in self._shared:
            if not np.array_equal(self._shared[name], value):
                raise ValueError(f"shared constant {name!r} redefined")
            return name
        self._shared[name] = np.asarray(value)
        return self.const(name, value)

    def normal(self, name: str, shape: Shape, std: float) -> str:
        """Adds a float32 initializer drawn from N(0, std^2)."""
        data = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        return self.const(name, data * np.float32(std))

    def uniform(self, name: str, shape: Shape, low: float, high: float) -> str:
        """Adds a float32 initializer drawn from U(low, high)."""
        data = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.const(name, data)

    def op(self, op_type: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        """Adds a single-output node whose output tensor is called ``name``.

        Returns:
            The output tensor name.
        """
        node = helper.make_node(op_type, list(inputs), [self._claim(name)], name=name, **attrs)
        self.nodes.append(node)
        return name


def batch_norm(g: GraphBuilder, x: str, name: str, channels: int) -> str:
    """Inference-mode BatchNormalization with non-trivial random statistics."""
    scale = g.uniform(f"{name}.scale", [channels], 0.5, 1.5)
    bias = g.normal(f"{name}.bias", [channels], 0.1)
    mean = g.normal(f"{name}.mean", [channels], 0.1)
    var = g.uniform(f"{name}.var", [channels], 0.5, 1.5)
    return g.op("BatchNormalization", [x, scale, bias, mean, var], name, epsilon=1e-5)


def conv_bn(
    g: GraphBuilder,
    x: str,
    name: str,
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    group: int = 1,
) -> str:
    """Bias-free Conv (std 1/sqrt(fan_in), "same" padding) followed by BatchNormalization."""
    fan_in = cin // group * kernel * kernel
    w = g.normal(f"{name}.weight", [cout, cin // group, kernel, kernel], np.sqrt(1.0 / fan_in))
    pad = kernel // 2
    y = g.op(
        "Conv",
        [x, w],
        f"{name}.conv",
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
        group=group,
    )
    return batch_norm(g, y, f"{name}.bn", cout)


def dense(
    g: GraphBuilder, x: str, name: str, fin: int, fout: int, out: str | None = None
) -> str:
    """Gemm ``x @ W + b`` on a 2-D input, weights scaled by 1/sqrt(fan_in).

    The output tensor is called ``out`` if given, else ``name``.
    """
    w = g.normal(f"{name}.weight", [fin, fout], 1.0 / np.sqrt(fin))
    b = g.normal(f"{name}.bias", [fout], 0.1)
    return g.op("Gemm", [x, w, b], out or name)


def classifier_head(
    g: GraphBuilder, x: str, channels: int, num_classes: int, out: str = "output"
) -> str:
    """GlobalAveragePool, Flatten and a Gemm to ``num_classes`` logits named ``out``."""
    y = g.op("GlobalAveragePool", [x], "head.pool")
    y = g.op("Flatten", [y], "head.flatten", axis=1)
    return dense(g, y, "head.fc", channels, num_classes, out)


INDEX_RANGE = "index_range:"  # metadata key prefix: an int64 input's values lie in [0, value)


def _value_info(name: str, shape: Shape, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def make_model(
    g: GraphBuilder,
    name: str,
    inputs: dict[str, Shape],
    outputs: dict[str, Shape],
    doc: str = "",
    int_inputs: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """Wraps the builder's graph into a shape-inferred opset-17 / IR-8 model.

    Args:
        g: Builder holding the nodes and initializers.
        name: Graph name.
        inputs: Graph inputs and their static shapes (float32 unless in ``int_inputs``).
        outputs: Float32 graph outputs and their static shapes.
        doc: Optional doc string stored on the graph.
        int_inputs: Int64 index inputs and the size of what they index (valid values: 0..size-1),
            recorded in the model's metadata for :func:`random_inputs`.

    Returns:
        The model, with ``value_info`` filled in by strict shape inference.
    """
    graph = helper.make_graph(
        g.nodes,
        name,
        [_value_info(n, s, TensorProto.INT64 if n in (int_inputs or {}) else TensorProto.FLOAT) for n, s in inputs.items()],
        [_value_info(n, s) for n, s in outputs.items()],
        initializer=g.initializers,
        doc_string=doc,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tvmsched.models",
    )
    for input_name, size in (int_inputs or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = INDEX_RANGE + input_name, str(size)
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def static_shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    """Returns the static shape of a tensor value, or raises ValueError."""
    dims = value.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        raise ValueError(f"tensor {value.name!r} has a non-static shape")
    return tuple(d.dim_value for d in dims)


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Makes feeds for every non-initializer graph input: standard-normal float32 (float16 for an input the model
    declares so, the same values rounded), or int64 indices uniform over their recorded range (``index_range:<input>``
    metadata).

    Args:
        model: Model whose inputs have static shapes.
        seed: Seed for ``numpy.random.default_rng``.

    Returns:
        Mapping from input name to an array of the declared shape.
    """
    rng = np.random.default_rng(seed)
    weights = {t.name for t in model.graph.initializer}
    ranges = {p.key[len(INDEX_RANGE):]: int(p.value) for p in model.metadata_props if p.key.startswith(INDEX_RANGE)}
    feeds = {}
    for v in model.graph.input:
        if v.name in weights:
            continue
        shape = static_shape(v)
        if v.name in ranges:
            feeds[v.name] = rng.integers(0, ranges[v.name], shape, dtype=np.int64)
        else:
            feeds[v.name] = rng.standard_normal(shape, dtype=np.float32)
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
                feeds[v.name] = feeds[v.name].astype(np.float16)
    return feeds
