"""Every route of the HTTP API and its status codes, against a real uvicorn server."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from httpharness import ThreadServer, wait_until

from hearth.store.rows import OPEN

JSON = {"content-type": "application/json"}


def error_type(response) -> str:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "details"}
    return str(body["error"]["type"])


# --- POST /agents/{agent}/{id} ---------------------------------------------------------------


def test_post_admits_and_answers_202_with_location(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.post("/agents/echo/c-1", json={"message": "hi"})
        assert r.status_code == 202
        body = r.json()
        assert body["submission_id"].startswith("s_")
        assert body["offset"] == 0  # conversation_created is at 0; the outcome comes after it
        assert body["deduplicated"] is False
        assert body["stream_url"] == "/agents/echo/c-1/stream?offset=0"
        assert r.headers["location"] == body["stream_url"]


def test_post_signal_is_admitted(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.post(
            "/agents/echo/c-1",
            json={"signal": {"type": "note", "body": "fyi", "attributes": {"k": 1}}},
        )
        assert r.status_code == 202


def test_same_idempotency_key_and_payload_returns_the_first_receipt(server: ThreadServer) -> None:
    with server.client() as http:
        body = {"message": "hi", "idempotency_key": "k-1"}
        first = http.post("/agents/echo/c-1", json=body).json()
        again = http.post("/agents/echo/c-1", json=body)
        assert again.status_code == 202
        assert again.json()["submission_id"] == first["submission_id"]
        assert again.json()["deduplicated"] is True


def test_same_idempotency_key_with_another_payload_is_409(server: ThreadServer) -> None:
    with server.client() as http:
        http.post("/agents/echo/c-1", json={"message": "hi", "idempotency_key": "k-1"})
        r = http.post("/agents/echo/c-1", json={"message": "bye", "idempotency_key": "k-1"})
        assert r.status_code == 409
        assert error_type(r) == "idempotency_conflict"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/agents/nobody/c-1"),
        ("GET", "/agents/nobody/c-1"),
        ("GET", "/agents/nobody/c-1/stream"),
        ("GET", "/agents/nobody/c-1/submissions/s_1"),
        ("POST", "/agents/nobody/c-1/abort"),
    ],
)
def test_unknown_agent_is_404_on_every_agents_route(
    server: ThreadServer, method: str, path: str
) -> None:
    with server.client() as http:
        r = http.request(method, path, json={"message": "hi"})
        assert r.status_code == 404
        assert error_type(r) == "unknown_agent"


@pytest.mark.parametrize("bad_id", ["-starts-with-dash", "has%20space", "x" * 129, "semi;colon"])
def test_bad_conversation_id_is_400(server: ThreadServer, bad_id: str) -> None:
    with server.client() as http:
        r = http.post(f"/agents/echo/{bad_id}", json={"message": "hi"})
        assert r.status_code == 400
        assert error_type(r) == "invalid_id"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b'{"message": NaN}', "invalid_json"),
        (b"[1, 2]", "invalid_request"),
        (b"{}", "invalid_request"),
        (b'{"text": "hi"}', "invalid_request"),
        (b'{"message": ""}', "invalid_request"),
        (b'{"message": 7}', "invalid_request"),
        (b'{"message": "hi", "signal": {"type": "x"}}', "invalid_request"),
        (b'{"signal": {"body": "no type"}}', "invalid_request"),
        (b'{"signal": {"type": "x", "attributes": []}}', "invalid_request"),
        (b'{"message": "hi", "idempotency_key": 7}', "invalid_request"),
    ],
)
def test_bad_body_is_400(server: ThreadServer, raw: bytes, kind: str) -> None:
    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=raw, headers=JSON)
        assert r.status_code == 400
        assert error_type(r) == kind


def test_idempotency_key_over_256_characters_is_400(server: ThreadServer) -> None:
    with server.client() as http:
        ok = http.post("/agents/echo/c-1", json={"message": "hi", "idempotency_key": "k" * 256})
        assert ok.status_code == 202
        r = http.post("/agents/echo/c-1", json={"message": "hi", "idempotency_key": "k" * 257})
        assert r.status_code == 400
        assert r.json()["error"]["details"] == {"field": "idempotency_key"}


def test_an_idempotency_key_with_a_nul_is_400_not_a_store_error(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.post("/agents/echo/c-1", json={"message": "hi", "idempotency_key": "k\u0000x"})
        assert r.status_code == 400
        assert r.json()["error"]["details"] == {"field": "idempotency_key"}
        assert "NUL" in r.json()["error"]["message"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_non_json_content_type_is_415(server: ThreadServer, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=b'{"message": "hi"}', headers=headers)
        assert r.status_code == 415
        assert error_type(r) == "unsupported_media_type"


def test_json_with_charset_is_accepted(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.post(
            "/agents/echo/c-1",
            content=b'{"message": "hi"}',
            headers={"content-type": "application/json; charset=utf-8"},
        )
        assert r.status_code == 202


def test_body_over_max_body_is_413(serve_app: Callable[..., ThreadServer]) -> None:
    server = serve_app(max_body=1000)
    with server.client() as http:
        body = {"message": "x" * 990}
        assert http.post("/agents/echo/c-1", json={"message": "x" * 900}).status_code == 202
        r = http.post("/agents/echo/c-1", json=body)
        assert r.status_code == 413
        assert error_type(r) == "payload_too_large"


def test_413_is_enforced_while_reading_a_body_of_unknown_length(
    serve_app: Callable[..., ThreadServer],
) -> None:
    server = serve_app(max_body=1000)

    def chunks() -> Iterator[bytes]:
        yield b'{"message": "'
        for _ in range(50):
            yield b"x" * 100
        yield b'"}'

    with server.client() as http:
        r = http.post("/agents/echo/c-1", content=chunks(), headers=JSON)
        assert "content-length" not in r.request.headers
        assert r.status_code == 413


def test_post_while_shutting_down_is_503(server: ThreadServer) -> None:
    with server.client() as http:
        assert http.post("/agents/echo/c-1", json={"message": "hi"}).status_code == 202
        server.call(server.asgi.begin_shutdown)
        time.sleep(0.1)
        r = http.post("/agents/echo/c-1", json={"message": "again"})
        assert r.status_code == 503
        assert error_type(r) == "shutting_down"
        assert r.headers["retry-after"] == "1"


# --- the bearer token ------------------------------------------------------------------------


def test_token_guards_every_route_but_healthz(serve_app: Callable[..., ThreadServer]) -> None:
    server = serve_app(token="s3cret")
    with server.client() as http:
        for method, path in [
            ("POST", "/agents/echo/c-1"),
            ("GET", "/agents/echo/c-1"),
            ("GET", "/agents/echo/c-1/stream"),
            ("POST", "/agents/echo/c-1/abort"),
            ("GET", "/metrics"),
            ("GET", "/openapi.json"),
            ("GET", "/admin/submissions"),
            ("GET", "/conversations"),
            ("GET", "/no/such/route"),
        ]:
            r = http.request(method, path, json={"message": "hi"})
            assert r.status_code == 401, (method, path)
            assert error_type(r) == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        console = http.get("/")  # a person's page: the sign-in form, not the JSON envelope
        assert console.status_code == 401 and 'id="sign-in-form"' in console.text
        wrong = http.get("/metrics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        # A token sent but wrong is told apart from none (both said "a token is required").
        assert "is not this server's" in wrong.json()["error"]["message"]
        none = http.get("/metrics").json()["error"]["message"]
        assert none.startswith("a bearer token is required")
        assert http.get("/healthz").status_code == 200
        good = {"authorization": "Bearer s3cret"}
        assert (
            http.post("/agents/echo/c-1", json={"message": "hi"}, headers=good).status_code == 202
        )
        assert http.get("/metrics", headers=good).status_code == 200


# --- GET snapshot, submissions, abort --------------------------------------------------------


def test_snapshot_is_404_before_the_first_message(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.get("/agents/echo/c-1")
        assert r.status_code == 404
        assert error_type(r) == "conversation_not_found"
        assert http.get("/agents/echo/c-1/stream").status_code == 404


def test_snapshot_shows_messages_and_submissions(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hello"}).json()["submission_id"]
        sub = http.get(f"/agents/echo/c-1/submissions/{sid}", params={"wait": 5}).json()
        assert sub["status"] == "settled" and sub["outcome"] == "completed"
        assert sub["reply"] == "echo: hello"
        snap = http.get("/agents/echo/c-1").json()
        assert snap["conversation_id"] == "echo/c-1"
        assert [m["role"] for m in snap["messages"]] == ["user", "assistant"]
        assert snap["messages"][1]["text"] == "echo: hello"
        assert snap["messages"][1]["in_progress"] is False
        assert snap["submissions"][0]["id"] == sid
        assert snap["submissions"][0]["outcome"] == "completed"
        last = http.get("/agents/echo/c-1/stream").json()["records"][-1]
        assert snap["offset"] == last["offset"]


def test_a_snapshot_is_folded_and_encoded_off_the_event_loop(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long conversation's took over a second on the event loop: every other request of
    the process waited for it."""
    import threading

    from hearth.server import routes

    threads: list[str] = []
    fold = routes.snapshot

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return fold(*args)

    monkeypatch.setattr(routes, "snapshot", recorded)
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hello"}).json()["submission_id"]
        http.get(f"/agents/echo/c-1/submissions/{sid}", params={"wait": 5})
        assert http.get("/agents/echo/c-1").json()["messages"][1]["text"] == "echo: hello"
    assert threads and threads[0] != server.thread.name


