"""``step.do`` and ``step.wait``: named checkpoints inside a durable tool call."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hearth import _faults
from hearth._tasks import held_the_loop
from hearth.errors import ConfigurationError, Interruption, StepError, WaitTimedOut
from hearth.ids import is_name, name_rule
from hearth.jsontext import json_round_trip, stored_round_trip

# ``step.transaction``'s way to the store: (step name, the application's async fn(conn)) → the
# recorded value, once the function's writes and the step record committed together.
Transact = Callable[[str, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


# The longest timeout hearth takes, a wait's or a submission's: each is stored as the date it
# expires, and dates end in the year 9999 (a wait's timeout of ``sys.maxsize`` failed every
# attempt of the submission computing it).
MAX_TIMEOUT_S = 100 * 365 * 86400

# Set while a ``step.transaction`` function runs: a step inside it would wait for the row its
# transaction holds locked, on another connection (a deadlock no database can see).
_IN_TRANSACTION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "hearth_step_transaction", default=None
)

# Values that come back from a store as they went in (exact types: a subclass, such as an
# ``IntEnum``, comes back as its base type, so it takes the round trip). Not every int: one of
# more digits than Python prints (4,300 by default) has no JSON form; nor every str: half a
# surrogate pair is kept as U+FFFD.
_PLAIN = frozenset({bool, type(None)})
_PLAIN_INT_BITS = 4000  # about 1,200 digits


def json_value(name: str, value: Any) -> Any:
    """What step ``name`` returned, as a store gives it back (what a replay returns too)."""
    kind = type(value)
    if kind in _PLAIN or (kind is int and value.bit_length() <= _PLAIN_INT_BITS):
        return value
    try:
        return stored_round_trip(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StepError(f"step {name!r} returned a value that is not JSON: {exc}") from None


# Step (and wait) names hearth keeps for its own bookkeeping records of a call.
RESERVED_PREFIX = "hearth."


def wait_id_for(message_id: str, tool_call_id: str, name: str) -> str:
    """The deterministic id of the wait ``name`` of one tool call (safe in a URL path)."""
    digest = hashlib.sha256(f"{message_id}\n{tool_call_id}\n{name}".encode()).hexdigest()
    return f"w_{digest[:24]}"


@dataclass(frozen=True)
class WaitOutcome:
    """How a recorded wait ended: with a value, by its timeout, or with its submission's abort."""

    value: Any = None
    timed_out: bool = False
    aborted: bool = False


class WaitPending(Interruption):
    """Raised by ``step.wait`` while its value has not arrived: the tool call stops here and the
    attempt pauses once the rest of its batch has recorded outcomes. A ``BaseException``, so that
    a tool's own ``except Exception`` does not swallow it."""

    def __init__(
        self, wait_id: str, name: str, prompt: Any, timeout: float | None, started: bool
    ) -> None:
        super().__init__(f"waiting for {name!r} ({wait_id})")
        self.wait_id = wait_id
        self.name = name
        self.prompt = prompt
        self.timeout = timeout
        self.started = started  # its wait_started record is on disk already


