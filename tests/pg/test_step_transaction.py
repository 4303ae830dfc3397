"""``step.transaction`` in a running app: on PostgreSQL the application's writes and the step
record commit together; a raising function rolls both back and the tool sees its exception; the
same name twice is refused as by ``step.do``; on SQLite it raises ``ConfigurationError``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from pgcluster import Cluster

import hearth
from hearth.records import Record, ToolOutcome, ToolStepSettled
from hearth.testing import ScriptedModel, call, calls, reply

TABLE = f"seats_{uuid.uuid4().hex[:10]}"


async def take_seat(conn: Any) -> int:
    await conn.execute(f"INSERT INTO {TABLE} (seat) VALUES (7)")
    return 7


@hearth.tool(durable=True)
async def seat(how: str, ctx: hearth.ToolContext) -> Any:
    """Take a seat in one of several ways."""
    try:
        if how == "once":
            return await ctx.step.transaction("seat", take_seat)
        if how == "twice":
            await ctx.step.transaction("seat", take_seat)
            return await ctx.step.transaction("seat", take_seat)
        if how == "raises":

            async def fails(conn: Any) -> None:
                await take_seat(conn)
                raise LookupError("the seat is gone")

            return await ctx.step.transaction("seat", fails)
        if how == "sync":
            return await ctx.step.transaction("seat", lambda conn: 7)
        if how == "not-json":

            async def odd(conn: Any) -> Any:
                await take_seat(conn)
                return {1, 2}

            return await ctx.step.transaction("seat", odd)
        if how in ("COMMIT", "ROLLBACK", "COMMIT then more"):

            async def ends_it(conn: Any) -> int:
                await take_seat(conn)
                await conn.execute(how.split()[0])  # SQL: psycopg's own commit() is refused
                if how.endswith("more"):
                    await conn.execute("SELECT 1")  # (psycopg opens another transaction)
                return 7

            return await ctx.step.transaction("seat", ends_it)
        if how == "caught":

            async def goes_on(conn: Any) -> int:
                await take_seat(conn)
                try:
                    await conn.execute("SELECT 1 / 0")
                except Exception:
                    pass  # without a savepoint: the transaction is aborted
                return 7

            return await ctx.step.transaction("seat", goes_on)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(how)


@hearth.agent
def hall(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/hall")
    ctx.use_tool(seat)
    return "Seat people."


def run(db: str, how: str) -> list[Record]:
    model = ScriptedModel("hall", [calls(call("seat", how=how)), reply("ok")])
    app = hearth.App([hall], db=db, providers=[model])

    async def main() -> list[Record]:
        async with app.run() as rt:
            await rt.dispatch("hall", "c1", "go")
            await rt.settle_all(timeout=20)
            return await rt.history("hall", "c1")

    return asyncio.run(main())


def outcome(records: list[Record]) -> Any:
    (found,) = [r for r in records if isinstance(r, ToolOutcome)]
    return found.content


def steps(records: list[Record]) -> list[ToolStepSettled]:
    return [r for r in records if isinstance(r, ToolStepSettled)]


@pytest.fixture
def pg(pg_cluster: Cluster) -> tuple[Cluster, str]:
    pg_cluster.sql(f"CREATE TABLE IF NOT EXISTS public.{TABLE} (seat int)")
    pg_cluster.sql(f"DELETE FROM public.{TABLE}")
    return pg_cluster, pg_cluster.url()


def seats(cluster: Cluster) -> int:
    return int(cluster.sql(f"SELECT count(*) FROM public.{TABLE}"))


def test_the_rows_and_the_step_commit_together(pg: tuple[Cluster, str]) -> None:
    cluster, url = pg
    records = run(url, "once")
    assert outcome(records) == 7
    assert [(s.step, s.value) for s in steps(records)] == [("seat", 7)]
    assert seats(cluster) == 1


def test_a_raising_function_rolls_both_back_and_the_tool_sees_it(pg: tuple[Cluster, str]) -> None:
    cluster, url = pg
    records = run(url, "raises")
    assert outcome(records) == "LookupError: the seat is gone"
    assert steps(records) == [] and seats(cluster) == 0


def test_the_same_name_twice_is_refused_as_by_step_do(pg: tuple[Cluster, str]) -> None:
    cluster, url = pg
    records = run(url, "twice")
    assert outcome(records) == (
        "StepError: step 'seat' was already used in this tool call; names are unique"
    )
    assert len(steps(records)) == 1 and seats(cluster) == 1


def test_a_sync_function_is_refused(pg: tuple[Cluster, str]) -> None:
    cluster, url = pg
    assert "needs an async function" in outcome(run(url, "sync"))
    assert seats(cluster) == 0


def test_a_value_that_is_not_json_rolls_back(pg: tuple[Cluster, str]) -> None:
    cluster, url = pg
    records = run(url, "not-json")
    assert "not JSON" in outcome(records)
    assert steps(records) == [] and seats(cluster) == 0


def test_on_sqlite_it_raises_configuration_error_naming_postgresql(tmp_path: Path) -> None:
    records = run(str(tmp_path / "h.db"), "once")
    assert outcome(records).startswith("ConfigurationError: ")
    assert "PostgreSQL" in outcome(records)
    assert steps(records) == []


def test_an_abort_stops_an_open_transaction_instead_of_waiting_for_it(
    pg: tuple[Cluster, str],
) -> None:
    """The transaction holds its submission's row locked: the abort's stamp waited for it to
    end (here a minute). The owner is told to stop first; the transaction rolls back."""
    cluster, url = pg
    locked = asyncio.Event()

    async def slow(conn: Any) -> int:
        await take_seat(conn)
        locked.set()
        await conn.execute("SELECT pg_sleep(60)")
        return 7

    @hearth.tool(durable=True)
    async def linger(ctx: hearth.ToolContext) -> Any:
        """Take a seat, slowly."""
        return await ctx.step.transaction("seat", slow)

    @hearth.agent
    def usher(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/usher")
        ctx.use_tool(linger)
        return "Seat people slowly."

    model = ScriptedModel("usher", [calls(call("linger")), reply("ok")])
    app = hearth.App([usher], db=url, providers=[model])

    async def main() -> list[Record]:
        async with app.run() as rt:
            receipt = await rt.dispatch("usher", "c1", "go")
            await asyncio.wait_for(locked.wait(), 20)
            result = await asyncio.wait_for(rt.abort("usher", "c1"), 20)
            assert result.aborted and result.submission_ids == [receipt.submission_id]
            with pytest.raises(hearth.SubmissionAborted):
                await rt.read(receipt, timeout=20)
            return await rt.history("usher", "c1")

    records = asyncio.run(main())
    assert steps(records) == [] and seats(cluster) == 0


@pytest.mark.parametrize("how", ["COMMIT", "ROLLBACK", "COMMIT then more"])
def test_a_function_that_ends_the_transaction_itself_gets_no_step(
    pg: tuple[Cluster, str], how: str
) -> None:
    """A ``COMMIT`` sent as SQL committed the function's row, and the step was then written in
    another transaction, without the fence's lock: a re-execution wrote the row twice. A
    ``ROLLBACK`` lost the row and recorded the step as done. Both are now the function's
    error, and no step is recorded."""
    cluster, url = pg
    records = run(url, how)
    assert outcome(records).startswith("StepError: the step's function ended its transaction")
    assert steps(records) == []
    assert seats(cluster) == (0 if how == "ROLLBACK" else 1)  # (what it committed, it did)


def test_a_function_that_catches_a_failed_statement_without_a_savepoint_is_told(
    pg: tuple[Cluster, str],
) -> None:
    cluster, url = pg
    records = run(url, "caught")
    assert "leaves the transaction aborted" in outcome(records)
    assert steps(records) == [] and seats(cluster) == 0