def test_a_snapshot_shows_the_newest_records_and_submissions_within_a_bound(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation of 110 messages of 900 KB made a 198 MB snapshot, the whole history
    read at once: the snapshot shows about the last SNAPSHOT_BYTES, and says where it starts."""
    from hearth.server import snapshot

    monkeypatch.setattr(snapshot, "SNAPSHOT_BYTES", 64 << 10)
    big = "y" * (20 << 10)
    with server.client() as http:
        for i in range(12):
            sid = http.post("/agents/echo/c-1", json={"message": f"{i}:{big}"}).json()
            http.get(f"/agents/echo/c-1/submissions/{sid['submission_id']}", params={"wait": 5})
        r = http.get("/agents/echo/c-1")
        assert r.status_code == 200
        snap = r.json()
        records = http.get("/agents/echo/c-1/stream").json()["records"]
    assert len(r.content) < 300 << 10  # the whole of it is about 1 MB
    assert snap["offset"] == records[-1]["offset"]
    assert 0 < snap["first_offset"] <= snap["messages"][0]["offset"]
    assert snap["messages"][-1]["text"] == f"echo: 11:{big}"
    assert [s["id"] for s in snap["submissions"]][-1] == sid["submission_id"]
    assert 0 < len(snap["submissions"]) < 12
    # The records before first_offset are the stream route's to page through.
    assert records[0]["offset"] == 0 and records[0]["type"] == "conversation_created"


def test_a_snapshot_reads_the_submissions_it_shows_not_every_one(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submissions were read 20 at a time from the first: a conversation of 100,000
    submissions cost 5,000 reads a snapshot. They are read from the newest back."""
    from hearth.server import snapshot

    monkeypatch.setattr(snapshot, "SNAPSHOT_SUBMISSIONS", 5)
    with server.client() as http:
        sids = [
            http.post("/agents/echo/c-1", json={"message": f"m{i}"}).json()["submission_id"]
            for i in range(100)
        ]
        http.get(f"/agents/echo/c-1/submissions/{sids[-1]}", params={"wait": 10})
        store = server.asgi._runtime.store
        reads: list[int] = []
        list_submissions = store.list_submissions

        async def counted(*args: Any, **kwargs: Any) -> Any:
            found = await list_submissions(*args, **kwargs)
            reads.append(len(found))
            return found

        store.list_submissions = counted
        try:
            snap = http.get("/agents/echo/c-1").json()
        finally:
            store.list_submissions = list_submissions
    assert [s["id"] for s in snap["submissions"]] == sids[-5:]  # in admission order
    assert len(reads) == 1  # (before: 5 reads of 20, and every row of the 100)


def test_submission_wait_answers_soon_after_settlement(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/later/c-1", json={"message": "hi"}).json()["submission_id"]
        r = http.get(f"/agents/later/c-1/submissions/{sid}", params={"wait": 10})
        answered = time.time()
        body = r.json()
        assert body["outcome"] == "completed"
        # woken by the settlement itself, not by the end of the 10 s wait (a loose bound: timing
        # on a shared machine is no test of speed; bench/ measures that)
        assert answered - body["settled_at"] < 2.0


def test_submission_wait_times_out_with_the_current_status(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/staller/c-1", json={"message": "hi"}).json()["submission_id"]
        started = time.monotonic()
        body = http.get(f"/agents/staller/c-1/submissions/{sid}", params={"wait": 0.3}).json()
        assert 0.25 < time.monotonic() - started < 2
        assert body["outcome"] is None and body["status"] in ("queued", "running")


def test_unknown_submission_is_404_and_bad_wait_is_400(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hi"}).json()["submission_id"]
        r = http.get("/agents/echo/c-1/submissions/s_nope")
        assert r.status_code == 404 and error_type(r) == "submission_not_found"
        other = http.get(f"/agents/echo/c-2/submissions/{sid}")  # another conversation's
        assert other.status_code == 404
        for wait in ("soon", "-1", "nan", "inf"):
            bad = http.get(f"/agents/echo/c-1/submissions/{sid}", params={"wait": wait})
            assert bad.status_code == 400, wait


def test_abort_settles_running_work_aborted(server: ThreadServer) -> None:
    with server.client() as http:
        assert http.post("/agents/staller/c-1/abort").status_code == 404
        sid = http.post("/agents/staller/c-1", json={"message": "hi"}).json()["submission_id"]
        r = http.post("/agents/staller/c-1/abort")
        assert r.status_code == 200
        assert r.json() == {"aborted": True, "submission_ids": [sid]}
        sub = http.get(f"/agents/staller/c-1/submissions/{sid}", params={"wait": 5}).json()
        assert sub["outcome"] == "aborted"
        again = http.post("/agents/staller/c-1/abort").json()
        assert again == {"aborted": False, "submission_ids": []}


# --- operational routes ----------------------------------------------------------------------


def test_healthz_metrics_openapi_and_console(server: ThreadServer) -> None:
    with server.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        http.post("/agents/echo/c-1", json={"message": "hi"})
        metrics = http.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        for name in (
            "hearth_submissions_admitted_total 1",
            "hearth_submissions_running",
            'hearth_submissions_settled_total{outcome="completed"}',
            "hearth_recoveries_total",
            "hearth_append_seconds_bucket",
            "hearth_step_seconds_count",
        ):
            assert name in metrics.text
        spec = http.get("/openapi.json").json()
        assert spec["openapi"].startswith("3.")
        assert {
            "/agents/{agent}/{id}",
            "/agents/{agent}/{id}/stream",
            "/agents/{agent}/{id}/submissions/{sid}",
            "/agents/{agent}/{id}/abort",
            "/healthz",
            "/metrics",
        } <= set(spec["paths"])
        page = http.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_unknown_route_and_method_answer_the_envelope(server: ThreadServer) -> None:
    with server.client() as http:
        r = http.get("/nowhere")
        assert r.status_code == 404 and error_type(r) == "not_found"
        r = http.delete("/agents/echo/c-1")
        assert r.status_code == 405 and error_type(r) == "method_not_allowed"


def test_admin_view_counts_submissions(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/staller/c-1", json={"message": "hi"}).json()["submission_id"]
        http.post("/agents/echo/c-2", json={"message": "hi"})
        time.sleep(0.3)
        view = http.get("/admin/submissions").json()
        assert view["counts"].get("running") == 1
        assert [lease["submission_id"] for lease in view["leases"]] == [sid]
        assert view["stuck"] == []


def test_the_admin_view_reads_the_open_work_not_every_settled_submission(
    server: ThreadServer,
) -> None:
    """It read every submission ever admitted (1.6 s and 80 MB for 100,000 settled ones) to
    count them and keep the latest 20."""
    with server.client() as http:
        for n in range(120):
            http.post(f"/agents/echo/s-{n}", json={"message": "hi"})
        wait_until(
            lambda: http.get("/admin/submissions").json()["counts"].get("settled") == 120,
            timeout=30,
        )
        store = server.asgi._runtime.store
        read: list[int] = []
        list_submissions = store.list_submissions

        async def counted(*args: Any, **kwargs: Any) -> Any:
            found = await list_submissions(*args, **kwargs)
            read.append(len(found))
            return found

        store.list_submissions = counted
        sid = http.post("/agents/staller/c-1", json={"message": "hi"}).json()["submission_id"]
        wait_until(lambda: http.get("/admin/submissions").json()["counts"].get("running") == 1)
        read.clear()
        view = http.get("/admin/submissions").json()
    assert sum(read) <= 2  # the running one (and its conversation's joined ones: none)
    assert view["counts"] == {"settled": 120, "running": 1}
    assert view["outcomes"] == {"completed": 120}
    assert [s["id"] for s in view["unsettled"]] == [sid]
    assert len(view["recent"]) == 20 and view["recent"][0]["conversation_id"] == "echo/s-119"


def test_a_submission_settling_while_the_admin_view_is_read_is_listed_once(
    server: ThreadServer,
) -> None:
    """The view reads the open work, then the settled: one that settled in between was listed
    in both (seen once in a suite run)."""
    with server.client() as http:
        sid = http.post("/agents/echo/c-1", json={"message": "hi"}).json()["submission_id"]
        http.get(f"/agents/echo/c-1/submissions/{sid}", params={"wait": 10})
        runtime = server.asgi._runtime
        assert server.loop is not None
        settled = asyncio.run_coroutine_threadsafe(runtime.submission(sid), server.loop).result()
        stale = dataclasses.replace(settled, status="running", outcome=None, settled_at=None)
        submissions = runtime.submissions

        async def read_before_it_settled(*args: Any, **kwargs: Any) -> Any:
            found = await submissions(*args, **kwargs)
            return [stale] if args[1:2] == (OPEN,) else found

        runtime.submissions = read_before_it_settled
        try:
            view = http.get("/admin/submissions").json()
        finally:
            runtime.submissions = submissions
    assert [s["id"] for s in view["recent"]] == [sid]
    assert view["unsettled"] == [] and view["leases"] == []


def test_a_subagents_child_stream_is_readable_through_the_api(server: ThreadServer) -> None:
    with server.client() as http:
        sid = http.post("/agents/delegator/d-1", json={"message": "go"}).json()["submission_id"]
        done = http.get(f"/agents/delegator/d-1/submissions/{sid}", params={"wait": 10}).json()
        assert done["reply"] == "the echo agent said: echo: hello from the parent"
        parent = http.get("/agents/delegator/d-1/stream").json()["records"]
        (link,) = [r for r in parent if r["type"] == "child_conversation_linked"]
        child_path = "/agents/" + link["child_conversation_id"]
        child = http.get(child_path + "/stream").json()["records"]
        assert child[0]["type"] == "conversation_created"
        assert child[0]["parent"] == {
            "conversation_id": "delegator/d-1",
            "tool_call_id": link["tool_call_id"],
        }
        assert http.get(child_path).status_code == 200  # the snapshot too


def test_a_message_queued_behind_a_waiting_submission_is_not_stuck() -> None:
    """It was reported "queued for 62 s (is an earlier one of its conversation running?)": a
    message sent while its conversation waits for a person queues behind the wait, by design."""
    from hearth.server.ops import stuck_reason
    from hearth.store.base import Submission

    def row(conversation_id: str, status: str) -> Submission:
        return Submission(
            id=f"s_{conversation_id}_{status}", conversation_id=conversation_id, kind="message",
            payload={"message": "hi"}, idempotency_key=None, status=status, outcome=None,
            error=None, reply=None, attempt=0, max_attempts=10, timeout=3600.0, deadline=None,
            lease_owner=None, lease_expires_at=None, abort_requested_at=None, accepted_at=1000.0,
            started_at=None, settled_at=None,
        )  # fmt: skip

    later = 1000.0 + 120
    waiting = {"a/behind-a-wait"}
    assert stuck_reason(row("a/behind-a-wait", "queued"), later, waiting) is None
    assert "queued for 120 s" in (stuck_reason(row("a/other", "queued"), later, waiting) or "")
