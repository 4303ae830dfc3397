"""Durable waits in the turn loop: what a tool batch does when a call waits, and what a
re-executed call learns from the records about its waits.

A call that waits (``step.wait`` raised ``WaitPending``) gets no outcome. Once every other call of
its batch has recorded its outcome, the batch raises ``PauseForWait`` instead of committing; a
delegated task's child passes it up to its parent's batch, and the submission's own loop hands
the new ``wait_started`` records to ``Store.begin_wait``, which ends the attempt: the submission
waits, holding no lease and no task, until a resolve, a timeout or an abort queues it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hearth.errors import InvalidInput
from hearth.ids import id_part
from hearth.jsontext import json_round_trip, unpaired_surrogate
from hearth.records import Record, WaitResolved, WaitStarted, iso_from_unix
from hearth.steps import WaitOutcome, WaitPending

Started = tuple[str, WaitStarted]  # (conversation id, its wait_started record)


def resolution(value: Any) -> Any:
    """The value that resolves a wait, as it is stored and ``step.wait`` returns it: as JSON
    gives it back. ``InvalidInput`` naming ``value`` for what no store could keep or no reader
    could read back (NaN, a set, half a surrogate pair, nesting too deep to encode)."""
    try:
        value = json_round_trip(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"the value is not JSON: {exc}", "value") from None
    where = unpaired_surrogate(value)
    if where is not None:
        raise InvalidInput(f"the value has {where}; no UTF-8 text can hold it", "value")
    return value


@dataclass
class PauseForWait(Exception):
    """A tool batch cannot commit because some of its calls wait for a value from outside."""

    started: list[Started] = field(default_factory=list)  # new wait_started records to append
    expiries: list[float] = field(default_factory=list)  # unix seconds, of the new waits
    # The open batches' uncommitted state writes, by conversation: ``Submission.carried``.
    carried: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, other: PauseForWait) -> None:
        self.started += other.started
        self.expiries += other.expiries
        self.carried.update(other.carried)

    def carry_state(
        self, conversation_id: str, message_id: str, attempt: int, writes: Mapping[str, Any]
    ) -> None:
        """Keep a batch's uncommitted state writes for the attempt that resumes it: in the
        submission's row (a batch whose only waiting call is a task has no wait record of its
        own: its child's are in the child's conversation), and in its new wait records as well
        (what an attempt of an earlier release reads)."""
        if not writes:
            return
        self.carried[conversation_id] = {
            "message_id": message_id,
            "attempt": attempt,
            "writes": dict(writes),
        }
        self.started = [
            (conv, dataclasses.replace(r, state_writes=dict(writes)))
            if conv == conversation_id
            else (conv, r)
            for conv, r in self.started
        ]

    @property
    def next_expiry(self) -> float | None:
        return min(self.expiries, default=None)


def wait_started(
    message_id: str, tool_call_id: str, pending: WaitPending, now: float
) -> tuple[WaitStarted, float | None]:
    """The record that opens a wait (its id is deterministic) and its expiry in unix seconds."""
    expires = None if pending.timeout is None else now + pending.timeout
    record = WaitStarted(
        id=f"{message_id}:wait:{id_part(tool_call_id)}:{pending.name}",
        wait_id=pending.wait_id,
        tool_call_id=tool_call_id,
        name=pending.name,
        prompt=pending.prompt,
        expires_at=None if expires is None else iso_from_unix(expires),
    )
    return record, expires


def recorded_waits(
    records: Sequence[Record], message_id: str, tool_call_id: str
) -> tuple[frozenset[str], dict[str, WaitOutcome]]:
    """The ids of the waits one call started, and how those that ended ended."""
    prefix = f"{message_id}:wait:"  # and the call's own id (a sibling's may begin with it)
    started = frozenset(
        r.wait_id
        for r in records
        if isinstance(r, WaitStarted) and r.tool_call_id == tool_call_id and r.id.startswith(prefix)
    )
    ended = {
        r.wait_id: WaitOutcome(r.value, r.timed_out, r.aborted)
        for r in records
        if isinstance(r, WaitResolved) and r.wait_id in started
    }
    return started, ended


def carried_state(
    records: Sequence[Record], message_id: str, carried: Mapping[str, Any] | None
) -> tuple[dict[str, Any], int]:
    """The state writes a batch made before it paused for waits, to commit when it resumes:
    those its wait records carry, and those the submission's row keeps for its conversation
    (``carried``: its entry in ``Submission.carried``) unless a later pause's records hold more.
    Each pause keeps all the writes the batch made so far, so the latest one is the whole set.
    With them, the attempt of that latest pause (-1 if none paused)."""
    prefix = f"{message_id}:wait:"
    writes: dict[str, Any] = {}
    latest = -1
    for r in records:
        if isinstance(r, WaitStarted) and r.id.startswith(prefix):
            writes.update(r.state_writes)
            latest = max(latest, r.attempt or 0)
    if (
        isinstance(carried, Mapping)
        and carried.get("message_id") == message_id
        and isinstance(carried.get("attempt"), int)
    ):
        if carried["attempt"] >= latest and isinstance(carried.get("writes"), Mapping):
            writes.update(carried["writes"])
        latest = max(latest, carried["attempt"])
    return writes, latest
