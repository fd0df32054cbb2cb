"""Mutation fuzzing (issue 12, widened by issue 28 item 5): seeded random mutations of zoo models,
artifacts and run inputs, and fixed cases of artifact paths that are not files, members that pass
their checksum but are not what they claim, hostile manifest values and a kernels.so with a constructor.

Every case must end in exit 0, or exit 2 with exactly one `error:` line on stderr — never a signal,
a traceback or an "internal error". Every artifact goes through `tvmsched inspect`, `tvmsched run` and
the Python API (`load(path).run(...)`, which must succeed or raise a one-line TvmschedError). The cases
run in one child process (one interpreter start); a crash of the child fails the test and names the
case it was running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CASES_PER_KIND = {"onnx": 40, "artifact": 40, "inputs": 20}  # bounded: about half a minute on 2 cores

_CHILD = r'''
import contextlib, copy, hashlib, io, json, os, random, subprocess, sys, zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvmsched import models
from tvmsched.cli.main import main
from tvmsched.errors import TvmschedError
from tvmsched.runtime import load

seed, counts, folder = int(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
rng = random.Random(seed)
INTS = [-(2**63), -(2**31), -1, 0, 1, 2, 3, 7, 2**31, 2**62]


def cli(*args):
    """main(args) -> (exit code, all it wrote to stderr, native code's writes to fd 2 included)."""
    import gc, os, tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                code = main([str(a) for a in args])
            gc.collect()  # objects the case left behind warn now, not during a later case
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return code, tmp.read().decode(errors="replace")


def load_and_run(path, trusted_keys=()):
    """The Python API: (0, "") if load(path).run() works, (2, "error: MESSAGE") for a TvmschedError (its message
    as it is: it must be one line too), (1, the exception) for anything else."""
    try:
        executor = load(path, trusted_keys=trusted_keys)
        executor.run(executor.random_inputs())
        del executor
        return 0, ""
    except TvmschedError as err:
        return 2, f"error: {err}"
    except Exception as err:  # noqa: BLE001
        return 1, f"{type(err).__name__}: {err}"


def attempt(mode, path):
    """One artifact through `tvmsched inspect`, `tvmsched run` or load().run()."""
    return load_and_run(path) if mode == "load" else cli(mode, path)


MODES = ("inspect", "run", "load")


def mutate_model(model):
    m = copy.deepcopy(model)
    g = m.graph
    kind = rng.choice(["attr", "dim", "dtype", "input_name", "drop_node", "init_dims", "op_type", "opset", "bytes", "output"])
    if kind == "attr":
        attrs = [a for n in g.node for a in n.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT)]
        if attrs:
            a = rng.choice(attrs)
            if a.type == onnx.AttributeProto.INT:
                a.i = rng.choice(INTS)
            elif a.type == onnx.AttributeProto.INTS and a.ints:
                a.ints[rng.randrange(len(a.ints))] = rng.choice(INTS)
            else:
                a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
    elif kind == "dim":
        values = list(g.input) + list(g.output)
        dims = [d for v in values for d in v.type.tensor_type.shape.dim]
        if dims:
            rng.choice(dims).dim_value = rng.choice([0, 1, 2, 3, 5, 10**6])
    elif kind == "dtype":
        rng.choice(list(g.input) + list(g.output)).type.tensor_type.elem_type = rng.choice(
            [TensorProto.INT64, TensorProto.INT32, TensorProto.DOUBLE, TensorProto.BOOL, TensorProto.STRING, TensorProto.FLOAT16])
    elif kind == "input_name":
        node = rng.choice(list(g.node))
        names = [i.name for i in g.initializer] + [o for n in g.node for o in n.output] + ["", "ghost"]
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif kind == "drop_node":
        del g.node[rng.randrange(len(g.node))]
    elif kind == "init_dims" and g.initializer:
        init = rng.choice(list(g.initializer))
        if init.dims:
            init.dims[rng.randrange(len(init.dims))] = rng.choice([0, 1, 2, 7])
    elif kind == "op_type":
        rng.choice(list(g.node)).op_type = rng.choice(["Relu", "Gemm", "Conv", "Softmax", "Reshape", "Gather", "Add", "NotAnOp"])
    elif kind == "opset":
        m.opset_import[0].version = rng.choice([1, 6, 9, 13, 23, 99])
    elif kind == "output":
        del g.output[:]
    data = m.SerializeToString()
    if kind == "bytes":
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[: rng.randint(len(data) // 2, len(data))])
    return kind, data


HOSTILE = [-3, -1, 10**9, 2**31, 2**63, 10**30, -0.5, 1e308, float("nan"), float("inf"), "a\nerror: b\x1b[2J"]
NUMERIC = {"units", "blocks", "latency_us", "memory_bytes", "threads", "progress_blocks", "flops", "bytes", "qos_bound_us",
           "unit_latency_us", "qos_ms", "preempt_flags", "gpu_sms", "index", "id", "schema_version", "shape"}


def random_value():
    return rng.choice([None, -1, 0, 2**40, 3.5, "x", "", [], {}, [1, 2], {"a": 1}, True] + HOSTILE)


def json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from json_paths(v, (*path, i))


def mutate_artifact(base: bytes):
    with zipfile.ZipFile(io.BytesIO(base)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    kind = rng.choice(["manifest", "manifest", "manifest", "hostile", "hostile", "flip", "truncate", "member"])
    if kind in ("manifest", "hostile"):
        manifest = json.loads(members["manifest.json"])
        paths = [p for p in json_paths(manifest) if p]
        if kind == "hostile":  # a number the engine or inspect reads (or a slot of one), set to a hostile value
            manifest["qos_ms"], manifest["gpu_sms"] = manifest.get("qos_ms"), manifest.get("gpu_sms")
            for layer in manifest["layers"]:
                layer["unit_latency_us"] = layer.get("unit_latency_us") or {"1": 10.0}
            paths = [p for p in json_paths(manifest) if any(key in NUMERIC for key in p if isinstance(key, str))]
        path = rng.choice(paths)
        target = manifest
        for key in path[:-1]:
            target = target[key]
        if kind == "manifest" and rng.random() < 0.2 and isinstance(target, (dict, list)):
            del target[path[-1]]
            value = "deleted"
        else:
            value = target[path[-1]] = rng.choice(HOSTILE) if kind == "hostile" else random_value()
        members["manifest.json"] = json.dumps(manifest).encode()
        sums = json.loads(members["checksums.json"])
        sums["manifest.json"] = hashlib.sha256(members["manifest.json"]).hexdigest()
        members["checksums.json"] = json.dumps(sums).encode()
        kind = f"{kind}:" + "/".join(map(str, path)) + f"={value!r}"
    elif kind == "member":
        name = rng.choice(list(members))
        members[name] = members[name][: rng.randrange(len(members[name]) + 1)]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    data = bytearray(out.getvalue())
    if kind == "flip":
        for _ in range(rng.randint(1, 16)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "truncate":
        data = data[: rng.randrange(len(data))]
    return kind, bytes(data)


def random_inputs(names_shapes):
    feeds = {}
    for name, shape, dtype in names_shapes:
        choice = rng.choice(["ok", "shape", "dtype", "nan", "huge_index", "missing", "extra", "empty"])
        if choice == "missing":
            continue
        if choice == "shape":
            shape = tuple(rng.choice([0, 1, 2, 5]) for _ in range(rng.randint(0, 3)))
        if choice == "dtype":
            dtype = rng.choice(["float64", "int8", "bool", "complex64"])
        if choice == "empty":
            shape = (0,) + tuple(shape[1:])
        value = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(shape).astype(dtype)
        if choice == "nan" and value.dtype.kind == "f":
            value[...] = np.nan
        if choice == "huge_index" and value.dtype.kind == "i":
            value[...] = rng.choice([-(2**62), 2**31, 10**6, -10**6])
        feeds[name] = value
        if choice == "extra":
            feeds["extra"] = value
    return choice, feeds


def with_member(base: bytes, member: str, data: bytes, path: Path) -> Path:
    """`base` with `member` replaced by `data` and its checksum recomputed (as anyone can), written to `path`."""
    with zipfile.ZipFile(io.BytesIO(base)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[member] = data
    sums = json.loads(members["checksums.json"])
    sums[member] = hashlib.sha256(data).hexdigest()
    members["checksums.json"] = json.dumps(sums).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    return path


def shared_library(name: str, source: str) -> bytes:
    (folder / f"{name}.c").write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", folder / f"{name}.so", folder / f"{name}.c"], check=True)
    return (folder / f"{name}.so").read_bytes()


def npz(**arrays) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


results = []
def report(kind, detail, code, err, expect=None, **facts):
    """One case; `expect` (the exit code) and `facts` (marker=...) are what the parent asserts beyond the oracle."""
    results.append({"kind": kind, "detail": detail, "code": code, "stderr": err, "expected_code": expect, **facts})
    print(json.dumps(results[-1]), flush=True)

bases = {name: models.build(name) for name in ("tiny", "mlp", "dlrm-small")}
for i in range(counts["onnx"]):
    name = rng.choice(list(bases))
    kind, data = mutate_model(bases[name])
    path = folder / f"m{i}.onnx"
    path.write_bytes(data)
    print(json.dumps({"starting": f"onnx {i} {name} {kind}"}), flush=True)
    report("onnx", f"{name}:{kind}", *cli("compile", path, "-o", folder / f"m{i}.tvms"))

for name in ("mlp", "dlrm-small"):  # NAME.tvms: the parent's copy of what `tvmsched compile NAME.onnx` writes
    models.save(name, folder / f"{name}.onnx")
    assert (folder / f"{name}.tvms").is_file()
for i in range(counts["artifact"]):
    name = rng.choice(["mlp", "dlrm-small"])
    kind, data = mutate_artifact((folder / f"{name}.tvms").read_bytes())
    path = folder / f"a{i}.tvms"
    path.write_bytes(data)
    for mode in MODES:
        print(json.dumps({"starting": f"artifact {i} {name} {kind} {mode}"}), flush=True)
        report("artifact", f"{name}:{kind}:{mode}", *attempt(mode, path))

# paths that are not artifact files: refused with one line, never read (a FIFO would block, /dev/zero never end)
special = folder / "special"
special.mkdir()
(special / "folder.tvms").mkdir()
os.mkfifo(special / "fifo.tvms")
(special / "empty.tvms").write_bytes(b"")
os.symlink(special / "absent", special / "dangling.tvms")
os.symlink(special / "loop-b.tvms", special / "loop-a.tvms")
os.symlink(special / "loop-a.tvms", special / "loop-b.tvms")
os.symlink(special / "folder.tvms", special / "to-folder.tvms")
for path in [*sorted(special.iterdir()), Path("/dev/null"), Path("/dev/zero")]:
    for mode in MODES:
        print(json.dumps({"starting": f"path {path} {mode}"}), flush=True)
        report("path", f"{path.name}:{mode}", *attempt(mode, path), expect=2)

# members that pass their checksum but are not what they claim
mlp, dlrm = ((folder / f"{n}.tvms").read_bytes() for n in ("mlp", "dlrm-small"))
with zipfile.ZipFile(io.BytesIO(mlp)) as z:
    parts = {n: z.read(n) for n in z.namelist()}
with zipfile.ZipFile(io.BytesIO(dlrm)) as z:
    other = {n: z.read(n) for n in z.namelist()}
weights = dict(np.load(io.BytesIO(parts["weights.npz"])))
pickled = io.BytesIO()
np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
with_pickle = io.BytesIO()
with zipfile.ZipFile(with_pickle, "w") as z:
    for k in weights:
        z.writestr(f"{k}.npy", pickled.getvalue())
manifest_text = parts["manifest.json"]
swaps = {
    "kernels=text": ("kernels.so", b"not a library"),
    "kernels=empty": ("kernels.so", b""),
    "kernels=elf-header": ("kernels.so", parts["kernels.so"][:64]),
    "kernels=half": ("kernels.so", parts["kernels.so"][: len(parts["kernels.so"]) // 2]),
    "kernels=weights": ("kernels.so", parts["weights.npz"]),
    "kernels=other-model": ("kernels.so", other["kernels.so"]),
    "kernels=no-kernels": ("kernels.so", shared_library("plain", "int tvmsched_fuzz_plain(void) { return 0; }\n")),
    "weights=manifest": ("weights.npz", manifest_text),
    "weights=none": ("weights.npz", npz()),
    "weights=pickled": ("weights.npz", with_pickle.getvalue()),
    "weights=float64": ("weights.npz", npz(**{k: v.astype("float64") for k, v in weights.items()})),
    "weights=flat": ("weights.npz", npz(**{k: v.reshape(-1) for k, v in weights.items()})),
    "weights=other-model": ("weights.npz", other["weights.npz"]),
    "manifest=other-model": ("manifest.json", other["manifest.json"]),
    "manifest=list": ("manifest.json", b"[]"),
    "manifest=null": ("manifest.json", b"null"),
    "manifest=bom": ("manifest.json", b"\xef\xbb\xbf" + manifest_text),
    "manifest=not-utf8": ("manifest.json", manifest_text.replace(b'"mlp"', b'"m\xff\xfe"', 1)),
    "manifest=surrogate": ("manifest.json", manifest_text.replace(b'"mlp"', b'"m\\ud800"', 1)),
    "manifest=newline-in-kind": ("manifest.json", manifest_text.replace(b'"activation"', b'"act\\nerror: x"', 1)),
}
for name, (member, data) in swaps.items():
    path = with_member(mlp, member, data, folder / f"swap-{name.replace('=', '-')}.tvms")
    for mode in MODES:
        print(json.dumps({"starting": f"swap {name} {mode}"}), flush=True)
        # the kernels are checked only where they are loaded: inspect reads the manifest and weights alone
        expected = 0 if mode == "inspect" and member == "kernels.so" else 2
        report("swap", f"{name}:{mode}", *attempt(mode, path), expect=expected)

# hostile values where the engine or inspect reads numbers: refused by the loader's manifest checks
base_manifest = json.loads(manifest_text)
hostile = [("units", -3), ("units", 10**9), ("units", 0.5), ("blocks", -3), ("blocks", 2**63), ("threads", 0),
           ("threads", 10**9), ("latency_us", -1.5), ("latency_us", 1e308), ("latency_us", float("nan")),
           ("latency_us", "fast"), ("memory_bytes", -3), ("progress_blocks", -1), ("id", 2**32), ("layer.index", 2**32),
           ("layer.flops", -1), ("layer.flops", "x"), ("layer.bytes", 10**30), ("layer.qos_bound_us", "x"),
           ("layer.unit_latency_us", {"1": -3}), ("layer.unit_latency_us", 5), ("qos_ms", -3), ("gpu_sms", 0),
           ("gpu_sms", "x"), ("preempt_flags", 2**32), ("schema_version", 2**32 + 1), ("tuning", -3),
           ("tuning", {"database": "x", "layers": {"f": {"status": None}}}),
           ("tuning", {"database": "x", "layers": {}, "workloads": 1}), ("model_name", "m\x1b[2J\nerror: x"),
           ("schedule", "s\x1b[2J\nerror: x")]
for field, value in hostile:
    manifest = copy.deepcopy(base_manifest)
    if field.startswith("layer."):
        manifest["layers"][0][field[6:]] = value
    elif field in ("units", "blocks", "threads", "latency_us", "memory_bytes", "progress_blocks", "id", "schedule"):
        manifest["layers"][0]["candidates"][0][field] = value
    else:
        manifest[field] = value
    path = with_member(mlp, "manifest.json", json.dumps(manifest).encode(), folder / "hostile.tvms")
    for mode in MODES:
        print(json.dumps({"starting": f"hostile {field}={value!r} {mode}"}), flush=True)
        code, err = attempt(mode, path)
        report("hostile", f"{field}={value!r}:{mode}", code, err, expect=2 if field != "schedule" else 0)  # names: no control characters
    if field == "schedule":  # free text is shown, its control characters escaped: no line or escape sequence of its own
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            main(["inspect", str(path)])
        clean = "\x1b" not in shown.getvalue() and "\nerror: x" not in shown.getvalue() and "s\\x1b[2J\\nerror: x" in shown.getvalue()
        report("hostile", "schedule escaped by inspect", 0 if clean else 1, "" if clean else shown.getvalue()[:200], expect=0)

# a kernels.so swapped for a library with a constructor (checksums recomputed): readers that run no code never
# run it, nor do loaders given trusted keys or told to require signatures; a plain load runs it (README, Trust
# model: an unsigned artifact is code)
assert cli("keys", "generate", folder / "me")[0] == 0
assert cli("compile", folder / "mlp.onnx", "-o", folder / "signed.tvms", "--sign", folder / "me.key")[0] == 0
constructor = shared_library("constructor", "#include <stdio.h>\n#include <stdlib.h>\n"
                             "__attribute__((constructor)) static void ran(void) {\n"
                             "  const char* marker = getenv(\"TVMSCHED_FUZZ_MARKER\");\n"
                             "  if (marker) fclose(fopen(marker, \"w\"));\n}\n")
unsigned = with_member(mlp, "kernels.so", constructor, folder / "constructor.tvms")
resigned = with_member((folder / "signed.tvms").read_bytes(), "kernels.so", constructor, folder / "constructor-signed.tvms")
trust = folder / "me.pub"
steps = [
    ("inspect", {}, lambda: cli("inspect", unsigned), 0, False),
    ("inspect --json", {}, lambda: cli("inspect", "--json", unsigned), 0, False),
    ("inspect --trust (signed, changed)", {}, lambda: cli("inspect", "--trust", trust, resigned), 2, False),
    ("keys verify", {}, lambda: cli("keys", "verify", "--trust", trust, unsigned), 2, False),
    ("plan-memory --task", {}, lambda: cli("plan-memory", "--task", unsigned), 0, False),
    ("run --trust (unsigned)", {}, lambda: cli("run", "--trust", trust, unsigned), 2, False),
    ("run --trust (signed, changed)", {}, lambda: cli("run", "--trust", trust, resigned), 2, False),
    ("load(trusted_keys=)", {}, lambda: load_and_run(resigned, [trust]), 2, False),
    ("REQUIRE_SIGNATURE run", {"TVMSCHED_REQUIRE_SIGNATURE": "1"}, lambda: cli("run", unsigned), 2, False),
    ("REQUIRE_SIGNATURE load", {"TVMSCHED_REQUIRE_SIGNATURE": "1"}, lambda: load_and_run(unsigned), 2, False),
    ("REQUIRE_SIGNATURE inspect", {"TVMSCHED_REQUIRE_SIGNATURE": "1"}, lambda: cli("inspect", unsigned), 0, False),
    ("REQUIRE_SIGNATURE run --trust", {"TVMSCHED_REQUIRE_SIGNATURE": "1"}, lambda: cli("run", "--trust", trust, resigned), 2, False),
    ("REQUIRE_SIGNATURE run signed", {"TVMSCHED_REQUIRE_SIGNATURE": "1"},
     lambda: cli("run", "--trust", trust, folder / "signed.tvms"), 0, False),
    ("REQUIRE_SIGNATURE=0 run", {"TVMSCHED_REQUIRE_SIGNATURE": "0"}, lambda: cli("run", unsigned), 2, True),
    ("run", {}, lambda: cli("run", unsigned), 2, True),
]
for i, (name, env, step, code, runs) in enumerate(steps):
    marker = folder / f"constructor-ran-{i}"
    os.environ.update(env, TVMSCHED_FUZZ_MARKER=str(marker))
    print(json.dumps({"starting": f"constructor {name}"}), flush=True)
    result = step()
    for key in env:
        del os.environ[key]
    report("constructor", name, *result, expect=code, marker=runs, marker_found=marker.exists())

signatures = {"mlp": [("input", (1, 784), "float32")],
              "dlrm-small": [("dense", (32, 13), "float32")] + [(f"ids{t}", (32, 4), "int64") for t in range(8)]}
for i in range(counts["inputs"]):
    name = rng.choice(list(signatures))
    kind, feeds = random_inputs(signatures[name])
    path = folder / f"in{i}.npz"
    np.savez(path, **feeds)
    print(json.dumps({"starting": f"inputs {i} {name} {kind}"}), flush=True)
    report("inputs", f"{name}:{kind}", *cli("run", folder / f"{name}.tvms", "--inputs", path))
'''


def _ok(case: dict) -> bool:
    lines = case["stderr"].strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    if case["code"] == 0:
        return not errors
    return (case["code"] == 2 and errors == lines[-1:] and "internal error" not in lines[-1]
            and all(not line.startswith(("Traceback", "  File")) for line in lines) and len(lines) == 1)


def test_mutated_models_artifacts_and_inputs_end_in_exit_0_or_one_error_line(compiled, tmp_path):
    """100 seeded mutations (CASES_PER_KIND), each compiled, inspected or run by the CLI in one child process (~35 s on
    2 cores: the mutated models are compiled, which is the subject)."""
    for name in ("mlp", "dlrm-small"):  # the base artifacts the child mutates and runs: the shared cache's
        compiled.copy(name, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("TVMSCHED_REQUIRE_SIGNATURE", "TVMSCHED_DEBUG")}
    child = subprocess.run([sys.executable, "-c", _CHILD, "12", json.dumps(CASES_PER_KIND), str(tmp_path)],
                           capture_output=True, text=True, timeout=3600, env=env)  # a hang, not a slow machine
    records = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    started = [r["starting"] for r in records if "starting" in r]
    assert child.returncode == 0, f"the child died ({child.returncode}) during {started[-1:]}: {child.stderr[-3000:]}"
    cases = [r for r in records if "kind" in r]
    counts = {kind: sum(c["kind"] == kind for c in cases) for kind in CASES_PER_KIND}
    assert counts == {**CASES_PER_KIND, "artifact": 3 * CASES_PER_KIND["artifact"]}  # inspect, run, load().run()
    assert {c["kind"] for c in cases} == {*CASES_PER_KIND, "path", "swap", "hostile", "constructor"}
    bad = [c for c in cases if not _ok(c)]
    assert not bad, json.dumps(bad[:5], indent=1)
    # the mutations reach both outcomes: some still compile and run, most are refused
    for kind in CASES_PER_KIND:
        codes = {c["code"] for c in cases if c["kind"] == kind}
        assert codes == {0, 2}, (kind, codes)
    hostile = {c["detail"].split("=")[0] for c in cases if c["kind"] == "artifact" and c["detail"].split(":")[1] == "hostile"}
    assert len(hostile) >= 2, hostile  # the seeded draw reaches the hostile-value mutation
    # the fixed cases end as stated: refused (or, for a kernels.so, read by inspect without loading it)
    wrong = [c for c in cases if c["kind"] in ("path", "swap", "hostile", "constructor") and c["code"] != c["expected_code"]]
    assert not wrong, json.dumps(wrong[:5], indent=1)
    # the constructor ran exactly where code was loaded without a signature being required
    ran = {c["detail"]: c["marker_found"] for c in cases if c["kind"] == "constructor"}
    assert ran == {c["detail"]: c["marker"] for c in cases if c["kind"] == "constructor"}, ran
    assert any(ran.values()) and not all(ran.values())


@pytest.mark.parametrize("line, ok", [("error: x", True), ("Traceback (most recent call last):", False),
                                      ("error: internal error (KeyError): 'a'", False)])
def test_the_fuzz_oracle_tells_errors_apart(line, ok):
    assert _ok({"code": 2, "stderr": line + "\n"}) is ok
    assert not _ok({"code": 1, "stderr": "error: x\n"})
