"""Settlement waits that survive a lost event: one shared look at every waited row, every second.

A ``read`` waits for its submission's ``settled`` event. An event from another process can be
lost (the process died between its commit and its notification, or this process's listener was
reconnecting), so the waits look at their rows now and then. Each wait doing that on its own
costs a read per wait per look; here one task reads the rows of every submission waited on in one
statement per look, and wakes the waits whose row has settled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from hearth._tasks import cancel_and_wait
from hearth.store.base import Store

log = logging.getLogger("hearth.runtime")

LOOK_EVERY_S = 1.0  # how long a settlement missed by its event can keep a wait waiting
_CHUNK = 500  # ids per statement


class SettledLooks:
    """The submissions being waited on, and the one task that looks at their rows."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waited: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self.looks = 0  # statements sent (tests count them)

    def watch(self, submission_id: str) -> None:
        self._waited[submission_id] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="hearth-settled-looks")

    def unwatch(self, submission_id: str) -> None:
        self._waited[submission_id] -= 1
        if self._waited[submission_id] <= 0:
            del self._waited[submission_id]

    async def close(self) -> None:
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
                        self.store.events.found_settled(row)
