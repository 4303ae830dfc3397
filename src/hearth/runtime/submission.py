"""The turn loop's policy for a claimed submission: its input comes from the submission's payload,
queued messages may join it at turn boundaries, and its end settles the submission."""

from __future__ import annotations

import logging

from hearth import _faults
from hearth.agent import Agent
from hearth.attachments import message_content
from hearth.records import Record, Signal, UserMessage
from hearth.runtime.env import Env
from hearth.runtime.recovery import assemble_messages
from hearth.runtime.scope import AttemptScope, Settlement
from hearth.store.base import Submission

log = logging.getLogger("hearth.runner")


class SubmissionPolicy:
    """How the loop of a submission begins, lets others join, and ends."""

    depth = 0

    def __init__(self, sub: Submission) -> None:
        self.sub = sub
        self.conversation_id = sub.conversation_id
        self.input_id = _input_id(sub)
        self.log = logging.LoggerAdapter(log, {"submission_id": sub.id})

    def agent(self, env: Env) -> Agent | None:
        return env.agents.get(self.conversation_id.partition("/")[0])

    def input_record(self) -> Record:
        if "signal" in self.sub.payload:  # a signal, direct or from a channel or a schedule
            sig = self.sub.payload.get("signal", {})
            return Signal(
                id=self.input_id,
                signal_type=str(sig.get("type", "signal")),
                body=str(sig.get("body", "")),
                attributes=dict(sig.get("attributes") or {}),
            )
        return _message_input(self.sub)

    async def join_queued(self, scope: AttemptScope) -> bool:
        """At a turn boundary (a tool batch just committed), let messages that arrived
        meanwhile join the live response. True when any joined."""
        views = assemble_messages(scope.submission_records())
        if not views or not views[-1].committed:
            return False
        queued = await scope.store.list_submissions(scope.conversation_id, statuses=("queued",))
        joins = []
        for sub in queued:
            # Any message joins, direct or from a channel or a schedule; a signal never does.
            if "message" not in sub.payload or sub.abort_requested_at is not None:
                break  # order is kept: nothing joins past one that cannot
            joins.append((sub.id, scope.journal.stamp([_message_input(sub)])))
        if not joins:
            return False
        _faults.reached("before:user_message")
        _faults.reached("before:store.join_many")
        joined = await scope.store.join_many(self.sub.fence, joins)  # in order, one write
        _faults.reached("after:store.join_many")
        if joined:
            _faults.reached("after:user_message")
        return joined > 0

    async def finish(self, scope: AttemptScope, settlement: Settlement) -> None:
        """Write the settlement (after its records) exactly once."""
        s = settlement
        await scope.journal.settle(
            outcome=s.outcome, reply=s.reply, error=s.error, records_before=s.records
        )
        # The messages joined to it settle with it, each a submission of its own to count.
        joined = sum(
            1
            for r in scope.submission_records()
            if isinstance(r, UserMessage) and r.id.endswith(":input") and r.id != self.input_id
        )
        for _ in range(1 + joined):
            scope.env.metrics.settled(s.outcome)


def _input_id(sub: Submission) -> str:
    return f"{sub.id}:input"


def _message_input(sub: Submission) -> UserMessage:
    text = sub.payload.get("message", "")
    parts = list(sub.payload.get("attachments") or ())
    return UserMessage(id=_input_id(sub), message_id=sub.id, content=message_content(text, parts))
