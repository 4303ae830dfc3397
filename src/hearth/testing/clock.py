"""A clock the test moves: give it to a store (``SQLiteStore(path, clock=clock)``) to control
leases and deadlines without sleeping."""

from __future__ import annotations


class ManualClock:
    """Unix seconds that change only when the test says so.

    Example::

        clock = ManualClock(1000.0)
        store = SQLiteStore(":memory:", clock=clock)
        clock.advance(31)          # every lease of 30 s taken at 1000.0 has now expired
    """

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds
