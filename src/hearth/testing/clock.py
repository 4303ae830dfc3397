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


class FileClock:
    """Unix seconds read from a file at every call: a clock that a test moves for another
    process (``App(schedule_clock=FileClock(path))`` in a test app; never for leases).

    Example::

        Path("clock").write_text("1800000000")   # the process's schedules now see this time
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._last = 0.0

    def __call__(self) -> float:
        try:
            with open(self.path) as f:
                self._last = float(f.read().strip())
        except (OSError, ValueError):
            pass  # written at this moment: the last reading stands
        return self._last

    def set(self, now: float) -> None:
        """Move the clock (atomically: a reader never sees half a number)."""
        import os

        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(repr(now))
        os.replace(tmp, self.path)
