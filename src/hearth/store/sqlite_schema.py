"""The SQLite file: opening it for one process, and its versioned schema."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable

from hearth.errors import SchemaTooNew, StoreError

SCHEMA_VERSION = 11
# 2: submissions.is_head marks each conversation's claimable head
# 3: conversations.last_activity, indexed for the conversation list
# 4: submissions.source; the deliveries and schedules tables (channels and schedules)
# 5: submissions.traceparent keeps the W3C trace context of the admission
# 6: durable waits: the waits table, submissions.waits and submissions.waiting_since
# 7: attachments: the attachments table (bytes by SHA-256) and attachment_refs (what holds them)
# 8: records_by_type (every record's type) gives way to two partial indexes, of compactions and
#    of settlements, the only types looked up by type: a step's record writes one index fewer
# 9: the conversation list's indexes hold activity_bucket (last_activity to the 10 seconds, kept
#    by triggers) in place of last_activity: an append rewrites the conversation's row alone
# 10: submissions.releases counts the attempts a graceful shutdown gave back (not counted)
# 11: submissions.carried keeps the state writes of the batches a paused attempt left open
LOCK_TIMEOUT_S = 0.5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    parent TEXT,
    last_offset INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_activity REAL NOT NULL DEFAULT 0,
    activity_bucket INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS conversations_recent ON conversations (activity_bucket);
CREATE INDEX IF NOT EXISTS conversations_recent_by_agent ON conversations (agent, activity_bucket);
CREATE TRIGGER IF NOT EXISTS conversations_bucket_on_insert AFTER INSERT ON conversations
WHEN NEW.activity_bucket <> CAST(NEW.last_activity / 10 AS INTEGER)
BEGIN
    UPDATE conversations SET activity_bucket = CAST(NEW.last_activity / 10 AS INTEGER)
    WHERE rowid = NEW.rowid;
END;
CREATE TRIGGER IF NOT EXISTS conversations_bucket_on_update
AFTER UPDATE OF last_activity ON conversations
WHEN NEW.activity_bucket <> CAST(NEW.last_activity / 10 AS INTEGER)
BEGIN
    UPDATE conversations SET activity_bucket = CAST(NEW.last_activity / 10 AS INTEGER)
    WHERE rowid = NEW.rowid;
END;
CREATE TABLE IF NOT EXISTS records (
    conversation_id TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    id TEXT NOT NULL,
    type TEXT NOT NULL,
    submission_id TEXT,
    body TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (conversation_id, "offset"),
    UNIQUE (conversation_id, id)
);
CREATE INDEX IF NOT EXISTS records_compactions ON records (conversation_id, "offset")
    WHERE type = 'compaction';
CREATE INDEX IF NOT EXISTS records_settlements ON records (conversation_id, submission_id)
    WHERE type = 'submission_settled';
CREATE TABLE IF NOT EXISTS state (
    conversation_id TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conversation_id, name)
);
CREATE TABLE IF NOT EXISTS submissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT,
    payload_digest TEXT NOT NULL,
    admitted_offset INTEGER NOT NULL,
    status TEXT NOT NULL,
    outcome TEXT,
    error TEXT,
    reply TEXT,
    attempt INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    timeout REAL NOT NULL,
    deadline REAL,
    lease_owner TEXT,
    lease_expires_at REAL,
    abort_requested_at REAL,
    accepted_at REAL NOT NULL,
    started_at REAL,
    settled_at REAL,
    joined_to TEXT,
    is_head INTEGER NOT NULL DEFAULT 0,
    source TEXT,
    traceparent TEXT,
    waits INTEGER NOT NULL DEFAULT 0,
    waiting_since REAL,
    releases INTEGER NOT NULL DEFAULT 0,
    carried TEXT,
    UNIQUE (conversation_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS submissions_by_conversation
    ON submissions (conversation_id, status, seq);
CREATE INDEX IF NOT EXISTS submissions_by_status ON submissions (status);
CREATE INDEX IF NOT EXISTS submissions_heads ON submissions (seq) WHERE is_head = 1;
-- What a claim reads: heads that may run (a waiting head, which holds no lease, is not one).
CREATE INDEX IF NOT EXISTS submissions_claimable ON submissions (seq)
    WHERE is_head = 1 AND status IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS submissions_by_host ON submissions (joined_to)
    WHERE joined_to IS NOT NULL;
CREATE TABLE IF NOT EXISTS deliveries (
    channel TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    data TEXT NOT NULL,
    body TEXT NOT NULL,
    headers TEXT NOT NULL,
    submission_ids TEXT NOT NULL,
    error TEXT,
    attempts INTEGER NOT NULL,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (channel, delivery_id)
);
CREATE INDEX IF NOT EXISTS deliveries_by_time ON deliveries (channel, received_at);
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    cursor REAL NOT NULL,
    last_occurrence REAL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS waits (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    wait_id TEXT NOT NULL,
    submission_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    name TEXT NOT NULL,
    prompt TEXT NOT NULL,
    expires_at REAL,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,
    value TEXT,
    resolved_at REAL,
    UNIQUE (conversation_id, wait_id)
);
CREATE INDEX IF NOT EXISTS waits_pending ON waits (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS waits_expiring ON waits (expires_at)
    WHERE state = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS waits_by_submission ON waits (submission_id, state);
CREATE TABLE IF NOT EXISTS attachments (
    sha256 TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    data BLOB NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attachment_refs (
    sha256 TEXT NOT NULL,
    holder TEXT NOT NULL,
    PRIMARY KEY (sha256, holder)
) WITHOUT ROWID;
"""
_ATTACHMENT_TABLES = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS attachments") :]


