"""Default CUDA schedules fill the GPU (tvmsched.lower.gpu_schedule), checked without a GPU.

Waves: every layer holding >= 2% of a zoo model's FLOPs launches at least one block per SM in each of its
launches. Numerics: TIR's meaning is sequential (a thread binding only says where an iteration runs), so a
scheduled CUDA PrimFunc with its thread loops made serial and its shared/local buffers plain computes what
the GPU computes; built for the CPU, it must match the unscheduled layer.
"""

import re

import numpy as np
import pytest

from tvmsched import models
from tvmsched.lower import gpu_schedule
from tvmsched.lower import kernels
from tvmsched.lower.gpu_schedule import Tiling, choose_tiling
from tvmsched.passes.launch_geometry import launch_blocks
from tvmsched.pipeline import lower_model

H100_SMS = 132


@pytest.fixture(scope="module")
def scheduled():
    """{model: (unscheduled funcs, scheduled funcs, FLOP share of each func)} for the CUDA target."""
    out = {}
    for name in ("bert-tiny", "resnet18-small", "mobilenetv2", "resnet18"):
        graph, funcs, target = lower_model(models.build(name), "cuda")
        uses = {}
        for layer in graph.layers:
            uses[layer.func] = uses.get(layer.func, 0) + 1
        flops = {f: kernels.estimated_flops(funcs[f]) * uses[f] for f in funcs}
        total = sum(flops.values())
        out[name] = (funcs, kernels.default_schedule(funcs, target), {f: v / total for f, v in flops.items()})
    return out


@pytest.mark.parametrize("name", ["bert-tiny", "resnet18-small", "mobilenetv2", "resnet18"])
def test_heavy_layers_launch_a_full_wave(scheduled, name):
    import tvm

    _, funcs, share = scheduled[name]
    heavy = [f for f in funcs if share[f] >= 0.02]
    assert heavy
    short = {f: launch_blocks(tvm.IRModule({"main": funcs[f]})) for f in heavy}
    short = {f: b for f, b in short.items() if not b or min(b) < H100_SMS}
    assert not short, f"{name}: layers launching less than a wave of {H100_SMS} SMs: {short}"


def test_choose_tiling_keeps_large_tiles_where_they_fill_the_gpu():
    # ResNet-18's first 3x3 convolution at 56x56x64 (K = 3*3*64): plenty of outputs for a large tile
    t = choose_tiling(1, 56 * 56, 64, 576, H100_SMS)
    assert t.split_k == 1 and t.blocks(1, 56 * 56, 64) >= H100_SMS
    assert t.tile[0] * t.tile[1] >= 16 * 32
    # a GPU with fewer SMs takes a larger tile for the same layer, never a smaller one
    few = choose_tiling(1, 56 * 56, 64, 576, 16)
    assert few.tile[0] * few.tile[1] >= t.tile[0] * t.tile[1]


def test_choose_tiling_splits_k_only_where_no_tile_fills_the_gpu():
    # BERT-tiny's 128x128x128 projection: small tiles reach a wave, no split
    assert choose_tiling(1, 128, 128, 128, H100_SMS).split_k == 1
    # a 1x1 convolution at 3x3 with 960 input channels: 2880 outputs, a long K
    t = choose_tiling(1, 9, 320, 960, H100_SMS)
    assert t.split_k > 1 and t.blocks(1, 9, 320) >= H100_SMS
    assert gpu_schedule.slice_length(960, t.split_k) % gpu_schedule.MICRO_K == 0
    # too few outputs and too short a K: the most blocks there are, no split below one shared stage
    t = choose_tiling(1, 4, 8, 16, H100_SMS)
    assert t.split_k == 1 and t.blocks(1, 4, 8) == 1


