"""One framing for every collectives connection (agent ↔ controller, agent ↔ switch).

A message is a 4-byte big-endian header length, a UTF-8 JSON object, then `nbytes` raw payload bytes
when the header names them. Sizes are bounded so a hostile peer cannot make us allocate at will; a
violation raises ProtocolError (the connection is then closed by its owner).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

MAX_HEADER = 1 << 20  # 1 MiB of JSON
MAX_PAYLOAD = 4 << 30  # 4 GiB: larger than any DDP bucket
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """A peer sent something that is not a message of this protocol."""


def encode(obj: dict, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The frames of one message (header length, header, payload); `nbytes` is set from the payload."""
    if payload:
        obj = {**obj, "nbytes": len(payload)}
    head = json.dumps(obj, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER:
        raise ProtocolError(f"header of {len(head)} bytes exceeds {MAX_HEADER}")
    return [_LEN.pack(len(head)) + head, payload] if payload else [_LEN.pack(len(head)) + head]


def _decode_header(raw: bytes) -> dict:
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError(f"header is not JSON ({err})") from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is not a JSON object")
    nbytes = obj.get("nbytes", 0)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 <= nbytes <= MAX_PAYLOAD:
        raise ProtocolError(f"payload size {nbytes!r} is not an integer in [0, {MAX_PAYLOAD}]")
    return obj


def _header_length(raw: bytes) -> int:
    (length,) = _LEN.unpack(raw)
    if not 0 < length <= MAX_HEADER:
        raise ProtocolError(f"header length {length} is not in (0, {MAX_HEADER}]")
    return length


# -- blocking sockets (agents' threads) --------------------------------------------------------------

def send(sock: socket.socket, obj: dict, payload: bytes | memoryview = b"") -> None:
    for frame in encode(obj, payload):
        sock.sendall(frame)


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("peer closed the connection")
        view = view[got:]


def recv(sock: socket.socket, into: memoryview | None = None) -> tuple[dict, memoryview | bytes]:
    """One message; the payload lands in `into` when it is given and large enough (no copy)."""
    raw = bytearray(_LEN.size)
    _recv_exactly(sock, memoryview(raw))
    head = bytearray(_header_length(bytes(raw)))
    _recv_exactly(sock, memoryview(head))
    obj = _decode_header(bytes(head))
    nbytes = obj.get("nbytes", 0)
    if not nbytes:
        return obj, b""
    buf = into[:nbytes] if into is not None and len(into) >= nbytes else memoryview(bytearray(nbytes))
    _recv_exactly(sock, buf)
    return obj, buf


# -- asyncio streams (controller, switch) ------------------------------------------------------------

async def read_header(reader: asyncio.StreamReader) -> dict:
    """A message's header alone, so that its payload can be checked before it is read (its `nbytes`
    bytes follow on the stream)."""
    length = _header_length(await reader.readexactly(_LEN.size))
    return _decode_header(await reader.readexactly(length))


async def read(reader: asyncio.StreamReader) -> tuple[dict, bytes]:
    """One message from a stream; raises asyncio.IncompleteReadError at end of stream."""
    obj = await read_header(reader)
    nbytes = obj.get("nbytes", 0)
    return obj, (await reader.readexactly(nbytes) if nbytes else b"")


def write(writer: asyncio.StreamWriter, obj: dict, payload: bytes | memoryview = b"") -> None:
    writer.writelines(encode(obj, payload))
