"""Take the console's screenshot, docs/console.png: ``.venv/bin/python tests/console/screenshot.py``

It runs what the browser tests run (a ``hearth serve`` process, headless Chromium): a conversation
whose tool call is cut off by a SIGKILL, then recovered by the restarted server, shown live.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "server"))
sys.path.insert(0, str(HERE))

import httpx2  # noqa: E402
from consoleharness import console_env, make_browser  # noqa: E402
from httpharness import ServerProcess  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

OUT = HERE.parents[1] / "docs" / "console.png"


def main(out: Path = OUT) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "console.db", app="consoleapp:app")
        server.env = console_env()
        server.start()
        driver = make_browser(1280, 1500)
        try:
            wait = WebDriverWait(driver, 30, poll_frequency=0.1)
            for room in ("kitchen", "attic"):
                httpx2.post(f"{server.url}/agents/chores/home", json={"message": room})
            httpx2.post(f"{server.url}/agents/holder/h-1", json={"message": "Hold the line."})
            driver.get(f"{server.url}/console/holder/h-1")
            wait.until(lambda d: "running…" in d.find_element(By.ID, "timeline").text)
            server.kill()
            server.start()
            wait.until(lambda d: "settled · completed" in d.find_element(By.ID, "timeline").text)
            wait.until(lambda d: "2/10" in d.find_element(By.ID, "submissions").text)
            wait.until(lambda d: d.find_element(By.ID, "live-state").text == "live")
            driver.save_screenshot(str(out))
        finally:
            driver.quit()
            server.kill()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
