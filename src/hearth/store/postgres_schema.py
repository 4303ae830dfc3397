"""The PostgreSQL schema: its tables in one schema of their own, and its versioned migration.

Many processes may start at once against a fresh database: the migration runs under a
transaction-scoped advisory lock, so the schema is created once and the others wait for it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from hearth.errors import SchemaTooNew, StoreError

SCHEMA_VERSION = 11  # 2: last_activity; 3: source, inputs tables; 4: traceparent; 5: waits
# 6: attachments (bytes by SHA-256) and attachment_refs (what holds them)
# 7: records_by_type (every record's type) gives way to partial indexes of compactions and of
#    settlements, the only types looked up by type: a step's record writes one index fewer
# 8: the conversation list's indexes hold activity_bucket (a column generated from last_activity,
#    to the 10 seconds) in place of last_activity: an append's update of the row is heap-only
# 9: submissions.releases counts the attempts a graceful shutdown gave back (not counted)
# 10: submissions_claimable, the heads a claim reads (not those of waiting conversations)
# 11: submissions.carried keeps the state writes of the batches a paused attempt left open
_LOCK_KEY = 0x6865617274  # "heart": the advisory lock key of hearth's migrations

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id text PRIMARY KEY,
    agent text NOT NULL,
    parent text,
    last_offset bigint NOT NULL,
    created_at double precision NOT NULL,
    last_activity double precision NOT NULL DEFAULT 0,
    activity_bucket bigint GENERATED ALWAYS AS (floor(last_activity / 10)::bigint) STORED
);
CREATE INDEX IF NOT EXISTS conversations_recent ON conversations (activity_bucket);
CREATE INDEX IF NOT EXISTS conversations_recent_by_agent ON conversations (agent, activity_bucket);
CREATE TABLE IF NOT EXISTS records (
    conversation_id text NOT NULL,
    "offset" bigint NOT NULL,
    id text NOT NULL,
    type text NOT NULL,
    submission_id text,
    body text NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (conversation_id, "offset"),
    UNIQUE (conversation_id, id)
);
CREATE INDEX IF NOT EXISTS records_compactions ON records (conversation_id, "offset")
    WHERE type = 'compaction';
CREATE INDEX IF NOT EXISTS records_settlements ON records (conversation_id, submission_id)
    WHERE type = 'submission_settled';
CREATE TABLE IF NOT EXISTS state (
    conversation_id text NOT NULL,
    name text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (conversation_id, name)
);
CREATE TABLE IF NOT EXISTS submissions (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text NOT NULL UNIQUE,
    conversation_id text NOT NULL,
    kind text NOT NULL,
    payload text NOT NULL,
    idempotency_key text,
    payload_digest text NOT NULL,
    admitted_offset bigint NOT NULL,
    status text NOT NULL,
    outcome text,
    error text,
    reply text,
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    timeout double precision NOT NULL,
    deadline double precision,
    lease_owner text,
    lease_expires_at double precision,
    claim_token text,
    abort_requested_at double precision,
    accepted_at double precision NOT NULL,
    started_at double precision,
    settled_at double precision,
    joined_to text,
    is_head boolean NOT NULL DEFAULT false,
    source text,
    traceparent text,
    waits integer NOT NULL DEFAULT 0,
    waiting_since double precision,
    releases integer NOT NULL DEFAULT 0,
    carried text,
    UNIQUE (conversation_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS submissions_by_conversation
    ON submissions (conversation_id, status, seq);
CREATE INDEX IF NOT EXISTS submissions_heads ON submissions (seq) WHERE is_head;
CREATE INDEX IF NOT EXISTS submissions_claimable ON submissions (seq)
    WHERE is_head AND status IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS submissions_by_owner ON submissions (lease_owner)
    WHERE status = 'running';
CREATE INDEX IF NOT EXISTS submissions_by_claim ON submissions (claim_token)
    WHERE claim_token IS NOT NULL;
CREATE INDEX IF NOT EXISTS submissions_by_host ON submissions (joined_to)
    WHERE joined_to IS NOT NULL;
CREATE TABLE IF NOT EXISTS deliveries (
    channel text NOT NULL,
    delivery_id text NOT NULL,
    type text NOT NULL,
    status text NOT NULL,
    data text NOT NULL,
    body text NOT NULL,
    headers text NOT NULL,
    submission_ids text NOT NULL,
    error text,
    attempts integer NOT NULL,
    received_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (channel, delivery_id)
);
CREATE INDEX IF NOT EXISTS deliveries_by_time ON deliveries (channel, received_at);
CREATE TABLE IF NOT EXISTS schedules (
    name text PRIMARY KEY,
    spec text NOT NULL,
    cursor double precision NOT NULL,
    last_occurrence double precision,
    updated_at double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS waits (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id text NOT NULL,
    wait_id text NOT NULL,
    submission_id text NOT NULL,
    tool_call_id text NOT NULL,
    name text NOT NULL,
    prompt text NOT NULL,
    expires_at double precision,
    created_at double precision NOT NULL,
    state text NOT NULL,
    value text,
    resolved_at double precision,
    UNIQUE (conversation_id, wait_id)
);
CREATE INDEX IF NOT EXISTS waits_pending ON waits (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS waits_expiring ON waits (expires_at)
    WHERE state = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS waits_by_submission ON waits (submission_id, state);
CREATE TABLE IF NOT EXISTS attachments (
    sha256 text PRIMARY KEY,
    media_type text NOT NULL,
    size bigint NOT NULL,
    data bytea NOT NULL,
    created_at double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS attachment_refs (
    sha256 text NOT NULL,
    holder text NOT NULL,
    PRIMARY KEY (sha256, holder)
)
"""
# Version 5 → 6: the attachment store and its references (no older row references one).
_ADD_ATTACHMENTS = _TABLES[_TABLES.index("CREATE TABLE IF NOT EXISTS attachments") :]

