"""The rules of records and submissions that every store follows the same way.

A store persists, fences and notifies; what it persists is decided here: submission ids, the
payload digest behind idempotent admission, the ``conversation_created`` record at admission,
the settlement records of joined submissions, the fence check, how a re-appended record is
judged, and how ``state_write`` records project onto the conversation's state. Keeping them in
one place means a second store cannot drift from the first.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hearth.attachments import parts_of
from hearth.errors import (
    FencedOut,
    IdempotencyConflict,
    IntegrityError,
    InvalidInput,
    NotARestPoint,
    WaitConflict,
)
from hearth.jsontext import canonical_json, compact_json
from hearth.records import (
    ConversationCreated,
    Record,
    StateWrite,
    SubmissionSettled,
    UserMessage,
    WaitResolved,
    WaitStarted,
    unix_from_iso,
)
from hearth.store.rows import (
    ACTIVE,
    CONVERSATION_STATUSES,
    IDLE,
    OPEN_SQL,
    RUNNING,
    WAIT_ABORTED,
    WAIT_RESOLVED,
    WAIT_TIMED_OUT,
    WAITING,
    ConversationSummary,
    Fence,
    NewDelivery,
    NewSubmission,
)


def payload_refs(submission_id: str, payload: dict[str, Any]) -> list[tuple[str, str]]:
    """``(sha256, holder)`` for each attachment a submission's payload references: what keeps
    its bytes from ``hearth gc``."""
    found = payload.get("attachments")
    return [(p["sha256"], f"s:{submission_id}") for p in parts_of(found)]


def record_refs(conversation_id: str, records: Iterable[Record]) -> list[tuple[str, str]]:
    """``(sha256, holder)`` for each attachment the records reference (a ``user_message``'s
    content parts), so that a record — a fork's copy too — keeps its bytes."""
    return [
        (part["sha256"], f"r:{conversation_id}:{record.id}")
        for record in records
        if isinstance(record, UserMessage)
        for part in parts_of(record.content)
    ]


def new_submission_id() -> str:
    """A fresh, unguessable submission id (``s_`` and 20 hex digits)."""
    return "s_" + uuid.uuid4().hex[:20]


