"""The narrow view of a running attempt that the turn loop's helpers work through.

Tool batches, hooks, compaction, delegated tasks, the model turn and bringing to rest take an
``AttemptScope``, never the loop itself, so they sit below it. ``TurnPolicy`` is the loop's other
seam: what differs between a submission's own loop and a delegated task's child loop.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from hearth.agent import Agent
from hearth.records import Record
from hearth.runtime.env import Env
from hearth.runtime.journal import Journal
from hearth.store.base import Store, Submission
from hearth.workspaces.base import OpenWorkspace, Workspace

Log = logging.LoggerAdapter[logging.Logger]


@dataclass
class Lease:
    """Until when (``time.monotonic()``) this process knows its claim is held: the lease's
    length from the moment the claim, or the last renewal that kept it, was sent. A process
    stopped (SIGSTOP, a frozen VM) past that no longer knows: a peer may have taken the work."""

    valid_until: float

    def renewed(self, sent_at: float, lease_s: float) -> None:
        self.valid_until = max(self.valid_until, sent_at + lease_s)

    def known_held(self) -> bool:
        return time.monotonic() < self.valid_until


@dataclass
class InAttempt:
    """An attempt that the code running in this context runs inside."""

    conversation_id: str
    running: bool = True


# The attempts the running code is inside, outermost first (a delegated task's child loop runs
# inside its parent's): none of their conversations takes a new turn, and none of their
# submissions settles, until that code returns. Copied into the tasks that code starts.
inside_attempts: ContextVar[tuple[InAttempt, ...]] = ContextVar("hearth_attempts", default=())


@dataclass(frozen=True)
class Settlement:
    """How a turn loop ends: the outcome, its reply or error, and records to write just before."""

    outcome: str  # "completed", "failed" or "aborted"
    reply: str | None = None
    error: dict[str, Any] | None = None
    records: list[Record] = field(default_factory=list)


class AttemptScope(Protocol):
    """What a helper of the turn loop may use of the attempt it runs in."""

    env: Env
    store: Store
    # The claim: fence, attempt number, budget and deadline. A child loop runs under its parent's.
    sub: Submission
    conversation_id: str
    agent_name: str
    id: str  # the conversation's id without the agent's name
    journal: Journal
    depth: int  # delegation depth: 0 for a submission, 1 for its task's child, ...
    log: Log

    def submission_records(self) -> list[Record]:
        """The records of this loop's input and everything after it."""
        ...

    async def run_child(self, policy: TurnPolicy) -> None:
        """Run another conversation through the same loop, under this attempt's claim."""
        ...

    async def workspace(self, declared: Workspace) -> OpenWorkspace:
        """``declared`` opened for this attempt at this conversation (once; closed when the
        attempt ends)."""
        ...

    async def confirm_claim(self) -> None:
        """Return at once while the lease is known held; past that, read the row: ``FencedOut``
        when another attempt owns the submission now (before a step's function runs: its
        effect must not happen twice)."""
        ...

    async def attachment(self, sha256: str) -> bytes | None:
        """The bytes of an attachment (None when the store no longer has them), read from the
        store once per attempt however many model turns and tools ask."""
        ...


class TurnPolicy(Protocol):
    """Whose turn loop this is, how its input is appended, whether queued messages may join it,
    and how its end is recorded."""

    conversation_id: str
    input_id: str  # the id of the input record; the loop's own records follow it
    depth: int
    log: Log

    def agent(self, env: Env) -> Agent | None:
        """The agent that answers, or None when it is not declared."""
        ...

    def input_record(self) -> Record:
        """The record that starts the loop, appended once."""
        ...

    async def join_queued(self, scope: AttemptScope) -> bool:
        """At a turn boundary, let waiting inputs join the live response; True when any did."""
        ...

    async def finish(self, scope: AttemptScope, settlement: Settlement) -> None:
        """Record the end, exactly once."""
        ...