def _serial(func):
    """The scheduled PrimFunc with every thread binding a serial loop, shared / local / WMMA fragment buffers plain,
    and the annotations that only GPU lowering reads (software pipelines, shared-memory stages) dropped."""
    import tvm

    text = func.script()
    text, bound = re.subn(
        r'T\.thread_binding\(([^,()]+(?:\([^()]*\))?), thread="[^"]+"(?:, annotations=\{[^{}]*\})?\)', r"T.serial(\1)", text
    )
    assert bound, "not a GPU schedule"
    text = re.sub(r', scope="(?:shared|shared\.dyn|local|wmma\.\w+)"', "", text)
    text = re.sub(r"^\s*T\.sblock_attr\(.*\)\n", "", text, flags=re.M)
    text = re.sub(r"(T\.serial\([^()]*(?:\([^()]*\))?[^()]*?), annotations=\{.*?\}\)(:)", r"\1)\2", text)
    return tvm.script.from_source(text)


def _run_on_cpu(func, inputs):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = func.params[-1]
    tensors = [tvm.runtime.tensor(x) for x in inputs]
    tensors.append(tvm.runtime.tensor(np.full([int(d) for d in out.shape], np.nan, str(out.dtype))))
    lib(*tensors)
    return tensors[-1].numpy()


@pytest.mark.parametrize("name", ["bert-tiny", "resnet18-small", "mobilenetv2"])
def test_scheduled_layers_compute_the_layer(scheduled, name):
    plain, funcs, _ = scheduled[name]
    rng = np.random.default_rng(7)
    checked = split = 0
    for f, func in funcs.items():
        extents = gpu_schedule.matmul_extents(plain[f])
        if extents is None:
            continue
        inputs = [rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)) for p in plain[f].params[:-1]]
        want = _run_on_cpu(plain[f], inputs)
        np.testing.assert_allclose(_run_on_cpu(_serial(func), inputs), want, rtol=1e-4, atol=1e-4, err_msg=f)
        checked += 1
        split += choose_tiling(*extents, H100_SMS).split_k > 1
    assert checked >= 5
    if name != "bert-tiny":
        assert split, "no split-K layer was checked"


def test_split_k_layer_keeps_its_epilogue():
    """A matmul + bias + ReLU whose K is split: two launches, both a full wave, the epilogue after the sum."""
    import onnx
    import tvm
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w, bias = rng.standard_normal([1024, 64]).astype("float32"), rng.standard_normal([64]).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["out"])],
        "split_k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1024])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 64])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    _, funcs, target = lower_model(model, "cuda")
    (name,) = [f for f in funcs if "matmul" in f]
    assert choose_tiling(*gpu_schedule.matmul_extents(funcs[name]), H100_SMS).split_k > 1
    func = kernels.default_schedule({name: funcs[name]}, target)[name]
    blocks = launch_blocks(tvm.IRModule({"main": func}))
    assert len(blocks) == 2 and min(blocks) >= H100_SMS, blocks
    data = rng.standard_normal([1, 8, 1024]).astype("float32")
    consts = [p for p in funcs[name].params[1:-1]]
    inputs = [data] + [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in consts]
    want = _run_on_cpu(funcs[name], inputs)
    np.testing.assert_allclose(_run_on_cpu(_serial(func), inputs), want, rtol=1e-4, atol=1e-4)
    assert np.all(want >= 0)  # the ReLU ran


def test_sm_count_override(monkeypatch):
    from tvmsched.errors import TvmschedError
    from tvmsched.lower.targets import gpu_sms, make_target

    target = make_target("cuda")
    assert gpu_sms(target) == H100_SMS
    monkeypatch.setenv("TVMSCHED_GPU_SMS", "58")
    assert gpu_sms(target) == 58
    for bad in ("lots", "0", "1025", "-3"):
        monkeypatch.setenv("TVMSCHED_GPU_SMS", bad)
        with pytest.raises(TvmschedError, match=rf"^TVMSCHED_GPU_SMS='{bad}' is not a whole number of SMs from 1 to 1024$"):
            gpu_sms(target)
    monkeypatch.setenv("TVMSCHED_GPU_SMS", " ")
    assert gpu_sms(target) == H100_SMS


