"""The console shows a message's attachments: images inline (loaded through the session
cookie when a token guards the server), other files as links to ``/attachments/{sha256}``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess
from selenium.webdriver.common.by import By
from test_console_browser import TOKEN, text_of, until

pytestmark = pytest.mark.crash

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)
PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"


def test_images_show_inline_and_other_files_as_links(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server("--token", TOKEN)
    answer = httpx2.post(
        f"{server.url}/agents/chores/files",
        data={"message": "see these"},
        files=[("file", ("dot.png", PNG, "image/png")),
               ("file", ("report.pdf", PDF, "application/pdf"))],
        headers={"Authorization": f"Bearer {TOKEN}"},
    )  # fmt: skip
    assert answer.status_code == 202, answer.text
    page.get(f"{server.url}/console/chores/files")
    page.find_element(By.ID, "token").send_keys(TOKEN)
    page.find_element(By.ID, "sign-in").click()
    until(page, lambda d: "see these" in text_of(d, "li.rec-user_message .text"))
    png_sha = hashlib.sha256(PNG).hexdigest()
    image = f'li.rec-user_message .attachment[data-sha256="{png_sha}"] img'
    # The image loaded (a broken one has no natural width): the cookie reached the route.
    until(page, lambda d: d.execute_script(
        "const i = document.querySelector(arguments[0]); return i && i.complete"
        " && i.naturalWidth", image) == 1)  # fmt: skip
    link = page.find_element(
        By.CSS_SELECTOR,
        f'.attachment[data-sha256="{hashlib.sha256(PDF).hexdigest()}"] a',
    )
    assert link.text == "report.pdf"
    assert link.get_attribute("href").endswith(f"/attachments/{hashlib.sha256(PDF).hexdigest()}")
    assert link.get_attribute("download") == "report.pdf"
    assert "report.pdf · application/pdf" in text_of(page, ".attachment .file-meta")
    assert "sha256" not in text_of(page, "li.rec-user_message .text")  # no raw JSON
