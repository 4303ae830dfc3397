"""Leases: periodic scans take over expired work; a stale attempt is fenced out."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import hearth
from hearth.records import ToolOutcome
from hearth.runtime.owner import this_host
from hearth.store.base import Held, NewSubmission, Submission
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


async def test_a_claim_settled_just_before_a_renewal_is_not_reported_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The heartbeat lists its claims, then renews. A settlement that commits in between leaves
    # the claim out of the renewal's answer although nothing was lost: the attempt must not be
    # interrupted, no warning logged, and no extra read spent on telling the two apart.
    app = hearth.App(
        [echo_agent()],
        db="memory",
        providers=[ScriptedModel("echo", [reply("done")])],
        lease_s=30,
        heartbeat_s=0.01,
    )
    async with app.run() as rt:
        store = rt.store
        settled, judged = asyncio.Event(), asyncio.Event()
        renew_all, settle_batch, get_submission = (
            store.renew_all,
            store.settle_batch,
            store.get_submission,
        )
        renewals = 0
        heartbeat_reads = 0

        async def settle_then_hold(*args: Any) -> int:
            offset = await settle_batch(*args)
            settled.set()
            await judged.wait()  # the attempt is not done while the heartbeat judges it
            return offset

        async def renew_after_settlement(owner: str, lease_s: float) -> list[Held]:
            nonlocal renewals
            renewals += 1
            if renewals > 1:
                judged.set()  # the previous beat finished judging its claims
            await settled.wait()
            return await renew_all(owner, lease_s)

        async def counted_get(submission_id: str) -> Submission | None:
            nonlocal heartbeat_reads
            if any(t.get_name() == "hearth-heartbeat" for t in [asyncio.current_task()] if t):
                heartbeat_reads += 1
            return await get_submission(submission_id)

        store.renew_all = renew_after_settlement  # type: ignore[method-assign]
        store.settle_batch = settle_then_hold  # type: ignore[method-assign]
        store.get_submission = counted_get  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="hearth.coordinator"):
            receipt = await rt.dispatch("echo", "c", "hi")
            answer = await rt.read(receipt, timeout=10)
            await asyncio.wait_for(judged.wait(), timeout=10)
    assert answer.text == "done"
    assert renewals >= 2
    assert "lost the lease" not in caplog.text
    assert heartbeat_reads == 0


async def test_an_abort_whose_notice_was_missed_is_heard_at_the_next_heartbeat() -> None:
    """On PostgreSQL the notice of an abort travels by NOTIFY: an owner whose listener was down
    when it was sent never stopped the work, which ran on to its deadline (an hour by default),
    and the messages queued behind it waited as long."""
    from hearth.store.events import ABORT
    from hearth.testing import stall

    def staller(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/stall")
        return "Never finish."

    app = hearth.App(
        [hearth.Agent(staller, name="staller")],
        db="memory",
        providers=[ScriptedModel("stall", [stall(after_chunks=["thinking"])], repeat_last=True)],
        heartbeat_s=0.1,
    )
    async with app.run() as rt:
        coordinator = rt.coordinator
        coordinator._unlisten()  # this owner now misses every abort notice
        hear = coordinator._on_event
        coordinator._unlisten = rt.store.events.listen(
            lambda event: None if event.kind == ABORT else hear(event)
        )
        receipt = await rt.dispatch("staller", "c", "go")
        async with asyncio.timeout(10):  # until the model call is under way
            while not any(
                r.type == "assistant_text_delta" for r in await rt.history("staller", "c")
            ):
                await asyncio.sleep(0.01)
        assert (await rt.abort("staller", "c")).aborted
        with pytest.raises(hearth.SubmissionAborted):
            await rt.read(receipt, timeout=10)


async def test_a_step_does_not_run_once_the_lease_ran_out_and_a_peer_took_the_work() -> None:
    """A process stopped past its lease (SIGSTOP, a frozen VM) and then resumed ran its next
    step's function, an external effect, though a peer had taken the work over (and ran the
    step itself); only the record that followed was refused."""
    ran: list[str] = []
    holder: dict[str, Any] = {}

    async def stopped_past_the_lease() -> None:
        rt = holder["rt"]
        for claim in rt.coordinator._claims.values():
            claim.lease.valid_until = 0.0  # as a stop longer than the lease leaves it
        await rt.store.expire_owners([rt.coordinator.owner])
        assert len(await rt.store.claim("peer", 30.0, 1)) == 1  # a peer takes the work

    @hearth.tool(durable=True)
    async def pay(ctx: hearth.ToolContext) -> str:
        """Pay in two steps."""
        await ctx.step.do("reserve", lambda: ran.append("reserve"))
        await stopped_past_the_lease()
        await ctx.step.do("charge", lambda: ran.append("charge"))
        return "paid"

    def payer(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/payer")
        ctx.use_tool(pay)
        return "Pay."

    model = ScriptedModel("payer", [calls(call("pay")), reply("done")])
    app = hearth.App([hearth.Agent(payer, name="payer")], db="memory", providers=[model])
    async with app.run() as rt:
        holder["rt"] = rt
        receipt = await rt.dispatch("payer", "c", "pay")
        async with asyncio.timeout(10):
            while rt.coordinator.running or not ran:
                await asyncio.sleep(0.01)
        assert ran == ["reserve"]
        row = await rt.submission(receipt.submission_id)
        assert (row.lease_owner, row.attempt) == ("peer", 2)


async def test_on_sqlite_work_held_by_any_other_owner_is_taken_at_start(tmp_path: Path) -> None:
    """An owner id of an earlier release (``host:boot:pid:start``, no PID namespace) proves
    nothing by itself: after an upgrade, the work a killed server of that release held waited
    the whole lease. The file's lock proves that no other process has it."""
    app = hearth.App(
        [echo_agent()],
        db=str(tmp_path / "h.db"),
        providers=[ScriptedModel("echo", [reply("recovered")])],
        lease_s=3600,
        scan_s=3600,
    )
    async with app.run() as rt:
        await rt.coordinator.stop()
        admission = await rt.store.admit(
            NewSubmission(
                conversation_id="echo/c", agent="echo", kind="message", payload={"message": "hi"}
            )
        )
        legacy = f"{this_host()}:some-boot:4242:123456"  # the earlier releases' form
        (claimed,) = await rt.store.claim(legacy, lease_s=3600, limit=1)
        assert claimed.attempt == 1
    async with app.run() as rt:
        reply_ = await rt.read(admission.submission.id, timeout=10)  # not after an hour
    assert reply_.text == "recovered"


