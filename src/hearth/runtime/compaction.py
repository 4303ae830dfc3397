"""Compaction: summarise older records with the model, so the context fits its window again."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from hearth.errors import ProviderError
from hearth.providers.base import ModelProvider, ModelRequest, TextDelta, UserTurn, estimate_tokens
from hearth.records import Compaction
from hearth.runtime.context import build_context

if TYPE_CHECKING:
    from hearth.runtime.runner import Attempt

SUMMARY_PROMPT = (
    "You condense conversations. Write a faithful summary of the conversation so far: the user's "
    "goals, facts learned, decisions made, tool results that matter, and anything still open. "
    "Write it so that the conversation can continue from the summary alone."
)


async def compact(attempt: Attempt, provider: ModelProvider, model: str) -> bool:
    """Append a ``compaction`` record covering everything before the current submission's
    input. Returns False when there is nothing older to summarise."""
    records = attempt.journal.records
    mine = attempt._submission_records()
    if not mine:
        return False
    first_kept = mine[0].offset
    previous = next((r for r in reversed(records) if isinstance(r, Compaction)), None)
    start = previous.first_kept_offset if previous is not None else 0
    older = [r for r in records if start <= r.offset < first_kept and not isinstance(r, Compaction)]
    _, messages = build_context(older)
    if not messages:
        return False  # nothing the model has seen lies before the input (only bookkeeping)
    summary = previous.summary if previous is not None else None
    request = ModelRequest(
        model=model,
        system=SUMMARY_PROMPT,
        messages=(*messages, UserTurn("Summarise the conversation above.")),
        summary=summary,
        conversation_id=attempt.conversation_id,
    )
    tokens_before = estimate_tokens(request)
    parts: list[str] = []
    async with contextlib.aclosing(provider.stream(request)) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                parts.append(event.text)
    text = "".join(parts).strip()
    if not text:
        raise ProviderError("the model returned an empty summary", kind="transient")
    await attempt.journal.append(
        Compaction(
            id=f"{attempt.sub.id}:compaction:{first_kept}:{attempt.sub.attempt}",
            summary=text,
            first_kept_offset=first_kept,
            tokens_before=tokens_before,
        )
    )
    # The caller may rebuild the context at once (the pre-call estimate): let it see the record.
    await attempt.journal.refresh()
    return True
