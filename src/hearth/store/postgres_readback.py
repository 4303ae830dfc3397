"""Reading back a write whose COMMIT reply was lost: what it would have left, if it committed.

Each function returns the write's result when its traces are stored (so the write committed and
must not be repeated), else None (so it did not, and may be tried again).
"""

from __future__ import annotations

from hearth.records import ConversationCreated, Record
from hearth.store.postgres_ops import Conn, fetchall, fetchone
from hearth.store.rows import (
    DELIVERY_ADMITTED,
    RUNNING,
    UNSETTLED_SQL,
    Admission,
    ConversationInfo,
    DeliveryAdmission,
    Fence,
    Submission,
    delivery_from_row,
    stored_record,
    submission_from_row,
)


def same_attempt(stored: Record, submission_id: str | None, attempt: int | None) -> bool:
    """Whether ``stored`` was written by that submission's attempt. A read-back takes
    only its own attempt's records: a step's id is the same in every attempt (and a digest
    leaves the attempt out), so a stale attempt took the record of the attempt that took over
    for its own commit, and ran its next step again."""
    return (stored.submission_id, stored.attempt) == (submission_id, attempt)


async def aborting(conn: Conn, conversation_ids: list[str]) -> set[str]:
    """Of these conversations, those with unsettled work whose abort is stamped (an abort whose
    caller was cancelled committed all the same)."""
    rows = await fetchall(
        conn,
        "SELECT DISTINCT conversation_id FROM submissions WHERE conversation_id = ANY(%(c)s)"
        f" AND abort_requested_at IS NOT NULL AND {UNSETTLED_SQL}",
        {"c": conversation_ids},
    )
    return {row["conversation_id"] for row in rows}


async def admission(conn: Conn, submission_id: str) -> Admission | None:
    """The submission row an admission wrote under the id it chose beforehand."""
    row = await fetchone(conn, "SELECT * FROM submissions WHERE id = %(id)s", {"id": submission_id})
    if row is None:
        return None
    return Admission(submission_from_row(row), int(row["admitted_offset"]), False)


async def claimed(conn: Conn, token: str) -> list[Submission] | None:
    """The submissions a claim took, by the token it stamped on them."""
    rows = await fetchall(
        conn,
        "SELECT * FROM submissions WHERE claim_token = %(t)s AND status = %(r)s ORDER BY seq",
        {"t": token, "r": RUNNING},
    )
    return [submission_from_row(row) for row in rows] or None


async def settlement(conn: Conn, fence: Fence, record: Record) -> int | None:
    """The offset of a settlement record, when it is stored (the settlement committed)."""
    offsets = await appended_offsets(conn, None, [record], fence.submission_id)
    return None if offsets is None else offsets[-1]


async def joined(conn: Conn, submission_id: str, host: Fence) -> bool | None:
    """True when the submission is joined to ``host`` (the join committed)."""
    row = await fetchone(
        conn,
        "SELECT 1 AS ok FROM submissions WHERE id = %(id)s AND joined_to = %(h)s",
        {"id": submission_id, "h": host.submission_id},
    )
    return None if row is None else True


async def appended_offsets(
    conn: Conn,
    conversation_id: str | None,
    records: list[Record],
    submission_id: str | None = None,
) -> list[int] | None:
    """The offsets of ``records`` when every one of them is stored with the same content by
    the same attempt (``same_attempt``; an earlier try committed), else None. Without
    ``conversation_id``, the submission's is used."""
    if conversation_id is None:
        row = await fetchone(
            conn, "SELECT conversation_id FROM submissions WHERE id = %(id)s", {"id": submission_id}
        )
        if row is None:
            return None
        conversation_id = row["conversation_id"]
    rows = await fetchall(
        conn,
        'SELECT id, "offset", digest, body FROM records'
        " WHERE conversation_id = %(c)s AND id = ANY(%(ids)b::text[])",
        {"c": conversation_id, "ids": [r.id for r in records]},
    )
    stored = {row["id"]: row for row in rows}
    offsets = []
    for record in records:
        found = stored.get(record.id)
        if found is None or found["digest"] != record.content_digest():
            return None
        stored_by = stored_record(found["body"], conversation_id)
        if not same_attempt(stored_by, record.submission_id, record.attempt):
            return None
        offsets.append(int(found["offset"]))
    return offsets


async def delivery(
    conn: Conn, channel: str, delivery_id: str, submission_ids: list[str]
) -> DeliveryAdmission | None:
    """The delivery's row when it is admitted: by this write when it holds the submission ids
    this write chose, else by another one."""
    row = await fetchone(
        conn,
        "SELECT * FROM deliveries WHERE channel = %(ch)s AND delivery_id = %(d)s",
        {"ch": channel, "d": delivery_id},
    )
    if row is None or row["status"] != DELIVERY_ADMITTED:
        return None
    stored = delivery_from_row(row)
    return DeliveryAdmission(stored, stored.submission_ids != submission_ids)


async def forked(conn: Conn, source: str, offset: int, target: str) -> ConversationInfo | None:
    """The fork's conversation when its stream starts with this fork's ``conversation_created``
    (the fork committed)."""
    row = await fetchone(
        conn,
        "SELECT c.agent, c.last_offset, r.body FROM conversations c JOIN records r"
        ' ON r.conversation_id = c.conversation_id AND r."offset" = 0'
        " WHERE c.conversation_id = %(c)s",
        {"c": target},
    )
    if row is None:
        return None
    created = stored_record(row["body"], target)
    origin = {"conversation_id": source, "offset": offset}
    if not isinstance(created, ConversationCreated) or created.forked_from != origin:
        return None
    return ConversationInfo(target, row["agent"], offset)
