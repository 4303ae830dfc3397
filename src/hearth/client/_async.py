"""The asyncio client: ``hearth.AsyncClient`` and its ``AsyncConversation``, over httpx2.

The same methods as ``Client``, awaitable (``stream`` is an async iterator). What to send and what
to make of the answers lives in ``_core``, so the two clients behave alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from os import PathLike
from typing import Any

import httpx2

from hearth.attachments import Attachment
from hearth.client._core import FIRST_ASK_S, BaseClient, BaseConversation, Call, Reading, T, Tail
from hearth.client._errors import check, error_from
from hearth.receipts import AbortResult, Receipt, Reply
from hearth.sse import async_sse_lines, parse_sse

__all__ = ["AsyncClient", "AsyncConversation"]


class AsyncClient(BaseClient[httpx2.AsyncClient]):
    """The same as ``Client``, awaitable. ``async with hearth.AsyncClient(url) as client``."""

    _http_class = httpx2.AsyncClient

    def conversation(self, agent: str, id: str) -> AsyncConversation:
        return AsyncConversation(self, agent, id)

    async def health(self) -> dict[str, Any]:
        return await _do(self._http, self._health_call())

    async def waits(self) -> list[dict[str, Any]]:
        """Every pending durable wait on the server, oldest first (``GET /waits``)."""
        return await _do(self._http, self._waits_call())

    async def admin_submissions(self, conversation: str | None = None) -> dict[str, Any]:
        """Submissions by status, leases and stuck work (what ``hearth inspect`` shows)."""
        return await _do(self._http, self._admin_submissions_call(conversation))

    async def conversations(
        self,
        agent: str | None = None,
        status: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page of conversations, newest activity first: ``{"conversations": [...],
        "next": cursor}``; pass ``next`` back as ``after`` for the next page (None: the last)."""
        return await _do(self._http, self._conversations_call(agent, status, after, limit))

    async def schedules(self) -> dict[str, Any]:
        """The app's schedules with their last and next occurrence."""
        return await _do(self._http, self._schedules_call())

    async def deliveries(self, channel: str, status: str | None = None) -> dict[str, Any]:
        """A channel's kept deliveries, newest first."""
        return await _do(self._http, self._deliveries_call(channel, status))

    async def replay(self, channel: str, delivery_id: str) -> dict[str, Any]:
        """Route a failed delivery again, after a fix."""
        return await _do(self._http, self._replay_call(channel, delivery_id))

    async def gc(self, dry_run: bool = False) -> dict[str, Any]:
        """Delete the attachments nothing references: ``{"deleted", "count", "bytes"}``."""
        return await _do(self._http, self._gc_call(dry_run))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncConversation(BaseConversation[httpx2.AsyncClient]):
    """One conversation on the server: ``async_client.conversation(agent, id)``."""

    async def send(
        self,
        text: str = "",
        idempotency_key: str | None = None,
        *,
        attachments: Sequence[Attachment | str | PathLike[str]] | None = None,
    ) -> Receipt:
        """Admit a message; returns once it (and its attachments) are durable.

        ``attachments``: ``hearth.Attachment`` values or file paths, sent in the JSON body as
        base64; with attachments the text may be empty."""
        return await _do(self._http, self._send_call(text, idempotency_key, attachments))

    async def signal(
        self,
        type: str,
        body: str = "",
        attributes: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Admit a signal (a system note the model sees)."""
        return await _do(self._http, self._signal_call(type, body, attributes, idempotency_key))

    async def submission(self, submission_id: str, wait: float | None = None) -> dict[str, Any]:
        """The submission's status; with ``wait``, long-polls up to that long for its outcome."""
        return await _do(self._http, self._submission_call(submission_id, wait))

    async def read(self, receipt: Receipt | str, timeout: float | None = None) -> Reply:
        """Wait for the submission's settlement and return its reply (see ``Conversation.read``)."""
        reading = self._reading(receipt, timeout)
        try:
            async with asyncio.timeout(None) as limit:
                if reading.deadline is not None:
                    # The first ask as a whole too, not only each of its reads: a server that
                    # trickled its answer held a read(timeout=1) for 9 s.
                    first = max(reading.remaining(), FIRST_ASK_S)
                    limit.reschedule(asyncio.get_running_loop().time() + first)
                return await self._settlement(reading, limit)
        except TimeoutError:
            raise reading.expired() from None

    async def _settlement(self, reading: Reading, limit: asyncio.Timeout) -> Reply:
        while True:
            try:
                reply = await self._status(reading, limit) or await self._follow(reading)
                if reply is not None:
                    return reply
            except Exception as exc:
                reading.raise_unless_transient(exc)
            await asyncio.sleep(reading.pause())

    async def _status(self, reading: Reading, limit: asyncio.Timeout) -> Reply | None:
        """The reply if the submission has settled. The first status request has a timeout of
        its own (``timeout=0`` reads a settled submission); after it, ``limit`` holds the read
        to its deadline."""
        try:
            return await _do(self._http, reading.status_call())
        finally:
            if reading.deadline is not None and not limit.expired():
                limit.reschedule(asyncio.get_running_loop().time() + reading.remaining())

    async def _follow(self, reading: Reading) -> Reply | None:
        async with contextlib.aclosing(self._records(reading)) as records:
            async for record in records:
                reply = reading.reply_from_record(record)
                if reply is not None:
                    return reply
        return None

    async def stream(self, offset: int = -1) -> AsyncIterator[dict[str, Any]]:
        """Every record after ``offset``, live, forever; reconnects from the last one seen."""
        tail = self._tail(offset)
        while True:
            try:
                async with contextlib.aclosing(self._records(tail)) as records:
                    async for record in records:
                        yield record
            except Exception as exc:
                tail.raise_unless_transient(exc)
            await asyncio.sleep(tail.pause())

    async def _records(self, tail: Tail) -> AsyncGenerator[dict[str, Any], None]:
        """One SSE connection: the records after the tail's offset, until it ends."""
        async with self._http.stream(**tail.stream_request().arguments()) as response:
            if response.status_code >= 400:
                await response.aread()
                raise error_from(response)
            async for event in parse_sse(async_sse_lines(response.aiter_text())):
                record = tail.record(event)
                if record is not None:
                    yield record

    async def history(self, offset: int = -1) -> list[dict[str, Any]]:
        """All records after ``offset`` up to now (JSON pages; does not wait)."""
        pages = self._history(offset)
        while not pages.complete:
            await _do(self._http, pages.next_page())
        return pages.records

    async def snapshot(self) -> dict[str, Any]:
        return await _do(self._http, self._snapshot_call())

    async def abort(self) -> AbortResult:
        return await _do(self._http, self._abort_call())

    async def fork(self, offset: int, new_id: str) -> AsyncConversation:
        """Fork this conversation at a rest point (see ``Conversation.fork``)."""
        answer = await _do(self._http, self._fork_call(offset, new_id))
        return AsyncConversation(self._client, self.agent, str(answer["id"]))

    async def resolve(self, wait_id: str, value: Any) -> dict[str, Any]:
        """Resolve a durable wait of this conversation (see ``Conversation.resolve``)."""
        return await _do(self._http, self._resolve_call(wait_id, value))

    async def waits(self) -> list[dict[str, Any]]:
        """This conversation's pending durable waits."""
        return await _do(self._http, self._waits_call())


async def _do(http: httpx2.AsyncClient, call: Call[T]) -> T:
    return call.decode(check(await http.request(**call.request.arguments())))
