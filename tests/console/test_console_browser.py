"""The console in a real headless Chromium against real ``hearth serve`` processes.

Every wait is a ``WebDriverWait`` on what the page shows; nothing sleeps.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.crash
WAIT_S = 30.0
TOKEN = "console-secret-token-7f3a"


def until(driver: Any, condition: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def shown(driver: Any, css: str) -> list[Any]:
    return list(driver.find_elements(By.CSS_SELECTOR, css))


def text_of(driver: Any, css: str) -> str:
    script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)"
    return " | ".join(driver.execute_script(script, css))


def offsets_taken(driver: Any) -> list[int]:
    return list(driver.execute_script("return window.hearthConsole.offsets"))


def submission_cell(driver: Any, column: str) -> str:
    """The cell of the newest submission (the table is redrawn as it refreshes: read it in
    one script, never through element handles that go stale)."""
    return text_of(driver, f"#submissions tbody tr:first-child td.{column}")


class Unavailable:
    """A stand-in on the server's port that answers every request 503 (a proxy in front of a
    restarting server), counting the refused SSE requests."""

    def __init__(self, port: int) -> None:
        outer = self
        self.streams_refused = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0].endswith("/stream"):
                    outer.streams_refused += 1
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Unavailable:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def admit(server: ServerProcess, path: str, message: str, **headers: str) -> str:
    r = httpx2.post(f"{server.url}/agents/{path}", json={"message": message}, headers=headers)
    assert r.status_code == 202, r.text
    return str(r.json()["submission_id"])


def test_a_submission_appears_and_settles_live_without_a_reload(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    admit(server, "chores/home", "kitchen")
    page.get(f"{server.url}/console/chores/home")
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    until(page, lambda d: text_of(d, "#live-state") == "live")
    page.execute_script("window.notReloaded = true")
    second = admit(server, "chores/home", "attic")
    until(page, lambda d: "attic" in text_of(d, "li.rec-user_message"))
    until(page, lambda d: text_of(d, "li.rec-submission_settled").count("completed") == 2)
    timeline = text_of(page, "#timeline li")
    assert "tool call · tidy" in timeline and "step · sweep" in timeline
    assert "Done: the attic is tidy." in timeline
    assert "hook seam · on_agent_start" in timeline and "state · visits" in timeline
    assert text_of(page, "li.rec-tool_outcome .duration").endswith(" ms")
    until(page, lambda d: second in text_of(d, "#submissions td.id"))
    row = f'#submissions tr[data-submission="{second}"]'
    until(page, lambda d: text_of(d, f"{row} td.status") == "settled")
    assert text_of(page, f"{row} td.attempt") == "1/10"
    assert page.execute_script("return window.notReloaded") is True
    taken = offsets_taken(page)
    assert taken == list(range(taken[0], taken[-1] + 1)) and taken[0] == 0
    # The list page shows the conversation, and the link leads back here.
    page.get(f"{server.url}/")
    link = page.find_element(By.CSS_SELECTOR, 'tr[data-conversation="chores/home"] a')
    assert link.text == "home"


def test_a_page_opened_before_its_conversation_exists_shows_it_once_it_does(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    """It said "no records yet" for good: only a message sent from the page itself reloaded it."""
    server = console_server()
    page.get(f"{server.url}/console/chores/later")
    until(page, lambda d: text_of(d, "#live-state") == "no records yet")
    admit(server, "chores/later", "garden")  # from elsewhere
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    assert "garden" in text_of(page, "li.rec-user_message")
    assert shown(page, "#no-records") == []
    taken = offsets_taken(page)
    assert taken == list(range(taken[-1] + 1))


def test_a_child_task_links_to_the_child_conversation_and_back(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    admit(server, "boss/b-1", "get it done")
    page.get(f"{server.url}/console/boss/b-1")
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    assert "The helper says: Done: the study is tidy." in text_of(page, "li.rec-submission_settled")
    page.find_element(By.CSS_SELECTOR, "li.rec-child_conversation_linked a").click()
    # A child runs inside its parent's attempt: its answer is its last assistant message.
    until(page, lambda d: "Done: the study is tidy." in text_of(d, "li.rec.assistant"))
    assert "step · sweep" in text_of(page, "li.rec-tool_step_settled")
    assert page.current_url.startswith(f"{server.url}/console/chores/")
    assert "child task of boss/b-1" in text_of(page, "li.rec-conversation_created")
    # No send box and no abort button: a child takes no input, nor an abort (409 both); the
    # page says where to go instead.
    assert not page.find_elements(By.ID, "abort") and not page.find_elements(By.ID, "send-form")
    assert "send to its parent" in text_of(page, "#child-note")
    page.find_element(By.CSS_SELECTOR, "li.rec-conversation_created a").click()
    until(page, lambda d: d.current_url == f"{server.url}/console/boss/b-1")


def test_a_long_conversation_opens_at_its_newest_records_and_pages_backwards(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    with httpx2.Client(base_url=server.url, timeout=10) as http:
        for n in [*range(20), "the last note"]:
            text = n if isinstance(n, str) else f"note {n}"
            sid = http.post("/agents/notes/long", json={"message": text}).json()["submission_id"]
            # One at a time: a message sent while another runs would join its response.
            http.get(f"/agents/notes/long/submissions/{sid}?wait=30")
        newest = http.get("/conversations", params={"agent": "notes"}).json()
        last_offset = newest["conversations"][0]["last_offset"]
    assert last_offset > 400  # more than two pages of 200
    page.get(f"{server.url}/console/notes/long")
    until(page, lambda d: "the last note" in text_of(d, "li.rec-user_message"))

    def rendered(d: Any) -> list[int]:  # one round trip, not one per element
        script = "return [...document.querySelectorAll('li.rec')].map(e => +e.dataset.offset)"
        return list(d.execute_script(script))

    offsets = rendered(page)
    assert offsets[-1] == last_offset and offsets[0] > 0  # the newest page only
    assert "note 0" not in text_of(page, "li.rec-user_message")
    # The submissions table above the button fills in after the timeline: clicked before it
    # did, the button moved as it was clicked, and the click fell on a row of the table.
    until(page, lambda d: d.execute_script("return window.hearthConsole.refreshes") >= 1)
    pages = 0
    while page.find_element(By.ID, "earlier").is_displayed():
        before = offsets[0]
        page.find_element(By.ID, "earlier").click()
        try:
            until(page, lambda d, before=before: rendered(d)[0] < before)
        except TimeoutException:  # say what the page showed (it failed once under heavy load)
            shown_now = rendered(page)
            said = page.execute_script("return document.querySelector('.problem')?.textContent")
            raise AssertionError(
                f"no earlier page after the click: first offset {shown_now[:1]} (was {before}),"
                f" {len(shown_now)} records shown, the page said {said!r}"
            ) from None
        offsets = rendered(page)
        pages += 1
    assert pages == 2 and offsets[0] == 0
    assert offsets == sorted(set(offsets))  # in order, none twice
    assert "note 0" in text_of(page, "li.rec-user_message")
    # No attempt boundary is doubled by paging: one per submission.
    boundaries = [e.get_attribute("data-submission") for e in shown(page, "li.attempt-boundary")]
    assert len(boundaries) == len(set(boundaries)) == 21
    # A call whose outcome (a message whose end) was on a later page than its start was left
    # "running…" (streaming) for good.
    assert "running" not in text_of(page, "li.rec-assistant_tool_call .status")
    assert shown(page, "li.streaming") == []
    assert shown(page, "li.rec-assistant_text_delta") == []  # no "(continued)" part is left


def test_paging_back_over_records_larger_than_a_json_page_leaves_no_gap(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    """A JSON page ends after about 4 MB of records: "load earlier records" took the cut page
    for the whole range and went on before it, and the rest of the range was never shown."""
    server = console_server()
    with httpx2.Client(base_url=server.url, timeout=30) as http:
        for message in ["hoard", *[f"keep {n}" for n in range(60)]]:  # 4.5 MB, then 6 each
            sid = http.post("/agents/hoarder/big", json={"message": message}).json()
            http.get(f"/agents/hoarder/big/submissions/{sid['submission_id']}?wait=30")
    page.get(f"{server.url}/console/hoarder/big")
    until(page, lambda d: "keep 59" in text_of(d, "li.rec-user_message"))
    until(page, lambda d: d.execute_script("return window.hearthConsole.refreshes") >= 1)

    def rendered(d: Any) -> list[int]:
        script = "return [...document.querySelectorAll('li.rec')].map(e => +e.dataset.offset)"
        return list(d.execute_script(script))

    assert rendered(page)[0] > 20  # the big message is on an earlier page
    while page.find_element(By.ID, "earlier").is_displayed():
        before = rendered(page)[0]
        page.find_element(By.ID, "earlier").click()
        until(page, lambda d, before=before: rendered(d)[0] < before)
    shown_offsets = rendered(page)
    assert shown_offsets[0] == 0 and shown_offsets == sorted(set(shown_offsets))
    # Every message and every settlement (a text delta joins its message's entry).
    assert len(shown(page, "li.rec-user_message")) == 61
    assert len(shown(page, "li.rec-submission_settled")) == 61
    assert len(shown(page, "li.rec-tool_step_settled")) == 5
    assert "running" not in text_of(page, "li.rec-assistant_tool_call .status")


def test_an_answer_over_three_pages_is_shown_once_whole(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    """Each earlier page without the answer's start made an "(continued)" entry of its own, and
    only the last one made was taken back once the start was found: the whole answer showed
    twice."""
    server = console_server(HEARTH_TEST_EACH_DELTA="1")
    with httpx2.Client(base_url=server.url, timeout=30) as http:
        sid = http.post("/agents/rambler/r1", json={"message": "go"}).json()["submission_id"]
        http.get(f"/agents/rambler/r1/submissions/{sid}?wait=30")
        conversation = http.get("/conversations").json()["conversations"][0]
    assert conversation["last_offset"] > 400  # the answer's pieces are on three pages
    page.get(f"{server.url}/console/rambler/r1")
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    until(page, lambda d: d.execute_script("return window.hearthConsole.refreshes") >= 1)
    while page.find_element(By.ID, "earlier").is_displayed():
        before = text_of(page, "li.rec .offset").split(" | ")[0]
        page.find_element(By.ID, "earlier").click()
        until(page, lambda d, before=before: text_of(d, "li.rec .offset").split(" | ")[0] != before)
    whole = "".join(f"w{n} " for n in range(450))
    assert shown(page, "li.rec-assistant_text_delta") == []
    assert text_of(page, "li.rec-assistant_message_started .text").strip() == whole.strip()
    assert shown(page, "li.streaming") == []


def test_after_a_sigkill_and_restart_the_page_reconnects_and_shows_the_recovery(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    sid = admit(server, "holder/h-1", "hold on")
    page.get(f"{server.url}/console/holder/h-1")
    until(page, lambda d: "running…" in text_of(d, "li.rec-assistant_tool_call .status"))
    until(page, lambda d: text_of(d, "#live-state") == "live")
    page.execute_script("window.notReloaded = true")
    server.kill()
    until(page, lambda d: text_of(d, "#live-state") != "live")
    # While it restarts, a proxy in front answers 503: the browser gives up on that EventSource
    # for good, and the page must make a new one itself.
    with Unavailable(server.port) as proxy:
        until(page, lambda d: proxy.streams_refused > 0)
    server.start()  # the same port and database
    until(page, lambda d: shown(d, 'li.attempt-boundary.recovery[data-attempt="2"]'))
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    assert text_of(page, "#live-state") == "live"
    interrupted = shown(page, "li.rec-tool_outcome.interrupted.recovery")
    assert len(interrupted) == 1 and "interrupted" in interrupted[0].text
    assert shown(page, "li.rec-assistant_tool_call.interrupted")  # the call is marked too
    assert "The hold ended" in text_of(page, "li.rec-assistant_message_started")
    until(page, lambda d: submission_cell(d, "attempt") == "2/10")
    assert text_of(page, "#submissions td.attempt.recovery") == "2/10"
    assert submission_cell(page, "id") == sid
    assert page.execute_script("return window.notReloaded") is True
    taken = offsets_taken(page)
    assert taken == list(range(0, taken[-1] + 1)), "a duplicate or a gap across the restart"


def test_a_stream_cut_off_by_a_sigkill_shows_the_partial_output_and_the_advisory(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    admit(server, "talker/t-1", "tell me")
    page.get(f"{server.url}/console/talker/t-1")
    until(page, lambda d: "word3 " in text_of(d, "li.rec.assistant.streaming .text"))
    server.kill()
    server.start()
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    cut = text_of(page, 'li.rec.assistant.recovery[data-stop-reason="aborted"]')
    assert "aborted partial output" in cut and "word3 " in cut and "word59" not in cut
    assert "stream_interrupted" in text_of(page, "li.rec-signal.recovery")
    assert shown(page, 'li.attempt-boundary.recovery[data-attempt="2"]')
    taken = offsets_taken(page)
    assert taken == list(range(0, taken[-1] + 1))


def test_sending_a_message_and_aborting_from_the_page(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    page.get(f"{server.url}/console/holder/fresh")
    assert text_of(page, "#live-state") == "no records yet"
    page.find_element(By.ID, "message").send_keys("please wait")
    page.find_element(By.ID, "send").click()
    until(page, lambda d: "please wait" in text_of(d, "li.rec-user_message"))
    until(page, lambda d: "running…" in text_of(d, "li.rec-assistant_tool_call .status"))
    page.find_element(By.ID, "abort").click()
    until(page, lambda d: "abort requested" in text_of(d, "#action-result"))
    until(page, lambda d: "settled · aborted" in text_of(d, "li.rec-submission_settled"))
    until(page, lambda d: submission_cell(d, "outcome") == "aborted")
    page.find_element(By.ID, "message").send_keys("again")
    page.find_element(By.ID, "send").click()
    until(page, lambda d: "again" in text_of(d, "li.rec-user_message"))
    until(page, lambda d: "admitted s_" in text_of(d, "#action-result"))


def test_a_pending_wait_is_resolved_from_the_page(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server()
    admit(server, "approver/r-1", "refund my order")
    page.get(f"{server.url}/console/approver/r-1")
    until(page, lambda d: "refund 250?" in text_of(d, "#waits li.wait"))
    assert "approval" in text_of(page, "#waits li.wait .name")
    until(page, lambda d: submission_cell(d, "status") == "waiting")
    page.find_element(By.CSS_SELECTOR, "#waits li.wait button.resolve-button").click()
    until(page, lambda d: "give the value" in text_of(d, "#action-result"))  # nothing preset
    page.find_element(By.CSS_SELECTOR, "#waits li.wait input.value").send_keys("true")
    page.find_element(By.CSS_SELECTOR, "#waits li.wait button.resolve-button").click()
    until(page, lambda d: "Refund: refunded 250." in text_of(d, "li.rec-submission_settled"))
    until(page, lambda d: d.find_element(By.ID, "waits-section").get_attribute("hidden"))
    assert shown(page, "li.rec-wait_started") and shown(page, "li.rec-wait_resolved")
    assert submission_cell(page, "status") == "settled"
    # Waiting is no interruption: the attempt after the wait is no recovery (it was shown as
    # one, amber, "recovered after attempt 1 was cut off").
    until(page, lambda d: "resumed after its wait ended" in text_of(d, "li.attempt-boundary"))
    assert not shown(page, "li.attempt-boundary.recovery")
    assert not shown(page, "#submissions td.attempt.recovery")
    assert submission_cell(page, "attempt") == "1/10 (attempt 2)"


def refreshes(driver: Any) -> int:
    return int(driver.execute_script("return window.hearthConsole.refreshes"))


def test_what_a_person_types_into_a_wait_survives_the_pages_refreshes(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    """The waits were redrawn at every refresh (3 s): the box went back to its preset `true`,
    and a person who typed a refusal, then clicked, approved the refund."""
    server = console_server()
    admit(server, "approver/r-2", "refund my order")
    page.get(f"{server.url}/console/approver/r-2")
    until(page, lambda d: "refund 250?" in text_of(d, "#waits li.wait"))
    box = page.find_element(By.CSS_SELECTOR, "#waits li.wait input.value")
    box.send_keys('"no, ')
    seen = refreshes(page)
    until(page, lambda d: refreshes(d) >= seen + 2)  # two refreshes of the waits since
    box.send_keys('not this one"')  # the same element, still in the page
    assert box.get_attribute("value") == '"no, not this one"'
    page.find_element(By.CSS_SELECTOR, "#waits li.wait button.resolve-button").click()
    until(
        page,
        lambda d: "not refunded ('no, not this one')" in text_of(d, "li.rec-submission_settled"),
    )


def test_pages_left_for_others_free_their_streams(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    """A page left for another stayed alive in the browser's back/forward cache with its
    stream open: a browser opens six connections to a host, and the seventh page never
    loaded."""
    server = console_server()
    for n in range(8):
        admit(server, f"notes/n-{n}", f"note {n}")
    for n in range(8):
        page.get(f"{server.url}/console/notes/n-{n}")
        until(page, lambda d: d.find_element(By.ID, "live-state").text == "live", timeout=15)
    page.back()  # from the back/forward cache: it follows again
    until(page, lambda d: d.find_element(By.ID, "live-state").text == "live", timeout=15)
    assert page.current_url.endswith("/console/notes/n-6")


def test_a_webhook_submission_shows_its_channel_and_delivery(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    from consoleapp import HOOK_SECRET

    from hearth.channels import sign

    server = console_server()
    body = b'{"house": "h-9", "room": "cellar"}'
    headers = {
        "content-type": "application/json",
        "x-delivery-id": "d-42",
        "x-signature": sign(HOOK_SECRET, body),
    }
    r = httpx2.post(f"{server.url}/channels/hooks", content=body, headers=headers)
    assert r.status_code == 202, r.text
    page.get(f"{server.url}/console/chores/h-9")
    until(page, lambda d: "hooks #d-42" in submission_cell(d, "kind"))
    assert submission_cell(page, "kind").startswith("channel")


def test_sign_in_works_and_a_wrong_token_is_refused(
    console_server: Callable[..., ServerProcess], page: Any
) -> None:
    server = console_server("--token", TOKEN)
    admit(server, "chores/signed", "garage", authorization=f"Bearer {TOKEN}")
    page.get(f"{server.url}/console/chores/signed")
    page.find_element(By.ID, "token").send_keys("not-the-token")
    page.find_element(By.ID, "sign-in").click()
    until(page, lambda d: shown(d, "#sign-in-error"))
    assert page.get_cookies() == []
    page.find_element(By.ID, "token").send_keys(TOKEN)
    page.find_element(By.ID, "sign-in").click()
    # Back on the page asked for, signed in: the API and the EventSource accept the cookie.
    until(page, lambda d: "settled · completed" in text_of(d, "li.rec-submission_settled"))
    until(page, lambda d: text_of(d, "#live-state") == "live")
    assert page.current_url == f"{server.url}/console/chores/signed"
    [cookie] = page.get_cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]
    page.find_element(By.ID, "message").send_keys("cellar")
    page.find_element(By.ID, "send").click()  # a POST with the cookie passes the CSRF check
    until(page, lambda d: "cellar" in text_of(d, "li.rec-user_message"))
    page.find_element(By.ID, "sign-out").click()
    until(page, lambda d: shown(d, "#sign-in-form"))
    assert page.get_cookies() == []
    assert TOKEN not in server.log.read_text()
