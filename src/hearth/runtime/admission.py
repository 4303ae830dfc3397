"""What every source of submissions shares on its way to the store: the shape of an input
(a message or a signal) and the ``NewSubmission`` for a declared agent's conversation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hearth.agent import Agent
from hearth.attachments import MAX_ATTACHMENTS, Attachment, Checked, check
from hearth.errors import DelegatedConversation, InvalidInput, UnknownAgent
from hearth.ids import check_id
from hearth.jsontext import unpaired_surrogate
from hearth.signals import BadSignal, checked_signal
from hearth.store.base import Blob, NewSubmission, Store

# The ids ``tasks.child_id`` makes for the conversations of delegated tasks.
TASK_ID = re.compile(r"\.task-[0-9a-f]{16}$")


async def refuse_delegated(store: Store, conversation_id: str) -> None:
    """``DelegatedConversation`` when ``conversation_id`` is a delegated task's conversation: it
    takes no input from outside, as it runs only inside its parent's attempt (a message admitted
    to it ran beside the parent's task, in the same stream, and changed the task's answer). Only
    ids of that form (``tasks.child_id``'s) cost a read."""
    if not TASK_ID.search(conversation_id):
        return
    info = await store.get_conversation(conversation_id)
    if info is not None and info.parent is not None:
        raise DelegatedConversation(
            f"{conversation_id} is the conversation of a delegated task: it runs inside its"
            " parent's attempt and takes no input of its own (read it, or send to the parent)"
        )


def check_attachments(attachments: Any, limit: int) -> list[Checked]:
    """Every attachment checked (``attachments.check``), in order; at most
    ``MAX_ATTACHMENTS``."""
    if attachments is None:
        return []
    if isinstance(attachments, Attachment) or not isinstance(attachments, Sequence):
        raise InvalidInput("attachments must be a list of hearth.Attachment", "attachments")
    if len(attachments) > MAX_ATTACHMENTS:
        raise InvalidInput(
            f"at most {MAX_ATTACHMENTS} attachments per message, not {len(attachments)}",
            "attachments",
        )
    return [check(att, i, limit) for i, att in enumerate(attachments)]


def blobs_of(checked: Sequence[Checked]) -> tuple[Blob, ...]:
    """What the store keeps of each distinct file: bytes and the declared media type."""
    seen: dict[str, Blob] = {}
    for att in checked:
        seen.setdefault(att.sha256, Blob(att.sha256, att.media_type, len(att.data), att.data))
    return tuple(seen.values())


def declared(agents: dict[str, Agent], name: str) -> Agent:
    """The agent named ``name``; ``UnknownAgent`` listing the declared ones otherwise."""
    agent = agents.get(name)
    if agent is None:
        raise UnknownAgent(f"no agent named {name!r}; declared: {', '.join(sorted(agents))}")
    return agent


def input_payload(
    message: Any, signal: Any, attachments: Sequence[Checked] = ()
) -> tuple[str, dict[str, Any]]:
    """``(kind, payload)`` of a direct input: exactly one of a non-empty message or a signal
    ``{"type", "body", "attributes"}``; ``InvalidInput`` naming the field otherwise (a string
    with an unpaired surrogate too: no store could keep it). A message with attachments may
    have no text; its payload lists their parts under ``attachments``."""
    kind, payload = _input_payload(message, signal, attachments)
    field = kind  # "message" or "signal"
    where = unpaired_surrogate(payload[field])
    if where is not None:
        raise InvalidInput(f"{field} has {where}; no UTF-8 text can hold it", field)
    return kind, payload


def _input_payload(
    message: Any, signal: Any, attachments: Sequence[Checked] = ()
) -> tuple[str, dict[str, Any]]:
    if attachments:
        if signal is not None:
            raise InvalidInput("attachments come with a message, not a signal", "attachments")
        message = "" if message is None else message
        if not isinstance(message, str):
            raise InvalidInput("message must be a string", "message")
        return "message", {"message": message, "attachments": [a.part for a in attachments]}
    if (message is None) == (signal is None):
        raise InvalidInput("give exactly one of message or signal")
    if message is not None:
        if not isinstance(message, str) or not message:
            raise InvalidInput("message must be a non-empty string", "message")
        return "message", {"message": message}
    try:
        signal = checked_signal(signal)
    except BadSignal as exc:
        raise InvalidInput(exc.why, exc.field) from None
    return "signal", {"signal": signal}


def new_submission(
    agents: dict[str, Agent],
    agent: str,
    id: str,
    kind: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    source: dict[str, Any] | None = None,
    traceparent: str | None = None,
    blobs: tuple[Blob, ...] = (),
) -> NewSubmission:
    """The row to admit for ``agent``'s conversation ``id``, with the agent's durability."""
    durability = declared(agents, agent).durability
    return NewSubmission(
        conversation_id=f"{agent}/{check_id(id)}",
        agent=agent,
        kind=kind,
        payload=payload,
        idempotency_key=idempotency_key,
        max_attempts=durability.max_attempts,
        timeout=float(durability.timeout),
        source=source,
        traceparent=traceparent,
        blobs=blobs,
    )
