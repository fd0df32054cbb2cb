"""Signed artifacts (issue 12 item 2): an artifact is native code, so a loader given trusted keys
refuses any artifact they did not sign before any of its code is loaded, on every entry point."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from tests.helpers import assert_user_error, run_cli
from tests.test_artifact import rewrite_member
from tvmsched import models
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Executor, Runtime


@pytest.fixture(scope="module")
def signed(tmp_path_factory, compiled):
    """tiny.onnx, keys `me` and `other`, and tiny (the shared cache's) signed by `me` (s.tvms) and unsigned (u.tvms).

    Called in process, as the `cli` fixture does (a module fixture cannot take the function-scoped `cli`)."""
    from tvmsched.artifact.signing import load_private_key

    folder = tmp_path_factory.mktemp("signing")
    models.save("tiny", folder / "tiny.onnx")
    for name in ("me", "other"):
        assert _keys_generate(folder / name) == 0
    compiled.artifact("tiny").save(folder / "s.tvms", load_private_key(folder / "me.key"))  # as `compile --sign` does
    compiled.copy("tiny", folder / "u.tvms")
    return folder


def _keys_generate(name):
    """`tvmsched keys generate NAME` in process."""
    from click.testing import CliRunner

    from tvmsched.cli.main import main

    with CliRunner().isolation():
        return main(["keys", "generate", str(name)])


def test_keys_generate_writes_a_private_key_only_its_owner_reads(signed):
    assert stat.S_IMODE(os.stat(signed / "me.key").st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in (signed / "me.key").read_bytes()
    assert b"BEGIN PUBLIC KEY" in (signed / "me.pub").read_bytes()
    before = (signed / "me.key").read_bytes()
    assert_user_error(run_cli("keys", "generate", signed / "me"), "already exists")
    assert (signed / "me.key").read_bytes() == before
    assert_user_error(run_cli("keys", "generate", signed / "no" / "such"), "does not exist")


def test_a_signed_artifact_runs_where_its_key_is_trusted(cli, signed):
    ok = cli("run", signed / "s.tvms", "--trust", signed / "other.pub", "--trust", signed / "me.pub")
    assert ok.returncode == 0, ok.stderr
    verify = cli("keys", "verify", signed / "s.tvms", "--trust", signed / "me.pub")
    assert verify.returncode == 0 and "signed by trusted key" in verify.stdout
    assert cli("run", signed / "s.tvms").returncode == 0  # no --trust: signatures are not required


def test_unsigned_or_foreign_artifacts_are_refused(signed):
    assert_user_error(run_cli("run", signed / "u.tvms", "--trust", signed / "me.pub"), "u.tvms is not signed")
    assert_user_error(run_cli("run", signed / "s.tvms", "--trust", signed / "other.pub"), "signed by key", "which is not trusted")
    assert_user_error(run_cli("keys", "verify", signed / "u.tvms", "--trust", signed / "me.pub"), "is not signed")


@pytest.mark.parametrize("member", ["kernels.so", "weights.npz", "manifest.json"])
def test_a_member_changed_after_signing_fails_the_signature(signed, tmp_path, member):
    """Checksums recomputed (as anyone can): the signature over checksums.json no longer verifies."""
    path = tmp_path / "t.tvms"
    path.write_bytes((signed / "s.tvms").read_bytes())
    rewrite_member(path, member, lambda data: data.replace(b"fused", b"fusex", 1) if member == "manifest.json" else data + b"\0",
                   fix_checksum=True)
    assert_user_error(run_cli("run", path, "--trust", signed / "me.pub"), "signature that does not verify")


def test_a_signature_moved_to_another_key_id_or_malformed_is_refused(signed, tmp_path):
    from tvmsched.artifact.signing import key_id, load_public_key

    path = tmp_path / "t.tvms"
    path.write_bytes((signed / "s.tvms").read_bytes())
    # claims to be by `other` (trusted here), but `me` signed it
    other_id = key_id(load_public_key(signed / "other.pub"))
    rewrite_member(path, "signature.json", lambda data: json.dumps({**json.loads(data), "key_id": other_id}).encode())
    assert_user_error(run_cli("run", path, "--trust", signed / "other.pub"), "signature that does not verify")
    rewrite_member(path, "signature.json", lambda data: b'{"algorithm": "rsa", "signature": "00"}')
    assert_user_error(run_cli("run", path, "--trust", signed / "me.pub"), "malformed signature.json")


def test_bad_key_files_are_one_line_errors(signed, tmp_path):
    assert_user_error(run_cli("run", signed / "s.tvms", "--trust", signed / "me.key"), "is not an Ed25519 public key")
    assert_user_error(run_cli("run", signed / "s.tvms", "--trust", tmp_path / "none.pub"), "trusted key not found")
    assert_user_error(run_cli("compile", signed / "tiny.onnx", "-o", tmp_path / "x.tvms", "--sign", signed / "me.pub"),
                      "is not an unencrypted PEM private key")
    assert not (tmp_path / "x.tvms").exists()


def test_no_code_of_a_refused_artifact_runs(signed, tmp_path):
    """A kernels.so with a constructor (checksums recomputed): refused with --trust before it is loaded;
    without --trust it runs on load, which is why artifacts from others must be signed."""
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "evil.c"
    source.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void f(void) {{ fclose(fopen("{marker}", "w")); }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "evil.so", source], check=True)
    path = tmp_path / "evil.tvms"
    path.write_bytes((signed / "s.tvms").read_bytes())
    rewrite_member(path, "kernels.so", lambda _: (tmp_path / "evil.so").read_bytes(), fix_checksum=True)
    assert_user_error(run_cli("run", path, "--trust", signed / "me.pub"), "does not verify")
    with pytest.raises(TvmschedError, match="does not verify"):
        Runtime("cpu", trusted_keys=[signed / "me.pub"]).load(path)
    assert not marker.exists()
    run_cli("run", path)  # untrusted mode: the documented risk
    assert marker.exists()


def test_python_api_takes_trusted_keys(signed):
    assert Executor(signed / "s.tvms", trusted_keys=[signed / "me.pub"]).run({"x": models.random_inputs(models.build("tiny"))["x"]})
    with pytest.raises(TvmschedError, match="is not signed"):
        Executor(signed / "u.tvms", trusted_keys=[signed / "me.pub"])
    runtime = Runtime("cpu", trusted_keys=[signed / "me.pub"])
    try:
        runtime.load(signed / "s.tvms")
        with pytest.raises(TvmschedError, match="is not signed"):
            runtime.load(signed / "u.tvms", name="u")
    finally:
        runtime.shutdown()


def test_example_server_refuses_untrusted_artifacts(signed):
    result = subprocess.run([sys.executable, "examples/server.py", "--model", f"u={signed / 'u.tvms'}", "--trust",
                             str(signed / "me.pub"), "--port", "1"], capture_output=True, text=True, timeout=120)
    assert_user_error(result, "u.tvms is not signed")


def test_an_environment_that_requires_signatures_refuses_unsigned_loads_on_every_entry_point(signed):
    """TVMSCHED_REQUIRE_SIGNATURE=1: every loader of artifact code needs trusted keys (README, Trust model);
    readers that load no code (inspect) still read unsigned artifacts."""
    env = {**os.environ, "TVMSCHED_REQUIRE_SIGNATURE": "1"}
    cli = lambda *args: subprocess.run([sys.executable, "-m", "tvmsched.cli", *map(str, args)], capture_output=True,  # noqa: E731
                                       text=True, env=env, timeout=600)
    assert_user_error(cli("run", signed / "u.tvms"), "TVMSCHED_REQUIRE_SIGNATURE is set")
    assert_user_error(cli("run", signed / "s.tvms"), "TVMSCHED_REQUIRE_SIGNATURE is set")  # signed, but no key given
    assert cli("run", signed / "s.tvms", "--trust", signed / "me.pub").returncode == 0
    assert cli("inspect", signed / "u.tvms").returncode == 0
    server = subprocess.run([sys.executable, "examples/server.py", "--model", f"u={signed / 'u.tvms'}", "--port", "1"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert_user_error(server, "TVMSCHED_REQUIRE_SIGNATURE is set")
