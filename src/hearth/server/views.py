"""JSON views of durable state: a conversation's snapshot and a submission's status."""

from __future__ import annotations

import re
from typing import Any

from hearth.records import Record
from hearth.server.errors import ApiError
from hearth.store.base import ConversationSummary, Submission


def submission_view(sub: Submission) -> dict[str, Any]:
    """What ``GET .../submissions/{sid}`` answers."""
    return {
        "id": sub.id,
        "conversation_id": sub.conversation_id,
        "kind": sub.kind,
        "source": sub.source,
        "status": sub.status,
        "outcome": sub.outcome,
        "error": sub.error,
        "reply": sub.reply,
        "attempt": sub.attempt,
        "accepted_at": sub.accepted_at,
        "settled_at": sub.settled_at,
    }


def snapshot(conversation_id: str, records: list[Record], subs: list[Submission]) -> dict[str, Any]:
    """The conversation as messages (deltas folded in) plus its submissions, from the newest
    ``records`` (``first_offset``: where they start; the stream route pages the earlier ones)."""
    return {
        "conversation_id": conversation_id,
        "offset": records[-1].offset if records else -1,
        "first_offset": records[0].offset if records else 0,
        "messages": messages(records),
        "submissions": [_submission_summary(s) for s in subs],
    }


def _submission_summary(sub: Submission) -> dict[str, Any]:
    out = sub.to_json()
    out.pop("conversation_id", None)
    return out


def messages(records: list[Record]) -> list[dict[str, Any]]:
    """User, assistant, tool and signal messages in stream order.

    An assistant message still streaming shows its persisted text with ``"in_progress": true``.
    """
    out: list[dict[str, Any]] = []
    open_messages: dict[str, dict[str, Any]] = {}
    for record in records:
        r = record.to_json()
        kind = r["type"]
        if kind == "user_message":
            out.append(_msg("user", r, content=r["content"], message_id=r["message_id"]))
        elif kind == "signal":
            out.append(
                _msg(
                    "signal",
                    r,
                    signal_type=r["signal_type"],
                    body=r["body"],
                    attributes=r["attributes"],
                )
            )
        elif kind == "assistant_message_started":
            msg = _msg(
                "assistant",
                r,
                message_id=r["message_id"],
                model=r["model"],
                text="",
                tool_calls=[],
                in_progress=True,
            )
            open_messages[r["message_id"]] = msg
            out.append(msg)
        elif kind == "assistant_text_delta" and r["message_id"] in open_messages:
            open_messages[r["message_id"]]["text"] += r["delta"]
        elif kind == "assistant_tool_call" and r["message_id"] in open_messages:
            open_messages[r["message_id"]]["tool_calls"].append(
                {"id": r["tool_call_id"], "name": r["name"], "arguments": r["arguments"]}
            )
        elif kind == "assistant_message_completed":
            done = open_messages.pop(r["message_id"], None)
            if done is None:
                done = _msg("assistant", r, message_id=r["message_id"], tool_calls=[])
                out.append(done)
            done.update(
                in_progress=False, text=r["text"], stop_reason=r["stop_reason"], error=r["error"]
            )
        elif kind == "tool_outcome":
            out.append(
                _msg(
                    "tool",
                    r,
                    tool_call_id=r["tool_call_id"],
                    name=r["name"],
                    is_error=r["is_error"],
                    content=r["content"],
                )
            )
        elif kind == "compaction":
            out.append(_msg("summary", r, summary=r["summary"]))
    return out


def _msg(role: str, r: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"role": role, "offset": r["offset"], "submission_id": r["submission_id"], **fields}


def conversation_view(c: ConversationSummary) -> dict[str, Any]:
    """One entry of ``GET /conversations``."""
    return {
        "agent": c.agent,
        "id": c.conversation_id[len(c.agent) + 1 :],
        "conversation_id": c.conversation_id,
        "last_activity": c.last_activity,
        "last_offset": c.last_offset,
        "unsettled": c.unsettled,
        "parent": c.parent,
    }


# A page cursor: the last row's activity time (exact, as ``repr`` writes it) and its
# conversation id. Every string of this shape is a position in the list, so the OpenAPI
# description can say exactly which ``after`` values are valid.
CURSOR_RE = re.compile(
    r"^(-?[0-9]{1,17}(?:\.[0-9]{1,17})?(?:e[-+]?[0-9]{1,2})?)~([A-Za-z0-9._:/-]{1,300})$"
)


def encode_cursor(cursor: tuple[float, str]) -> str:
    """The ``next`` cursor of a page whose last row is ``cursor`` (activity, conversation id)."""
    return f"{cursor[0]!r}~{cursor[1]}"


def decode_cursor(text: str | None) -> tuple[float, str] | None:
    """The position ``encode_cursor`` wrote, or a 400 for anything else."""
    if text is None:
        return None
    found = CURSOR_RE.fullmatch(text)
    if found:
        return float(found[1]), found[2]
    raise ApiError(
        400,
        "invalid_request",
        "after must be the next cursor of an earlier page of /conversations",
        {"field": "after"},
    )
