"""``hearth.Client`` and ``hearth.AsyncClient`` against a real server (docs/http.md)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable

import pytest
from httpharness import ThreadServer, wait_until

import hearth
from hearth.client import HTTPError, Unauthorized
from hearth.receipts import Receipt


def test_send_and_read_a_reply(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        receipt = conv.send("hello")
        assert receipt.conversation_id == "echo/c-1" and receipt.offset == 0
        reply = conv.read(receipt, timeout=10)
        assert reply.text == "echo: hello"
        assert reply.submission_id == receipt.submission_id


def test_read_works_from_a_receipt_kept_as_plain_data(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        kept = client.conversation("echo", "c-1").send("hello").to_json()
    with hearth.Client(server.url) as other:
        reply = other.conversation("echo", "c-1").read(Receipt.from_json(kept), timeout=10)
        assert reply.text == "echo: hello"
        by_id = other.conversation("echo", "c-1").read(kept["submission_id"], timeout=10)
        assert by_id == reply


def test_idempotent_send_and_conflict(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        first = conv.send("hi", idempotency_key="k")
        again = conv.send("hi", idempotency_key="k")
        assert again.deduplicated and again.submission_id == first.submission_id
        with pytest.raises(hearth.IdempotencyConflict):
            conv.send("other", idempotency_key="k")


def test_typed_errors(serve_app: Callable[..., ThreadServer]) -> None:
    server = serve_app(token="t0k")
    with hearth.Client(server.url, token="t0k") as client:
        with pytest.raises(hearth.UnknownAgent):
            client.conversation("nobody", "c-1").send("hi")
        with pytest.raises(hearth.InvalidId):
            client.conversation("echo", "bad id").send("hi")
        with pytest.raises(hearth.ConversationNotFound):
            client.conversation("echo", "never").snapshot()
        with pytest.raises(hearth.SubmissionNotFound):
            client.conversation("echo", "c-1").send("x")
            client.conversation("echo", "c-1").read("s_missing", timeout=5)
        with pytest.raises(ValueError):
            receipt = client.conversation("echo", "c-1").send("x")
            client.conversation("echo", "c-2").read(receipt)
    with hearth.Client(server.url) as anonymous:
        with pytest.raises(Unauthorized) as caught:
            anonymous.conversation("echo", "c-1").send("hi")
        assert isinstance(caught.value, HTTPError) and caught.value.status == 401


def test_read_raises_for_aborted_and_times_out(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        conv = client.conversation("staller", "c-1")
        receipt = conv.send("hi")
        with pytest.raises(TimeoutError):
            conv.read(receipt, timeout=0.3)
        result = conv.abort()
        assert result.aborted and result.submission_ids == [receipt.submission_id]
        with pytest.raises(hearth.SubmissionAborted):
            conv.read(receipt, timeout=10)


@pytest.mark.parametrize("timeout", [float("inf"), 1e12])
def test_an_infinite_or_huge_read_timeout_is_no_timeout(
    server: ThreadServer, timeout: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's cut-off timer could not wait that long: OverflowError in its thread."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    with hearth.Client(server.url) as client:
        conv = client.conversation("staller", "c-1")
        receipt = conv.send("hi")

        def abort_once_followed() -> None:
            wait_until(lambda: server.asgi.sse_streams == 1)
            conv.abort()

        aborter = threading.Thread(target=abort_once_followed)
        aborter.start()
        with pytest.raises(hearth.SubmissionAborted):
            conv.read(receipt, timeout=timeout)
        aborter.join(10)
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.join(10)
    assert raised == []


@pytest.mark.parametrize("timeout", [-5.0, float("nan")])
@pytest.mark.anyio
async def test_a_negative_or_nan_read_timeout_is_refused(
    server: ThreadServer, timeout: float
) -> None:
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
            conv.read(conv.send("hi"), timeout=timeout)
    async with hearth.AsyncClient(server.url) as aclient:
        aconv = aclient.conversation("echo", "c-2")
        with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
            await aconv.read(await aconv.send("hi"), timeout=timeout)


@pytest.mark.parametrize(
    ("timeout", "heartbeat"),
    [(0.5, 10.0), (2.0, 1.5)],
    ids=["heartbeat-much-longer", "heartbeat-just-shorter"],
)
def test_read_timeout_is_exact_whatever_the_heartbeat(
    serve_app: Callable[..., ThreadServer], timeout: float, heartbeat: float
) -> None:
    server = serve_app(sse_heartbeat_s=heartbeat)
    with hearth.Client(server.url) as client:
        conv = client.conversation("staller", "c-1")
        receipt = conv.send("hi")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            conv.read(receipt, timeout=timeout)
        took = time.monotonic() - started
    # A heartbeat must neither extend the wait nor be needed to end it.
    assert timeout - 0.05 <= took < timeout + heartbeat / 2


@pytest.mark.anyio
async def test_async_read_timeout_is_exact_too(serve_app: Callable[..., ThreadServer]) -> None:
    server = serve_app(sse_heartbeat_s=1.5)
    async with hearth.AsyncClient(server.url) as client:
        conv = client.conversation("staller", "c-1")
        receipt = await conv.send("hi")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await conv.read(receipt, timeout=2.0)
        took = time.monotonic() - started
    assert 2.0 - 0.05 <= took < 2.0 + 1.5 / 2


def test_signal_history_snapshot_and_stream(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        conv.read(conv.send("one"), timeout=10)
        receipt = conv.signal("note", "fyi", {"k": "v"})
        conv.read(receipt, timeout=10)
        records = conv.history()
        assert [r["offset"] for r in records] == list(range(len(records)))
        assert any(r["type"] == "signal" and r["signal_type"] == "note" for r in records)
        assert conv.history(offset=records[-2]["offset"]) == records[-1:]
        assert conv.snapshot()["offset"] == records[-1]["offset"]
        streamed = list(itertools.islice(conv.stream(offset=1), len(records) - 2))
        assert streamed == records[2:]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_record_holding_a_unicode_line_separator_is_read_and_streamed(
    server: ThreadServer, separator: str
) -> None:
    """JSON leaves these unescaped inside strings; the SDK's lines also ended at them (as
    ``str.splitlines`` does), so read, stream and ``hearth tail`` raised on the cut record,
    every time."""
    text = f"line{separator}separator"
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        assert conv.read(conv.send(text), timeout=10).text == f"echo: {text}"
        records = conv.history()
        streamed = list(itertools.islice(conv.stream(), len(records)))
        assert streamed == records


@pytest.mark.parametrize("id", [".", ".."])
def test_dot_ids_reach_the_server_as_ids_not_as_path_steps(server: ThreadServer, id: str) -> None:
    """A client drops a ``.`` segment and goes up for ``..``: the calls reached other routes
    (the snapshot of a conversation named "stream"; a stream that reconnected for ever)."""
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", id)
        for call in (
            lambda: conv.send("hi"),
            conv.history,
            conv.snapshot,
            lambda: next(conv.stream()),
        ):
            with pytest.raises(hearth.InvalidId):
                call()


def test_channel_and_delivery_names_cannot_reach_other_routes(server: ThreadServer) -> None:
    """They went into the path as given: a delivery id of ``../../../admin/gc?dry_run=1#``
    replayed nothing and ran the attachments' garbage collection instead."""
    with hearth.Client(server.url) as client:
        with pytest.raises(HTTPError) as replayed:
            client.replay("x", "../../../admin/gc?dry_run=1#")
        with pytest.raises(HTTPError) as listed:
            client.deliveries("../admin/submissions#")
    assert replayed.value.status == listed.value.status == 404


