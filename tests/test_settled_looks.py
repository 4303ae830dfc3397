"""What a process knows of a settlement without reading its row (``runtime/settled.py``)."""

from __future__ import annotations

import pytest

from hearth.runtime.settled import SettledLooks
from hearth.store.events import SETTLED, Event
from hearth.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_submission_admitted_here_is_known_unsettled_until_a_settlement_is_heard() -> None:
    store = SQLiteStore(":memory:")
    looks = SettledLooks(store)
    try:
        assert looks.known("s_1") is None  # not admitted here: read the row
        looks.admitted("s_1")
        assert looks.known("s_1") is True  # admitted here, nothing heard: the row says queued
        store.events.publish(Event(SETTLED, "w/c", 3, "s_1"))  # a peer settled it
        assert looks.known("s_1") is None  # heard without the row: read it
        looks._heard.clear()  # the settlement is forgotten (many heard since)...
        assert looks.known("s_1") is None  # ...and still nothing claims it is unsettled
    finally:
        await looks.close()