class Steps:
    """The ``ctx.step`` of a durable tool call.

    ``await ctx.step.do("charge", lambda: billing.charge(order))`` runs the function once per tool
    call and step name, records its JSON value durably before returning it, and returns the
    recorded value without running the function when the call is re-executed after a crash.

    ``approved = await ctx.step.wait("approval", prompt="Refund 120 EUR?", timeout=86400)``
    asks the outside world for a JSON value: the submission waits (no process needed) until it is
    resolved, then the call runs again with its earlier steps replayed and ``wait`` returning the
    value (or raising ``hearth.WaitTimedOut`` past ``timeout`` seconds).

    ``await ctx.step.transaction("book", insert_booking)`` (PostgreSQL) runs
    ``async def insert_booking(conn)`` inside the transaction that records the step, so the
    application's writes to that database commit exactly once, together with the step.
    """

    def __init__(
        self,
        tool_call_id: str,
        recorded: dict[str, Any],
        record: Callable[[str, Any, dict[str, Any]], Awaitable[None]],
        around: Callable[[str], AbstractContextManager[None]] = lambda name: (
            contextlib.nullcontext()
        ),
        *,
        message_id: str = "",
        waits_started: frozenset[str] = frozenset(),
        waits_ended: dict[str, WaitOutcome] | None = None,
        transact: Transact | None = None,
        before_run: Callable[[], Awaitable[None]] | None = None,
        capture: Callable[[], AbstractContextManager[dict[str, Any]]] = lambda: (
            contextlib.nullcontext({})
        ),
        replay: Callable[[dict[str, Any]], None] = lambda writes: None,
        recorded_sets: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.tool_call_id = tool_call_id
        # Awaited before a step's function runs (not when it replays): the attempt confirms it
        # still owns the submission, after a stop longer than its lease.
        self._before_run = before_run
        self._around = around  # wraps each step that runs: its trace span and its latency
        self.message_id = message_id
        self._recorded = dict(recorded)
        self._record = record
        self._used: set[str] = set()
        self._waits_started = waits_started  # wait ids with a wait_started record
        self._waits_ended = dict(waits_ended or {})  # wait id → how it ended
        self._transact = transact
        # The state a step's function sets is recorded with the step (``capture`` gives what it
        # set), and set again when the step replays (``replay``): its function does not run.
        self._capture = capture
        self._replay = replay
        self._recorded_sets = recorded_sets or {}

    def _claim_name(self, name: str) -> None:
        inside = _IN_TRANSACTION.get()
        if inside is not None:
            raise StepError(
                f"step {name!r} is inside the function of step.transaction {inside!r}: steps"
                " cannot be nested in it (do the work on its connection, or make it a step of"
                " its own before or after)"
            )
        if not is_name(name) and not (isinstance(name, str) and name in self._recorded):
            # (A recorded name always replays: one recorded before names had a length limit
            # stays readable.)
            raise StepError(name_rule("step", name))
        if name.startswith(RESERVED_PREFIX) and name not in self._recorded:
            raise StepError(
                f"step {name!r}: names starting with {RESERVED_PREFIX!r} are hearth's own (its"
                " bookkeeping records of a call are steps too); choose another name"
            )
        if name in self._used:
            raise StepError(f"step {name!r} was already used in this tool call; names are unique")
        self._used.add(name)

    async def do(self, name: str, fn: Callable[[], Any]) -> Any:
        self._claim_name(name)
        if name in self._recorded:
            sets = self._recorded_sets.get(name)
            if sets:
                self._replay(sets)
            return self._recorded[name]
        if self._before_run is not None:
            await self._before_run()
        with self._around(name):
            _faults.reached(f"step:{name}")
            with self._capture() as gathered:
                began = time.monotonic()
                value = fn()
                held_the_loop(f"step {name!r}", time.monotonic() - began)
                if inspect.isawaitable(value):
                    value = await value
            value = json_value(name, value)
            _faults.reached(f"step-done:{name}")
            await self._record(name, value, gathered)
        self._recorded[name] = value
        return value

    async def transaction(self, name: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``await fn(conn)`` — ``conn`` a psycopg ``AsyncConnection`` to hearth's
        PostgreSQL database, with the application's ``search_path`` — inside the transaction
        that records the step, and return its JSON value.

        The application's writes through ``conn`` and the step record commit together or not
        at all: exactly once. On a re-execution the recorded value is returned and ``fn`` does
        not run. If ``fn`` raises, both roll back and the exception reaches the tool (no step
        is recorded). Names share the namespace of ``do``; on SQLite this raises
        ``ConfigurationError``.
        """
        self._claim_name(name)
        if name in self._recorded:
            return self._recorded[name]
        if self._transact is None:
            raise ConfigurationError("step.transaction needs hearth's store on PostgreSQL")
        if self._before_run is not None:
            await self._before_run()
        with self._around(name):
            _faults.reached(f"step:{name}")
            token = _IN_TRANSACTION.set(name)
            try:
                value = await self._transact(name, fn)
            finally:
                _IN_TRANSACTION.reset(token)
        self._recorded[name] = value
        return value

    def wait_id(self, name: str) -> str:
        """The id the wait ``name`` of this call has (or will have): tell it to whoever answers."""
        return wait_id_for(self.message_id, self.tool_call_id, name)

    async def wait(self, name: str, *, prompt: Any = None, timeout: float | None = None) -> Any:
        """Wait durably for a JSON value sent from outside (``POST .../waits/{wait_id}``).

        Names share the namespace of ``do``'s step names. ``prompt`` (JSON, usually a string)
        says what is asked; ``timeout`` (seconds, None for ever) ends the wait with
        ``hearth.WaitTimedOut`` raised here.
        """
        self._claim_name(name)
        try:
            prompt = json_round_trip(prompt)
        except (TypeError, ValueError) as exc:
            raise StepError(f"the prompt of wait {name!r} is not JSON: {exc}") from None
        if timeout is not None and (
            not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 <= timeout <= MAX_TIMEOUT_S
        ):
            raise StepError(
                f"the timeout of wait {name!r} must be a number of seconds from 0 to"
                f" {MAX_TIMEOUT_S:,} (100 years); None waits for ever"
            )
        wait_id = self.wait_id(name)
        ended = self._waits_ended.get(wait_id)
        if ended is None:
            _faults.reached(f"wait:{name}")
            started = wait_id in self._waits_started
            raise WaitPending(wait_id, name, prompt, timeout, started)
        if ended.timed_out:
            raise WaitTimedOut(f"nobody answered the wait {name!r} ({wait_id}) before its timeout")
        if ended.aborted:
            raise WaitTimedOut(f"the wait {name!r} ({wait_id}) ended with its submission's abort")
        return ended.value
