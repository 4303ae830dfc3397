"""Asking a tool's ``reconcile`` function about a call whose outcome is unknown.

The decision *whether* a call may be reconciled is the recovery classifier's (pure, from the
records); this module does the asking — the I/O — with a bounded time, and turns anything but a
clear ``Done`` or ``NotDone`` into "unknown" (the ``interrupted`` marker), logging why.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any

from hearth._tasks import in_thread
from hearth.effects import Answer, Done, NotDone, ReconcileCall
from hearth.errors import app_failure
from hearth.records import AssistantToolCall
from hearth.tools import Tool, thread_still_running, to_json_value

log = logging.getLogger("hearth.reconcile")


def reconcile_call(call: AssistantToolCall, conversation_id: str) -> ReconcileCall:
    """What ``reconcile`` is told of a call: the attempt is the one that made (and ran) it."""
    return ReconcileCall(
        tool_call_id=call.tool_call_id,
        name=call.name,
        arguments=call.arguments,
        conversation_id=conversation_id,
        attempt=call.attempt or 0,
    )


async def ask(tool: Tool, call: ReconcileCall) -> Answer:
    """``tool.reconcile(call)`` within ``tool.reconcile_timeout`` seconds: ``Done`` (its result
    JSON), ``NotDone``, or None for unknown — a timeout, an exception or any other answer."""
    fn = tool.reconcile
    if fn is None:
        return None
    end = time.monotonic() + tool.reconcile_timeout
    # A sync call of this process may still run on its worker thread (an abort or a lost lease
    # stops waiting for it, not the thread): wait for it, or give up and keep the marker.
    running = thread_still_running(call.conversation_id, call.tool_call_id)
    if running is not None and not await in_thread(running.wait, tool.reconcile_timeout):
        log.warning(
            "reconcile of %s (%s): the call still runs on a thread of this process; its outcome"
            " stays unknown",
            call.tool_call_id,
            call.name,
        )
        return None
    caller = asyncio.current_task()
    try:
        async with asyncio.timeout(max(end - time.monotonic(), 0.001)):
            answer = await _call(fn, call)
    except TimeoutError:
        log.warning(
            "reconcile of %s (%s) gave no answer within %g s; its outcome stays unknown",
            call.tool_call_id,
            call.name,
            tool.reconcile_timeout,
        )
        return None
    except BaseException as exc:
        if not app_failure(exc, caller):
            raise
        log.warning(
            "reconcile of %s (%s) raised; its outcome stays unknown",
            call.tool_call_id,
            call.name,
            exc_info=True,
        )
        return None
    return _checked(answer, call)


async def _call(fn: Any, call: ReconcileCall) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(call)
    answer = await in_thread(fn, call)  # a sync lookup must not stall the event loop
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


def _checked(answer: Any, call: ReconcileCall) -> Answer:
    if answer is None or isinstance(answer, NotDone):
        return answer
    if isinstance(answer, Done):
        if answer.error is not None:
            if isinstance(answer.error, str | BaseException):
                return answer
        else:
            try:
                return Done(to_json_value(answer.result))
            except TypeError as exc:
                log.warning(
                    "reconcile of %s (%s): Done's result is not JSON (%s); its outcome stays"
                    " unknown",
                    call.tool_call_id,
                    call.name,
                    exc,
                )
                return None
    log.warning(
        "reconcile of %s (%s) answered %r, not hearth.Done, hearth.NotDone or None; its outcome"
        " stays unknown",
        call.tool_call_id,
        call.name,
        answer,
    )
    return None
