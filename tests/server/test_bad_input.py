"""Bad input cannot hurt the server: every refusal is a 4xx with the error envelope, never a 5xx or
a traceback, and a refused request admits nothing."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from httpharness import ThreadServer, sse_records, wait_until

JSON = {"content-type": "application/json"}
SSE = {"accept": "text/event-stream"}


def refused(response: httpx2.Response, status: int = 400) -> str:
    """The error type of a refusal, after checking its shape."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "details"}
    assert "Traceback" not in response.text
    return str(body["error"]["type"])


def admitted_count(http: httpx2.Client) -> int:
    return sum(http.get("/admin/submissions").json()["counts"].values())


@pytest.mark.parametrize(
    "raw_id",
    [
        "abc%0A",  # the newline a $-anchored match let through
        "abc%0D%0A",
        "abc%E2%80%A8",  # U+2028 LINE SEPARATOR
        "a%00b",
        "%2E%2E",  # ".." (a client would resolve a literal one away)
        "%2E",
        "..a",
        "a%2Fb",
        "a%2fb",
        "x" * 129,
        "%20abc",
    ],
)
def test_a_bad_id_is_400_with_the_envelope_and_admits_nothing(
    server: ThreadServer, raw_id: str
) -> None:
    with server.client() as http:
        r = http.post(f"/agents/echo/{raw_id}", content=b'{"message": "hi"}', headers=JSON)
        assert refused(r) == "invalid_id"
        for method, suffix in [("GET", ""), ("GET", "/stream"), ("POST", "/abort")]:
            r = http.request(method, f"/agents/echo/{raw_id}{suffix}")
            assert refused(r) == "invalid_id", (method, suffix)
        assert admitted_count(http) == 0


def test_the_longest_id_is_admitted_and_one_more_character_is_not(server: ThreadServer) -> None:
    with server.client() as http:
        assert http.post("/agents/echo/" + "x" * 128, json={"message": "hi"}).status_code == 202
        assert refused(http.post("/agents/echo/" + "x" * 129, json={"message": "hi"})) == (
            "invalid_id"
        )
        assert admitted_count(http) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,  # deeper than any parser's recursion
        b'{"message": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
        b'{"message": "caf\xe9"}',  # latin-1, not UTF-8
        b'{"message": "\xff\xfe"}',
        b"\xef\xbb\xbf",  # a lone byte-order mark
        b'{"message": "hi"',
        b'{"message": NaN}',
        b'{"message": 1e999}',
        b"",
        # an unpaired surrogate: valid JSON syntax, but no UTF-8 text (no store) can hold it
        b'{"message": "half an emoji \\ud83d"}',
        b'{"message": "\\udc00 alone"}',
        b'{"message": "ok", "idempotency_key": "k\\uDFFF"}',
        b'{"signal": {"type": "t", "attributes": {"a": ["\\ud800"]}}}',
        # parsed, but too deep to encode again later: admitted, it made every read of the
        # conversation, and the admin view of all submissions, answer 500
        b'{"signal": {"type": "t", "attributes": {"a": ' + b"[" * 962 + b"]" * 962 + b"}}}",
        b'{"signal": {"type": "t", "attributes": {"a": ' + b"[" * 300 + b"]" * 300 + b"}}}",
    ],
)
def test_unparseable_bodies_are_400_and_admit_nothing(server: ThreadServer, body: bytes) -> None:
    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=body, headers=JSON)
        assert refused(r) in ("invalid_json", "invalid_request")
        assert admitted_count(http) == 0


def test_nesting_up_to_the_limit_is_admitted_and_read_back(server: ThreadServer) -> None:
    nested = b"[" * 250 + b"]" * 250
    body = b'{"signal": {"type": "t", "attributes": {"a": ' + nested + b"}}}"
    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=body, headers=JSON)
        assert r.status_code == 202, r.text
        assert http.get("/agents/echo/c-1/stream?offset=-1").status_code == 200
        assert http.get("/admin/submissions").status_code == 200


