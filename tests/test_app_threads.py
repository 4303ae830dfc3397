"""The threads an application's sync code runs on: taken again while idle, let go after."""

from __future__ import annotations

import contextvars
import threading
import time

from hearth._tasks import AppThreads

_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_an_idle_thread_is_taken_again_and_let_go_after_its_idle_time() -> None:
    threads = AppThreads(idle_s=0.2)
    first = threads.submit(threading.get_ident).result(5)
    assert threads.submit(threading.get_ident).result(5) == first  # one thread, taken again
    assert threads.threads == 1
    for _ in range(500):
        if threads.threads == 0:
            break
        time.sleep(0.01)
    assert threads.threads == 0
    assert threads.submit(lambda: "again").result(5) == "again"  # a new one when none is left


def test_a_call_that_never_returns_does_not_hold_up_the_next() -> None:
    threads = AppThreads()
    stuck = threading.Event()
    try:
        held = [threads.submit(stuck.wait, 30) for _ in range(40)]
        assert threads.submit(lambda: 7).result(5) == 7
        assert threads.threads == 41
        assert not any(f.done() for f in held)
    finally:
        stuck.set()


def test_a_call_runs_in_a_copy_of_the_callers_context_and_its_exception_comes_back() -> None:
    threads = AppThreads()
    _who.set("caller")
    assert threads.submit(_who.get).result(5) == "caller"

    def leave() -> None:
        raise SystemExit(2)

    try:
        threads.submit(leave).result(5)
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("SystemExit did not come back")