# Version 7 → 8: ``activity_bucket`` takes ``last_activity``'s place in the list's indexes (the
# new indexes come with ``_TABLES``). Adding the generated column rewrites the table once.
_ADD_ACTIVITY_BUCKET = """
DROP INDEX IF EXISTS conversations_by_activity;
DROP INDEX IF EXISTS conversations_by_agent;
ALTER TABLE conversations ADD COLUMN IF NOT EXISTS activity_bucket bigint
    GENERATED ALWAYS AS (floor(last_activity / 10)::bigint) STORED
"""

# Version 4 → 5: the columns of durable waits (the waits table is created with the rest).
_ADD_WAITS = """
ALTER TABLE submissions ADD COLUMN IF NOT EXISTS waits integer NOT NULL DEFAULT 0;
ALTER TABLE submissions ADD COLUMN IF NOT EXISTS waiting_since double precision
"""


async def migrate(
    conn: psycopg.AsyncConnection[Any], schema: str, *, create: bool = True
) -> int | None:
    """Create the schema and its tables, or check the version of the ones that exist. Without
    ``create``, a schema without hearth's tables is a ``StoreError`` (nothing is made). Returns
    the version found (``None``: there were no tables, and now there are this release's)."""
    async with conn.transaction():
        # Whatever isolation a DBA made the default: under repeatable read or serializable, the
        # snapshot taken as the lock is asked for missed the schema a peer created meanwhile.
        await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        # Created only when missing: ``CREATE SCHEMA IF NOT EXISTS`` asks for the database's
        # CREATE privilege even when the schema is there (owned by a role that has no more).
        cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        missing = StoreError(
            f"there is no hearth database in the schema {schema!r}: check --db (or HEARTH_DB)"
            " and its ?schema="
        )
        if await cur.fetchone() is None:
            if not create:
                raise missing
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        else:
            await _check_usage(conn, schema)
        await conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        found = await _version(conn, schema)
        if found is None and not create:
            raise missing
        if found is None:
            await _check_create(conn, schema)
        if found is not None and found > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database schema {schema!r} was created by a newer hearth (schema version"
                f" {found}; this hearth knows version {SCHEMA_VERSION}); upgrade hearth"
            )
        if found == SCHEMA_VERSION:
            # Nothing to do, and no DDL: even ``CREATE INDEX IF NOT EXISTS`` locks its table,
            # which can deadlock with a peer process already using it.
            if create:
                await _check_grants(conn, schema)
            return found
        if found is not None and found < 2:
            await _add_heads(conn)
            await _add_activity(conn)
        if found is not None and found < 5:
            await _run(conn, _ADD_WAITS)
        if found is not None and found < 7:  # its partial replacements come with _TABLES
            await conn.execute("DROP INDEX IF EXISTS records_by_type")
        if found is not None and found < 8:
            await _run(conn, _ADD_ACTIVITY_BUCKET)
        if found is not None and found < 9:  # the attempts a graceful shutdown gave back
            await conn.execute(
                "ALTER TABLE submissions ADD COLUMN IF NOT EXISTS releases integer NOT NULL"
                " DEFAULT 0"
            )
        if found is not None and found < 11:  # the open batches' writes of a paused attempt
            await conn.execute("ALTER TABLE submissions ADD COLUMN IF NOT EXISTS carried text")
        await _run(conn, _TABLES)
        if found is not None and found < 3:
            await _add_sources(conn)
        if found is not None and found < 4:
            await _add_traceparent(conn)
        if found is not None and found < 6:
            await _add_attachments(conn)
        await conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
    return found


