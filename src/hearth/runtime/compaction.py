"""Compaction: summarise older records with the model, so the context fits its window again.

The summary covers everything between the previous compaction's ``first_kept_offset`` and the
current submission's input (the input itself is never compacted away), and it folds the previous
summary in. So each compaction reads only what followed the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from hearth import _faults
from hearth.errors import ProviderError
from hearth.providers.base import (
    Finished,
    Message,
    ModelProvider,
    ModelRequest,
    SystemNote,
    TextDelta,
    UserTurn,
    estimate_tokens,
)
from hearth.records import Compaction
from hearth.runtime.model_context import build_context
from hearth.runtime.recovery import TRANSIENT_BUDGET, backoff_delay
from hearth.runtime.scope import AttemptScope

SUMMARY_PROMPT = (
    "You condense conversations. Write a faithful summary of the conversation so far: the user's "
    "goals, facts learned, decisions made, tool results that matter, and anything still open. "
    "Write it so that the conversation can continue from the summary alone."
)
SUMMARY_ASK = "Summarise the conversation above."
RESPONSE_RESERVE = 4096  # tokens kept free for the model's answer (at most a quarter of the window)


def input_budget(window: int) -> int:
    """How many tokens a request may take in a ``window``-token model, leaving room to answer."""
    return window - min(RESPONSE_RESERVE, window // 4)


async def compact(scope: AttemptScope, provider: ModelProvider, model: str) -> bool:
    """Append a ``compaction`` record covering everything before the current submission's
    input. Returns False when there is nothing older to summarise.

    The summary call runs without tools. Its transient errors are retried here, up to
    ``TRANSIENT_BUDGET`` times with the same backoff as a turn (a crash starts the count again;
    the attempt budget bounds that). History too long for one summary call keeps its most recent
    part, so a conversation can always be compacted and go on.
    """
    records = scope.journal.records
    mine = scope.submission_records()
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
    whole = ModelRequest(model=model, system="", messages=tuple(messages), summary=summary)
    _faults.reached("compaction:start")
    usage: dict[str, int] = {}
    text = await _summarise(
        provider,
        model,
        summary,
        messages,
        budget=input_budget(provider.context_window(model)),
        conversation_id=scope.conversation_id,
        usage=usage,
    )
    _faults.reached("compaction:end")
    await scope.journal.append(
        Compaction(
            id=f"{scope.sub.id}:compaction:{first_kept}:{scope.sub.attempt}",
            summary=text,
            first_kept_offset=first_kept,
            tokens_before=estimate_tokens(whole),
            usage=usage or None,
        )
    )
    return True


async def _summarise(
    provider: ModelProvider,
    model: str,
    summary: str | None,
    messages: Sequence[Message],
    *,
    budget: int,
    conversation_id: str,
    usage: dict[str, int] | None = None,
) -> str:
    """Ask the model for the summary; retry transient errors, and shrink what is sent when the
    provider says it is still too long."""
    errors = 0
    while True:
        request, kept = summary_request(model, summary, messages, budget, conversation_id)
        try:
            text = await _text_of(provider, request, usage)
            if not text:
                raise ProviderError("the model returned an empty summary", kind="transient")
            return text
        except ProviderError as exc:
            if exc.kind == "overflow" and kept > 1:  # send less, from the recent end
                budget = min(budget, estimate_tokens(request)) // 2
                continue
            errors += 1
            if exc.kind != "transient" or errors > TRANSIENT_BUDGET:
                raise
            await asyncio.sleep(backoff_delay(errors, exc.retry_after))


def summary_request(
    model: str,
    summary: str | None,
    messages: Sequence[Message],
    budget: int,
    conversation_id: str = "",
) -> tuple[ModelRequest, int]:
    """The summary call: the older messages (the most recent ones that fit in ``budget``
    tokens, at least one) and the ask, with the previous summary and no tools. Also returns
    how many of ``messages`` it holds."""
    bare = ModelRequest(
        model=model,
        system=SUMMARY_PROMPT,
        messages=(UserTurn(SUMMARY_ASK),),
        summary=summary,
        conversation_id=conversation_id,
    )
    room = budget - estimate_tokens(bare)
    sizes = [estimate_tokens(ModelRequest(model="", system="", messages=(m,))) for m in messages]
    total, first = sum(sizes), 0
    while total > room and first < len(messages) - 1:
        total -= sizes[first]
        first += 1
    kept: list[Message] = list(messages[first:])
    if first:
        left_out = f"{first} earlier messages were too long to include and are left out."
        kept.insert(0, SystemNote("compaction", left_out))
    request = ModelRequest(
        model=model,
        system=SUMMARY_PROMPT,
        messages=(*kept, UserTurn(SUMMARY_ASK)),
        summary=summary,
        conversation_id=conversation_id,
    )
    return request, len(messages) - first


async def _text_of(
    provider: ModelProvider, request: ModelRequest, usage: dict[str, int] | None = None
) -> str:
    """The summary's text; the usage the provider reports is added into ``usage``."""
    parts: list[str] = []
    async with contextlib.aclosing(provider.stream(request)) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, Finished) and event.usage and usage is not None:
                for key, n in event.usage.items():
                    usage[key] = usage.get(key, 0) + int(n)
    return "".join(parts).strip()
