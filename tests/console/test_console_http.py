"""The conversation list route and the console's session cookie, over plain HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from httpharness import ThreadServer, make_app, wait_until

import hearth
import hearth.errors
from hearth.server.session import COOKIE, make_session, session_valid

TOKEN = "list-secret-token-91c2"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    started = ThreadServer(make_app(tmp_path / "h.db")).start()
    yield started
    started.stop()


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[ThreadServer]:
    started = ThreadServer(make_app(tmp_path / "g.db", token=TOKEN)).start()
    yield started
    started.stop()


def error_field(r: httpx2.Response) -> str:
    body = r.json()
    assert set(body) == {"error"} and body["error"]["type"] == "invalid_request"
    return str(body["error"]["details"]["field"])


def conversations(http: httpx2.Client, **params: object) -> dict[str, object]:
    r = http.get("/conversations", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# --- GET /conversations ----------------------------------------------------------------------


def test_the_list_pages_through_every_conversation_newest_first(server: ThreadServer) -> None:
    with server.client() as http:
        for n in range(7):
            assert http.post(f"/agents/echo/c-{n}", json={"message": "hi"}).status_code == 202
        wait_until(lambda: all(c["unsettled"] == 0 for c in conversations(http)["conversations"]))
        seen, after, pages = [], None, 0
        while True:
            page = conversations(http, limit=3, **({"after": after} if after else {}))
            pages += 1
            seen += page["conversations"]
            after = page["next"]
            if after is None:
                break
        assert pages == 3 and len(seen) == 7
        assert len({c["conversation_id"] for c in seen}) == 7
        times = [c["last_activity"] for c in seen]
        assert times == sorted(times, reverse=True)
        first = seen[0]
        assert set(first) >= {"agent", "id", "conversation_id", "last_activity", "unsettled"}
        assert first["conversation_id"] == f"echo/{first['id']}" and first["agent"] == "echo"


def test_the_list_filters_by_agent_and_status(server: ThreadServer) -> None:
    with server.client() as http:
        http.post("/agents/echo/done", json={"message": "hi"})
        http.post("/agents/staller/stuck", json={"message": "hi"})  # never settles
        wait_until(
            lambda: (
                [c["id"] for c in conversations(http, status="idle")["conversations"]] == ["done"]
            )
        )
        active = conversations(http, status="active")["conversations"]
        assert [(c["id"], c["unsettled"]) for c in active] == [("stuck", 1)]
        assert [c["id"] for c in conversations(http, agent="staller")["conversations"]] == ["stuck"]
        assert conversations(http, agent="echo", status="active")["conversations"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("agent=nobody", "agent"),
        ("status=settled", "status"),
        ("after=not-a-cursor", "after"),
        ("after=WzEsMl0", "after"),  # a JSON list of the wrong shape
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=ten", "limit"),
    ],
)
def test_bad_list_parameters_are_400_with_the_error_envelope(
    server: ThreadServer, query: str, field: str
) -> None:
    with server.client() as http:
        r = http.get(f"/conversations?{query}")
        assert r.status_code == 400
        assert error_field(r) == field


@pytest.mark.parametrize("after", ["9e90~echo/x", "-9e90~echo/x", "1e17~echo/x", "0~echo/x"])
def test_a_cursor_at_any_time_its_shape_allows_pages_without_an_error(
    server: ThreadServer, after: str
) -> None:
    """The list's index holds activity to the 10 seconds as a 64-bit integer; a cursor's time
    of any size the cursor's shape allows still reads a page (found by the fuzzer: 9e90)."""
    with server.client() as http:
        http.post("/agents/echo/c-1", json={"message": "hi"})
        page = conversations(http, after=after)
    ids = [c["conversation_id"] for c in page["conversations"]]  # type: ignore[union-attr]
    assert ids == (["echo/c-1"] if after[0] in "91" else [])


def test_the_sdk_pages_through_the_list(server: ThreadServer) -> None:
    with hearth.Client(server.url) as client:
        for n in range(3):
            conv = client.conversation("echo", f"s-{n}")
            conv.read(conv.send("hi"), timeout=10)  # settled: no activity moves it meanwhile
        first = client.conversations("echo", limit=2)
        rest = client.conversations("echo", after=first["next"], limit=2)
        assert len(first["conversations"]) == 2 and rest["next"] is None
        ids = {c["id"] for c in first["conversations"] + rest["conversations"]}
        assert ids == {"s-0", "s-1", "s-2"}
        with pytest.raises(hearth.errors.HearthError, match="status"):
            client.conversations(status="nonsense")


