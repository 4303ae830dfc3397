"""Small helpers for the background tasks hearth's parts own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import queue
import threading
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
    """Cancel ``task`` (if any) and wait until it has ended; an error it ended with is raised.
    The caller's own cancellation goes on (``await task`` under ``suppress(CancelledError)``
    swallowed it too: a stop that was itself cancelled went on as if it had not been)."""
    if task is not None:
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.result()


def cancellation_kept(count_before: int) -> None:
    """Raise ``CancelledError`` if the running task was asked to stop since it counted
    ``count_before`` (``task.cancelling()``) and nothing raised it. Python 3.11's
    ``asyncio.wait_for`` drops a cancellation that arrives as what it waits for completes, and
    libraries hearth calls wait with it (psycopg's pool): a start cancelled at that moment went
    on, and whoever cancelled it waited for ever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > count_before:
        raise asyncio.CancelledError


def cancel_count() -> int:
    """The running task's ``cancelling()``, for ``cancellation_kept``."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


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


class AppThreads:
    """The threads an application's sync code runs on (sync tools, channel callbacks,
    reconciles): as many as there are calls running, an idle one taken again, one idle for
    ``idle_s`` let go. Not asyncio's default executor, whose min(32, cpus + 4) threads six calls
    stuck in a network read took on two cores: every later sync tool waited behind them, and so
    did hearth's own work on that executor (the store's stop, and with it the shutdown). Daemon
    threads: a call that never returns does not keep the process from exiting."""

    def __init__(self, idle_s: float = 60.0) -> None:
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job, less the jobs queued for them
        self.threads = 0

    def submit(self, fn: Callable[..., T], /, *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on one of the threads, in a copy of the caller's context."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        context = contextvars.copy_context()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = context.run(fn, *args)
            except BaseException as exc:  # the caller's to judge, as a thread pool's are
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._lock:
            new = self._idle == 0
            if new:
                self.threads += 1
            else:
                self._idle -= 1
        self._jobs.put(job)
        if new:
            threading.Thread(target=self._work, name="hearth-app", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody counts on this thread: let it go
                        self._idle -= 1
                        self.threads -= 1
                        return
                continue  # a job was queued for it just now
            job()
            del job  # its result and arguments are not kept alive while idle
            with self._lock:
                self._idle += 1


APP_THREADS = AppThreads()


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` of an application's sync code, on one of ``APP_THREADS``. A
    ``StopIteration`` it raises (a ``next()`` that found nothing) cannot be carried by a future:
    the await would never end. A ``GeneratorExit`` can, but the task awaiting it takes it for a
    close of its coroutines, which end without a word. Each arrives as a ``RuntimeError``
    naming it."""
    return await asyncio.wrap_future(APP_THREADS.submit(_stop_iteration_raised, fn, *args))


def _stop_iteration_raised(fn: Callable[..., T], /, *args: Any) -> T:
    try:
        return fn(*args)
    except (StopIteration, GeneratorExit) as exc:
        raise RuntimeError(f"{type(exc).__name__} raised: {exc!r}"[:500]) from exc
