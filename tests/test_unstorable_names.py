"""Names no store can hold (a NUL, half a surrogate pair) name nothing, alike on both stores:
PostgreSQL refuses such text outright, and a lookup by one answered 503 "unavailable" over HTTP
(a client retries that for good) and ``StoreError`` in Python, where SQLite said 404 / not found;
half a pair raised a bare ``UnicodeEncodeError`` from either."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

import hearth
from hearth.errors import SubmissionNotFound, UnknownAgent, WaitNotFound
from hearth.server.asgi import HearthASGI
from hearth.testing import ScriptedModel, reply

pytestmark = pytest.mark.anyio

ODD = ["\x00", "\ud800"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def runtime(db_url: str) -> AsyncIterator[Any]:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/m")
        return ""

    model = ScriptedModel("m", [reply("x")], repeat_last=True)
    app = hearth.App([hearth.Agent(render, name="a")], db=db_url, providers=[model])
    async with app.run() as rt:
        await rt.read(await rt.dispatch("a", "c1", "hi"), timeout=20)
        yield rt


@pytest.mark.parametrize("odd", ODD, ids=["nul", "half-pair"])
async def test_the_python_api_says_not_found(runtime: Any, odd: str) -> None:
    rt = runtime
    with pytest.raises(UnknownAgent):
        await rt.history(f"a{odd}", "c1")
    with pytest.raises(UnknownAgent):
        await rt.abort(f"a{odd}", "c1")
    with pytest.raises(SubmissionNotFound):
        await rt.submission(f"s{odd}")
    with pytest.raises(SubmissionNotFound):
        await rt.read(f"s{odd}", timeout=1)
    with pytest.raises(SubmissionNotFound):
        await rt.conversation_submission("a", "c1", f"s{odd}")
    with pytest.raises(WaitNotFound):
        await rt.resolve("a", "c1", f"w{odd}", 1)
    assert await rt.waits(f"a/c{odd}") == []
    assert await rt.conversations(f"a{odd}") == []


async def test_http_answers_404_or_400_never_503(runtime: Any) -> None:
    transport = httpx2.ASGITransport(app=HearthASGI(runtime))
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as client:
        for method, path in [
            ("GET", "/agents/a%00/c1"),
            ("POST", "/agents/a%00/c1/abort"),
            ("GET", "/agents/a%00/c1/stream"),
            ("GET", "/agents/a%00/c1/submissions/s1"),
            ("GET", "/conversations?agent=a%00"),
            ("GET", "/console/a%00/c1"),
            ("GET", "/?agent=a%00"),
        ]:
            answer = await client.request(method, path)
            assert answer.status_code in (400, 404), (method, path, answer.text)
