"""Compaction: summarise older records with the model, so the context fits its window again.

A compaction picks a cut, ``first_kept_offset``: what the model saw before it is folded into one
summary (together with the previous summary), what follows it stays verbatim. The cut is the
earliest turn boundary whose kept tail fits in half of the room left, so the loop can go on for a
while before it compacts again. Usually the cut is the running submission's input, and everything
before the submission is summarised. When the submission's own tool loop has outgrown the window,
the cut moves into the loop: its older tool turns are summarised too, while its input and the
messages that joined it stay verbatim (``kept_offsets``). A cut never falls inside a tool batch, so
a call and its outcome are kept or summarised together.

``plan_compaction`` decides from the records alone; ``compact`` asks for the summary and appends
the ``compaction`` record, with the summary call's usage (it counts toward ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from hearth import _faults
from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    Message,
    ModelProvider,
    ModelRequest,
    SystemNote,
    TextDelta,
    ToolResult,
    UserTurn,
    estimate_tokens,
)
from hearth.records import (
    AssistantMessageStarted,
    AssistantToolCall,
    Compaction,
    Record,
    ToolOutcome,
    UserMessage,
)
from hearth.runtime.model_context import messages_of
from hearth.runtime.provider_stream import provider_events
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


class ContextTooLong(Exception):
    """Compaction cannot make the context fit: the submission settles ``context_overflow``."""


@dataclass(frozen=True)
class Plan:
    """What one compaction summarises and what it keeps."""

    first_kept_offset: int
    kept_offsets: tuple[int, ...]  # verbatim records before the cut (input, joined messages)
    summarised: tuple[Record, ...]  # the records folded into the summary, in stream order
    shown: tuple[Record, ...]  # what the summary call reads: ``summarised`` and ``kept`` in order


def messages_tokens(messages: Sequence[Message]) -> int:
    """The estimated size of ``messages`` alone (no system prompt, tools or summary)."""
    if not messages:
        return 0
    return estimate_tokens(ModelRequest(model="", system="", messages=tuple(messages)))


def verbatim_records(mine: Sequence[Record]) -> list[Record]:
    """The submission's records that are never summarised: its input and joined messages."""
    if not mine:
        return []
    return [mine[0], *(r for r in mine[1:] if isinstance(r, UserMessage))]


def turn_boundaries(mine: Sequence[Record]) -> list[int]:
    """Offsets inside the submission where a cut separates no call from its outcome: the start
    of each assistant message after the input while no call is open, and the end."""
    open_calls: set[tuple[str, str]] = set()
    cuts: list[int] = []
    for rec in mine[1:]:
        if isinstance(rec, AssistantToolCall):
            open_calls.add((rec.message_id, rec.tool_call_id))
        elif isinstance(rec, ToolOutcome):
            open_calls.discard((rec.message_id, rec.tool_call_id))
        elif isinstance(rec, AssistantMessageStarted) and not open_calls:
            cuts.append(rec.offset)
    if mine and not open_calls:
        cuts.append(mine[-1].offset + 1)
    return cuts


def plan_compaction(records: Sequence[Record], mine: Sequence[Record], room: int) -> Plan | None:
    """The compaction to make, from the records alone: the earliest cut at or after the
    previous compaction's whose kept tail (beyond the verbatim records) takes at most ``room``
    tokens and that summarises something new. None when nothing can be summarised.

    ``records`` are the conversation's records from the latest compaction's first needed
    offset on; ``mine`` the running submission's, from its input on.
    """
    if not mine:
        return None
    previous = next((r for r in reversed(records) if isinstance(r, Compaction)), None)
    start = previous.first_kept_offset if previous is not None else -1
    before = set(previous.kept_offsets or ()) if previous is not None else set()
    verbatim = {r.offset for r in verbatim_records(mine)}
    candidates = sorted({c for c in [mine[0].offset, *turn_boundaries(mine)] if c >= start})
    visible = [r for r in records if not isinstance(r, Compaction)]
    tails = _tail_sizes([r for r in visible if r.offset not in verbatim], candidates)
    for cut, tail in zip(candidates, tails, strict=True):
        summarised = tuple(
            r
            for r in visible
            if (r.offset in before or start <= r.offset < cut) and r.offset not in verbatim
        )
        if tail > room or not messages_of(summarised):
            continue
        kept = tuple(sorted(o for o in verbatim if o < cut))
        read = {r.offset for r in summarised}.union(kept)
        shown = tuple(r for r in visible if r.offset in read)
        return Plan(cut, kept, summarised, shown)
    return None