# What a role that runs hearth may not do on its tables and sequences (empty: all it needs).
_MISSING_GRANTS = """
SELECT c.relname AS name, p.privilege
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p (privilege)
WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p') AND NOT has_table_privilege(c.oid, p.privilege)
UNION ALL
SELECT c.relname, 'USAGE'
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(s)s
  AND CASE WHEN c.relkind = 'S' THEN NOT has_sequence_privilege(c.oid, 'USAGE') ELSE false END
ORDER BY 1, 2
"""


async def _role(conn: psycopg.AsyncConnection[Any]) -> str:
    cursor = await conn.execute("SELECT current_user")
    row = await cursor.fetchone()
    return str(row[0]) if row else "this role"


async def _check_usage(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Refuse a role that may not use an existing schema (a DBA's, say), saying so: its names
    were looked up past the schema, as if it were not there (no schema to create in, or a table
    "meta" that does not exist)."""
    if not await _may(conn, schema, "USAGE"):
        raise StoreError(
            f"the role {await _role(conn)!r} may not use the schema {schema!r}: grant it USAGE"
            f" ON SCHEMA {schema}, then SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA"
            f" {schema} and USAGE ON ALL SEQUENCES IN SCHEMA {schema}"
        )


async def _check_create(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Refuse, saying so, a role that would create hearth's tables in a schema it may not
    create in (one a DBA made for it, empty)."""
    if not await _may(conn, schema, "CREATE"):
        raise StoreError(
            f"the schema {schema!r} has no hearth tables yet, and the role {await _role(conn)!r}"
            f" may not create them: grant it CREATE ON SCHEMA {schema} (or make it the schema's"
            " owner), or run hearth migrate once as a role that may"
        )


async def _may(conn: psycopg.AsyncConnection[Any], schema: str, privilege: str) -> bool:
    """Whether the role connected may ``privilege`` (USAGE, CREATE) on ``schema``."""
    cursor = await conn.execute("SELECT has_schema_privilege(%s, %s)", (schema, privilege))
    row = await cursor.fetchone()
    return bool(row is not None and row[0])


async def _check_grants(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Refuse a role that may read hearth's tables but not write them: it would start, answer
    /healthz, and fail every admission and claim (a traceback a second in the log)."""
    cursor = await conn.execute(_MISSING_GRANTS, {"s": schema})
    missing = await cursor.fetchall()
    if not missing:
        return
    role = await _role(conn)
    tables = sorted({name for name, _ in missing})
    privileges = sorted({privilege for _, privilege in missing})
    raise StoreError(
        f"the role {role!r} may not {' or '.join(privileges)} on {len(tables)} of hearth's"
        f" tables in the schema {schema!r} ({', '.join(tables[:3])}"
        f"{', ...' if len(tables) > 3 else ''}): grant it SELECT, INSERT, UPDATE, DELETE ON ALL"
        f" TABLES IN SCHEMA {schema} and USAGE ON ALL SEQUENCES IN SCHEMA {schema}"
    )


async def _add_heads(conn: psycopg.AsyncConnection[Any]) -> None:
    """Version 1, the first form of it → 2: the first release's version 1 had no
    ``submissions.is_head`` (a later one added it under the same number, and no migration of
    that first form could run). Each conversation's oldest queued or running submission is its
    head: without the mark, no claim would ever see its work."""
    cursor = await conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = 'submissions' AND column_name = 'is_head'"
    )
    if await cursor.fetchone() is not None:
        return
    await conn.execute("ALTER TABLE submissions ADD COLUMN is_head boolean NOT NULL DEFAULT false")
    await conn.execute(
        "UPDATE submissions SET is_head = true WHERE seq IN (SELECT MIN(seq) FROM submissions"
        " WHERE status IN ('queued', 'running') GROUP BY conversation_id)"
    )


async def _add_activity(conn: psycopg.AsyncConnection[Any]) -> None:
    """Version 1 → 2: each conversation's last activity, from its submissions' stamps."""
    await conn.execute(
        "ALTER TABLE conversations ADD COLUMN IF NOT EXISTS last_activity double precision"
        " NOT NULL DEFAULT 0"
    )
    await conn.execute(
        "UPDATE conversations c SET last_activity = GREATEST(c.created_at, COALESCE((SELECT"
        " MAX(COALESCE(s.settled_at, s.started_at, s.accepted_at)) FROM submissions s"
        " WHERE s.conversation_id = c.conversation_id), 0))"
    )


async def _add_sources(conn: psycopg.AsyncConnection[Any]) -> None:
    """Version 2 → 3: submissions say where they came from (``source``); the new tables came
    with ``_TABLES``. Idempotent, so it may run on any older schema."""
    await conn.execute("ALTER TABLE submissions ADD COLUMN IF NOT EXISTS source text")


async def _add_traceparent(conn: psycopg.AsyncConnection[Any]) -> None:
    """Version 3 → 4: the W3C trace context of each admission (older rows have none)."""
    await conn.execute("ALTER TABLE submissions ADD COLUMN IF NOT EXISTS traceparent text")


async def _add_attachments(conn: psycopg.AsyncConnection[Any]) -> None:
    """Version 5 → 6: the attachment tables (``_TABLES`` creates them too; idempotent)."""
    await _run(conn, _ADD_ATTACHMENTS)


async def _run(conn: psycopg.AsyncConnection[Any], statements: str) -> None:
    for statement in statements.split(";"):
        if statement.strip():
            await conn.execute(statement.encode())


async def _version(conn: psycopg.AsyncConnection[Any], schema: str) -> int | None:
    # From the catalog: information_schema shows only the tables this role has a privilege on.
    cursor = await conn.execute(
        "SELECT has_table_privilege(c.oid, 'SELECT') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'meta' AND c.relkind IN ('r', 'p')",
        (schema,),
    )
    found = await cursor.fetchone()
    if found is None:
        return None
    if not found[0]:
        await _check_grants(conn, schema)  # names what this role may not do, meta's SELECT too
    cursor = await conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    row = await cursor.fetchone()
    return None if row is None else int(str(row[0]))
