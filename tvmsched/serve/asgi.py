"""ASGI pieces the HTTP servers share (tvmsched serve, examples/server.py): a request-body limit, answer headers
(X-Request-Id back, Connection: close while draining), uvicorn's server drained on SIGTERM and each answer written in
one system call."""

from __future__ import annotations

import time

MAX_BODY_BYTES = 16 << 20


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413, by its Content-Length before any of
    it is read, or as soon as a chunked body passes the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await too_large(send, self.max_bytes)
        received, refused = 0, False

        async def limited_receive():  # past the limit: answer 413 now, and the app sees a disconnect
            nonlocal received, refused
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes and not refused:
                refused = True
                await too_large(send, self.max_bytes)
            return {"type": "http.disconnect"} if refused else message

        async def guarded_send(message):  # the app's own answer to a refused request is dropped
            if not refused:
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise



async def too_large(send, max_bytes: int) -> None:
    """Answer 413: the request's body is over `max_bytes`."""
    text = b'request body larger than %d bytes' % max_bytes  # "detail": FastAPI's key, "error": the v2 protocol's
    body = b'{"detail":"%s","error":"%s"}' % (text, text)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def extra_answer_headers(state, request_id: bytes | None) -> list:
    """What AnswerHeaders adds to an answer: the request's X-Request-Id, and Connection: close while draining (the
    app's `state.draining`)."""
    extra = [(b"x-request-id", request_id)] if request_id is not None else []
    if getattr(state, "draining", False):
        extra.append((b"connection", b"close"))
    return extra


class AnswerHeaders:
    """ASGI middleware: a request's X-Request-Id header comes back on its answer (errors and 413 included), so a
    client can match answers to requests; while the server drains (DrainingServer), answers close their connection."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = dict(scope.get("headers") or ()).get(b"x-request-id")

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                extra = extra_answer_headers(scope["app"].state, request_id)
                if extra:
                    message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def draining_server(app, host: str, port: int, grace_s: float = 2.0):
    """uvicorn's server, drained on SIGTERM (or SIGINT): it stops accepting, answers what arrives on the open
    connections (closing each after its answer), and when they are closed, or after `grace_s`, shuts down as
    uvicorn does (requests in flight answered, then the runtime: its queued requests finish); exit status 0.
    uvicorn alone closes an idle keep-alive connection at once, dropping a request the client has just written
    on it unread, and then raises the signal again (the process ends killed by it)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        draining_since: float | None = None

        def handle_exit(self, sig, frame) -> None:
            if self.draining_since is None:
                self.draining_since = time.monotonic()
                app.state.draining = True
            else:  # a second signal: uvicorn's shutdown now (SIGINT twice: without waiting)
                super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self.draining_since is None:
                return await super().on_tick(counter)
            for server in self.servers:
                server.close()  # no new connections (idempotent)
            return not self.server_state.connections or time.monotonic() - self.draining_since > grace_s

    return DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning", http=http_protocol()))


class _OneWrite:
    """A transport that writes what one turn of the event loop gave it in one system call, at the end of that turn:
    uvicorn writes an answer's status line and headers, then its body, each at once (two packets, the client woken
    twice). Everything else is the connection's own transport."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport, loop) -> None:
        self._transport, self._loop, self._pending = transport, loop, []

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def write(self, data) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data if type(data) is bytes else bytes(data))

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()


def http_protocol():
    """uvicorn's HTTP protocol (httptools where installed, as its "auto"), each answer written in one system call."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # (no httptools: uvicorn's h11 protocol as it is)
        return "auto"

    class OneWriteProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(_OneWrite(transport, self.loop))

    return OneWriteProtocol
