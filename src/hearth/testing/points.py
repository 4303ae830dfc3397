"""Every named kill point: where a crash test may SIGKILL the process (``HEARTH_CRASH_AT``).

The scheme:

- ``before:store.<method>`` / ``after:store.<method>`` — right around each store write
  (``STORE_WRITES``): ``before`` once nothing of the call has run, ``after`` once it committed
  and returned (not reached when the write raised).
- ``before:<record type>`` / ``after:<record type>`` — around the append (or settlement) of a
  batch holding a record of that type, outside the ``store.append`` points. So a state write, a
  step record, a hook seam, a child link or a compaction each has its own pair.
- ``store:commit-begin`` / ``store:commit-done`` — where the SQLite store runs a group (on its
  writer thread, or on the event loop for a lone operation): the group's statements ran but
  COMMIT has not; COMMIT returned but no caller has heard of it.
- runner seams (``RUNNER_SEAMS``): ``model:start|chunk|end``, ``render``, ``batch:start|commit``,
  ``child:start|resume|end``, ``delta:flush``, ``compaction:start|chunk|end``, and per hook
  ``hook:<hook>`` (before each callback) and ``hook-done:<hook>`` (its callbacks ran, its seam
  is not committed).
- per tool and step name (``KILL_POINT_PATTERNS``): ``tool:<name>`` before a tool body,
  ``tool-done:<name>`` after it returned or raised and before its outcome is appended,
  ``step:<name>`` before a ``step.do`` function, ``step-done:<name>`` after it and before its
  record, ``wait:<name>`` where a ``step.wait`` without a value stops its call. The built-in
  ``task`` tool has ``tool-done:task`` (its "body" is the child).

``KILL_POINTS`` maps each concrete name to where it sits. ``#N`` after a name picks its N-th
occurrence in the process. Example::

    from hearth.testing import KILL_POINTS
    for point in KILL_POINTS:
        harness.run(dispatch=[...], crash_at=point)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hearth.records import RECORD_TYPES

# The Store methods that write, each bracketed by its ``before:/after:store.<method>`` points.
STORE_WRITES: tuple[str, ...] = (
    "admit",
    "append",
    "claim",
    "renew_all",
    "release",
    "expire_owners",
    "request_abort",
    "settle",
    "join_many",
    "begin_wait",
    "expire_waits",
)

RUNNER_SEAMS: Mapping[str, str] = MappingProxyType(
    {
        "model:start": "a model turn's request is built; the provider stream is not opened",
        "model:chunk": "an event of the model stream arrived, before it is handled",
        "model:end": "the stream ended; remaining text and the completion are not written",
        "render": "the agent function is about to render from the committed state",
        "batch:start": "a tool batch's calls are about to run",
        "batch:commit": (
            "every call of a batch has ended; the last one's outcome, the state writes and the"
            " commit are about to be appended together"
        ),
        "child:start": "a task's child conversation is created; its loop is about to run",
        "child:resume": "a dead attempt's child conversation is about to be resumed",
        "child:end": "a child's loop ended; the parent's outcome for the task is not written",
        "delta:flush": "buffered text deltas are about to be appended",
        "compaction:start": "a compaction's summary is about to be asked for",
        "compaction:chunk": "an event of the summary call's stream arrived, before it is handled",
        "compaction:end": "the summary arrived; the compaction record is not written",
        "store:commit-begin": "the store's transaction ran, COMMIT has not (a SQLite group, or a"
        " PostgreSQL transaction)",
        "store:commit-done": "COMMIT returned, no caller has heard of it",
        "tool-done:task": "a task's child ended; its tool outcome is not appended",
    }
    | {
        f"hook:{hook}": f"an {hook} callback is about to run"
        for hook in ("on_agent_start", "on_agent_finish")
    }
    | {
        f"hook-done:{hook}": f"the {hook} callbacks ran; their seam is not committed"
        for hook in ("on_agent_start", "on_agent_finish")
    }
)

# Names that depend on the app: substitute a tool's or a step's name.
KILL_POINT_PATTERNS: Mapping[str, str] = MappingProxyType(
    {
        "tool:<name>": "a tool call is about to run its body",
        "tool-done:<name>": "the tool body returned or raised; its outcome is not appended",
        "step:<name>": "a step.do is about to run its function",
        "step-done:<name>": "the step's function returned; its record is not appended",
        "wait:<name>": "a step.wait found no value yet; the call is about to stop and wait",
        "reconcile:<name>": "a cut-off call's reconcile function is about to be asked",
        "reconcile-done:<name>": "its reconcile answered; the call's outcome is not recorded",
    }
)


# The store writes of inputs from outside (channels, schedules), bracketed the same way. Only an
# app with channels or schedules reaches them, so they are kept apart from ``STORE_WRITES`` and
# ``KILL_POINTS`` (which one scenario reaches in full); chain them with the store's commit points
# to kill inside a transaction (``before:store.admit_occurrence>store:commit-done``).
INPUT_WRITES: tuple[str, ...] = (
    "admit_delivery",
    "fail_delivery",
    "open_schedule",
    "admit_occurrence",
)


def _bracketed(methods: tuple[str, ...]) -> Mapping[str, str]:
    """The ``before:`` and ``after:`` points of each of these store writes."""
    return MappingProxyType(
        {
            f"{when}:store.{method}": f"Store.{method} {what}"
            for method in methods
            for when, what in (
                ("before", "is about to be called"),
                ("after", "committed and returned"),
            )
        }
    )


INPUT_POINTS: Mapping[str, str] = _bracketed(INPUT_WRITES)


# The store write of ``step.transaction`` (PostgreSQL only), bracketed the same way; kept apart
# from ``STORE_WRITES`` (which one SQLite scenario reaches in full). Inside it, the step's
# ``step-done:<name>`` comes after the application's function ran, in the open transaction, and
# the store's ``store:commit-begin`` / ``store:commit-done`` follow.
EFFECT_WRITES: tuple[str, ...] = ("transact",)

EFFECT_POINTS: Mapping[str, str] = MappingProxyType(
    {
        "before:store.transact": "a step.transaction is about to open its transaction",
        "after:store.transact": "the step.transaction committed and returned",
    }
)


# The writes made for an operator, outside any attempt (a wait's resolve, a fork, ``hearth gc``),
# bracketed the same way.
OPERATOR_WRITES: tuple[str, ...] = ("resolve_wait", "fork", "collect_attachments")

OPERATOR_POINTS: Mapping[str, str] = _bracketed(OPERATOR_WRITES)


def _concrete() -> dict[str, str]:
    points: dict[str, str] = {}
    for method in STORE_WRITES:
        points[f"before:store.{method}"] = f"Store.{method} is about to be called"
        points[f"after:store.{method}"] = f"Store.{method} committed and returned"
    for record_type in RECORD_TYPES:
        points[f"before:{record_type}"] = f"a batch holding a {record_type} is about to be written"
        points[f"after:{record_type}"] = f"a batch holding a {record_type} was written"
    points.update(RUNNER_SEAMS)
    return points


KILL_POINTS: Mapping[str, str] = MappingProxyType(_concrete())

# Points named after a tool, step, wait, hook or ledger entry (``tool:refund``).
_NAMED = (
    *(pattern.split("<", 1)[0] for pattern in KILL_POINT_PATTERNS),
    "hook:",
    "hook-done:",
    "ledger:",
    "ledger-done:",
)


def check_crash_at(spec: str) -> str:
    """``spec`` as ``HEARTH_CRASH_AT`` takes it (``name``, ``name#N``, ``a>b#N``), or
    ``ValueError`` naming what is wrong: a point no code reaches (a typo would run the child
    to its end, no kill, and the test pass), or an occurrence that is not a whole number ≥ 1."""
    known = {**KILL_POINTS, **INPUT_POINTS, **EFFECT_POINTS, **OPERATOR_POINTS}
    for stage in spec.split(">"):
        name, hash_, count = stage.strip().partition("#")
        if hash_ and not (count.isascii() and count.isdigit() and int(count) >= 1):
            raise ValueError(f"crash_at {spec!r}: #{count} must be a whole number from 1")
        named = any(name.startswith(p) and len(name) > len(p) for p in _NAMED)
        if name not in known and not named:
            raise ValueError(
                f"crash_at {spec!r}: no point is named {name!r} (see hearth.testing.KILL_POINTS"
                " and KILL_POINT_PATTERNS)"
            )
    return spec


__all__ = [
    "EFFECT_POINTS",
    "EFFECT_WRITES",
    "INPUT_POINTS",
    "INPUT_WRITES",
    "KILL_POINTS",
    "KILL_POINT_PATTERNS",
    "OPERATOR_POINTS",
    "OPERATOR_WRITES",
    "RUNNER_SEAMS",
    "STORE_WRITES",
    "check_crash_at",
]
