"""`--target llvm` is the host CPU, `llvm:LEVEL` a portable level; artifacts record the CPU features their
kernels need, and every loader (CLI, Python runtime, C++ engine and examples) refuses a CPU that lacks one."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import assert_user_error, run_cli
from tests.test_artifact import rewrite_member
from tests.test_cpp_examples import cpp_build  # noqa: F401  (the fixture: `make cpp` once)
from tvmsched import models
from tvmsched.lower import targets
from tvmsched.artifact.format import Artifact, Manifest
from tvmsched.errors import TvmschedError
from tvmsched.pipeline import compile_model

X86 = platform.machine() in ("x86_64", "AMD64")
x86_only = pytest.mark.skipif(not X86, reason="CPU features are recorded and checked on x86-64 only")
CORES = os.cpu_count() or 1


def test_llvm_is_the_host_cpu():
    host = targets.host_cpu()
    assert host, "LLVM names no CPU for this machine"
    assert targets.target_json("llvm") == {"kind": "llvm", "mcpu": host, "num-cores": CORES}
    assert targets.target_json("llvm:host") == targets.target_json("llvm")
    # "native" is what LLVM's own tools take; the wheel's LLVM rejects it and falls back to generic
    assert targets.target_json('{"kind": "llvm", "mcpu": "native", "num-cores": 1}') == {"kind": "llvm", "mcpu": host, "num-cores": 1}
    target = targets.make_target("llvm")
    assert str(target.attrs["mcpu"]) == host and int(target.attrs["num-cores"]) == CORES


@pytest.mark.parametrize(
    "spec, config",
    [
        ("llvm:portable", {"kind": "llvm", "num-cores": CORES}),
        ("llvm:generic", {"kind": "llvm", "num-cores": CORES}),
        ("llvm:x86-64", {"kind": "llvm", "mcpu": "x86-64", "num-cores": CORES}),
        ("llvm:x86-64-v2", {"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": CORES}),
        ("llvm:x86-64-v3", {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": CORES}),
        ("llvm:x86-64-v4", {"kind": "llvm", "mcpu": "x86-64-v4", "num-cores": CORES}),
        ("llvm:skylake-avx512", {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": CORES}),
        ('{"kind": "llvm", "mcpu": "x86-64-v3"}', {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": CORES}),
        ('{"kind": "llvm", "num-cores": 2}', {"kind": "llvm", "num-cores": 2}),  # explicit JSON: as given
    ],
)
@x86_only
def test_portable_levels_are_valid_targets(spec, config):
    assert targets.target_json(spec) == config
    target = targets.make_target(spec)
    assert target.kind.name == "llvm" and not targets.is_cuda_spec(spec)
    cpu, features, unchecked = targets.cpu_requirements(target)
    assert cpu == config.get("mcpu", "generic") and unchecked is None
    assert list(features) == sorted(features) and set(features) <= set(targets.X86_RUNTIME_FEATURES)
    expect = {"x86-64-v2": {"sse4.2", "popcnt"}, "x86-64-v3": {"avx2", "fma"}, "x86-64-v4": {"avx512f", "avx512bw"},
              "skylake-avx512": {"avx512f", "avx512vl"}}.get(cpu, set())
    assert expect <= set(features)
    if cpu in ("generic", "x86-64"):
        assert features == ()
    if cpu in ("x86-64-v2", "x86-64-v3"):
        assert not any(f.startswith("avx512") for f in features)
    if cpu == "x86-64-v2":
        assert "avx" not in features


def test_target_parsing_needs_no_tvm():
    code = ("import sys; from tvmsched.lower.targets import is_cuda_spec; "
            "assert not is_cuda_spec('llvm') and not is_cuda_spec('llvm:x86-64-v3') and is_cuda_spec('cuda'); "
            "assert 'tvm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_unknown_cpu_is_one_error_line(tmp_path):
    with pytest.raises(TvmschedError, match="LLVM knows no CPU named 'pentium9'"):
        targets.make_target("llvm:pentium9")
    model = tmp_path / "tiny.onnx"
    model.write_bytes(models.build("tiny").SerializeToString())
    assert_user_error(run_cli("compile", model, "--target", "llvm:pentium9"), "pentium9", "x86-64-v3")


@x86_only
def test_the_generated_code_differs_by_level():
    """A vectorized loop: zmm registers only for AVX-512 targets, ymm for x86-64-v3, xmm only for portable."""
    import tvm
    from tvm import te

    a = te.placeholder((4096,), name="A")
    b = te.compute((4096,), lambda i: a[i] * 2.0 + 1.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    (loop,) = sch.get_loops(sch.get_sblock("B"))
    sch.vectorize(sch.split(loop, [None, 64])[1])

    def registers(spec: str) -> set[str]:
        asm = tvm.compile(sch.mod, target=targets.make_target(spec)).mod.inspect_source("asm")
        return set(re.findall(r"%([xyz]mm)\d+", asm))

    assert registers("llvm:portable") == {"xmm"}
    assert "ymm" in registers("llvm:x86-64-v3") and "zmm" not in registers("llvm:x86-64-v3")
    assert "zmm" in registers("llvm:x86-64-v4")
    if "avx512f" in targets.host_cpu_features():
        assert "zmm" in registers("llvm")


@x86_only
def test_the_engine_and_llvm_agree_on_features():
    """The engine's CPUID table is the same list, reads the same host features as LLVM, and knows the levels."""
    from tvmsched.runtime.native import func

    info = func("cpu_features")()
    assert sorted(str(f) for f in info["checked"]) == sorted(targets.X86_RUNTIME_FEATURES)
    assert tuple(sorted(str(f) for f in info["host"])) == targets.host_cpu_features()
    for level in targets.X86_LEVELS:
        wanted = targets.cpu_requirements(targets.make_target(f"llvm:{level}"))[1]
        assert sorted(str(f) for f in info["levels"][level]) == list(wanted), level
    # the host's own CPU never asks for a feature this machine lacks (a VM may hide some of its model's)
    assert set(targets.cpu_requirements(targets.make_target("llvm"))[1]) <= set(targets.host_cpu_features())


