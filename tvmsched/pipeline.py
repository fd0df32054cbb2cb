"""`tvmsched compile`: the ordered stages from an ONNX model to an artifact."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from tvmsched import __version__, frontend, kernels, lowering
from tvmsched.artifact import Artifact, Binding, Candidate, Layer, Manifest
from tvmsched.errors import TvmschedError
from tvmsched.layers import Graph, extract_graph
from tvmsched.targets import device_kind, make_target, target_json

log = logging.getLogger(__name__)


def compile_file(path: str | Path, **options) -> Artifact:
    """Load, check and compile an ONNX file (options as for `compile_model`)."""
    model = frontend.load_onnx(path)
    return compile_model(model, name=Path(path).stem, **options)


def compile_model(
    model: onnx.ModelProto,
    *,
    target: str = "llvm",
    input_shapes: dict | None = None,
    name: str = "model",
    tune_trials: int = 0,
    database=None,
    progress: bool = False,
) -> Artifact:
    """ONNX → Relax → fused layers → (tuned or default) kernels → artifact (in memory).

    Args:
        model: a checked ONNX model.
        target: "llvm", "cuda", a TVM target tag or a JSON target dict.
        input_shapes: static shapes for inputs whose ONNX shape is dynamic.
        name: the model name recorded in the manifest.
        tune_trials: MetaSchedule trials per layer; 0 keeps TVM's default schedules.
        database: a URL (sqlite, postgresql, http) or a MetaSchedule Database for tuning records.
        progress: show a progress bar while tuning.
    """
    signature = frontend.input_signature(model, input_shapes)
    frontend.check_supported_ops(model)
    tvm_target = make_target(target)
    mod = frontend.to_relax(model, signature)
    mod = lowering.legalize_and_fuse(mod, tvm_target)
    graph = extract_graph(mod)
    all_funcs = kernels.layer_funcs(mod)
    funcs = {f: all_funcs[f] for f in dict.fromkeys(layer.func for layer in graph.layers)}
    default = "dlight" if tvm_target.kind.name == "cuda" else "default"
    scheduled = kernels.default_schedule(funcs, tvm_target)
    schedules, tuning_summary = dict.fromkeys(funcs, default), None
    if tune_trials > 0:
        tuned, tuning_summary = _tune(funcs, tvm_target, database, tune_trials, progress)
        scheduled.update(tuned)
        schedules.update(dict.fromkeys(tuned, "tuned"))
    library = kernels.build_library({kernels.kernel_symbol(f, 0): scheduled[f] for f in funcs}, tvm_target)
    manifest = _manifest(model, graph, funcs, name, target, tvm_target, schedules, tuning_summary)
    log.info("compiled %s: %d layers, %d kernels", name, len(graph.layers), len(funcs))
    return Artifact(manifest, library, graph.weights)


def _tune(funcs: dict, tvm_target, database, trials: int, progress: bool) -> tuple[dict, dict]:
    """Tune into the database; returns the tuned PrimFuncs and a summary for the manifest."""
    from tvmsched import tuning

    if database is None or isinstance(database, str):
        from tvmsched.tuning_db import default_url, open_database

        url, database = database or default_url(), open_database(database, target=tvm_target)
    else:
        url = getattr(getattr(database, "store", None), "url", type(database).__name__)
    tuned, report = tuning.tune_layers(funcs, tvm_target, database, trials=trials, progress=progress)
    summary = {
        "trials_per_layer": trials,
        "database": url,
        "layers": {r.func: {"status": r.status, "trials": r.trials, "seconds": round(r.seconds, 2), "message": r.message} for r in report},
    }
    return tuned, summary


def _manifest(
    model, graph: Graph, funcs: dict, name: str, target: str, tvm_target, schedules: dict, tuning_summary: dict | None
) -> Manifest:
    import tvm

    output_names = [value.name for value in model.graph.output]
    if len(output_names) != len(graph.outputs):
        raise TvmschedError(f"the model declares {len(output_names)} outputs but computes {len(graph.outputs)}")
    device = device_kind(tvm_target)
    layers = tuple(
        Layer(
            index=layer.index,
            func=layer.func,
            inputs=layer.inputs,
            outputs=layer.outputs,
            flops=_flops(funcs[layer.func]),
            bytes=sum(graph.tensors[t].nbytes for t in (*layer.inputs, *layer.outputs)),
            candidates=(Candidate(id=0, kernel=kernels.kernel_symbol(layer.func, 0), schedule=schedules[layer.func]),),
        )
        for layer in graph.layers
    )
    return Manifest(
        model_name=name,
        target=target_json(target),
        device=device,
        device_code=kernels.cuda_device_code() if device == "cuda" else "native",
        inputs=tuple(Binding(n, t) for n, t in zip(frontend.input_signature_names(model), graph.inputs)),
        outputs=tuple(Binding(n, t) for n, t in zip(output_names, graph.outputs)),
        tensors=dict(graph.tensors),
        layers=layers,
        tvmsched_version=__version__,
        tvm_version=tvm.__version__,
        tuning=tuning_summary,
    )


def _flops(func) -> float:
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # the estimator rejects some loop nests; FLOPs are informative only
        return 0.0
