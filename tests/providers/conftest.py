"""Fixtures for the provider tests; the fake model server itself is ``fakellm.FakeServer``.

The server runs its own asyncio loop in a background thread, so what it observes (requests,
disconnects) does not depend on the loop of the test that drives the client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from fakellm import FakeServer

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    ModelEvent,
    ModelRequest,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserTurn,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


Collect = Callable[..., Awaitable[tuple[list[ModelEvent], ProviderError | None]]]


@pytest.fixture
def collect() -> Collect:
    """Run a provider's stream to the end: ``(events, the ProviderError raised or None)``."""

    async def run(provider: Any, request: ModelRequest) -> tuple[list[ModelEvent], Any]:
        events: list[ModelEvent] = []
        try:
            async with contextlib.aclosing(provider.stream(request)) as stream:
                async for event in stream:
                    events.append(event)
        except ProviderError as exc:
            return events, exc
        return events, None

    return run


@pytest.fixture
def hello() -> ModelRequest:
    return ModelRequest(model="m", system="Be brief.", messages=(UserTurn("hello"),))


@pytest.fixture
def conversation() -> ModelRequest:
    """Every kind of message: a tool batch with an interrupted call, a note, a summary."""
    weather = ToolSpec(
        "get_weather",
        "Look the weather up.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    return ModelRequest(
        model="m",
        system="You are helpful.",
        summary="The user lives in Oslo.",
        tools=(weather,),
        messages=(
            UserTurn("What's the weather in Oslo and Bergen?"),
            AssistantTurn(
                text="Let me check.",
                tool_calls=(
                    ToolCall("call_A1", "get_weather", {"city": "Oslo"}),
                    ToolCall("toolu_B2", "get_weather", {"city": "Bergen"}),
                ),
            ),
            ToolResult("call_A1", "get_weather", {"temp_c": 4}),
            ToolResult(
                "toolu_B2",
                "get_weather",
                {"type": "interrupted", "message": "the call was cut off; outcome unknown"},
                is_error=True,
            ),
            SystemNote("submission_interrupted", "The previous attempt crashed."),
            UserTurn("And tomorrow?"),
        ),
    )