def test_inspect_shows_sms_and_waves(compiled, cli):
    text = cli("inspect", compiled("bert-tiny", target="cuda")).stdout
    assert f"tiled for {H100_SMS} SMs" in text
    waves = [float(w) for w in re.findall(r" \d+b (\d+\.\d+)w ", text)]
    assert waves and max(waves) >= 1.0
    assert Tiling(8, 8, 1, 1).tile == (8, 8)


# fp16 on tensor cores: dlight's WMMA schedule, checked on the CPU through its intrinsic twin. Importing TVM's CUDA
# tensor intrinsics costs 20-30 s once per process (docs/tvm-pitfalls.md), so every test that tensorizes is here, in
# one pytest-xdist worker (--dist loadscope), compiling in this process.
def _convolutions():
    """Two convolutions as a CNN's middle stages have them: 3x3 from 32 to 64 channels, then 1x1 to 128, at 16x16."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.1, name)
               for name, shape in (("w3", [64, 32, 3, 3]), ("b3", [64]), ("w1", [128, 64, 1, 1]))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c3"], ["r"]),
         helper.make_node("Conv", ["r", "w1"], ["out"])],
        "convolutions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 128, 16, 16])], weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _attention_einsum():
    """Attention scores as some exports write them, an Einsum (bhid,bhjd->bhij) of queries and keys: at fp16 a matmul."""
    from tests.test_precision import einsum_model

    return einsum_model("bhid,bhjd->bhij", [(1, 4, 128, 64), (1, 4, 128, 64)])


@pytest.fixture(scope="module")
def fp16_scheduled():
    """{model: (unscheduled funcs, scheduled funcs, target)} at --precision fp16 for the CUDA target."""
    out = {}
    for name, model in (("bert-tiny", models.build("bert-tiny")), ("convolutions", _convolutions()),
                        ("attention einsum", _attention_einsum())):
        _, funcs, target = lower_model(model, "cuda", precision="fp16")
        out[name] = (funcs, kernels.default_schedule(funcs, target), target)
    return out


@pytest.mark.parametrize("name", ["bert-tiny", "convolutions", "attention einsum"])
def test_fp16_tensor_core_layers_and_row_reductions_compute_the_layer(fp16_scheduled, name):
    """Every fp16 tensor-core layer, through its twin (each WMMA fill / load / multiply / store replaced by the plain
    TIR its intrinsic describes, thread bindings made serial), computes what the unscheduled layer computes; so does
    every row reduction (a warp or a block per row) through the plain serial twin. SIMT and split-K layers are
    checked at fp32 above."""
    plain, funcs, target = fp16_scheduled[name]
    rng = np.random.default_rng(11)
    paths, unchecked = {}, []
    for f, func in funcs.items():
        path, reason = kernels.gpu_path(plain[f], func)
        if path is None:
            continue
        paths[f] = path
        if path in (gpu_schedule.SIMT, gpu_schedule.SPLIT_K):
            continue
        if path == gpu_schedule.TENSOR_CORES:
            twin = gpu_schedule.intrinsic_twin(plain[f], target, H100_SMS)
            if twin is None:
                unchecked.append(f)
                continue
            assert "tvm_mma_sync" in func.script() or "wmma" in func.script(), f  # the kernel itself is tensorized
        else:
            twin = func
        inputs = [rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)) for p in plain[f].params[:-1]]
        want = _run_on_cpu(plain[f], inputs).astype("float32")
        got = _run_on_cpu(_serial(twin), inputs).astype("float32")
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * scale, err_msg=f"{f} ({path}: {reason})")
    assert not unchecked, f"tensor-core layers without a CPU twin: {unchecked}"
    assert gpu_schedule.TENSOR_CORES in paths.values(), paths
    # every projection and attention product (head dim 64 included), every convolution (64 channels included)
    assert all(p == gpu_schedule.TENSOR_CORES for f, p in paths.items() if "matmul" in f or "conv" in f), paths
    if name == "bert-tiny":
        assert paths["layer_norm"] == gpu_schedule.WARP_PER_ROW and paths["fused_softmax_cast1"] == gpu_schedule.WARP_PER_ROW


def test_each_matmul_like_layer_states_its_path_and_why():
    from tvmsched.lower.gpu_schedule import sm_version, tensor_core_refusal
    from tvmsched.lower.targets import make_target

    assert sm_version(make_target("cuda")) == 90  # sm_90a: dlight's own rule reads it as no tensor cores at all
    assert tensor_core_refusal((1, 128, 128, 128), "float16", 90) is None
    assert tensor_core_refusal((1, 64, 64, 64), "float16", 70) is None  # head dim 64: 4x the work padded, still taken
    assert "float32 operands" in tensor_core_refusal((1, 128, 128, 128), "float32", 90)
    assert "sm_61" in tensor_core_refusal((1, 128, 128, 128), "float16", 61)
    assert "K = 8" in tensor_core_refusal((1, 128, 128, 8), "float16", 90)
    assert "8x the work" in tensor_core_refusal((1, 4, 128, 1152), "float16", 90)  # a 2x2 convolution's 4 rows
    # tiles from 16x16 (one warp, one fragment) to dlight's 128x128 (16 warps): the largest that fills the SMs, else
    # the most blocks
    assert gpu_schedule.tensor_core_tiles(1, 128, 128, H100_SMS)[0] == (16, 16)  # BERT-tiny: 64 blocks, not 1 (or 16)
    assert gpu_schedule.tensor_core_tiles(1, 128, 768, H100_SMS)[0] in ((32, 16), (16, 32))  # BERT-base: 192, not 96
    # ResNet-50's first stage (3136 x 64 outputs), padded as dlight's own schedule pads it (to 3200 x 128: a tile its
    # replay takes), at batch 8: a 4096-output tile, 800 blocks; at batch 1: 200 blocks, not dlight's 25
    tile = gpu_schedule.tensor_core_tiles(8, 3136, 64, H100_SMS)[0]
    assert tile[0] * tile[1] == 4096 and gpu_schedule.tensor_core_blocks(8, 3136, 64, *tile) == 800, tile
    assert gpu_schedule.tensor_core_blocks(1, 3136, 64, *gpu_schedule.tensor_core_tiles(1, 3136, 64, H100_SMS)[0]) == 200
    assert gpu_schedule.tensor_core_tiles(1, 128, 768, H100_SMS)[-1] == (128, 128)  # dlight's own, the last resort
    # fp32: no layer on tensor cores, each with the reason
    _, funcs, target = lower_model(models.build("bert-tiny"), "cuda")
    for f, func in kernels.default_schedule(funcs, target).items():
        path, reason = kernels.gpu_path(funcs[f], func)
        if "matmul" in f:
            assert path in (gpu_schedule.SIMT, gpu_schedule.SPLIT_K) and "float32 operands" in reason, (f, path, reason)


def test_row_reductions_take_a_warp_per_short_row():
    from tvmsched.lower.gpu_schedule import DLIGHT_ROW_THREADS, WARP, row_threads

    assert row_threads(128) == WARP and row_threads(256) == WARP  # BERT-tiny's rows; up to 8 elements a thread
    assert row_threads(768) == 128  # BERT-base's hidden size: 6 each
    assert row_threads(1 << 16) == DLIGHT_ROW_THREADS


def test_fp16_cuda_compile_shows_paths_with_their_flop_share_and_instruments_every_kernel(compiled, cli):
    """A CUDA fp16 artifact (nvcc where on PATH) as `tvmsched compile` ships it: `inspect` gives each layer's path,
    reason and share of the FLOPs, the shares per path adding up; every tensor-core kernel is idempotent and carries
    preempt-flag checks and progress counters."""
    import json

    path = compiled("bert-tiny", target="cuda", precision="fp16", progress_counters=True)
    text = cli("inspect", path).stdout
    summary = re.search(r"GPU paths of matmul-like layers and row reductions \(share of the model's FLOPs\): (.*)", text)
    assert summary, text
    shares = {p: float(v) for p, v in re.findall(r"([a-zA-Z -]+?) (\d+\.\d)% \(\d+ layers\)(?:, |$)", summary.group(1) + ", ")}
    assert shares.get("tensor cores", 0) >= 95.0 and "warp per row" in shares, summary.group(0)
    assert sum(shares.values()) <= 100.05
    manifest = json.loads(cli("inspect", path, "--json").stdout)
    tensor = [c for layer in manifest["layers"] for c in layer["candidates"] if c["path"] == "tensor cores"]
    assert len(tensor) >= 8
    for c in tensor:
        assert c["idempotent"] and c["preempt_check"] and c["progress_blocks"] >= 1 and c["threads"] >= 32, c
        assert c["path_reason"].startswith("fp16 WMMA 16x16x16"), c


def test_fp16_kit_records_on_tensor_cores_are_taken_and_a_simt_record_does_not_replace_a_tensor_core_default(tmp_path):
    """An fp16 CUDA kit: MetaSchedule samples tensor-core schedules of the matmul (their traces name WMMA intrinsics and
    hold IndexMaps, both of which the import must read). Measured there (times as `tune measure` reports them; no
    GPU here) and compiled here: the matmul runs its record on tensor cores. A faster record from SIMT code
    (dlight's own matmul rule, which never tensorizes on sm_90a) does not replace the tensor-core default here,
    where the two cannot be timed against each other; the softmax takes its record."""
    from onnx import TensorProto, helper, numpy_helper
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from tvmsched.pipeline import compile_model, open_tuning_database
    from tvmsched.tune.kit_build import build_kit, import_results
    from tvmsched.tune.search import task_module

    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["out"], axis=-1)],
        "mm_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 256])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 128, 128])],
        [numpy_helper.from_array(rng.standard_normal([256, 128]).astype("float32"), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kit = build_kit(model, tmp_path / "kit", target="cuda", samples=4, progress=False, precision="fp16")
    times = {e["func"]: {s["symbol"]: {"132": 10.0 + i} for i, s in enumerate(e["samples"])} for e in kit["funcs"]}
    results = {"kit": kit["id"], "device": "cuda", "unit_kind": "gpu_sm", "full_units": 132, "units": [132],
               "mechanism": "green_context", "times_us": times}
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert import_results(tmp_path / "kit", results, db) == sum(len(e["samples"]) for e in kit["funcs"])

    def compiled_layers():
        artifact = compile_model(model, target="cuda", precision="fp16", database=db)
        return artifact.manifest.tuning["layers"], {layer.func: layer.candidates[0] for layer in artifact.manifest.layers}

    tuning, candidates = compiled_layers()
    (matmul,) = [f for f in tuning if "matmul" in f]
    assert tuning[matmul]["kernel"] == "tuned", tuning[matmul]
    assert (candidates[matmul].path, candidates[matmul].path_reason) == (gpu_schedule.TENSOR_CORES,
                                                                       "tuned (MetaSchedule's tensor-core rule)")
    assert all(tuning[f]["kernel"] == "tuned" for f in tuning if "softmax" in f), tuning

    _, funcs, target = lower_model(model, "cuda", precision="fp16")
    with target:
        simt = dl.gpu.Matmul().apply(funcs[matmul], target, False)
    assert "wmma" not in simt.mod["main"].script()
    database = open_tuning_database(db, target)
    mod = task_module(funcs[matmul])
    database.commit_tuning_record(TuningRecord(simt.trace, database.commit_workload(mod), [1e-6], target,
                                               ArgInfo.from_prim_func(mod["main"])))  # faster than every TC record
    tuning, candidates = compiled_layers()
    assert tuning[matmul]["kernel"] == "default" and "tensor cores" in tuning[matmul]["message"], tuning[matmul]
    assert candidates[matmul].path == gpu_schedule.TENSOR_CORES and candidates[matmul].schedule == "dlight:WaveMatmul"


def _padded_epilogue():
    """A 1x1 convolution, swish and an asymmetric Pad (EfficientNet-B0 and MobileNet-v2 as TF exports them pad a layer's
    output for the stride-2 layer after it), which TVM's FuseOps made one layer (lowering._reshaping_as_injective)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
         helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Pad", ["m", "pads"], ["y"])],
        "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 29, 29])],
        [numpy_helper.from_array(rng.standard_normal((32, 16, 1, 1)).astype(np.float32) * 0.1, "w"),
         numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("fused", [False, True], ids=["as-lowered", "pad-as-epilogue"])
def test_a_layer_whose_epilogue_dlight_cannot_inline_takes_a_later_rule_and_computes_the_layer(monkeypatch, precision,
                                                                                               fused):
    """dlight's matmul schedules (SIMT and WMMA) assert on a layer whose epilogue pads its output ("There are some
    consumers of the cache-write stage that are not properly inlined"), and EfficientNet-B0 and MobileNet-v2-TF did not
    compile for CUDA at all, fp32 or fp16. Such a layer takes a later rule's schedule, says why, and computes the layer
    (`pad-as-epilogue`: the layer as FuseOps made it before the padding was marked injective). As lowered now, the
    padding is a layer of its own and the convolution takes dlight's path."""
    from tvmsched.lower import relax as lowering

    if fused:
        monkeypatch.setattr(lowering, "_reshaping_as_injective", lambda mod, _ctx: mod)
    _, plain, target = lower_model(_padded_epilogue(), "cuda", precision=precision)
    funcs = kernels.default_schedule(plain, target)
    layer = next(f for f in funcs if "conv2d" in f)
    assert ("pad" in layer) == fused, sorted(funcs)
    path, reason = kernels.gpu_path(plain[layer], funcs[layer])
    assert ("cannot inline this layer's epilogue" in reason) == fused, (path, reason)
    assert path == gpu_schedule.SIMT or not fused, (path, reason)
    rng = np.random.default_rng(5)
    for name in {layer, *(f for f in funcs if "pad" in f)}:
        params = plain[name].params[:-1]
        inputs = [rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)) for p in params]
        want = _run_on_cpu(plain[name], inputs).astype("float32")
        wmma = kernels.gpu_path(plain[name], funcs[name])[0] == gpu_schedule.TENSOR_CORES
        scheduled = gpu_schedule.intrinsic_twin(plain[name], target, H100_SMS) if wmma else funcs[name]
        got = _run_on_cpu(_serial(scheduled), inputs).astype("float32")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * max(1.0, float(np.abs(want).max())), err_msg=name)


