"""The coordinator: claims runnable submissions, holds their leases, and lets go.

It knows nothing of prompts or tools: it claims, supervises one ``Attempt`` per claim (deadline
timer, abort, lost lease, shutdown), renews its leases by heartbeat, and scans for work whose owner
is gone. It learns of new work and of aborts from the store's events (``admitted``, ``released``,
``settled``, ``abort``), wherever they were written, and polls at ``scan_s`` in case one is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hearth import _faults, logs, telemetry
from hearth._tasks import cancel_and_wait
from hearth.config import Settings
from hearth.errors import FencedOut, StoreUnavailable, app_failure
from hearth.runtime.env import Env
from hearth.runtime.owner import is_dead_local, owner_ids
from hearth.runtime.runner import Attempt
from hearth.runtime.scope import Lease
from hearth.store.base import LIST_LIMIT, WAITING, Fence, Held, Submission
from hearth.store.events import ABORT, APPENDED, SETTLED, Event

log = logging.getLogger("hearth.coordinator")
# Marks the log line of an exception the runtime did not expect (a bug), in an attempt or while
# claiming; crash harnesses fail a run that logs it.
UNEXPECTED = "hearth: unexpected exception"
# How long a submission of an agent this process does not declare is left to processes that do
# (a newer release's, during a rolling redeploy) before this one takes it: to settle it
# ``agent_missing`` when no process declares it any more. (Claim loops look again at least every
# ``scan_s``.)
OTHER_AGENTS_AFTER_S = 300.0
BUG_PAUSE_S = 1.0  # the pause before retrying an attempt that a bug of hearth's ended, doubled
LATE_RELEASE_S = 2.0  # how long a shutdown waits for the releases of work that ran past it
# The share of ``shutdown_s`` that running work has to wind down in a stop: giving back what has
# not, closing the store and the process's exit have the rest, so ``hearth serve``'s watchdog (at
# ``shutdown_s``) never ends a release half done.
STOP_SHARE = 0.8
# On a store shared with other processes, an attempt is stopped this long (at most; a fifth of a
# short lease) before its lease could run out unrenewed, so that it has stopped before a peer may
# take the work over; half of it goes to one last try at renewing.
LEASE_MARGIN_S = 2.0
# How many aborted queued submissions one claim takes past the workers' limit (each settles at
# once, with no model work); more are taken at the next claim.
ABORTED_PAST_CAPACITY = 16


@dataclass
class _Claim:
    sub: Submission
    lease: Lease
    work: asyncio.Task[None] | None = None
    reason: str | None = None  # why the work was cancelled: abort | deadline | lost | shutdown
    settled: bool = False  # its settlement committed: a renewal that skips it lost nothing

    @property
    def working(self) -> bool:
        """Its attempt runs: not interrupted, not settled, its work not ended."""
        return (
            self.reason is None
            and not self.settled
            and self.work is not None
            and not self.work.done()
        )

    def interrupt(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.work is not None and not self.work.done():
            self.work.cancel()


class Coordinator:
    def __init__(self, env: Env, settings: Settings, owner: str | None = None) -> None:
        self.env = env
        self.store = env.store
        self.settings = settings
        self.owner = owner or owner_ids.take(self)
        self._claims: dict[str, _Claim] = {}
        self._strays: set[Fence] = set()  # leases renewed at the last beat with no claim here
        self._supervisors: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        # An abort was stamped (heard, or a scan is due): queued work it aborted is taken even
        # when every worker is busy, since it settles at once with no model work.
        self._aborts_heard = True
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._unlisten: Callable[[], None] | None = None
        # The earliest expiry of a pending durable wait (store clock), learnt at each scan and
        # from the attempts that pause here: the claim loop wakes for it, so no task per wait.
        self._next_expiry: float | None = None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Reconcile first (work of dead local owners is taken over at once), then claim."""
        self._unlisten = self.store.events.listen(self._on_event)
        await self.reconcile(starting=True)
        self._next_expiry = await self.store.next_wait_expiry()
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="hearth-claims"),
            asyncio.create_task(self._heartbeat_loop(), name="hearth-heartbeat"),
        ]
        if self.store.shared:
            self._tasks.append(asyncio.create_task(self._lease_watch(), name="hearth-leases"))

    async def stop(self) -> None:
        """Interrupt running work without settling it, release its leases, stop claiming: work
        that has not wound down by ``STOP_SHARE`` of ``shutdown_s`` is given back anyway, well
        before ``shutdown_s``. Its owner id is then free for a runtime started later."""
        try:
            await self._stop()
        finally:
            owner_ids.give_back(self.owner, self)

    async def _stop(self) -> None:
        self._stopping = True
        if self._unlisten is not None:
            self._unlisten()
        for task in self._tasks:
            task.cancel()
        for claim in list(self._claims.values()):
            claim.interrupt("shutdown")
        limit = self.settings.shutdown_s
        # Work winds down for STOP_SHARE of the limit; two thirds of the rest are kept for
        # giving back what has not by then (two waits of ``release_s`` at most), the last third
        # for closing the store before the process must be gone.
        release_s = min(LATE_RELEASE_S, limit * (1 - STOP_SHARE) / 3)
        pending = [t for t in self._supervisors if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=limit * STOP_SHARE)
            for t in late:
                t.cancel()  # each gives its lease back now, its work still winding down
            if late:
                _, stuck = await asyncio.wait(late, timeout=release_s)
                if stuck:
                    # Their releases did not get through in time: given back from here (what
                    # is left of their work is fenced out), never left for a lease to expire.
                    await self._release_all(release_s)
        for task in self._tasks:
            await cancel_and_wait(task)

    async def _release_all(self, timeout: float) -> None:
        """Give back every claim still held, together, for at most ``timeout`` seconds."""
        releases = [
            asyncio.ensure_future(self._release(c.sub, graceful=True))
            for c in list(self._claims.values())
        ]
        if not releases:
            return
        _, unfinished = await asyncio.wait(releases, timeout=timeout)
        for release in unfinished:
            release.cancel()
        await asyncio.gather(*releases, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> int:
        return len(self._claims)

    def _on_event(self, event: Event) -> None:
        if event.kind == APPENDED:
            return
        if event.kind == SETTLED and event.submission_id is not None:
            claim = self._claims.get(event.submission_id)
            if claim is not None and event.attempt == claim.sub.attempt:
                claim.settled = True  # by this very claim (a peer's settlement means it was lost)
        elif event.kind == ABORT:
            self._aborts_heard = True
            # This process's running work of the conversation stops; it then settles aborted.
            for claim in self._claims.values():
                if claim.sub.conversation_id == event.conversation_id:
                    claim.interrupt("abort")
        self.wake()  # admitted, released, settled: there may be work to claim

    # --- loops ----------------------------------------------------------------------------
    async def reconcile(self, *, starting: bool = False) -> None:
        owners = await self.store.lease_owners()
        if starting and not self.store.shared:
            # One process owns a SQLite file (its lock proves it): whoever else holds a lease
            # in it has ended, an owner of an earlier release too, whose id (without its PID
            # namespace) proves nothing by itself: after an upgrade its work waited the lease.
            dead = [o for o in owners if o != self.owner]
        else:
            dead = [o for o in owners if o != self.owner and is_dead_local(o)]
        if dead:
            _faults.reached("before:store.expire_owners")
            n = await self.store.expire_owners(dead)
            _faults.reached("after:store.expire_owners")
            log.info("took over %d submissions of %d dead local owner(s)", n, len(dead))

    async def _claim_loop(self) -> None:
        last_scan = time.monotonic()
        while not self._stopping:
            self._wake.clear()
            try:
                await self._expire_waits()
                await self._claim_some()
            except StoreUnavailable as exc:
                log.warning("cannot claim work: %s; retrying", exc)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("%s while claiming; retrying", UNEXPECTED)
                await asyncio.sleep(0.5)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(await self._idle_s()):
                    await self._wake.wait()
            if time.monotonic() - last_scan >= self.settings.scan_s:
                last_scan = time.monotonic()
                self._aborts_heard = True  # (one whose notice was lost)
                with contextlib.suppress(Exception):
                    await self.reconcile()
                with contextlib.suppress(Exception):
                    self._next_expiry = await self.store.next_wait_expiry()

    async def _idle_s(self) -> float:
        """How long the claim loop may sleep: until the next scan, or the next wait's expiry."""
        idle = self.settings.scan_s
        if self._next_expiry is not None:
            with contextlib.suppress(Exception):
                idle = min(idle, max(0.0, self._next_expiry - await self.store.now()) + 0.01)
        return idle

    async def _expire_waits(self) -> None:
        """End the durable waits whose timeout has passed: their submissions are queued again."""
        due = self._next_expiry
        if due is None or due > await self.store.now():
            return
        while True:
            _faults.reached("before:wait_resolved")
            _faults.reached("before:store.expire_waits")
            ended = await self.store.expire_waits(LIST_LIMIT)
            _faults.reached("after:store.expire_waits")
            _faults.reached("after:wait_resolved")
            if len(ended) < LIST_LIMIT:
                break
        self._next_expiry = await self.store.next_wait_expiry()

    def _note_expiry(self, expiry: float | None) -> None:
        if expiry is not None and (self._next_expiry is None or expiry < self._next_expiry):
            self._next_expiry = expiry

    async def _claim_some(self) -> None:
        if self._stopping:
            return
        capacity = self.settings.workers - len(self._claims)
        aborting_only = capacity <= 0
        if aborting_only:
            if not self._aborts_heard:
                return
            self._aborts_heard = False
            capacity = ABORTED_PAST_CAPACITY
        busy = [c.sub.conversation_id for c in self._claims.values()]
        sent = time.monotonic()

        async def claim_bracketed() -> list[Submission]:  # (its own task: a stop cannot cut it)
            _faults.reached("before:store.claim")
            taken = await self.store.claim(
                self.owner,
                self.settings.lease_s,
                capacity,
                exclude_conversations=busy,
                # Shared with other releases: another agent's work goes first to those
                # declaring it.
                agents=list(self.env.agents) if self.store.shared else None,
                others_after=OTHER_AGENTS_AFTER_S,
                aborting_only=aborting_only,
            )
            _faults.reached("after:store.claim")
            return taken

        claiming = asyncio.ensure_future(claim_bracketed())
        try:
            subs = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            await self._give_back_claimed(claiming)
            raise
        if aborting_only and len(subs) == capacity:
            self._aborts_heard = True  # (more may wait: taken at the next turn)
            self.wake()
        for sub in subs:
            claim = _Claim(sub, Lease(sent + self.settings.lease_s))
            self._claims[sub.id] = claim
            task = asyncio.create_task(self._supervise(claim), name=f"hearth-{sub.id}")
            self._supervisors.add(task)
            task.add_done_callback(self._supervisors.discard)

    async def _give_back_claimed(self, claiming: asyncio.Future[list[Submission]]) -> None:
        """The loop was stopped while its claim ran: what the claim took goes back at once
        (it was lost, and a peer waited out its lease)."""
        try:
            async with asyncio.timeout(LATE_RELEASE_S):
                taken = await claiming
        except Exception:  # (the claim failed, or did not end in time: nothing to give back)
            claiming.add_done_callback(_retrieved)
            return
        for sub in taken:
            with contextlib.suppress(Exception):
                await self._release(sub, graceful=True)

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.heartbeat_s)
            claims = list(self._claims.values())  # claimed before the renewal, so judged by it
            if not claims:
                continue
            try:
                _faults.reached("before:store.renew_all")
                sent = time.monotonic()
                renewed = await self.store.renew_all(self.owner, self.settings.lease_s)
                _faults.reached("after:store.renew_all")
            except StoreUnavailable as exc:
                log.warning("cannot renew the leases of %s: %s", self.owner, exc)
                continue
            except Exception:
                log.exception("renewing the leases of %s failed", self.owner)
                continue
            held = self._mark_renewed(claims, renewed, sent)
            # An abort whose notice this process missed (its listener was down, say): without
            # this, the work ran on to its deadline, and the messages queued behind it waited.
            aborting = {h.fence for h in renewed if h.abort_requested}
            for claim in claims:
                if claim.sub.fence in aborting and claim.reason is None:
                    log.info("heard of the abort of %s at a heartbeat", claim.sub.id)
                    claim.interrupt("abort")
                if claim.sub.fence in held or claim.reason is not None:
                    continue
                if claim.settled or (claim.work is not None and claim.work.done()):
                    continue  # it settled (or stopped) between the snapshot and the renewal
                if await self._ended_by_this_attempt(claim) or claim.reason is not None:
                    continue  # (or the lease watch stopped it while the answer came)
                log.warning("lost the lease of %s; stopping its attempt", claim.sub.id)
                claim.interrupt("lost")
            await self._give_back_strays(held)

    async def _lease_watch(self) -> None:
        """Stop each attempt whose lease this process cannot know it still holds: no renewal
        has reached the database for about a lease's length (the network cut, the database not
        answering). Past that a peer may take the work over and run it again; an owner cut
        off went on running its attempts (a step ran 14 s on two owners at once). One last
        renewal is tried first, so that a process that only stood still (SIGSTOP, a frozen VM)
        and finds its leases still its own goes on."""
        margin = min(LEASE_MARGIN_S, self.settings.lease_s / 5)
        while not self._stopping:
            await asyncio.sleep(min(margin, self.settings.heartbeat_s) / 2)
            now = time.monotonic()
            lapsing = [
                c
                for c in self._claims.values()
                if c.working and now >= c.lease.valid_until - margin
            ]
            if not lapsing:
                continue
            held = await self._renewed_within(margin / 2)
            for claim in lapsing:
                if (held is not None and claim.sub.fence in held) or not claim.working:
                    continue
                if held is not None:  # the database answered: the row is not held by us now
                    if await self._ended_by_this_attempt(claim) or not claim.working:
                        continue  # settled or paused (its event not here yet), or stopped
                    log.warning("lost the lease of %s; stopping its attempt", claim.sub.id)
                    claim.interrupt("lost")
                    continue
                log.warning(
                    "no renewal of the lease of %s reached the database for %.0f s; stopping"
                    " its attempt before the lease runs out and another process may take it over",
                    claim.sub.id,
                    time.monotonic() - (claim.lease.valid_until - self.settings.lease_s),
                )
                claim.interrupt("lost")

    async def _renewed_within(self, limit: float) -> set[Fence] | None:
        """The fences whose leases one renewal kept, if it answered within ``limit`` seconds
        (each claim held is marked renewed); None if not. A renewal still waiting is left to
        end by itself: cancelling a query can itself wait seconds for the server."""
        sent = time.monotonic()
        renewing = asyncio.ensure_future(self.store.renew_all(self.owner, self.settings.lease_s))
        done, _ = await asyncio.wait({renewing}, timeout=limit)
        if not done:
            renewing.add_done_callback(_retrieved)
            renewing.cancel()
            return None
        if renewing.exception() is not None:
            return None
        return self._mark_renewed(list(self._claims.values()), renewing.result(), sent)

    def _mark_renewed(self, claims: list[_Claim], renewed: list[Held], sent: float) -> set[Fence]:
        """The fences a renewal sent at ``sent`` (monotonic) kept; each of ``claims`` among
        them knows its lease held for a lease's length from then."""
        held = {h.fence for h in renewed}
        for claim in claims:
            if claim.sub.fence in held:
                claim.lease.renewed(sent, self.settings.lease_s)
        return held

    async def _give_back_strays(self, held: set[Fence]) -> None:
        """Release the leases this owner holds with no attempt here: a release that failed
        (the disk full, the database away) left the row running under this owner, and every
        renewal (all of an owner's leases in one statement) kept it so for as long as other
        work ran here. A stray at two beats running is released (at one, it may be a claim
        that is committed and not yet taken in)."""
        mine = {c.sub.fence for c in self._claims.values()}
        strays = {fence for fence in held if fence not in mine}
        again, self._strays = strays & self._strays, strays - self._strays
        for fence in again:
            log.warning(
                "gave back the lease of %s, which no attempt here held (its release had failed)",
                fence.submission_id,
            )
            with contextlib.suppress(Exception):
                await self.store.release(fence, self.owner)

    async def _settled_by_this_attempt(self, sub: Submission) -> bool:
        """Whether the row is settled under ``sub``'s attempt number (a peer that takes work
        over runs it under the next number)."""
        try:
            row = await self.store.get_submission(sub.id)
        except Exception:
            return False
        return row is not None and row.attempt == sub.attempt and row.outcome is not None

    async def _ended_by_this_attempt(self, claim: _Claim) -> bool:
        """The row's word, for a settlement whose event has not reached this loop yet (a store
        shared by processes may publish it after a renewal committed later), or for an attempt
        that paused for a durable wait (the row waits, or was queued again, under its number)."""
        try:
            row = await self.store.get_submission(claim.sub.id)
        except Exception:
            return True  # cannot tell: the next beat judges it again
        if row is None or row.attempt != claim.sub.attempt:
            return False
        return row.outcome is not None or row.status in (WAITING, "queued")

    # --- one claim ------------------------------------------------------------------------
    async def _release(self, sub: Submission, *, graceful: bool = False) -> None:
        """Give the claim back (every release goes through here, between its kill points); a
        ``graceful`` one (a shutdown's) does not count toward the submission's attempts."""
        _faults.reached("before:store.release")
        await self.store.release(sub.fence, self.owner, graceful=graceful)
        _faults.reached("after:store.release")

    async def _supervise(self, claim: _Claim) -> None:
        sub = claim.sub
        attributes: dict[str, str | int | float | bool] = {
            "hearth.submission_id": sub.id,
            "hearth.conversation_id": sub.conversation_id,
            "hearth.attempt": sub.attempt,
            "hearth.max_attempts": sub.max_attempts,
            "hearth.owner": self.owner,
        }
        # Every attempt, here or in another process after a crash, continues the admission's
        # trace; the ids go on each log line written while it runs.
        parent = telemetry.context_of(sub.traceparent)
        t0 = time.perf_counter()
        with (
            logs.ids(conversation_id=sub.conversation_id, submission_id=sub.id),
            telemetry.span("hearth.attempt", parent=parent, attributes=attributes) as span,
        ):
            try:
                await self._supervise_claim(claim)
            finally:
                if claim.reason is not None:
                    span.set_attribute("hearth.interrupted", claim.reason)
                self.env.metrics.observe_attempt(time.perf_counter() - t0)
                if claim.reason == "abort" or sub.abort_requested_at is not None:
                    # The conversation's next message may be aborted too, now its head: taken
                    # past the workers' limit as well (it waited for the next scan, 15 s each).
                    self._aborts_heard = True
                    self.wake()

    async def _supervise_claim(self, claim: _Claim) -> None:
        sub = claim.sub
        metrics = self.env.metrics
        metrics.running += 1
        if sub.interruptions > 1:  # attempts after a durable wait are not recoveries
            metrics.recoveries += 1
        try:
            attempt = Attempt(self.env, sub, lease=claim.lease)
            claim.work = asyncio.create_task(attempt.run())
            now = await self.store.now()
            remaining = (sub.deadline - now) if sub.deadline is not None else None
            done, _ = await asyncio.wait({claim.work}, timeout=remaining)
            if not done:
                claim.interrupt("deadline")
            try:
                await claim.work
            except asyncio.CancelledError:
                if claim.reason is None:
                    raise
            if attempt.paused:
                self._note_expiry(attempt.next_expiry)
            elif claim.reason in ("abort", "deadline"):
                # The same claim concludes: the classifier now sees the intent or the deadline.
                # It runs as the claim's work, so that a later interrupt (a shutdown) stops it.
                concluding = Attempt(
                    self.env, sub, lease=claim.lease, past_deadline=claim.reason == "deadline"
                )
                claim.work = asyncio.create_task(concluding.run())
                try:
                    await claim.work
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # this supervisor itself is being stopped
                    # Interrupted again (a shutdown): given back; its next attempt concludes.
                    await self._release(sub, graceful=self._stopping)
            elif claim.reason == "shutdown":
                await self._release(sub, graceful=True)
        except FencedOut:
            if claim.settled or await self._settled_by_this_attempt(sub):
                # An abort or a deadline interrupted work whose own settlement had just
                # committed: the concluding run found it settled. Nothing was taken over.
                log.debug("submission %s was already settled by attempt %d", sub.id, sub.attempt)
            else:
                log.warning("submission %s was taken over by another owner", sub.id)
        except asyncio.CancelledError:
            if claim.work is not None:
                claim.work.cancel()
            with contextlib.suppress(Exception):
                # A shutdown that stopped waiting for the work to wind down: still graceful,
                # as every release while this process stops (only its stop cancels this task).
                await self._release(sub, graceful=self._stopping)
            raise
        except StoreUnavailable as exc:  # expected while the database is away: one line
            log.warning("attempt %d of %s stopped: %s; releasing it", sub.attempt, sub.id, exc)
            with contextlib.suppress(Exception):
                await self._release(sub)
        except BaseException as exc:
            if not app_failure(exc):
                raise  # (KeyboardInterrupt, GeneratorExit: on up)
            # Not fenced out, not the store away, not cancelled: a bug in the runtime (or a
            # foreign BaseException that no boundary took for the app's failure). It still
            # releases the work, but says so loudly (crash harnesses fail a run that logs it).
            # A bug that the next attempt meets again (the same records, the same path) would
            # spin through attempts with no pause, for ever if it is on the way to settling:
            # each retry waits longer, up to a minute.
            pause = min(BUG_PAUSE_S * 2 ** min(sub.attempt - 1, 10), 60.0)
            log.exception(
                "%s in attempt %d of %s; releasing it for a retry in %g s",
                UNEXPECTED,
                sub.attempt,
                sub.id,
                pause,
            )
            # The pause is the claim's work now: a shutdown, an abort or a lost lease ends it.
            pausing = asyncio.ensure_future(asyncio.sleep(pause))
            claim.work = pausing
            try:
                await asyncio.wait({pausing})
            finally:
                pausing.cancel()
                with contextlib.suppress(Exception):
                    await self._release(sub)
        finally:
            self._claims.pop(sub.id, None)
            metrics.running -= 1
            self.wake()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take a finished task's exception, so that none is logged as never retrieved."""
    if not task.cancelled():
        task.exception()
