"""What ``GET /agents/{agent}/{id}`` reads: the newest part of a conversation, bounded.

A snapshot shows the records of about the last ``SNAPSHOT_BYTES`` of the stream and the newest
submissions of about as many bytes; older records are paged through the stream route. Each
store read is a bounded page, so a long conversation neither holds the store's connection for
one huge read nor builds an answer of hundreds of megabytes."""

from __future__ import annotations

import json

from hearth.errors import ConversationNotFound
from hearth.records import Record
from hearth.runtime.runtime import Runtime
from hearth.server.tail import PAGE_BYTES
from hearth.store.base import Submission

SNAPSHOT_BYTES = PAGE_BYTES  # about the most bytes of records, and of submissions, shown
SNAPSHOT_RECORDS = 10_000  # and the most records the messages are folded from
SNAPSHOT_SUBMISSIONS = 1_000  # the most submissions listed
_SUBMISSION_PAGE = 20  # rows per store read: each row holds a payload of up to a request body


async def newest_records(runtime: Runtime, conversation_id: str) -> list[Record]:
    """The conversation's last records, at most ``SNAPSHOT_RECORDS`` of about
    ``SNAPSHOT_BYTES`` (one record however large); ``ConversationNotFound`` before its first
    admission.

    Pages are read forward, so the window that ends at the last record is found by narrowing:
    a page that stops short of the end for its size shows how many records fit, and the next
    try starts that many (and at most half as many as before) from the end."""
    info = await runtime.conversation_info(conversation_id)
    if info is None:
        raise ConversationNotFound(f"no conversation {conversation_id!r}")
    last = info.last_offset
    wanted = min(SNAPSHOT_RECORDS, last + 1)
    while True:
        page, more = await runtime.read_stream(
            conversation_id, last - wanted, wanted, SNAPSHOT_BYTES
        )
        # (``more`` with a full page: records appended since ``last``, not a page cut short)
        if not more or len(page) >= wanted or wanted <= 1:
            return page
        wanted = max(1, min(len(page), wanted // 2))


async def newest_submissions(runtime: Runtime, conversation_id: str) -> list[Submission]:
    """The conversation's newest submissions in admission order: at most
    ``SNAPSHOT_SUBMISSIONS``, of about ``SNAPSHOT_BYTES`` in all (the newest one always).
    Read from the newest back, so that the reads grow with what is shown, not with every
    submission the conversation ever had (a read of 20 rows per 20 submissions, from the first)."""
    kept: list[Submission] = []
    size, before = 0, 2**62
    while True:
        page = await runtime.store.list_submissions(
            conversation_id, before=before, limit=_SUBMISSION_PAGE
        )
        for sub in page:
            size += _weight(sub)
            if kept and (size > SNAPSHOT_BYTES or len(kept) >= SNAPSHOT_SUBMISSIONS):
                return kept[::-1]
            kept.append(sub)
        if len(page) < _SUBMISSION_PAGE:
            return kept[::-1]
        before = page[-1].seq


def _weight(sub: Submission) -> int:
    """About the bytes the submission takes in an answer: its payload, reply and error."""
    return 256 + len(json.dumps([sub.payload, sub.error], default=str)) + len(sub.reply or "")
