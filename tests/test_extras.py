"""Only what is used (issue 37, item 5): compiling with default schedules and running never import torch, and a part
whose extra is missing (tuning, a real architecture, PostgreSQL, the collectives) is one `error:` line naming it.

A missing extra is played by a child process whose imports of the extra's modules fail, as they do where the
packages are not installed (the wheel test, tests/test_wheel.py, installs none of them for real)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import ROOT, assert_user_error
from tvmsched.extras import EXTRAS, missing


def not_installed(modules: tuple[str, ...]) -> str:
    """Python code that makes importing (and finding) any of `modules` fail from then on, as if not installed."""
    return textwrap.dedent(f"""
        import importlib.util, sys
        HIDDEN = {modules!r}

        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in HIDDEN:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, NotInstalled())
        real_find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in HIDDEN else real_find_spec(name, *a)
    """)


def run_without(modules: tuple[str, ...], *args: str) -> subprocess.CompletedProcess:
    """`tvmsched ARGS` in a child process where importing any of `modules` fails as if it were not installed."""
    script = not_installed(modules) + "from tvmsched.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-P", "-c", script, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_every_extra_names_modules_that_the_dev_environment_has():
    assert set(EXTRAS) == {"tune", "db", "collectives", "models"}
    for extra in EXTRAS:
        assert missing(extra) == [], extra  # the tests' environment holds them all (the `dev` extra)


def test_compiling_and_running_with_default_schedules_never_import_torch(compiled, tmp_path):
    """In a fresh process where torch is installed (TVM's own packages would import it), a whole compile and run."""
    path = compiled("mlp")
    script = textwrap.dedent(f"""
        import sys
        from tvmsched import models
        from tvmsched.pipeline import compile_model
        from tvmsched.runtime import Runtime, load

        compile_model(models.build("tiny"), name="tiny").save({str(tmp_path / "tiny.tvms")!r})
        executor = load({str(path)!r})
        executor.run(executor.random_inputs(seed=0))
        with Runtime("cpu") as rt:
            model = rt.load({str(path)!r}, qos_ms=1000)
            rt.submit(model, executor.random_inputs(seed=1)).result(timeout=60)
        import tvm.relax.frontend.onnx, tvmsched.serve.service
        print(sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "grpc_tools", "xgboost")))
    """)
    result = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_torch_still_imports_after_tvmsched_and_tvm():
    script = "import tvmsched, tvm, torch, tvm_ffi; print(torch.ones(2).sum().item(), 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-P", "-c", f"import sys; {script}"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2.0", "True"]


def test_tuning_workers_start_without_torch_and_run_tvm():
    """MetaSchedule's builders and runners are TVM popen-pool workers; tvmsched starts them with torch hidden (torch is
    installed here: the dev extra has it), and they still do TVM's work."""
    from tvm.support.popen_pool import PopenPoolExecutor

    from tvmsched.tune.search import workers_started_by_tvmsched

    workers_started_by_tvmsched()
    workers_started_by_tvmsched()  # idempotent
    pool = PopenPoolExecutor(max_workers=1, timeout=300)
    try:
        found = pool.submit(lambda: (sys.argv[0], "torch" in sys.modules, __import__("tvm").tirx.IntImm("int32", 7).value)).result()
    finally:
        pool.shutdown()
    assert found[0].endswith(str(Path("tvmsched", "tune", "popen_worker.py"))) and found[1:] == (False, 7)


def test_tuning_without_the_tune_extra_is_one_error_line(tmp_path):
    model = tmp_path / "mlp.onnx"
    from tvmsched import models

    models.save("mlp", model)
    result = run_without(EXTRAS["tune"], "compile", str(model), "--tune-trials", "2", "-o", str(tmp_path / "m.tvms"))
    assert_user_error(result, "tuning", "'tune' extra", "pip install 'tvmsched[tune]'")
    assert not (tmp_path / "m.tvms").exists()
    kit = run_without(EXTRAS["tune"], "tune", "kit", str(model), "--target", "llvm", "-o", str(tmp_path / "kit"))
    assert_user_error(kit, "tune kit", "'tune' extra")


def test_compiling_with_default_schedules_needs_no_extra(tmp_path):
    from tvmsched import models

    models.save("tiny", tmp_path / "tiny.onnx")
    hidden = tuple(sorted({module for modules in EXTRAS.values() for module in modules}))
    result = run_without(hidden, "compile", str(tmp_path / "tiny.onnx"), "-o", str(tmp_path / "tiny.tvms"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "tiny.tvms").is_file()


def test_a_real_architecture_without_the_models_extra_is_one_error_line(tmp_path):
    result = run_without(EXTRAS["models"], "models", "build", "resnet50", "-o", str(tmp_path / "r.onnx"))
    assert_user_error(result, "resnet50", "'models' extra", "pip install 'tvmsched[models]'")


def test_postgresql_without_the_db_extra_is_one_error_line():
    result = run_without(EXTRAS["db"], "db", "stats", "--db", "postgresql+psycopg://me@127.0.0.1:1/tuning")
    assert_user_error(result, "PostgreSQL", "'db' extra", "pip install 'tvmsched[db]'")
    service = run_without(EXTRAS["db"], "db", "stats", "--db", "http://127.0.0.1:1")
    assert_user_error(service, "database service", "'db' extra")


def test_the_collectives_agent_without_the_collectives_extra_is_one_error():
    script = not_installed(("torch",)) + textwrap.dedent("""
        from tvmsched.errors import TvmschedError
        try:
            from tvmsched.runtime.collectives import agent
        except TvmschedError as err:
            print(err)
    """)
    result = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "'collectives' extra" in result.stdout and "pip install 'tvmsched[collectives]'" in result.stdout
    # the parts that need no torch (the simulator, the controller) still answer
    assert run_without(("torch",), "collectives", "simulate", "--help").returncode == 0
