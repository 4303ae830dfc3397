"""GET .../stream: JSON pages, and SSE that resumes, tails live, beats and closes cleanly."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpharness import ThreadServer, sse_records, wait_until

from hearth.server import tail

SSE = {"accept": "text/event-stream"}


def settle(http: httpx2.Client, agent: str, id: str, message: str = "hi") -> str:
    sid = http.post(f"/agents/{agent}/{id}", json={"message": message}).json()["submission_id"]
    sub = http.get(f"/agents/{agent}/{id}/submissions/{sid}", params={"wait": 10}).json()
    assert sub["outcome"] == "completed"
    return str(sid)


def test_json_pages_follow_the_offset_convention(server: ThreadServer) -> None:
    with server.client() as http:
        settle(http, "echo", "c-1")
        everything = http.get("/agents/echo/c-1/stream").json()
        offsets = [r["offset"] for r in everything["records"]]
        assert offsets == list(range(len(offsets)))
        assert everything["up_to_date"] is True
        assert everything["next_offset"] == offsets[-1]
        page = http.get("/agents/echo/c-1/stream", params={"offset": 0, "limit": 2}).json()
        assert [r["offset"] for r in page["records"]] == [1, 2]
        assert page["next_offset"] == 2 and page["up_to_date"] is False
        past = http.get("/agents/echo/c-1/stream", params={"offset": 999}).json()
        assert past == {"records": [], "next_offset": 999, "up_to_date": True}
        for bad in ("x", "-2", "1e3", str(2**70)):
            assert http.get("/agents/echo/c-1/stream", params={"offset": bad}).status_code == 400


def test_pages_and_sse_of_large_records_come_in_bounded_reads_and_miss_nothing(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a byte budget of 100 kB per read (4 MB in production) and records of 30 kB: a page
    stops after the record that reaches it (``up_to_date`` false, whatever its limit), the
    pages that follow carry on from it, and an SSE stream catching up from the start reads the
    store in bounded batches too, sending every record once, in order."""
    monkeypatch.setattr(tail, "PAGE_BYTES", 100_000)
    monkeypatch.setattr(tail, "CATCH_UP_BYTES", 100_000)
    with server.client() as http:
        for n in range(6):  # each: the message and its echo, ~60 kB
            settle(http, "echo", "c-big", f"{n}" + "x" * 30_000)
        reads: list[int] = []
        store = server.asgi._runtime.store
        read_page = store.read_page

        async def counted(*args: Any) -> Any:
            records, more = await read_page(*args)
            reads.append(len(records))
            return records, more

        store.read_page = counted
        first = http.get("/agents/echo/c-big/stream")
        page = first.json()
        assert page["up_to_date"] is False and len(first.content) < 200_000
        offsets = [r["offset"] for r in page["records"]]
        while not page["up_to_date"]:
            page = http.get(
                "/agents/echo/c-big/stream", params={"offset": page["next_offset"]}
            ).json()
            offsets += [r["offset"] for r in page["records"]]
        assert offsets == list(range(len(offsets))) and len(offsets) > 12
        assert 1 < max(reads) <= 6  # 4 records of ~30 kB reach 100 kB
        reads.clear()
        seen: list[int] = []
        with http.stream("GET", "/agents/echo/c-big/stream", headers=SSE) as response:
            for _, record in sse_records(response):
                seen.append(record["offset"])
                if record["offset"] == offsets[-1]:
                    break
        assert seen == offsets
        assert len(reads) > 2 and max(reads) <= 6


def test_json_page_long_polls_for_the_next_record(server: ThreadServer) -> None:
    with server.client() as http:
        settle(http, "echo", "c-1")
        last = http.get("/agents/echo/c-1/stream").json()["next_offset"]
        threading.Timer(
            0.3, lambda: server.client().post("/agents/echo/c-1", json={"message": "again"})
        ).start()
        started = time.monotonic()
        page = http.get("/agents/echo/c-1/stream", params={"offset": last, "wait": 5}).json()
        assert page["records"] and page["records"][0]["offset"] == last + 1
        assert time.monotonic() - started < 4  # woken by the append, well before the 5 s wait


def test_sse_sends_every_record_with_its_offset_as_id_and_tails_live(server: ThreadServer) -> None:
    with server.client() as http:
        http.post("/agents/streamer/c-1", json={"message": "hi"})
        seen: list[tuple[str | None, dict[str, Any]]] = []
        with http.stream("GET", "/agents/streamer/c-1/stream", headers=SSE) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for event_id, record in sse_records(response):
                seen.append((event_id, record))
                if record["type"] == "submission_settled":
                    break
        assert [int(i or -1) for i, _ in seen] == [r["offset"] for _, r in seen]
        assert [r["offset"] for _, r in seen] == list(range(len(seen)))
        assert sum(r["type"] == "assistant_text_delta" for _, r in seen) >= 2


def test_sse_resumes_after_last_event_id(server: ThreadServer) -> None:
    with server.client() as http:
        settle(http, "echo", "c-1")
        headers = {**SSE, "last-event-id": "2"}
        with http.stream("GET", "/agents/echo/c-1/stream?offset=0", headers=headers) as response:
            first_id, first = next(iter(sse_records(response)))
        assert first_id == "3" and first["offset"] == 3
        with http.stream("GET", "/agents/echo/c-1/stream?offset=1", headers=SSE) as response:
            first_id, _ = next(iter(sse_records(response)))
        assert first_id == "2"
        bad = http.get("/agents/echo/c-1/stream", headers={**SSE, "last-event-id": "x"})
        assert bad.status_code == 400