def test_a_tensor_core_layer_that_dlight_pads_takes_a_smaller_tile_and_computes_the_layer():
    """ResNet-50's first stage at batch 1, a 1x1 convolution of 56 x 56 x 64: 3136 x 64 outputs, which dlight's
    128 x 128 schedule pads (to 3200 x 128) and launches in 25 blocks. Its trace replayed with a smaller tile inlines
    the padding's producer, so the smaller tile pads the same way (`tensor_core_pad_factor`); before, every smaller tile
    failed to replay here and the layer kept dlight's 25 blocks on 132 SMs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "stage",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
        [numpy_helper.from_array(rng.standard_normal((64, 64, 1, 1)).astype(np.float32) * 0.1, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, plain, target = lower_model(model, "cuda", precision="fp16")
    funcs = kernels.default_schedule(plain, target)
    layer = next(f for f in funcs if "conv2d" in f)
    path, reason = kernels.gpu_path(plain[layer], funcs[layer])
    assert path == gpu_schedule.TENSOR_CORES and "128x128" not in reason and "200 blocks" in reason, reason
    twin = gpu_schedule.intrinsic_twin(plain[layer], target, H100_SMS)
    inputs = [rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)) for p in plain[layer].params[:-1]]
    want = _run_on_cpu(plain[layer], inputs).astype("float32")
    got = _run_on_cpu(_serial(twin), inputs).astype("float32")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * max(1.0, float(np.abs(want).max())))
