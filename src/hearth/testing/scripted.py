"""A model provider that plays a script, for tests of hearth and of users' own agents.

The script is a list of steps, or a function of the request. With a list, the step played for a
request is chosen by the number of assistant messages already in ``request.messages``: step 0
answers the first model call of a conversation, step 1 the call after the first assistant message,
and so on. The choice depends only on the conversation, which hearth rebuilds from durable records,
so a process that restarts after a crash plays the same step for the same history.

Example::

    from hearth.testing.scripted import ScriptedModel, call, calls, reply

    model = ScriptedModel(
        "weather",
        [
            calls(call("get_weather", city="Oslo"), text="Let me check."),
            reply("It is sunny in Oslo."),
        ],
    )
    app = App(..., providers=[model])  # agents use "scripted/weather"
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from hearth.errors import ProviderError
from hearth.providers.base import (
    AssistantTurn,
    Finished,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    estimate_tokens,
)

__all__ = [
    "CallsStep",
    "ErrorStep",
    "Response",
    "ScriptStep",
    "ScriptStepFunction",
    "ScriptedModel",
    "StallStep",
    "Step",
    "StepFunction",
    "TextStep",
    "ToolCallSpec",
    "call",
    "calls",
    "error",
    "overflow",
    "reply",
    "stall",
    "stream",
]

_ERROR_KINDS = ("transient", "overflow", "terminal")


# --- steps: plain data describing one model response -------------------------------------------


@dataclass(frozen=True)
class Response:
    """What ``reply``, ``stream``, ``calls``, ``error`` and ``stall`` make: one scripted response
    (the common base lets a type checker take a list mixing them as a script)."""


@dataclass(frozen=True)
class TextStep(Response):
    """Stream ``chunks`` as text deltas, sleeping ``delays[i]`` before chunk ``i``; then stop."""

    chunks: tuple[str, ...]
    delays: tuple[float, ...]


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call to be made by a :class:`CallsStep`; ``id=None`` means ``call_{i}_{k}``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class CallsStep(Response):
    """One assistant message: optional ``text``, then the (parallel) tool ``calls``."""

    calls: tuple[ToolCallSpec, ...]
    text: str = ""


@dataclass(frozen=True)
class ErrorStep(Response):
    """Stream ``after_chunks``, then raise ``ProviderError`` with these fields."""

    kind: str
    message: str
    status: int | None = None
    retry_after: float | None = None
    after_chunks: tuple[str, ...] = ()


@dataclass(frozen=True)
class StallStep(Response):
    """Stream ``after_chunks``, then hang: forever, or for ``seconds`` and then stop normally."""

    after_chunks: tuple[str, ...] = ()
    seconds: float | None = None


ScriptStep: TypeAlias = Response | ToolCallSpec | str
"""One scripted response. A bare ``str`` means ``reply(s)``; a ``ToolCallSpec``, ``calls(c)``."""

_STEP_TYPES = (TextStep, CallsStep, ErrorStep, StallStep, ToolCallSpec, str)

ScriptStepFunction: TypeAlias = Callable[[ModelRequest], ScriptStep | Awaitable[ScriptStep]]
"""A step computed from the request, sync or async."""

# The names these had before: ``Step`` read too much like ``hearth.Steps`` (durable tool steps).
Step: TypeAlias = ScriptStep
StepFunction: TypeAlias = ScriptStepFunction


def reply(text: str) -> TextStep:
    """Answer ``text`` in one delta and stop.

    Example: ``reply("Done.")``
    """
    return TextStep(chunks=(text,), delays=(0.0,))


def stream(*chunks: str, delay: float = 0.0, delays: Sequence[float] | None = None) -> TextStep:
    """Answer one delta per chunk, sleeping before each (``delays[i]`` if given, else ``delay``).

    Example: ``stream("Hel", "lo", delay=0.05)``
    """
    if delays is None:
        per_chunk = tuple(float(delay) for _ in chunks)
    else:
        per_chunk = tuple(float(d) for d in delays)
        if len(per_chunk) != len(chunks):
            raise ValueError(f"stream() got {len(chunks)} chunks but {len(per_chunk)} delays")
    if any(d < 0 for d in per_chunk):
        raise ValueError("stream() delays must not be negative")
    return TextStep(chunks=tuple(chunks), delays=per_chunk)


def call(
    name: str,
    arguments: Mapping[str, Any] | None = None,
    /,
    *,
    id: str | None = None,
    **kwargs: Any,
) -> ToolCallSpec:
    """Describe a tool call. Arguments come from the ``arguments`` mapping and/or keywords.

    Without ``id``, the call's id is ``f"call_{i}_{k}"`` (``i`` the script position, ``k`` the
    call's index in its message). A tool argument literally named ``id`` goes in the mapping.

    Example: ``call("search", query="hearth")`` or ``call("lookup", {"id": 7}, id="c1")``
    """
    merged = dict(arguments or {})
    clash = merged.keys() & kwargs.keys()
    if clash:
        raise ValueError(f"call({name!r}) got argument(s) {sorted(clash)} twice")
    merged.update(kwargs)
    return ToolCallSpec(name=name, arguments=merged, id=id)


def calls(*tool_calls: ToolCallSpec, text: str = "") -> CallsStep:
    """One assistant message with optional ``text`` and one or more tool calls (run in parallel).

    Example: ``calls(call("a"), call("b", x=1), text="Checking both.")``
    """
    if not tool_calls:
        raise ValueError("calls() needs at least one call(...)")
    return CallsStep(calls=tuple(tool_calls), text=text)


def error(
    kind: str = "transient",
    message: str = "scripted provider error",
    *,
    status: int | None = None,
    retry_after: float | None = None,
    after_chunks: Sequence[str] = (),
) -> ErrorStep:
    """Stream ``after_chunks`` (if any), then raise ``ProviderError(message, kind=kind, ...)``.

    Example: ``error("transient", "overloaded", status=529, after_chunks=["par", "tial"])``
    """
    if kind not in _ERROR_KINDS:
        raise ValueError(f"error kind must be one of {_ERROR_KINDS}, not {kind!r}")
    return ErrorStep(
        kind=kind,
        message=message,
        status=status,
        retry_after=retry_after,
        after_chunks=_chunks(after_chunks),
    )


def stall(after_chunks: Sequence[str] = (), seconds: float | None = None) -> StallStep:
    """Stream ``after_chunks``, then hang forever (or for ``seconds``, then stop normally).

    Used to test deadlines, aborts and kills in the middle of a stream.

    Example: ``stall(["Thinking"])``
    """
    if seconds is not None and seconds < 0:
        raise ValueError("stall() seconds must not be negative")
    return StallStep(after_chunks=_chunks(after_chunks), seconds=seconds)


def overflow(message: str = "scripted model: the input exceeds the context window") -> ErrorStep:
    """Raise ``ProviderError(kind="overflow")``, as a provider does when the context is too long.

    An overflow leaves no assistant turn, so in a list the turn after the compaction would
    play it again: give it in a function of the request, e.g.
    ``lambda req: overflow() if req.purpose == "turn" and not req.summary else reply("ok")``
    (the summary call gets "ok" as its summary too).
    """
    return ErrorStep(kind="overflow", message=message)


def _chunks(chunks: Sequence[str]) -> tuple[str, ...]:
    # A lone string is one chunk, not a sequence of characters.
    return (chunks,) if isinstance(chunks, str) else tuple(chunks)


# --- the provider --------------------------------------------------------------------------------


class ScriptedModel:
    """A ``ModelProvider`` that plays a script; agents address it as ``"scripted/<name>"``.

    ``script`` is either a sequence of steps (each a :data:`ScriptStep` or a
    :data:`ScriptStepFunction`) or one :data:`ScriptStepFunction` used for every request. With a
    sequence, ``script[i]`` answers the request whose messages hold ``i`` assistant turns (aborted
    ones included); past the end, the last step is played again if ``repeat_last``, otherwise the
    request fails with a terminal ``ProviderError``. ``requests`` records the requests this
    instance received, oldest first: at least the latest ``keep_requests`` (1,000 by default;
    ``None`` keeps all), older ones dropped in batches, so that an app served with a scripted
    model for hours does not keep every request it was ever sent.

    Example::

        model = ScriptedModel("echo", lambda req: reply(f"seen {len(req.messages)} messages"))
        assert model.supports("echo") and not model.supports("other")
    """

    name: str = "scripted"

    def __init__(
        self,
        name: str,
        script: Sequence[ScriptStep | ScriptStepFunction] | ScriptStepFunction,
        *,
        context_window: int = 128_000,
        repeat_last: bool = False,
        keep_requests: int | None = 1000,
    ) -> None:
        if not name:
            raise ValueError("a ScriptedModel needs a non-empty name")
        if context_window <= 0:
            raise ValueError("context_window must be positive")
        if keep_requests is not None and (
            isinstance(keep_requests, bool)
            or not isinstance(keep_requests, int)
            or keep_requests < 1
        ):
            raise ValueError(f"keep_requests must be a positive int or None, not {keep_requests!r}")
        self.model_name = name
        self.repeat_last = repeat_last
        self.keep_requests = keep_requests
        self.requests: list[ModelRequest] = []
        self._context_window = context_window
        self._function: ScriptStepFunction | None = None
        self._steps: tuple[ScriptStep | ScriptStepFunction, ...] = ()
        if isinstance(script, Sequence) and not isinstance(script, str):
            self._steps = tuple(script)
            if repeat_last and not self._steps:
                raise ValueError("repeat_last=True needs at least one step to repeat")
        elif callable(script):
            self._function = script
        else:
            raise TypeError("script must be a sequence of steps or a function of the request")

    def __repr__(self) -> str:
        return f"ScriptedModel({self.model_name!r})"

    def supports(self, model: str) -> bool:
        return model == self.model_name

    def context_window(self, model: str) -> int:
        return self._context_window

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Play the step chosen for ``request``; cancelling stops it at once (sleeps included)."""
        self.requests.append(request)
        keep = self.keep_requests
        if keep is not None and len(self.requests) >= 2 * keep:
            del self.requests[:-keep]  # in halves: a trim per request would copy the list each
        turns = sum(1 for m in request.messages if isinstance(m, AssistantTurn))
        position = turns + _summarised(request.summary)
        if request.purpose == "summary" and self._function is None:
            # A list is the agent's turns: compaction's summary call plays none of them. Its
            # summary says how many turns it stands for, so that the turns after it go on
            # where the list was, not from its start again.
            text = f"(scripted summary of {position} assistant turns)"
            yield TextDelta(text)
            yield Finished("stop", _usage(request, text))
            return
        step = await self._step_for(position, request)

        if isinstance(step, str):
            step = reply(step)
        elif isinstance(step, ToolCallSpec):
            step = calls(step)

        if isinstance(step, TextStep):
            for chunk, delay in zip(step.chunks, step.delays, strict=True):
                await asyncio.sleep(delay)
                if chunk:
                    yield TextDelta(chunk)
            yield Finished("stop", _usage(request, "".join(step.chunks)))
        elif isinstance(step, CallsStep):
            if step.text:
                yield TextDelta(step.text)
            made = [
                ToolCall(
                    id=spec.id if spec.id is not None else f"call_{position}_{k}",
                    name=spec.name,
                    arguments=dict(spec.arguments),
                )
                for k, spec in enumerate(step.calls)
            ]
            for tool_call in made:
                yield ToolCallEvent(tool_call)
            spent = step.text + "".join(c.name + json.dumps(c.arguments) for c in made)
            yield Finished("tool_use", _usage(request, spent))
        elif isinstance(step, ErrorStep):
            for chunk in step.after_chunks:
                await asyncio.sleep(0)
                if chunk:
                    yield TextDelta(chunk)
            raise ProviderError(
                step.message, kind=step.kind, status=step.status, retry_after=step.retry_after
            )
        elif isinstance(step, StallStep):
            for chunk in step.after_chunks:
                await asyncio.sleep(0)
                if chunk:
                    yield TextDelta(chunk)
            if step.seconds is None:
                await asyncio.Event().wait()  # nothing ever sets it: hang until cancelled
            else:
                await asyncio.sleep(step.seconds)
            yield Finished("stop", _usage(request, "".join(step.after_chunks)))
        else:  # the bare base class
            raise TypeError(f"scripted model '{self.model_name}': {step!r} plays nothing")

    async def _step_for(self, position: int, request: ModelRequest) -> ScriptStep:
        chosen: ScriptStep | ScriptStepFunction
        if self._function is not None:
            chosen = self._function
        elif position < len(self._steps):
            chosen = self._steps[position]
        elif self.repeat_last:
            chosen = self._steps[-1]
        else:
            raise ProviderError(
                f"scripted model '{self.model_name}' has no response #{position}",
                kind="terminal",
            )
        if not callable(chosen):
            return chosen
        result = chosen(request)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, _STEP_TYPES):
            raise TypeError(
                f"scripted model '{self.model_name}': a step function returned {result!r}, "
                "not a step (use reply(), stream(), calls(), error(), stall() or overflow())"
            )
        return result


_SUMMARISED = re.compile(r"\(scripted summary of (\d+) assistant turns\)")


def _summarised(summary: str | None) -> int:
    """The assistant turns a list script's summary stands for (0 without one)."""
    found = _SUMMARISED.search(summary or "")
    return int(found.group(1)) if found else 0


def _usage(request: ModelRequest, output: str) -> dict[str, int]:
    return {"input_tokens": estimate_tokens(request), "output_tokens": (len(output) + 3) // 4}
