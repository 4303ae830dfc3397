"""Channels and schedules over HTTP, on a real server (SPEC §14): what is admitted, once, and
what is refused with nothing admitted."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import inputsapp
import pytest
from click.testing import CliRunner
from httpharness import ThreadServer, wait_until

import hearth
from hearth.channels import sign
from hearth.cli import main
from hearth.testing.clock import ManualClock

SECRET = inputsapp.SECRET
GH_SECRET = inputsapp.GITHUB_SECRET
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a whole minute


@pytest.fixture
def receive_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "receive.log"
    log.touch()
    monkeypatch.setenv("HEARTH_TEST_LOG", str(log))
    monkeypatch.setenv("HEARTH_TEST_FIXED", str(tmp_path / "fixed"))
    return log


@pytest.fixture
def start(tmp_path: Path, receive_log: Path) -> Iterator[Callable[..., ThreadServer]]:
    started: list[ThreadServer] = []

    def run(**settings: Any) -> ThreadServer:
        settings.setdefault("port", 0)
        app = hearth.App(
            inputsapp.AGENTS,
            channels=inputsapp.CHANNELS,
            providers=inputsapp.MODELS,
            db=str(tmp_path / f"h{len(started)}.db"),
            **settings,
        )
        server = ThreadServer(app).start()
        started.append(server)
        return server

    yield run
    for server in started:
        server.stop()


@pytest.fixture
def server(start: Callable[..., ThreadServer]) -> ThreadServer:
    return start()


def hook(
    server: ThreadServer,
    body: Any,
    delivery_id: str = "d-1",
    *,
    secret: str = SECRET,
    timestamp: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    raw = json.dumps(body).encode()
    sent = {
        "Content-Type": "application/json",
        "X-Delivery-Id": delivery_id,
        "X-Signature": sign(secret, raw, timestamp),
    }
    if timestamp is not None:
        sent["X-Timestamp"] = timestamp
    sent.update(headers or {})
    return httpx2.post(f"{server.url}/channels/hooks", content=raw, headers=sent, timeout=10)


def github(server: ThreadServer, event: str, body: Any, delivery_id: str) -> httpx2.Response:
    raw = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery_id,
        "X-GitHub-Hook-ID": "292430182",
        "X-Hub-Signature-256": sign(GH_SECRET, raw),
    }
    return httpx2.post(f"{server.url}/channels/github", content=raw, headers=headers, timeout=10)


def receives(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line]


def submissions(server: ThreadServer) -> list[dict[str, Any]]:
    data = httpx2.get(f"{server.url}/admin/submissions", timeout=10).json()
    return list(data["unsettled"]) + list(data["recent"])


def to(*ids: str) -> dict[str, Any]:
    return {"to": [{"id": i, "message": f"hello {i}"} for i in ids]}


# --- channels --------------------------------------------------------------------------------


def test_a_delivery_admits_its_dispatches_and_answers_202(server: ThreadServer) -> None:
    answer = hook(server, to("a", "b"))
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert set(body) == {"delivery_id", "submission_ids", "deduplicated"}
    assert body["delivery_id"] == "d-1" and body["deduplicated"] is False
    assert len(body["submission_ids"]) == 2
    snap = httpx2.get(f"{server.url}/agents/triage/a", timeout=10).json()
    [sub] = snap["submissions"]
    assert sub["kind"] == "channel"
    assert sub["source"] == {"channel": "hooks", "delivery_id": "d-1"}
    assert sub["idempotency_key"] == "channel:hooks:d-1:0"
    done = httpx2.get(
        f"{server.url}/agents/triage/b/submissions/{body['submission_ids'][1]}?wait=10",
        timeout=20,
    ).json()
    assert (done["outcome"], done["reply"]) == ("completed", "echo: hello b")
    assert done["kind"] == "channel"


def test_a_redelivery_admits_nothing_and_never_routes_again(
    server: ThreadServer, receive_log: Path
) -> None:
    first = hook(server, to("a")).json()
    again = hook(server, to("a", "changed-routing"), delivery_id="d-1")
    assert again.status_code == 202
    assert again.json() == {**first, "deduplicated": True}
    assert len(receives(receive_log)) == 1
    assert httpx2.get(f"{server.url}/agents/triage/changed-routing", timeout=10).status_code == 404
    assert len(submissions(server)) == 1


def test_a_signal_dispatch_appends_a_signal_record(server: ThreadServer) -> None:
    body = {"to": [{"id": "s", "signal": {"type": "build_failed", "body": "main is red"}}]}
    [sid] = hook(server, body).json()["submission_ids"]
    done = httpx2.get(f"{server.url}/agents/triage/s/submissions/{sid}?wait=10", timeout=20).json()
    assert done["reply"] == "echo: main is red"
    messages = httpx2.get(f"{server.url}/agents/triage/s", timeout=10).json()["messages"]
    assert messages[0]["role"] == "signal" and messages[0]["signal_type"] == "build_failed"


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Signature": ""},
        {"X-Signature": "sha256=" + "0" * 64},
        {"X-Signature": sign("another-secret", b"{}")},
    ],
    ids=["missing", "zeros", "other-secret"],
)
def test_a_missing_or_wrong_signature_is_401_and_admits_nothing(
    server: ThreadServer, receive_log: Path, headers: dict[str, str]
) -> None:
    answer = hook(server, to("a"), headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "invalid_signature"
    assert receives(receive_log) == []
    assert submissions(server) == []
    listed = httpx2.get(f"{server.url}/channels/hooks/deliveries", timeout=10).json()
    assert listed == {"deliveries": []}


def test_a_timestamped_signature_is_checked_and_an_old_one_refused(server: ThreadServer) -> None:
    now = str(int(time.time()))
    assert hook(server, to("a"), "t-1", timestamp=now).status_code == 202
    old = str(int(time.time()) - 301)
    assert hook(server, to("a"), "t-2", timestamp=old).status_code == 401
    # Signed over the body alone while a timestamp is sent: the timestamp is not covered.
    body_only = {"X-Signature": sign(SECRET, json.dumps(to("a")).encode()), "X-Timestamp": now}
    assert hook(server, to("a"), "t-3", headers=body_only).status_code == 401
    assert len(submissions(server)) == 1


def test_an_unknown_channel_is_404(server: ThreadServer) -> None:
    answer = httpx2.post(f"{server.url}/channels/nope", content=b"{}", timeout=10)
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "unknown_channel"


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "x", "\u00b2", "\u2460", "\u0665"])
def test_a_deliveries_limit_out_of_range_or_not_ascii_digits_is_400(
    server: ThreadServer, limit: str
) -> None:
    """``²`` and ``①`` are digits to ``str.isdigit`` but not to ``int()``: they answered 500."""
    answer = httpx2.get(
        f"{server.url}/channels/hooks/deliveries", params={"limit": limit}, timeout=10
    )
    assert answer.status_code == 400 and answer.json()["error"]["details"] == {"field": "limit"}


def test_a_body_over_the_limit_is_413(start: Callable[..., ThreadServer]) -> None:
    server = start(max_body=1000)
    answer = hook(server, {"to": [], "pad": "x" * 2000})
    assert answer.status_code == 413
    assert submissions(server) == []


def test_a_sync_receive_raising_stop_iteration_is_a_500_not_a_request_that_never_ends(
    server: ThreadServer,
) -> None:
    """No future can carry a StopIteration out of a worker thread: the request hung."""
    answer = hook(server, {"find": "nothing"}, "n-1")
    assert answer.status_code == 500
    assert "its receive raised RuntimeError" in answer.json()["error"]["message"]


def test_a_receive_that_raises_is_500_kept_failed_and_replayed_after_a_fix(
    server: ThreadServer, receive_log: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="hearth.channels"):
        answer = hook(server, {"fail": True}, "f-1")
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert error["type"] == "channel_failed"
    assert error["details"] == {"channel": "hooks", "delivery_id": "f-1"}
    assert "RuntimeError" in error["message"] and "replay" in error["message"]
    assert "Traceback" not in answer.text and "routing table" not in answer.text
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)
    assert submissions(server) == []
    [kept] = httpx2.get(f"{server.url}/channels/hooks/deliveries?full=1", timeout=10).json()[
        "deliveries"
    ]
    assert (kept["status"], kept["attempts"]) == ("failed", 1)
    assert kept["error"] == {"type": "RuntimeError", "message": "the routing table is broken"}
    assert kept["data"] == {"fail": True} and kept["headers"]["x-delivery-id"] == "f-1"
    assert "x-signature" not in kept["headers"]
    # The sender retries: a failed delivery is routed again (and fails again).
    assert hook(server, {"fail": True}, "f-1").status_code == 500
    assert len(receives(receive_log)) == 2
    (tmp_path / "fixed").touch()
    replayed = httpx2.post(f"{server.url}/channels/hooks/deliveries/f-1/replay", timeout=10)
    assert replayed.status_code == 202
    assert replayed.json()["deduplicated"] is False
    [sid] = replayed.json()["submission_ids"]
    assert [s["id"] for s in submissions(server)] == [sid]
    # Once admitted, neither a replay nor a redelivery routes it again.
    again = httpx2.post(f"{server.url}/channels/hooks/deliveries/f-1/replay", timeout=10)
    assert again.json() == {"delivery_id": "f-1", "submission_ids": [sid], "deduplicated": True}
    assert hook(server, {"fail": True}, "f-1").json()["deduplicated"] is True
    assert len(receives(receive_log)) == 3
    listed = httpx2.get(f"{server.url}/channels/hooks/deliveries", timeout=10).json()
    assert [(d["status"], d["attempts"]) for d in listed["deliveries"]] == [("admitted", 3)]
    missing = httpx2.post(f"{server.url}/channels/hooks/deliveries/nope/replay", timeout=10)
    assert missing.status_code == 404


def test_a_dispatch_to_an_unknown_agent_or_bad_id_admits_nothing(server: ThreadServer) -> None:
    body = {"to": [{"id": "fine", "message": "x"}, {"agent": "ghost", "id": "a", "message": "x"}]}
    answer = hook(server, body, "u-1")
    assert answer.status_code == 500
    assert "'ghost'" in answer.json()["error"]["message"]
    bad_id = {"to": [{"id": "fine", "message": "x"}, {"id": "no spaces", "message": "x"}]}
    answer = hook(server, bad_id, "u-2")
    assert answer.status_code == 500
    assert "'no spaces'" in answer.json()["error"]["message"]
    assert submissions(server) == []  # all or nothing: "fine" was not admitted either
    assert httpx2.get(f"{server.url}/agents/triage/fine", timeout=10).status_code == 404


def test_github_ping_and_issue_events_signed_as_github_signs_them(server: ThreadServer) -> None:
    ping = github(server, "ping", {"zen": "Design for failure.", "hook_id": 1}, "gh-ping")
    assert ping.status_code == 202
    assert ping.json() == {"delivery_id": "gh-ping", "submission_ids": [], "deduplicated": False}
    issue = {"action": "opened", "issue": {"number": 7, "title": "Crash on start"}}
    opened = github(server, "issues", issue, "gh-1")
    [sid] = opened.json()["submission_ids"]
    closed = github(server, "issues", {**issue, "action": "closed"}, "gh-2")
    assert closed.status_code == 202
    snap = httpx2.get(f"{server.url}/agents/triage/issue-7", timeout=10).json()
    assert [s["source"]["delivery_id"] for s in snap["submissions"]] == ["gh-1", "gh-2"]
    assert snap["submissions"][0]["id"] == sid
    raw = json.dumps(issue).encode()
    forged = httpx2.post(
        f"{server.url}/channels/github",
        content=raw,
        headers={
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": "gh-3",
            "X-Hub-Signature-256": sign("guessed", raw),
        },
        timeout=10,
    )
    assert forged.status_code == 401


def test_a_channel_post_needs_no_bearer_token_but_its_operator_routes_do(
    start: Callable[..., ThreadServer],
) -> None:
    server = start(token="operator-token-123")
    assert hook(server, to("a")).status_code == 202
    listed = httpx2.get(f"{server.url}/channels/hooks/deliveries", timeout=10)
    assert listed.status_code == 401
    replay = httpx2.post(f"{server.url}/channels/hooks/deliveries/d-1/replay", timeout=10)
    assert replay.status_code == 401
    assert httpx2.get(f"{server.url}/schedules", timeout=10).status_code == 401
    authed = {"Authorization": "Bearer operator-token-123"}
    listed = httpx2.get(f"{server.url}/channels/hooks/deliveries", headers=authed, timeout=10)
    assert [d["delivery_id"] for d in listed.json()["deliveries"]] == ["d-1"]


def test_secrets_never_appear_in_answers_or_logs(
    server: ThreadServer, caplog: pytest.LogCaptureFixture
) -> None:
    answers = []
    with caplog.at_level(logging.DEBUG):
        answers.append(hook(server, to("a"), "s-1"))
        answers.append(hook(server, to("a"), "s-2", secret="wrong"))
        answers.append(hook(server, {"fail": True}, "s-3"))
        answers.append(github(server, "ping", {}, "s-4"))
        answers.append(httpx2.get(f"{server.url}/channels/hooks/deliveries?full=1", timeout=10))
    seen = caplog.text + "".join(a.text for a in answers)
    seen += repr(inputsapp.CHANNELS[0].verify) + repr(inputsapp.CHANNELS[1].verify)
    assert [a.status_code for a in answers] == [202, 401, 500, 202, 200]
    assert SECRET not in seen and GH_SECRET not in seen


# --- schedules -------------------------------------------------------------------------------


@pytest.fixture
def scheduled(tmp_path: Path, receive_log: Path) -> Iterator[tuple[ThreadServer, ManualClock]]:
    clock = ManualClock(T0 + 30)
    tick = hearth.Schedule("tick", "triage", "ticks", cron="* * * * *", message="tick")
    nightly = hearth.Schedule(
        "nightly",
        "triage",
        "nightly",
        cron="30 2 * * *",
        tz="Europe/Paris",
        signal={"type": "nightly_run", "body": "run the nightly"},
    )
    app = hearth.App(
        inputsapp.AGENTS,
        schedules=[tick, nightly],
        providers=inputsapp.MODELS,
        db=str(tmp_path / "h.db"),
        port=0,
        schedule_clock=clock,
    )
    server = ThreadServer(app).start()
    try:
        yield server, clock
    finally:
        server.stop()


def ticks(server: ThreadServer, conversation: str = "ticks") -> list[dict[str, Any]]:
    answer = httpx2.get(f"{server.url}/agents/triage/{conversation}", timeout=10)
    return [] if answer.status_code == 404 else list(answer.json()["submissions"])


def test_an_occurrence_is_admitted_once_as_a_scheduled_submission(
    scheduled: tuple[ThreadServer, ManualClock],
) -> None:
    server, clock = scheduled
    time.sleep(0.3)  # the scheduler looked: nothing before the schedule existed is due
    assert ticks(server) == []
    clock.set(T0 + 60)
    wait_until(lambda: len(ticks(server)) == 1, 5)
    [sub] = ticks(server)
    assert sub["kind"] == "scheduled"
    assert sub["payload"] == {"message": "tick", "scheduled_for": "2027-01-15T08:01:00Z"}
    assert sub["source"] == {"schedule": "tick", "occurrence": "2027-01-15T08:01:00Z"}
    time.sleep(0.3)
    assert len(ticks(server)) == 1


def test_missed_occurrences_are_coalesced_into_one_catch_up(
    scheduled: tuple[ThreadServer, ManualClock],
) -> None:
    server, clock = scheduled
    time.sleep(0.2)
    clock.set(T0 + 60 * 90 + 5)  # 90 occurrences passed at once
    wait_until(lambda: len(ticks(server)) == 1, 5)
    time.sleep(0.3)
    [sub] = ticks(server)
    assert sub["payload"]["scheduled_for"] == "2027-01-15T09:30:00Z"


def test_schedules_list_their_last_and_next_occurrence_over_http_and_the_cli(
    scheduled: tuple[ThreadServer, ManualClock],
) -> None:
    server, clock = scheduled
    listed = httpx2.get(f"{server.url}/schedules", timeout=10).json()["schedules"]
    assert [s["name"] for s in listed] == ["tick", "nightly"]
    assert listed[0] == {
        "name": "tick",
        "agent": "triage",
        "id": "ticks",
        "cron": "* * * * *",
        "tz": "UTC",
        "last_occurrence": None,
        "next_occurrence": "2027-01-15T08:01:00Z",
    }
    assert listed[1]["next_occurrence"] == "2027-01-16T01:30:00Z"  # 02:30 in Paris (UTC+1)
    clock.set(T0 + 60)
    wait_until(lambda: len(ticks(server)) == 1, 5)
    result = CliRunner().invoke(main, ["schedules", "--url", server.url], catch_exceptions=False)
    assert result.exit_code == 0
    line = next(line for line in result.output.splitlines() if "tick" in line)
    assert "2027-01-15T08:01:00Z" in line and "2027-01-15T08:02:00Z" in line
    assert "triage/ticks" in line
    result = CliRunner().invoke(main, ["schedules", "--url", server.url, "--json"])
    assert json.loads(result.output)["schedules"][0]["last_occurrence"] == "2027-01-15T08:01:00Z"


def test_a_scheduled_signal_shows_the_model_its_occurrence(
    scheduled: tuple[ThreadServer, ManualClock],
) -> None:
    server, clock = scheduled
    time.sleep(0.2)
    clock.set(1_800_070_000.0)  # past 2027-01-16T01:30:00Z, the next 02:30 in Paris
    wait_until(lambda: len(ticks(server, "nightly")) == 1, 5)
    [sub] = ticks(server, "nightly")
    done = httpx2.get(
        f"{server.url}/agents/triage/nightly/submissions/{sub['id']}?wait=10", timeout=20
    ).json()
    assert done["reply"] == "echo: run the nightly (scheduled for 2027-01-16T01:30:00Z)"
    [message] = httpx2.get(f"{server.url}/agents/triage/nightly", timeout=10).json()["messages"][:1]
    assert message["attributes"] == {"scheduled_for": "2027-01-16T01:30:00Z"}


def test_cli_lists_a_channels_deliveries_and_replays_one(
    server: ThreadServer, tmp_path: Path
) -> None:
    hook(server, to("a"), "c-1")
    hook(server, {"fail": True}, "c-2")
    result = CliRunner().invoke(main, ["deliveries", "hooks", "--url", server.url])
    assert result.exit_code == 0
    assert "c-1" in result.output and "admitted" in result.output
    assert "RuntimeError" in result.output and "failed" in result.output
    (tmp_path / "fixed").touch()
    result = CliRunner().invoke(
        main, ["deliveries", "hooks", "--url", server.url, "--replay", "c-2"]
    )
    assert result.exit_code == 0 and "delivery c-2 admitted s_" in result.output
    result = CliRunner().invoke(main, ["inspect", "--url", server.url])
    assert "channel hooks #c-1" in result.output or "channel hooks #c-2" in result.output


def test_the_openapi_document_describes_channels_and_schedules(server: ThreadServer) -> None:
    paths = httpx2.get(f"{server.url}/openapi.json", timeout=10).json()["paths"]
    assert paths["/channels/{name}"]["post"]["security"] == []
    assert "401" in paths["/channels/{name}"]["post"]["responses"]
    assert {"/channels/{name}/deliveries", "/schedules"} <= set(paths)
