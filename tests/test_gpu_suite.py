"""The GPU suite (bench/gpu: twins.py, slim.py, prepare.py, suite.py, suite.sh), checked on the CPU.

PyTorch twins match onnxruntime; slim artifacts restore byte for byte (and refuse a different model);
the suite's driver runs end to end in its CPU mode under the runtime-only TVM of the kit (no compiler
library), writes the report with every column, and degrades to "failed:" / "skipped:" cells (a bad
torch.compile backend, a worker killed at its time cap) instead of crashing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import ROOT, onnxruntime_outputs, run_cli
from tvmsched import models

GPU_DIR = ROOT / "bench" / "gpu"
if str(GPU_DIR) not in sys.path:
    sys.path.append(str(GPU_DIR))

import slim  # noqa: E402  (bench/gpu)
import twins  # noqa: E402

torch = pytest.importorskip("torch")

# the zoo models the suite carries, the rest of the zoo, and two real exports (a Caffe2 ResNet-50 at
# opset 9, a TorchScript BERT with the ids/mask/token-type front end)
TWIN_MODELS = ["mlp", "tiny", "resnet18-small", "mobilenetv2", "bert-tiny", "bert-tiny-ids", "dlrm-small", "resnet50", "bert-4l"]


def _feeds(name: str, model: onnx.ModelProto) -> dict:
    return models.real_inputs(name, seed=1) if name in models.REAL_MODELS else models.random_inputs(model, seed=1)


def _shapes(name: str):
    return models.REAL_MODELS[name].input_shapes if name in models.REAL_MODELS else None


@pytest.mark.parametrize("name", TWIN_MODELS)
def test_twin_matches_onnxruntime(name):
    model = models.build(name)
    feeds = _feeds(name, model)
    reference = onnxruntime_outputs(model, feeds)
    twin = twins.build_twin(model, _shapes(name)).eval()
    with torch.no_grad():
        outputs = twin(*[torch.from_numpy(feeds[n]) for n in twin.input_names])
    assert twin.output_names == list(reference)
    for got, (out_name, want) in zip(outputs, reference.items()):
        assert got.shape == want.shape, out_name
        scale = max(1.0, float(np.max(np.abs(want))))
        assert np.max(np.abs(got.numpy() - want)) <= 1e-4 * scale, out_name


def test_twin_runs_pytorch_ops_not_folded_ones():
    """Batch norms stay (as in a hand-written model); Linear and GELU fuse as nn.Linear / F.gelu do."""
    resnet = twins.build_twin(models.build("resnet18-small"))
    names = [getattr(fn, "__name__", "") for fn, _, _ in resnet._steps]
    assert names.count("run") >= 40  # 20 convolutions + 20 batch norms (closures named run)
    bert = twins.build_twin(models.build("bert-tiny"))
    names = [getattr(fn, "__name__", "") for fn, _, _ in bert._steps]
    assert names.count("linear") == 12 and names.count("gelu") == 2 and "erf" not in names


def test_twin_names_an_unsupported_op():
    from onnx import TensorProto, helper

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(twins.TwinError, match="Hardmax"):
        twins.build_twin(model)


def test_slim_cuda_artifact_travels_without_its_weights(tmp_path):
    """A CUDA artifact's weights all come back from the seeded model: the slim file is a few percent of it."""
    onnx_path, artifact = tmp_path / "mlp.onnx", tmp_path / "mlp.tvms"
    models.save("mlp", onnx_path)
    result = run_cli("compile", onnx_path, "--target", "cuda", "-o", artifact)
    assert result.returncode == 0, result.stderr
    record = slim.pack(artifact, tmp_path / "mlp.slim", models.build("mlp"), name="mlp")
    weights = sum(r["nbytes"] for r in slim.weight_ranges(artifact.read_bytes()))
    assert record["regenerated_bytes"] >= weights - slim.MIN_BYTES
    assert record["carried_bytes"] < 0.1 * artifact.stat().st_size
    restored = tmp_path / "restored.tvms"
    slim.unpack(tmp_path / "mlp.slim", restored)  # rebuilds mlp from the recorded name and seed
    assert restored.read_bytes() == artifact.read_bytes()
    with pytest.raises(slim.SlimError, match="not the one compiled"):
        slim.unpack(tmp_path / "mlp.slim", tmp_path / "other.tvms", models.build("mlp", seed=1))
    assert not (tmp_path / "other.tvms").exists()


