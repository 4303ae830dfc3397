"""``app.asgi()`` mounted inside a user's own Starlette app."""

from __future__ import annotations

import asyncio
import contextvars
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from httpharness import child_env, free_port, make_app, sse_records, wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import hearth
from hearth.testing import ScriptedModel, call, calls, reply


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello from the outer app")


class Served:
    """Any ASGI app under uvicorn in a thread."""

    def __init__(self, asgi: Any) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive()
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        assert not self.thread.is_alive()


def exercise(url: str) -> None:
    with httpx2.Client(base_url=url, timeout=10) as http:
        assert http.get("/hello").text == "hello from the outer app"
        r = http.post("/hearth/agents/echo/c-1", json={"message": "hi"})
        assert r.status_code == 202
        assert r.headers["location"] == "/hearth/agents/echo/c-1/stream?offset=0"
        sid = r.json()["submission_id"]
        sub = http.get(f"/hearth/agents/echo/c-1/submissions/{sid}", params={"wait": 10}).json()
        assert sub["reply"] == "echo: hi"
        headers = {"accept": "text/event-stream"}
        with http.stream("GET", "/hearth/agents/echo/c-1/stream", headers=headers) as response:
            for _, record in sse_records(response):
                if record["type"] == "submission_settled":
                    break
        assert http.get("/hearth/healthz").json() == {"status": "ok"}
        assert http.get("/hearth/nowhere").json()["error"]["type"] == "not_found"
        console = http.get("/hearth/").text  # the console's links stay under the mount
        assert 'href="/hearth/console/echo/c-1"' in console
        assert 'href="/hearth/console/static/console.css"' in console
        assert 'data-root="/hearth"' in http.get("/hearth/console/echo/c-1").text
        assert http.get("/hearth/console/static/console.js").status_code == 200


def test_mounted_without_lifespan_starts_the_runtime_on_first_request(tmp_path: Path) -> None:
    api = make_app(tmp_path / "h.db").asgi()
    outer = Starlette(routes=[Route("/hello", hello), Mount("/hearth", app=api)])
    with Served(outer) as url:
        exercise(url)


def test_mounted_with_the_outer_lifespan_starts_and_stops_with_it(tmp_path: Path) -> None:
    api = make_app(tmp_path / "h.db", token="tok").asgi()
    outer = Starlette(
        routes=[Route("/hello", hello), Mount("/hearth", app=api)], lifespan=api.lifespan
    )
    with Served(outer) as url:
        assert api._runtime is not None  # started at boot, before any request
        with httpx2.Client(base_url=url) as http:
            assert http.get("/hearth/metrics").status_code == 401
            assert http.get("/hello").status_code == 200  # the token guards only hearth's routes
            signed = http.post(
                "/hearth/console/session",
                content="token=tok&next=/hearth/console/echo/c-1",
                headers={"origin": url, "content-type": "application/x-www-form-urlencoded"},
            )
            assert signed.status_code == 303
            assert signed.headers["location"] == "/hearth/console/echo/c-1"
            assert "Path=/hearth/" in signed.headers["set-cookie"]
            assert http.get("/hearth/metrics").status_code == 200  # with the cookie
    assert api._runtime is None  # stopped, and ready to start again


@pytest.mark.parametrize("lifespan", ["outer lifespan", "started by a request"])
def test_an_app_served_again_after_it_stopped_starts_a_new_runtime(
    tmp_path: Path, lifespan: str
) -> None:
    """A second lifespan (a test client per test, a server restarted in one process), or a
    request after the event loop the runtime ran on ended, found the first runtime stopped,
    and every request answered 503 shutting_down for good."""
    api = make_app(tmp_path / "h.db").asgi()
    outer = Starlette(
        routes=[Mount("/hearth", app=api)],
        lifespan=api.lifespan if lifespan == "outer lifespan" else None,
    )
    for n in range(2):
        with Served(outer) as url, httpx2.Client(base_url=url, timeout=10) as http:
            r = http.post(f"/hearth/agents/echo/c-{n}", json={"message": "hi"})
            assert r.status_code == 202, r.text
            sid = r.json()["submission_id"]
            done = http.get(f"/hearth/agents/echo/c-{n}/submissions/{sid}", params={"wait": 10})
            assert done.json()["reply"] == "echo: hi"


tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


@hearth.tool
async def whose() -> str:
    """Whose request this is."""
    return tenant.get()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_runtime_a_request_starts_does_not_take_on_that_requests_context(
    anyio_backend: str,
) -> None:
    """Mounted without a lifespan, the runtime started in the first request's context: every
    tool of every later request saw that request's contextvars (a tenant, a user)."""

    @hearth.agent
    def desk(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/desk")
        ctx.use_tool(whose)
        return ""

    model = ScriptedModel("desk", [calls(call("whose")), reply("ok")] * 2)
    api = hearth.App([desk], db="memory", providers=[model]).asgi()

    async def per_tenant(scope: Any, receive: Any, send: Any) -> None:
        token = tenant.set(dict(scope.get("headers", [])).get(b"x-tenant", b"?").decode())
        try:
            await api(scope, receive, send)
        finally:
            tenant.reset(token)

    transport = httpx2.ASGITransport(app=per_tenant)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as http:
        for who in ("alice", "bob"):
            r = await http.post(
                f"/agents/desk/{who}", json={"message": "hi"}, headers={"x-tenant": who}
            )
            sid = r.json()["submission_id"]
            await http.get(f"/agents/desk/{who}/submissions/{sid}", params={"wait": 10})
        seen = {}
        for who in ("alice", "bob"):
            page = (await http.get(f"/agents/desk/{who}/stream")).json()
            (outcome,) = [r for r in page["records"] if r["type"] == "tool_outcome"]
            seen[who] = outcome["content"]
    await api.stop()
    assert seen == {"alice": "none", "bob": "none"}


@pytest.mark.parametrize(("target", "prefix"), [("asgiapp:api", ""), ("asgiapp:outer", "/hearth")])
def test_sigterm_under_plain_uvicorn_ends_open_streams_and_exits(
    tmp_path: Path, target: str, prefix: str
) -> None:
    """uvicorn waits for open connections before it runs the lifespan shutdown, where alone
    hearth ended its streams: one SSE follower kept the process from ever exiting."""
    port = free_port()
    url = f"http://127.0.0.1:{port}{prefix}"
    env = child_env(HEARTH_DB=f"sqlite:///{tmp_path / 'h.db'}")
    args = [sys.executable, "-m", "uvicorn", target, "--port", str(port), "--log-level", "warning"]
    with (tmp_path / "server.log").open("w") as log:
        proc = subprocess.Popen(args, stderr=log, env=env)
    try:
        wait_until(lambda: _answers(f"{url}/healthz"), timeout=20)
        httpx2.post(f"{url}/agents/echo/c-1", json={"message": "hi"}).raise_for_status()
        seen: list[dict[str, Any]] = []
        ended: list[bool] = []

        def follow() -> None:
            headers = {"accept": "text/event-stream"}
            stream = f"{url}/agents/echo/c-1/stream"
            with httpx2.stream("GET", stream, headers=headers, timeout=60) as r:
                seen.extend(record for _, record in sse_records(r))  # raises if it breaks
            ended.append(True)

        follower = threading.Thread(target=follow)
        follower.start()
        wait_until(lambda: any(r["type"] == "submission_settled" for r in seen), timeout=15)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)  # (uvicorn's graceful shutdown has no time limit by default)
        follower.join(5)
        assert ended == [True]  # the stream ended cleanly: the client reconnects elsewhere
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False