_HAS_META = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"


def connect(
    path: str,
    synchronous: str,
    *,
    create: bool = True,
    found: Callable[[int | None], None] | None = None,
) -> sqlite3.Connection:
    """Open the file as this process's one connection and create or migrate its schema;
    ``found`` is told the version the file had (``None``: it had none)."""
    conn = sqlite3.connect(
        path, timeout=LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    try:
        conn.row_factory = sqlite3.Row
        # Exclusive locking first: then WAL keeps its index in heap memory, not in shared memory.
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        # Before the first pragma that writes: another program's file is refused unchanged
        # (switched to WAL first, it stayed so).
        if not create and not conn.execute(_HAS_META).fetchone():
            raise StoreError("the file holds no hearth database: check --db (or HEARTH_DB)")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA cache_size = -32000")
        before = migrate(conn, create=create)
        if found is not None:
            found(before)
    except sqlite3.OperationalError as exc:
        conn.close()
        if getattr(exc, "sqlite_errorcode", None) in (5, 6) or "locked" in str(exc):
            raise StoreError(
                f"another process owns the SQLite file {path}; a SQLite store belongs to one"
                " process (use PostgreSQL for many processes)"
            ) from None
        raise StoreError(f"cannot open the SQLite file {path}: {_why(path, exc)}") from None
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"cannot open the SQLite file {path}: {exc}") from None
        raise
    return conn


def _why(path: str, exc: Exception) -> str:
    """The cause to show: a place hearth may not write to says so, not "disk I/O error"."""
    folder = os.path.dirname(os.path.abspath(path))
    if path != ":memory:" and not (
        os.access(folder, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))
    ):
        return (
            f"{exc}: the file or its folder is read-only (hearth writes the file and its -wal"
            " beside it); use a writable place"
        )
    return str(exc)


def _add_heads(conn: sqlite3.Connection) -> None:
    """Schema 1 → 2: mark the oldest queued or running submission of each conversation."""
    conn.execute("ALTER TABLE submissions ADD COLUMN is_head INTEGER NOT NULL DEFAULT 0")
    conn.execute(
        "UPDATE submissions SET is_head = 1 WHERE seq IN (SELECT MIN(seq) FROM submissions"
        " WHERE status IN ('queued', 'running') GROUP BY conversation_id)"
    )


def _add_activity(conn: sqlite3.Connection) -> None:
    """Schema 2 → 3: each conversation's last activity, from its submissions' stamps."""
    conn.execute("ALTER TABLE conversations ADD COLUMN last_activity REAL NOT NULL DEFAULT 0")
    conn.execute(
        "UPDATE conversations SET last_activity = MAX(created_at, COALESCE((SELECT"
        " MAX(COALESCE(settled_at, started_at, accepted_at)) FROM submissions s"
        " WHERE s.conversation_id = conversations.conversation_id), 0))"
    )