async def test_an_aborted_queued_submission_settles_while_every_worker_is_busy(
    tmp_path: Path,
) -> None:
    """Queued work that an abort stamped waited for a free worker: with every worker held by
    long work, it stayed queued (and its read timed out), where it settles at once, with no
    model work."""
    app, model = holding_app(str(tmp_path / "h.db"), workers=2)
    async with app.run() as rt:
        busy = [await rt.dispatch("holding", f"busy{i}", "go") for i in range(2)]
        while rt.coordinator.running < 2:
            await asyncio.sleep(0.02)
        queued = await rt.dispatch("holding", "queued", "go")
        assert (await rt.abort("holding", "queued")).aborted
        done = await rt.wait_settled(queued.submission_id, timeout=10)
        assert done.outcome == "aborted"
        assert len(model.requests) == 2  # the busy ones' turns only
        for receipt in busy:
            assert (await rt.submission(receipt.submission_id)).status == "running"
            await rt.abort("holding", receipt.conversation_id.split("/")[1])


def holding_app(db: str, **settings: Any) -> tuple[hearth.App, ScriptedModel]:
    """An agent whose one tool holds its worker for a minute, and its model."""

    @hearth.tool
    async def hold() -> str:
        """Hold a worker."""
        await asyncio.sleep(60)
        return "held"

    def holding(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/holding")
        ctx.use_tool(hold)
        return ""

    model = ScriptedModel("holding", [calls(call("hold")), reply("done")], repeat_last=True)
    agent = hearth.Agent(holding, name="holding")
    return hearth.App([agent], db=db, providers=[model], **settings), model


async def test_every_queued_message_of_an_aborted_conversation_settles_while_workers_are_busy(
    tmp_path: Path,
) -> None:
    """Only the first queued message settled at once; each next one, the conversation's new
    head, waited for the next scan (15 s each; 60 s here)."""
    app, _ = holding_app(str(tmp_path / "h.db"), workers=1, scan_s=60)
    async with app.run() as rt:
        busy = await rt.dispatch("holding", "busy", "go")
        while rt.coordinator.running < 1:
            await asyncio.sleep(0.02)
        queued = [await rt.dispatch("holding", "b", f"m{i}") for i in range(3)]
        assert (await rt.abort("holding", "b")).aborted
        for receipt in queued:
            done = await rt.wait_settled(receipt.submission_id, timeout=10)
            assert done.outcome == "aborted"
        assert (await rt.submission(busy.submission_id)).status == "running"
        await rt.abort("holding", "busy")


async def test_a_claim_that_a_stop_overtakes_gives_back_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that cancelled the claim loop while its claim ran lost what the claim took: the
    rows stayed running under this owner's lease, and a peer waited the lease out."""
    from hearth.store.sqlite import SQLiteStore

    claim = SQLiteStore.claim
    claimed = asyncio.Event()

    async def slow_claim(self: SQLiteStore, *args: Any, **kwargs: Any) -> list[Submission]:
        taken = await claim(self, *args, **kwargs)
        if taken:
            claimed.set()
            await asyncio.sleep(0.5)  # its answer on its way while the stop comes
        return taken

    monkeypatch.setattr(SQLiteStore, "claim", slow_claim)
    db = str(tmp_path / "h.db")
    async with holding_app(db)[0].run() as rt:
        receipt = await rt.dispatch("holding", "c", "go")
        await claimed.wait()
    monkeypatch.setattr(SQLiteStore, "claim", claim)
    store = SQLiteStore(db)
    await store.open()
    try:
        row = await store.get_submission(receipt.submission_id)
    finally:
        await store.close()
    assert row is not None and (row.lease_owner, row.releases) == (None, 1)  # given back
