"""Helpers for the fault tests: real ``hearth serve`` processes under a failing disk (an
``LD_PRELOAD`` shim), a power cut (a FUSE file system that forgets unsynced writes) and wall-clock
jumps (libfaketime). A missing part skips a test here and fails it in CI (``CI=true``)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

HERE = Path(__file__).resolve().parent
APPS = HERE.parent / "apps"
sys.path.insert(0, str(HERE.parent / "server"))  # httpharness

FAST_LEASES = {"HEARTH_LEASE_S": "2", "HEARTH_HEARTBEAT_S": "0.5", "HEARTH_SCAN_S": "0.5"}


def missing(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI needs it: ./run installs the Debian packages the tests use)")
    pytest.skip(reason)


def on_store(url: str, fn: Callable[[Any], Any]) -> Any:
    """Run ``await fn(store)`` on a freshly opened store at ``url`` (the server must be gone:
    a SQLite file belongs to one process)."""
    from hearth.store import open_store

    async def main() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def acks(path: Path) -> list[list[str]]:
    """The ``what|conversation|tool_call_id|detail`` lines ``faultapp`` wrote to ``path``."""
    text = path.read_text() if path.exists() else ""
    return [line.split("|") for line in text.splitlines() if line]


def serve(db: Path, log: Path, **env: str) -> Any:
    """A ``ServerProcess`` (not started) of ``hearth serve faultapp:app`` on the SQLite file
    ``db``, with ``env`` added to its environment."""
    from httpharness import ServerProcess

    server = ServerProcess(db, app="faultapp:app", env=env, log=log)
    server.env["PYTHONPATH"] = os.pathsep.join([str(APPS), server.env["PYTHONPATH"]])
    return server
