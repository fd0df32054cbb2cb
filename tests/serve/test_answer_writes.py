"""Each HTTP answer of tvmsched serve leaves in one system call (tvmsched/serve/asgi.py, http_protocol): uvicorn writes
the status line and headers, then the body, and each write was a packet of its own that woke the client. Checked on a
real uvicorn server on 127.0.0.1 with the protocol tvmsched serve uses, its connection's real transport observed under
the coalescing one."""

from __future__ import annotations

import asyncio
import http.client
import threading

import pytest

from tests.helpers import free_port
from tvmsched.serve.asgi import BodyLimit, http_protocol

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httptools")

BIG = 3 << 20  # above the transport's write buffer's high-water mark: the answer leaves in several sends


class _Observed:
    """The connection's transport, each write it is given recorded (and passed on)."""

    def __init__(self, transport, writes: list) -> None:
        self._transport, self.writes = transport, writes

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def write(self, data) -> None:
        self.writes.append(len(data))
        self._transport.write(data)


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    size = BIG if scope["path"] == "/big" else 512
    body = bytes(range(256)) * (size // 256)
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % len(body))]
    if scope["path"] == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server():
    """(port, writes per connection): a uvicorn server in a thread, the ASGI app behind a 1 KiB body limit."""
    connections: list[list[int]] = []

    class Observed(http_protocol()):
        def connection_made(self, transport) -> None:
            connections.append([])
            super().connection_made(_Observed(transport, connections[-1]))

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(BodyLimit(_app, 1024), host="127.0.0.1", port=port, http=Observed,
                                        log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    for _ in range(500):
        if srv.started:
            break
        threading.Event().wait(0.01)
    assert srv.started, "uvicorn did not start in 5 s"
    try:
        yield port, connections
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_each_answer_on_a_kept_alive_connection_is_one_write(server):
    port, connections = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    expected = bytes(range(256)) * 2
    for _ in range(5):
        conn.request("POST", "/small", body=b"x" * 100)
        answer = conn.getresponse()
        assert answer.status == 200 and answer.read() == expected
    conn.close()
    assert connections and connections[0] == [connections[0][0]] * 5  # five answers, five writes
    assert connections[0][0] > 512  # each the headers and the body together


def test_a_large_answer_a_closing_answer_and_a_refused_body_arrive_whole(server):
    port, connections = server
    pattern = bytes(range(256))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/big")
    answer = conn.getresponse()
    assert answer.status == 200 and answer.read() == pattern * (BIG // 256)
    conn.close()
    assert connections[0] == [connections[0][0]] and connections[0][0] > BIG  # one write, above the high-water mark
    # the answer that closes its connection is written before the close
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/close")
    answer = conn.getresponse()
    assert answer.getheader("connection") == "close" and answer.read() == pattern * 2
    conn.close()
    # a body over the limit: BodyLimit's 413 (its own two sends) in one write
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/small", body=b"x" * 4096)
    answer = conn.getresponse()
    assert answer.status == 413 and b"larger than 1024 bytes" in answer.read()
    conn.close()
    assert connections[2] == [connections[2][0]]
