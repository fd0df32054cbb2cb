"""Mutation fuzzing (issue 12): seeded random mutations of zoo models, artifacts and run inputs.

Every case must end in exit 0, or exit 2 with exactly one `error:` line on stderr — never a signal,
a traceback or an "internal error". The cases run in one child process (one interpreter start); a
crash of the child fails the test and names the case it was running.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CASES_PER_KIND = {"onnx": 80, "artifact": 80, "inputs": 40}  # bounded: under a minute on 2 cores

_CHILD = r'''
import contextlib, copy, hashlib, io, json, random, sys, zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvmsched import models
from tvmsched.cli import main

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


def random_value():
    return rng.choice([None, -1, 0, 2**40, 3.5, "x", "", [], {}, [1, 2], {"a": 1}, True])


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
    kind = rng.choice(["manifest", "manifest", "manifest", "flip", "truncate", "member"])
    if kind == "manifest":
        manifest = json.loads(members["manifest.json"])
        path = rng.choice([p for p in json_paths(manifest) if p])
        target = manifest
        for key in path[:-1]:
            target = target[key]
        if rng.random() < 0.2 and isinstance(target, (dict, list)):
            del target[path[-1]]
        else:
            target[path[-1]] = random_value()
        members["manifest.json"] = json.dumps(manifest).encode()
        sums = json.loads(members["checksums.json"])
        sums["manifest.json"] = hashlib.sha256(members["manifest.json"]).hexdigest()
        members["checksums.json"] = json.dumps(sums).encode()
        kind = "manifest:" + "/".join(map(str, path))
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


results = []
def report(kind, detail, code, err):
    results.append({"kind": kind, "detail": detail, "code": code, "stderr": err})
    print(json.dumps(results[-1]), flush=True)

bases = {name: models.build(name) for name in ("tiny", "mlp", "dlrm-small")}
for i in range(counts["onnx"]):
    name = rng.choice(list(bases))
    kind, data = mutate_model(bases[name])
    path = folder / f"m{i}.onnx"
    path.write_bytes(data)
    print(json.dumps({"starting": f"onnx {i} {name} {kind}"}), flush=True)
    report("onnx", f"{name}:{kind}", *cli("compile", path, "-o", folder / f"m{i}.tvms"))

for name in ("mlp", "dlrm-small"):
    models.save(name, folder / f"{name}.onnx")
    code, err = cli("compile", folder / f"{name}.onnx", "-o", folder / f"{name}.tvms")
    assert code == 0, err
for i in range(counts["artifact"]):
    name = rng.choice(["mlp", "dlrm-small"])
    kind, data = mutate_artifact((folder / f"{name}.tvms").read_bytes())
    path = folder / f"a{i}.tvms"
    path.write_bytes(data)
    print(json.dumps({"starting": f"artifact {i} {name} {kind}"}), flush=True)
    report("artifact", f"{name}:{kind}", *cli("run", path))

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


def test_mutated_models_artifacts_and_inputs_end_in_exit_0_or_one_error_line(tmp_path):
    child = subprocess.run([sys.executable, "-c", _CHILD, "12", json.dumps(CASES_PER_KIND), str(tmp_path)],
                           capture_output=True, text=True, timeout=1200)
    records = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    started = [r["starting"] for r in records if "starting" in r]
    assert child.returncode == 0, f"the child died ({child.returncode}) during {started[-1:]}: {child.stderr[-3000:]}"
    cases = [r for r in records if "kind" in r]
    assert len(cases) == sum(CASES_PER_KIND.values())
    bad = [c for c in cases if not _ok(c)]
    assert not bad, json.dumps(bad[:5], indent=1)
    # the mutations reach both outcomes: some still compile and run, most are refused
    for kind in CASES_PER_KIND:
        codes = {c["code"] for c in cases if c["kind"] == kind}
        assert codes == {0, 2}, (kind, codes)


@pytest.mark.parametrize("line, ok", [("error: x", True), ("Traceback (most recent call last):", False),
                                      ("error: internal error (KeyError): 'a'", False)])
def test_the_fuzz_oracle_tells_errors_apart(line, ok):
    assert _ok({"code": 2, "stderr": line + "\n"}) is ok
    assert not _ok({"code": 1, "stderr": "error: x\n"})
