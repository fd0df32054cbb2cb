"""Compile once, share everywhere: the test session's content-keyed cache of compiled artifacts and onnxruntime
reference outputs (the `compiled` and `reference` fixtures of tests/conftest.py).

An entry's key is everything that decides what the compiler writes: the ONNX bytes, the compile options, the
compiler's own sources (tvmsched/ and passes/), the TVM version, the resolved target (its JSON, the CPU's name and
its features) and the `TVMSCHED_*` variables the compiler reads (COMPILER_ENV). A reference's key is the ONNX bytes,
the inputs and onnxruntime's version.

The cache lives under pytest's basetemp (shared by the pytest-xdist workers of one run, never ~/.cache): a worker
that misses takes the entry's file lock, compiles into a temporary file and renames it into place, so the others
wait for it and then read the finished file. Entries are handed out read-only (mode 0444) with their SHA-256 kept
beside them; a test that signs, tampers with or rewrites an artifact takes a copy (`compiled.copy`). Every entry a
worker handed out is checked against its SHA-256 at the end of the session (root ignores the mode bits), so a test
that wrote into the cache fails the run instead of poisoning the tests after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
COMPILER_SOURCES = ("tvmsched", "passes")  # the compile pipeline's code (tests/test_artifact_cache.py checks the list)
COMPILER_ENV = ("TVMSCHED_GPU_SMS", "TVMSCHED_DB", "TVMSCHED_TUNE_MEASURE_MS")  # what the compiler reads of the environment (checked likewise)


@functools.cache
def compiler_digest() -> str:
    """SHA-256 over the compiler's sources, TVM's version and the host CPU's name and features."""
    import tvm

    from tvmsched.lower.targets import host_cpu, host_cpu_features

    digest = hashlib.sha256(f"tvm={tvm.__version__} cpu={host_cpu()} features={host_cpu_features()}".encode())
    for folder in COMPILER_SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def compiler_key(target, *parts: bytes) -> str:
    """An entry's key: `parts` (what was compiled, and how) with the compiler's digest, the resolved `target` and the
    environment variables the compiler reads."""
    from tvmsched.lower.targets import target_json

    digest = hashlib.sha256(compiler_digest().encode())
    for part in parts:
        digest.update(part)
    digest.update(json.dumps(target_json(target), sort_keys=True).encode())
    digest.update(json.dumps({name: os.environ.get(name) for name in COMPILER_ENV}).encode())
    return digest.hexdigest()[:32]


def _model(model: onnx.ModelProto | str, seed: int) -> tuple[onnx.ModelProto, str]:
    """A zoo name (built with `seed`) or a ModelProto; and the name an artifact records by default."""
    if isinstance(model, str):
        from tvmsched import models

        return models.build(model, seed=seed), model
    return model, "model"


