"""HTTP service over a SQLStore: the tuning database shared by tuning machines.

``create_app(store, token=...)`` builds the FastAPI app (one router per resource; OpenAPI at
``/openapi.json``, docs at ``/docs``); ``serve(url, ...)`` opens the store and runs it with uvicorn.
Writes (``POST /workloads``, ``POST /records``) need ``Authorization: Bearer <token>`` when a token is
configured; reads are open. Bad input gets a 4xx answer ``{"detail": message}`` (422: plus ``"errors"``,
see ``ValidationErrorOut``) and never reaches the store half-validated: JSON nested deeper than
``MAX_JSON_DEPTH`` (in the body or in a ``*_json`` field) and NUL characters are refused with 422 on every
backend. The OpenAPI document lists every error answer each operation can send.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import pathlib
import socket
import stat
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

import tvmsched
from tvmsched.errors import TvmschedError, one_line
from tvmsched.tuning_db.json_limits import JSONTooDeep, check_depth
from tvmsched.tuning_db.schemas import (
    MAX_INT32,
    MAX_JSON_DEPTH,
    ErrorOut,
    Health,
    LookupQuery,
    RecordIn,
    RecordOut,
    Stats,
    TopKQuery,
    ValidationErrorOut,
    WorkloadFind,
    WorkloadIn,
    WorkloadOut,
)
from tvmsched.tuning_db.store import SQLStore

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_ERRORS_IN_DETAIL = 3

_bearer = HTTPBearer(auto_error=False, description="the service token (writes only)")


# --- dependencies -------------------------------------------------------------------------------


def get_store(request: Request) -> SQLStore:
    """The store the app was created with."""
    return request.app.state.store


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Reject the request with 401 unless it carries the configured bearer token (if any)."""
    expected: str | None = request.app.state.token
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8")):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


StoreDep = Annotated[SQLStore, Depends(get_store)]
WriteAuth = [Depends(require_token)]


# --- the error answers, as the OpenAPI document lists them ------------------------------------------


def _error(description: str, **extra) -> dict:
    return {"model": ErrorOut, "description": description, **extra}


