"""One model turn: the request built from the records, the answer streamed into the journal.

Text arrives as batched deltas (``DeltaWriter``); tool calls are written with the completion
record, so a turn cut off mid-stream leaves its partial text and no half-made calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from dataclasses import replace
from typing import Any

from hearth import _faults, telemetry
from hearth.agent import Rendered
from hearth.errors import ProviderError
from hearth.jsontext import storable_text
from hearth.providers.base import ModelRequest, TextDelta, ToolCallEvent, ToolSpec
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantToolCall,
    Signal,
)
from hearth.runtime.deltas import DeltaWriter
from hearth.runtime.files import with_files
from hearth.runtime.model_context import STREAM_INTERRUPTED_NOTE, build_context
from hearth.runtime.provider_stream import provider_events
from hearth.runtime.scope import AttemptScope
from hearth.runtime.tasks import MAX_DEPTH, task_tool_spec


def build_request(scope: AttemptScope, rendered: Rendered, model: str) -> ModelRequest:
    """The model's request: the rendered agent, and the context rebuilt from the records."""
    summary, messages = build_context(scope.journal.records)
    tools = tuple(t.spec() for t in rendered.tools.values())
    return ModelRequest(
        model=model,
        system=rendered.system,
        messages=tuple(messages),
        tools=tools + _task_tools(scope, rendered),
        options=dict(rendered.model_options),
        summary=summary,
        conversation_id=scope.conversation_id,
    )


async def _with_files(scope: AttemptScope, request: ModelRequest) -> ModelRequest:
    return replace(request, messages=await with_files(scope.attachment, request.messages))


def _task_tools(scope: AttemptScope, rendered: Rendered) -> tuple[ToolSpec, ...]:
    if rendered.subagents and scope.depth < MAX_DEPTH:
        return (task_tool_spec(rendered),)
    return ()


async def model_turn(scope: AttemptScope, rendered: Rendered) -> None:
    """Ask the model once and record its answer; a provider error is recorded as the
    completion's ``error``. (A request estimated past the window is compacted before this, by
    the turn loop's ``Action.COMPACT``.)"""
    provider, model = scope.env.providers.resolve(rendered.model)
    request = await _with_files(scope, build_request(scope, rendered, model))
    mid = f"m_{uuid.uuid4().hex[:20]}"
    writer = DeltaWriter(scope.journal, mid)
    started = False

    async def ensure_started() -> None:
        nonlocal started
        if not started:
            started = True
            await scope.journal.append(
                AssistantMessageStarted(id=f"{mid}:started", message_id=mid, model=rendered.model)
            )

    calls: list[AssistantToolCall] = []
    stop_reason = "stop"
    usage: dict[str, int] | None = None
    error: dict[str, Any] | None = None
    attributes: dict[str, str | int | float | bool] = {
        "gen_ai.request.model": model,
        "hearth.model": rendered.model,
        "hearth.message_id": mid,
    }
    t0 = time.perf_counter()
    with telemetry.span("hearth.model_call", attributes=attributes) as span:
        try:
            _faults.reached("model:start")
            async with contextlib.aclosing(provider_events(provider, request)) as events:
                async for event in events:
                    _faults.reached("model:chunk")
                    if isinstance(event, TextDelta):
                        if event.text:
                            await ensure_started()
                            await writer.add(event.text)
                    elif isinstance(event, ToolCallEvent):
                        c = event.call
                        call_id = call_id_of(c.id, {call.tool_call_id for call in calls})
                        calls.append(
                            AssistantToolCall(
                                id=f"{mid}:call:{call_id}",
                                message_id=mid,
                                tool_call_id=call_id,
                                name=c.name,
                                arguments=c.arguments,
                            )
                        )
                    else:
                        stop_reason, usage = event.stop_reason, event.usage
        except ProviderError as exc:
            # A failed stream keeps its text but none of its calls.
            calls, stop_reason, usage, error = [], "error", None, exc.to_json()
            telemetry.mark_error(span, f"provider error: {exc.kind}")
        finally:
            writer.abandon()
            scope.env.metrics.observe_model_call(time.perf_counter() - t0)
        if calls:
            stop_reason = "tool_use"
        elif stop_reason == "tool_use":
            # "Tool use" with no call kept (a local server's tool-call parser failed, a tool
            # block cut before its end): the text is the answer. Kept as "tool_use", the
            # runtime would ask the model again at once, with nothing new, until the deadline.
            stop_reason = "stop"
        span.set_attribute("hearth.stop_reason", stop_reason)
        span.set_attribute("hearth.tool_calls", len(calls))
        for name, count in (usage or {}).items():
            if isinstance(count, int):
                span.set_attribute(f"gen_ai.usage.{name}", count)
    _faults.reached("model:end")
    await writer.close()
    await ensure_started()
    await scope.journal.append(
        *calls,
        AssistantMessageCompleted(
            id=f"{mid}:completed",
            message_id=mid,
            stop_reason=stop_reason,
            text="".join(writer.text),
            usage=usage,
            error=error,
        ),
    )


MAX_CALL_ID = 128  # characters of a recorded tool-call id (providers' ids are about 30)


def call_id_of(given: str, taken: set[str]) -> str:
    """The id a model's tool call is recorded under: the provider's, when every store can keep
    it and no earlier call of the same message has it. Otherwise NUL and unpaired surrogates
    become U+FFFD, an empty id gets a fresh one, one over ``MAX_CALL_ID`` characters is cut
    (ids are parts of index keys) and ends in a digest of the whole, and a repeated one gets a
    ``_2``, ``_3``... suffix: each call's records and outcome stay its own, and the next request
    names the calls by these ids. (Letters, digits, ``_`` and ``-`` only, in what is added:
    Anthropic's API takes no other characters in an id.)"""
    if not given:
        return f"call_{uuid.uuid4().hex[:20]}"
    base = storable_text(given)
    if len(base) > MAX_CALL_ID:
        digest = hashlib.sha256(base.encode()).hexdigest()[:16]
        base = f"{base[: MAX_CALL_ID - 17]}_{digest}"
    call_id, n = base, 1
    while call_id in taken:
        n += 1
        call_id = f"{base}_{n}"
    return call_id


async def note_interrupted_stream(scope: AttemptScope, message_id: str | None) -> None:
    """Tell the model its previous response was cut off, before it continues."""
    await scope.journal.append(
        Signal(
            id=f"{message_id}:interrupted",
            signal_type="stream_interrupted",
            body=STREAM_INTERRUPTED_NOTE,
            attributes={"message_id": message_id},
        )
    )
