"""Small helpers for the background tasks hearth's parts own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended, its cancellation swallowed."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
