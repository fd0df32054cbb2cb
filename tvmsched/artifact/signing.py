"""Ed25519 signatures on artifacts (the `cryptography` package; the engine verifies with OpenSSL).

An artifact is native code: loading it runs its kernels.so with the loading process's rights.
`checksums.json` (SHA-256 of each member) only detects corruption. A signed artifact also holds
`signature.json`: an Ed25519 signature over the exact bytes of `checksums.json`, so it covers
every member. A loader given trusted public keys (`--trust KEY.pub`, `Runtime(trusted_keys=...)`,
`tvmsched::TrustedKeys` in C++) refuses an artifact none of them signed, before any member is used.

Keys are PEM files: `tvmsched keys generate NAME` writes NAME.key (private, PKCS#8, mode 0600) and
NAME.pub (public, SubjectPublicKeyInfo). A key's id is the first 16 hex digits of the SHA-256 of
its 32 raw public bytes (the same in the engine).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tvmsched.errors import TvmschedError

SIGNATURE_MEMBER = "signature.json"


def generate_keys(stem: str | Path):
    """Write a new key pair to STEM.key (private, 0600) and STEM.pub (never overwrites a file):
    (private key path, public key path, the private key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path, public_path = Path(f"{stem}.key"), Path(f"{stem}.pub")
    for path in (private_path, public_path):
        if path.exists():
            raise TvmschedError(f"{path} already exists (not overwriting a key)")
        if not path.parent.is_dir():
            raise TvmschedError(f"folder {path.parent} does not exist")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private_pem)
    public_path.write_bytes(public_pem)
    return private_path, public_path, key


def load_private_key(path: str | Path):
    """An Ed25519 private key from a PEM file, or one TvmschedError line."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = _read_key_file(path)
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise TvmschedError(f"{path} is not an unencrypted PEM private key ({str(err).splitlines()[0]})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise TvmschedError(f"{path} is not an Ed25519 private key (tvmsched keys generate writes one)")
    return key


def load_public_key(path: str | Path):
    """An Ed25519 public key from a PEM file, or one TvmschedError line."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(_read_key_file(path))
    except ValueError:
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise TvmschedError(f"{path} is not an Ed25519 public key in PEM form (tvmsched keys generate writes one)")
    return key


def key_id(public_key) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(checksums: bytes, private_key) -> bytes:
    """signature.json for an artifact whose checksums.json holds `checksums`."""
    signature = private_key.sign(checksums)
    return json.dumps({"algorithm": "ed25519", "key_id": key_id(private_key.public_key()), "signed": "checksums.json",
                       "signature": signature.hex()}, indent=1).encode()


def _read_key_file(path: str | Path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise TvmschedError(f"key file not found: {path}")
    if path.stat().st_size > 64 * 1024:
        raise TvmschedError(f"{path} is too large to be a key file")
    return path.read_bytes()
