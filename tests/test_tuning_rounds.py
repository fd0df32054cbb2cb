"""Tuning in rounds for a device this machine lacks, and the runtime-only TVM that measures kits there (on CPU).

- `tune measure` runs in a real subprocess under a runtime-only TVM laid out as bench/gpu/make-kit.sh lays it out
  (the tvm package without libtvm_compiler.so, TVM_USE_RUNTIME_LIB=1): the GPU machine's setting.
- The rounds: kit -> measure -> import -> kit ... on llvm, measured on this CPU; round 2's search is seeded from
  round 1's imported records; compile --db then runs the records. kit and import run in this process (the full
  TVM's side), measure in the runtime-only subprocess.
- A kit of default CUDA schedules built without nvcc (CUDA source that TVM compiles when the library is loaded):
  loading it under the runtime-only TVM failed on the H200 with "module 'tvm.target._ffi_api' has no attribute
  'TargetCurrent'"; here it loads through a stand-in libcuda.so.1.
- Local GPU tuning (compile --target cuda --tune-minutes): the runner choice, and the error without a GPU.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import assert_user_error, cli_in_process, run_cli
from tvmsched import models
from tvmsched.tune import search as tuning
from tvmsched.errors import TvmschedError
from tvmsched.tuning_db import open_store

SAMPLES = 4  # per layer and round; mlp has 4 layers


@pytest.fixture(scope="module")
def runtime_only_env(tmp_path_factory):
    """Environment of a process whose `import tvm` is the runtime-only copy (what the GPU machine has)."""
    import tvm

    site = tmp_path_factory.mktemp("runtime-only")
    # what bench/gpu/make-kit.sh removes from the installed package
    shutil.copytree(Path(tvm.__file__).parent, site / "tvm",
                    ignore=shutil.ignore_patterns("libtvm_compiler.so", "3rdparty", "src", "include", "web", "__pycache__"))
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    env = {**os.environ, "PYTHONPATH": str(site), "TVM_USE_RUNTIME_LIB": "1"}
    env.pop("TVMSCHED_DB", None)
    return env


def run_in(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -P ARGS...` under `env` (-P: the copy on PYTHONPATH, not the working directory, provides tvm)."""
    return subprocess.run([sys.executable, "-P", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def test_the_runtime_only_copy_has_no_compiler(runtime_only_env):
    probe = run_in(runtime_only_env, "-c", textwrap.dedent("""
        import json, tvm, tvm.base, tvm.target._ffi_api as api
        print(json.dumps({"file": tvm.__file__, "runtime_only": tvm.base._RUNTIME_ONLY,
                          "compiler": "tvm_compiler" in tvm.base._LOADED_LIBS, "target_current": hasattr(api, "TargetCurrent")}))
    """))
    assert probe.returncode == 0, probe.stderr
    facts = json.loads(probe.stdout.splitlines()[-1])
    assert facts["file"].startswith(runtime_only_env["PYTHONPATH"]) and facts["runtime_only"] and not facts["compiler"]
    assert not facts["target_current"]  # the API whose absence broke the H200's measurement


# ---- K rounds of N samples, measured on this CPU ------------------------------------------------------------------


@pytest.fixture(scope="module")
def rounds(tmp_path_factory, runtime_only_env):
    """Two rounds through the CLI: kit (here, in process) -> measure (runtime-only TVM, a subprocess) -> import (here,
    in process), same database."""
    tmp = tmp_path_factory.mktemp("rounds")
    model = tmp / "mlp.onnx"
    models.save("mlp", model)
    db = f"sqlite:///{tmp / 'tuning.db'}"
    out = {"tmp": tmp, "model": model, "db": db}
    for r in (1, 2):
        kit, results = tmp / f"kit{r}", tmp / f"results{r}.json"
        made = cli_in_process("tune", "kit", model, "--target", "llvm", "--samples", SAMPLES, "--db", db, "-o", kit)
        assert made.returncode == 0, made.stderr
        measured = run_in(runtime_only_env, "-m", "tvmsched.cli", "tune", "measure", kit, "-o", results, "--units", "all")
        assert measured.returncode == 0, measured.stderr
        imported = cli_in_process("tune", "import", kit, results, "--db", db)
        assert imported.returncode == 0, imported.stderr
        out[r] = {"kit": json.loads((kit / "kit.json").read_text()), "results": json.loads(results.read_text()),
                  "kit_out": made.stdout, "import_out": imported.stdout, "records": open_store(db).stats()["records"]}
    return out


def test_round_one_samples_at_random_and_its_measurements_become_records(rounds):
    kit, results = rounds[1]["kit"], rounds[1]["results"]
    assert "round 1 (random samples), 4 layers" in rounds[1]["kit_out"]
    assert kit["round"] == 1 and all(e["search"] == "replay" and e["seeded"] is None for e in kit["funcs"])
    full = str(results["full_units"])
    assert results["units"] == [results["full_units"]]  # --units all: only all units, as a round needs
    times = [t[full] for per_func in results["times_us"].values() for t in per_func.values()]
    assert all(t > 0 for t in times) and len(times) == sum(len(e["samples"]) for e in kit["funcs"])
    assert rounds[1]["records"] == len(times) and f"round 1: stored {len(times)} measured records" in rounds[1]["import_out"]


def test_round_two_is_searched_from_round_one_records(rounds):
    """Every layer of round 2 comes from the evolutionary search seeded with round 1's records: its first
    population took the database's fastest record, which is round 1's fastest measured sample, and none of
    round 2's schedules repeats one already measured."""
    kit1, results1, kit2 = rounds[1]["kit"], rounds[1]["results"], rounds[2]["kit"]
    assert kit2["round"] == 2
    assert f"round 2 (4 of 4 layers searched from {rounds[1]['records']} measured records)" in rounds[2]["kit_out"]
    full = str(results1["full_units"])
    for before, after in zip(kit1["funcs"], kit2["funcs"]):
        assert after["func"] == before["func"] and after["search"] == "evolutionary"
        times = results1["times_us"][before["func"]]
        best = min(before["samples"], key=lambda s: times[s["symbol"]][full])
        seeded = after["seeded"]
        assert seeded["records"] == len(before["samples"])
        assert seeded["best_us"] == pytest.approx(times[best["symbol"]][full], rel=1e-5)
        assert seeded["population_seeds"][0]["trace"] == tuning.trace_digest(best["trace"])
        assert seeded["population_seeds"][0]["us"] == pytest.approx(seeded["best_us"], rel=1e-6)
        measured = {tuning.trace_digest(s["trace"]) for s in before["samples"]}
        assert 1 <= len(after["samples"]) <= SAMPLES
        assert not measured & {tuning.trace_digest(s["trace"]) for s in after["samples"]}


def test_round_two_is_imported_and_compared_with_the_database_best(rounds):
    stored = rounds[2]["records"] - rounds[1]["records"]
    assert stored == sum(len(e["samples"]) for e in rounds[2]["kit"]["funcs"])
    line = rounds[2]["import_out"]
    assert re.search(rf"round 2: stored {stored} measured records; \d of 4 seeded layers measured faster than the database's best "
                     r"\(sum of the layers' best [\d.e+-]+ -> [\d.e+-]+ us\)", line), line


def test_compile_with_the_database_runs_the_rounds_records(rounds, cli):
    out = rounds["tmp"] / "mlp.tvms"
    done = cli("compile", rounds["model"], "--db", rounds["db"], "-o", out)
    assert done.returncode == 0, done.stderr
    result = cli("inspect", out, "--json")
    assert result.returncode == 0, result.stderr
    tuning_summary = json.loads(result.stdout)["tuning"]
    assert tuning_summary["records_only"] and tuning_summary["trials"] == 0  # nothing searched: the records alone
    assert {v["status"] for v in tuning_summary["layers"].values()} <= {"cached", "default-kept"}
    assert all(v["tuned_us"] is not None for v in tuning_summary["layers"].values())  # each record's kernel was timed here
    assert open_store(rounds["db"]).stats()["records"] == rounds[2]["records"]  # compiling stores nothing


def test_the_round_counts_rounds_of_samples_per_workload():
    from tvmsched.tune.kit_build import kit_round

    def seeded(workload, records):
        return {"workload": workload, "seeded": {"records": records}}

    assert kit_round([{"workload": "a", "seeded": None}], 8) == 1
    assert kit_round([seeded("a", 8), seeded("b", 5)], 8) == 2
    assert kit_round([seeded("a", 16), seeded("a", 16)], 8) == 2  # two layers of one workload: 16 records per round
    assert kit_round([seeded("a", 17)], 8) == 4  # a partly measured round counts


def test_fresh_kit_ignores_the_database(rounds, tmp_path, cli):
    made = cli("tune", "kit", rounds["model"], "--target", "llvm", "--samples", "2", "--db", rounds["db"], "--fresh",
               "-o", tmp_path / "kit")
    assert made.returncode == 0 and "round 1 (random samples)" in made.stdout, made.stderr


# ---- a kit of CUDA source (built without nvcc), loaded under the runtime-only TVM ---------------------------------

_DEFAULT_SCHEDULE_KIT = """
import json, sys, uuid
from pathlib import Path
from tvmsched import models
from tvmsched.lower import kernels
from tvmsched.lower.layers import arg_specs
from tvmsched.pipeline import lower_model
from tvmsched.tuning_db.ms_adapter import target_dict

out = Path(sys.argv[1])
graph, funcs, target = lower_model(models.build("mlp"), "cuda", None)
specs = arg_specs(graph)
entries = []
for name, func in kernels.default_schedule(funcs, target).items():
    (out / f"{name}.so").write_bytes(kernels.build_library({f"{name}__s0": func}, target))
    entries.append({"func": name, "library": f"{name}.so", "args": [[list(s), d] for s, d in specs[name]],
                    "samples": [{"symbol": f"{name}__s0", "grid_limited": {}}]})
kit = {"version": 1, "id": uuid.uuid4().hex, "model": "mlp", "device": "cuda", "mechanism": "green_context",
       "grid_limit_units": [], "target": target_dict(target), "funcs": entries}
(out / "kit.json").write_text(json.dumps(kit))
print(kernels.cuda_device_code())
"""

_LOAD_KIT = """
import json, sys, tvm
from tvmsched.runtime.devices import _ensure_cuda_runtime
from tvmsched.tune.kit_run import load_library, read_kit

_ensure_cuda_runtime(tvm)
kit = read_kit(sys.argv[1])
print(json.dumps({e["func"]: [m.kind for m in load_library(kit, sys.argv[1], e).imports] for e in kit["funcs"]}))
"""


@pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("cc")), reason="needs nvcc and a C compiler")
def test_a_default_schedule_kit_of_cuda_source_loads_under_the_runtime_only_tvm(runtime_only_env, tmp_path):
    from tvmsched.lower.cuda_toolchain import _STUB_SOURCE

    kit = tmp_path / "kit"
    kit.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_CUDA_COMPILE_MODE", "LD_PRELOAD")}
    built = subprocess.run([sys.executable, "-c", _DEFAULT_SCHEDULE_KIT, kit], capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0 and built.stdout.split()[-1] == "source", built.stderr  # no driver: CUDA source
    (tmp_path / "stub.c").write_text(_STUB_SOURCE)  # TVM loads its CUDA runtime only when libcuda.so.1 loads
    stub = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", stub, tmp_path / "stub.c"], check=True)
    # the H200's setting: nvcc mode, as prepare_cuda_build sets it where nvcc exists
    there = {**runtime_only_env, "LD_PRELOAD": str(stub), "TVM_CUDA_COMPILE_MODE": "nvcc"}
    loaded = run_in(there, "-c", _LOAD_KIT, kit)
    assert "TargetCurrent" not in loaded.stderr and loaded.returncode == 0, loaded.stderr
    kinds = json.loads(loaded.stdout.splitlines()[-1])
    assert len(kinds) == 4 and all(k == ["cuda"] for k in kinds.values())  # each layer's device code compiled and loaded
    # the whole command: without a GPU it stops at the device, with one line
    assert_user_error(run_in(there, "-m", "tvmsched.cli", "tune", "measure", kit, "-o", tmp_path / "r.json"), "no cuda device")


# ---- tuning on a local GPU: compile --target cuda --tune-minutes ----------------------------------------------------


def test_a_cuda_target_is_measured_by_metaschedule_local_runner_on_the_local_gpu():
    import tvm.s_tir.meta_schedule as ms

    from tvmsched.lower.targets import make_target

    cuda, cpu = make_target("cuda"), make_target("llvm")
    assert tuning.device_kind(cuda) == "cuda" and tuning.device_kind(cpu) == "cpu"
    # where the GPU exists: MetaSchedule's LocalRunner, which runs each candidate on tvm.device(target kind, 0)
    assert isinstance(tuning.measurement_runner(cuda, device_present=True), ms.runner.LocalRunner)
    assert isinstance(tuning.measurement_runner(cpu), ms.runner.LocalRunner)
    assert isinstance(tuning.measurement_runner(cuda, "127.0.0.1:9190:h100"), ms.runner.RPCRunner)
    with pytest.raises(TvmschedError, match="this machine has none.*--rpc.*tune kit"):
        tuning.measurement_runner(cuda, device_present=False)
    assert tuning.local_device_present("cpu")


@pytest.mark.skipif(tuning.local_device_present("cuda"), reason="this machine has a GPU: compile would tune on it")
def test_compile_tune_minutes_for_cuda_without_a_gpu_is_one_error_line(tmp_path):
    model = tmp_path / "mlp.onnx"
    models.save("mlp", model)
    result = run_cli("compile", model, "--target", "cuda", "--tune-minutes", "1", "--db", f"sqlite:///{tmp_path / 't.db'}",
                     "-o", tmp_path / "m.tvms")
    assert_user_error(result, "measures its trials on a cuda device and this machine has none", "--rpc", "tune kit",
                      after_progress=True)
    assert not (tmp_path / "m.tvms").exists()