def _add_sources(conn: sqlite3.Connection) -> None:
    """Schema 3 → 4: submissions say where they came from (channel, schedule) in ``source``.
    The new tables come with ``_SCHEMA``."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(submissions)")}
    if "source" not in columns:
        conn.execute("ALTER TABLE submissions ADD COLUMN source TEXT")


def _add_traceparent(conn: sqlite3.Connection) -> None:
    """Schema 4 → 5: the W3C trace context of each admission (older rows have none)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(submissions)")}
    if "traceparent" not in columns:
        conn.execute("ALTER TABLE submissions ADD COLUMN traceparent TEXT")


def _add_waits(conn: sqlite3.Connection) -> None:
    """Schema 5 → 6: the columns of durable waits (the waits table is created with the rest)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(submissions)")}
    if "waits" not in have:
        conn.execute("ALTER TABLE submissions ADD COLUMN waits INTEGER NOT NULL DEFAULT 0")
    if "waiting_since" not in have:
        conn.execute("ALTER TABLE submissions ADD COLUMN waiting_since REAL")


def _add_releases(conn: sqlite3.Connection) -> None:
    """Schema 9 → 10: the attempts a graceful shutdown gave back (none counted before)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(submissions)")}
    if "releases" not in have:
        conn.execute("ALTER TABLE submissions ADD COLUMN releases INTEGER NOT NULL DEFAULT 0")


def _add_carried(conn: sqlite3.Connection) -> None:
    """Schema 10 → 11: the open batches' state writes of a paused attempt (a submission paused
    before carried them in its ``wait_started`` records alone, which still count)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(submissions)")}
    if "carried" not in have:
        conn.execute("ALTER TABLE submissions ADD COLUMN carried TEXT")


def _add_attachments(conn: sqlite3.Connection) -> None:
    """Schema 6 → 7: the attachment store and its references (no older row references one)."""
    for statement in _statements(_ATTACHMENT_TABLES):
        conn.execute(statement)


def _statements(script: str) -> list[str]:
    """The statements of ``script``, each whole (a trigger's body holds ``;`` of its own)."""
    found, pending = [], ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                found.append(pending)
            pending = ""
    return found


def _add_activity_bucket(conn: sqlite3.Connection) -> None:
    """Schema 8 → 9: ``activity_bucket`` takes ``last_activity``'s place in the list's indexes
    (the new indexes and the triggers that keep it come with ``_SCHEMA``)."""
    conn.execute("DROP INDEX IF EXISTS conversations_by_activity")
    conn.execute("DROP INDEX IF EXISTS conversations_by_agent")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(conversations)")}
    if "activity_bucket" not in columns:
        conn.execute(
            "ALTER TABLE conversations ADD COLUMN activity_bucket INTEGER NOT NULL DEFAULT 0"
        )
    conn.execute("UPDATE conversations SET activity_bucket = CAST(last_activity / 10 AS INTEGER)")


def migrate(conn: sqlite3.Connection, *, create: bool = True) -> int | None:
    """Create the schema or check it; writing to ``meta`` takes the exclusive lock at once.
    Without ``create``, a file without hearth's schema is a ``StoreError``. Returns the version
    the file had (``None``: it had no schema, and now has this release's)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta and not create:
            raise StoreError("the file holds no hearth database: check --db (or HEARTH_DB)")
        found: int | None = None
        if has_meta:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            found = int(row[0]) if row is not None else SCHEMA_VERSION
            if found > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database was created by a newer hearth (schema {found}; this hearth"
                    f" knows schema {SCHEMA_VERSION}); upgrade hearth"
                )
            if found < 2:
                _add_heads(conn)
            if found < 3:
                _add_activity(conn)
            if found < 4:
                _add_sources(conn)
            if found < 5:
                _add_traceparent(conn)
            if found < 6:
                _add_waits(conn)
            if found < 7:
                _add_attachments(conn)
            if found < 8:  # the partial indexes that replace it come with _SCHEMA
                conn.execute("DROP INDEX IF EXISTS records_by_type")
            if found < 9:
                _add_activity_bucket(conn)
            if found < 10:
                _add_releases(conn)
            if found < 11:
                _add_carried(conn)
        for statement in _statements(_SCHEMA):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('opened_at', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (repr(time.time()),),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found
