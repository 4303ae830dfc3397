"""The runtime on PostgreSQL, in one process: what it learns from other processes' writes."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pgcluster import Cluster

import hearth
from hearth.errors import StoreUnavailable
from hearth.providers.openai import OpenAIProvider
from hearth.runtime.coordinator import Coordinator
from hearth.store import NewSubmission, open_store, postgres_tx
from hearth.store import postgres_ops as pg_ops
from hearth.store.postgres import PostgresStore
from hearth.testing import ScriptedModel, call, calls, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def echo_agent() -> hearth.Agent:
    def echo(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/echo")
        return ""

    return hearth.Agent(echo, name="echo")


def app_on(url: str, **settings: float) -> hearth.App:
    model = ScriptedModel("echo", [reply("heard")], repeat_last=True)
    return hearth.App([echo_agent()], db=url, providers=[model], **settings)  # type: ignore[arg-type]


async def admit_elsewhere(url: str, conversation_id: str) -> str:
    """Admit through a second store handle, as another process would: no in-process wake-up."""
    other = open_store(url)
    await other.open()
    try:
        new = NewSubmission(conversation_id, "echo", "message", {"message": "hi"})
        return (await other.admit(new)).submission.id
    finally:
        await other.close()


async def test_work_admitted_elsewhere_is_claimed_through_the_listener(
    pg_cluster: Cluster,
) -> None:
    url = pg_cluster.url()
    async with app_on(url, scan_s=60, lease_s=90, heartbeat_s=30).run() as rt:
        sid = await admit_elsewhere(url, "echo/pushed")
        done = await rt.wait_settled(sid, timeout=10)  # far sooner than the 60 s scan
        assert done.outcome == "completed"


async def test_while_the_listener_is_down_polling_keeps_work_moving(pg_cluster: Cluster) -> None:
    url = pg_cluster.url()
    async with app_on(url, scan_s=0.5).run() as rt:
        assert isinstance(rt.store, PostgresStore)
        await rt.store._listener.stop()  # type: ignore[union-attr]  # no push from now on
        sid = await admit_elsewhere(url, "echo/polled")
        done = await rt.wait_settled(sid, timeout=10)
        assert done.outcome == "completed"


async def test_a_read_after_dispatch_hears_a_peers_settlement_or_looks_for_it(
    pg_cluster: Cluster,
) -> None:
    """A read of a submission this process just admitted skips the first read of its row; a
    settlement written by another process still reaches it: by its notification, or, with the
    notification lost, by the shared look at waited rows."""
    url = pg_cluster.url()
    async with app_on(url, scan_s=0.2).run() as front, app_on(url, scan_s=0.2).run() as worker:
        await front.coordinator.stop()  # this one only admits and reads; the other one runs
        receipt = await front.dispatch("echo", "heard", "hi")
        done = await front.read(receipt, timeout=10)
        assert done.text == "heard"
        assert isinstance(front.store, PostgresStore)
        await front.store._listener.stop()  # type: ignore[union-attr]  # notifications are lost
        receipt = await front.dispatch("echo", "looked", "hi")
        done = await front.read(receipt, timeout=10)
        assert done.text == "heard"
        assert front.settled_looks.looks >= 1
        assert worker.env.metrics.settled_by_outcome.get("completed", 0) == 2


async def test_in_a_rolling_redeploy_the_older_release_leaves_a_new_agents_work_alone(
    pg_cluster: Cluster,
) -> None:
    """A process of the older release claimed some of the new agent's submissions and settled
    them ``agent_missing`` (9 of 20 in one run), though a process that declares it was up."""

    def agent(name: str) -> hearth.Agent:
        def render(ctx: hearth.AgentContext) -> str:
            ctx.use_model("scripted/m")
            return ""

        return hearth.Agent(render, name=name)

    def release(*names: str) -> hearth.App:
        model = ScriptedModel("m", [reply("ok")], repeat_last=True)
        return hearth.App([agent(n) for n in names], db=url, providers=[model])

    url = pg_cluster.url()
    async with release("support").run(), release("support", "billing").run() as rt_new:
        receipts = [await rt_new.dispatch("billing", f"b{i}", "invoice?") for i in range(20)]
        outcomes = [(await rt_new.read(r, timeout=30)).outcome for r in receipts]
    assert outcomes == ["completed"] * 20


async def test_a_database_clock_set_back_is_followed_at_the_next_claim(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The process's estimate of the database's clock stayed where it was for 30 s after the
    clock was set back (and never went back): every submission claimed meanwhile had its
    deadline, stamped by the corrected clock, taken for passed, and failed ``timeout`` at once."""

    @hearth.agent(durability=hearth.Durability(timeout=120))
    def timed(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/echo")
        return ""

    model = ScriptedModel("echo", [reply("heard")], repeat_last=True)
    async with hearth.App([timed], db=pg_cluster.url(), providers=[model]).run() as rt:
        await rt.read(await rt.dispatch("timed", "warm", "hi"), timeout=10)
        store = rt.store
        assert isinstance(store, PostgresStore)
        right = await store.now()
        # As if the database's clock had been 10 minutes ahead when it was last read, and was
        # then set right: what this process believes is 10 minutes ahead of it.
        assert store._skew is not None
        store._skew = (store._skew[0] + 600, store._skew[1])
        assert await store.now() > right + 590
        answer = await rt.read(await rt.dispatch("timed", "c", "hi"), timeout=10)
        assert answer.outcome == "completed"
        assert abs(await store.now() - (right + 0)) < 60  # following the database again
    assert "moved -600" in caplog.text or "moved -599" in caplog.text, caplog.text


def long_step_app(
    url: str, on_stop: Callable[[], Awaitable[None]], **settings: float
) -> tuple[hearth.App, ScriptedModel]:
    """An agent whose one tool runs a step of a minute, calling ``on_stop`` when it is stopped,
    and the model that asks for it."""

    @hearth.tool(durable=True)
    async def slow(ctx: hearth.ToolContext) -> str:
        """A long step."""

        async def work() -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await on_stop()
                raise
            return "done"

        return str(await ctx.step.do("work", work))

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/s")
        ctx.use_tool(slow)
        return ""

    model = ScriptedModel("s", [calls(call("slow")), reply("ok")])
    agent = hearth.Agent(render, name="s")
    app = hearth.App([agent], db=url, providers=[model], scan_s=60, **settings)  # type: ignore[arg-type]
    return app, model


async def test_an_owner_whose_renewals_stop_reaching_the_database_stops_its_attempt_in_time(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """An owner cut off from the database (its renewals hanging) ran its attempt on past its
    lease, while a peer took the work over and ran the same step again (14 s of both, in a
    hunt with a blackholing proxy). It stops the attempt before the lease runs out."""
    stopped: dict[str, float] = {}

    async def note_when() -> None:
        stopped["at"] = await rt.store.now()

    app, _ = long_step_app(pg_cluster.url(), note_when, lease_s=10, heartbeat_s=2)
    async with app.run() as rt:
        cut = asyncio.Event()

        async def unanswered(owner: str, lease_s: float) -> list[Any]:
            await cut.wait()  # a database that never answers
            return []

        rt.store.renew_all = unanswered  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="hearth.coordinator"):
            receipt = await rt.dispatch("s", "c", "go")
            for _ in range(3000):
                if "at" in stopped:
                    break
                await asyncio.sleep(0.01)
            row = await rt.submission(receipt.submission_id)
        assert "at" in stopped, "the attempt ran on with no renewal reaching the database"
        assert row.lease_expires_at is not None and stopped["at"] < row.lease_expires_at
        assert "stopping its attempt before the lease runs out" in caplog.text
        cut.set()


async def take_over_once_it_runs(rt: hearth.Runtime, model: ScriptedModel) -> None:
    """Dispatch the long step's work and, once its model was asked, answer every renewal at
    once without this owner's leases: a peer took the work over."""

    async def taken_over(owner: str, lease_s: float) -> list[Any]:
        return []

    await rt.dispatch("s", "c", "go")
    for _ in range(500):
        if model.requests:
            break
        await asyncio.sleep(0.01)
    rt.store.renew_all = taken_over  # type: ignore[method-assign]


async def test_a_lease_the_database_says_is_gone_is_reported_lost_not_unrenewed(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """When the lease watch's last renewal is answered without this owner's claim (a peer took
    it over while this process stood still), the attempt stops as one whose lease was lost: it
    was reported as a renewal that never reached the database, which sent readers of the log
    looking for a network fault."""
    stopped = asyncio.Event()

    async def note() -> None:
        stopped.set()

    # The watch judges a fifth of the lease (1 s) before it ends; the heartbeat comes later.
    app, model = long_step_app(pg_cluster.url(), note, lease_s=5, heartbeat_s=4.9)
    async with app.run() as rt:
        with caplog.at_level(logging.WARNING, logger="hearth.coordinator"):
            await take_over_once_it_runs(rt, model)
            await asyncio.wait_for(stopped.wait(), 20)
        assert "lost the lease of" in caplog.text
        assert "reached the database" not in caplog.text


async def test_a_lease_lost_to_both_the_heartbeat_and_the_lease_watch_is_reported_once(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat and the lease watch each found the lease gone and asked whether the
    attempt had ended meanwhile; both were answered no, and both reported it: each lost lease
    was logged twice (a hunt's owner, stopped past its lease and continued)."""
    stopped = asyncio.Event()

    async def note() -> None:
        stopped.set()

    async def slow_to_answer(self: Any, claim: Any) -> bool:
        await asyncio.sleep(4)  # the other loop comes to the same claim meanwhile
        return False

    app, model = long_step_app(pg_cluster.url(), note, lease_s=5, heartbeat_s=1)
    async with app.run() as rt:
        with caplog.at_level(logging.WARNING, logger="hearth.coordinator"):
            monkeypatch.setattr(Coordinator, "_ended_by_this_attempt", slow_to_answer)
            await take_over_once_it_runs(rt, model)
            await asyncio.wait_for(stopped.wait(), 20)
            await asyncio.sleep(4)  # the later of the two answers
        assert caplog.text.count("lost the lease of") == 1, caplog.text


async def test_two_runtimes_of_one_process_keep_apart_the_leases_they_hold(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Two runtimes running in one process on one database took one owner id: each renewed the
    other's leases, then gave them back as strays, and the other stopped its attempts as lost
    (every tool call interrupted, run again by a later attempt). Each owns apart now."""
    ran: list[str] = []

    @hearth.tool(durable=True)
    async def work(tag: str, ctx: hearth.ToolContext) -> str:
        """Work a while."""
        ran.append(tag)
        await ctx.step.do("wait", lambda: asyncio.sleep(2.5))
        return f"done {tag}"

    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/w")
        ctx.use_tool(work)
        return ""

    def script(request: Any) -> Any:
        turns = sum(type(m).__name__ == "AssistantTurn" for m in request.messages)
        return calls(call("work", tag="x")) if turns == 0 else reply("ok")

    url = pg_cluster.url()

    def app() -> hearth.App:
        model = ScriptedModel("w", script)
        agent = hearth.Agent(render, name="w")
        return hearth.App(
            [agent],
            db=url,
            providers=[model],
            heartbeat_s=0.3,
            lease_s=1.5,
            scan_s=0.3,
        )  # type: ignore[arg-type]

    with caplog.at_level(logging.WARNING, logger="hearth"):
        async with app().run() as one, app().run() as two:
            assert one.owner != two.owner and two.owner.startswith(one.owner)
            receipts = [
                await (one if i % 2 else two).dispatch("w", f"c{i}", "go") for i in range(4)
            ]
            for receipt in receipts:
                assert (await one.read(receipt, timeout=30)).outcome == "completed"
                assert (await one.submission(receipt.submission_id)).attempt == 1
    assert len(ran) == 4
    assert "lost the lease" not in caplog.text


async def test_starts_given_up_on_leave_no_connection_open(pg_cluster: Cluster) -> None:
    """``app.run()`` given up on while its store opened (a task cancelled during start-up, a
    Ctrl-C) left the pool's and the listener's connections open for the process's life."""
    query = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    before = int(pg_cluster.sql(query))
    url = pg_cluster.url()

    async def serve() -> None:
        async with app_on(url).run():
            await asyncio.sleep(3600)

    began = asyncio.get_running_loop().time()
    async with app_on(url).run():
        start_s = asyncio.get_running_loop().time() - began
    pauses = random.Random(2)
    for _ in range(40):
        running = asyncio.create_task(serve())
        # Cancelled anywhere in its start (opening, migrating, claiming) and just after.
        await asyncio.sleep(pauses.random() * start_s * 1.5)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    for _ in range(100):
        if int(pg_cluster.sql(query)) <= before:
            break
        await asyncio.sleep(0.1)
    assert int(pg_cluster.sql(query)) <= before


async def test_a_read_cancelled_as_the_pool_hands_it_a_connection_ends_cancelled(
    pg_cluster: Cluster,
) -> None:
    """Python 3.11's ``asyncio.wait_for``, which psycopg's pool waits with, drops a cancellation
    that arrives just as the connection is handed over: a start cancelled there went on, and
    whoever cancelled it (a Ctrl-C, a timeout) waited for ever (a hang in CI)."""
    store = open_store(pg_cluster.url(), pg_pool=1)
    await store.open()
    try:
        assert isinstance(store, PostgresStore)
        pool = store._tx().pool
        held = await pool.getconn()
        reading = asyncio.create_task(store.get_submission("s_missing"))
        waiting: asyncio.Task[Any] | None = None
        for _ in range(200):  # the reader queues in the pool: its wait is a task of its own
            await asyncio.sleep(0.01)
            waiting = next(
                (t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Condition.wait"),
                None,
            )
            if waiting is not None:
                break
        assert waiting is not None
        # Cancelled once the wait has ended, before the reader has run again: the moment
        # ``wait_for`` takes for "the connection came first".
        waiting.add_done_callback(lambda _: reading.cancel())
        await pool.putconn(held)
        with pytest.raises(asyncio.CancelledError):
            await reading
        async with pool.connection(timeout=2):  # the connection it was handed went back
            pass
    finally:
        await store.close()


async def test_a_runtime_that_stops_leaves_the_app_s_providers_to_its_other_runtime(
    pg_cluster: Cluster,
) -> None:
    """Two runtimes of one app (two tasks serving one database) share its providers: the first
    to stop closed the HTTP client the other was streaming its model's answers on."""
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="k")
    app = hearth.App([echo_agent()], db=pg_cluster.url(), providers=[provider])
    async with app.run():
        async with app.run():
            client = provider._client.get()
        assert not client.is_closed
    assert client.is_closed  # the last runtime to stop closes it


async def test_a_store_close_that_raises_still_ends_the_runtime_s_share_of_the_providers(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose store failed to close was still counted as running: the app's providers
    were never closed after it, nor after any later runtime."""
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="k")
    app = hearth.App([echo_agent()], db=pg_cluster.url(), providers=[provider])
    close = PostgresStore.close

    async def failing_close(self: PostgresStore) -> None:
        await close(self)
        raise StoreUnavailable("the database went away during close")

    monkeypatch.setattr(PostgresStore, "close", failing_close)
    with pytest.raises(StoreUnavailable):
        async with app.run():
            client = provider._client.get()
    assert client.is_closed
    monkeypatch.setattr(PostgresStore, "close", close)
    async with app.run():
        client = provider._client.get()
    assert client.is_closed


async def test_a_write_whose_caller_was_cancelled_is_still_announced(pg_cluster: Cluster) -> None:
    """A dispatch (a resolve) cancelled as its statement committed was stored, but
    nobody heard of it: the work waited for the next scan, 15 s. What the try wrote is now
    announced as hints, each read back (a settled row too: its waiters read it)."""
    from hearth.store.events import ABORT, ADMITTED, SETTLED, Event

    store = open_store(pg_cluster.url())
    await store.open()
    heard: list[Event] = []
    stop = store.events.listen(heard.append)
    try:
        assert isinstance(store, PostgresStore)
        started = asyncio.Event()

        async def work(conn: Any, outbox: list[Event]) -> None:
            outbox.append(Event(ADMITTED, "echo/c-1", submission_id="s_1"))
            outbox.append(Event(SETTLED, "echo/c-0", submission_id="s_0", attempt=3))
            # Not an abort: heard, it would interrupt running work at once, which (the stamp
            # rolled back) then went on with its interrupted calls run again.
            outbox.append(Event(ABORT, "echo/c-2"))
            started.set()
            await asyncio.sleep(3600)  # the statement, whose answer the cancel overtakes

        writing = asyncio.create_task(store._tx().write_once(work, budget_s=5, resolve=work))
        await started.wait()
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
    finally:
        stop()
        await store.close()
    assert [(e.kind, e.submission_id, e.attempt, e.row) for e in heard] == [
        (ADMITTED, "s_1", 0, None),
        (SETTLED, "s_0", 0, None),
    ]


async def abort_given_up(
    rt: hearth.Runtime, running: asyncio.Event, aborting: list[asyncio.Task[Any]]
) -> hearth.Receipt:
    """Dispatch the long step's work, and once it runs, an abort its caller gives up on (the
    test's patches cancel ``aborting[0]``): the receipt."""
    receipt = await rt.dispatch("s", "c-1", "go")
    await running.wait()
    aborting.append(asyncio.create_task(rt.abort("s", "c-1")))
    with pytest.raises(asyncio.CancelledError):
        await aborting[0]
    return receipt


async def test_an_abort_cancelled_as_it_committed_stops_this_process_s_work_at_once(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``rt.abort`` whose caller gave up on it (an ``asyncio.timeout``) just as its stamp
    committed: the peers heard the commit's notification, but this process, which ran the
    conversation's work, heard of it only at its next heartbeat (3.5-9.7 s in a hunt; 30 s
    here). The stamp is read back."""
    running, stopped = asyncio.Event(), asyncio.Event()

    async def on_stop() -> None:
        stopped.set()

    app, _ = long_step_app(pg_cluster.url(), on_stop, lease_s=90, heartbeat_s=30)
    stamping: list[asyncio.Task[Any] | None] = []
    aborting: list[asyncio.Task[Any]] = []
    stamp, reached = pg_ops.request_abort, hearth._faults.reached

    async def noted_stamp(*args: Any, **kwargs: Any) -> list[str]:
        ids = await stamp(*args, **kwargs)
        stamping.append(asyncio.current_task())  # the try that commits it
        return ids

    def cancel_once_committed(point: str) -> None:
        reached(point)
        if point == "step:work":
            running.set()
        if point == "store:commit-done" and stamping and asyncio.current_task() is stamping[0]:
            stamping.clear()
            aborting[0].cancel()  # its commit is done; its caller has not heard of it

    monkeypatch.setattr(pg_ops, "request_abort", noted_stamp)
    monkeypatch.setattr(hearth._faults, "reached", cancel_once_committed)
    async with app.run() as rt:
        receipt = await abort_given_up(rt, running, aborting)
        async with asyncio.timeout(5):  # far sooner than the heartbeat
            await stopped.wait()
            done = await rt.wait_settled(receipt.submission_id, timeout=5)
    assert done.outcome == "aborted"


async def test_an_abort_cancelled_before_it_committed_leaves_the_work_running(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-back of a cancelled abort finds no stamp when its transaction rolled back: the
    running work is not interrupted (interrupted, it went on and ran its calls again)."""
    running, stopped = asyncio.Event(), asyncio.Event()

    async def on_stop() -> None:
        stopped.set()

    app, _ = long_step_app(pg_cluster.url(), on_stop, lease_s=90, heartbeat_s=30)
    stamp, reached = pg_ops.request_abort, hearth._faults.reached
    cancel = [True]
    aborting: list[asyncio.Task[Any]] = []

    async def cancelled_stamp(*args: Any, **kwargs: Any) -> list[str]:
        ids = await stamp(*args, **kwargs)
        if cancel:
            cancel.clear()
            # Heard at the next statement, before the COMMIT: the stamp rolls back, and what
            # the try would announce (the abort) is in its outbox.
            aborting[0].cancel()
        return ids

    def noted(point: str) -> None:
        reached(point)
        if point == "step:work":
            running.set()

    monkeypatch.setattr(pg_ops, "request_abort", cancelled_stamp)
    monkeypatch.setattr(hearth._faults, "reached", noted)
    async with app.run() as rt:
        receipt = await abort_given_up(rt, running, aborting)
        await asyncio.sleep(sum(postgres_tx.ABORT_READ_BACK_S) + 0.5)  # the read-back is done
        assert not stopped.is_set()
        assert (await rt.store.get_submission(receipt.submission_id)).status == "running"
        assert (await rt.abort("s", "c-1")).aborted  # now it is
        done = await rt.wait_settled(receipt.submission_id, timeout=5)
    assert done.outcome == "aborted" and stopped.is_set()


async def test_a_dispatch_cancelled_as_it_was_admitted_starts_at_once(pg_cluster: Cluster) -> None:
    """Cancelled while its statement ran (an ``asyncio.timeout``, a client gone), a dispatch
    was admitted all the same, but nothing claimed it until the next scan (60 s here)."""
    async with app_on(pg_cluster.url(), scan_s=60).run() as rt:
        await rt.read(await rt.dispatch("echo", "warm", "hi"), timeout=10)
        for i in range(50):
            await rt.settle_all()
            await asyncio.sleep(0.2)  # the claim loop is idle: only an event wakes it
            key = f"k{i}"
            sending = asyncio.create_task(rt.dispatch("echo", f"c{i}", "hi", idempotency_key=key))
            await asyncio.sleep(0)  # it waits for its INSERT now
            sending.cancel()
            try:
                await sending
                continue
            except asyncio.CancelledError:
                pass
            again = await rt.dispatch("echo", f"c{i}", "hi", idempotency_key=key)
            if again.deduplicated:  # the cancelled one was admitted
                done = await rt.wait_settled(again.submission_id, timeout=10)
                assert done.outcome == "completed"
                return
        pytest.fail("no cancelled dispatch was admitted in 50 tries")