def _tail_sizes(records: Sequence[Record], cuts: Sequence[int]) -> list[int]:
    """For each cut (ascending), the estimated size of the messages of ``records`` at or after
    it. Each stretch between two cuts holds whole tool turns, so it is measured on its own."""
    sizes = [0] * len(cuts)
    total = 0
    end = len(records)
    for i in range(len(cuts) - 1, -1, -1):
        first = end
        while first > 0 and records[first - 1].offset >= cuts[i]:
            first -= 1
        total += messages_tokens(messages_of(records[first:end]))
        sizes[i] = total
        end = first
    return sizes


async def compact(
    scope: AttemptScope,
    provider: ModelProvider,
    model: str,
    request: ModelRequest,
    *,
    refused: str | None = None,
) -> Compaction:
    """Append a ``compaction`` record so that ``request`` (the turn about to be asked, built
    from the records) fits the model's window, and return it. Raises ``ContextTooLong`` when
    no compaction can make it fit.

    The summary call runs without tools. Its transient errors are retried here, up to
    ``TRANSIENT_BUDGET`` times with the same backoff as a turn (a crash starts the count again;
    the attempt budget bounds that). History too long for one summary call keeps its most recent
    part, so a conversation can always be compacted and go on. ``refused``: what the provider
    said when it refused ``request`` as too long (None: hearth's estimate found it too long).
    """
    window = provider.context_window(model)

    def too_long(estimated: str) -> ContextTooLong:
        if refused is None:
            return ContextTooLong(estimated)
        # The provider refused what hearth's estimate let through: its window is smaller than
        # hearth takes it to be (a local server's, say); the estimate's figures would mislead.
        return ContextTooLong(
            f"the model provider refused the request as too long for its context window"
            f" ({refused}), and nothing older can be summarised to shorten it; if the model's"
            f" window is smaller than the {window} tokens hearth assumes, give its size to the"
            " provider (context_windows=)"
        )

    budget = input_budget(window)
    mine = scope.submission_records()
    overhead = estimate_tokens(dataclasses.replace(request, messages=(), summary=None))
    fixed = overhead + messages_tokens(messages_of(verbatim_records(mine)))
    if fixed > budget:
        raise too_long(
            f"the submission's input takes about {fixed} tokens with the system prompt and "
            f"tools, more than the {budget} tokens a request may take in this model's "
            f"{window}-token window; send a shorter message or use a model with a larger window"
        )
    # Keep a tail of at most half the room left; when the provider refused a request the
    # estimate let through, at most half of what was sent.
    before = estimate_tokens(request)
    room = (min(budget, before) - fixed) // 2
    plan = plan_compaction(scope.journal.records, mine, room)
    if plan is None:
        raise too_long(
            f"the context takes about {before} tokens, more than this model's {window}-token "
            "window allows, and nothing older can be summarised"
        )
    previous = next((r for r in reversed(scope.journal.records) if isinstance(r, Compaction)), None)
    summary = previous.summary if previous is not None else None
    messages = messages_of(plan.shown)
    _faults.reached("compaction:start")
    usage: dict[str, int] = {}
    text = await _summarise(
        provider,
        model,
        summary,
        messages,
        budget=budget,
        conversation_id=scope.conversation_id,
        usage=usage,
    )
    _faults.reached("compaction:end")
    record = Compaction(
        id=f"{scope.sub.id}:compaction:{plan.first_kept_offset}:{scope.sub.attempt}",
        summary=text,
        first_kept_offset=plan.first_kept_offset,
        tokens_before=before,
        usage=usage or None,
        kept_offsets=list(plan.kept_offsets) or None,
    )
    await scope.journal.append(record)
    return record


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
    refused: tuple[int, int] | None = None  # (messages, size) the provider found too long
    while True:
        request, kept = summary_request(model, summary, messages, budget, conversation_id)
        size = estimate_tokens(request)
        if refused is not None and kept >= refused[0] and size >= refused[1]:
            # Clipped as far as it goes (the last turn with its tool results is never split)
            # and still too long: asking again would be refused again, at once, for ever.
            raise ContextTooLong(
                f"the summary call was too long for the model even cut to about {size} tokens;"
                " the conversation cannot be compacted in this model's window"
            )
        try:
            text = await _text_of(provider, request, usage)
            if not text:
                raise ProviderError("the model returned an empty summary", kind="transient")
            return text
        except ProviderError as exc:
            if exc.kind == "overflow" and kept > 1:  # send less, from the recent end
                budget, refused = min(budget, size) // 2, (kept, size)
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
    """The summary call: the older messages and the ask, with the previous summary and no
    tools, in ``budget`` tokens. It holds the most recent messages that fit, starting at a
    message that is not a tool result (a result is never sent without its call); when not even
    the last turn fits, its longest texts are clipped. Also returns how many of ``messages`` it
    holds."""
    bare = ModelRequest(
        model=model,
        system=SUMMARY_PROMPT,
        messages=(UserTurn(SUMMARY_ASK),),
        summary=summary,
        conversation_id=conversation_id,
        purpose="summary",
    )
    room = budget - estimate_tokens(bare)
    sizes = [messages_tokens((m,)) for m in messages]
    after = [0] * (len(messages) + 1)  # after[i]: the size of messages[i:]
    for i in range(len(messages) - 1, -1, -1):
        after[i] = after[i + 1] + sizes[i]
    starts = [i for i, m in enumerate(messages) if not isinstance(m, ToolResult)] or [0]
    first = next((i for i in starts if after[i] <= room), starts[-1])
    kept: list[Message] = list(messages[first:])
    if after[first] > room and kept:
        share = max(room, 0) * 4 // len(kept) - _CLIP_MARGIN
        kept = [_clip(m, max(share, _CLIP_MARGIN)) for m in kept]
    if first:
        left_out = f"{first} earlier messages were too long to include and are left out."
        kept.insert(0, SystemNote("compaction", left_out))
    request = ModelRequest(
        model=model,
        system=SUMMARY_PROMPT,
        messages=(*kept, UserTurn(SUMMARY_ASK)),
        summary=summary,
        conversation_id=conversation_id,
        purpose="summary",
    )
    return request, len(messages) - first


