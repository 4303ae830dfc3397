"""Delegated tasks: the built-in ``task`` tool runs a subagent as a child conversation.

The child has its own canonical stream, linked from the parent's by a
``child_conversation_linked`` record written before the child starts. It runs inside the
parent's attempt — fenced by the parent's claim, under its budget and deadline — through the same
turn loop as any submission, so recovery resumes an interrupted child from its own records.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from hearth import _faults
from hearth.agent import Rendered
from hearth.providers.base import ToolSpec
from hearth.records import (
    AssistantToolCall,
    ChildConversationLinked,
    ConversationCreated,
    ToolOutcome,
)
from hearth.runtime.child import ChildPolicy
from hearth.runtime.outcomes import call_outcome, error_outcome
from hearth.runtime.recovery import TASK_TOOL
from hearth.runtime.scope import AttemptScope

MAX_DEPTH = 4  # a submission's agent is depth 0; its task's child is depth 1; ...
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


class TaskPreempted(Exception):
    """A child stopped because its parent was aborted or ran past its deadline: the parent's
    own classification settles it next."""


def child_id(parent_conversation_id: str, tool_call_id: str, message_id: str = "") -> str:
    """A deterministic conversation id for the child of one task call, valid as an HTTP id.

    The call's message is part of it: a model may use one tool-call id again in a later turn
    (a scripted one after a compaction, a local server counting from 0 each turn), and the
    second task got the first one's child, and its answer."""
    key = (
        f"{parent_conversation_id}\n{message_id}\n{tool_call_id}"
        if message_id
        else (f"{parent_conversation_id}\n{tool_call_id}")
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    parent_id = parent_conversation_id.split("/", 1)[-1]
    return f"{_UNSAFE.sub('-', parent_id)[:80]}.task-{digest}"


def task_tool_spec(rendered: Rendered) -> ToolSpec:
    lines = [f"- {name}: {sub.description}" for name, sub in sorted(rendered.subagents.items())]
    return ToolSpec(
        TASK_TOOL,
        "Delegate a self-contained task to a subagent, which works on it in its own conversation "
        "and returns its final answer. Available subagents:\n" + "\n".join(lines),
        {
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": sorted(rendered.subagents)},
                "prompt": {"type": "string", "description": "Everything the subagent needs."},
            },
            "required": ["agent", "prompt"],
            "additionalProperties": False,
        },
    )


async def run_child_task(
    parent: AttemptScope, call: AssistantToolCall, rendered: Rendered, *, resume: bool = False
) -> ToolOutcome:
    """Run (or, after a crash, ``resume``) the child conversation of one ``task`` call."""
    started = time.monotonic()
    args: dict[str, Any] = call.arguments if isinstance(call.arguments, dict) else {}
    name, prompt = args.get("agent"), args.get("prompt")
    sub = rendered.subagents.get(name) if isinstance(name, str) else None
    if sub is None:
        known = ", ".join(sorted(rendered.subagents)) or "none"
        return error_outcome(call, "subagent_missing", f"no subagent {name!r} (declared: {known})")
    if not isinstance(prompt, str) or not prompt.strip():
        return error_outcome(
            call, "validation", "invalid arguments: prompt must be a non-empty string"
        )
    if parent.depth >= MAX_DEPTH:
        return error_outcome(call, "depth_exceeded", f"delegation is limited to {MAX_DEPTH} levels")
    link_id = f"{call.message_id}:child:{call.tool_call_id}"
    linked = next(
        (r for r in parent.journal.records if r.id == link_id),
        None,
    )
    if isinstance(linked, ChildConversationLinked):
        # Resumed: its child, whatever the rule that named it (an earlier release named it
        # without the message).
        child_conversation = linked.child_conversation_id
    else:
        named = child_id(parent.conversation_id, call.tool_call_id, call.message_id)
        child_conversation = f"{sub.agent.name}/{named}"
    await parent.journal.append(
        ChildConversationLinked(
            id=link_id,
            tool_call_id=call.tool_call_id,
            child_conversation_id=child_conversation,
        )
    )
    created = ConversationCreated(
        id=f"{child_conversation}:created",
        agent=sub.agent.name,
        conversation_id=child_conversation,
        parent={"conversation_id": parent.conversation_id, "tool_call_id": call.tool_call_id},
    )
    # The child's records carry the parent's claim, so the parent's journal stamps them.
    _faults.reached(f"before:{created.type}")
    _faults.reached("before:store.append")
    await parent.store.append(
        child_conversation, parent.journal.stamp([created]), fence=parent.sub.fence
    )
    _faults.reached("after:store.append")
    _faults.reached(f"after:{created.type}")
    child = ChildPolicy(parent, sub.agent, child_conversation, prompt)
    _faults.reached("child:resume" if resume else "child:start")
    await parent.run_child(child)
    _faults.reached("child:end")
    end = child.settlement
    outcome, reply, error = (end.outcome, end.reply, end.error) if end else ("failed", None, None)
    took = int((time.monotonic() - started) * 1000)  # (this attempt's part, as for any call)
    if outcome == "completed":
        return call_outcome(call, reply or "", took)
    reason = (error or {}).get("type")
    if outcome == "aborted" or reason in ("timeout", "retry_exhausted"):
        raise TaskPreempted(child_conversation)
    message = f"{sub.agent.name} failed: {(error or {}).get('message', reason)}"
    return error_outcome(
        call, "task_failed", message, took, child_conversation_id=child_conversation
    )
