"""The attachment store's contract, on every store: bytes by SHA-256, stored once with the
admission that brings them, never rewritten, collected only when nothing references them."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from hearth.attachments import message_content
from hearth.errors import IdempotencyConflict
from hearth.records import UserMessage
from hearth.store import Blob, NewSubmission, Store
from hearth.store.base import Fence

pytestmark = pytest.mark.anyio

CONV = "support/c-1"


def blob(data: bytes, media_type: str = "application/pdf") -> Blob:
    return Blob(hashlib.sha256(data).hexdigest(), media_type, len(data), data)


def part(b: Blob, name: str = "file.pdf") -> dict[str, Any]:
    return {
        "type": "attachment",
        "sha256": b.sha256,
        "name": name,
        "media_type": b.media_type,
        "size": b.size,
    }


def with_files(*blobs: Blob, conversation_id: str = CONV, key: str | None = None) -> NewSubmission:
    return NewSubmission(
        conversation_id=conversation_id,
        agent=conversation_id.split("/", 1)[0],
        kind="message",
        payload={"message": "see", "attachments": [part(b) for b in blobs]},
        idempotency_key=key,
        blobs=blobs,
    )


async def test_admission_stores_the_bytes_by_their_sha256(store: Store) -> None:
    b = blob(b"%PDF-1.4 hello")
    await store.admit(with_files(b))
    got = await store.get_attachment(b.sha256)
    assert got is not None
    assert (got.data, got.media_type, got.size) == (b.data, "application/pdf", b.size)


async def test_an_unknown_sha256_reads_none(store: Store) -> None:
    assert await store.get_attachment("0" * 64) is None


async def test_reading_without_data_gives_the_size_only(store: Store) -> None:
    b = blob(b"x" * 1000)
    await store.admit(with_files(b))
    got = await store.get_attachment(b.sha256, with_data=False)
    assert got is not None and got.data is None and got.size == 1000


async def test_the_same_bytes_are_stored_once_with_the_first_media_type(store: Store) -> None:
    first = blob(b"same bytes", "text/plain")
    again = Blob(first.sha256, "application/octet-stream", first.size, first.data)
    await store.admit(with_files(first))
    await store.admit(with_files(again, conversation_id="support/c-2"))
    got = await store.get_attachment(first.sha256)
    assert got is not None and got.media_type == "text/plain"
    assert await store.collect_attachments(dry_run=True) == []


async def test_an_idempotency_conflict_stores_no_bytes(store: Store) -> None:
    await store.admit(with_files(blob(b"one"), key="k"))
    other = blob(b"two")
    with pytest.raises(IdempotencyConflict):
        await store.admit(with_files(other, key="k"))
    assert await store.get_attachment(other.sha256) is None


async def test_gc_keeps_what_a_submission_references(store: Store) -> None:
    b = blob(b"kept")
    await store.admit(with_files(b))
    assert await store.collect_attachments() == []
    assert await store.get_attachment(b.sha256) is not None


async def test_gc_keeps_what_a_record_references(store: Store) -> None:
    # A submission without the part, and a record (as a fork would copy it) with it.
    b = blob(b"held by a record")
    new = NewSubmission(CONV, "support", "message", {"message": "x"}, blobs=(b,))
    await store.admit(new)
    record = UserMessage(id="copy:input", message_id="m", content=message_content("x", [part(b)]))
    await store.append(CONV, [record])
    assert await store.collect_attachments() == []
    assert await store.get_attachment(b.sha256) is not None


async def test_gc_deletes_what_nothing_references_and_says_what(store: Store) -> None:
    b = blob(b"orphan bytes")
    # Bytes that came without a reference (nothing in the payload names them).
    await store.admit(NewSubmission(CONV, "support", "message", {"message": "x"}, blobs=(b,)))
    dry = await store.collect_attachments(dry_run=True)
    assert [x.sha256 for x in dry] == [b.sha256]
    assert await store.get_attachment(b.sha256) is not None
    freed = await store.collect_attachments()
    assert [(x.sha256, x.size) for x in freed] == [(b.sha256, b.size)]
    assert await store.get_attachment(b.sha256) is None
    assert await store.collect_attachments() == []


async def test_a_user_message_with_parts_appends_fenced(store: Store) -> None:
    b = blob(b"in a running turn")
    admitted = await store.admit(with_files(b))
    [sub] = await store.claim("owner", 30, 1)
    record = UserMessage(
        id=f"{sub.id}:input",
        submission_id=sub.id,
        message_id=sub.id,
        content=message_content("see", [part(b)]),
    )
    await store.append(CONV, [record], fence=Fence(sub.id, sub.attempt))
    [read] = [r for r in await store.read(CONV) if isinstance(r, UserMessage)]
    assert read.content == [{"type": "text", "text": "see"}, part(b)]
    assert admitted.submission.payload["attachments"] == [part(b)]


async def test_admissions_reusing_bytes_while_gc_runs_keep_them(
    store_pair: tuple[Store, Store],
) -> None:
    a, b = store_pair
    shared = blob(b"contended bytes")
    # An orphan copy first: gc would take it, unless an admission holds it.
    await a.admit(NewSubmission(CONV, "support", "message", {"message": "x"}, blobs=(shared,)))
    results = await asyncio.gather(
        *[b.admit(with_files(shared, conversation_id=f"support/r-{i}")) for i in range(5)],
        a.collect_attachments(),
    )
    assert all(r is not None for r in results)
    got = await a.get_attachment(shared.sha256)
    assert got is not None and got.data == shared.data
    assert await a.collect_attachments() == []
