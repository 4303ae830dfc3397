"""Settlement waits that survive a lost event: one shared look at every waited row, every second.

A ``read`` waits for its submission's ``settled`` event. An event from another process can be
lost (the process died between its commit and its notification, or this process's listener was
reconnecting), so the waits look at their rows now and then. Each wait doing that on its own
costs a read per wait per look; here one task reads the rows of every submission waited on in one
statement per look, and wakes the waits whose row has settled.

It also remembers the submissions this process admitted lately and the settlements it heard of
lately, so that a ``read`` right after a ``dispatch`` need not read a row it knows is unsettled.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter

from hearth._recent import keep_recent
from hearth._tasks import cancel_and_wait
from hearth.store.base import Store, Submission
from hearth.store.events import SETTLED, Event

log = logging.getLogger("hearth.runtime")

LOOK_EVERY_S = 1.0  # how long a settlement missed by its event can keep a wait waiting
_CHUNK = 500  # ids per statement
_KEPT = 4096  # submissions admitted, and settlements heard of, remembered lately


class SettledLooks:
    """The submissions being waited on, and the one task that looks at their rows."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waited: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self.looks = 0  # statements sent (tests count them)
        self._admitted: dict[str, None] = {}
        # Settlements heard of: the settled row when this process wrote it, else None.
        self._heard: dict[str, Submission | None] = {}
        self._unlisten = store.events.listen(self._on_event)

    def admitted(self, submission_id: str) -> None:
        """Note a submission this process just admitted (not an earlier one deduplicated)."""
        keep_recent(self._admitted, submission_id, None, _KEPT)

    def known(self, submission_id: str) -> Submission | bool | None:
        """What this process knows without a read: the settled row (its own settlement), True
        when it admitted the submission lately and has heard of no settlement since (a wait is
        woken by that settlement's event, or by the shared look), None when it cannot tell."""
        if submission_id in self._heard:
            return self._heard[submission_id]  # None: a peer settled it (read the row)
        return True if submission_id in self._admitted else None

    def _on_event(self, event: Event) -> None:
        if event.kind == SETTLED and event.submission_id is not None:
            self._heard_of(event.submission_id, event.row)

    def _heard_of(self, submission_id: str, row: Submission | None) -> None:
        # No longer "admitted, unsettled": once this is forgotten, a wait reads the row.
        self._admitted.pop(submission_id, None)
        keep_recent(self._heard, submission_id, row, _KEPT)

    def watch(self, submission_id: str) -> None:
        self._waited[submission_id] += 1
        if self._task is None or self._task.done():
            # (in a context of its own: not the first reader's, for the runtime's life)
            self._task = asyncio.create_task(
                self._run(), name="hearth-settled-looks", context=contextvars.Context()
            )

    def unwatch(self, submission_id: str) -> None:
        self._waited[submission_id] -= 1
        if self._waited[submission_id] <= 0:
            del self._waited[submission_id]

    async def close(self) -> None:
        self._unlisten()
        self._admitted.clear()  # nothing is heard from now on: waits read their rows
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        # Ends once nothing is waited on; ``watch`` starts it again. (No await lies between the
        # emptiness check and the return, so a wait cannot be added unseen.)
        while self._waited:
            await asyncio.sleep(LOOK_EVERY_S)
            ids = list(self._waited)
            for start in range(0, len(ids), _CHUNK):
                try:
                    rows = await self.store.get_submissions(ids[start : start + _CHUNK])
                except Exception as exc:  # the store is away: the next look tries again
                    log.debug("looking at waited submissions failed: %s", exc)
                    break
                self.looks += 1
                for row in rows:
                    if row.outcome is not None:
                        self._heard_of(row.id, row)
                        self.store.events.found_settled(row)
