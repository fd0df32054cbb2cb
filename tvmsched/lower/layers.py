"""Stage 3: extract the ordered list of fused layers from the Relax `main` function.

Every layer is one `call_tir` of a fused PrimFunc; tensors get stable string ids:
`in<k>` for model inputs, `w<k>` for weights (Relax constants), `t<k>` for layer outputs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tvmsched.errors import TvmschedError

@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "weight" | "activation"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class LayerSpec:
    index: int
    func: str  # name of the fused PrimFunc in the IRModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class Graph:
    """The model as our executor sees it: tensors, weights and layers in topological order."""

    tensors: dict[str, TensorSpec] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    layers: list[LayerSpec] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    index_checks: list = field(default_factory=list)  # (flag word tensor id, bit, index_checks.GuardedNode): lower_model


def extract_graph(mod) -> Graph:
    """Walk `main`'s bindings; each `call_tir` becomes a layer, aliases and tuples are resolved."""
    from tvm import relax

    main = mod["main"]
    graph = Graph()
    env: dict = {}
    for index, param in enumerate(main.params):
        env[param] = _add_tensor(graph, f"in{index}", param.ty, "input")
        graph.inputs.append(env[param])
    for block in main.body.blocks:
        for binding in block.bindings:
            env[binding.var] = _bind(graph, env, binding.value, relax)
    result = _resolve(graph, env, main.body.body, relax)
    graph.outputs = list(result) if isinstance(result, tuple) else [result]
    return graph


def _bind(graph: Graph, env: dict, value, relax):
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir":
        func, args = value.args[0], value.args[1]
        inputs = tuple(_resolve(graph, env, arg, relax) for arg in args.fields)
        out_types = value.ty_args[0]
        fields = list(out_types.fields) if isinstance(out_types, relax.TupleType) else [out_types]
        outputs = tuple(_add_tensor(graph, _next_id(graph, "t"), ty, "activation") for ty in fields)
        graph.layers.append(LayerSpec(len(graph.layers), func.name_hint, inputs, outputs))
        return outputs if isinstance(out_types, relax.TupleType) else outputs[0]
    if isinstance(value, relax.Call):
        op = getattr(value.op, "name", None) or getattr(value.op, "name_hint", "?")
        raise TvmschedError(f"the lowered model still calls {op}, which the tvmsched executor cannot run")
    return _resolve(graph, env, value, relax)


@functools.cache
def _generic_const() -> type:
    """Relax's constant type: tvm.ir.GenericConst in TVM 0.27 (relax.Constant before). Imported here, not at the top: an
    artifact's reader (run, inspect, serve) takes TensorSpec from this module and never needs the compiler."""
    try:
        from tvm.ir import GenericConst
    except ImportError:  # pragma: no cover
        from tvm.relax import Constant as GenericConst
    return GenericConst


def _resolve(graph: Graph, env: dict, expr, relax):
    if isinstance(expr, relax.Var):
        return env[expr]
    if isinstance(expr, relax.Tuple):
        return tuple(_resolve(graph, env, item, relax) for item in expr.fields)
    if isinstance(expr, relax.TupleGetItem):
        return _resolve(graph, env, expr.tuple_value, relax)[expr.index]
    if isinstance(expr, _generic_const()):
        array = expr.value.numpy()
        tensor_id = _next_id(graph, "w")
        graph.tensors[tensor_id] = TensorSpec(tuple(array.shape), str(array.dtype), "weight")
        graph.weights[tensor_id] = array
        return tensor_id
    raise TvmschedError(f"the lowered model uses a {type(expr).__name__} value the executor cannot handle")


def _add_tensor(graph: Graph, tensor_id: str, ty, kind: str) -> str:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        raise TvmschedError(f"tensor {tensor_id} has no static shape ({ty})")
    try:
        dims = tuple(int(dim) for dim in shape.values)
    except TypeError:
        raise TvmschedError(f"tensor {tensor_id} has a symbolic shape {shape}; give static input shapes") from None
    graph.tensors[tensor_id] = TensorSpec(dims, str(ty.dtype), kind)
    return tensor_id


def _next_id(graph: Graph, prefix: str) -> str:
    return f"{prefix}{sum(tensor_id.startswith(prefix) for tensor_id in graph.tensors)}"


def arg_specs(graph) -> dict[str, list[tuple[tuple[int, ...], str]]]:
    """(shape, dtype) of each PrimFunc's arguments, from the first layer that calls it."""
    specs = {}
    for layer in graph.layers:
        if layer.func not in specs:
            specs[layer.func] = [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in (*layer.inputs, *layer.outputs)]
    return specs
