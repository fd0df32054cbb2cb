"""Artifacts that travel without their weights: cut out here, regenerated on the GPU machine.

A zoo or real model's ONNX file is a deterministic function of its name and seed (`tvmsched models
build NAME`), and a CUDA artifact's weights are that model's initializers, as they are or after the
ONNX-level rewrites tvmsched's importer applies before TVM sees the model (shape folding, batch norms
folded into convolutions: tvmsched.frontend.loader.import_model), at most reshaped or transposed. An artifact
is a stored zip whose `weights.npz` member is itself a stored zip of `.npy` files, so every weight is
one contiguous byte range of the artifact file. `pack` finds, for each weight of at least
`MIN_BYTES`, the initializer whose bytes it is (by SHA-256), and writes a slim file: the artifact's
bytes with those ranges cut out (LZMA-compressed) plus, per range, its offset, length, source
initializer, transform and SHA-256. `unpack` rebuilds the model there, puts each range back and checks
every range's SHA-256 and the whole file's: the result is the artifact, byte for byte (so its
checksums and any signature hold). Weights that match nothing (CPU weights packed into tiles, for
instance) simply stay in the slim file.

    python bench/gpu/slim.py pack r.tvms r.tvms.slim --model resnet18 [--seed 0]
    python bench/gpu/slim.py unpack r.tvms.slim r.tvms     # builds the model from the recorded name and seed

Needs numpy, onnx and the tvmsched package (its model zoo and ONNX rewrites); no TVM.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

FORMAT = "tvmsched-slim-1"
MIN_BYTES = 4096  # smaller weights stay in the slim file (the bookkeeping would outweigh them)


class SlimError(RuntimeError):
    """A slim file that cannot be packed or restored (with the reason)."""


def _local_data_offset(data, header_offset: int) -> int:
    """Where a zip member's data begins, from its local file header."""
    if bytes(data[header_offset:header_offset + 4]) != b"PK\x03\x04":
        raise SlimError(f"no zip local header at byte {header_offset}")
    name_len, extra_len = struct.unpack("<HH", bytes(data[header_offset + 26:header_offset + 30]))
    return header_offset + 30 + name_len + extra_len


def weight_ranges(data: bytes) -> list[dict]:
    """Every weight array's byte range in an artifact file's bytes: name, offset, nbytes, shape, dtype."""
    with zipfile.ZipFile(io.BytesIO(data)) as artifact:
        info = artifact.getinfo("weights.npz")
        if info.compress_type != zipfile.ZIP_STORED:
            raise SlimError("weights.npz is not stored uncompressed")
        base = _local_data_offset(data, info.header_offset)
    npz = memoryview(data)[base:base + info.file_size]
    ranges = []
    with zipfile.ZipFile(io.BytesIO(npz)) as weights:
        for member in weights.infolist():
            if member.compress_type != zipfile.ZIP_STORED:
                raise SlimError(f"weight {member.filename} is compressed")
            start = _local_data_offset(npz, member.header_offset)
            stream = io.BytesIO(npz[start:start + min(member.file_size, 1 << 16)])
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
            else:
                continue  # a header format this reader does not parse: the weight stays in the slim file
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if dtype.hasobject or start + stream.tell() + nbytes > start + member.file_size:
                continue
            ranges.append({"name": member.filename.removesuffix(".npy"), "offset": base + start + stream.tell(),
                           "nbytes": nbytes, "shape": list(shape), "dtype": dtype.str, "fortran": bool(fortran)})
    return ranges


