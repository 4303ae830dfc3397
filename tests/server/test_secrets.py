"""Secrets never leave: a real server with a bearer token and a provider key is driven through
successes and failures (a wrong token, a provider that quotes the key back, an upstream outage),
and no log line, no answer and no metric carries either secret."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx2
import pytest
from fakellm import FakeServer
from httpharness import ServerProcess, child_env, free_port, wait_until

TOKEN = "hearth-token-5f3a9c1e7b2d4a60"
API_KEY = "sk-live-key-9d8c7b6a5f4e3d2c1b0a"
SECRETS = (TOKEN, API_KEY)


def chunk(delta: dict[str, object] | None = None, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return f"data: {json.dumps({'id': 'c', 'model': 'm', 'choices': [choice]})}\n\n"


def reply(text: str) -> list[str]:
    return [chunk({"role": "assistant", "content": text}), chunk(finish="stop"), "data: [DONE]\n\n"]


def test_no_secret_in_any_log_line_answer_or_metric(tmp_path: Path) -> None:
    model = FakeServer()
    model.start()
    # 1: the provider refuses the key and quotes it back (as some APIs do)
    model.error(401, {"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
    # 2: an outage, then success
    model.error(503, {"error": {"message": "overloaded"}})
    model.sse(reply("hello there"))
    env = {
        "HEARTH_FAKE_LLM_URL": model.url,
        "OPENAI_API_KEY": API_KEY,
        "HEARTH_TOKEN": TOKEN,
        "HEARTH_LOG_FORMAT": "json",
    }
    args = ("--log-level", "debug", "--access-log")
    server = ServerProcess(tmp_path / "h.db", app="secretapp:app", env=env, args=args).start()
    answers: list[str] = []
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        with httpx2.Client(base_url=server.url, timeout=30, headers=auth) as http:
            for id in ("refused", "recovered"):
                r = http.post(f"/agents/chat/{id}", json={"message": "hi"})
                answers.append(r.text)
                sid = r.json()["submission_id"]
                done = http.get(f"/agents/chat/{id}/submissions/{sid}?wait=30")
                answers.append(done.text)
                assert done.json()["status"] == "settled"
                answers.append(http.get(f"/agents/chat/{id}").text)
                answers.append(http.get(f"/agents/chat/{id}/stream").text)
            for path in ("/metrics", "/admin/submissions", "/openapi.json", "/healthz", "/"):
                answers.append(http.get(path).text)
            answers.append(http.post("/agents/chat/x%0A", json={"message": "hi"}).text)
            # A client that also puts the token in a URL: the access log line is redacted.
            answers.append(http.get(f"/metrics?token={TOKEN}").text)
            answers.append(http.post("/agents/chat/y", content=b"{", headers={}).text)
        refused = httpx2.get(f"{server.url}/agents/chat/recovered/submissions/{sid}")
        assert refused.status_code == 401
        answers.append(refused.text)
        # Wrong tokens: one that shares the real one's prefix, one that is short.
        for wrong in (TOKEN[:-1] + "x", "x"):
            r = httpx2.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {wrong}"})
            assert r.status_code == 401
            answers.append(r.text)
    finally:
        server.terminate()
        server.wait(30)
        model.stop()
    failed = [a for a in answers if '"provider_error"' in a]
    assert failed and any("[redacted]" in a for a in failed)  # the quoted key was caught
    log = server.log.read_text()
    lines = log.splitlines()
    assert len(lines) > 20  # debug level, access log: the run did log
    for secret in SECRETS:
        assert not leaked_lines(server.log, secret), secret
        assert not [a for a in answers if secret in a], secret
    assert model.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # it was sent


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_token_in_a_url_is_redacted_as_written_or_percent_encoded(
    tmp_path: Path, log_format: str
) -> None:
    """A base64 token (``+ / =``) in a query string is percent-encoded, and was logged so in
    full; in the text format, the redacted access line was lost (``--- Logging error ---``:
    uvicorn's formatter unpacks the record's arguments, which the redaction had dropped)."""
    token = "Zm9v+YmFy/cXV4PQ=="
    encoded = quote(token, safe="")
    log = tmp_path / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "hearth", "serve", "serverapp:app", "--port", str(port)]
    command += ["--db", f"sqlite:///{tmp_path / 'h.db'}", "--log-level", "debug", "--access-log"]
    env = child_env(HEARTH_TOKEN=token, HEARTH_LOG_FORMAT=log_format)
    with log.open("w") as out:  # (uvicorn's text access log goes to stdout)
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: "serving http" in log.read_text(), 20)
        for query in (f"token={encoded}", f"token={encoded.replace('%2F', '%2f')}"):
            assert httpx2.get(f"{url}/healthz?{query}").status_code == 200
        assert httpx2.get(f"{url}/healthz", params={"t": token}).status_code == 200
        assert httpx2.get(f"{url}/healthz?access_token={token}").status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert "Logging error" not in text
    assert len([line for line in text.splitlines() if "/healthz?" in line]) == 4
    assert text.count("[redacted]") == 4
    for spelled in (token, encoded, "YmFy%2FcXV4PQ", "YmFy%2fcXV4PQ"):
        assert not leaked_lines(log, spelled), spelled


def leaked_lines(log: Path, secret: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if secret in line]


def test_the_check_catches_a_server_that_leaks_its_key(tmp_path: Path) -> None:
    """The planted fault: application code that prints the provider key at start-up. The same
    check on the same server's log finds it."""
    env = {
        "OPENAI_API_KEY": API_KEY,
        "HEARTH_FAKE_LLM_URL": "http://127.0.0.1:9",
        "HEARTH_TEST_LEAK_KEY": "1",
    }
    server = ServerProcess(tmp_path / "h.db", app="secretapp:app", env=env).start()
    server.terminate()
    server.wait(30)
    assert leaked_lines(server.log, API_KEY)
