"""Bounds checks for indices read from run-time data (Gather, GatherElements, GatherND, Scatter*).

TVM lowers these ops unchecked ("fast" mode): an index past the table reads or writes foreign
memory. This ONNX-level rewrite runs before import and gives every such node whose indices
depend on the model's inputs:

- ONNX semantics for negative indices (`i < 0` means `i + n`),
- a clamped copy of the indices that the node reads instead (never out of bounds, on any device),
- a flag per node (1: some index was out of range); the flags are packed as bits of int32 words
  (31 a word), added as the last graph outputs. The manifest lists the checks (`index_checks`, each
  with its word tensor and bit); the engine reads the words after every run and fails that request
  with one line naming the node and the valid range.

Indices known at compile time (initializers, Constant nodes) are checked here instead: an
out-of-range constant index is a compile error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvmsched.errors import TvmschedError

CHECK_PREFIX = "_tvmsched_index_check"
FLAGS = "_tvmsched_index_checks"  # the extra graph outputs FLAGS0, FLAGS1, ...: bit j of word w is check 31w+j's
WORD_BITS = 31
_INDEX_OPS = {  # op -> (position of the indices input, how the bound is found)
    "Gather": (1, "axis"),
    "GatherElements": (1, "axis"),
    "ScatterElements": (1, "axis"),
    "Scatter": (1, "axis"),
    "GatherND": (1, "nd"),
    "ScatterND": (1, "nd"),
}
_INT_TYPES = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}


@dataclass(frozen=True)
class GuardedNode:
    """One checked node: the flag output it gets and what an error message says about it."""

    output: str  # its int32 flag (0-d), packed into a FLAGS word
    op: str
    node: str
    indices: str  # the ONNX tensor holding the indices
    bounds: tuple[int, ...]  # the sizes indices index into (one for axis ops, k for the *ND ops)


def guard_indices(model: onnx.ModelProto, signature: dict) -> tuple[onnx.ModelProto, list[GuardedNode]]:
    """Rewrite `model` so that run-time indices are bounds-checked; constant ones are checked now.

    `signature` maps each graph input to its static (shape, dtype), as `frontend.input_signature`.
    """
    if not any(n.op_type in _INDEX_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model, []
    from tvmsched.frontend.validate import Facts

    facts = Facts.of(model, strip_outputs=False, signature=signature)
    runtime = _runtime_tensors(model)
    nodes, initializers, outputs, checks = [], list(model.graph.initializer), list(model.graph.output), []
    for index, node in enumerate(model.graph.node):
        if node.op_type not in _INDEX_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        position, kind = _INDEX_OPS[node.op_type]
        data, indices = node.input[0], node.input[position]
        name = node.name or f"#{index}"
        bounds = _bounds(node, kind, _static(facts.shape(data)), _static(facts.shape(indices)), name)
        if indices in facts.constants:
            _check_constant(node.op_type, name, facts.constant(indices), bounds, kind)
            nodes.append(node)
            continue
        elem = facts.types.get(indices, (0, None))[0]
        if indices not in runtime or elem not in _INT_TYPES:
            nodes.append(node)  # computed from shapes alone: folded by TVM at compile time
            continue
        prefix = f"{CHECK_PREFIX}{len(checks)}"
        new_nodes, consts, safe = _clamp(indices, bounds, _INT_TYPES[elem], kind, prefix)
        nodes += new_nodes
        initializers += consts
        guarded = onnx.NodeProto()
        guarded.CopyFrom(node)
        guarded.input[position] = safe
        nodes.append(guarded)
        checks.append(GuardedNode(prefix, node.op_type, name, indices, bounds))
    if not checks:
        return model, []
    # the flags as bits of int32 words, 31 checks a word: one copy to the host per word and request;
    # a word of one check is its flag (no kernel), a word of several one fused elementwise kernel
    for word, start in enumerate(range(0, len(checks), WORD_BITS)):
        group, out = checks[start : start + WORD_BITS], f"{FLAGS}{word}"
        if len(group) == 1:
            nodes.append(helper.make_node("Identity", [group[0].output], [out]))
        else:
            for bit, check in enumerate(group):
                initializers.append(numpy_helper.from_array(np.array(1 << bit, np.int32), f"{check.output}_bit"))
                nodes.append(helper.make_node("Mul", [check.output, f"{check.output}_bit"], [f"{check.output}_shifted"]))
            # a chain of Adds, not one variadic Sum (TVM imports that as stack + sum: a copy of every flag,
            # and a stack lowering.to_cpu_layouts has to rewrite before ConvertLayout)
            total = f"{group[0].output}_shifted"
            for i, check in enumerate(group[1:], 1):
                partial = out if i == len(group) - 1 else f"{out}_partial{i}"
                nodes.append(helper.make_node("Add", [total, f"{check.output}_shifted"], [partial]))
                total = partial
        outputs.append(helper.make_tensor_value_info(out, TensorProto.INT32, []))
    from tvmsched.frontend.rewrites import with_graph

    return with_graph(model, nodes, initializers, outputs), checks


def describe(check: GuardedNode) -> str:
    """The valid range of a check, as error messages show it."""
    return f"{check.op} node {check.node!r} (indices {check.indices!r}): values must be in {_ranges(check.bounds)}"


def _ranges(bounds: tuple[int, ...]) -> str:
    return ", ".join(f"[{-n}, {n - 1}]" for n in bounds)


def _clamp(indices: str, bounds: tuple[int, ...], dtype, kind: str, prefix: str):
    """Nodes computing the in-range copy of `indices` and the flag `prefix` (1: some were out of range).

    Two chains that share nothing but `indices`, so that TVM fuses the clamp into the indexing
    kernel and the flag into one reduction (one extra kernel per checked node).
    """
    bound = np.array(bounds if kind == "nd" else bounds[0], dtype=dtype)  # broadcasts over the last axis (ND)
    p = prefix
    consts = [numpy_helper.from_array(v, f"{p}_{key}") for key, v in (("n", bound), ("neg_n", -bound), ("0", np.array(0, dtype)))]
    n, neg_n, zero = f"{p}_n", f"{p}_neg_n", f"{p}_0"
    nodes = [  # safe = (-n <= i < n) ? (i < 0 ? i + n : i) : 0
        helper.make_node("Less", [indices, zero], [f"{p}_neg"]),
        helper.make_node("Add", [indices, n], [f"{p}_wrapped"]),
        helper.make_node("Where", [f"{p}_neg", f"{p}_wrapped", indices], [f"{p}_adj"]),
        helper.make_node("Less", [indices, neg_n], [f"{p}_under_s"]),
        helper.make_node("Less", [indices, n], [f"{p}_below_s"]),
        helper.make_node("Not", [f"{p}_under_s"], [f"{p}_above_s"]),
        helper.make_node("And", [f"{p}_above_s", f"{p}_below_s"], [f"{p}_ok"]),
        helper.make_node("Where", [f"{p}_ok", f"{p}_adj", zero], [f"{p}_safe"]),
        # flag = any(i < -n or i >= n)
        helper.make_node("Less", [indices, neg_n], [f"{p}_under"]),
        helper.make_node("Less", [indices, n], [f"{p}_below"]),
        helper.make_node("Not", [f"{p}_below"], [f"{p}_over"]),
        helper.make_node("Or", [f"{p}_under", f"{p}_over"], [f"{p}_bad"]),
        helper.make_node("Cast", [f"{p}_bad"], [f"{p}_badi"], to=TensorProto.INT32),
        helper.make_node("ReduceMax", [f"{p}_badi"], [p], keepdims=0),  # no reshape: it would not fuse
    ]
    return nodes, consts, f"{p}_safe"


def _bounds(node, kind: str, data_shape, indices_shape, name: str) -> tuple[int, ...]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if data_shape is None or indices_shape is None:
        raise TvmschedError(f"cannot bounds-check {node.op_type} node {name!r}: the shapes of its data and indices are unknown")
    if kind == "axis":
        axis = attrs.get("axis", 0)
        if not -len(data_shape) <= axis < len(data_shape):
            raise TvmschedError(f"{node.op_type} node {name!r}: axis {axis} is out of range for rank {len(data_shape)}")
        bounds = (data_shape[axis],)
    else:
        batch = attrs.get("batch_dims", 0)
        depth = indices_shape[-1] if indices_shape else 0
        if not indices_shape or depth < 1 or batch + depth > len(data_shape):
            raise TvmschedError(f"{node.op_type} node {name!r}: indices of shape {list(indices_shape)} do not fit data of shape {list(data_shape)}")
        bounds = tuple(data_shape[batch : batch + depth])
    if 0 in bounds and int(np.prod(indices_shape, dtype=np.int64)) > 0:
        raise TvmschedError(f"{node.op_type} node {name!r} indexes an empty axis (data shape {list(data_shape)})")
    return bounds


def _check_constant(op: str, name: str, values: np.ndarray, bounds: tuple[int, ...], kind: str) -> None:
    limit = np.array(bounds if kind == "nd" else bounds[0], dtype=np.int64)
    values = values.astype(np.int64)
    bad = (values < -limit) | (values >= limit)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise TvmschedError(
            f"{op} node {name!r}: constant index {int(values[at])} at position {list(at)} is out of range (valid: {_ranges(bounds)})"
        )


def _static(dims: list | None) -> tuple[int, ...] | None:
    """A shape whose every dimension inference knows, else None."""
    return None if dims is None or None in dims else tuple(dims)


def _runtime_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors whose values depend on the model's input data (not on shapes or constants alone)."""
    initializers = {init.name for init in model.graph.initializer}
    runtime = {value.name for value in model.graph.input if value.name not in initializers}
    for node in model.graph.node:  # topological order (the checker ensures it)
        if node.op_type in ("Shape", "Size"):
            continue
        if any(name in runtime for name in node.input if name):
            runtime.update(name for name in node.output if name)
    return runtime
