"""schemathesis against ``/openapi.json``: a bounded run of every check, with and without a token,
finds no server error and no answer outside the description.

The long-poll bound (``?wait=``) of the server under test is 0.5 s so that the run stays short;
the description declares whatever bound the server has, so the fuzzer stays inside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from httpharness import ThreadServer, make_app

from hearth.receipts import AbortResult
from hearth.runtime.runtime import Runtime
from hearth.server.openapi import openapi_document

ST = Path(sys.executable).parent / "st"
EXAMPLES = 40  # test cases per operation and phase: about 30 s a run on a quiet machine
SEED = 14  # fixed, so that a failure in CI is reproducible with the printed command
TOKEN = "fuzz-token-0123456789"
# A fork's offset must lie inside the source's stream, which no schema can say: past its end
# the fork is refused with 400 (SPEC §17), so a schema-valid fork may get one. (schemathesis
# reads this file from its working directory.)
CONFIG = """
[[operations]]
include-operation-id = "fork"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]
"""


def fuzz_server(tmp_path: Path, **settings: object) -> ThreadServer:
    server = ThreadServer(make_app(tmp_path / "h.db", max_body=65536, **settings))
    server.asgi.max_wait_s = 0.5
    return server.start()


def schemathesis(
    server: ThreadServer, tmp_path: Path, *args: str, examples: int = EXAMPLES
) -> tuple[int, str]:
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    command = [
        str(ST),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(examples),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        "10",
        *args,
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def case_count(output: str) -> int:
    found = re.search(r"(\d+) generated, (\d+) passed", output)
    assert found, output[-3000:]
    return int(found[1])


@pytest.mark.parametrize("token", [None, TOKEN], ids=["open", "token"])
def test_schemathesis_finds_nothing_wrong(tmp_path: Path, token: str | None) -> None:
    server = fuzz_server(tmp_path, token=token)
    try:
        args = ("--header", f"Authorization: Bearer {token}") if token else ()
        rc, output = schemathesis(server, tmp_path, *args)
    finally:
        server.stop()
    summary = output[-2500:]
    assert rc == 0 and "Failures:" not in output, summary  # warnings (test data) may remain
    assert case_count(output) >= 300, summary
    # The run, for the record (pytest -s shows it).
    mode = "token" if token else "no token"
    print(f"schemathesis ({mode}): {case_count(output)} cases, 0 issues")


def test_schemathesis_reports_a_planted_server_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run fails when the server has a fault: here an abort that raises (a 500)."""

    async def broken(self: Runtime, agent: str, id: str) -> AbortResult:
        raise RuntimeError("planted")

    monkeypatch.setattr(Runtime, "abort", broken)
    server = fuzz_server(tmp_path)
    try:
        rc, output = schemathesis(
            server, tmp_path, "--include-operation-id", "abort", "--phases", "fuzzing", examples=5
        )
    finally:
        server.stop()
    assert rc != 0, output[-2500:]
    assert "Server error" in output, output[-2500:]


def test_schemathesis_reports_an_answer_outside_the_description(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run fails when an answer does not match its schema: here a receipt whose offset is
    a string."""
    import hearth.server.routes as routes

    real = routes.JSONResponse

    def skewed(content: Any, status_code: int = 200, **kwargs: Any) -> Any:
        if status_code == 202:
            content = {**content, "offset": str(content["offset"])}
        return real(content, status_code=status_code, **kwargs)

    monkeypatch.setattr(routes, "JSONResponse", skewed)
    server = fuzz_server(tmp_path)
    try:
        rc, output = schemathesis(
            server, tmp_path, "--include-operation-id", "admit", "--phases", "fuzzing", examples=5
        )
    finally:
        server.stop()
    assert rc != 0, output[-2500:]
    assert "Response violates schema" in output, output[-2500:]


def test_the_description_follows_the_server() -> None:
    open_doc = openapi_document("", ["support", "echo"])
    params = open_doc["paths"]["/agents/{agent}/{id}"]["parameters"]
    assert params[0]["schema"]["enum"] == ["echo", "support"]
    assert "security" not in open_doc and "securitySchemes" not in open_doc["components"]
    post = open_doc["paths"]["/agents/{agent}/{id}"]["post"]["responses"]
    assert "401" not in post
    guarded = openapi_document("", ["echo"], token=True)
    assert guarded["security"] == [{"bearer": []}, {"session": []}]  # token or cookie
    assert "401" in guarded["paths"]["/agents/{agent}/{id}"]["post"]["responses"]
    assert guarded["paths"]["/healthz"]["get"]["security"] == []
    wait = openapi_document("", ["echo"], max_wait_s=7)["paths"]["/agents/{agent}/{id}/stream"]
    [bound] = [p for p in wait["get"]["parameters"] if p["name"] == "wait"]
    assert bound["schema"]["maximum"] == 7