@pytest.mark.anyio
async def test_async_client_has_the_same_methods(server: ThreadServer) -> None:
    async with hearth.AsyncClient(server.url) as client:
        conv = client.conversation("echo", "c-1")
        receipt = await conv.send("hello")
        reply = await conv.read(receipt, timeout=10)
        assert reply.text == "echo: hello"
        records = await conv.history()
        seen = []
        async for record in conv.stream(-1):
            seen.append(record)
            if len(seen) == len(records):
                break
        assert seen == records
        assert (await conv.snapshot())["conversation_id"] == "echo/c-1"
        staller = client.conversation("staller", "c-1")
        stuck = await staller.send("hi")
        with pytest.raises(TimeoutError):
            await staller.read(stuck, timeout=0.3)
        assert (await staller.abort()).aborted
        with pytest.raises(hearth.SubmissionAborted):
            await staller.read(stuck, timeout=10)
        with pytest.raises(hearth.UnknownAgent) as unknown:
            await client.conversation("nobody", "c-1").send("hi")
        # As every error of the client (they were missing on the typed ones).
        assert (unknown.value.status, unknown.value.type) == (404, "unknown_agent")  # type: ignore[attr-defined]
        assert "nobody" in unknown.value.message  # type: ignore[attr-defined]
        assert unknown.value.details is None or isinstance(unknown.value.details, dict)  # type: ignore[attr-defined]
        assert (await client.health()) == {"status": "ok"}


