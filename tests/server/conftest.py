"""Fixtures for the HTTP server, SDK and CLI tests: real uvicorn servers on free ports."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from httpharness import ThreadServer, make_app


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def serve_app(tmp_path: Path) -> Iterator[Callable[..., ThreadServer]]:
    """``serve_app(**settings)``: a started in-process server on a fresh SQLite file."""
    started: list[ThreadServer] = []

    def start(sse_heartbeat_s: float = 15.0, **settings: Any) -> ThreadServer:
        db = tmp_path / f"h{len(started)}.db"
        server = ThreadServer(make_app(db, **settings), sse_heartbeat_s=sse_heartbeat_s)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(serve_app: Callable[..., ThreadServer]) -> ThreadServer:
    return serve_app()
