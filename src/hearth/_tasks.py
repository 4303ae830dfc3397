"""Small helpers for the background tasks hearth's parts own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger("hearth")

# Sync application code that runs this long on the event loop is reported: every other
# conversation and the leases' heartbeats share the loop.
HELD_THE_LOOP_S = 1.0


def held_the_loop(what: str, seconds: float) -> None:
    """Report ``what`` (a sync step function, a hook) if it held the loop ``HELD_THE_LOOP_S``."""
    if seconds >= HELD_THE_LOOP_S:
        log.warning(
            "%s ran %.1f s on the event loop (a sync function): every other conversation and"
            " the leases' heartbeats waited meanwhile, and past the lease a peer takes the work"
            " over and runs it again; give blocking work as `lambda: asyncio.to_thread(work)`"
            " or as an async function",
            what,
            seconds,
        )


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended, its cancellation swallowed."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_to_end(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` (a stop: it must end by itself) to its end, even if the caller is cancelled
    meanwhile, then let the caller's cancellation go on. An anyio cancel scope cancels again at
    every await, and a task may be cancelled twice: a stop cut short left half its work."""
    running = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    # The shield keeps an enclosing anyio scope from cancelling this task again and again;
    # a plain asyncio cancel arrives once per ``cancel()``, and is held until the end.
    with anyio.CancelScope(shield=True):
        while not running.done():
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError as exc:
                cancelled = exc
    if cancelled is not None:
        raise cancelled
    running.result()


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` for an application's sync code. A ``StopIteration`` it raises (a
    ``next()`` that found nothing) cannot be carried by a future: the await would never end. A
    ``GeneratorExit`` can, but the task awaiting it takes it for a close of its coroutines,
    which end without a word. Each arrives as a ``RuntimeError`` naming it."""
    return await asyncio.to_thread(_stop_iteration_raised, fn, *args, **kwargs)


def _stop_iteration_raised(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except (StopIteration, GeneratorExit) as exc:
        raise RuntimeError(f"{type(exc).__name__} raised: {exc!r}"[:500]) from exc
