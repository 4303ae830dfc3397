"""Forking a conversation at a rest point (SPEC §17) over HTTP, the SDK and the CLI, against a
real server on a real SQLite file (the store conformance suite covers PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkapp
import httpx2
import pytest
from click.testing import CliRunner
from httpharness import ThreadServer

import hearth
from hearth.cli import main
from hearth.providers.base import ModelRequest
from hearth.testing.crash import with_store
from hearth.testing.invariants import assert_invariants

AGENT = "notary"


@pytest.fixture
def fork_server(tmp_path: Path) -> Iterator[ThreadServer]:
    forkapp.MODEL.requests.clear()
    app = hearth.App([forkapp.notary], db=str(tmp_path / "h.db"), providers=[forkapp.MODEL], port=0)
    server = ThreadServer(app).start()
    yield server
    server.stop()


def db_of(server: ThreadServer) -> str:
    db = server.app.settings.db
    assert db is not None
    return db


def requests_of(conversation_id: str) -> list[ModelRequest]:
    return [r for r in forkapp.MODEL.requests if r.conversation_id == conversation_id]


def settlements(records: list[dict[str, Any]]) -> list[int]:
    return [r["offset"] for r in records if r["type"] == "submission_settled"]


def talk(client: hearth.Client, id: str, *messages: str) -> hearth.Conversation:
    conv = client.conversation(AGENT, id)
    for text in messages:
        conv.read(conv.send(text), timeout=20)
    return conv


def test_a_message_sent_to_a_fork_runs_with_the_context_the_source_had(
    fork_server: ThreadServer,
) -> None:
    with hearth.Client(fork_server.url) as client:
        source = talk(client, "c-1", "remember apple", "remember pear")
        records = source.history()
        first = settlements(records)[0]
        with fork_server.client() as http:
            answer = http.post(f"/agents/{AGENT}/c-1/fork", json={"offset": first, "new_id": "alt"})
        assert answer.status_code == 201, answer.text
        assert answer.json() == {
            "conversation_id": f"{AGENT}/alt",
            "agent": AGENT,
            "id": "alt",
            "offset": first,
        }
        assert answer.headers["location"] == f"/agents/{AGENT}/alt"
        alt = client.conversation(AGENT, "alt")
        assert alt.snapshot()["submissions"] == []
        reply = alt.read(alt.send("remember pear"), timeout=20)
        assert reply.text == "noted pear"
        # The source's second submission and the fork's first asked the model the same thing.
        source_ask = requests_of(f"{AGENT}/c-1")[2]
        fork_ask = requests_of(f"{AGENT}/alt")[0]
        assert fork_ask.system == source_ask.system == "You keep notes. Notes so far: apple."
        assert fork_ask.messages == source_ask.messages
        assert fork_ask.tools == source_ask.tools
        assert fork_ask.summary == source_ask.summary
        # The source is untouched by the fork and by what the fork did next.
        assert source.history() == records
        alt_records = alt.history()
        assert alt_records[0]["forked_from"] == {"conversation_id": f"{AGENT}/c-1", "offset": first}
        assert [r["type"] for r in alt_records[: first + 1]] == [
            r["type"] for r in records[: first + 1]
        ]
    fork_server.stop()  # one process owns the SQLite file: let go of it to read it whole
    asyncio.run(with_store(db_of(fork_server), assert_invariants))


def test_a_fork_of_a_fork_works_through_both_sdks(fork_server: ThreadServer) -> None:
    with hearth.Client(fork_server.url) as client:
        source = talk(client, "c-1", "remember apple")
        at = settlements(source.history())[-1]
        alt = source.fork(at, "alt")
        assert alt.conversation_id == f"{AGENT}/alt"
        talk(client, "alt", "remember fig")
        again_at = settlements(alt.history())[-1]

    async def fork_async() -> list[dict[str, Any]]:
        async with hearth.AsyncClient(fork_server.url) as client:
            alt2 = await client.conversation(AGENT, "alt").fork(again_at, "alt-2")
            reply = await alt2.read(await alt2.send("remember kiwi"), timeout=20)
            assert reply.text == "noted kiwi"
            return await alt2.history()

    records = asyncio.run(fork_async())
    assert records[0]["forked_from"] == {"conversation_id": f"{AGENT}/alt", "offset": again_at}
    ask = requests_of(f"{AGENT}/alt-2")[0]
    assert ask.system == "You keep notes. Notes so far: apple, fig."


def test_a_fork_at_0_starts_an_empty_conversation(fork_server: ThreadServer) -> None:
    with hearth.Client(fork_server.url) as client:
        talk(client, "c-1", "remember apple")
        empty = client.conversation(AGENT, "c-1").fork(0, "blank")
        assert [r["type"] for r in empty.history()] == ["conversation_created"]
        talk(client, "blank", "hello")
    assert requests_of(f"{AGENT}/blank")[0].system == "You keep notes. Notes so far: none."


def test_bad_forks_are_clear_4xx_and_store_nothing(fork_server: ThreadServer) -> None:
    with hearth.Client(fork_server.url) as client:
        records = talk(client, "c-1", "remember apple", "hello").history()
    first, second = settlements(records)
    last = records[-1]["offset"]

    def fork(body: Any, path: str = f"/agents/{AGENT}/c-1/fork") -> httpx2.Response:
        with fork_server.client() as http:
            return http.post(path, json=body)

    def error(response: httpx2.Response) -> tuple[int, str]:
        return response.status_code, response.json()["error"]["type"]

    assert error(fork({"offset": 0, "new_id": "x"}, f"/agents/{AGENT}/nobody/fork")) == (
        404,
        "conversation_not_found",
    )
    assert error(fork({"offset": 0, "new_id": "x"}, "/agents/ghost/c-1/fork")) == (
        404,
        "unknown_agent",
    )
    assert error(fork({"offset": 0, "new_id": "c-1"})) == (409, "conversation_exists")
    assert error(fork({"offset": 0, "new_id": "bad id!"})) == (400, "invalid_request")
    assert error(fork({"offset": -1, "new_id": "x"})) == (400, "invalid_request")
    assert error(fork({"offset": last + 1, "new_id": "x"})) == (400, "invalid_request")
    assert error(fork({"offset": "1", "new_id": "x"})) == (400, "invalid_request")
    assert error(fork({"offset": 0})) == (400, "invalid_request")
    assert error(fork({"offset": 0, "new_id": "x", "extra": 1})) == (400, "invalid_request")
    assert error(fork([0, "x"])) == (400, "invalid_request")
    refused = fork({"offset": first + 1, "new_id": "x"})
    assert error(refused) == (409, "not_a_rest_point")
    assert refused.json()["error"]["details"] == {"rest_points": [first, second]}
    with fork_server.client() as http:
        assert http.get(f"/agents/{AGENT}/x").status_code == 404
    with hearth.Client(fork_server.url) as client, pytest.raises(hearth.NotARestPoint) as exc:
        client.conversation(AGENT, "c-1").fork(first + 1, "x")
    assert exc.value.rest_points == [first, second]


def test_the_cli_forks_and_says_so_in_one_line(fork_server: ThreadServer) -> None:
    with hearth.Client(fork_server.url) as client:
        at = settlements(talk(client, "c-1", "remember apple").history())[-1]
    runner = CliRunner()
    done = runner.invoke(main, ["fork", AGENT, "c-1", str(at), "alt", "--url", fork_server.url])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"forked {AGENT}/c-1 at offset {at} into {AGENT}/alt"
    again = runner.invoke(main, ["fork", AGENT, "c-1", "1", "alt-2", "--url", fork_server.url])
    assert again.exit_code == 1
    lines = again.output.strip().splitlines()
    assert len(lines) == 1 and "not a rest point" in lines[0] and "Traceback" not in again.output