ANY_REQUEST = {  # BodyLimit and FastAPI's body reading answer these before any handler runs
    400: _error("the request cannot be read (an invalid Content-Length, a body that is not UTF-8 JSON text) "
                "or the database refuses it"),
    413: _error("the request body is over the service's limit"),
    500: _error("an unexpected error; the service log has the details"),
}
STORE = {503: _error("the database is unavailable (down, locked or out of connections); retry later")}
INVALID = {422: {"model": ValidationErrorOut, "description": "invalid parameters or body"}}
UNAUTHORIZED = {
    401: _error(
        "missing or invalid bearer token",
        headers={"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    )
}
NOT_FOUND = {404: _error("not found")}


class CheckedRoute(APIRoute):
    """A route that refuses a request body nested deeper than MAX_JSON_DEPTH with 422, before parsing it.

    FastAPI parses JSON bodies with ``json.loads``, which recurses once per level: a deep body would end
    in RecursionError (answered 400 by FastAPI, 500 if it happened anywhere else). The depth is measured
    without recursion; the body stays cached on the request for FastAPI's own parsing.
    """

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            try:
                check_depth(await request.body(), MAX_JSON_DEPTH)
            except UnicodeDecodeError:
                pass  # FastAPI answers 400: the body is not text
            except JSONTooDeep as err:
                raise RequestValidationError([{"type": "json_too_deep", "loc": ("body",), "msg": str(err)}]) from None
            return await handler(request)

        return checked


# --- routers --------------------------------------------------------------------------------------

health_router = APIRouter(tags=["health"], route_class=CheckedRoute)
stats_router = APIRouter(tags=["stats"], route_class=CheckedRoute, responses=STORE)
workloads_router = APIRouter(prefix="/workloads", tags=["workloads"], route_class=CheckedRoute, responses=STORE)
records_router = APIRouter(prefix="/records", tags=["records"], route_class=CheckedRoute, responses=STORE)


@health_router.get("/health", response_model=Health)
def health(request: Request) -> Health:
    """Liveness: the service is up (does not touch the database)."""
    return Health(
        version=tvmsched.__version__,
        backend=_backend_name(request.app.state.store),
        auth=request.app.state.token is not None,
    )


@stats_router.get("/stats", response_model=Stats)
def stats(store: StoreDep) -> Stats:
    """Row counts of the database."""
    return Stats.model_validate(store.stats())


@workloads_router.post(
    "",
    response_model=WorkloadOut,
    status_code=status.HTTP_201_CREATED,
    dependencies=WriteAuth,
    responses={200: {"model": WorkloadOut, "description": "already stored (idempotent)"}, **UNAUTHORIZED, **INVALID},
)
def commit_workload(body: WorkloadIn, response: Response, store: StoreDep) -> WorkloadOut:
    """Commit a workload; committing it again returns the stored row with 200."""
    existed = store.find_workload(body.shash, body.mod_json) is not None
    row = store.commit_workload(body.shash, body.mod_json, body.description)
    if existed:
        response.status_code = status.HTTP_200_OK
    log.debug("workload %d (shash %s) committed, new=%s", row.id, row.shash, not existed)
    return WorkloadOut.model_validate(row)


@workloads_router.get("", response_model=list[WorkloadOut])
def list_workloads(store: StoreDep) -> list[WorkloadOut]:
    """All workloads."""
    return [WorkloadOut.model_validate(row) for row in store.all_workloads()]


@workloads_router.get("/lookup", response_model=WorkloadOut, responses={**NOT_FOUND, **INVALID})
def lookup_workload(query: Annotated[LookupQuery, Query()], store: StoreDep) -> WorkloadOut:
    """Find a workload by structural hash alone (use ``POST /workloads/find`` to match the module)."""
    return _workload_or_404(store.find_workload(query.shash), f"no workload with shash {query.shash}")


@workloads_router.post("/find", response_model=WorkloadOut, responses={**NOT_FOUND, **INVALID})
def find_workload(body: WorkloadFind, store: StoreDep) -> WorkloadOut:
    """Find a workload by structural hash and, when given, the same module JSON (a read)."""
    row = store.find_workload(body.shash, body.mod_json)
    return _workload_or_404(row, f"no workload with shash {body.shash} and this module")


@workloads_router.get("/{workload_id:int}", response_model=WorkloadOut, responses={**NOT_FOUND, **INVALID})
def get_workload(workload_id: Annotated[int, Path(ge=1, le=MAX_INT32)], store: StoreDep) -> WorkloadOut:
    """One workload by id."""
    return _workload_or_404(store.get_workload(workload_id), f"no workload with id {workload_id}")


@records_router.post(
    "",
    response_model=RecordOut,
    status_code=status.HTTP_201_CREATED,
    dependencies=WriteAuth,
    responses={404: _error("unknown workload"), **UNAUTHORIZED, **INVALID},
)
def commit_record(body: RecordIn, store: StoreDep) -> RecordOut:
    """Commit a tuning record; idempotent (the same record again returns the stored row, also 201)."""
    fields = body.model_dump(exclude={"workload_id"})
    try:
        row = store.commit_record(body.workload_id, **fields)
    except KeyError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown workload id {body.workload_id}") from None
    log.debug("record %d committed for workload %d", row.id, row.workload_id)
    return RecordOut.model_validate(row)


@records_router.get("/top", response_model=list[RecordOut], responses=INVALID)
def top_k(query: Annotated[TopKQuery, Query()], store: StoreDep) -> list[RecordOut]:
    """The k fastest valid records of a workload, optionally for one target hash and unit count."""
    rows = store.top_k(query.workload_id, query.k, target_hash=query.target_hash, units=query.units)
    return [RecordOut.model_validate(row) for row in rows]


@records_router.get("", response_model=list[RecordOut])
def list_records(store: StoreDep) -> list[RecordOut]:
    """All records."""
    return [RecordOut.model_validate(row) for row in store.all_records()]


def _workload_or_404(row, message: str):
    """``row``, or a 404 with ``message`` when it is None."""
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, message)
    return WorkloadOut.model_validate(row)


def _backend_name(store: SQLStore) -> str:
    """The database dialect of the store's URL (never the URL: it may hold a password)."""
    return str(getattr(store, "url", "")).split(":", 1)[0].split("+", 1)[0] or "unknown"


# --- error handling -------------------------------------------------------------------------------


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with a one-line ``detail`` and the error list (without echoing the input back)."""
    errors = [
        {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "")), "type": str(err.get("type", ""))}
        for err in exc.errors()
    ]
    parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:MAX_ERRORS_IN_DETAIL]]
    if len(errors) > MAX_ERRORS_IN_DETAIL:
        parts.append(f"({len(errors) - MAX_ERRORS_IN_DETAIL} more)")
    detail = "invalid request: " + "; ".join(parts)
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's answer, except that a 405 lists every method of the path in ``Allow``.

    Starlette names only the methods of the first route whose path matches (``OPTIONS /workloads`` would
    get ``Allow: POST`` although ``GET /workloads`` exists too).
    """
    if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        methods = [method for method in _HTTP_METHODS if _routes_accept(request, method)]
        if methods:
            headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
            exc = StarletteHTTPException(exc.status_code, exc.detail, headers=headers)
    return await http_exception_handler(request, exc)


def _routes_accept(request: Request, method: str) -> bool:
    """Whether some route of the app fully matches this request's path with ``method``."""
    for route in request.app.router.routes:
        scope = {"type": "http", "method": method, "path": request.scope["path"], "headers": [], "query_string": b"",
                 "root_path": request.scope.get("root_path", "")}  # fresh: matching may write into the scope
        if route.matches(scope)[0] is Match.FULL:
            return True
    return False


async def _on_user_error(request: Request, exc: Exception) -> JSONResponse:
    """A store-level refusal of the input (TvmschedError) is the client's fault: 400."""
    log.info("%s %s refused: %s", request.method, request.url.path, one_line(exc))
    return JSONResponse({"detail": one_line(exc)}, status_code=status.HTTP_400_BAD_REQUEST)


async def _on_database_down(request: Request, exc: Exception) -> JSONResponse:
    """Database unreachable, locked or out of connections: 503, which clients retry (all is idempotent)."""
    reason = one_line(getattr(exc, "orig", None) or exc)
    log.error("%s %s: database error: %s", request.method, request.url.path, reason)
    return JSONResponse({"detail": "the database is unavailable; retry later"}, status_code=503)


class CatchAll:
    """ASGI middleware: an unexpected error becomes a logged 500 ``{"detail": ...}``.

    Unlike Starlette's own 500 handler it does not re-raise, so uvicorn keeps the connection usable.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the service must answer, whatever the handler did
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await _send_error(send, 500, f"internal error ({type(exc).__name__}); see the service log")


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``max_bytes`` (declared Content-Length or actual size)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is None:
            await _send_error(send, 400, "invalid Content-Length header")
            return
        if declared > self.max_bytes:
            await _send_error(send, 413, self._too_large(declared))
            return
        body, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_error(send, 413, self._too_large(size, at_least=True))
                return
            body.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(body), receive), send)

    def _too_large(self, size: int, at_least: bool = False) -> str:
        prefix = "at least " if at_least else ""
        return f"request body too large: {prefix}{size} bytes, the limit is {self.max_bytes}"


def _content_length(scope) -> int | None:
    """The declared Content-Length (0 when absent), or None when it is not a number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return None
    return 0


def _replay(body: bytes, receive):
    """An ASGI receive that yields the buffered body once, then defers to the real one."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(send, code: int, detail: str) -> None:
    """Answer ``{"detail": detail}`` with ``code`` directly (the app never sees the request)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- app and server -------------------------------------------------------------------------------


def create_app(
    store: SQLStore, *, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> FastAPI:
    """The tuning-database HTTP app over ``store``.

    Args:
        store: the SQLStore to serve (any object with its methods).
        token: the bearer token writes need; None leaves writes open.
        max_body_bytes: larger request bodies are refused with 413.
    """
    if token is not None and not token:
        raise TvmschedError("the service token must not be empty")
    app = FastAPI(
        title="tvmsched tuning database",
        version=tvmsched.__version__,
        description=(
            "MetaSchedule workloads and tuning records shared between tuning machines. Request bodies are "
            "strict: no unknown fields, no type coercion (integers written as integers: `2`, not `2.0`). "
            f"No string may contain a NUL character; JSON nests at most {MAX_JSON_DEPTH} levels."
        ),
    )
    app.state.store = store
    app.state.token = token
    for router in (health_router, stats_router, workloads_router, records_router):
        app.include_router(router, responses=ANY_REQUEST)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(TvmschedError, _on_user_error)
    app.add_exception_handler(OperationalError, _on_database_down)
    app.add_exception_handler(PoolTimeout, _on_database_down)
    app.add_middleware(CatchAll)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def read_token(token_file: str | os.PathLike) -> str:
    """The token in ``token_file`` (whitespace stripped); TvmschedError if missing or empty."""
    path = pathlib.Path(token_file)
    try:
        token = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise TvmschedError(f"cannot read the token file {path}: {reason}") from None
    if not token:
        raise TvmschedError(f"the token file {path} is empty")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the token file %s is readable by other users (chmod 600 it)", path)
    return token


def serve(
    url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    token_file: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_level: str = "info",
) -> None:
    """Open ``SQLStore(url)`` and serve it on ``host:port`` until interrupted (SIGINT/SIGTERM).

    Raises:
        TvmschedError: an unreadable token file, a port out of range or in use, an unknown host, or a
            database that cannot be opened; each before anything is served.
    """
    import uvicorn

    token = read_token(token_file) if token_file is not None else None
    sock = listen_socket(host, port)
    if token is None and not _is_loopback(host):
        log.warning("serving on %s without a token: anyone who can reach it can write records", host)
    try:
        store = SQLStore(url)
        try:
            app = create_app(store, token=token, max_body_bytes=max_body_bytes)
            config = uvicorn.Config(app, host=host, port=port, log_level=log_level)
            server = uvicorn.Server(config)
            shown_host = f"[{host}]" if ":" in host else host
            logging.getLogger("uvicorn.error").info(  # uvicorn says this only when it binds the socket itself
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", shown_host, sock.getsockname()[1]
            )
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down gracefully (as uvicorn.run does)
                pass
        finally:
            store.close()
    finally:
        sock.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (uvicorn's options), or TvmschedError saying why not.

    Binding here rather than in uvicorn turns a port in use or out of range into one clear error
    (uvicorn would log it and exit with its own status).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise TvmschedError(f"invalid port {port!r}: it must be an integer from 0 to 65535")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as err:
        sock.close()
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TvmschedError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