def test_a_surrogate_pair_escaped_in_json_is_one_character_and_admitted(
    server: ThreadServer,
) -> None:
    with server.client() as http:
        body = b'{"message": "a pair \\ud83d\\ude00 is one emoji"}'
        r = http.post("/agents/echo/c-1", content=body, headers=JSON)
        assert r.status_code == 202
        # The user message, as the conversation's snapshot shows it: one character, U+1F600.
        assert "a pair \U0001f600 is one emoji" in http.get("/agents/echo/c-1").text


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/stream", {"offset": "-2"}),
        ("/stream", {"offset": "abc"}),
        ("/stream", {"offset": str(2**62 + 1)}),
        ("/stream", {"offset": "9" * 5000}),
        ("/stream", {"limit": "0"}),
        ("/stream", {"limit": "1001"}),
        ("/stream", {"wait": "-1"}),
        ("/stream", {"wait": "nan"}),
        ("/stream", {"wait": "1e9"}),
        ("/stream", {"wait": "301"}),
        ("/submissions/SID", {"wait": "inf"}),
        ("/submissions/SID", {"wait": "300.5"}),
    ],
)
def test_query_parameters_out_of_range_are_400(
    server: ThreadServer, path: str, params: dict[str, str]
) -> None:
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hi"}).json()["submission_id"]
        r = http.get(f"/agents/echo/c-1{path.replace('SID', sid)}", params=params)
        assert refused(r) == "invalid_request"
        assert r.json()["error"]["details"] == {"field": next(iter(params))}


def test_last_event_id_that_is_not_an_offset_is_400(server: ThreadServer) -> None:
    with server.client() as http:
        http.post("/agents/echo/c-1", json={"message": "hi"})
        r = http.get("/agents/echo/c-1/stream", headers={**SSE, "last-event-id": "x"})
        assert refused(r) == "invalid_request"


# --- HEARTH_MAX_BODY -------------------------------------------------------------------------


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send a request by hand (a declared length the body never reaches) and read the answer
    until the server closes the connection or 10 s pass."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        return answer


def test_a_body_declared_over_the_limit_is_refused_before_it_is_sent(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_body=1024)
    head = (
        b"POST /agents/echo/c-1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 104857600\r\n\r\n"
    )
    answer = raw_request(server.url, head, b'{"message": "')  # 100 MiB declared, 13 bytes sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"payload_too_large"' in answer
    with server.client() as http:
        assert admitted_count(http) == 0


def test_a_chunked_body_over_the_limit_is_413_and_admits_nothing(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_body=1024)

    def chunks() -> Any:
        yield b'{"message": "'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}'

    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=chunks(), headers=JSON)
        assert refused(r, 413) == "payload_too_large"
        assert r.json()["error"]["details"] == {"max_body": 1024}
        assert admitted_count(http) == 0


# --- HEARTH_MAX_STREAMS ----------------------------------------------------------------------


def test_streams_past_max_streams_get_a_clear_503_and_a_freed_slot_is_reused(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_streams=2, sse_heartbeat_s=0.2)
    with server.client() as http, server.client() as a, server.client() as b:
        http.post("/agents/echo/c-1", json={"message": "hi"})
        with a.stream("GET", "/agents/echo/c-1/stream", headers=SSE) as first:
            assert first.status_code == 200
            events_a = sse_records(first)  # kept: dropping the reader would close the stream
            next(events_a)
            with b.stream("GET", "/agents/echo/c-1/stream", headers=SSE) as second:
                assert second.status_code == 200
                events_b = sse_records(second)
                next(events_b)
                assert server.asgi.sse_streams == 2
                third = http.get("/agents/echo/c-1/stream", headers=SSE)
                assert refused(third, 503) == "too_many_streams"
                assert "HEARTH_MAX_STREAMS" in third.json()["error"]["message"]
                assert third.headers["retry-after"]
                # JSON pages are not streams: still served.
                assert http.get("/agents/echo/c-1/stream").status_code == 200
        # Both streams closed by their clients: their slots come back.
        wait_until(lambda: server.asgi.sse_streams == 0, timeout=10)
        with a.stream("GET", "/agents/echo/c-1/stream", headers=SSE) as again:
            assert again.status_code == 200


def test_max_streams_comes_from_the_environment_and_must_be_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hearth.config import Settings
    from hearth.errors import ConfigurationError

    assert Settings.resolve(env={}).max_streams == 2000
    assert Settings.resolve(env={"HEARTH_MAX_STREAMS": "7"}).max_streams == 7
    assert Settings.resolve(env={"HEARTH_MAX_STREAMS": "7"}, max_streams=9).max_streams == 9
    with pytest.raises(ConfigurationError):
        Settings.resolve(env={"HEARTH_MAX_STREAMS": "0"})


