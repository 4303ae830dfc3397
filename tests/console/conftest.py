"""The console's tests: real ``hearth serve`` processes and a real headless Chromium.

Chromium and its driver are Debian's ``chromium`` and ``chromium-driver`` (``./run`` installs
them). In CI (``CI=true``) a missing browser fails the run; elsewhere those tests skip.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "server"))
sys.path.insert(0, str(HERE))

from consoleharness import console_env, make_browser, missing_browser  # noqa: E402
from httpharness import ServerProcess, free_port  # noqa: E402


@pytest.fixture
def console_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``console_server(*args, **env)``: a started ``hearth serve consoleapp:app``."""
    started: list[ServerProcess] = []

    def start(*args: str, **env: str) -> ServerProcess:
        server = ServerProcess(
            tmp_path / f"console{len(started)}.db",
            free_port(),
            app="consoleapp:app",
            args=args,
        )
        server.env = console_env(**env)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = missing_browser()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI needs it: ./run installs Debian's chromium-driver)")
        pytest.skip(reason)
    driver = make_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """The module's browser, with no cookies left from an earlier test."""
    browser.delete_all_cookies()
    yield browser
    browser.delete_all_cookies()
