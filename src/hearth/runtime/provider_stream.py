"""A model provider's stream as the runtime reads it: what the provider's own code raises is a
provider error like any other, never a crash of the attempt."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator

from hearth.errors import ProviderError, app_failure, described, stopping
from hearth.jsontext import json_round_trip
from hearth.providers.base import (
    Finished,
    ModelEvent,
    ModelProvider,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
)

log = logging.getLogger("hearth")


async def provider_events(
    provider: ModelProvider, request: ModelRequest
) -> AsyncGenerator[ModelEvent, None]:
    """``provider.stream(request)``, with what the provider's own code raises, other than a
    ``ProviderError``, turned into a transient one (recorded, retried under the durable budget,
    and named in the submission's error when that runs out). A provider of the application's
    may have a bug; it is not the runtime's, and no attempt should crash on it. So is a
    ``CancelledError`` that nothing cancelled (a leaked one), and so is an event that is not one
    a provider may yield (``checked``)."""
    held = ""  # a high surrogate that ended a text delta: the next may begin with its low half
    try:
        async with contextlib.aclosing(provider.stream(request)) as events:
            async for event in events:
                event = checked(provider, event)
                if isinstance(event, TextDelta):
                    text, held = _paired(held, event.text)
                    if text:
                        yield TextDelta(text) if text is not event.text else event
                    continue
                if held:
                    yield TextDelta(held)
                    held = ""
                yield event
        if held:
            yield TextDelta(held)
    except ProviderError:
        raise
    except asyncio.CancelledError as exc:
        if stopping(exc):
            raise
        raise _raised(provider, "raised CancelledError (nothing cancelled it)") from None
    except BaseException as exc:
        if not app_failure(exc):
            raise
        log.warning("model provider %r raised", provider.name, exc_info=exc)
        raise _raised(provider, f"raised {described(exc)}") from exc


def _paired(held: str, text: str) -> tuple[str, str]:
    """``(text to pass on, high surrogate to hold)``. A provider that streams UTF-16 code units
    (JSON's ``\\ud83d`` escapes) may end one delta with the first half of an emoji and begin the
    next with the second: joined here, they are the one character they are; apart, each half
    would be stored as U+FFFD."""
    if held:
        if text and "\udc00" <= text[0] <= "\udfff":
            pair = chr(0x10000 + ((ord(held) - 0xD800) << 10) + (ord(text[0]) - 0xDC00))
            text = pair + text[1:]
        else:
            text = held + text
    if text and "\ud800" <= text[-1] <= "\udbff":
        return text[:-1], text[-1]
    return text, ""


def checked(provider: ModelProvider, event: object) -> ModelEvent:
    """``event`` as the runtime records it: text as text, a tool call with string id and name
    and JSON arguments (as JSON gives them back), a finish with a string stop reason and only
    the integer counts of its usage. Anything else is the provider's bug: a ``ProviderError``
    saying what it yielded."""
    if isinstance(event, TextDelta) and isinstance(event.text, str):
        return event
    if isinstance(event, ToolCallEvent) and isinstance(event.call, ToolCall):
        call = event.call
        if isinstance(call.id, str) and isinstance(call.name, str):
            try:
                arguments = json_round_trip(call.arguments)
            except (TypeError, ValueError, RecursionError) as exc:
                what = f"gave tool call arguments that are not JSON: {exc}"
                raise _raised(provider, what) from None
            if arguments == call.arguments:
                return event
            return ToolCallEvent(dataclasses.replace(call, arguments=arguments))
    if isinstance(event, Finished) and isinstance(event.stop_reason, str):
        usage = event.usage
        if usage is None or (
            isinstance(usage, dict) and all(_count(k, v) for k, v in usage.items())
        ):
            return event
        if isinstance(usage, dict):
            counts = {k: v for k, v in usage.items() if _count(k, v)}
            return Finished(event.stop_reason, counts or None)
    raise _raised(provider, f"yielded {_what(event)}, which is not a model event")


def _count(key: object, value: object) -> bool:
    return isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)


def _what(event: object) -> str:
    text = repr(event)
    return text if len(text) <= 120 else f"{text[:100]}..."


def _raised(provider: ModelProvider, what: str) -> ProviderError:
    return ProviderError(f"{provider.name}: the provider {what}"[:2000], kind="transient")
