"""Leases: periodic scans take over expired work; a stale attempt is fenced out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import hearth
from hearth.records import ToolOutcome
from hearth.store.base import NewSubmission
from hearth.testing import ScriptedModel, call, calls, reply

pytestmark = pytest.mark.anyio

ELSEWHERE = "another-host:boot:1:1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def echo_agent() -> hearth.Agent:
    def echo(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/echo")
        return ""

    return hearth.Agent(echo, name="echo")


async def test_an_expired_lease_of_another_owner_is_taken_over_by_a_periodic_scan(
    tmp_path: Path,
) -> None:
    app = hearth.App(
        [echo_agent()],
        db=str(tmp_path / "h.db"),
        providers=[ScriptedModel("echo", [reply("recovered")])],
        lease_s=1,
        heartbeat_s=0.2,
        scan_s=0.2,
    )
    async with app.run() as rt:
        await rt.coordinator.stop()  # claim by hand first, as a peer on another host would
        admission = await rt.store.admit(
            NewSubmission(
                conversation_id="echo/c", agent="echo", kind="message", payload={"message": "hi"}
            )
        )
        (claimed,) = await rt.store.claim(ELSEWHERE, lease_s=0.3, limit=1)
        assert claimed.attempt == 1
    async with app.run() as rt:
        reply_ = await rt.read(admission.submission.id, timeout=10)
        sub = await rt.submission(admission.submission.id)
    assert reply_.text == "recovered"
    assert sub.attempt == 2


async def test_a_stale_attempt_cannot_write_after_another_owner_took_over() -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    @hearth.tool
    async def wait_here() -> str:
        """Block until released."""
        entered.set()
        await release.wait()
        return "late"

    def agent(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/w")
        ctx.use_tool(wait_here)
        return ""

    app = hearth.App(
        [hearth.Agent(agent, name="w")],
        db="memory",
        providers=[ScriptedModel("w", [calls(call("wait_here")), reply("x")])],
        lease_s=30,
        heartbeat_s=10,
        scan_s=30,
    )
    async with app.run() as rt:
        receipt = await rt.dispatch("w", "c", "go")
        await asyncio.wait_for(entered.wait(), 10)
        # a peer finds the lease expired (say this process froze) and claims the submission
        await rt.store.expire_owners([rt.coordinator.owner])
        (taken,) = await rt.store.claim(ELSEWHERE, lease_s=30, limit=1)
        assert taken.attempt == 2
        release.set()
        for _ in range(200):
            if rt.coordinator.running == 0:
                break
            await asyncio.sleep(0.01)
        assert rt.coordinator.running == 0  # the zombie attempt stopped
        history = await rt.history("w", "c")
        sub = await rt.submission(receipt.submission_id)
    assert not [r for r in history if isinstance(r, ToolOutcome)]
    assert sub.status == "running" and sub.lease_owner == ELSEWHERE and sub.outcome is None


async def test_no_more_than_workers_submissions_run_at_once() -> None:
    running = 0
    peak = 0

    @hearth.tool
    async def hold() -> str:
        """Hold a worker for a moment."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return "held"

    def agent(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/h")
        ctx.use_tool(hold)
        return ""

    app = hearth.App(
        [hearth.Agent(agent, name="h")],
        db="memory",
        providers=[ScriptedModel("h", [calls(call("hold")), reply("done")])],
        workers=2,
    )
    async with app.run() as rt:
        receipts = [await rt.dispatch("h", f"c{i}", "go") for i in range(6)]
        for receipt in receipts:
            assert (await rt.read(receipt, timeout=10)).text == "done"
    assert peak == 2