def test_the_openapi_description_has_the_list_and_the_console(server: ThreadServer) -> None:
    with server.client() as http:
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/conversations", "/", "/console/{agent}/{id}", "/console/session"} <= set(paths)


def test_the_console_pages_render(server: ThreadServer) -> None:
    with server.client() as http:
        http.post("/agents/echo/c-1", json={"message": "hi"})
        home = http.get("/")
        assert home.status_code == 200 and "text/html" in home.headers["content-type"]
        assert 'data-conversation="echo/c-1"' in home.text
        assert http.get("/?status=nonsense").status_code == 400
        one = http.get("/console/echo/c-1")
        assert one.status_code == 200 and 'data-agent="echo"' in one.text
        assert http.get("/console/echo/never").status_code == 404
        assert http.get("/console/nobody/c-1").status_code == 404
        assert http.get("/console/static/console.js").status_code == 200
        assert http.get("/console/static/secrets.txt").status_code == 404


# --- requests from web pages of other origins ------------------------------------------------


def test_without_a_token_a_page_of_another_origin_cannot_admit_or_abort(
    server: ThreadServer,
) -> None:
    """A form POST needs no CORS preflight: any page the operator opened made the browser
    admit messages (multipart) and abort conversations on a server without a token."""
    evil = {"origin": "http://localhost:1"}
    with server.client() as http:
        form = http.post("/agents/echo/c-1", files={"message": (None, "hi")}, headers=evil)
        assert form.status_code == 403 and form.json()["error"]["type"] == "forbidden"
        assert "Origin" in form.json()["error"]["message"]
        plain = {**evil, "content-type": "text/plain"}
        assert http.post("/agents/echo/c-1", content="x=y", headers=plain).status_code == 403
        assert http.post("/agents/echo/c-1/abort", headers=evil).status_code == 403
        assert http.post("/agents/echo/c-1/abort", headers={"origin": "null"}).status_code == 403
        basic = {**evil, "authorization": "Basic YTpi"}  # a browser may send this by itself
        assert http.post("/agents/echo/c-1/abort", headers=basic).status_code == 403
        assert http.get("/agents/echo/c-1").status_code == 404  # nothing was admitted
        assert http.get("/conversations", headers=evil).status_code == 200  # reads are not refused


def test_without_a_token_the_console_and_clients_without_origin_still_change_things(
    server: ThreadServer,
) -> None:
    with server.client() as http:
        own = {"origin": server.url}
        r = http.post("/agents/echo/c-1", files={"message": (None, "hi")}, headers=own)
        assert r.status_code == 202
        assert http.post("/agents/echo/c-2", json={"message": "hi"}).status_code == 202


def test_a_bearer_token_is_not_refused_for_its_origin(guarded: ThreadServer) -> None:
    headers = {"authorization": f"Bearer {TOKEN}", "origin": "http://elsewhere.test"}
    with guarded.client() as http:
        r = http.post("/agents/echo/c-1", json={"message": "hi"}, headers=headers)
        assert r.status_code == 202


# --- the session cookie ----------------------------------------------------------------------


def sign_in(http: httpx2.Client, token: str, origin: str | None) -> httpx2.Response:
    headers = {"content-type": "application/x-www-form-urlencoded"}
    if origin is not None:
        headers["origin"] = origin
    return http.post("/console/session", content=f"token={token}&next=/", headers=headers)


def test_signing_in_sets_an_httponly_strict_cookie_that_the_api_accepts(
    guarded: ThreadServer,
) -> None:
    with guarded.client() as http:
        assert http.get("/conversations").status_code == 401
        page = http.get("/")
        assert page.status_code == 401 and 'id="sign-in-form"' in page.text
        r = sign_in(http, TOKEN, guarded.url)
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        assert http.get("/conversations").status_code == 200  # the client keeps the cookie
        assert http.get("/").status_code == 200
        out = http.post("/console/logout", headers={"origin": guarded.url})
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
        assert http.get("/conversations").status_code == 401


def test_a_wrong_token_sets_no_cookie(guarded: ThreadServer) -> None:
    with guarded.client() as http:
        r = sign_in(http, "wrong", guarded.url)
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert 'id="sign-in-error"' in r.text
        assert sign_in(http, TOKEN, None).status_code == 403  # no Origin: refused


