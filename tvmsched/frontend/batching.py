"""The batch dimension of an ONNX model: which inputs carry it, the model rewritten for a batch of B rows, and the
check that every row of a batch is computed from that row alone (docs/batching.md).

A model has a batch dimension when every graph input's first dimension is symbolic (as
`torch.onnx.export(dynamic_axes=...)` writes it) or 1. For B rows:

1. every input's first dimension becomes B;
2. a Reshape of a tensor computed from the inputs whose target shape is a constant starting with 1 (the zoo's
   bert-tiny: `Reshape [1, 128, 2, 64]`) gets that 1 replaced by B; shape arithmetic computed from `Shape` (dynamic
   exports) needs no rewrite, `frontend.fold` folds it with the new input shapes;
3. the rewrite is checked, not assumed: onnxruntime runs the model at batch 2 on two different rows and at batch 1 on
   each row alone, every intermediate tensor kept. Each tensor computed from the inputs must hold the batch in exactly
   one dimension (2 rows where the batch-1 run has 1, every other dimension the same), each row equal to the same row
   computed alone, and each graph output must hold it first. The first node that breaks this is refused with one
   line naming it: a Softmax or ReduceMean over the batch axis, a Reshape that folds the batch into another
   dimension, a constant that fixes the batch at 1.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from tvmsched.errors import TvmschedError
from tvmsched.frontend.loader import graph_inputs, input_signature

_NO_ROWS = frozenset({"Shape", "Size"})  # their outputs describe a tensor's shape, not its rows


@dataclass(frozen=True)
class BatchedModel:
    """A model rewritten for `size` rows: compile it with `input_shapes`."""

    model: onnx.ModelProto
    size: int
    input_shapes: dict[str, tuple[int, ...]]
    rewritten: tuple[str, ...]  # the Reshape nodes whose target shape now starts with `size`


def row_shapes(model: onnx.ModelProto, input_shapes: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Each input's shape for one row (first dimension 1), or one line saying why the model has no batch dimension.

    `input_shapes` (as `--input-shape`) fixes the dimensions an export left symbolic; its first entry is the batch's
    and is ignored.
    """
    input_shapes = dict(input_shapes or {})
    if not graph_inputs(model):
        raise TvmschedError("cannot batch the model: the model has no inputs, so no batch dimension")
    unknown = sorted(set(input_shapes) - {value.name for value in graph_inputs(model)})
    if unknown:
        raise TvmschedError(f"cannot batch the model: --input-shape names unknown input(s) {unknown}")
    fixed = {}
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if value.name in input_shapes:
            given = tuple(input_shapes[value.name])
            if len(given) != len(dims) and len(dims):
                raise TvmschedError(f"cannot batch the model: --input-shape {value.name}: {len(given)} dimensions, the input has {len(dims)}")
            fixed[value.name] = (1, *given[1:]) if given else given
            continue
        if not dims:
            raise TvmschedError(f"cannot batch the model: input {value.name!r} is a scalar: a batched input's first dimension is the batch")
        first = dims[0]
        if first.HasField("dim_value") and first.dim_value not in (0, 1):
            raise TvmschedError(
                f"cannot batch the model: input {value.name!r} has first dimension {first.dim_value} (a batch "
                "dimension is a symbolic first dimension or 1)"
            )
        fixed[value.name] = (1, *[d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:]])
    override = {name: shape for name, shape in fixed.items() if -1 not in shape}
    signature = input_signature(_with_first_dim(model, 1), override)  # one line for a dimension still symbolic
    return {name: shape for name, (shape, _) in signature.items()}


def rebatch(model: onnx.ModelProto, size: int, input_shapes: dict | None = None) -> BatchedModel:
    """The model for `size` rows (the rewrite of the module doc, unchecked: see `check_rows`)."""
    if size < 1:
        raise TvmschedError(f"a batch size is a positive number of rows, not {size}")
    rows = row_shapes(model, input_shapes)
    out = _with_first_dim(model, size)
    constants = _constants(out)
    from_inputs = _computed_from_inputs(out)
    rewritten, replaced = [], set()
    for index, node in enumerate(out.graph.node):
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[0] not in from_inputs:
            continue
        target = constants.get(node.input[1])
        if target is None or target.ndim != 1 or not target.size or int(target[0]) != 1 or size == 1:
            continue
        batched = target.copy()
        batched[0] = size
        name = f"{node.input[1]}__batch{size}"
        if name not in constants:
            out.graph.initializer.append(numpy_helper.from_array(batched, name))
            constants[name] = batched
        replaced.add(node.input[1])
        node.input[1] = name
        rewritten.append(node.name or f"#{index}")
    used = {name for node in out.graph.node for name in node.input}
    kept = [init for init in out.graph.initializer if init.name not in replaced or init.name in used]
    if len(kept) != len(out.graph.initializer):
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
    shapes = {name: (size, *shape[1:]) for name, shape in rows.items()}
    return BatchedModel(out, size, shapes, tuple(rewritten))


