"""The ASGI application: one ``RuntimeHost`` such as a hearth ``App`` (or a running ``Runtime``)
behind HTTP.

Lifecycle. Run directly by an ASGI server (``hearth serve``, ``uvicorn``), the application's own
lifespan starts the runtime and stops it. Mounted inside another Starlette or FastAPI app, where
sub-application lifespans never run, it starts the runtime on the first request instead; give the
outer app ``lifespan=hearth_asgi.lifespan`` to start it at boot and stop it gracefully::

    api = app.asgi()
    outer = Starlette(routes=[Mount("/hearth", api)], lifespan=api.lifespan)

Built from a ``Runtime`` that the caller started, it never starts or stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from hearth.config import Settings
from hearth.runtime.runtime import Runtime
from hearth.server import console
from hearth.server.context import CLOSING_KEY, Closing, Endpoint
from hearth.server.errors import ApiError, api_error, error_response
from hearth.server.exit_signals import on_exit_signals
from hearth.server.host import RuntimeHost
from hearth.server.routes import admit, routes
from hearth.server.session import cross_origin, same_origin, session_cookie, session_valid
from hearth.server.tail import MAX_WAIT_S

log = logging.getLogger("hearth.server")
_ADMISSION_PATH = re.compile(r"/agents/([^/]+)/([^/]+)")
_CHANNEL_PATH = re.compile(r"/channels/[^/]+")  # signed by its sender, not with the token

DEFAULT_HEARTBEAT_S = 15.0


class HearthASGI:
    """The HTTP API (docs/http.md) as an ASGI callable. Make one with ``app.asgi()``."""

    def __init__(
        self,
        target: RuntimeHost | Runtime,
        *,
        sse_heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        max_wait_s: float = MAX_WAIT_S,
    ):
        if isinstance(target, Runtime):
            self._app: RuntimeHost | None = None
            self._runtime: Runtime | None = target
        else:
            self._app = target
            self._runtime = None
        self.sse_heartbeat_s = sse_heartbeat_s
        self.max_wait_s = max_wait_s  # the longest ?wait= long-poll; longer is a 400
        self.closing = Closing()
        self.sse_streams = 0
        self._starting: asyncio.Future[Runtime] | None = None
        self._owner: asyncio.Task[None] | None = None
        self._release: asyncio.Event | None = None
        self._stopper: asyncio.Task[None] | None = None
        # Admission is the hot path: it skips the router (same handler, same answers).
        self._admit = self._endpoint(admit)
        # One route per path, whatever its methods: a 405 then names them all in ``Allow``.
        by_path: dict[str, dict[str, Endpoint]] = {}
        for path, fn, methods in routes():
            for method in methods:
                by_path.setdefault(path, {})[method] = fn
        self._router = Starlette(
            routes=[
                Route(path, self._by_method(endpoints), methods=list(endpoints))
                for path, endpoints in by_path.items()
            ],
            exception_handlers={HTTPException: _http_exception},
            lifespan=self.lifespan,
        )

    # --- settings and the runtime ---------------------------------------------------------
    @property
    def settings(self) -> Settings:
        if self._runtime is not None:
            return self._runtime.settings
        assert self._app is not None
        return self._app.settings

    @property
    def shutting_down(self) -> bool:
        self._forget_ended()
        rt = self._runtime
        return self.closing.is_set() or (rt is not None and rt.shutting_down)

    def _forget_ended(self) -> None:
        """A runtime this app started that stopped without ``stop`` (the event loop it ran on
        ended: a test client's, say) is forgotten: the next request starts a new one."""
        rt = self._runtime
        if self._app is not None and rt is not None and rt.stopped and not self.closing.is_set():
            self._forget()

    def _forget(self) -> None:
        """Forget the runtime this app started (stopped for good), and its closing event (of
        the loop it ran on): a later lifespan or request starts a new one."""
        self._runtime = self._starting = self._release = self._stopper = self._owner = None
        self.closing = Closing()

    async def runtime(self) -> Runtime:
        """The running runtime, started now if nobody started it yet."""
        self._forget_ended()
        if self._runtime is not None:
            return self._runtime
        if self.closing.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down")
        starting = self._starting
        if starting is None or (starting.done() and (starting.cancelled() or starting.exception())):
            # One start for all the requests that wait for it; a failed one is tried again.
            # In a context of its own: the runtime's tasks (attempts, tools) must not see the
            # contextvars of the request that happened to start it (a tenant, a user).
            starting = self._starting = asyncio.create_task(
                self._start(), context=contextvars.Context()
            )
        # Shielded: a request that goes away must not cancel the start the others wait for.
        return await asyncio.shield(starting)

    async def _start(self) -> Runtime:
        assert self._app is not None
        app = self._app
        ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()

        async def own() -> None:
            # One task holds ``app.run()`` open from start to stop, whoever asked for either.
            try:
                async with app.run() as rt:
                    ready.set_result(rt)
                    await release.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                    return
                raise

        owner = asyncio.create_task(own(), name="hearth-runtime")
        try:
            runtime = await ready
        except Exception as exc:
            await asyncio.gather(owner, return_exceptions=True)
            raise ApiError(503, "unavailable", f"the runtime could not start: {exc}") from exc
        self._runtime, self._owner, self._release = runtime, owner, release
        return runtime

    def begin_shutdown(self) -> None:
        """Stop admitting (503), end open streams and long-polls, and interrupt running work so
        that its leases are released. Safe to call more than once; needs the event loop."""
        self.closing.set()
        rt = self._runtime
        if rt is not None and self._owner is not None:
            rt.shutting_down = True
            if self._stopper is None:
                self._stopper = asyncio.ensure_future(rt.stop())

    async def stop(self) -> None:
        """Shut down and close the store (when this app started the runtime)."""
        self.begin_shutdown()
        owner, release = self._owner, self._release
        if owner is None or release is None:
            return
        if self._stopper is not None:
            with contextlib.suppress(Exception):
                await self._stopper
        release.set()
        try:
            await owner
        finally:
            # (a later lifespan, a test client per test, finds no runtime shutting down for ever)
            self._forget()

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any = None) -> AsyncIterator[None]:
        """Start the runtime before serving and stop it after; usable as an outer app's
        ``lifespan``."""
        if self._app is not None:
            try:
                await self.runtime()
            except ApiError as exc:
                raise RuntimeError(exc.message) from exc.__cause__
        # The server runs this shutdown only once every connection has closed: its signal is
        # when streams and long-polls must end.
        undo = on_exit_signals(self.begin_shutdown)
        try:
            yield
        finally:
            undo()
            await self.stop()

    def count_sse(self, delta: int) -> None:
        self.sse_streams += delta

    # --- requests -------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._router(scope, receive, send)  # the lifespan (a websocket: refused)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._serve_http(scope, receive, send_tracked)
        except asyncio.CancelledError:
            if started or not self.shutting_down:
                raise
            # The server's grace ran out with this request unanswered, and it cancelled the
            # request: the answer is a shutdown's (it was a bare 500, and a traceback logged).
            await _cut_short(scope, receive, send)

    async def _serve_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        refused = self._refusal(scope, receive)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if _encoded_slash(scope):
            response = error_response(
                400,
                "invalid_id",
                "an agent name, conversation id or submission id cannot contain '/'",
            )
            await response(scope, receive, send)
            return
        if scope["method"] == "POST":
            found = _ADMISSION_PATH.fullmatch(route_path(scope))
            if found:
                scope["path_params"] = {"agent": found[1], "id": found[2]}
                response = await self._admit(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self._router(scope, receive, send)

    def _refusal(self, scope: Scope, receive: Receive) -> Response | None:
        """The answer to a request that may not proceed (401, the console's sign-in form, or
        403 for a state-changing request from a web page of another origin); None to serve it."""
        token = self.settings.token
        path = route_path(scope)
        channel = scope["method"] == "POST" and _CHANNEL_PATH.fullmatch(path) is not None
        given = _bearer(scope)
        # With or without a token, a page elsewhere must not make a browser change anything
        # here (a form POST needs no CORS preflight); no browser sends a bearer token by itself
        # (Basic credentials, which it may, are no exemption).
        if not given and not channel and cross_origin(scope):
            return error_response(
                403,
                "forbidden",
                "a request that changes something may not come from a web page of another"
                " origin (its Origin header did not name this server)",
            )
        if not token or path == "/healthz" or path in console.PUBLIC_PATHS:
            return None
        if path.startswith(console.PUBLIC_PREFIX):
            return None
        if channel:
            return None  # the channel's own verify authenticates it
        if given is not None:
            return None if hmac.compare_digest(given, token.encode()) else _unauthorized(given)
        cookie = session_cookie(scope)
        if cookie is not None and session_valid(token, cookie):
            if not same_origin(scope):
                return error_response(
                    403,
                    "forbidden",
                    "a request made with the console's session cookie must come from the"
                    " console's own origin (its Origin header did not name this server)",
                )
            scope["hearth_session"] = True
            return None
        if scope["method"] in ("GET", "HEAD") and console.is_console_page(path):
            return console.sign_in_page(Request(scope, receive))
        return _unauthorized()

    def _by_method(
        self, endpoints: dict[str, Endpoint]
    ) -> Callable[[Request], Awaitable[Response]]:
        handlers = {method: self._endpoint(fn) for method, fn in endpoints.items()}
        if "GET" in handlers:
            handlers.setdefault("HEAD", handlers["GET"])

        async def handle(request: Request) -> Response:
            return await handlers[request.method](request)

        return handle

    def _endpoint(self, fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            request.scope[CLOSING_KEY] = self.closing  # a body still arriving ends with it
            try:
                return await fn(self, request)
            except Exception as exc:
                return api_error(exc).response()

        return handle


async def _cut_short(scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(
        503,
        "shutting_down",
        "the server shut down before it finished this request; send it again (an idempotency"
        " key or a delivery id makes that safe)",
        headers={"Retry-After": "1", "Connection": "close"},
    )
    await response(scope, receive, send)


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, given = bytes(value).partition(b" ")
            if scheme.lower() == b"bearer":
                return given.strip()
            return b""  # another scheme: wrong, not absent
    return None


def _unauthorized(given: bytes | None = None) -> Response:
    if given is None:
        message = "a bearer token is required: send Authorization: Bearer <HEARTH_TOKEN>"
    else:  # (one that was sent: the operator is told which mistake, not that none came)
        message = (
            "the bearer token sent is not this server's (HEARTH_TOKEN); or the Authorization"
            " header is not of the form Bearer <token>"
        )
    return error_response(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def route_path(scope: Scope) -> str:
    """The request path below the mount point, if mounted."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :] or "/"
    return path


def _encoded_slash(scope: Scope) -> bool:
    """Whether an ``/agents`` path has a ``%2F`` in a segment: an id with a slash in it, which
    the router would otherwise read as more segments."""
    raw = scope.get("raw_path")
    if not raw or not route_path(scope).startswith("/agents/"):
        return False
    return b"%2f" in bytes(raw).lower()


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    message = {
        404: f"no route {request.method} {route_path(request.scope)}; see /openapi.json",
        405: f"{request.method} is not allowed here",
    }.get(exc.status_code, exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, kind, message, headers=headers)


def build_asgi(
    target: RuntimeHost | Runtime, *, sse_heartbeat_s: float = DEFAULT_HEARTBEAT_S
) -> HearthASGI:
    """The ASGI application serving ``target``: a ``RuntimeHost`` such as ``hearth.App``, or a
    ``Runtime`` you started."""
    return HearthASGI(target, sse_heartbeat_s=sse_heartbeat_s)