_CLIP_MARGIN = 64  # characters kept free per clipped message, for the marker and JSON quoting


def _clip(message: Message, chars: int) -> Message:
    """``message`` with its text cut to about ``chars`` characters (tool results as JSON)."""

    def cut(text: str) -> str:
        if len(text) <= chars:
            return text
        return f"{text[:chars]} [... {len(text) - chars} characters cut]"

    if isinstance(message, ToolResult):
        content = message.content
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        return dataclasses.replace(message, content=cut(text)) if len(text) > chars else message
    if isinstance(message, UserTurn) and isinstance(message.content, str):
        return UserTurn(cut(message.content))
    if isinstance(message, AssistantTurn):
        return dataclasses.replace(message, text=cut(message.text))
    if isinstance(message, SystemNote):
        return SystemNote(message.kind, cut(message.text))
    return message


async def _text_of(
    provider: ModelProvider, request: ModelRequest, usage: dict[str, int] | None = None
) -> str:
    """The summary's text; the usage the provider reports is added into ``usage``."""
    parts: list[str] = []
    async with contextlib.aclosing(provider_events(provider, request)) as events:
        async for event in events:
            _faults.reached("compaction:chunk")
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, Finished) and event.usage and usage is not None:
                for key, n in event.usage.items():
                    usage[key] = usage.get(key, 0) + int(n)
    return "".join(parts).strip()