class Cache:
    """One folder of entries `<key>.<suffix>`, each written once under `<key>.lock`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.handed_out: dict[Path, str] = {}  # path -> SHA-256, checked at the end of the session
        self.built = 0  # entries this process made (the others it found)

    def entry(self, key: str, suffix: str, make, what: str | Callable[[], str] = "") -> Path:
        """The entry's read-only path; `make(tmp_path)` writes it the first time (in one worker only), noting `what` it
        is (a callable: asked only then) and the seconds it took in the folder's made.jsonl (where a run's compile time
        goes)."""
        path = self.folder / f"{key}{suffix}"
        if not path.is_file():
            with self._locked(key):
                if not path.is_file():
                    tmp = self.folder / f".{key}{suffix}.{os.getpid()}.tmp"
                    try:
                        started = time.perf_counter()
                        make(tmp)
                        with open(self.folder / "made.jsonl", "a") as log:  # one short line: an atomic append
                            log.write(json.dumps({"entry": path.name, "what": what() if callable(what) else what,
                                                  "seconds": round(time.perf_counter() - started, 2)}) + "\n")
                        os.chmod(tmp, 0o444)
                        (self.folder / f"{key}{suffix}.sha256").write_text(_sha256(tmp))
                        os.replace(tmp, path)  # atomic: a reader sees no entry or a whole one
                    finally:
                        tmp.unlink(missing_ok=True)
                    self.built += 1
        if path not in self.handed_out:
            self.handed_out[path] = (self.folder / f"{key}{suffix}.sha256").read_text()
        return path

    def derived(self, name: str, suffix: str, make) -> Path:
        """An entry that `name` (what it is and how it is made) and the compiler determine, such as a test module's
        artifacts compiled from a kit it measures: `make test`'s asynchronous pass then takes the first pass's."""
        return self.entry(compiler_key("llvm", name.encode()), suffix, make, name)

    @contextlib.contextmanager
    def _locked(self, key: str):
        with open(self.folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
            yield

    def changed(self) -> list[str]:
        """Entries handed out here whose bytes are no longer what was cached (a test wrote into the cache)."""
        return [str(path) for path, sha in self.handed_out.items() if not path.is_file() or _sha256(path) != sha]


class Compiled:
    """`compiled(model, **options)`: the path of the artifact `compile_model(model, **options)` writes.

    `model` is a zoo name (built with `seed`, named after itself unless `name=` says otherwise) or an ONNX
    ModelProto; options are `tvmsched.pipeline.compile_model`'s. The path is shared and read-only."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def __call__(self, model: onnx.ModelProto | str, *, seed: int = 0, **options) -> Path:
        proto, options = self._resolved(model, seed, options)
        key = self.key(proto, options)

        def make(tmp: Path) -> None:
            from tvmsched.pipeline import compile_model

            compile_model(proto, **options).save(tmp)

        def what() -> str:
            shown = json.dumps(options, sort_keys=True, default=repr)
            return f"{model if isinstance(model, str) else proto.graph.name}: {shown}"

        return self.cache.entry(key, ".tvms", make, what)

    @staticmethod
    def _resolved(model: onnx.ModelProto | str, seed: int, options: dict) -> tuple[onnx.ModelProto, dict]:
        """The ModelProto and the options with the artifact's name (the zoo name, or "model")."""
        proto, name = _model(model, seed)
        return proto, {"name": name, **options}

    def start(self, name: str, **options) -> subprocess.Popen | None:
        """Compile the zoo model `name` into the cache in a child process (so both cores compile at once), unless it
        is cached already (None); `compiled(name, ...)` afterwards waits for that child's entry."""
        proto, resolved = self._resolved(name, 0, options)
        if (self.cache.folder / f"{self.key(proto, resolved)}.tvms").is_file():
            return None
        script = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                  "from tests.artifact_cache import Cache, Compiled; "
                  "Compiled(Cache(Path(sys.argv[2])))(sys.argv[3], **json.loads(sys.argv[4]))")
        return subprocess.Popen([sys.executable, "-c", script, str(ROOT), str(self.cache.folder), name,
                                 json.dumps(options)])

    def key(self, proto: onnx.ModelProto, options: dict) -> str:
        options_json = json.dumps(options, sort_keys=True, default=repr).encode()
        return compiler_key(options.get("target", "llvm"), proto.SerializeToString(deterministic=True), options_json)

    def artifact(self, model: onnx.ModelProto | str, **options):
        """The cached artifact as a `tvmsched.artifact.format.Artifact` (a fresh object each call)."""
        from tvmsched.artifact.format import Artifact

        return Artifact.load(self(model, **options))

    def copy(self, model: onnx.ModelProto | str, dest: str | Path, **options) -> Path:
        """A writable copy of the cached artifact at `dest` (a file, or a folder to put `<name>.tvms` in)."""
        source = self(model, **options)
        dest = Path(dest)
        if dest.is_dir():
            dest = dest / f"{self._resolved(model, 0, options)[1]['name']}.tvms"
        shutil.copyfile(source, dest)
        os.chmod(dest, 0o644)
        return dest


class References:
    """`reference(model, inputs)`: onnxruntime's outputs ({name: array}) for `inputs`, computed once per run."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def __call__(self, model: onnx.ModelProto | str, inputs: dict[str, np.ndarray], *, seed: int = 0) -> dict:
        import onnxruntime

        proto, _ = _model(model, seed)
        digest = hashlib.sha256(f"onnxruntime={onnxruntime.__version__}".encode())
        digest.update(proto.SerializeToString(deterministic=True))
        digest.update(_npz({name: np.asarray(value) for name, value in sorted(inputs.items())}))

        def make(tmp: Path) -> None:
            from tests.helpers import onnxruntime_outputs

            tmp.write_bytes(_npz(onnxruntime_outputs(proto, inputs)))

        path = self.cache.entry(digest.hexdigest()[:32], ".npz", make, f"onnxruntime: {model if isinstance(model, str) else proto.graph.name}")
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    """The arrays in their order (a reference keeps the model's output order)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
