"""Artifact round-trip and integrity checks."""

import hashlib
import json
import zipfile

import numpy as np
import pytest

from tvmsched.artifact.format import SCHEMA_VERSION, Artifact
from tvmsched.errors import TvmschedError


@pytest.fixture(scope="module")
def mlp_artifact(compiled):
    """The zoo's mlp (the shared cache's), as an Artifact: tests save it to files of their own and change those."""
    return compiled.artifact("mlp")


def test_round_trip_keeps_manifest_weights_and_library(mlp_artifact, tmp_path):
    path = tmp_path / "mlp.tvms"
    mlp_artifact.save(path)
    loaded = Artifact.load(path)
    assert loaded.manifest == mlp_artifact.manifest
    assert loaded.library == mlp_artifact.library
    assert loaded.weights.keys() == mlp_artifact.weights.keys()
    for key, value in mlp_artifact.weights.items():
        np.testing.assert_array_equal(loaded.weights[key], value)
    assert loaded.manifest.schema_version == SCHEMA_VERSION


def test_truncated_artifact_is_rejected(mlp_artifact, tmp_path):
    path = tmp_path / "mlp.tvms"
    mlp_artifact.save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(TvmschedError, match="truncated or corrupt"):
        Artifact.load(path)


def test_tampered_weights_fail_the_checksum(mlp_artifact, tmp_path):
    path = tmp_path / "mlp.tvms"
    mlp_artifact.save(path)
    rewrite_member(path, "weights.npz", lambda data: data[:-8] + b"\x00" * 8)
    with pytest.raises(TvmschedError, match="checksum mismatch in weights.npz"):
        Artifact.load(path)


def test_newer_schema_is_rejected_with_its_version(mlp_artifact, tmp_path):
    path = tmp_path / "mlp.tvms"
    mlp_artifact.save(path)
    rewrite_member(path, "manifest.json", bump_schema, fix_checksum=True)
    with pytest.raises(TvmschedError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        Artifact.load(path)


def bump_schema(data: bytes) -> bytes:
    manifest = json.loads(data)
    manifest["schema_version"] = SCHEMA_VERSION + 1
    return json.dumps(manifest).encode()


def rewrite_member(path, member: str, change, fix_checksum: bool = False) -> None:
    """Rewrite one member of an artifact zip, optionally updating checksums.json to match."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members[member] = change(members[member])
    if fix_checksum:
        checksums = json.loads(members["checksums.json"])
        checksums[member] = hashlib.sha256(members[member]).hexdigest()
        members["checksums.json"] = json.dumps(checksums).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_deflated_member_is_refused_before_it_is_inflated(mlp_artifact, tmp_path):
    """A zip bomb: 64 MiB of zeros deflated to ~64 kB in place of the weights (checksum matching)."""
    path = tmp_path / "bomb.tvms"
    mlp_artifact.save(path)
    bomb = bytes(64 << 20)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["weights.npz"] = bomb
    checksums = json.loads(members["checksums.json"])
    checksums["weights.npz"] = hashlib.sha256(bomb).hexdigest()
    members["checksums.json"] = json.dumps(checksums).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name == "weights.npz" else None)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(TvmschedError, match="compressed member weights.npz"):
        Artifact.load(path)


def test_an_older_or_negative_schema_is_refused(mlp_artifact, tmp_path):
    path = tmp_path / "old.tvms"
    mlp_artifact.save(path)
    rewrite_member(path, "manifest.json", lambda d: d.replace(b'"schema_version": 1', b'"schema_version": -1'), fix_checksum=True)
    with pytest.raises(TvmschedError, match="schema version -1; this tvmsched reads version 1 only"):
        Artifact.load(path)