def test_sse_sends_heartbeat_comments_while_idle(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(sse_heartbeat_s=0.2)
    with server.client() as http:
        settle(http, "echo", "c-1")
        last = http.get("/agents/echo/c-1/stream").json()["next_offset"]
        started = time.monotonic()
        with http.stream("GET", f"/agents/echo/c-1/stream?offset={last}", headers=SSE) as response:
            for line in response.iter_lines():
                if line.startswith(":"):
                    break
        assert time.monotonic() - started < 2


def test_sse_streams_end_cleanly_when_the_server_shuts_down(server: ThreadServer) -> None:
    with server.client() as http:
        settle(http, "echo", "c-1")
        records: list[dict[str, Any]] = []
        ended = threading.Event()

        def follow() -> None:
            with http.stream("GET", "/agents/echo/c-1/stream", headers=SSE) as response:
                for _, record in sse_records(response):  # raises if the stream breaks
                    records.append(record)
            ended.set()

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.3)
        started = time.monotonic()
        server.stop()
        reader.join(5)
        assert ended.is_set(), "the SSE response did not end cleanly"
        assert time.monotonic() - started < 5
        assert records[-1]["type"] == "submission_settled"


@pytest.fixture
def wordy(tmp_path: Path) -> Iterator[ThreadServer]:
    """A server whose agent answers 2 MB to every message."""
    import hearth
    from hearth.testing import ScriptedModel, reply

    @hearth.agent
    def talker(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/wordy")
        return "talk"

    model = ScriptedModel("wordy", lambda request: reply("y" * 2_000_000), context_window=10**9)
    app = hearth.App([talker], db=str(tmp_path / "w.db"), providers=[model], port=0)
    server = ThreadServer(app).start()
    yield server
    server.stop()


def stalled_follower(server: ThreadServer) -> Any:
    """A socket following a conversation of about 20 MB over SSE that never reads: the
    server's writes to it soon wait for good."""
    import socket

    with server.client() as http:
        for i in range(4):
            settle(http, "talker", "big", str(i))
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /agents/talker/big/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"
    )
    wait_until(lambda: server.asgi.sse_streams == 1, timeout=10)
    return sock


def test_a_stream_whose_client_stopped_reading_ends_at_once_when_the_server_shuts_down(
    wordy: ThreadServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Its write waited for the client, and never saw the shutdown: every graceful exit took
    four fifths of HEARTH_SHUTDOWN_S (24 s), then logged the cancelled write's traceback."""
    sock = stalled_follower(wordy)
    try:
        time.sleep(1)  # (its writes wait for the client by now)
        started = time.monotonic()
        wordy.stop()
        assert time.monotonic() - started < 10
    finally:
        sock.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_stream_write_its_client_does_not_take_in_time_ends_the_stream(
    wordy: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that stopped reading held its stream, and one of HEARTH_MAX_STREAMS, for good."""
    monkeypatch.setattr(tail.ConversationStream, "write_timeout_s", 1.0, raising=False)
    sock = stalled_follower(wordy)
    try:
        wait_until(lambda: wordy.asgi.sse_streams == 0, timeout=15)
    finally:
        sock.close()


def test_sse_for_an_unknown_conversation_is_404_json(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.get("/agents/echo/nobody/stream", headers=SSE)
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "conversation_not_found"


def test_a_long_poll_whose_client_hung_up_ends_at_once(server: ThreadServer) -> None:
    """It went on waiting (and, on a shared store, reading once a second) for the rest of its
    ``wait``, up to 5 minutes, holding its tasks: a client retrying with a shorter timeout of
    its own piled them up."""
    import socket

    with server.client() as http:
        sid = settle(http, "echo", "c-1")
        last = http.get("/agents/echo/c-1/stream").json()["next_offset"]
        queued = http.post("/agents/staller/c-2", json={"message": "hang"}).json()
    events = server.asgi._runtime.store.events
    port = int(server.url.rsplit(":", 1)[1])
    for path in (
        f"/agents/echo/c-1/stream?offset={last}&wait=60",
        f"/agents/staller/c-2/submissions/{queued['submission_id']}?wait=60",
    ):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            wait_until(lambda: bool(events._appended or events._settled), timeout=5)
        # The client is gone: its poll stops waiting.
        wait_until(lambda: not events._appended and not events._settled, timeout=5)
    assert sid


def test_a_stream_writes_in_pieces_a_slow_client_is_waited_for() -> None:
    """4 MB in one write: the server buffered all of it for a client that had stopped reading
    (5.6 MB held per stalled client, where 1 MiB was documented)."""
    import asyncio

    sizes: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        sizes.append(len(message["body"]))

    asyncio.run(tail._write(send, b"x" * (4 << 20)))
    assert sum(sizes) == 4 << 20 and max(sizes) == tail.WRITE_PIECE == 64 << 10
    assert tail.CATCH_UP_BYTES <= 1 << 20


def test_a_record_the_store_cannot_read_is_a_500_for_the_stream_too(server: ThreadServer) -> None:
    """A page answered 500 ``corrupt_data``, but the event stream answered 200 and ended with no
    record: the SDK and ``hearth tail`` took the end for a dropped connection and reconnected
    for good, saying nothing."""
    with server.client() as http:
        settle(http, "echo", "c-1")
        server.damage_record("echo/c-1", 2)
        for headers in (SSE, {}):
            r = http.get("/agents/echo/c-1/stream", params={"offset": 1}, headers=headers)
            assert r.status_code == 500, (headers, r.text)
            assert r.json()["error"]["type"] == "corrupt_data"
        before = http.get("/agents/echo/c-1/stream", params={"limit": 2}).json()
        assert [r["offset"] for r in before["records"]] == [0, 1]  # what can be read still is
