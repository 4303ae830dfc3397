"""The scheduler: admits each occurrence of the app's schedules once, across every process
that shares the store (SPEC §14).

Every schedule has a durable cursor (``Store.open_schedule``): no occurrence at or before it is
admitted, unless the clock was set back past it by more than ``CLOCK_BACK_S``: then the time
this process noticed counts as the cursor, or the schedule would stay silent until the clock
caught up with it (an occurrence admitted twice so is deduplicated by its idempotency key).
An occurrence is admitted together with moving the cursor to it, by compare and
set (``Store.admit_occurrence``), so of several processes that wake for it, one admits it and
the others find the cursor moved. Occurrences missed while no process ran are coalesced into
one catch-up, for the latest of them; a schedule never seen, or whose cron or zone changed,
starts from now.

The clock is the store's (``Store.now()``) — on SQLite the wall clock itself, cron being wall
time — unless a test injects one: the scheduler reads it, nothing else does (leases never see
it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from hearth import _faults
from hearth._tasks import cancel_and_wait
from hearth.errors import ConfigurationError, DelegatedConversation
from hearth.runtime.admission import new_submission, refuse_delegated
from hearth.runtime.env import Env
from hearth.schedules import Schedule, iso
from hearth.store.base import ScheduleCursor

log = logging.getLogger("hearth.scheduler")

TICK_S = 1.0  # the longest sleep between two looks at the clock
INJECTED_TICK_S = 0.05  # an injected clock may jump at any moment: look often
RETRY_S = 1.0  # after a store error
CLOCK_BACK_S = 60.0  # a cursor this far ahead of the clock was set by a clock that was wrong
# A schedule another process keeps under another cron (a newer release's, or a canary's) is
# looked at again this often: fired again when its cron is this process's again, or when an
# occurrence of the other cron has gone unfired for ABANDONED_S (that process is gone: a canary
# rolled back left the schedule firing nowhere).
FOREIGN_LOOK_S = 15.0
ABANDONED_S = 60.0


class Scheduler:
    """One task per process that fires the app's schedules when they are due."""

    def __init__(
        self,
        env: Env,
        schedules: Sequence[Schedule],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.env = env
        self.schedules = list(schedules)
        self.clock = clock
        self.tick_s = TICK_S if clock is None else INJECTED_TICK_S
        self.cursors: dict[str, ScheduleCursor | None] = {}
        # Schedules whose cursor is ahead of the clock: the clock's time when that was noticed.
        self._ahead: dict[str, float] = {}
        self._next: dict[str, tuple[float, float | None]] = {}  # name → (since, next after it)
        # Schedules kept by another process under another cron: when this one last looked.
        self._foreign: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        if getattr(self.env.store, "steady", False):
            # Cron is wall time: SQLite's steady clock drifts from it by every correction of
            # the wall clock (and every sleep of the machine) since the process started, and
            # schedules fired that much late for the rest of its life.
            return time.time()
        return await self.env.store.now()

    def start(self) -> None:
        if self.schedules and self._task is None:
            self._task = asyncio.create_task(self._run(), name="hearth-scheduler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                wake = await self.tick()
            except Exception as exc:  # the store is away, say: look again soon
                log.warning("the scheduler could not fire its schedules: %s", exc)
                wake = RETRY_S
            await asyncio.sleep(wake)

    async def tick(self) -> float:
        """Fire whatever is due now; return how long to sleep before the next look."""
        now = await self.now()
        if len(self.cursors) < len(self.schedules):
            for s in self.schedules:
                if s.name not in self.cursors:
                    _faults.reached("before:store.open_schedule")
                    self.cursors[s.name] = await self.env.store.open_schedule(s.name, s.spec, now)
                    _faults.reached("after:store.open_schedule")
        for s in self.schedules:
            looked = self._foreign.get(s.name)
            if looked is not None and now - looked >= FOREIGN_LOOK_S:
                self.cursors[s.name] = await self._look_again(s, now)
        firing = []
        for s in self.schedules:
            cursor = self.cursors[s.name]
            if cursor is None:
                continue
            since = self.looks_from(s, cursor, now)
            upcoming = self._upcoming(s, since)
            due = None if upcoming is None or upcoming > now else s.latest_due(since, now)
            if due is not None:
                firing.append((s, cursor, due))
        # Schedules due at once are admitted at once: their commits share the store's fsyncs.
        fired = await asyncio.gather(*(self._fire(s, c, due) for s, c, due in firing))
        for (s, _, _), cursor in zip(firing, fired, strict=True):
            self.cursors[s.name] = cursor
        wake = now + self.tick_s
        for s in self.schedules:
            cursor = self.cursors[s.name]
            if cursor is None:
                continue
            since = self.looks_from(s, cursor, now)
            # Nothing is due in (since, now] once it fired: the next one after since is the
            # next after now.
            upcoming = self._upcoming(s, since)
            if upcoming is not None and upcoming <= now:  # due, yet its cursor did not move
                upcoming = s.next_after(now)
            if upcoming is not None:
                wake = min(wake, upcoming)
        return max(0.0, wake - await self.now())

    def yields(self, name: str) -> bool:
        """Whether this process leaves the schedule to another that keeps it under another
        cron (and looks again now and then)."""
        return name in self._foreign

    def _upcoming(self, s: Schedule, since: float) -> float | None:
        """The schedule's first occurrence after ``since``, computed once per ``since``: a
        tick that finds nothing due evaluates no cron expression (5,000 schedules took 0.4 s
        of the event loop every second)."""
        known = self._next.get(s.name)
        if known is None or known[0] != since:
            known = (since, s.next_after(since))
            self._next[s.name] = known
        return known[1]

    def looks_from(self, s: Schedule, cursor: ScheduleCursor, now: float) -> float:
        """Where the next occurrence is looked for from: the cursor, or the time this process
        found the cursor ahead of the clock by more than ``CLOCK_BACK_S`` (stamped while the
        clock was ahead, and the clock since set back)."""
        if cursor.cursor <= now + CLOCK_BACK_S:
            self._ahead.pop(s.name, None)
            return cursor.cursor
        if s.name not in self._ahead:
            self._ahead[s.name] = now
            log.warning(
                "schedule %s: its cursor (%s) is ahead of the clock (%s), which was set back;"
                " its occurrences are looked for from now",
                s.name,
                iso(cursor.cursor),
                iso(now),
            )
        return min(self._ahead[s.name], now)

    async def _fire(
        self, s: Schedule, cursor: ScheduleCursor, occurrence: float
    ) -> ScheduleCursor | None:
        when = iso(occurrence)
        try:
            await refuse_delegated(self.env.store, f"{s.agent}/{s.id}")
        except DelegatedConversation as exc:
            log.error("schedule %s no longer fires: %s", s.name, exc)
            return None
        new = new_submission(
            self.env.agents,
            s.agent,
            s.id,
            "scheduled",
            s.payload(occurrence),
            idempotency_key=f"schedule:{s.name}:{when}",
            source={"schedule": s.name, "occurrence": when},
        )
        _faults.reached("before:store.admit_occurrence")
        admission = await self.env.store.admit_occurrence(
            s.name, s.spec, cursor.cursor, occurrence, new
        )
        _faults.reached("after:store.admit_occurrence")
        if admission is not None:
            if not admission.deduplicated:
                self.env.metrics.admitted += 1
            log.info("schedule %s: admitted the occurrence %s", s.name, when)
            return ScheduleCursor(s.name, s.spec, occurrence, occurrence, cursor.updated_at)
        # Another process moved the cursor first: follow it.
        fresh = {c.name: c for c in await self.env.store.list_schedules()}.get(s.name)
        if fresh is None or fresh.spec != s.spec:
            log.warning(
                "schedule %s was changed by another process (now %s); this process does not fire"
                " it while that process does",
                s.name,
                None if fresh is None else fresh.spec,
            )
            self._foreign[s.name] = occurrence
            return None
        return fresh

    async def _look_again(self, s: Schedule, now: float) -> ScheduleCursor | None:
        """A schedule another process changed: its cursor once the cron stored is this
        process's again, or once nobody fires the other one (taken back from now); else None,
        to look again later."""
        self._foreign[s.name] = now
        fresh = {c.name: c for c in await self.env.store.list_schedules()}.get(s.name)
        if fresh is not None and fresh.spec == s.spec:
            del self._foreign[s.name]
            log.info("schedule %s is fired by this process again", s.name)
            return fresh
        if fresh is not None and not _abandoned(fresh, now):
            return None
        del self._foreign[s.name]
        log.warning(
            "schedule %s: no process fires it as %s any longer; this process fires it again",
            s.name,
            None if fresh is None else fresh.spec,
        )
        return await self.env.store.open_schedule(s.name, s.spec, now)


def _abandoned(cursor: ScheduleCursor, now: float) -> bool:
    """Whether an occurrence of the cron ``cursor`` is kept for has gone unfired for
    ``ABANDONED_S`` (a cron this release cannot read counts as one nobody fires)."""
    try:
        other = Schedule.of_spec(cursor.name, cursor.spec)
    except ConfigurationError:
        return True
    due = other.next_after(cursor.cursor)
    return due is not None and now - due > ABANDONED_S
