"""Constant folding at the ONNX level with the input shapes fixed, before TVM's importer sees the model.

Exporters (TorchScript with dynamic axes above all) leave the model's shape arithmetic in the graph:
Shape → Gather → Unsqueeze → Concat → Reshape, Range over a sequence length, pads computed from the
image size, masks sliced from buffers. TVM's importer cannot follow much of it ("Dynamic pads are not
supported yet", "Reshape expects the input tensor to have known shape", "broadcast_to expects ...")
even when every input shape is given. Once the input shapes are fixed, all of it is constant: this pass
does what onnxruntime's basic graph optimizer does before running such a model —

1. fix the graph inputs to the compiled shapes;
2. in graph order (topological), one pass: replace Shape / Size of statically shaped tensors by
   constants; evaluate every node whose inputs are all constant (onnx's reference implementation, one
   node at a time), unless it is random, has a subgraph, produces a graph output, or its output would be
   larger than `MAX_FOLDED_BYTES`; infer the shapes of every node kept (ONNX's per-node inference, with
   the values of small constants), so a folded Reshape target makes the next shapes static;
3. drop the dead nodes and initializers and record the now-static shapes in value_info and the graph
   outputs.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvmsched.frontend.validate import SHOWN_ELEMENTS, fixed_input, model_shell

log = logging.getLogger(__name__)

MAX_FOLDED_BYTES = 4 << 20  # a folded tensor larger than this stays computed at run time (as onnxruntime keeps big ones)
_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"})  # Dropout: random in training mode; identity otherwise (TVM drops it)
_DEFAULT_DOMAINS = ("", "ai.onnx")


def fold_constants(model: onnx.ModelProto, signature: dict | None = None) -> onnx.ModelProto:
    """A copy of `model` with its compile-time computable part folded into initializers.

    `signature` maps graph inputs to their static (shape, dtype) (frontend.input_signature); the
    model is returned unchanged when nothing folds. Never raises on a node it cannot fold: that node
    stays for the importer (whose refusal then names it).
    """
    folder = _Folder(model, signature or {})
    if not folder.run():
        return model
    return folder.result()


class _Folder:
    def __init__(self, model: onnx.ModelProto, signature: dict):
        self.model = model
        self.opsets = {o.domain or "": o.version for o in model.opset_import}
        self.nodes = list(model.graph.node)
        self.inits = {t.name: t for t in model.graph.initializer}
        self.arrays: dict[str, np.ndarray] = {}  # constant values read or computed so far
        self.folded: dict[str, np.ndarray] = {}  # tensors computed here (become initializers)
        self.graph_outputs = {o.name for o in model.graph.output}
        self.inputs = [fixed_input(value, signature) for value in model.graph.input if value.name not in self.inits]
        self.types: dict[str, tuple[int, list | None]] = {}  # elem type, dims (None: unknown)

    # -- the passes ------------------------------------------------------------------------------

    def run(self) -> bool:
        """Fold in one pass in graph order (topological: the checker holds it), shapes inferred node by node as
        it goes, so every value folded or inferred is known to the nodes after it; whether anything folded."""
        self.types = self._known_types()
        kept = []
        for node in self.nodes:
            values = self._fold(node)
            if values is None:
                kept.append(node)
                self._infer_node(node)
                continue
            for name, value in values.items():
                self.arrays[name] = self.folded[name] = value
                self.types[name] = (helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        changed, self.nodes = len(kept) != len(self.nodes), kept
        return changed

    def _known_types(self) -> dict[str, tuple[int, list | None]]:
        types = {}
        for value in self.inputs:
            types[value.name] = _type_of(value.type)
        for name, init in self.inits.items():
            types[name] = (init.data_type, list(init.dims))
        return types

    def _infer_node(self, node: onnx.NodeProto) -> None:
        """ONNX's shape inference of one node from what is known of its inputs (values of small constants too)."""
        outputs = [o for o in node.output if o]
        inputs = [name for name in node.input if name]
        if node.domain not in _DEFAULT_DOMAINS or not all(self.types.get(name, (0, None))[0] for name in inputs):
            return
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get(node.domain or "", 1), node.domain or "")
            input_types = {name: helper.make_tensor_type_proto(*self.types[name]) for name in inputs}
            data = {name: numpy_helper.from_array(self.arrays[name], name) for name in inputs
                    if name in self.arrays and self.arrays[name].size <= SHOWN_ELEMENTS}
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, input_types, data, opset_imports=list(self.model.opset_import),
                ir_version=max(self.model.ir_version, 4))
        except Exception as err:  # noqa: BLE001 - unknown op, subgraph, inconsistent input: outputs stay unknown
            log.debug("no shape for %s node %r: %s", node.op_type, node.name, err)
            return
        for name in outputs:
            if name in inferred and inferred[name].HasField("tensor_type"):
                self.types[name] = _type_of(inferred[name])

    def _fold(self, node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
        outputs = [o for o in node.output if o]
        if (node.domain not in _DEFAULT_DOMAINS or not outputs or node.op_type in _RANDOM
                or any(o in self.graph_outputs for o in outputs)
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)):
            return None
        if node.op_type in ("Shape", "Size"):
            dims = self.types.get(node.input[0], (0, None))[1]
            if dims is None or any(d is None for d in dims):
                return None
            if node.op_type == "Size":
                return {outputs[0]: np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)}
            attrs = {a.name: a.i for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(dims))
            return {outputs[0]: np.array(dims[slice(start, end)], dtype=np.int64)}
        inputs = [name for name in node.input if name]
        if not all(name in self.arrays or name in self.inits for name in inputs):
            return None  # (checked before reading any weight into numpy)
        if not all(self._constant(name) for name in inputs):
            return None
        if any(self._nbytes(o) is not None and self._nbytes(o) > MAX_FOLDED_BYTES for o in outputs):
            return None
        values = self._evaluate(node)
        if values is None:
            return None
        for name, value in values.items():
            if not isinstance(value, np.ndarray) or value.dtype == object or value.nbytes > MAX_FOLDED_BYTES:
                return None
            elem = self.types.get(name, (0, None))[0]
            if elem and value.dtype != helper.tensor_dtype_to_np_dtype(elem):
                return None  # the reference evaluator disagrees with inference on the type: leave it to TVM
        return values

    def _constant(self, name: str) -> bool:
        if name in self.arrays:
            return True
        init = self.inits.get(name)
        if init is None or init.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            return False
        try:
            self.arrays[name] = numpy_helper.to_array(init)
        except Exception:  # noqa: BLE001 - external or malformed data: not ours to fold
            return False
        return True

    def _nbytes(self, name: str) -> int | None:
        elem, dims = self.types.get(name, (0, None))
        if not elem or dims is None or any(d is None for d in dims):
            return None
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize
        except Exception:  # noqa: BLE001
            return None
        return int(np.prod(dims, dtype=np.int64)) * itemsize

    def _evaluate(self, node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
        from onnx.reference import ReferenceEvaluator

        tensor = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if tensor is not None:  # its value as it is (no evaluator built for it)
            try:
                return {node.output[0]: numpy_helper.to_array(tensor)}
            except Exception:  # noqa: BLE001 - external or malformed data: the evaluator says
                pass
        feeds = {name: self.arrays[name] for name in node.input if name}
        graph = helper.make_graph(
            [node], "fold",
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
             for name, value in feeds.items()],
            [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o])
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()])
        probe.ir_version = self.model.ir_version or onnx.IR_VERSION
        try:
            with np.errstate(all="ignore"):
                results = ReferenceEvaluator(probe).run(None, feeds)
        except Exception as err:  # noqa: BLE001 - the importer will see (and name) the node instead
            log.debug("not folding %s node %r: %s", node.op_type, node.name, err)
            return None
        return {name: np.asarray(value) if np.isscalar(value) else value
                for name, value in zip([o for o in node.output if o], results)}

    # -- the folded model ------------------------------------------------------------------------

    def result(self) -> onnx.ModelProto:
        needed = set(self.graph_outputs)
        live = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output if o):
                live.append(node)
                needed.update(name for name in node.input if name)
                for attr in node.attribute:  # names a subgraph reads from the outer scope
                    for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                        needed.update(_outer_names(g))
        live.reverse()
        initializers = [init for name, init in self.inits.items() if name in needed and name not in self.folded]
        initializers += [numpy_helper.from_array(value, name) for name, value in self.folded.items() if name in needed]
        folded = model_shell(self.model)
        graph = folded.graph
        graph.node.extend(live)
        graph.initializer.extend(initializers)
        graph.input.extend(v for v in self.inputs)
        graph.input.extend(v for v in self.model.graph.input if v.name in self.inits and v.name in needed
                           and v.name not in self.folded)
        for node in live:
            for name in node.output:
                elem, dims = self.types.get(name, (0, None))
                if name and elem and name not in self.graph_outputs and dims is not None and None not in dims:
                    graph.value_info.append(helper.make_tensor_value_info(name, elem, dims))
        for value in graph.output:
            elem, dims = self.types.get(value.name, (0, None))
            declared = value.type.tensor_type
            if dims is not None and all(d is not None for d in dims) and value.type.HasField("tensor_type") and (
                    not declared.HasField("shape") or not all(d.HasField("dim_value") for d in declared.shape.dim)):
                declared.shape.ClearField("dim")
                for d in dims:
                    declared.shape.dim.add().dim_value = d
        log.info("folded %d tensors; %d of %d nodes left", len(self.folded), len(live), len(self.model.graph.node))
        return folded


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.update(name for name in node.input if name)
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                names |= _outer_names(g)
    return names


def _type_of(type_proto: onnx.TypeProto) -> tuple[int, list | None]:
    """(elem type, dims with None for unknown ones, or None without a shape); (0, None) for non-tensors."""
    if not type_proto.HasField("tensor_type"):
        return (0, None)
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return (tensor.elem_type, None)
    return (tensor.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim])
