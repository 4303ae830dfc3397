"""Schedules: cron occurrences that admit submissions (SPEC §14).

``Schedule(name, agent, id, cron=..., tz=..., message=... | signal=...)`` admits one submission
of kind ``scheduled`` per occurrence, exactly once across any number of processes. The cron
expression (five fields) is evaluated by ``cronsim``, which follows Debian's cron, DST included:
a time skipped when the clocks go forward fires at the jump, a time repeated when they go back
fires once.

Example::

    morning = hearth.Schedule(
        "morning-digest", "digest", "team", cron="0 9 * * 1-5", tz="Europe/Paris",
        message="Write today's digest.",
    )
    app = hearth.App([digest], schedules=[morning])
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from hearth.errors import ConfigurationError, HearthError
from hearth.ids import check_id
from hearth.jsontext import unpaired_surrogate
from hearth.signals import BadSignal, checked_signal

if TYPE_CHECKING:
    from hearth.agent import Agent

NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
# How far back a catch-up looks at first; widened until it finds the latest missed occurrence,
# so coalescing a long outage costs a few windows, not one step per missed occurrence.
_MAX_STEPS = 100_000  # cron can name no time at all (30 February): give up, never spin


class Schedule:
    """Admit ``message`` (or ``signal``) to conversation ``agent/id`` at every occurrence of
    ``cron`` in the time zone ``tz`` (an IANA name, default UTC)."""

    def __init__(
        self,
        name: str,
        agent: str | Agent,
        id: str,
        *,
        cron: str,
        tz: str = "UTC",
        message: str | None = None,
        signal: dict[str, Any] | None = None,
    ) -> None:
        def bad(why: str) -> ConfigurationError:
            return ConfigurationError(f"schedule {name!r}: {why}")

        if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
            raise ConfigurationError(
                f"schedule name {name!r} must match {NAME_PATTERN} (lowercase, dashes)"
            )
        self.name = name
        self.agent = agent if isinstance(agent, str) else agent.name
        try:
            self.id = check_id(id)
        except HearthError as exc:
            raise bad(str(exc)) from None
        if (message is None) == (signal is None):
            raise bad("give exactly one of message= or signal=")
        if message is not None and (not isinstance(message, str) or not message):
            raise bad("message must be a non-empty string")
        if signal is not None:
            try:
                # Checked now, not at the first occurrence: as JSON gives it back, never NaN
                # (stored, it would spoil every read of the conversation's stream).
                signal = checked_signal(signal)
            except BadSignal as exc:
                raise bad(exc.why) from None
        where = unpaired_surrogate([message, signal])
        if where is not None:
            raise bad(f"the message or signal has {where}; no UTF-8 text can hold it")
        self.message = message
        self.signal = signal
        if not isinstance(cron, str) or len(cron.split()) != 5:
            raise bad(f"cron {cron!r} must have five fields: minute hour day month weekday")
        self.cron = " ".join(cron.split())
        try:
            self.zone: tzinfo = ZoneInfo(tz)
        except Exception:  # ZoneInfoNotFoundError, or a malformed key (ValueError)
            raise bad(f"unknown time zone {tz!r}; use an IANA name like 'Europe/Paris'") from None
        self.tz = tz
        try:
            next(CronSim(self.cron, datetime.now(self.zone)))
        except CronSimError as exc:
            raise bad(f"invalid cron expression {cron!r}: {exc}") from None
        except StopIteration:
            raise bad(f"cron {cron!r} never fires") from None

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, {self.agent!r}, {self.id!r}, cron={self.cron!r})"

    @property
    def spec(self) -> str:
        """What a change of restarts the schedule from now: its cron and its zone."""
        return f"{self.cron}|{self.tz}"

    @classmethod
    def of_spec(cls, name: str, spec: str) -> Schedule:
        """A schedule of the cron and zone a stored ``spec`` names (another release's, say), to
        walk its occurrences; ``ConfigurationError`` when this release cannot read it."""
        cron, _, tz = spec.partition("|")
        return cls(name, "spec", "spec", cron=cron, tz=tz or "UTC", message="-")

    def next_after(self, t: float) -> float | None:
        """The first occurrence strictly after ``t`` (unix seconds), or None if none."""
        for at in self._from(t):
            return at
        return None

    def latest_due(self, after: float, now: float) -> float | None:
        """The latest occurrence in ``(after, now]``: the one to admit, the earlier ones
        coalesced into it. None when nothing is due. Looked for back from ``now`` (forward
        from ``after``, a cron of a few months a year walked 100,000 minutes and stopped at a
        January occurrence, after half a second, when the latest was in February)."""
        if now <= after:
            return None
        # One second past ``now``: cronsim's reverse walk names times strictly before its start.
        start = datetime.fromtimestamp(now + 1, UTC).astimezone(self.zone)
        for n, at in enumerate(CronSim(self.cron, start, reverse=True)):
            stamp = at.timestamp()
            if n > _MAX_STEPS or stamp <= after:
                return None
            if stamp <= now:
                return stamp
        return None

    def _from(self, t: float) -> Iterator[float]:
        """Occurrences strictly after ``t``, as unix seconds, in order."""
        start = datetime.fromtimestamp(t, UTC).astimezone(self.zone)
        # cronsim, like cron, may name the first instance of a repeated hour after a start in
        # its second instance: such a time is not after ``t``, and is skipped.
        for n, at in enumerate(CronSim(self.cron, start)):
            if n > _MAX_STEPS:
                return
            stamp = at.timestamp()
            if stamp > t:
                yield stamp

    def payload(self, occurrence: float) -> dict[str, Any]:
        """The submission's payload for one occurrence: the message or the signal, and
        ``scheduled_for`` (UTC ISO), which a signal also carries in its attributes."""
        when = iso(occurrence)
        if self.signal is not None:
            sig = self.signal
            signal = {**sig, "attributes": {**sig["attributes"], "scheduled_for": when}}
            return {"signal": signal, "scheduled_for": when}
        return {"message": self.message, "scheduled_for": when}


def iso(t: float) -> str:
    """Unix seconds as a UTC ISO time, ``2026-12-04T09:00:00Z``."""
    stamp = datetime.fromtimestamp(t, UTC)
    text = stamp.isoformat(timespec="milliseconds" if stamp.microsecond else "seconds")
    return text.replace("+00:00", "Z")


__all__ = ["Schedule", "iso"]
