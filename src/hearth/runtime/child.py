"""The turn loop's policy for a delegated task's child conversation, run inside its parent's
attempt: its input is the task's prompt, nothing joins it, and its end is kept for the parent's
tool outcome instead of settling a submission."""

from __future__ import annotations

import logging

from hearth.agent import Agent
from hearth.records import Record, UserMessage
from hearth.runtime.env import Env
from hearth.runtime.scope import AttemptScope, Settlement

log = logging.getLogger("hearth.tasks")


class ChildPolicy:
    """How the loop of one child conversation begins and ends."""

    def __init__(
        self, parent: AttemptScope, agent: Agent, conversation_id: str, prompt: str
    ) -> None:
        self.conversation_id = conversation_id
        self.input_id = f"{conversation_id}:input"
        self.depth = parent.depth + 1
        self.log = logging.LoggerAdapter(log, {"child": conversation_id})
        self.prompt = prompt
        self.settlement: Settlement | None = None  # set once the child's loop ends
        self._agent = agent

    def agent(self, env: Env) -> Agent | None:
        return self._agent

    def input_record(self) -> Record:
        return UserMessage(id=self.input_id, message_id=self.input_id, content=self.prompt)

    async def join_queued(self, scope: AttemptScope) -> bool:
        return False  # a child has no submissions of its own

    async def finish(self, scope: AttemptScope, settlement: Settlement) -> None:
        if settlement.records:
            await scope.journal.append(*settlement.records)
        self.settlement = settlement