# --- 405 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/agents/echo/c-1", {"GET", "HEAD", "POST"}),
        ("DELETE", "/agents/echo/c-1/stream", {"GET", "HEAD"}),
        ("GET", "/agents/echo/c-1/abort", {"POST"}),
        ("POST", "/healthz", {"GET", "HEAD"}),
        ("PATCH", "/metrics", {"GET", "HEAD"}),
    ],
)
def test_405_names_every_allowed_method(
    server: ThreadServer, method: str, path: str, allow: set[str]
) -> None:
    with server.client() as http:
        r = http.request(method, path)
        assert refused(r, 405) == "method_not_allowed"
        assert {m.strip() for m in r.headers["allow"].split(",")} == allow


@pytest.mark.parametrize(
    "query", ["limit=5&limit=7", "offset=1&offset=", "wait=0&wait=1", "offset=", "limit=", "wait="]
)
def test_a_query_parameter_given_twice_or_empty_is_400(server: ThreadServer, query: str) -> None:
    with server.client() as http:
        http.post("/agents/echo/c-1", json={"message": "hi"})
        assert refused(http.get(f"/agents/echo/c-1/stream?{query}")) == "invalid_request"


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/admin/gc?dry_run=1&dry_run=0"),
        ("POST", "/admin/gc?dry_run=yes"),
        ("GET", "/admin/submissions?conversation=echo/a&conversation=echo/b"),
        ("GET", "/admin/submissions?conversation=echo"),  # (was empty tables: no such form)
        ("GET", "/admin/submissions?conversation=echo/a%20b"),
        ("GET", "/channels/mail/deliveries?limit=1&limit=2"),
        ("GET", "/channels/mail/deliveries?status=failed&status=admitted"),
        ("GET", "/channels/mail/deliveries?full=yes"),
        ("GET", "/channels/mail/deliveries?limit=%D9%A3"),
    ],
)
def test_every_route_reads_its_query_parameters_alike(
    server: ThreadServer, method: str, target: str
) -> None:
    """These routes took the last of a repeated parameter (a garbage collection asked for a dry
    run and ran for real) and read a flag other than 1 or true as no."""
    with server.client() as http:
        assert refused(http.request(method, target)) == "invalid_request"


@pytest.mark.parametrize(
    "query",
    [
        "offset=1_0",
        "offset=%2B5",
        "offset=%207%20",
        "offset=%D9%A3",
        "limit=%EF%BC%90%EF%BC%92",
        "wait=1_0",
        "wait=%2B1",
        "wait=1%20",
        "wait=%EF%BC%91",
        "wait=%D9%A1",
    ],
)
def test_a_number_that_is_not_plain_ascii_digits_is_400(server: ThreadServer, query: str) -> None:
    """``int()`` read these (``1_0`` as 10, ``+5``, `` 7 ``, an Arabic-Indic 3, full-width 02),
    and ``float()`` the same as a wait: a parameter that is not a number must be refused, not
    guessed at."""
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hi"}).json()["submission_id"]
        assert refused(http.get(f"/agents/echo/c-1/stream?{query}")) == "invalid_request"
        if query.startswith("wait="):
            answer = http.get(f"/agents/echo/c-1/submissions/{sid}?{query}")
            assert refused(answer) == "invalid_request"
        assert (
            refused(http.get("/agents/echo/c-1/stream", headers={"last-event-id": "2_0"}))
            == "invalid_request"
        )


@pytest.mark.parametrize("wait", ["0", "0.5", "2.", ".25", "1e-05", "3E0"])
def test_a_wait_in_plain_decimal_or_with_an_exponent_is_taken(
    server: ThreadServer, wait: str
) -> None:
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hi"}).json()["submission_id"]
        answer = http.get(f"/agents/echo/c-1/submissions/{sid}?wait={wait}")
        assert answer.status_code == 200, answer.text


def test_a_compressed_body_is_415_saying_so(server: ThreadServer) -> None:
    """It was read as sent and refused as bad JSON: "'utf-8' codec can't decode byte 0x8b"."""
    body = gzip.compress(b'{"message": "hi"}')
    with server.client() as http:
        r = http.post(
            "/agents/echo/c-1", content=body, headers={**JSON, "content-encoding": "gzip"}
        )
        assert refused(r, 415) == "unsupported_media_type" and "gzip" in r.text
        assert admitted_count(http) == 0
