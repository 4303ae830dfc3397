"""The PostgreSQL store's operations: SQL and row mapping, each run inside one transaction.

Every write takes the row locks that make it safe beside other processes: an append locks its
conversation's row (so offsets are allocated densely and in commit order), a fenced write locks
its submission's row (so a claim cannot change hands before the write commits). The rules of
what to write come from ``hearth.store.rules``; ``NOW`` is the store's clock in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from hearth.errors import (
    AbortRequested,
    ConversationExists,
    ConversationNotFound,
    HearthError,
    StoreError,
    WaitNotFound,
)
from hearth.records import ConversationCreated, Record, WaitStarted
from hearth.store import rules
from hearth.store.events import ABORT, ADMITTED, APPENDED, RELEASED, SETTLED, Event
from hearth.store.rows import (
    DELIVERY_ADMITTED,
    DELIVERY_FAILED,
    JOINED,
    OPEN_SQL,
    QUEUED,
    RUNNING,
    UNSETTLED_SQL,
    WAIT_ABORTED,
    WAIT_PENDING,
    WAIT_RESOLVED,
    WAIT_TIMED_OUT,
    WAITING,
    Admission,
    Blob,
    ConversationInfo,
    DeliveryAdmission,
    Fence,
    NewDelivery,
    NewSubmission,
    ScheduleCursor,
    StoredDelivery,
    TurnView,
    Wait,
    blob_from_row,
    cursor_from_row,
    delivery_from_row,
    stored_record,
    stored_state,
    submission_from_row,
    wait_from_row,
)
from hearth.store.rows import SETTLED as SETTLED_STATUS

Conn = psycopg.AsyncConnection[dict[str, Any]]
Cursor = psycopg.AsyncCursor[dict[str, Any]]
Outbox = list[Event]

# The injected clock when a test gives one, else the database server's clock.
NOW = "COALESCE(%(now)s::float8, extract(epoch FROM clock_timestamp()))"

# Only heads are looked at (one per conversation: its oldest queued or running submission), so a
# claim costs the same however many submissions wait behind them. A head locked by another
# claimer is skipped; once locked, its conditions are checked again on its newest version.
CLAIM = f"""
WITH picked AS (
    SELECT seq FROM submissions
    WHERE is_head AND status IN ('queued', 'running')
      AND (status = 'queued' OR (status = 'running' AND COALESCE(lease_expires_at, 0) <= {NOW}))
      AND NOT (conversation_id = ANY(%(excluded)b::text[]))
      AND (NOT %(aborting_only)s OR abort_requested_at IS NOT NULL)
      AND (%(agents)b::text[] IS NULL OR accepted_at <= {NOW} - %(others_after)s
           OR split_part(conversation_id, '/', 1) = ANY(%(agents)b::text[]))
    ORDER BY seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE submissions AS u SET
    status = 'running',
    attempt = u.attempt + 1,
    lease_owner = %(owner)s,
    lease_expires_at = {NOW} + %(lease_s)s,
    claim_token = %(token)s,
    started_at = COALESCE(u.started_at, {NOW}),
    deadline = COALESCE(u.deadline, {NOW} + u.timeout)
FROM picked WHERE u.seq = picked.seq
RETURNING u.*, {NOW} AS claimed_at
"""


async def fetchone(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any] | None:
    cursor = await conn.execute(query.encode(), params)
    return await cursor.fetchone()


async def fetchall(conn: Conn, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = await conn.execute(query.encode(), params)
    return await cursor.fetchall()


async def check_fence(conn: Conn, fence: Fence, *, lock: str = "SHARE") -> dict[str, Any]:
    row = await fetchone(
        conn, f"SELECT * FROM submissions WHERE id = %(id)s FOR {lock}", {"id": fence.submission_id}
    )
    rules.check_fence(
        fence, None if row is None else row["status"], None if row is None else row["attempt"]
    )
    assert row is not None
    return row


async def append(
    conn: Conn, conversation_id: str, records: list[Record], outbox: Outbox, now: float | None
) -> list[int]:
    locked = await _lock_conversation(conn, conversation_id)
    if locked is not None:
        last = locked
    elif (
        records
        and isinstance(records[0], ConversationCreated)
        and records[0].conversation_id == conversation_id
    ):
        created = records[0]
        await create_conversation(conn, conversation_id, created.agent, created.parent, now)
        last = -1
    else:
        raise StoreError(f"conversation {conversation_id} does not exist; admit a submission first")
    return await append_locked(conn, conversation_id, records, last, outbox, now)


async def append_locked(
    conn: Conn,
    conversation_id: str,
    records: list[Record],
    last: int,
    outbox: Outbox,
    now: float | None,
) -> list[int]:
    """``append`` once the conversation's row is locked at offset ``last``."""
    start = last
    if len(records) > 1 and await _insert_all(conn, conversation_id, records, last):
        offsets, new = list(range(last + 1, last + 1 + len(records))), records
        last += len(records)
    else:
        offsets, new = [], []
        for record in records:
            offset = await _insert_one(conn, conversation_id, record, last)
            if offset > last:
                last = offset
                new.append(record)
            offsets.append(offset)
    await add_refs(conn, rules.record_refs(conversation_id, new))
    for name, value in rules.state_changes(new).items():
        await conn.execute(
            "INSERT INTO state (conversation_id, name, value) VALUES (%(c)s, %(n)s, %(v)s)"
            " ON CONFLICT (conversation_id, name) DO UPDATE SET value = excluded.value",
            {"c": conversation_id, "n": name, "v": rules.to_json(value)},
        )
    if last != start:
        await conn.execute(
            f"UPDATE conversations SET last_offset = %(o)s, last_activity = {NOW}"
            " WHERE conversation_id = %(c)s",
            {"o": last, "c": conversation_id, "now": now},
        )
        outbox.append(Event(APPENDED, conversation_id, last))
    return offsets


INSERT_RECORDS = """
INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)
SELECT %(c)s, r.o, r.id, r.t, r.s, r.b, r.d
FROM unnest(%(os)b::bigint[], %(ids)b::text[], %(ts)b::text[], %(ss)b::text[], %(bs)b::text[],
            %(ds)b::text[]) AS r(o, id, t, s, b, d)
ON CONFLICT DO NOTHING
RETURNING id
"""


async def _insert_all(conn: Conn, conversation_id: str, records: list[Record], last: int) -> bool:
    """Insert ``records`` after ``last`` in one statement; False (with nothing left inserted)
    when one of them exists already, so they must go one by one."""
    rows = await fetchall(
        conn, INSERT_RECORDS, {"c": conversation_id, **record_arrays(records, last + 1)}
    )
    if len(rows) == len(records):
        return True
    if rows:  # inserted by this transaction at offsets that are now wrong: take them back
        await conn.execute(
            "DELETE FROM records WHERE conversation_id = %(c)s AND id = ANY(%(ids)b::text[])",
            {"c": conversation_id, "ids": [row["id"] for row in rows]},
        )
    return False


async def _insert_one(conn: Conn, conversation_id: str, record: Record, last: int) -> int:
    """Insert ``record`` at ``last + 1``, or find it stored with the same content; its offset."""
    body, digest = record.encode(last + 1)
    inserted = await fetchone(
        conn,
        'INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)'
        " VALUES (%(c)s, %(o)s, %(id)s, %(t)s, %(s)s, %(b)s, %(d)s)"
        " ON CONFLICT DO NOTHING RETURNING 1 AS ok",
        {
            "c": conversation_id,
            "o": last + 1,
            "id": record.id,
            "t": record.type,
            "s": record.submission_id,
            "b": body,
            "d": digest,
        },
    )
    if inserted is not None:
        return last + 1
    existing = await fetchone(
        conn,
        'SELECT "offset", digest FROM records WHERE conversation_id = %(c)s AND id = %(id)s',
        {"c": conversation_id, "id": record.id},
    )
    if existing is None:
        raise StoreError(f"offset {last + 1} of {conversation_id} is taken: corrupt stream")
    return rules.check_reappend(
        conversation_id, record, digest, int(existing["offset"]), existing["digest"]
    )


async def create_conversation(
    conn: Conn, conversation_id: str, agent: str, parent: Any, now: float | None
) -> None:
    await conn.execute(
        "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at,"
        f" last_activity) VALUES (%(c)s, %(a)s, %(p)s, -1, {NOW}, {NOW})"
        " ON CONFLICT DO NOTHING".encode(),
        {"c": conversation_id, "a": agent, "p": rules.to_json_or_none(parent), "now": now},
    )


_SETTLEMENTS, _SUBMISSION_SPANS = rules.fork_evidence_sql(lambda name: f"%({name})s")


async def _rest_points(conn: Conn, conversation_id: str, depth: int = 0) -> list[int]:
    settlements = [r["settled"] for r in await fetchall(conn, _SETTLEMENTS, {"c": conversation_id})]
    spans = [
        (r["admitted"], r["settled"])
        for r in await fetchall(conn, _SUBMISSION_SPANS, {"c": conversation_id})
    ]
    points = rules.rest_points(settlements, spans)
    first = await fetchone(
        conn,
        'SELECT body FROM records WHERE conversation_id = %(c)s AND "offset" = 0',
        {"c": conversation_id},
    )
    origin = rules.forked_from(
        None if first is None else stored_record(first["body"], conversation_id)
    )
    if origin is None or depth >= rules.MAX_FORK_DEPTH:
        return points
    inherited = await _rest_points(conn, origin[0], depth + 1)
    return rules.inherited_rest_points(points, origin[1], inherited)


async def fork(
    conn: Conn, source: str, offset: int, target: str, outbox: Outbox, now: float | None
) -> ConversationInfo:
    # FOR SHARE: no append or admission to the source commits while the fork reads it.
    row = await fetchone(
        conn,
        "SELECT agent, last_offset FROM conversations WHERE conversation_id = %(c)s FOR SHARE",
        {"c": source},
    )
    if row is None:
        raise ConversationNotFound(f"no conversation {source!r}")
    if await last_offset(conn, target) >= 0:  # (the insert below settles a race)
        raise ConversationExists(f"conversation {target!r} already exists; fork to a new id")
    points = await _rest_points(conn, source)
    rules.check_fork(source, offset, int(row["last_offset"]), points)
    created = await fetchone(
        conn,
        "INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at,"
        f" last_activity) VALUES (%(c)s, %(a)s, NULL, -1, {NOW}, {NOW})"
        " ON CONFLICT DO NOTHING RETURNING 1 AS ok",
        {"c": target, "a": row["agent"], "now": now},
    )
    if created is None:
        raise ConversationExists(f"conversation {target!r} already exists; fork to a new id")
    # In chunks: each one's decoding and encoding is short, so the event loop runs between
    # them and the transaction never idles long (all of a long stream at once held the loop for
    # seconds, and the server ended the transaction as idle).
    await append(conn, target, [rules.fork_created(source, offset, target, row["agent"])], [], now)
    copied_to = 0
    while copied_to < offset:
        bodies = await fetchall(
            conn,
            'SELECT body FROM records WHERE conversation_id = %(c)s AND "offset" > %(after)s'
            ' AND "offset" <= %(o)s ORDER BY "offset" LIMIT %(n)s',
            {"c": source, "after": copied_to, "o": offset, "n": FORK_CHUNK},
        )
        if not bodies:
            break
        copies = [rules.fork_copy(stored_record(r["body"], source), target) for r in bodies]
        await append(conn, target, copies, [], now)
        copied_to = copies[-1].offset
    outbox.append(Event(APPENDED, target, offset))
    return ConversationInfo(target, row["agent"], offset)


# How many records a fork copies per statement (``fork``).
FORK_CHUNK = 1000


async def admit(
    conn: Conn, new: NewSubmission, submission_id: str, outbox: Outbox, now: float | None
) -> Admission:
    conversation_id = new.conversation_id
    offset = await _lock_conversation(conn, conversation_id)
    if offset is None:
        await create_conversation(conn, conversation_id, new.agent, new.parent, now)
        offset = await _lock_conversation(conn, conversation_id)
        assert offset is not None
    if offset < 0:
        created: list[Record] = [rules.conversation_created(new)]
        offset = (await append_locked(conn, conversation_id, created, offset, outbox, now))[-1]
    if new.idempotency_key is not None:
        row = await fetchone(
            conn,
            "SELECT * FROM submissions WHERE conversation_id = %(c)s AND idempotency_key = %(k)s",
            {"c": conversation_id, "k": new.idempotency_key},
        )
        if row is not None:
            rules.check_idempotent(new, row["payload_digest"])
            return Admission(submission_from_row(row), int(row["admitted_offset"]), True)
    row = await fetchone(
        conn,
        "INSERT INTO submissions (id, conversation_id, kind, payload, idempotency_key,"
        " payload_digest, admitted_offset, status, attempt, max_attempts, timeout, accepted_at,"
        " is_head, source, traceparent) VALUES (%(id)s, %(c)s, %(kind)s, %(payload)s, %(key)s,"
        f" %(digest)s, %(offset)s, 'queued', 0, %(max)s, %(timeout)s, {NOW}, NOT EXISTS ("
        "SELECT 1 FROM submissions WHERE conversation_id = %(c)s"
        f" AND status IN {OPEN_SQL}), %(source)s, %(traceparent)s)"
        " RETURNING *",
        {
            "id": submission_id,
            "c": conversation_id,
            "kind": new.kind,
            "payload": rules.to_json(new.payload),
            "key": new.idempotency_key,
            "digest": rules.payload_digest(new.kind, new.payload),
            "offset": offset,
            "max": new.max_attempts,
            "timeout": new.timeout,
            "now": now,
            "source": rules.to_json_or_none(new.source),
            "traceparent": new.traceparent,
        },
    )
    assert row is not None
    await store_blobs(conn, new.blobs, now)
    await add_refs(conn, rules.payload_refs(submission_id, new.payload))
    outbox.append(Event(ADMITTED, conversation_id, offset, submission_id))
    return Admission(submission_from_row(row), offset, False)


# An admission as one round trip: statements in one simple query, which PostgreSQL runs as one
# transaction, each with a snapshot of its own. The lock is taken as ``admit`` takes it; the
# insert, with a snapshot taken once the lock is held, sees every admission committed before it
# (so that one submission of an idle conversation becomes its head), and inserts nothing when
# the idempotency key is taken (``admit`` then answers). Values are bound by the client, so each
# is cast to its column's type.
_ADMIT_LOCK = """
SELECT last_offset FROM conversations WHERE conversation_id = %(c)s FOR UPDATE;
"""
_ADMIT_INSERT = f"""
INSERT INTO submissions (id, conversation_id, kind, payload, idempotency_key, payload_digest,
    admitted_offset, status, attempt, max_attempts, timeout, accepted_at, is_head, source,
    traceparent)
SELECT %(id)s::text, %(c)s::text, %(kind)s::text, %(payload)s::text, %(key)s::text,
    %(digest)s::text, c.last_offset, 'queued', 0, %(max)s::int, %(timeout)s::float8, {NOW},
    NOT EXISTS (SELECT 1 FROM submissions WHERE conversation_id = %(c)s AND status IN {OPEN_SQL}),
    %(source)s::text, %(traceparent)s::text
FROM conversations c
WHERE c.conversation_id = %(c)s AND c.last_offset >= 0
  AND NOT EXISTS (
    SELECT 1 FROM submissions WHERE conversation_id = %(c)s AND idempotency_key = %(key)s)
RETURNING *
"""
ADMIT_FAST = _ADMIT_LOCK + _ADMIT_INSERT
_ADMIT_LOCK_ONE = _ADMIT_LOCK.strip().removesuffix(";")  # one statement, to be prepared
# The same for a conversation this process has not seen: it is created with its first record
# unless it exists (the creation and the first record are no-ops then). One statement each, so
# that a group prepares them; joined, they are the admission in one simple query.
_NEW_CONVERSATION = f"""
INSERT INTO conversations (conversation_id, agent, parent, last_offset, created_at, last_activity)
VALUES (%(c)s::text, %(agent)s::text, %(parent)s::text, -1, {NOW}, {NOW})
ON CONFLICT DO NOTHING
"""
_FIRST_RECORD = """
INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)
SELECT %(c)s::text, 0, %(rid)s::text, %(rtype)s::text, NULL, %(rbody)s::text, %(rdigest)s::text
FROM conversations WHERE conversation_id = %(c)s AND last_offset = -1
"""
_FIRST_OFFSET = f"""
UPDATE conversations SET last_offset = 0, last_activity = {NOW}
WHERE conversation_id = %(c)s AND last_offset = -1
RETURNING 1 AS created
"""
_CREATING = (_NEW_CONVERSATION, _ADMIT_LOCK_ONE, _FIRST_RECORD)  # then _FIRST_OFFSET
ADMIT_FAST_NEW = ";\n".join(q.strip() for q in [*_CREATING, _FIRST_OFFSET, _ADMIT_INSERT])


def fast_admittable(new: NewSubmission) -> bool:
    """Whether ``admit_fast`` may admit ``new`` (nothing to store beside its row)."""
    return not new.blobs and not rules.payload_refs("", new.payload)


async def admit_fast(
    conn: Conn,
    new: NewSubmission,
    submission_id: str,
    outbox: Outbox,
    now: float | None,
    *,
    known: bool,
) -> Admission | None:
    """``admit`` in one round trip, for a submission ``fast_admittable`` accepted; ``known``:
    the conversation is known to exist. None when nothing was written (the idempotency key is
    taken, or a ``known`` conversation does not exist)."""
    values = _admit_values(new, submission_id, now)
    if not known:
        values |= _creation_values(new)
    cursor = psycopg.AsyncClientCursor(conn)
    await cursor.execute((ADMIT_FAST if known else ADMIT_FAST_NEW).encode(), values)
    created = False
    if not known:
        cursor.nextset()  # the lock
        cursor.nextset()  # the first record
        cursor.nextset()  # the offset it moved
        created = await cursor.fetchone() is not None
    cursor.nextset()  # the insert
    row = await cursor.fetchone()
    if row is None:
        return None
    if created:
        outbox.append(Event(APPENDED, new.conversation_id, 0))
    return _admitted(row, outbox)


def _admitted(row: dict[str, Any], outbox: Outbox) -> Admission:
    """The admission an inserted ``submissions`` row makes, its event in ``outbox``."""
    offset = int(row["admitted_offset"])
    outbox.append(Event(ADMITTED, row["conversation_id"], offset, row["id"]))
    return Admission(submission_from_row(row), offset, False)


def _admit_values(new: NewSubmission, submission_id: str, now: float | None) -> dict[str, Any]:
    """The values ``ADMIT_FAST`` binds."""
    return {
        "id": submission_id,
        "c": new.conversation_id,
        "kind": new.kind,
        "payload": rules.to_json(new.payload),
        "key": new.idempotency_key,
        "digest": rules.payload_digest(new.kind, new.payload),
        "max": new.max_attempts,
        "timeout": new.timeout,
        "now": now,
        "source": rules.to_json_or_none(new.source),
        "traceparent": new.traceparent,
    }


def _creation_values(new: NewSubmission) -> dict[str, Any]:
    """The values the statements creating ``new``'s conversation bind (``ADMIT_FAST_NEW``)."""
    first = rules.conversation_created(new)
    body, digest = first.encode(0)
    return {
        "agent": new.agent,
        "parent": rules.to_json_or_none(new.parent),
        "rid": first.id,
        "rtype": first.type,
        "rbody": body,
        "rdigest": digest,
    }


async def admit_group(
    conn: Conn,
    admissions: list[tuple[NewSubmission, str, bool]],
    outbox: Outbox,
    now: float | None,
) -> list[Admission | None]:
    """``admit_fast`` for several submissions ``(new, submission id, known)``, one per
    conversation, in one round trip and one transaction: each one's statements, in the order of
    their conversations (so two groups lock their rows in the same order and cannot deadlock).
    Each answer is as ``admit_fast``'s: None where nothing was written. Any error rolls back all
    of them.

    The statements go as one pipeline of prepared statements: the server parses and plans each
    once per connection, not once per admission (sent as one simple query instead, the same
    statements cost the server twice the CPU per admission in ``bench/admission.py``)."""
    order = sorted(range(len(admissions)), key=lambda ix: admissions[ix][0].conversation_id)
    answered: list[tuple[int, Cursor | None, Cursor]] = []
    async with conn.pipeline(), conn.transaction():
        for ix in order:
            new, sid, known = admissions[ix]
            values = _admit_values(new, sid, now)
            if known:
                await conn.execute(_ADMIT_LOCK_ONE, values, prepare=True)
                created = None
            else:
                values |= _creation_values(new)
                for statement in _CREATING:
                    await conn.execute(statement, values, prepare=True)
                # A row when this admission created the conversation's first record.
                created = await conn.execute(_FIRST_OFFSET, values, prepare=True)
            answered.append((ix, created, await conn.execute(_ADMIT_INSERT, values, prepare=True)))
    answers: list[Admission | None] = [None] * len(admissions)
    for ix, created, inserted in answered:
        row = await inserted.fetchone()
        if created is not None and await created.fetchone() is not None:
            outbox.append(Event(APPENDED, admissions[ix][0].conversation_id, 0))
        if row is not None:
            answers[ix] = _admitted(row, outbox)
    return answers


# What an attempt reads at a turn boundary, in one round trip: three reads in one simple query.
TURN_VIEW = """
SELECT body FROM records WHERE conversation_id = %(c)s AND "offset" > %(a)s ORDER BY "offset";
SELECT name, value FROM state WHERE conversation_id = %(c)s;
SELECT * FROM submissions WHERE id = %(id)s
"""


async def turn_view(conn: Conn, values: dict[str, Any]) -> TurnView:
    """``Store.turn_view`` for ``values`` ``c`` (conversation), ``a`` (after), ``id``."""
    cursor = psycopg.AsyncClientCursor(conn)
    await cursor.execute(TURN_VIEW.encode(), values)
    records = [stored_record(row["body"], values["c"]) for row in await cursor.fetchall()]
    cursor.nextset()
    pairs = ((row["name"], row["value"]) for row in await cursor.fetchall())
    state = stored_state(pairs, values["c"])
    cursor.nextset()
    row = await cursor.fetchone()
    return TurnView(records, state, None if row is None else submission_from_row(row))


async def _lock_conversation(conn: Conn, conversation_id: str) -> int | None:
    """Lock the conversation's row (admissions and appends to it wait their turn); its last
    offset, or None when it does not exist."""
    row = await fetchone(
        conn,
        "SELECT last_offset FROM conversations WHERE conversation_id = %(c)s FOR UPDATE",
        {"c": conversation_id},
    )
    return None if row is None else int(row["last_offset"])


# Insert the bytes, or lock the stored copy without rewriting it (``DO UPDATE ... WHERE false``
# locks the conflicting row all the same): a concurrent ``hearth gc`` then skips it, or, holding
# it first, makes this insert wait and store it anew.
STORE_BLOB = f"""
INSERT INTO attachments (sha256, media_type, size, data, created_at)
VALUES (%(sha)s, %(mt)s, %(size)s, %(data)s, {NOW})
ON CONFLICT (sha256) DO UPDATE SET size = attachments.size WHERE false
"""


async def store_blobs(conn: Conn, blobs: tuple[Blob, ...], now: float | None) -> None:
    for blob in blobs:
        values = {
            "sha": blob.sha256, "mt": blob.media_type, "size": blob.size, "data": blob.data,
            "now": now,
        }  # fmt: skip
        await conn.execute(STORE_BLOB.encode(), values)


async def add_refs(conn: Conn, refs: list[tuple[str, str]]) -> None:
    if refs:
        await conn.execute(
            "INSERT INTO attachment_refs (sha256, holder) SELECT * FROM"
            " unnest(%(s)b::text[], %(h)b::text[]) ON CONFLICT DO NOTHING",
            {"s": [sha for sha, _ in refs], "h": [holder for _, holder in refs]},
        )


async def get_attachment(conn: Conn, sha256: str, with_data: bool) -> Blob | None:
    columns = "sha256, media_type, size, created_at" + (", data" if with_data else "")
    row = await fetchone(
        conn, f"SELECT {columns} FROM attachments WHERE sha256 = %(s)s", {"s": sha256}
    )
    return None if row is None else blob_from_row(row)


UNREFERENCED = (
    "SELECT sha256, media_type, size, created_at FROM attachments a WHERE NOT EXISTS"
    " (SELECT 1 FROM attachment_refs r WHERE r.sha256 = a.sha256) ORDER BY sha256"
)


async def collect_attachments(conn: Conn, dry_run: bool) -> list[Blob]:
    """Lock the unreferenced attachments (skipping any an admission holds), then delete those
    still unreferenced as a fresh statement sees them (it sees every admission that committed
    before the lock was taken)."""
    if dry_run:
        return [blob_from_row(row) for row in await fetchall(conn, UNREFERENCED, {})]
    locked = await fetchall(conn, UNREFERENCED + " FOR UPDATE SKIP LOCKED", {})
    if not locked:
        return []
    rows = await fetchall(
        conn,
        "DELETE FROM attachments a WHERE sha256 = ANY(%(s)s) AND NOT EXISTS"
        " (SELECT 1 FROM attachment_refs r WHERE r.sha256 = a.sha256)"
        " RETURNING sha256, media_type, size, created_at",
        {"s": [row["sha256"] for row in locked]},
    )
    return sorted((blob_from_row(row) for row in rows), key=lambda b: b.sha256)


async def settle(
    conn: Conn,
    fence: Fence,
    batch: list[Record],
    result: tuple[str, dict[str, Any] | None, str | None],
    outbox: Outbox,
    now: float | None,
) -> int:
    outcome, error, reply = result
    host = await check_fence(conn, fence, lock="UPDATE")
    conversation_id = host["conversation_id"]
    last = await _lock_conversation(conn, conversation_id)
    if last is None:
        raise StoreError(f"conversation {conversation_id} does not exist")
    # The messages that joined this one settle with it, each by its own record after the batch.
    joined = [
        row["id"]
        for row in await fetchall(
            conn,
            "SELECT id FROM submissions WHERE joined_to = %(id)s AND status = %(j)s"
            " AND settled_at IS NULL ORDER BY seq FOR UPDATE",
            {"id": fence.submission_id, "j": JOINED},
        )
    ]
    records = batch + [rules.settlement(sid, outcome, error, reply) for sid in joined]
    offsets = await append_locked(conn, conversation_id, records, last, outbox, now)
    offset = offsets[len(batch) - 1]
    values = {
        "outcome": outcome,
        "error": rules.to_json_or_none(error),
        "reply": reply,
        "now": now,
        "id": fence.submission_id,
        "c": conversation_id,
        "settled": SETTLED_STATUS,
    }
    settled = await fetchone(conn, SETTLE_HOST, values)
    assert settled is not None
    row = submission_from_row(settled)
    outbox.append(Event(SETTLED, conversation_id, offset, fence.submission_id, fence.attempt, row))
    if joined:
        rows = await fetchall(
            conn,
            "UPDATE submissions SET outcome = %(outcome)s, error = %(error)s, reply = %(reply)s,"
            f" settled_at = {NOW} WHERE id = ANY(%(ids)b::text[]) RETURNING *",
            {**values, "ids": joined},
        )
        guests = {r["id"]: submission_from_row(r) for r in rows}
        for sid, at in zip(joined, offsets[len(batch) :], strict=True):
            outbox.append(Event(SETTLED, conversation_id, at, sid, row=guests.get(sid)))
    return offset


# The host's settlement, and the next queued submission of its conversation becomes the head
# (a queued row, never the host's own).
SETTLE_HOST = f"""
WITH host AS (
    UPDATE submissions SET status = %(settled)s, outcome = %(outcome)s, error = %(error)s,
        reply = %(reply)s, settled_at = {NOW}, lease_owner = NULL, lease_expires_at = NULL,
        is_head = false
    WHERE id = %(id)s
    RETURNING *),
head AS (
    UPDATE submissions SET is_head = true WHERE seq = (
        SELECT min(seq) FROM submissions WHERE conversation_id = %(c)s AND status = 'queued')
    RETURNING 1)
SELECT * FROM host
"""


async def join(
    conn: Conn,
    host: Fence,
    submission_id: str,
    batch: list[Record],
    outbox: Outbox,
    now: float | None,
) -> bool:
    """Join ``submission_id`` to the host's attempt and append ``batch`` (its input)."""
    row = await fetchone(
        conn,
        JOIN,
        {
            "j": JOINED,
            "q": QUEUED,
            "host": host.submission_id,
            "attempt": host.attempt,
            "id": submission_id,
            "now": now,
        },
    )
    if row is None:
        await check_fence(conn, host)  # FencedOut when the host's claim is gone
        return False  # not queued (any more), or of another conversation
    await append(conn, row["conversation_id"], batch, outbox, now)
    return True


# A queued submission joins the host's running attempt: the host's row is locked as by
# ``check_fence`` (SHARE), the joining one as by its update; nothing changes unless both hold.
JOIN = f"""
UPDATE submissions SET status = %(j)s, joined_to = %(host)s, started_at = {NOW}
WHERE id = %(id)s AND status = %(q)s AND conversation_id = (
    SELECT conversation_id FROM submissions
    WHERE id = %(host)s AND status = 'running' AND attempt = %(attempt)s
    FOR SHARE)
RETURNING conversation_id
"""


async def release(
    conn: Conn, fence: Fence, owner: str, outbox: Outbox, graceful: bool = False
) -> bool:
    row = await fetchone(
        conn,
        "UPDATE submissions SET lease_expires_at = 0, lease_owner = NULL,"
        " releases = releases + %(g)s"
        " WHERE id = %(id)s AND status = %(r)s AND attempt = %(a)s AND lease_owner = %(o)s"
        " RETURNING conversation_id",
        {"id": fence.submission_id, "r": RUNNING, "a": fence.attempt, "o": owner,
         "g": int(graceful)},
    )  # fmt: skip
    if row is None:
        return False
    outbox.append(Event(RELEASED, row["conversation_id"], submission_id=fence.submission_id))
    return True


async def expire_owners(conn: Conn, owners: list[str], outbox: Outbox) -> int:
    rows = await fetchall(
        conn,
        "UPDATE submissions SET lease_expires_at = 0 WHERE status = %(r)s"
        " AND lease_owner = ANY(%(owners)b::text[])"
        " AND (lease_expires_at IS NULL OR lease_expires_at <> 0)"
        " RETURNING id, conversation_id",
        {"r": RUNNING, "owners": owners},
    )
    outbox.extend(Event(RELEASED, row["conversation_id"], submission_id=row["id"]) for row in rows)
    return len(rows)


class RowsLocked(HearthError):
    """A row the write needs is locked by another transaction (an open ``step.transaction``)
    for longer than the write would wait."""


async def request_abort(
    conn: Conn,
    conversation_id: str,
    outbox: Outbox,
    now: float | None,
    *,
    lock_wait_ms: int | None = None,
) -> list[str]:
    """``Store.request_abort``; with ``lock_wait_ms``, ``RowsLocked`` after waiting that long
    for a locked row (a running ``step.transaction`` holds its submission's row).

    The rows are locked in admission order first, the order a settlement locks its row and
    then the next one's: one ``UPDATE`` of them all locked them in the order it found them,
    and an abort racing a settlement deadlocked."""
    if lock_wait_ms is not None:
        await conn.execute(f"SET LOCAL lock_timeout = {int(lock_wait_ms)}".encode())
    try:
        locked = await fetchall(
            conn,
            f"SELECT id FROM submissions WHERE conversation_id = %(c)s AND {UNSETTLED_SQL}"
            " ORDER BY seq FOR UPDATE",
            {"c": conversation_id},
        )
        rows = await fetchall(
            conn,
            f"UPDATE submissions SET abort_requested_at = COALESCE(abort_requested_at, {NOW})"
            " WHERE id = ANY(%(ids)s::text[]) RETURNING id, seq, status",
            {"ids": [row["id"] for row in locked], "now": now},
        )
        rows.sort(key=lambda r: int(r["seq"]))
        for row in rows:
            if row["status"] == WAITING:
                for wait in await pending_waits(conn, row["id"], lock=True):
                    await end_wait(conn, wait, WAIT_ABORTED, None, outbox, now)
                await resume(conn, row["id"], outbox, now)
        ids = [row["id"] for row in rows]
        if ids:
            outbox.append(Event(ABORT, conversation_id, await last_offset(conn, conversation_id)))
    except psycopg.errors.LockNotAvailable:
        raise RowsLocked(f"a submission of {conversation_id} is locked") from None
    return ids


# --- durable waits --------------------------------------------------------------------------------
# Locks are taken submission first, then its waits, by every write here (and by an abort), so two
# of them racing on one wait wait for each other instead of deadlocking.
async def begin_wait(
    conn: Conn,
    fence: Fence,
    started: list[tuple[str, WaitStarted]],
    carried: Mapping[str, Any] | None,
    outbox: Outbox,
    now: float | None,
) -> None:
    row = await check_fence(conn, fence, lock="UPDATE")
    if row["abort_requested_at"] is not None:
        raise AbortRequested(f"submission {fence.submission_id} is being aborted; it cannot wait")
    for conversation_id, record in started:
        await append(conn, conversation_id, [record], outbox, now)
        await conn.execute(
            "INSERT INTO waits (conversation_id, wait_id, submission_id, tool_call_id, name,"
            " prompt, expires_at, created_at, state) VALUES (%(c)s, %(wait_id)s,"
            " %(submission_id)s, %(tool_call_id)s, %(name)s, %(prompt)s, %(expires_at)s,"
            f" {NOW}, %(p)s) ON CONFLICT (conversation_id, wait_id) DO NOTHING".encode(),
            {"c": conversation_id, "now": now, "p": WAIT_PENDING, **rules.wait_row(record)},
        )
    if not await pending_waits(conn, fence.submission_id):
        raise StoreError(f"submission {fence.submission_id} has no pending wait to wait for")
    await conn.execute(
        "UPDATE submissions SET status = %(w)s, lease_owner = NULL, lease_expires_at = NULL,"
        f" waits = waits + 1, waiting_since = {NOW}, carried = %(k)s WHERE id = %(id)s".encode(),
        {"w": WAITING, "id": fence.submission_id, "now": now, "k": rules.carried_column(carried)},
    )


async def resolve_wait(
    conn: Conn, conversation_id: str, wait_id: str, value: Any, outbox: Outbox, now: float | None
) -> Wait:
    key = {"c": conversation_id, "w": wait_id}
    found = await fetchone(
        conn,
        "SELECT submission_id FROM waits WHERE conversation_id = %(c)s AND wait_id = %(w)s",
        key,
    )
    if found is None:
        raise WaitNotFound(f"no wait {wait_id!r} in conversation {conversation_id}")
    sub = await fetchone(
        conn,
        "SELECT status FROM submissions WHERE id = %(id)s FOR UPDATE",
        {"id": found["submission_id"]},
    )
    row = await fetchone(
        conn,
        f"SELECT *, COALESCE(expires_at <= {NOW}, false) AS expired FROM waits"
        " WHERE conversation_id = %(c)s AND wait_id = %(w)s FOR UPDATE",
        {**key, "now": now},
    )
    assert row is not None
    wait = wait_from_row(row)
    status = None if sub is None else sub["status"]
    expired = bool(row["expired"])
    if rules.judge_resolve(wait_id, wait.state, row["value"], status, value, expired):
        await end_wait(conn, wait, WAIT_RESOLVED, value, outbox, now)
        await resume(conn, wait.submission_id, outbox, now)
        row = await fetchone(conn, "SELECT * FROM waits WHERE seq = %(s)s", {"s": wait.seq})
        assert row is not None
    return wait_from_row(row)


async def expire_waits(conn: Conn, limit: int, outbox: Outbox, now: float | None) -> list[Wait]:
    due = await fetchall(
        conn,
        "SELECT seq, submission_id FROM waits WHERE state = %(p)s AND expires_at IS NOT NULL"
        f" AND expires_at <= {NOW} ORDER BY expires_at LIMIT %(l)s",
        {"p": WAIT_PENDING, "now": now, "l": limit},
    )
    ended = []
    for item in due:
        await fetchone(
            conn,
            "SELECT 1 AS ok FROM submissions WHERE id = %(id)s FOR UPDATE",
            {"id": item["submission_id"]},
        )
        row = await fetchone(
            conn,
            "SELECT * FROM waits WHERE seq = %(s)s AND state = %(p)s FOR UPDATE",
            {"s": item["seq"], "p": WAIT_PENDING},
        )
        if row is None:
            continue  # a peer ended it meanwhile
        wait = wait_from_row(row)
        await end_wait(conn, wait, WAIT_TIMED_OUT, None, outbox, now)
        await resume(conn, wait.submission_id, outbox, now)
        ended.append(wait)
    return ended


async def end_wait(
    conn: Conn, wait: Wait, state: str, value: Any, outbox: Outbox, now: float | None
) -> None:
    """Close a pending wait: its ``wait_resolved`` record and its row, together."""
    sub = await fetchone(
        conn, "SELECT attempt FROM submissions WHERE id = %(id)s", {"id": wait.submission_id}
    )
    record = rules.wait_resolved(
        wait.wait_id,
        wait.submission_id,
        0 if sub is None else int(sub["attempt"]),
        value=value,
        timed_out=state == WAIT_TIMED_OUT,
        aborted=state == WAIT_ABORTED,
    )
    await append(conn, wait.conversation_id, [record], outbox, now)
    await conn.execute(
        f"UPDATE waits SET state = %(st)s, value = %(v)s, resolved_at = {NOW}"
        " WHERE seq = %(s)s".encode(),
        {
            "st": state,
            "v": rules.to_json(value) if state == WAIT_RESOLVED else None,
            "now": now,
            "s": wait.seq,
        },
    )


async def resume(conn: Conn, submission_id: str, outbox: Outbox, now: float | None) -> None:
    """A waiting submission with no pending wait left is queued again; its deadline moves on
    by the time it waited (waiting does not count toward ``Durability.timeout``)."""
    if await pending_waits(conn, submission_id):
        return
    row = await fetchone(
        conn,
        "UPDATE submissions SET status = %(q)s,"
        f" deadline = deadline + GREATEST(0, {NOW} - COALESCE(waiting_since, {NOW})),"
        " waiting_since = NULL WHERE id = %(id)s AND status = %(w)s RETURNING conversation_id",
        {"q": QUEUED, "w": WAITING, "id": submission_id, "now": now},
    )
    if row is not None:
        conversation_id = row["conversation_id"]
        offset = await last_offset(conn, conversation_id)
        outbox.append(Event(ADMITTED, conversation_id, offset, submission_id))


async def pending_waits(conn: Conn, submission_id: str, *, lock: bool = False) -> list[Wait]:
    rows = await fetchall(
        conn,
        "SELECT * FROM waits WHERE submission_id = %(id)s AND state = %(p)s ORDER BY seq"
        + (" FOR UPDATE" if lock else ""),
        {"id": submission_id, "p": WAIT_PENDING},
    )
    return [wait_from_row(row) for row in rows]


async def last_offset(conn: Conn, conversation_id: str) -> int:
    row = await fetchone(
        conn,
        "SELECT last_offset FROM conversations WHERE conversation_id = %(c)s",
        {"c": conversation_id},
    )
    return -1 if row is None else int(row["last_offset"])


# --- channel deliveries and schedule cursors ---------------------------------------------------
async def delivery_row(
    conn: Conn, channel: str, delivery_id: str, *, lock: bool = False
) -> StoredDelivery | None:
    row = await fetchone(
        conn,
        "SELECT * FROM deliveries WHERE channel = %(ch)s AND delivery_id = %(d)s"
        + (" FOR UPDATE" if lock else ""),
        {"ch": channel, "d": delivery_id},
    )
    return None if row is None else delivery_from_row(row)


# A delivery routed again keeps its first arrival, and shows what its latest routing was given
# (the body a failure failed on, or the one admitted); each routing counts one attempt.
UPSERT_DELIVERY = f"""
INSERT INTO deliveries (channel, delivery_id, type, status, data, body, headers, submission_ids,
    error, attempts, received_at, updated_at)
VALUES (%(channel)s, %(delivery_id)s, %(type)s, %(status)s, %(data)s, %(body)s, %(headers)s,
    %(submission_ids)s, %(error)s, 1, %(received_at)s, {NOW})
ON CONFLICT (channel, delivery_id) DO UPDATE SET
    type = excluded.type, data = excluded.data, body = excluded.body, headers = excluded.headers,
    status = excluded.status, submission_ids = excluded.submission_ids, error = excluded.error,
    attempts = deliveries.attempts + 1, updated_at = excluded.updated_at
"""

# Claims the delivery's key first: a second process admitting it at once waits here for the
# first one's transaction, then finds the delivery admitted.
CLAIM_DELIVERY = f"""
INSERT INTO deliveries (channel, delivery_id, type, status, data, body, headers, submission_ids,
    error, attempts, received_at, updated_at)
VALUES (%(channel)s, %(delivery_id)s, %(type)s, 'pending', %(data)s, %(body)s, %(headers)s,
    '[]', NULL, 0, %(received_at)s, {NOW})
ON CONFLICT (channel, delivery_id) DO NOTHING
"""


async def admit_delivery(
    conn: Conn,
    delivery: NewDelivery,
    submissions: list[tuple[NewSubmission, str]],
    outbox: Outbox,
    now: float | None,
) -> DeliveryAdmission:
    values = rules.delivery_values(
        delivery, DELIVERY_ADMITTED, [sid for _, sid in submissions], None, now
    )
    await conn.execute(CLAIM_DELIVERY.encode(), values)
    known = await delivery_row(conn, delivery.channel, delivery.delivery_id, lock=True)
    if known is not None and known.status == DELIVERY_ADMITTED:
        return DeliveryAdmission(known, True)
    # Conversation rows are locked in one global order, so that two deliveries admitted at once
    # to the same conversations cannot deadlock; the ids keep the dispatches' order.
    ids = [""] * len(submissions)
    for i in sorted(range(len(submissions)), key=lambda i: submissions[i][0].conversation_id):
        new, sid = submissions[i]
        ids[i] = (await admit(conn, new, sid, outbox, now)).submission.id
    values["submission_ids"] = rules.to_json(ids)
    await conn.execute(UPSERT_DELIVERY.encode(), values)
    stored = await delivery_row(conn, delivery.channel, delivery.delivery_id)
    assert stored is not None
    return DeliveryAdmission(stored, False)


async def fail_delivery(
    conn: Conn, delivery: NewDelivery, error: dict[str, Any], now: float | None
) -> StoredDelivery:
    await conn.execute(
        CLAIM_DELIVERY.encode(), rules.delivery_values(delivery, DELIVERY_FAILED, [], error, now)
    )
    known = await delivery_row(conn, delivery.channel, delivery.delivery_id, lock=True)
    if known is None or known.status != DELIVERY_ADMITTED:
        await conn.execute(
            UPSERT_DELIVERY.encode(),
            rules.delivery_values(delivery, DELIVERY_FAILED, [], error, now),
        )
    stored = await delivery_row(conn, delivery.channel, delivery.delivery_id)
    assert stored is not None
    return stored


async def open_schedule(conn: Conn, name: str, spec: str, now: float) -> ScheduleCursor:
    values = {"n": name, "s": spec, "c": now, "now": now}
    await conn.execute(
        "INSERT INTO schedules (name, spec, cursor, last_occurrence, updated_at)"
        " VALUES (%(n)s, %(s)s, %(c)s, NULL, %(now)s) ON CONFLICT (name) DO NOTHING",
        values,
    )
    await conn.execute(
        "UPDATE schedules SET spec = %(s)s, cursor = %(c)s, updated_at = %(now)s"
        " WHERE name = %(n)s AND spec <> %(s)s",
        values,
    )
    row = await fetchone(conn, "SELECT * FROM schedules WHERE name = %(n)s", values)
    assert row is not None
    return cursor_from_row(row)


async def admit_occurrence(
    conn: Conn,
    name: str,
    spec: str,
    cursor: float,
    occurrence: float,
    admission: tuple[NewSubmission, str],
    outbox: Outbox,
    now: float | None,
) -> Admission | None:
    moved = await fetchone(
        conn,
        f"UPDATE schedules SET cursor = %(o)s, last_occurrence = %(o)s, updated_at = {NOW}"
        " WHERE name = %(n)s AND spec = %(s)s AND cursor = %(c)s RETURNING 1 AS ok",
        {"o": occurrence, "n": name, "s": spec, "c": cursor, "now": now},
    )
    if moved is None:
        return None
    new, submission_id = admission
    return await admit(conn, new, submission_id, outbox, now)


# The fenced attempt's claim, locked as ``check_fence`` locks it (the first CTE of a statement).
_FENCE = """WITH fence AS (
    SELECT 1 FROM submissions
    WHERE id = %(sid)s AND status = 'running' AND attempt = %(attempt)s
    FOR SHARE),"""

# A fenced append in one statement, for the common case: the appender knows the conversation's
# last offset (it appended there before), so the records are encoded with their offsets up front.
# The fence is checked and the conversation's row locked as in ``check_fence`` and ``append``; if
# the offset moved meanwhile (another writer appended), nothing is written and the caller takes
# the general path.
FAST_APPEND = f"""
{_FENCE}
moved AS (
    UPDATE conversations SET last_offset = %(last)s, last_activity = {NOW}
    WHERE conversation_id = %(c)s AND last_offset = %(expect)s AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1),
added AS (
    INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)
    SELECT %(c)s, r.o, r.id, r.t, r.s, r.b, r.d
    FROM moved, unnest(%(os)b::bigint[], %(ids)b::text[], %(ts)b::text[], %(ss)b::text[],
                       %(bs)b::text[], %(ds)b::text[]) AS r(o, id, t, s, b, d)
    RETURNING 1)
SELECT count(*) AS added FROM added
"""

# The same for one record, without arrays (most steps append one).
FAST_APPEND_ONE = FAST_APPEND.replace(
    """SELECT %(c)s, r.o, r.id, r.t, r.s, r.b, r.d
    FROM moved, unnest(%(os)b::bigint[], %(ids)b::text[], %(ts)b::text[], %(ss)b::text[],
                       %(bs)b::text[], %(ds)b::text[]) AS r(o, id, t, s, b, d)""",
    "SELECT %(c)s, %(o)s, %(id)s, %(t)s, %(s)s, %(b)s, %(d)s FROM moved",
)


def fast_appendable(conversation_id: str, records: list[Record]) -> bool:
    """Whether ``records`` may go by the one-statement path (no state, no attachment refs)."""
    return bool(records) and not (
        rules.state_changes(records) or rules.record_refs(conversation_id, records)
    )


def fast_append(
    conversation_id: str, records: list[Record], expect: int, fence: Fence, now: float | None
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters that append ``records`` after offset ``expect`` (records
    that ``fast_appendable`` accepted)."""
    if len(records) == 1:
        [record] = records
        body, digest = record.encode(expect + 1)
        return FAST_APPEND_ONE, {
            "sid": fence.submission_id,
            "attempt": fence.attempt,
            "now": now,
            "c": conversation_id,
            "expect": expect,
            "last": expect + 1,
            "o": expect + 1,
            "id": record.id,
            "t": record.type,
            "s": record.submission_id,
            "b": body,
            "d": digest,
        }
    return FAST_APPEND, {
        "sid": fence.submission_id,
        "attempt": fence.attempt,
        "now": now,
        "c": conversation_id,
        "expect": expect,
        "last": expect + len(records),
        **record_arrays(records, expect + 1),
    }


def record_arrays(records: list[Record], first: int) -> dict[str, list[Any]]:
    """The array parameters (``os``, ``ids``, ``ts``, ``ss``, ``bs``, ``ds``) that insert
    ``records`` at offsets ``first``, ``first + 1``, ... through ``unnest``."""
    encoded = [record.encode(first + i) for i, record in enumerate(records)]
    return {
        "os": list(range(first, first + len(records))),
        "ids": [record.id for record in records],
        "ts": [record.type for record in records],
        "ss": [record.submission_id for record in records],
        "bs": [body for body, _ in encoded],
        "ds": [digest for _, digest in encoded],
    }


# A join as one statement, for its common case: the host's process knows the conversation's last
# offset, and the input is one record. The host's fence, the joining row (queued, in that
# conversation) and the offset are checked and locked as ``join`` and ``append`` do; unless all
# three hold, nothing is written and the caller takes the general path.
FAST_JOIN = f"""
{_FENCE}
guest AS (
    SELECT 1 FROM submissions
    WHERE id = %(guest)s AND status = %(q)s AND conversation_id = %(c)s
    FOR UPDATE),
moved AS (
    UPDATE conversations SET last_offset = %(last)s, last_activity = {NOW}
    WHERE conversation_id = %(c)s AND last_offset = %(expect)s
      AND EXISTS (SELECT 1 FROM fence) AND EXISTS (SELECT 1 FROM guest)
    RETURNING 1),
joined AS (
    UPDATE submissions SET status = %(j)s, joined_to = %(sid)s, started_at = {NOW}
    WHERE id = %(guest)s AND EXISTS (SELECT 1 FROM moved)
    RETURNING 1),
added AS (
    INSERT INTO records (conversation_id, "offset", id, type, submission_id, body, digest)
    SELECT %(c)s, %(o)s, %(id)s, %(t)s, %(s)s, %(b)s, %(d)s FROM moved
    RETURNING 1)
SELECT (SELECT count(*) FROM added) + (SELECT count(*) FROM joined) AS done
"""


# The same join, for one of several sent together in one transaction: it also needs the one
# before it (``prev``) to have joined this host, so that none ever joins ahead of an earlier one
# (even when another writer moved the offset by exactly one in between).
FAST_JOIN_NEXT = FAST_JOIN.replace(
    "AND EXISTS (SELECT 1 FROM guest)",
    "AND EXISTS (SELECT 1 FROM guest) AND EXISTS (SELECT 1 FROM submissions"
    " WHERE id = %(prev)s AND status = %(j)s AND joined_to = %(sid)s)",
)
assert FAST_JOIN_NEXT != FAST_JOIN


def fast_join(
    conversation_id: str,
    host: Fence,
    submission_id: str,
    record: Record,
    expect: int,
    now: float | None,
    prev: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters that join ``submission_id`` with its input ``record`` (one
    that ``fast_appendable`` accepted) after offset ``expect`` (and after ``prev`` joined, when
    given); it did when ``done`` is 2."""
    _, params = fast_append(conversation_id, [record], expect, host, now)
    params |= {"guest": submission_id, "q": QUEUED, "j": JOINED}
    if prev is None:
        return FAST_JOIN, params
    return FAST_JOIN_NEXT, {**params, "prev": prev}


async def fast_join_many(conn: Conn, statements: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Run ``fast_join`` statements in one simple query (one round trip, one implicit
    transaction); each one's ``done``."""
    cursor = psycopg.AsyncClientCursor(conn)
    query = ";\n".join(cursor.mogrify(sql, params) for sql, params in statements)
    await cursor.execute(query.encode())
    dones = []
    for i in range(len(statements)):
        if i:
            cursor.nextset()
        row = await cursor.fetchone()
        dones.append(0 if row is None else int(row["done"]))
    return dones
