"""Slow clients cannot starve the server: connections that stall mid-head or mid-body do not stop
``/healthz`` or admissions from answering, and the server lets go of them in time."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from httpharness import ThreadServer, make_app, wait_until

from hearth.server import body
from hearth.server.protocol import BoundedHeadProtocol

STALLED = 200


@pytest.fixture
def quick_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deadlines of 2 s instead of 10 s and 30 s, so the test sees them pass."""
    monkeypatch.setattr(BoundedHeadProtocol, "head_timeout_s", 2.0)
    monkeypatch.setattr(body, "BODY_TIMEOUT_S", 2.0)


@pytest.fixture
def stalled_server(tmp_path: Path, quick_deadlines: None) -> Iterator[ThreadServer]:
    server = ThreadServer(make_app(tmp_path / "h.db")).start()
    yield server
    server.stop()


def whole_response(sock: socket.socket) -> bytes:
    """One HTTP response read to its end (its head and body may arrive in separate segments)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (20 s at most)."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_stalled_heads_and_bodies_do_not_stop_health_checks_or_admissions(
    stalled_server: ThreadServer,
) -> None:
    url = stalled_server.url
    heads, bodies = [], []
    try:
        for i in range(STALLED // 2):
            sock = connect(url)
            sock.sendall(b"POST /agents/echo/slow-%d HTTP/1.1\r\nHost: x\r\nContent-Ty" % i)
            heads.append(sock)
            sock = connect(url)
            sock.sendall(
                b"POST /agents/echo/slow-b%d HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n"
                b'{"message": "' % i
            )
            bodies.append(sock)
        # While all of them hang on, the server answers everyone else.
        with httpx2.Client(base_url=url, timeout=10) as http:
            assert http.get("/healthz").status_code == 200
            r = http.post("/agents/echo/fast", json={"message": "hi"})
            assert r.status_code == 202
        # A stalled head: the connection is closed, with nothing said.
        for sock in heads:
            assert read_all(sock) == b""
        # A stalled body: 408 with the error envelope, and the connection closed.
        for sock in bodies:
            answer = read_all(sock)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
            assert b'"request_timeout"' in answer
        with httpx2.Client(base_url=url, timeout=10) as http:
            counts = http.get("/admin/submissions").json()["counts"]
            assert sum(counts.values()) == 1  # only the fast one: nothing stalled was admitted
    finally:
        for sock in heads + bodies:
            sock.close()


def test_an_idle_connection_that_never_sends_a_byte_is_closed(stalled_server: ThreadServer) -> None:
    with connect(stalled_server.url) as sock:
        assert read_all(sock) == b""


def test_a_kept_alive_connection_is_not_cut_by_the_head_deadline_of_a_past_request(
    stalled_server: ThreadServer,
) -> None:
    """The deadline is per request head: a connection idle between requests (for less than
    uvicorn's 5 s keep-alive) still serves its next request."""
    with connect(stalled_server.url) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = whole_response(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
            time.sleep(2.5)  # past the 2 s head deadline, inside the keep-alive


def test_a_request_head_past_its_size_bound_is_refused_and_its_connection_closed(
    stalled_server: ThreadServer,
) -> None:
    """An endless head (a header at a time, never the blank line) gets 431, not the memory."""
    with connect(stalled_server.url) as sock:
        pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
        # Just past the bound, in one write: the server reads all of it before it answers, so
        # its close is not a reset that could discard the answer on the way.
        count = BoundedHeadProtocol.max_head_bytes // len(pad) + 8
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad * count)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    with connect(stalled_server.url) as sock:  # and the server goes on serving
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert whole_response(sock).startswith(b"HTTP/1.1 200")


def test_a_head_under_the_size_bound_is_served(stalled_server: ThreadServer) -> None:
    with connect(stalled_server.url) as sock:
        pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad * 40 + b"\r\n")
        assert whole_response(sock).startswith(b"HTTP/1.1 200")


def test_a_pipelined_head_split_across_reads_is_not_counted_with_what_came_before(
    stalled_server: ThreadServer,
) -> None:
    """A read that carried 68 KB of small pipelined requests and ended inside the next head
    counted all of it as that head: 431, ahead of the answers still owed."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    count = BoundedHeadProtocol.max_head_bytes // len(request) + 100
    with connect(stalled_server.url) as sock:
        sock.sendall(request * count + last[:20])
        time.sleep(0.3)  # (the server has read the first part and waits for the rest)
        sock.sendall(last[20:])
        answers = read_all(sock)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)
    assert len(statuses) == count + 1 and set(statuses) == {b"200"}, set(statuses)


def test_a_head_too_large_after_a_pipelined_post_is_answered_after_it(
    stalled_server: ThreadServer,
) -> None:
    """The 431 went out before the answer to the POST pipelined ahead of it, which was
    admitted all the same: its client read 431 for a message that was accepted."""
    body = b'{"message": "hi"}'
    post = (
        b"POST /agents/echo/p-1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    count = BoundedHeadProtocol.max_head_bytes // len(pad) + 8
    with connect(stalled_server.url) as sock:
        sock.sendall(post + b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad * count)
        answers = read_all(sock)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)
    assert statuses == [b"202", b"431"], answers[:300]
    with httpx2.Client(base_url=stalled_server.url, timeout=10) as http:
        assert len(http.get("/agents/echo/p-1").json()["submissions"]) == 1


def test_streams_pipelined_on_a_connection_that_closes_give_back_their_slots(
    tmp_path: Path,
) -> None:
    """uvicorn told only the newest request of a connection that its client went away: a
    stream requested before it, on the same connection, wrote into the closed connection for
    ever, and with HEARTH_MAX_STREAMS streams held so, every new follower got a 503."""
    server = ThreadServer(make_app(tmp_path / "h.db", max_streams=3)).start()
    try:
        httpx2.post(f"{server.url}/agents/echo/e-1", json={"message": "go"}, timeout=10)
        get = (
            b"GET /agents/echo/e-1/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"
        )
        for _ in range(3):
            with connect(server.url) as sock:
                sock.sendall(get + get)
                assert sock.recv(200).startswith(b"HTTP/1.1 200")

        def streams() -> int:
            text = httpx2.get(f"{server.url}/metrics", timeout=10).text
            gauge = next(x for x in text.splitlines() if x.startswith("hearth_sse_streams "))
            return int(gauge.split()[1])

        wait_until(lambda: streams() == 0, timeout=10)
        with connect(server.url) as sock:
            sock.sendall(get)
            assert sock.recv(200).startswith(b"HTTP/1.1 200")  # not 503 too_many_streams
    finally:
        server.stop()