@x86_only
def test_the_host_target_turns_off_what_a_vm_hides(monkeypatch):
    """A guest whose CPU model has AVX-512 that the VM hides: the host target must not need it."""
    real = targets.host_cpu_features()
    if "avx512f" not in targets.cpu_requirements(targets.make_target("llvm"))[1]:
        pytest.skip("this CPU model has no AVX-512 to hide")
    monkeypatch.setattr(targets, "host_cpu_features", lambda: tuple(f for f in real if not f.startswith("avx512")))
    targets.host_mattr.cache_clear()
    try:
        config = targets.target_json("llvm")
        assert config["mcpu"] == targets.host_cpu() and "-avx512f" in config["mattr"]
        features = targets.cpu_requirements(targets.make_target("llvm"))[1]
        assert "avx2" in features and not any(f.startswith("avx512") for f in features)
    finally:
        targets.host_mattr.cache_clear()
    monkeypatch.undo()
    assert ("mattr" in targets.target_json("llvm")) == bool(targets.host_mattr())  # usually nothing is hidden


def test_tuning_records_keep_one_target_hash():
    """Tuning records are keyed by the target: the host target must hash the same in every process."""
    from tvmsched.tuning_db.ms_adapter import target_to_json
    from tvmsched.tuning_db.store import target_hash

    code = ("from tvmsched.lower.targets import make_target; from tvmsched.tuning_db.ms_adapter import target_to_json; "
            "from tvmsched.tuning_db.store import target_hash; print(target_hash(target_to_json(make_target('llvm'))))")
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    text = target_to_json(targets.make_target("llvm"))
    assert other.stdout.strip() == target_hash(text)
    assert json.loads(text).get("mcpu") == targets.host_cpu()


# ---- the artifact records its CPU, loaders refuse a CPU that lacks its features ---------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, compiled):
    """The zoo's tiny model compiled for this machine's CPU (the shared cache's): (model, artifact, folder)."""
    model = models.build("tiny")
    return model, compiled.artifact("tiny"), tmp_path_factory.mktemp("targets")


@pytest.fixture(scope="module")
def absent_feature() -> str:
    """A feature the engine checks that this CPU lacks (none has both XOP and AVX512-FP16)."""
    if not X86:
        pytest.skip("CPU features are checked on x86-64 only")
    return next(f for f in targets.X86_RUNTIME_FEATURES if f not in targets.host_cpu_features())


@pytest.fixture(scope="module")
def foreign(tiny, absent_feature):
    """tiny's artifact, its manifest claiming a CPU with a feature this one lacks (checksums redone by save)."""
    _, artifact, folder = tiny
    manifest = dataclasses.replace(artifact.manifest, cpu="futurecpu",
                                   cpu_features=tuple(sorted({*artifact.manifest.cpu_features, absent_feature})))
    path = folder / "foreign.tvms"
    Artifact(manifest, artifact.library, artifact.weights).save(path)
    return path


