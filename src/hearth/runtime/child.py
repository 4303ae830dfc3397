"""The turn loop of a delegated task's child conversation, run inside its parent's attempt."""

from __future__ import annotations

import logging
from typing import Any

from hearth.agent import Agent
from hearth.records import Record, UserMessage
from hearth.runtime.journal import Journal
from hearth.runtime.runner import Attempt


class ChildAttempt(Attempt):
    """The turn loop of a child conversation, inside its parent's attempt."""

    def __init__(self, parent: Attempt, agent: Agent, conversation_id: str, prompt: str) -> None:
        self.env = parent.env
        self.sub = parent.sub  # the parent's claim: fence, budget and deadline
        self.store = parent.store
        self.conversation_id = conversation_id
        self.agent_name, _, self.id = conversation_id.partition("/")
        self.journal = Journal(parent.store, conversation_id, parent.sub.fence)
        self.input_id = f"{conversation_id}:input"
        self.log = logging.LoggerAdapter(
            logging.getLogger("hearth.tasks"), {"child": conversation_id}
        )
        self.depth = parent.depth + 1
        self._agent = agent
        self.prompt = prompt
        self.result: tuple[str, str | None, dict[str, Any] | None] | None = None

    @property
    def agent(self) -> Agent | None:
        return self._agent

    async def _append_input(self) -> None:
        await self.journal.append(
            UserMessage(id=self.input_id, message_id=self.input_id, content=self.prompt)
        )

    async def _join_queued(self) -> bool:
        return False  # a child has no submissions of its own

    async def _finish(
        self,
        outcome: str,
        *,
        reply: str | None,
        error: dict[str, Any] | None,
        records: list[Record],
    ) -> None:
        if records:
            await self.journal.append(*records)
        self.result = (outcome, reply, error)
