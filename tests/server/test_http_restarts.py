"""A real ``hearth serve`` child process, SIGKILLed or SIGTERMed under open streams and readers."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess, sse_records, wait_until

import hearth
from hearth.store import open_store
from hearth.store.base import Submission

pytestmark = pytest.mark.crash
SSE = {"accept": "text/event-stream"}


def history(url: str, conversation: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = httpx2.get(f"{url}/agents/{conversation}/stream").json()[
        "records"
    ]
    return records


def stored_submission(db: Path, sid: str) -> Submission:
    async def read() -> Submission:
        store = open_store(str(db))
        await store.open()
        try:
            sub = await store.get_submission(sid)
            assert sub is not None
            return sub
        finally:
            await store.close()

    return asyncio.run(read())


def test_sse_resumes_across_a_sigkill_with_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db").start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            http.post("/agents/streamer/c-1", json={"message": "hi"})
            seen: list[int] = []
            with pytest.raises(httpx2.TransportError):
                with http.stream("GET", "/agents/streamer/c-1/stream", headers=SSE) as response:
                    for event_id, record in sse_records(response):
                        assert int(event_id or -1) == record["offset"]
                        seen.append(record["offset"])
                        if record["type"] == "assistant_text_delta" and len(seen) > 6:
                            server.kill()
            killed_after = seen[-1]
            server.start()
            headers = {**SSE, "last-event-id": str(killed_after)}
            with http.stream("GET", "/agents/streamer/c-1/stream", headers=headers) as response:
                for event_id, record in sse_records(response):
                    assert int(event_id or -1) == record["offset"]
                    seen.append(record["offset"])
                    if record["type"] == "submission_settled":
                        break
        offsets = [r["offset"] for r in history(server.url, "streamer/c-1")]
        assert seen == offsets == list(range(len(offsets)))
    finally:
        server.kill()


def test_sdk_read_survives_the_server_restarting_underneath_it(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db", env={"HEARTH_TEST_SLOW_S": "1.5"}).start()
    try:
        client = hearth.Client(server.url)
        conv = client.conversation("worker", "job-1")
        receipt = conv.send("run it")
        result: dict[str, Any] = {}

        def read() -> None:
            try:
                result["reply"] = (
                    hearth.Client(server.url)
                    .conversation("worker", "job-1")
                    .read(receipt, timeout=60)
                )
            except BaseException as exc:
                result["error"] = exc

        reader = threading.Thread(target=read)
        reader.start()
        wait_until(
            lambda: any(r["type"] == "tool_step_settled" for r in conv.history()), timeout=15
        )
        server.kill()
        time.sleep(0.5)
        assert reader.is_alive()
        server.start()
        reader.join(30)
        assert "error" not in result, result
        reply = result["reply"]
        assert reply.text == "job done" and reply.submission_id == receipt.submission_id
        settled = [r for r in conv.history() if r["type"] == "submission_settled"]
        assert len(settled) == 1
        client.close()
    finally:
        server.kill()


def test_sigterm_with_open_sse_streams_exits_in_time_and_releases_the_work(
    tmp_path: Path,
) -> None:
    db = tmp_path / "h.db"
    env = {"HEARTH_TEST_SLOW_S": "3", "HEARTH_SHUTDOWN_S": "5"}
    server = ServerProcess(db, env=env).start()
    try:
        conv = hearth.Client(server.url).conversation("worker", "job-1")
        receipt = conv.send("run it")
        seen: list[list[dict[str, Any]]] = [[], [], []]
        ended_cleanly: list[int] = []

        def follow(n: int) -> None:
            with httpx2.Client(base_url=server.url, timeout=30) as http:
                with http.stream("GET", "/agents/worker/job-1/stream", headers=SSE) as response:
                    for _, record in sse_records(response):  # raises if the stream breaks
                        seen[n].append(record)
            ended_cleanly.append(n)

        readers = [threading.Thread(target=follow, args=(n,)) for n in range(3)]
        for reader in readers:
            reader.start()
        wait_until(
            lambda: all(any(r["type"] == "tool_step_settled" for r in s) for s in seen),
            timeout=15,
        )
        started = time.monotonic()
        server.terminate()
        code = server.wait(timeout=10)
        took = time.monotonic() - started
        for reader in readers:
            reader.join(5)
        assert code == 0
        assert took < 5
        assert sorted(ended_cleanly) == [0, 1, 2]
        sub = stored_submission(db, receipt.submission_id)
        assert sub.outcome is None and sub.status == "running"
        assert sub.lease_expires_at == 0  # released: the next owner takes it at once
        server.start()
        again = hearth.Client(server.url).conversation("worker", "job-1")
        assert again.read(receipt, timeout=30).text == "job done"
        assert again.submission(receipt.submission_id)["attempt"] == 2
    finally:
        server.kill()


def call_under_way(server: ServerProcess, agent: str, id: str, message: str) -> hearth.Receipt:
    """Send ``message`` and return once its tool call is under way."""
    conv = hearth.Client(server.url).conversation(agent, id)
    receipt = conv.send(message)
    wait_until(lambda: any(r["type"] == "assistant_tool_call" for r in conv.history()), timeout=15)
    time.sleep(0.2)  # the call has started
    return receipt


def test_sigterm_while_a_sync_tool_blocks_still_exits_within_the_shutdown_time(
    tmp_path: Path,
) -> None:
    """The watchdog was stopped once the server had stopped, and the interpreter then waited
    for the tool's worker thread: the process lived on for as long as the tool blocked (60 s
    here) past a ``HEARTH_SHUTDOWN_S`` of 2. (Then it ended at the watchdog, with 1; since sync
    tools run on daemon threads of their own, the stop gives the work back and ends cleanly.)"""
    db = tmp_path / "h.db"
    server = ServerProcess(db, app="syncapp:app", env={"HEARTH_SHUTDOWN_S": "2"}).start()
    try:
        receipt = call_under_way(server, "blocker", "b-1", "block")
        server.terminate()
        code = server.wait(timeout=30)  # (the tool blocks for 60 s)
        assert code == 0, server.log.read_text()
        assert "graceful shutdown took over" not in server.log.read_text()
        sub = stored_submission(db, receipt.submission_id)
        assert sub.outcome is None and sub.releases == 1  # given back for the next process
    finally:
        server.kill()


def test_sigterm_gives_back_work_whose_cleanup_outlasts_the_shutdown_time(tmp_path: Path) -> None:
    """The watchdog ended the process at ``HEARTH_SHUTDOWN_S``, the moment the coordinator was
    to cancel the late work and release it: the lease stayed held, and the attempt counted
    (the next server failed the submission ``retry_exhausted`` under ``max_attempts=1``)."""
    db = tmp_path / "h.db"
    server = ServerProcess(db, app="cleanupapp:app", env={"HEARTH_SHUTDOWN_S": "3"}).start()
    try:
        receipt = call_under_way(server, "shop", "o-1", "buy")
        server.terminate()
        assert server.wait(timeout=30) == 0  # (the tool's cleanup takes 30 s)
        assert "Traceback" not in server.log.read_text()
        sub = stored_submission(db, receipt.submission_id)
        assert sub.outcome is None and sub.lease_expires_at == 0  # released
        assert sub.releases == 1
        server.start()
        again = hearth.Client(server.url).conversation("shop", "o-1")
        assert again.read(receipt, timeout=30).text == "done"
    finally:
        server.kill()


def test_a_cleanup_shorter_than_four_fifths_of_the_shutdown_time_runs_to_its_end(
    tmp_path: Path,
) -> None:
    """Late work was cut at two fifths of ``HEARTH_SHUTDOWN_S`` (4 s of 10), not four: a 5 s
    clean-up on cancellation was cut short."""
    db, log = tmp_path / "h.db", tmp_path / "tool.log"
    env = {"HEARTH_SHUTDOWN_S": "10", "HEARTH_TEST_CLEANUP_S": "5", "HEARTH_TEST_LOG": str(log)}
    server = ServerProcess(db, app="cleanupapp:app", env=env).start()
    try:
        receipt = call_under_way(server, "shop", "o-1", "buy")
        server.terminate()
        assert server.wait(timeout=30) == 0
        assert log.exists() and log.read_text() == "cleaned up\n"
        sub = stored_submission(db, receipt.submission_id)
        assert sub.outcome is None and sub.releases == 1
    finally:
        server.kill()


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
@pytest.mark.parametrize("after", [0.3, 1.0], ids=["at-0.3s", "at-1s"])
def test_a_second_ctrl_c_while_a_sync_tool_blocks_exits_at_once(
    tmp_path: Path, first: signal.Signals, after: float
) -> None:
    """The interrupt cancelled the watchdog on its way out, and the interpreter's exit then
    waited for the tool's worker thread: the process lived on for as long as the tool blocked
    (60 s here) past a ``HEARTH_SHUTDOWN_S`` of 3. Sent while the server still stopped, it only
    skipped the end of the lifespan (a traceback) and the process waited for the watchdog."""
    db = tmp_path / "h.db"
    server = ServerProcess(db, app="syncapp:app", env={"HEARTH_SHUTDOWN_S": "10"}).start()
    try:
        call_under_way(server, "blocker", "b-1", "block")

        # A request the server waits for as it stops (its grace is 8 s): until then, a second
        # Ctrl-C only made it skip the end of the lifespan (a traceback) and wait on.
        def deliver() -> None:
            try:
                httpx2.post(f"{server.url}/channels/slow", json={"id": "d-1"}, timeout=30)
            except httpx2.HTTPError:
                pass  # the process is gone before it answers

        threading.Thread(target=deliver, daemon=True).start()
        time.sleep(0.3)
        assert server.proc is not None
        server.proc.send_signal(first)
        time.sleep(after)  # the runtime is stopping; the tool's thread holds the process
        started = time.monotonic()
        server.proc.send_signal(signal.SIGINT)  # Ctrl-C again
        assert server.wait(timeout=30) == 130  # at once, not at the watchdog (1)
        assert time.monotonic() - started < 5  # (the watchdog: 10 s after the first)
        text = server.log.read_text()
        assert "hearth: interrupted; exiting now" in text and "Traceback" not in text
    finally:
        server.kill()


def test_sigterm_while_a_body_is_arriving_answers_503_and_exits_at_once(tmp_path: Path) -> None:
    """The read of the body waited until the server's grace ran out and was cancelled: the
    client got a bare 500 (not JSON), the log a traceback, and the shutdown waited for it."""
    server = ServerProcess(tmp_path / "h.db", env={"HEARTH_SHUTDOWN_S": "10"}).start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /agents/echo/b-1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 40\r\n\r\n{"message":'  # the rest of the body is still on its way
        )
        time.sleep(0.5)
        started = time.monotonic()
        server.terminate()
        assert server.wait(timeout=15) == 0
        took = time.monotonic() - started
        answer = sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
    assert json.loads(body)["error"]["type"] == "shutting_down"
    assert took < 5
    assert "Traceback" not in server.log.read_text()


def test_a_request_still_running_when_the_grace_ends_is_answered_503_shutting_down(
    tmp_path: Path,
) -> None:
    """uvicorn cancels what still runs when its share of ``HEARTH_SHUTDOWN_S`` ends: the sender
    got a bare plain-text 500 and the log a traceback, where a shutdown answers 503."""
    server = ServerProcess(
        tmp_path / "h.db", app="slowrouteapp:app", env={"HEARTH_SHUTDOWN_S": "2"}
    ).start()
    answer: list[httpx2.Response] = []

    def deliver() -> None:
        answer.append(httpx2.post(f"{server.url}/channels/hook", json={"id": "d-1"}, timeout=30))

    sender = threading.Thread(target=deliver)
    sender.start()
    try:
        time.sleep(0.5)  # its routing is under way (it takes 30 s)
        server.terminate()
        assert server.wait(timeout=15) == 0
        sender.join(10)
    finally:
        server.kill()
    (response,) = answer
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "shutting_down"
    assert "Traceback" not in server.log.read_text()