def payload_digest(kind: str, payload: dict[str, Any]) -> str:
    """What "the same payload" means for an idempotency key: kind and payload, canonical JSON."""
    canonical = json.dumps([kind, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_idempotent(new: NewSubmission, first_digest: str) -> None:
    """A key seen before must come with the payload it came with the first time."""
    if first_digest != payload_digest(new.kind, new.payload):
        raise IdempotencyConflict(
            f"idempotency key {new.idempotency_key!r} was already used in"
            f" {new.conversation_id} with a different payload; use a new key"
        )


def conversation_created(new: NewSubmission) -> ConversationCreated:
    """The record at offset 0 of a conversation, written by its first admission."""
    return ConversationCreated(
        id=f"{new.conversation_id}:created",
        agent=new.agent,
        conversation_id=new.conversation_id,
        parent=new.parent,
    )


def settlement(
    submission_id: str, outcome: str, error: dict[str, Any] | None, reply: str | None
) -> SubmissionSettled:
    """The ``submission_settled`` record of a submission (its id is deterministic)."""
    return SubmissionSettled(
        id=f"{submission_id}:settled",
        submission_id=submission_id,
        outcome=outcome,
        error=error,
        reply=reply,
    )


def check_fence(fence: Fence, status: str | None, attempt: int | None) -> None:
    """Accept a write only from the attempt that owns the submission now; ``status`` is None
    when the submission does not exist."""
    if status == RUNNING and attempt == fence.attempt:
        return
    now = "missing" if status is None else f"{status}, attempt {attempt}"
    raise FencedOut(
        f"submission {fence.submission_id} attempt {fence.attempt} no longer owns its work"
        f" (now {now}); this attempt must stop"
    )


def check_reappend(
    conversation_id: str, record: Record, digest: str, existing_offset: int, existing_digest: str
) -> int:
    """A record whose id exists is a no-op when its content is the same (its original offset is
    returned) and an integrity error otherwise."""
    if existing_digest != digest:
        raise IntegrityError(
            f"record {record.id} already exists in {conversation_id} (offset {existing_offset})"
            " with different content"
        )
    return existing_offset


def state_changes(appended: Iterable[Record]) -> dict[str, Any]:
    """The conversation state after newly appended records: each ``state_write`` sets its name,
    the later one winning. (A re-appended, old write is not new and changes nothing.)"""
    changes: dict[str, Any] = {}
    for record in appended:
        if isinstance(record, StateWrite):
            changes[record.name] = record.value
    return changes


def delivery_values(
    delivery: NewDelivery,
    status: str,
    submission_ids: list[str],
    error: dict[str, Any] | None,
    now: float | None,
) -> dict[str, Any]:
    """The named parameters a store writes a ``deliveries`` row with."""
    return {
        "channel": delivery.channel,
        "delivery_id": delivery.delivery_id,
        "type": delivery.type,
        "status": status,
        "data": to_json(delivery.data),
        "body": delivery.body,
        "headers": to_json(delivery.headers),
        "submission_ids": to_json(submission_ids),
        "error": to_json_or_none(error),
        "received_at": delivery.received_at,
        "now": now,
    }


def to_json(value: Any) -> str:
    """The stored JSON form of a value (compact, UTF-8 kept as is)."""
    return compact_json(value)


def to_json_or_none(value: Any) -> str | None:
    return None if value is None else to_json(value)


# The conversation list's indexes hold each conversation's activity to the 10 seconds: an append
# changes ``last_activity`` but, within those seconds, no indexed value, so the write touches the
# row alone (a heap-only update in PostgreSQL; no index page in SQLite). The order stays exact:
# the bucket only ever grows with ``last_activity``, and rows of one bucket are sorted on read.
ACTIVITY_BUCKET_S = 10


def activity_bucket(last_activity: float) -> int:
    """The ``activity_bucket`` a store keeps for ``last_activity``: the same double division
    and floor as the stores' own (PostgreSQL's generated column; SQLite's trigger truncates,
    which is the floor for any time since 1970). A cursor's time far outside any clock's
    (``9e90``) is held to a 63-bit integer, beyond every row's."""
    return math.floor(min(max(last_activity / ACTIVITY_BUCKET_S, -(2.0**62)), 2.0**62))


# How many conversations, newest first, the list looks through for a page of active ones before
# it reads them from the open submissions instead (``active_conversations_sql``).
ACTIVE_WINDOW = 1000


def conversation_list_sql(
    agent: bool, status: str | None, before: bool, param: Callable[[str], str]
) -> str:
    """The conversation list's query, shared by the stores: newest activity first, through the
    ``conversations_recent`` or ``conversations_recent_by_agent`` index, sorting only the rows
    of the buckets a page reaches. ``param(name)`` spells a named parameter in the store's
    dialect (``agent``, ``b`` (``activity_bucket(t)``), ``t``, ``c``, ``limit``).

    With ``status="active"`` it looks through the newest ``ACTIVE_WINDOW`` conversations only
    (active ones are few among 100,000 idle, and walking them all took 110 ms): a page it does
    not fill is read again with ``active_conversations_sql``."""
    if status is not None and status not in CONVERSATION_STATUSES:
        raise ValueError(f"status must be one of {', '.join(CONVERSATION_STATUSES)}")
    where = _list_conditions(agent, before, param)
    if status == IDLE:
        where.append(f"NOT EXISTS (SELECT 1 {_UNSETTLED})")
    page = f"SELECT c.* FROM conversations c WHERE {' AND '.join(where)} {_NEWEST_FIRST}"
    if status == ACTIVE:
        window = f"{page} LIMIT {ACTIVE_WINDOW}"
        seen = _UNSETTLED.replace("c.conversation_id", "w.conversation_id")
        page = (
            f"SELECT w.* FROM ({window}) w WHERE EXISTS (SELECT 1 {seen})"
            f" {_NEWEST_FIRST.replace('c.', 'w.')}"
        )
    return _counted(f"{page} LIMIT {param('limit')}")


def active_conversations_sql(agent: bool, before: bool, param: Callable[[str], str]) -> str:
    """The page of active conversations read from the open submissions (through
    ``submissions_by_status``), then sorted: what ``conversation_list_sql`` leaves when its
    window holds fewer than a page. It costs the open work's size, not the conversations'."""
    where = ["c.conversation_id = o.conversation_id", *_list_conditions(agent, before, param)]
    page = (  # (SQLite joins a CROSS JOIN in its written order: the open work first)
        f"SELECT c.* FROM (SELECT DISTINCT s.conversation_id FROM submissions s"
        f" WHERE s.status IN {OPEN_SQL}) o CROSS JOIN conversations c"
        f" WHERE {' AND '.join(where)} {_NEWEST_FIRST} LIMIT {param('limit')}"
    )
    return _counted(page)


_UNSETTLED = (
    f"FROM submissions s WHERE s.conversation_id = c.conversation_id AND s.status IN {OPEN_SQL}"
)
_NEWEST_FIRST = "ORDER BY c.activity_bucket DESC, c.last_activity DESC, c.conversation_id DESC"


def _list_conditions(agent: bool, before: bool, param: Callable[[str], str]) -> list[str]:
    where = ["TRUE"]
    if agent:
        where.append(f"c.agent = {param('agent')}")
    if before:
        where.append(f"c.activity_bucket <= {param('b')}")
        where.append(f"(c.last_activity, c.conversation_id) < ({param('t')}, {param('c')})")
    return where


def _counted(page: str) -> str:
    # The page first, then the open submissions of its rows only: counted in the same query,
    # each row of the buckets it reaches was counted before the sort (a first page of a bucket
    # of 100,000 conversations took 142 ms). The rows come back in no order: ``newest_first``.
    counted = _UNSETTLED.replace("c.conversation_id", "p.conversation_id")
    return f"SELECT p.*, (SELECT COUNT(*) {counted}) AS unsettled FROM ({page}) p"


def newest_first(page: list[ConversationSummary]) -> list[ConversationSummary]:
    """A page of ``conversation_list_sql`` in its order: newest activity first, ties by id."""
    return sorted(page, key=lambda c: (c.last_activity, c.conversation_id), reverse=True)


# --- durable waits ------------------------------------------------------------------------------
def carried_column(carried: Mapping[str, Any] | None) -> str | None:
    """The ``submissions.carried`` column that ``begin_wait`` stores (NULL for nothing)."""
    return compact_json(dict(carried)) if carried else None


def wait_row(record: WaitStarted) -> dict[str, Any]:
    """The columns of a ``waits`` row that a ``wait_started`` record opens."""
    expires = None if record.expires_at is None else unix_from_iso(record.expires_at)
    return {
        "wait_id": record.wait_id,
        "submission_id": record.submission_id,
        "tool_call_id": record.tool_call_id,
        "name": record.name,
        "prompt": to_json(record.prompt),
        "expires_at": expires,
    }


def wait_resolved(
    wait_id: str,
    submission_id: str,
    attempt: int,
    *,
    value: Any = None,
    timed_out: bool = False,
    aborted: bool = False,
) -> WaitResolved:
    """The ``wait_resolved`` record that ends a wait (its id is deterministic: written once).
    It carries the attempt that paused, which no longer runs."""
    return WaitResolved(
        id=f"{wait_id}:resolved",
        submission_id=submission_id,
        attempt=attempt,
        wait_id=wait_id,
        value=value,
        timed_out=timed_out,
        aborted=aborted,
    )


def canonical(value: Any) -> str:
    """What "the same value" means for a repeated resolve: canonical JSON."""
    return canonical_json(value)


def judge_resolve(
    wait_id: str,
    state: str,
    stored_value: str | None,
    status: str | None,
    value: Any,
    expired: bool = False,
) -> bool:
    """Whether a resolve with ``value`` writes now (True) or repeats an identical one (False);
    ``WaitConflict`` when the wait cannot take it. ``status`` is its submission's; ``expired``
    says its timeout has passed (a pending wait that no expiry pass has ended yet: while no
    process ran, say)."""
    if state == WAIT_RESOLVED:
        if stored_value is not None and canonical(json.loads(stored_value)) == canonical(value):
            return False
        raise WaitConflict(f"wait {wait_id} was already resolved with another value")
    if state == WAIT_TIMED_OUT or expired:
        raise WaitConflict(f"wait {wait_id} timed out before it was resolved")
    if state == WAIT_ABORTED:
        raise WaitConflict(f"wait {wait_id} ended: its submission was aborted")
    if status != WAITING:
        raise WaitConflict(f"the submission of wait {wait_id} is {status}, not waiting")
    return True


# --- forks (SPEC §17) ---------------------------------------------------------------------------
def rest_points(
    settlements: Iterable[int], submissions: Iterable[tuple[int, int | None]]
) -> list[int]:
    """The offsets a conversation may be forked at, ascending: 0 (before any submission), and
    each settlement's offset ``K`` at which no submission is open — none admitted before the
    record at ``K`` was written (its admission offset, the stream's last offset then, is below
    ``K``) and settled after it. ``submissions`` are ``(admitted_offset, settlement offset or
    None)`` pairs."""
    blocked: list[tuple[int, int]] = []  # offsets a submission is open at, as closed ranges
    for admitted, settled in submissions:
        low, high = admitted + 1, (settled - 1 if settled is not None else _NO_END)
        if low <= high:
            blocked.append((low, high))
    blocked.sort()
    merged: list[tuple[int, int]] = []
    for low, high in blocked:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    starts = [low for low, _ in merged]
    points = {0}
    for offset in settlements:
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0 or merged[i][1] < offset:
            points.add(offset)
    return sorted(points)


_NO_END = 2**62  # a submission not settled yet is open at every later offset


# How many forks of forks a fork's rest points are followed back through (past that, a fork's
# copied settlements are judged as its own: a bound on the reads, not a case met in practice).
MAX_FORK_DEPTH = 64


def forked_from(created: Record | None) -> tuple[str, int] | None:
    """The conversation and offset a conversation was forked from, given its first record."""
    if not isinstance(created, ConversationCreated) or not created.forked_from:
        return None
    origin = created.forked_from
    return str(origin["conversation_id"]), int(origin["offset"])


def inherited_rest_points(own: list[int], forked_at: int, origin: list[int]) -> list[int]:
    """A fork's rest points: its origin's up to the offset it was forked at (the records there
    are copies, and their submissions' rows stayed with the origin: judged alone, every copied
    settlement looked like a rest point, a joined message's host's included), then its own."""
    return sorted({p for p in origin if p <= forked_at} | {p for p in own if p > forked_at})


def check_fork(source: str, offset: int, last_offset: int, points: list[int]) -> None:
    """A fork at ``offset`` needs an offset inside the stream (``InvalidInput``) that is one of
    its rest ``points`` (``NotARestPoint`` naming the nearest ones)."""
    if not 0 <= offset <= last_offset:
        raise InvalidInput(
            f"offset must be between 0 and {last_offset}, the last offset of {source}", "offset"
        )
    if offset in points:
        return
    i = bisect.bisect_left(points, offset)
    nearest = [points[i - 1]] if i > 0 else []
    nearest += points[i : i + 1]
    named = " and ".join(str(p) for p in nearest)
    raise NotARestPoint(
        f"offset {offset} of {source} is not a rest point (a settlement with no submission open"
        f" at it, or 0); the nearest are {named}",
        nearest,
    )


def fork_records(
    source: str, offset: int, target: str, agent: str, records: Sequence[Record]
) -> list[Record]:
    """The stream of a fork of ``source`` at ``offset``: its own ``conversation_created`` with
    ``forked_from``, then copies of records 1..``offset`` with fresh ids, each at its original
    offset (so a compaction's ``first_kept_offset`` stays right)."""
    copies = [fork_copy(record, target) for record in records if 0 < record.offset <= offset]
    return [fork_created(source, offset, target, agent), *copies]


def fork_created(source: str, offset: int, target: str, agent: str) -> ConversationCreated:
    """The ``conversation_created`` that opens a fork of ``source`` at ``offset``."""
    return ConversationCreated(
        id=f"{target}:created",
        agent=agent,
        conversation_id=target,
        forked_from={"conversation_id": source, "offset": offset},
    )


def fork_copy(record: Record, target: str) -> Record:
    """A fork's copy of ``record``: a fresh id, the same offset."""
    return dataclasses.replace(record, id=f"{target}:copy:{record.offset}")


# The record types looked up by type (``last_of_type``, a fork's evidence), each with a partial
# index of its own in both stores; a query uses it when it names the type literally
# (``type = 'compaction'``), not as a parameter.
TYPES_BY_INDEX = frozenset({"compaction", "submission_settled"})


def fork_evidence_sql(param: Callable[[str], str]) -> tuple[str, str]:
    """The two reads a fork judges its offset by, shared by the stores: the offsets of the
    source's settlement records, and each submission's admission offset with the offset of its
    settlement record (NULL while unsettled). ``param(name)`` spells a named parameter."""
    settlements = (
        'SELECT "offset" AS settled FROM records'
        f" WHERE conversation_id = {param('c')} AND type = 'submission_settled'"
    )
    submissions = (
        'SELECT s.admitted_offset AS admitted, (SELECT r."offset" FROM records r'
        " WHERE r.conversation_id = s.conversation_id AND r.type = 'submission_settled'"
        " AND r.submission_id = s.id) AS settled"
        f" FROM submissions s WHERE s.conversation_id = {param('c')}"
    )
    return settlements, submissions
