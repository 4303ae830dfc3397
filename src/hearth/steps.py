"""``step.do``: named checkpoints inside a durable tool call."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

from hearth import _faults
from hearth.errors import StepError


class Steps:
    """The ``ctx.step`` of a durable tool call.

    ``await ctx.step.do("charge", lambda: billing.charge(order))`` runs the function once per tool
    call and step name, records its JSON value durably before returning it, and returns the
    recorded value without running the function when the call is re-executed after a crash.
    """

    def __init__(
        self,
        tool_call_id: str,
        recorded: dict[str, Any],
        record: Callable[[str, Any], Awaitable[None]],
        around: Callable[[str], AbstractContextManager[None]] = lambda name: (
            contextlib.nullcontext()
        ),
    ) -> None:
        self.tool_call_id = tool_call_id
        self._around = around  # wraps each step that runs: its trace span and its latency
        self._recorded = dict(recorded)
        self._record = record
        self._used: set[str] = set()

    async def do(self, name: str, fn: Callable[[], Any]) -> Any:
        if not isinstance(name, str) or not name:
            raise StepError("a step name must be a non-empty string")
        if name in self._used:
            raise StepError(f"step {name!r} was already used in this tool call; names are unique")
        self._used.add(name)
        if name in self._recorded:
            return self._recorded[name]
        with self._around(name):
            _faults.reached(f"step:{name}")
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            try:
                value = json.loads(json.dumps(value))
            except (TypeError, ValueError) as exc:
                raise StepError(f"step {name!r} returned a value that is not JSON: {exc}") from None
            _faults.reached(f"step-done:{name}")
            await self._record(name, value)
        self._recorded[name] = value
        return value
