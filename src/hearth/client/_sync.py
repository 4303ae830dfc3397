"""The blocking client: ``hearth.Client`` and its ``Conversation``, I/O over ``httpx2.Client``.

What to send and what to make of the answers lives in ``_core``; this shell sends, reads, sleeps.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from os import PathLike
from typing import Any

import httpx2

from hearth.attachments import Attachment
from hearth.client._core import BaseClient, BaseConversation, Call, Reading, T, Tail
from hearth.client._errors import check, error_from
from hearth.receipts import AbortResult, Receipt, Reply
from hearth.sse import iter_sse, sse_lines

__all__ = ["Client", "Conversation"]


class Client(BaseClient[httpx2.Client]):
    """A blocking client. ``with hearth.Client(url) as client: ...`` closes its connections."""

    _http_class = httpx2.Client

    def conversation(self, agent: str, id: str) -> Conversation:
        return Conversation(self, agent, id)

    def health(self) -> dict[str, Any]:
        return _do(self._http, self._health_call())

    def waits(self) -> list[dict[str, Any]]:
        """Every pending durable wait on the server, oldest first (``GET /waits``)."""
        return _do(self._http, self._waits_call())

    def admin_submissions(self, conversation: str | None = None) -> dict[str, Any]:
        """Submissions by status, leases and stuck work (what ``hearth inspect`` shows)."""
        return _do(self._http, self._admin_submissions_call(conversation))

    def conversations(
        self,
        agent: str | None = None,
        status: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page of conversations, newest activity first: ``{"conversations": [...],
        "next": cursor}``; pass ``next`` back as ``after`` for the next page (None: the last)."""
        return _do(self._http, self._conversations_call(agent, status, after, limit))

    def schedules(self) -> dict[str, Any]:
        """The app's schedules with their last and next occurrence."""
        return _do(self._http, self._schedules_call())

    def deliveries(self, channel: str, status: str | None = None) -> dict[str, Any]:
        """A channel's kept deliveries, newest first."""
        return _do(self._http, self._deliveries_call(channel, status))

    def replay(self, channel: str, delivery_id: str) -> dict[str, Any]:
        """Route a failed delivery again, after a fix."""
        return _do(self._http, self._replay_call(channel, delivery_id))

    def gc(self, dry_run: bool = False) -> dict[str, Any]:
        """Delete the attachments nothing references: ``{"deleted", "count", "bytes"}``."""
        return _do(self._http, self._gc_call(dry_run))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Conversation(BaseConversation[httpx2.Client]):
    """One conversation on the server: ``client.conversation(agent, id)``."""

    def send(
        self,
        text: str = "",
        idempotency_key: str | None = None,
        *,
        attachments: Sequence[Attachment | str | PathLike[str]] | None = None,
    ) -> Receipt:
        """Admit a message; returns once it (and its attachments) are durable.

        ``attachments``: ``hearth.Attachment`` values or file paths, sent in the JSON body as
        base64; with attachments the text may be empty."""
        return _do(self._http, self._send_call(text, idempotency_key, attachments))

    def signal(
        self,
        type: str,
        body: str = "",
        attributes: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Admit a signal (a system note the model sees)."""
        return _do(self._http, self._signal_call(type, body, attributes, idempotency_key))

    def submission(self, submission_id: str, wait: float | None = None) -> dict[str, Any]:
        """The submission's status; with ``wait``, long-polls up to that long for its outcome."""
        return _do(self._http, self._submission_call(submission_id, wait))

    def read(self, receipt: Receipt | str, timeout: float | None = None) -> Reply:
        """Wait for the submission's settlement and return its reply.

        Raises ``SubmissionFailed``/``SubmissionAborted`` for the other outcomes and
        ``TimeoutError`` once ``timeout`` seconds have passed.
        """
        reading = self._reading(receipt, timeout)
        while True:
            try:
                reply = _do(self._http, reading.status_call()) or self._follow(reading)
                if reply is not None:
                    return reply
            except Exception as exc:
                reading.raise_unless_transient(exc)
            time.sleep(reading.pause())

    def _follow(self, reading: Reading) -> Reply | None:
        with contextlib.closing(self._records(reading)) as records:
            for record in records:
                reply = reading.reply_from_record(record)
                if reply is not None:
                    return reply
        return None

    def stream(self, offset: int = -1) -> Iterator[dict[str, Any]]:
        """Every record after ``offset``, live, forever; reconnects from the last one seen."""
        tail = self._tail(offset)
        while True:
            try:
                with contextlib.closing(self._records(tail)) as records:
                    yield from records
            except Exception as exc:
                tail.raise_unless_transient(exc)
            time.sleep(tail.pause())

    def _records(self, tail: Tail) -> Generator[dict[str, Any], None, None]:
        """One SSE connection: the records after the tail's offset, until it ends."""
        with self._http.stream(**tail.stream_request().arguments()) as response:
            if response.status_code >= 400:
                response.read()
                raise error_from(response)
            with _cut_off_at(tail.deadline, response):
                for event in iter_sse(sse_lines(response.iter_text())):
                    record = tail.record(event)
                    if record is not None:
                        yield record

    def history(self, offset: int = -1) -> list[dict[str, Any]]:
        """All records after ``offset`` up to now (JSON pages; does not wait)."""
        pages = self._history(offset)
        while not pages.complete:
            _do(self._http, pages.next_page())
        return pages.records

    def snapshot(self) -> dict[str, Any]:
        return _do(self._http, self._snapshot_call())

    def abort(self) -> AbortResult:
        return _do(self._http, self._abort_call())

    def fork(self, offset: int, new_id: str) -> Conversation:
        """Fork this conversation at the rest point ``offset`` into a new conversation ``new_id``
        of the same agent, and return it: it holds the records up to ``offset`` and the state as
        of then, and no submissions; this one is not touched. Raises ``hearth.NotARestPoint``
        (with the nearest ``rest_points``) or ``hearth.ConversationExists``."""
        answer = _do(self._http, self._fork_call(offset, new_id))
        return Conversation(self._client, self.agent, str(answer["id"]))

    def resolve(self, wait_id: str, value: Any) -> dict[str, Any]:
        """Resolve a durable wait of this conversation with a JSON ``value``; the same value
        again is accepted, another raises ``hearth.WaitConflict``."""
        return _do(self._http, self._resolve_call(wait_id, value))

    def waits(self) -> list[dict[str, Any]]:
        """This conversation's pending durable waits."""
        return _do(self._http, self._waits_call())


def _do(http: httpx2.Client, call: Call[T]) -> T:
    return call.decode(check(http.request(**call.request.arguments())))


def _cut_off_at(deadline: float | None, response: httpx2.Response) -> AbstractContextManager[Any]:
    """While in it, the response's connection is shut down at ``deadline`` (if there is one)."""
    stream = response.extensions.get("network_stream")
    sock = None if stream is None else stream.get_extra_info("socket")
    if deadline is None or not isinstance(sock, socket.socket):
        return contextlib.nullcontext()
    return _Cutoff(sock, deadline)


class _Cutoff:
    """Shuts a socket down at a deadline, unless left before it.

    A blocking read waits for the next line however long the server takes, and every heartbeat
    restarts its own timeout: only shutting the socket down ends it on time.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._armed = True
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Cutoff:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._armed = False  # the connection may go back to the pool: never cut it now
        self._timer.cancel()

    def _cut(self) -> None:
        with self._lock:
            if self._armed:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