def check_rows(model: onnx.ModelProto, input_shapes: dict | None = None, seed: int = 0) -> None:
    """Refuse, in one line naming the node, a model whose rows are not computed independently at batch 2 (module doc)."""
    import onnxruntime as ort

    one, two = rebatch(model, 1, input_shapes), rebatch(model, 2, input_shapes)
    rng = np.random.default_rng(seed)
    dtypes = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type) for v in graph_inputs(model)}
    rows = [{name: _random(rng, shape, dtypes[name]) for name, shape in one.input_shapes.items()} for _ in range(2)]
    feeds = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    values, order = _intermediates(two.model)
    alone = _run(ort, one.model, values, rows)
    (together,) = _run(ort, two.model, values, [feeds])
    from_inputs = _computed_from_inputs(two.model)
    outputs = {o.name for o in model.graph.output}
    for node, index in order:
        for name in node.output:
            if name not in from_inputs or name not in together or name not in alone[0]:
                continue
            problem = _row_problem(together[name], alone[0][name], alone[1][name], name in outputs)
            if problem:
                where = f"node {node.name!r}" if node.name else f"node #{index} (writing {name!r})"
                raise TvmschedError(f"cannot batch the model: {node.op_type} {where} {problem}")


def _row_problem(together: np.ndarray, alone0: np.ndarray, alone1: np.ndarray, output: bool) -> str | None:
    """What is wrong with a tensor computed from the inputs, at two rows against each row alone (None: nothing)."""
    one, two = list(alone0.shape), list(together.shape)
    if len(one) != len(two):
        return f"changes its output's rank with the batch ({one} for one row, {two} for two)"
    differ = [k for k in range(len(one)) if one[k] != two[k]]
    if not differ:
        if _same(together, alone0) and _same(together, alone1):
            return None  # computed from the inputs, yet the same for any row
        return f"reduces over the batch: its output is {two} for one row and for two"
    axis = differ[0]
    if len(differ) > 1 or one[axis] != 1 or two[axis] != 2:
        return f"folds the batch into another dimension: its output is {one} for one row and {two} for two"
    if output and axis:
        return f"writes a graph output with the batch in dimension {axis}: a batched output holds it first"
    for row, alone in enumerate((alone0, alone1)):
        if not _same(np.take(together, [row], axis=axis), alone):
            return f"mixes the rows of a batch: row {row} of its output differs from that row computed alone"
    return None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(a, b))


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A row of input: normal floats; integers and booleans 0 or 1 (valid indices and masks in any model)."""
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _with_first_dim(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """A copy whose inputs' first dimension is `size`; the declared output dimensions become symbolic and the value
    infos are dropped (stale once the batch changes): shape inference recomputes them."""
    out = copy.deepcopy(model)
    for value in graph_inputs(out):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = size
    for value in out.graph.output:
        for k, dim in enumerate(value.type.tensor_type.shape.dim):
            dim.Clear()
            dim.dim_param = f"{value.name}_{k}"
    del out.graph.value_info[:]
    return out


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant nodes' values, by tensor name."""
    out = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _computed_from_inputs(model: onnx.ModelProto) -> set[str]:
    """Tensors whose values depend on the graph inputs' values (a Shape's output depends on a shape only)."""
    found = {value.name for value in graph_inputs(model)}
    for node in model.graph.node:
        if node.op_type not in _NO_ROWS and any(name in found for name in node.input if name):
            found.update(name for name in node.output if name)
    return found


def _intermediates(model: onnx.ModelProto) -> tuple[list[onnx.ValueInfoProto], list[tuple[onnx.NodeProto, int]]]:
    """Every node output whose type shape inference knows, and the nodes in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output) if v.type.tensor_type.elem_type}
    values = []
    for node in model.graph.node:
        for name in node.output:
            if name in typed:
                value = onnx.ValueInfoProto()
                value.name = name
                value.type.tensor_type.elem_type = typed[name].type.tensor_type.elem_type
                values.append(value)
    return values, [(node, index) for index, node in enumerate(model.graph.node)]


def _run(ort, model: onnx.ModelProto, values: list[onnx.ValueInfoProto], feeds: list[dict]) -> list[dict]:
    """Every tensor of `values` (and the outputs) of one onnxruntime session of `model` (rebatch's own copy: its
    outputs are extended in place) for each of `feeds`."""
    declared = {o.name for o in model.graph.output}
    model.graph.output.extend(v for v in values if v.name not in declared)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # (its warnings about the copies' unused initializers are not the user's)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return [dict(zip(names, session.run(None, feed))) for feed in feeds]
    except Exception as err:  # noqa: BLE001 - onnxruntime raises several types; all say the same here
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise TvmschedError(f"cannot check the model's batch dimension: onnxruntime could not run it: {reason}") from None
