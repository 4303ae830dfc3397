"""Headless Chromium driven by Selenium, for the console's tests and its screenshot."""

from __future__ import annotations

import shutil
from typing import Any

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