@pytest.mark.parametrize("answer", ["redirect", "html", "list"])
def test_a_url_that_is_not_hearths_server_is_one_clear_error(answer: str) -> None:
    """A redirect (http to https), a page of HTML or JSON of another shape came out of the SDK
    and the CLI as JSONDecodeError, KeyError or TypeError tracebacks."""
    import http.server
    import threading

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if answer == "redirect":
                self.send_response(301)
                self.send_header("Location", "https://example.invalid/")
                self.end_headers()
                return
            body = b"<html>a login page</html>" if answer == "html" else b"[1, 2]"
            self.send_response(200)
            self.send_header(
                "Content-Type", "text/html" if answer == "html" else "application/json"
            )
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with hearth.Client(f"http://127.0.0.1:{server.server_address[1]}") as client:
            with pytest.raises(HTTPError) as caught:
                client.waits()
        assert caught.value.type == "not_hearth"
    finally:
        server.shutdown()


@pytest.mark.anyio
async def test_more_than_a_hundred_pending_reads_leave_the_clients_other_calls_working(
    server: ThreadServer,
) -> None:
    """Each pending read holds a connection; with httpx's default cap of 100 on one client, the
    101st call of any kind (a send, the resolve the reads were waiting for) waited for the pool
    and failed with PoolTimeout."""
    async with hearth.AsyncClient(server.url, timeout=10) as client:
        convs = [client.conversation("staller", f"p{i}") for i in range(105)]
        receipts = [await conv.send("hi") for conv in convs]
        reads = [asyncio.create_task(c.read(r)) for c, r in zip(convs, receipts, strict=True)]
        try:
            async with asyncio.timeout(20):  # (the 101st never got a connection)
                while server.asgi.sse_streams < len(reads):
                    await asyncio.sleep(0.05)
            async with asyncio.timeout(10):
                assert (await client.conversation("echo", "more").send("hi")).submission_id
                assert (await convs[0].abort()).aborted
            with pytest.raises(hearth.SubmissionAborted):
                await reads[0]
        finally:
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)


@pytest.mark.anyio
async def test_an_async_read_timeout_holds_against_a_server_that_trickles_its_answer(
    server: ThreadServer,
) -> None:
    """httpx's timeouts are per read: an answer trickling in a few bytes at a time held
    ``read(timeout=1.5)`` for 9 s, as its first ask had no deadline of its own as a whole."""
    receipt = hearth.Client(server.url).conversation("staller", "c-1").send("hi")
    host, port = server.url.removeprefix("http://").split(":")

    async def trickle(client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        upstream, to_server = await asyncio.open_connection(host, int(port))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, slow: bool) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(7 if slow else 65536):
                    dst.write(data)
                    await dst.drain()
                    if slow:
                        await asyncio.sleep(0.2)

        await asyncio.gather(pump(client, to_server, False), pump(upstream, to_client, True))

    proxy = await asyncio.start_server(trickle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
    try:
        async with hearth.AsyncClient(url) as client:
            reading = asyncio.create_task(
                client.conversation("staller", "c-1").read(receipt, timeout=1.5)
            )
            done, _ = await asyncio.wait({reading}, timeout=6)
            assert done, "the read ran past its timeout"
            with pytest.raises(TimeoutError):
                reading.result()
    finally:
        proxy.close()
        await hearth.AsyncClient(server.url).conversation("staller", "c-1").abort()