# ---------------------------------------------------------------------------------------------------
# the driver, end to end, in CPU mode under the kit's runtime-only TVM


@pytest.fixture(scope="module")
def kit_site(tmp_path_factory):
    """The kit's TVM (bench/gpu/make-kit.sh --tvm-only: no libtvm_compiler.so) unpacked as the device does."""
    folder = tmp_path_factory.mktemp("kit")
    done = subprocess.run(["bash", str(GPU_DIR / "make-kit.sh"), "--tvm-only", str(folder)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    site = folder / "site"
    with tarfile.open(folder / "tvm-runtime.tgz") as archive:
        archive.extractall(site, filter="data")
    assert (site / "tvm" / "lib" / "libtvm_runtime.so").exists()
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    return site


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """prepare.py's carried folder for two small models compiled for the CPU."""
    folder = tmp_path_factory.mktemp("suite")
    carried = folder / ".gpu"
    done = subprocess.run([sys.executable, str(GPU_DIR / "prepare.py"), "--target", "llvm", "--models", "mlp", "bert-tiny",
                           "--out", str(carried), "--build-dir", str(folder / "build"), "--kit", str(folder / "no-kit")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    suite = json.loads((carried / "suite.json").read_text())
    assert [e["model"] for e in suite["artifacts"]] == ["mlp", "bert-tiny"]
    assert suite["device"] == "cpu" and all((carried / e["file"]).exists() for e in suite["artifacts"])
    assert "carried:" in done.stdout
    return folder, carried


def _run_suite(folder, carried, site, name: str, *extra: str) -> tuple[subprocess.CompletedProcess, str, dict]:
    out = folder / f"{name}.md"
    env = {**os.environ, "PYTHONPATH": str(site), "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run([sys.executable, "-P", str(GPU_DIR / "suite.py"), "--artifacts", str(carried), "--out", str(out),
                           "--work", str(folder / f"work-{name}"), "--copy-to", str(folder / f"copy-{name}"), *extra],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw = json.loads((folder / "raw" / f"{name}.json").read_text())
    assert (folder / f"copy-{name}" / f"{name}.md").read_text() == out.read_text()
    return done, out.read_text(), raw


def test_suite_cpu_mode_end_to_end_without_the_compiler(prepared, kit_site):
    folder, carried = prepared
    _, report, raw = _run_suite(folder, carried, kit_site, "cpu", "--repeat", "10", "--warmup", "2",
                                "--compile-backend", "eager")
    for heading in ("## Carried", "## Correctness", "## Latency (ms, p50 / p99)", "## GPU kernels (CUPTI) and host cost per launch",
                    "## Goals", "## Reading"):
        assert heading in report
    for column in ("| model | variant | layers | tvmsched | PyTorch eager | eager + CUDA graph | torch.compile |",
                   "| tvmsched ÷ eager | tvmsched ÷ CUDA graph | tvmsched ÷ torch.compile |",
                   "kernels / run: tvmsched", "GPU busy µs / run: tvmsched", "host µs / launch", "issue µs / launch",
                   "| file | model | variant | artifact MB | carried MB | weights regenerated there MB | restore s |"):
        assert column in report
    results = {r["model"]: r for r in raw["results"]}
    assert set(results) == {"mlp", "bert-tiny"}
    for r in results.values():
        assert r["worker"]["rc"] == 0
        assert r["restore"]["artifact_bytes"] > 0 and "failed" not in r["restore"]
        assert r["tvmsched"]["ok"] and r["tvmsched"]["p50_ms"] > 0 and r["tvmsched"]["runs"] == 10
        assert r["twin"]["ok"] and r["eager"]["p50_ms"] > 0
        assert r["compile"]["ok"] and r["compile"]["p50_ms"] > 0
        assert r["cuda_graph"] == {"skipped": "no CUDA graphs on the CPU"}
        # it ran on the kit's runtime-only TVM: the compiler library was neither there nor loaded
        assert r["env"]["tvm_path"].startswith(str(kit_site)) and r["env"]["tvm_compiler_library_present"] is False
        assert any(lib.startswith(str(kit_site)) and lib.endswith("libtvm_runtime.so") for lib in r["libraries"])
        assert not any("libtvm_compiler" in lib for lib in r["libraries"])
    row = next(line for line in report.splitlines() if line.startswith("| bert-tiny | default | 30 |"))
    assert "skipped: no CUDA graphs on the CPU" in row and row.count("×") == 2  # ÷ eager and ÷ torch.compile


def test_fp16_and_batched_rows_run_as_cpu_twins_with_their_own_pytorch_columns(tmp_path):
    """prepare.py --rows: an fp16 row at batch 4 carried slim (its fp16 weights regenerated from the float32
    initializers), run beside the default row by docs/gpu.md's plan, step 3, through bench/gpu/session.sh as a CPU
    twin: tvmsched and the half-precision PyTorch twin at 4 rows, each checked against onnxruntime in float32 within
    the fp16 bound. The plan runs the steps that fit in order; the first that does not is where the next call resumes."""
    carried = tmp_path / ".gpu"
    done = subprocess.run([sys.executable, str(GPU_DIR / "prepare.py"), "--target", "llvm", "--models", "mlp",
                           "--rows", "mlp:fp16@4", "--out", str(carried), "--build-dir", str(tmp_path / "build"),
                           "--kit", str(tmp_path / "no-kit")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    entries = {e["variant"]: e for e in json.loads((carried / "suite.json").read_text())["artifacts"]}
    assert set(entries) == {"default", "fp16-b4"}
    assert (entries["fp16-b4"]["precision"], entries["fp16-b4"]["batch"]) == ("fp16", 4)
    assert entries["fp16-b4"]["regenerated_bytes"] > 0.8 * entries["fp16-b4"]["artifact_bytes"] / 2  # fp16 weights travel slim
    bad = subprocess.run([sys.executable, str(GPU_DIR / "prepare.py"), "--rows", "mlp:fp8@2"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode == 2 and "--rows takes [MODEL:]fp32|fp16[@BATCH]" in bad.stderr.splitlines()[-1]

    def plan(name: str, **env) -> tuple[str, dict]:
        out = tmp_path / name
        out.mkdir()
        done = subprocess.run(["bash", str(GPU_DIR / "session.sh"), "plan"], capture_output=True, text=True, cwd=ROOT,
                              timeout=300, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                                                "OUT": str(out), "SESSION_DEVICE": "cpu", "SESSION_DIR": str(carried), **env})
        assert done.returncode == 0, done.stdout + done.stderr
        with tarfile.open(out / "results.tgz") as archive:
            files = {m.name.removeprefix("./"): archive.extractfile(m).read().decode() for m in archive if m.isfile()}
        return done.stdout, files

    log, files = plan("dry", SESSION_BUDGET_S="400", PLAN_DRY="1")
    assert "plan: step 2 (preemption) within 110 s" in log and "plan: step 3 (fp16 rows) needs 230 s, 120 s left" in log
    assert files["plan-next.txt"].strip() == "PLAN_FROM=3"
    log, files = plan("step3", SESSION_BUDGET_S="100", PLAN_FROM="3", PLAN_BUDGETS="170 110 80 150 200 150",
                      PLAN_SUITE_MODELS="mlp")
    assert "fp16 rows: exit 0" in log and files["plan-next.txt"].strip() == "PLAN_FROM=4", log
    rows = {r["variant"]: r for r in json.loads(files["raw/gpu-fp16.json"])["results"]}
    fp16 = rows["fp16-b4"]
    assert fp16["pytorch_here"] and rows["default"]["pytorch_here"]  # each row its own PyTorch twin run
    assert fp16["build"]["inputs"]["input"][0] == 4 and rows["default"]["build"]["inputs"]["input"][0] == 1
    for step in ("tvmsched", "twin"):
        assert fp16[step]["ok"] and fp16[step]["tol"] == pytest.approx(2e-2 * max(1.0, fp16[step]["ref_max_abs"]))
        assert fp16[step]["max_abs_err"] > 0  # computed in half, not a float32 run under a loose bound
    assert rows["default"]["tvmsched"]["tol"] == pytest.approx(1e-4 * max(1.0, rows["default"]["tvmsched"]["ref_max_abs"]))
    report = files["gpu-fp16.md"]
    assert re.search(r"^\| mlp \| fp16-b4 \| 5 \| \d+\.\d{3} / \d+\.\d{3} \| \d+\.\d{3} / ", report, re.M), report
    assert re.search(r"^\| mlp \| fp16-b4 \| \d\.\de-\d\d \| \d\.\de-\d\d \| .* \| yes \|$", report, re.M), report


def test_fp16_goals_read_the_batch_8_rows():
    import suite

    def row(precision, busy, eager=None):
        r = {"model": "bert-base", "variant": "fp16-b8" if precision == "fp16" else "b8", "precision": precision, "batch": 8,
             "profile_tvmsched": {"busy_us_per_run": busy}, "pytorch_here": eager is not None}
        if eager is not None:
            r["profile_eager"] = {"busy_us_per_run": eager}
        return r

    results = [row("fp32", 900.0), row("fp16", 300.0, eager=250.0)]
    lines = suite.fp16_goal_lines(results, {suite.row_key(r): r for r in results if r["pytorch_here"]})
    assert lines == ["| fp16 GPU busy ÷ PyTorch fp16 eager's kernels | bert-base | fp16-b8 | 1.20× | ≤ 1.5× | yes |",
                     "| tvmsched fp32 GPU busy ÷ its fp16 (batch 8) | bert-base | fp16-b8 | 3.00× | ≥ 2.0× | yes |"]
    results[1]["profile_tvmsched"] = {"skipped": "CUPTI needs a GPU"}
    assert all("not measured" in line for line in suite.fp16_goal_lines(results, {}))


def test_suite_degrades_to_failed_cells(prepared, kit_site):
    folder, carried = prepared
    # a torch.compile that fails: its cells say so, every other number is there
    _, report, raw = _run_suite(folder, carried, kit_site, "badcompile", "--models", "mlp", "--repeat", "5", "--warmup", "1",
                                "--compile-backend", "no-such-backend")
    (result,) = raw["results"]
    assert "failed" in result["compile"] and result["tvmsched"]["ok"]
    row = next(line for line in report.splitlines() if line.startswith("| mlp | default | 4 |"))
    assert "failed: " in row and re.search(r"\| \d+\.\d{3} / \d+\.\d{3} \|", row)  # tvmsched and eager still timed
    # a worker killed at its time cap: the report is still written, naming what was cut short (0.2 s: less than the
    # worker takes to start Python and import torch; a cap of 1.5 s was met by a whole mlp pass on a quiet machine)
    _, report, raw = _run_suite(folder, carried, kit_site, "killed", "--models", "mlp", "--model-cap-s", "0.2",
                                "--compile-backend", "none")
    (result,) = raw["results"]
    assert result["worker"]["killed"] is True
    assert "## Failures" in report and "killed at the time budget" in report
    # a budget too small for a second model's first pass skips it, and torch.compile passes with little time left:
    # 15.5 s gives the first model's worker its minimum of 10 s (the budget less 5 s), and leaves the second less as
    # soon as the first has taken 0.5 s (a worker that starts Python and imports torch takes more)
    _, report, raw = _run_suite(folder, carried, kit_site, "budget", "--budget-s", "15.5", "--reserve-s", "0",
                                "--repeat", "5", "--warmup", "1", "--min-compile-s", "1000")
    first, second = raw["results"]
    assert first["tvmsched"]["ok"] and first["compile"]["skipped"].startswith("time budget")
    assert second["worker"] == {"skipped": "time budget spent"}
    assert "bert-tiny: skipped (time budget spent)" in report


def test_report_on_gpu_results():
    """The GPU-only parts of the report (CUPTI columns, host cost per launch, goals, per-kernel tables) from
    results shaped as a CUDA worker writes them (the numbers are made up here, the report is not written)."""
    import suite

    def timing(p50):
        return {"p50_ms": p50, "p99_ms": p50 * 1.1, "runs": 200, "seconds": 1.0}

    def profile(kernels, busy, name):
        return {"kernels_per_run": kernels, "busy_us_per_run": busy, "seconds": 1.0,
                "top": [{"name": f"{name}_{i}", "calls_per_run": 1, "us_per_run": busy / kernels} for i in range(kernels)]}

    check = {"max_abs_err": 2e-6, "ok": True, "tol": 1e-4, "seconds": 1.0}
    default = {"model": "resnet18", "variant": "default", "file": "resnet18.tvms.slim", "pytorch_here": True,
               "env": {"gpu": "NVIDIA H200", "driver": "580.1", "sms": 132}, "worker": {"rc": 0},
               "tvmsched": {**timing(3.4), **check, "layers": 24, "enqueue_us_p50": 48.0},
               "twin": check, "eager": {**timing(1.9), "enqueue_us_p50": 680.0}, "cuda_graph": {**timing(1.2), **check},
               "compile": {"failed": "BackendCompilerFailed: no triton"},
               "profile_tvmsched": profile(24, 3300.0, "default_function_kernel"), "profile_eager": profile(68, 1200.0, "cudnn")}
    tuned = {"model": "resnet18", "variant": "tuned", "file": "resnet18.tuned.tvms.slim", "pytorch_here": False,
             "worker": {"rc": 0}, "tvmsched": {**timing(1.8), **check, "layers": 24}, "eager": {"skipped": "other artifact"},
             "profile_tvmsched": profile(24, 1700.0, "tuned_kernel")}
    meta = {"date": "2026-11-26 00:00 UTC", "device": "cuda", "elapsed_s": 100, "budget_s": 400, "repeat": 200, "warmup": 20,
            "profile_runs": 20, "suite": {"kit": {"bytes": 7_700_000}}, "carried_bytes": 800_000,
            "entries": [{"file": "resnet18.tvms.slim", "artifact_bytes": 47_127_727, "carried_bytes": 82_157, "regenerated_bytes": 46_715_648}]}
    report = suite.render([default, tuned], meta)
    row = next(line for line in report.splitlines() if line.startswith("| resnet18 | default | 24 | 68 | 3300 | 1200 |"))
    # busy ratio 2.75x; host per run 3400 - 3300 = 100 us over 24 launches; issue 48 / 24 and 680 / 68 us per launch
    assert "| 2.75× | 100 | 4.17 | 2.00 | 10.00 |" in row
    assert "| untuned GPU busy ÷ PyTorch eager's kernels | resnet18 | default | 2.75× | ≤ 1.5× | no |" in report
    assert "| tuned end-to-end ÷ PyTorch eager | resnet18 | tuned | 0.95× | ≤ 1.0× | yes |" in report
    assert "| tuned end-to-end ÷ eager + CUDA graph | resnet18 | tuned | 1.50× | ≤ 1.2× | no |" in report
    latency = next(line for line in report.splitlines() if line.startswith("| resnet18 | tuned | 24 |"))
    assert "| 1.800 / 1.980 | 1.900 / 2.090 | 1.200 / 1.320 | failed: BackendCompilerFailed: no triton |" in latency
    assert "| 1 | `default_function_kernel_0` | 1 | 137.5 | `cudnn_0` | 1 | 17.6 |" in report
    assert "GPU: NVIDIA H200" in report and "driver 580.1" in report and "| 47.13 | 0.08 | 46.72 |" in report


def test_shell_scripts_parse():
    for script in ("suite.sh", "prepare.sh", "make-kit.sh", "sharing.sh"):
        done = subprocess.run(["bash", "-n", str(GPU_DIR / script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)


def test_suite_sh_explains_a_missing_kit(tmp_path):
    """suite.sh run where nothing was prepared: one error line naming the preparation, exit 2."""
    repo = tmp_path / "repo"
    (repo / "bench" / "gpu").mkdir(parents=True)
    (repo / "bench" / "gpu" / "suite.sh").write_text((GPU_DIR / "suite.sh").read_text())
    done = subprocess.run(["bash", str(repo / "bench" / "gpu" / "suite.sh")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "bench/gpu/prepare.sh" in done.stderr


def test_kit_activate_installs_without_pip(tmp_path):
    """The kit's activate.sh (written by make-kit.sh) unzips the wheels itself and re-installs a changed kit."""
    text = (GPU_DIR / "make-kit.sh").read_text()
    activate = text.split("cat > \"$kit/activate.sh\" <<'EOS'\n", 1)[1].split("\nEOS\n", 1)[0]
    assert "pip install" not in activate
    kit = tmp_path / ".devkit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "activate.sh").write_text(activate.replace("/tmp/devkit-site", str(tmp_path / "site")) + "\n")
    with tarfile.open(kit / "tvm-runtime.tgz", "w:gz") as archive:
        (tmp_path / "tvm").mkdir()
        (tmp_path / "tvm" / "__init__.py").write_text("")
        archive.add(tmp_path / "tvm", "tvm")
    for stamp, module in (("one", "first_wheel"), ("two", "second_wheel")):
        with zipfile.ZipFile(kit / "wheels" / "w-1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{module}/__init__.py", "")
        (kit / "stamp").write_text(stamp)
        done = subprocess.run(["bash", "-c", "source .devkit/activate.sh && echo \"$PYTHONPATH\""], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(str(tmp_path / "site"))
        assert (tmp_path / "site" / module / "__init__.py").exists() and (tmp_path / "site" / "tvm").is_dir()
    assert not (tmp_path / "site" / "first_wheel").exists()  # the changed kit replaced the old install