def test_a_sign_in_declaring_a_body_over_its_limit_is_refused_before_it_is_sent(
    guarded: ThreadServer,
) -> None:
    """Anyone may call the route: a body it would not take is not read (it was read whole
    into memory, however large, before its size was checked)."""
    host = guarded.url.removeprefix("http://")
    address, port = host.rsplit(":", 1)
    head = (
        f"POST /console/session HTTP/1.1\r\nHost: {host}\r\nOrigin: {guarded.url}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {1 << 30}\r\n\r\n"
    )
    with socket.create_connection((address, int(port))) as conn:
        conn.settimeout(20)  # the body is never sent: only an answer before it ends the wait
        conn.sendall(head.encode() + b"token=")
        status_line = conn.recv(200).split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"


def test_a_state_change_with_the_cookie_must_come_from_the_same_origin(
    guarded: ThreadServer,
) -> None:
    with guarded.client() as http:
        sign_in(http, TOKEN, guarded.url)
        body = {"message": "hi"}
        evil = http.post("/agents/echo/c-1", json=body, headers={"origin": "http://evil.test"})
        assert evil.status_code == 403 and evil.json()["error"]["type"] == "forbidden"
        assert http.post("/agents/echo/c-1", json=body).status_code == 403  # no Origin
        assert http.post("/agents/echo/c-1/abort", headers={"origin": "null"}).status_code == 403
        assert http.get("/agents/echo/c-1").status_code == 404  # nothing was admitted
        ok = http.post("/agents/echo/c-1", json=body, headers={"origin": guarded.url})
        assert ok.status_code == 202
    with httpx2.Client(base_url=guarded.url) as bearer:  # a bearer token needs no Origin
        headers = {"authorization": f"Bearer {TOKEN}"}
        assert bearer.post("/agents/echo/c-2", json=body, headers=headers).status_code == 202


@pytest.mark.parametrize(
    "value",
    [
        make_session(TOKEN, now=0.0),  # expired long ago
        make_session("another-token"),  # signed with another server's key
        make_session(TOKEN).split(".")[0] + ".forged",
        "garbage",
    ],
    # (named: the values hold the time, and the test workers collect at different moments)
    ids=["expired", "another-key", "forged", "garbage"],
)
def test_an_expired_or_forged_cookie_is_refused(guarded: ThreadServer, value: str) -> None:
    with httpx2.Client(base_url=guarded.url, cookies={COOKIE: value}) as http:
        assert http.get("/conversations").status_code == 401


def test_a_cookie_whose_expiry_is_not_ascii_digits_is_refused(guarded: ThreadServer) -> None:
    """``²`` (one byte in Latin-1, as a server reads header bytes) is a digit to
    ``str.isdigit`` but not to ``int()``: every request with such a cookie answered 500."""
    with httpx2.Client(base_url=guarded.url) as http:
        cookie = f"{COOKIE}=\u00b2\u00b2.sig".encode("latin-1")
        assert http.get("/conversations", headers={b"cookie": cookie}).status_code == 401


def test_a_cookie_whose_signature_is_not_ascii_is_refused(guarded: ThreadServer) -> None:
    """hmac.compare_digest raises on a str with non-ASCII characters: it answered 500."""
    with httpx2.Client(base_url=guarded.url) as http:
        cookie = f"{COOKIE}=9999999999.\u00e9abc".encode("latin-1")
        assert http.get("/conversations", headers={b"cookie": cookie}).status_code == 401
    assert not session_valid(TOKEN, "9999999999.\u00e9abc")


@pytest.mark.parametrize("origin", ["http://[", "http://[::1", "https://]x["])
def test_a_malformed_origin_is_not_the_same_origin(guarded: ThreadServer, origin: str) -> None:
    """urlsplit raises on these: the sign-in, the sign-out and a cookie-borne request answered
    500 (the last outside any error handling, with a traceback in the log)."""
    with guarded.client() as http:
        assert sign_in(http, TOKEN, origin).status_code == 403
        assert http.post("/console/logout", headers={"origin": origin}).status_code == 403
        assert sign_in(http, TOKEN, guarded.url).status_code == 303
        r = http.post("/agents/echo/c-1/abort", headers={"origin": origin})
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"


def test_a_session_is_valid_until_its_expiry_for_its_token_only() -> None:
    value = make_session(TOKEN, now=1000.0, lifetime_s=60.0)
    assert session_valid(TOKEN, value, now=1059.0)
    assert not session_valid(TOKEN, value, now=1061.0)
    assert not session_valid("other", value, now=1000.0)
    expires, _, signature = value.partition(".")
    assert not session_valid(TOKEN, f"{int(expires) + 3600}.{signature}", now=1000.0)
    assert TOKEN not in value
