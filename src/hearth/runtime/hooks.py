"""Event hooks: the seams where ``on_agent_start`` and ``on_agent_finish`` callbacks run.

A seam is every callback of one hook at one point. Its state writes (and, for a finish seam,
the text its callbacks append) commit in one batch with its ``hook_seam_committed`` record; a
committed seam never runs again, an interrupted one runs again on recovery (at least once).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hearth import _faults
from hearth._tasks import held_the_loop
from hearth.agent import MAX_CONTINUATIONS, Hook, Rendered, StateBuffer, current_unit
from hearth.errors import app_failure, described
from hearth.records import HookSeamCommitted, Record, Signal, StateWrite, UserMessage
from hearth.runtime.recovery import (
    CONTINUATION,
    FINISH_HOOK,
    START_HOOK,
    assemble_messages,
    input_key,
)
from hearth.runtime.scope import AttemptScope

log = logging.getLogger("hearth.hooks")


@dataclass
class AgentStart:
    """What an ``on_agent_start`` callback receives: who, and the input being delivered."""

    agent: str
    id: str
    conversation_id: str
    submission_id: str
    input: Any  # the message text (or parts), or the signal ``{"type", "body", "attributes"}``
    log: logging.LoggerAdapter[logging.Logger]


@dataclass
class AgentFinish:
    """What an ``on_agent_finish`` callback receives. ``append(text)`` continues the response."""

    agent: str
    id: str
    conversation_id: str
    submission_id: str
    input: Any
    text: str  # the response as it would stop
    log: logging.LoggerAdapter[logging.Logger]
    remaining: int = MAX_CONTINUATIONS
    appended: list[str] = field(default_factory=list)

    def append(self, text: str) -> None:
        """Continue the response: the model is asked again with ``text`` as a note."""
        if not isinstance(text, str) or not text:
            raise ValueError("append() takes a non-empty string")
        if len(self.appended) >= self.remaining:
            self.log.warning(
                "on_agent_finish continued this response %d times already; the limit is %d",
                MAX_CONTINUATIONS - self.remaining + len(self.appended),
                MAX_CONTINUATIONS,
            )
            return
        self.appended.append(text)


class HookFailure(Exception):
    """A hook callback raised: the submission fails with ``hook_error``."""


async def run_seam(
    scope: AttemptScope,
    hook: str,
    key: str,
    rendered: Rendered,
    callbacks: list[Hook],
    event: Any,
) -> None:
    """Run every callback of one seam, then commit its writes with its seam record."""
    buffer = StateBuffer(rendered.state)
    token = current_unit.set(buffer)
    caller = asyncio.current_task()
    try:
        for fn in callbacks:
            _faults.reached(f"hook:{hook}")
            try:
                began = time.monotonic()
                result = fn(event)
                name = getattr(fn, "__name__", "callback")
                held_the_loop(f"the {hook} callback {name}", time.monotonic() - began)
                if inspect.isawaitable(result):
                    await result
            except BaseException as exc:
                if not app_failure(exc, caller):
                    raise
                name = getattr(fn, "__name__", "callback")
                raise HookFailure(f"{hook} callback {name} raised {described(exc)}") from exc
    finally:
        current_unit.reset(token)
        buffer.closed = True
    _faults.reached(f"hook-done:{hook}")
    records: list[Record] = [
        StateWrite(id=f"{key}:{hook}:state:{name}", name=name, value=value)
        for name, value in buffer.writes.items()
    ]
    if isinstance(event, AgentFinish):
        base = MAX_CONTINUATIONS - event.remaining
        records += [
            Signal(
                id=f"{key}:{hook}:continue:{base + i}",
                signal_type=CONTINUATION,
                body=text,
                attributes={"message_id": key},
            )
            for i, text in enumerate(event.appended)
        ]
    records.append(HookSeamCommitted(id=f"{key}:{hook}", hook=hook, message_id=key))
    await scope.journal.append(*records)


def _input_content(scope: AttemptScope, key: str) -> Any:
    for rec in scope.submission_records():
        if input_key(rec) == key:
            if isinstance(rec, UserMessage):
                return rec.content
            if isinstance(rec, Signal):
                return {"type": rec.signal_type, "body": rec.body, "attributes": rec.attributes}
    return None


async def start_seam(scope: AttemptScope, key: str, rendered: Rendered) -> None:
    """The ``on_agent_start`` seam of the delivered input keyed ``key``."""
    event = AgentStart(
        agent=scope.agent_name,
        id=scope.id,
        conversation_id=scope.conversation_id,
        submission_id=scope.sub.id,
        input=_input_content(scope, key),
        log=scope.log,
    )
    await run_seam(scope, START_HOOK, key, rendered, rendered.on_start, event)


async def finish_seam(scope: AttemptScope, message_id: str, rendered: Rendered) -> None:
    """The ``on_agent_finish`` seam where the response ending with ``message_id`` would stop."""
    mine = scope.submission_records()
    used = sum(1 for r in mine if isinstance(r, Signal) and r.signal_type == CONTINUATION)
    view = next(v for v in assemble_messages(mine) if v.message_id == message_id)
    event = AgentFinish(
        agent=scope.agent_name,
        id=scope.id,
        conversation_id=scope.conversation_id,
        submission_id=scope.sub.id,
        input=_input_content(scope, input_key(mine[0])),
        text=view.completed.text if view.completed is not None else "",
        log=scope.log,
        remaining=max(MAX_CONTINUATIONS - used, 0),
    )
    await run_seam(scope, FINISH_HOOK, message_id, rendered, rendered.on_finish, event)


__all__ = [
    "FINISH_HOOK",
    "START_HOOK",
    "AgentFinish",
    "AgentStart",
    "HookFailure",
    "finish_seam",
    "run_seam",
    "start_seam",
]