class Sources:
    """The arrays an artifact's weights can come from: the model's initializers ("raw:NAME") and those
    after tvmsched's ONNX-level rewrites ("pre:NAME"), computed on first use."""

    # the C-order bytes, or those of the 2-D transpose; "f16", "f16T": the same of a float32 array cast to float16
    # (`tvmsched compile --precision fp16` casts the weights: IEEE round-to-nearest-even, as numpy's astype)
    TRANSFORMS = ("flat", "T", "f16", "f16T")

    def __init__(self, model: onnx.ModelProto, input_shapes: dict | None = None):
        self.model = model
        self.input_shapes = input_shapes
        self._sets: dict[str, dict[str, np.ndarray]] = {}
        self._digests: dict[tuple[str, str], str] = {}
        self.prepass_error: str | None = None

    def arrays(self, kind: str) -> dict[str, np.ndarray]:
        if kind not in self._sets:
            if kind == "raw":
                model = self.model
            elif kind == "pre":
                model = self._rewritten()
            else:
                raise SlimError(f"unknown source kind {kind!r}")
            self._sets[kind] = {} if model is None else {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        return self._sets[kind]

    def _rewritten(self) -> onnx.ModelProto | None:
        """The model as tvmsched's importer hands it to TVM (frontend.import_model, before index guards)."""
        try:
            from tvmsched.frontend import loader as frontend
            from tvmsched.frontend.fold import fold_constants
            from tvmsched.frontend.rewrites import (
                expand_layernorm_statistics,
                fold_batchnorm_into_conv,
                propagate_nan,
                upgrade_legacy_forms,
            )
        except ImportError as err:  # the rewrites moved: only the raw initializers can be matched
            self.prepass_error = f"tvmsched's ONNX rewrites are not importable ({err})"
            return None
        model = fold_constants(self.model, frontend.input_signature(self.model, self.input_shapes))
        model = upgrade_legacy_forms(model)
        return propagate_nan(fold_batchnorm_into_conv(expand_layernorm_statistics(model)))

    def get(self, source: str) -> np.ndarray:
        kind, _, name = source.partition(":")
        try:
            return self.arrays(kind)[name]
        except KeyError:
            raise SlimError(f"the rebuilt model has no initializer {name!r} ({kind})") from None

    def bytes_of(self, source: str, transform: str) -> bytes:
        array = self.get(source)
        if transform not in self.TRANSFORMS:
            raise SlimError(f"unknown transform {transform!r}")
        if transform.startswith("f16"):
            if array.dtype != np.float32:
                raise SlimError(f"{source} is {array.dtype}, not float32: cannot cast it to float16")
            array = array.astype(np.float16)
        if transform.endswith("T"):
            if array.ndim != 2:
                raise SlimError(f"{source} is not 2-D: cannot transpose it")
            array = array.T
        return np.ascontiguousarray(array).tobytes()

    def find(self, nbytes: int, digest: str) -> tuple[str, str] | None:
        """(source, transform) whose bytes have this SHA-256, or None."""
        for kind in ("raw", "pre"):
            for name, array in self.arrays(kind).items():
                if array.nbytes not in (nbytes, 2 * nbytes) or array.dtype.hasobject:
                    continue
                source = f"{kind}:{name}"
                for transform in self.TRANSFORMS:
                    cast = transform.startswith("f16")
                    if (transform.endswith("T") and array.ndim != 2) or (cast and array.dtype != np.float32):
                        continue
                    if array.nbytes // (2 if cast else 1) != nbytes:
                        continue
                    key = (source, transform)
                    if key not in self._digests:
                        self._digests[key] = hashlib.sha256(self.bytes_of(source, transform)).hexdigest()
                    if self._digests[key] == digest:
                        return key
        return None


def pack(artifact: str | Path, out: str | Path, model: onnx.ModelProto, *, name: str, seed: int = 0,
         input_shapes: dict | None = None, min_bytes: int = MIN_BYTES) -> dict:
    """Write the slim form of `artifact` (compiled from `model`, zoo name `name` built with `seed`); returns its record."""
    data = Path(artifact).read_bytes()
    sources = Sources(model, input_shapes)
    holes = []
    for r in weight_ranges(data):
        if r["nbytes"] < min_bytes or r["fortran"]:
            continue
        digest = hashlib.sha256(memoryview(data)[r["offset"]:r["offset"] + r["nbytes"]]).hexdigest()
        found = sources.find(r["nbytes"], digest)
        if found is not None:
            holes.append({"weight": r["name"], "offset": r["offset"], "nbytes": r["nbytes"], "source": found[0],
                          "transform": found[1], "sha256": digest})
    holes.sort(key=lambda h: h["offset"])
    skeleton, position = bytearray(), 0
    for hole in holes:
        skeleton += data[position:hole["offset"]]
        position = hole["offset"] + hole["nbytes"]
    skeleton += data[position:]
    meta = {
        "format": FORMAT, "model": name, "seed": seed,
        "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
        "artifact_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "regenerated_bytes": sum(h["nbytes"] for h in holes), "holes": holes,
        "unmatched_note": sources.prepass_error,
    }
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as slim:
        slim.writestr("slim.json", json.dumps(meta, indent=1))
        slim.writestr("skeleton.bin", bytes(skeleton))
    tmp.replace(out)
    return {k: v for k, v in meta.items() if k != "holes"} | {"weights": len(holes), "carried_bytes": out.stat().st_size}


def read_meta(slim: str | Path) -> dict:
    with zipfile.ZipFile(slim) as archive:
        meta = json.loads(archive.read("slim.json"))
    if meta.get("format") != FORMAT:
        raise SlimError(f"{slim} is not a {FORMAT} file (format {meta.get('format')!r})")
    return meta


def unpack(slim: str | Path, out: str | Path, model: onnx.ModelProto | None = None) -> dict:
    """Restore the artifact of a slim file to `out`; `model` is the rebuilt ONNX model (built from the
    recorded name and seed with tvmsched's zoo when None). Raises SlimError when a byte differs."""
    started = time.perf_counter()
    meta = read_meta(slim)
    with zipfile.ZipFile(slim) as archive:
        skeleton = archive.read("skeleton.bin")
    if model is None:
        from tvmsched import models

        model = models.build(meta["model"], meta["seed"])
    shapes = {k: tuple(v) for k, v in meta["input_shapes"].items()} or None
    sources = Sources(model, shapes)
    data, taken = bytearray(), 0
    for hole in meta["holes"]:
        keep = hole["offset"] - len(data)
        data += skeleton[taken:taken + keep]
        taken += keep
        piece = sources.bytes_of(hole["source"], hole["transform"])
        if len(piece) != hole["nbytes"] or hashlib.sha256(piece).hexdigest() != hole["sha256"]:
            raise SlimError(f"weight {hole['weight']} of {meta['model']} (from {hole['source']}, {hole['transform']}) "
                            "differs from the compiled one: the model rebuilt here is not the one compiled")
        data += piece
    data += skeleton[taken:]
    if len(data) != meta["artifact_bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise SlimError(f"the restored artifact of {meta['model']} does not match its SHA-256")
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return {"model": meta["model"], "artifact_bytes": len(data), "regenerated_bytes": meta["regenerated_bytes"],
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="artifact -> slim file")
    p.add_argument("artifact", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--model", required=True, help="zoo or real model name the artifact was compiled from")
    p.add_argument("--seed", type=int, default=0)
    u = sub.add_parser("unpack", help="slim file -> artifact (model rebuilt from its name and seed)")
    u.add_argument("slim", type=Path)
    u.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        from tvmsched import models

        shapes = models.REAL_MODELS[args.model].input_shapes if args.model in models.REAL_MODELS else None
        print(json.dumps(pack(args.artifact, args.out, models.build(args.model, args.seed), name=args.model,
                              seed=args.seed, input_shapes=shapes)))
    else:
        print(json.dumps(unpack(args.slim, args.out)))


if __name__ == "__main__":
    main()
