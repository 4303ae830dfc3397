"""``step.transaction`` whose work takes long: longer than the lease, longer than a try may
run, or waiting for another call's transaction of the same submission."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pgcluster import Cluster, new_schema

import hearth
import hearth.store.postgres
from hearth.records import Record, ToolOutcome, ToolStepSettled
from hearth.testing import ScriptedModel, call, calls, reply


def app_with(url: str, tool: hearth.Tool, *, parallel: int = 1, **settings: float) -> hearth.App:
    @hearth.agent
    def clerk(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/clerk")
        ctx.use_tool(tool)
        return "Book."

    turn = calls(*(call(tool.name, n=n) for n in range(parallel)))
    model = ScriptedModel("clerk", [turn, reply("ok")])
    return hearth.App([clerk], db=url, providers=[model], **settings)  # type: ignore[arg-type]


def booking(seconds: int, runs: list[int] | None = None) -> hearth.Tool:
    """A durable tool whose step.transaction sleeps ``seconds`` on the server (noting each run
    in ``runs``); it says "booked", or the ``StoreError`` it met."""

    @hearth.tool(durable=True)
    async def book(n: int, ctx: hearth.ToolContext) -> str:
        """Book."""

        async def slow(conn: Any) -> int:
            if runs is not None:
                runs.append(n)
            await conn.execute(f"SELECT pg_sleep({seconds})")
            return n

        try:
            await ctx.step.transaction("book", slow)
        except hearth.StoreError as exc:
            return f"StoreError: {exc}"
        return "booked"

    return book


def outcomes(records: list[Record]) -> list[Any]:
    return [r.content for r in records if isinstance(r, ToolOutcome)]


def test_a_transaction_longer_than_the_lease_commits_a_renewed_lease(
    pg_cluster: Cluster,
) -> None:
    """Renewals leave the row a transaction holds alone: it committed with the lease it had
    when it began, run out, and a peer could claim the healthy work before the next beat."""
    schema = new_schema()
    url = pg_cluster.url(schema)
    query = (
        f"SELECT lease_expires_at > extract(epoch FROM clock_timestamp()) FROM {schema}.submissions"
        " WHERE conversation_id = 'clerk/c1'"
    )
    seen: list[str] = []

    @hearth.tool(durable=True)
    async def book(n: int, ctx: hearth.ToolContext) -> str:
        """Book, slowly."""

        async def slow(conn: Any) -> int:
            await conn.execute("SELECT pg_sleep(3)")
            return n

        await ctx.step.transaction("book", slow)
        seen.append(pg_cluster.sql(query))  # (blocking: no heartbeat runs before it)
        return "booked"

    async def main() -> list[Record]:
        app = app_with(url, book, lease_s=2, heartbeat_s=1.5)
        async with app.run() as rt:
            await rt.dispatch("clerk", "c1", "go")
            await rt.settle_all(timeout=30)
            return await rt.history("clerk", "c1")

    records = asyncio.run(main())
    assert outcomes(records) == ["booked"]
    assert seen == ["t"]  # the lease runs on from the commit


def test_a_transaction_past_its_time_is_ended_on_the_server_and_not_run_again(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut at its limit, the transaction's statement ran on at the server, the row locked: the
    process's lease renewals (one statement for all its claims) waited behind it, so every
    attempt of the process was stopped; and the function was run again, and again."""
    monkeypatch.setattr(hearth.store.postgres, "WORK_TRY_S", 3.0)
    url = pg_cluster.url()
    runs: list[int] = []

    book = booking(20, runs)

    async def main() -> list[Record]:
        app = app_with(url, book, lease_s=4, heartbeat_s=1)
        async with app.run() as rt:
            rt.store.write_retry_s = 3.0  # type: ignore[attr-defined]
            receipt = await rt.dispatch("clerk", "c1", "go")
            await rt.read(receipt, timeout=30)
            assert (await rt.submission(receipt.submission_id)).attempt == 1
            return await rt.history("clerk", "c1")

    records = asyncio.run(main())
    (said,) = outcomes(records)
    assert "ran past its 3 s and was ended on the server; nothing of it committed" in said
    assert runs == [0]
    assert not [r for r in records if isinstance(r, ToolStepSettled)]
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(20)%'"
    assert pg_cluster.sql(sleeping) == "0"


def test_parallel_calls_transactions_each_get_their_time(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls of one turn each run a transaction: they lock the same row, and the second's
    wait for the first counted against its own time: cut, it failed as unreachable."""
    monkeypatch.setattr(hearth.store.postgres, "WORK_TRY_S", 3.0)
    url = pg_cluster.url()

    book = booking(2)

    async def main() -> list[Record]:
        app = app_with(url, book, parallel=2)
        async with app.run() as rt:
            rt.store.write_retry_s = 3.0  # type: ignore[attr-defined]
            await rt.dispatch("clerk", "c1", "go")
            await rt.settle_all(timeout=30)
            return await rt.history("clerk", "c1")

    records = asyncio.run(main())
    assert outcomes(records) == ["booked", "booked"]