@x86_only
def test_the_manifest_records_cpu_and_features(tiny, compiled, tmp_path):
    model, artifact, _ = tiny
    host = targets.make_target("llvm")
    assert artifact.manifest.target == targets.target_json("llvm")
    assert artifact.manifest.cpu == targets.host_cpu()
    assert artifact.manifest.cpu_features == targets.cpu_requirements(host)[1] and artifact.manifest.cpu_features
    assert artifact.manifest.cpu_features_unchecked is None
    artifact.save(tmp_path / "a.tvms")
    assert Artifact.load(tmp_path / "a.tvms").manifest == artifact.manifest  # JSON round trip
    portable = compiled.artifact("tiny", target="llvm:portable").manifest  # the next test runs it
    assert (portable.cpu, portable.cpu_features, portable.target) == ("generic", (), {"kind": "llvm", "num-cores": CORES})
    v3 = compile_model(model, name="tiny", target="llvm:x86-64-v3").manifest
    assert v3.cpu == "x86-64-v3" and {"avx2", "fma"} <= set(v3.cpu_features)


def test_an_artifact_without_the_fields_still_loads(tiny, compiled, tmp_path):
    """Artifacts written before the CPU was recorded: generic, loaded and run as before."""
    from tvmsched.runtime import load

    _, artifact, _ = tiny
    old = {k: v for k, v in artifact.manifest.to_json().items() if not k.startswith("cpu")}
    manifest = Manifest.from_json(old)
    assert (manifest.cpu, manifest.cpu_features, manifest.cpu_features_unchecked) == (None, (), None)
    path = tmp_path / "old.tvms"
    compiled.copy("tiny", path, target="llvm:portable")
    rewrite_member(path, "manifest.json", lambda data: json.dumps(
        {k: v for k, v in json.loads(data).items() if not k.startswith("cpu")}).encode(), fix_checksum=True)
    x = np.array([[0.0, 1.0, 2.0, -3.0]], np.float32)
    np.testing.assert_array_equal(load(path).run({"x": x})["y"], np.maximum(2 * x - 1, 0))


def _refusal(absent_feature: str, path) -> re.Pattern:
    return re.compile(rf"^{re.escape(str(path))} was compiled for futurecpu and needs CPU features {absent_feature} "
                      r"that this CPU \(.+\) lacks; recompile with --target llvm on this machine or --target llvm:\S+$")


def test_run_refuses_a_cpu_without_the_features(cli, foreign, absent_feature):
    result = run_cli("run", foreign)
    assert_user_error(result, "was compiled for futurecpu", f"needs CPU features {absent_feature} ", "--target llvm:")
    assert _refusal(absent_feature, foreign).match(result.stderr.strip().removeprefix("error: "))
    assert cli("inspect", foreign).returncode == 0  # reading it is fine: only loading its code is refused


def test_the_python_runtime_refuses_a_cpu_without_the_features(foreign, absent_feature, tiny, tmp_path):
    from tvmsched.runtime import Executor, Runtime, load
    from tvmsched.artifact.signing import generate_keys

    with pytest.raises(TvmschedError) as refused:
        load(foreign)
    assert _refusal(absent_feature, foreign).match(str(refused.value))
    with pytest.raises(TvmschedError, match="the artifact of model tiny was compiled for futurecpu"):
        Executor(Artifact.load(foreign))  # in memory: checked before it becomes a temporary file
    with Runtime("cpu") as rt, pytest.raises(TvmschedError, match=f"needs CPU features {absent_feature} "):
        rt.load(foreign)
    # signed by a trusted key: still refused, for its CPU
    key_path, pub, key = generate_keys(tmp_path / "me")
    signed = tmp_path / "signed.tvms"
    _, artifact, _ = tiny
    Artifact(Artifact.load(foreign).manifest, artifact.library, artifact.weights).save(signed, signing_key=key)
    with pytest.raises(TvmschedError, match="was compiled for futurecpu"):
        load(signed, trusted_keys=[pub])
    assert Manifest.verified(signed, [pub]).cpu == "futurecpu"  # verifying without loading code is fine


def test_the_cpp_engine_refuses_a_cpu_without_the_features(cpp_build, foreign, absent_feature, tmp_path):  # noqa: F811
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 4), np.float32))
    result = subprocess.run([str(cpp_build / "tvmsched_run"), str(foreign), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                            capture_output=True, text=True, timeout=120)
    assert_user_error(result, f"needs CPU features {absent_feature} ")
    assert _refusal(absent_feature, foreign).match(result.stderr.strip().removeprefix("error: "))
    assert not (tmp_path / "out.npz").exists()
