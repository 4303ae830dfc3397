"""What the console's tests and its screenshot share: the server's environment, and headless
Chromium driven by Selenium."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

CHROMIUM = "/usr/bin/chromium"


def missing_browser() -> str | None:
    """Why no browser can be started here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    if shutil.which("chromedriver") is None or not shutil.which(CHROMIUM):
        return "Debian's chromium and chromium-driver are not installed"
    return None


def make_browser(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium; as root (CI) it needs ``--no-sandbox``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    return driver


def console_env(**extra: str) -> dict[str, str]:
    """The environment of a ``hearth serve consoleapp:app`` child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    paths = [str(HERE), str(HERE.parent / "server"), str(SRC), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env
