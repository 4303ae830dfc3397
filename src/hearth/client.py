"""The client SDK: talk to a ``hearth serve`` over HTTP (docs/http.md).

Example::

    client = hearth.Client("http://127.0.0.1:8000", token=None)
    conv = client.conversation("support", "c-1")
    receipt = conv.send("Where is my order 7?")
    reply = conv.read(receipt)          # follows the stream; survives server restarts
    print(reply.text)

``hearth.AsyncClient`` has the same methods, awaitable (``stream`` is an async iterator).

A receipt is plain data: ``read`` works from any process. ``read`` and ``stream`` reconnect with
backoff whenever the server is unreachable, restarting or shutting down, and resume after the last
offset they saw, so no record is missed or seen twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any
from urllib.parse import quote

import httpx2

from hearth.errors import (
    ConversationNotFound,
    HearthError,
    IdempotencyConflict,
    InvalidId,
    ShuttingDown,
    SubmissionNotFound,
    UnknownAgent,
)
from hearth.receipts import AbortResult, Receipt, Reply, reply_or_raise

__all__ = [
    "AsyncClient",
    "AsyncConversation",
    "Client",
    "Conversation",
    "HTTPError",
    "ServerUnavailable",
    "Unauthorized",
]

_CONNECT_S = 5.0
_STREAM_READ_S = 45.0  # three missed heartbeats: the connection is dead, reconnect
_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 2.0


class HTTPError(HearthError):
    """The server answered an error that has no more specific class; carries the envelope."""

    def __init__(self, status: int, type: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.details = details


class Unauthorized(HTTPError):
    """The server wants a bearer token (``token=``, ``HEARTH_TOKEN``), or another one."""


class ServerUnavailable(HTTPError):
    """The server failed (5xx) or could not be reached."""


_BY_TYPE: dict[str, type[HearthError]] = {
    "unknown_agent": UnknownAgent,
    "conversation_not_found": ConversationNotFound,
    "submission_not_found": SubmissionNotFound,
    "invalid_id": InvalidId,
    "idempotency_conflict": IdempotencyConflict,
    "shutting_down": ShuttingDown,
}


def error_from(response: httpx2.Response) -> HearthError:
    """The typed error for an error answer (``hearth.errors`` where one fits)."""
    try:
        envelope = response.json()["error"]
        kind, message = str(envelope["type"]), str(envelope["message"])
        details = envelope.get("details")
    except Exception:
        kind, message, details = "http_error", response.reason_phrase or "error", None
    known = _BY_TYPE.get(kind)
    if known is not None:
        exc = known(message)
        exc.status = response.status_code  # type: ignore[attr-defined]
        return exc
    if response.status_code == 401:
        return Unauthorized(401, kind, message, details)
    if response.status_code >= 500:
        return ServerUnavailable(response.status_code, kind, message, details)
    return HTTPError(response.status_code, kind, message, details)


def _transient(exc: BaseException) -> bool:
    """Worth retrying after a pause: the server is away, restarting or shutting down."""
    return isinstance(exc, httpx2.TransportError | ShuttingDown | ServerUnavailable)


def _check(response: httpx2.Response) -> httpx2.Response:
    if response.status_code >= 400:
        raise error_from(response)
    return response


def _receipt(data: dict[str, Any]) -> Receipt:
    return Receipt(
        submission_id=str(data["submission_id"]),
        conversation_id=str(data["conversation_id"]),
        offset=int(data["offset"]),
        accepted_at=float(data.get("accepted_at", time.time())),
        deduplicated=bool(data.get("deduplicated", False)),
    )


def _settled(record: dict[str, Any], sid: str) -> bool:
    return record.get("type") == "submission_settled" and record.get("submission_id") == sid


def _reply(sid: str, data: dict[str, Any]) -> Reply:
    return reply_or_raise(sid, data.get("outcome"), data.get("reply"), data.get("error"))


class _Backoff:
    def __init__(self) -> None:
        self.delay = _BACKOFF_MIN_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, _BACKOFF_MAX_S)
        return delay * random.uniform(0.75, 1.25)

    def reset(self) -> None:
        self.delay = _BACKOFF_MIN_S


class _SSEParser:
    """Just enough of the SSE format for hearth's events: ``id`` and one-line ``data``."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.data: list[str] = []

    def line(self, line: str) -> dict[str, Any] | None:
        """Feed one line; a record when an event ends, else None."""
        if not line:
            if not self.data:
                return None
            text, self.data = "\n".join(self.data), []
            record: dict[str, Any] = json.loads(text)
            return record
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.data.append(value)
        elif name == "id":
            self.id = value
        return None


class _Paths:
    def __init__(self, agent: str, id: str) -> None:
        self.agent, self.id = agent, id
        self.conversation_id = f"{agent}/{id}"
        self.base = f"/agents/{quote(agent, safe='')}/{quote(id, safe='')}"

    def submission_id(self, receipt: Receipt | str) -> tuple[str, int | None]:
        if isinstance(receipt, Receipt):
            if receipt.conversation_id != self.conversation_id:
                raise ValueError(
                    f"the receipt belongs to {receipt.conversation_id}, not {self.conversation_id}"
                )
            return receipt.submission_id, receipt.offset
        return str(receipt), None

    @staticmethod
    def signal_body(
        type: str, body: str, attributes: dict[str, Any] | None, key: str | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "signal": {"type": type, "body": body, "attributes": attributes or {}}
        }
        if key is not None:
            out["idempotency_key"] = key
        return out


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- synchronous -----------------------------------------------------------------------------


class Client:
    """A blocking client. ``with hearth.Client(url) as client: ...`` closes its connections."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx2.Client(
            base_url=self.url,
            headers=_headers(token),
            timeout=httpx2.Timeout(timeout, connect=_CONNECT_S),
        )

    def conversation(self, agent: str, id: str) -> Conversation:
        return Conversation(self, agent, id)

    def health(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(self._http.get("/healthz")).json()
        return data

    def admin_submissions(self, conversation: str | None = None) -> dict[str, Any]:
        """Submissions by status, leases and stuck work (what ``hearth inspect`` shows)."""
        params = {"conversation": conversation} if conversation else None
        data: dict[str, Any] = _check(self._http.get("/admin/submissions", params=params)).json()
        return data

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Conversation:
    """One conversation on the server: ``client.conversation(agent, id)``."""

    def __init__(self, client: Client, agent: str, id: str) -> None:
        self._client = client
        self._http = client._http
        self._paths = _Paths(agent, id)
        self.agent, self.id = agent, id
        self.conversation_id = self._paths.conversation_id

    def send(self, text: str, idempotency_key: str | None = None) -> Receipt:
        """Admit a message; returns once it is durable."""
        body: dict[str, Any] = {"message": text}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return _receipt(_check(self._http.post(self._paths.base, json=body)).json())

    def signal(
        self,
        type: str,
        body: str = "",
        attributes: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Admit a signal (a system note the model sees)."""
        payload = _Paths.signal_body(type, body, attributes, idempotency_key)
        return _receipt(_check(self._http.post(self._paths.base, json=payload)).json())

    def submission(self, submission_id: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        url = f"{self._paths.base}/submissions/{quote(submission_id, safe='')}"
        timeout = httpx2.Timeout((wait or 0) + 30.0, connect=_CONNECT_S)
        data: dict[str, Any] = _check(self._http.get(url, params=params, timeout=timeout)).json()
        return data

    def read(self, receipt: Receipt | str, timeout: float | None = None) -> Reply:
        """Wait for the submission's settlement and return its reply.

        Raises ``SubmissionFailed``/``SubmissionAborted`` for the other outcomes and
        ``TimeoutError`` after ``timeout`` seconds (honoured to within one heartbeat).
        """
        sid, offset = self._paths.submission_id(receipt)
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = _Backoff()
        after = -1 if offset is None else offset
        while True:
            try:
                status = self.submission(sid)
                if status.get("outcome") is not None:
                    return _reply(sid, status)
                with contextlib.closing(self._follow(after, deadline)) as records:
                    for record in records:
                        after = record["offset"]
                        backoff.reset()
                        if _settled(record, sid):
                            return _reply(sid, record)
            except Exception as exc:
                if not _transient(exc):
                    raise
            _pause(backoff, deadline, sid)

    def stream(self, offset: int = -1) -> Iterator[dict[str, Any]]:
        """Every record after ``offset``, live, forever; reconnects from the last one seen."""
        backoff = _Backoff()
        after = offset
        while True:
            try:
                with contextlib.closing(self._follow(after, None)) as records:
                    for record in records:
                        after = record["offset"]
                        backoff.reset()
                        yield record
            except Exception as exc:
                if not _transient(exc):
                    raise
            time.sleep(backoff.next())

    def _follow(self, after: int, deadline: float | None) -> Generator[dict[str, Any], None, None]:
        """One SSE connection: records after ``after`` until it ends (or ``deadline``)."""
        read_s = _STREAM_READ_S
        if deadline is not None:
            read_s = max(min(read_s, deadline - time.monotonic()), 0.01)
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        timeout = httpx2.Timeout(read_s, connect=_CONNECT_S)
        url = f"{self._paths.base}/stream"
        with self._http.stream("GET", url, headers=headers, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise error_from(response)
            parser = _SSEParser()
            for line in response.iter_lines():
                if deadline is not None and time.monotonic() > deadline:
                    return
                record = parser.line(line)
                if record is not None and record["offset"] > after:
                    after = record["offset"]
                    yield record

    def history(self, offset: int = -1) -> list[dict[str, Any]]:
        """All records after ``offset`` up to now (JSON pages; does not wait)."""
        out: list[dict[str, Any]] = []
        while True:
            response = self._http.get(f"{self._paths.base}/stream", params={"offset": offset})
            page = _check(response).json()
            out += page["records"]
            offset = page["next_offset"]
            if page["up_to_date"]:
                return out

    def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(self._http.get(self._paths.base)).json()
        return data

    def abort(self) -> AbortResult:
        data = _check(self._http.post(f"{self._paths.base}/abort")).json()
        return AbortResult(bool(data["aborted"]), list(data["submission_ids"]))


def _pause(backoff: _Backoff, deadline: float | None, sid: str) -> None:
    delay = backoff.next()
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"submission {sid} has not settled yet")
        delay = min(delay, left)
    time.sleep(delay)


# --- asynchronous ----------------------------------------------------------------------------


class AsyncClient:
    """The same as ``Client``, awaitable. ``async with hearth.AsyncClient(url) as client``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx2.AsyncClient(
            base_url=self.url,
            headers=_headers(token),
            timeout=httpx2.Timeout(timeout, connect=_CONNECT_S),
        )

    def conversation(self, agent: str, id: str) -> AsyncConversation:
        return AsyncConversation(self, agent, id)

    async def health(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(await self._http.get("/healthz")).json()
        return data

    async def admin_submissions(self, conversation: str | None = None) -> dict[str, Any]:
        params = {"conversation": conversation} if conversation else None
        response = await self._http.get("/admin/submissions", params=params)
        data: dict[str, Any] = _check(response).json()
        return data

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncConversation:
    """One conversation on the server: ``async_client.conversation(agent, id)``."""

    def __init__(self, client: AsyncClient, agent: str, id: str) -> None:
        self._client = client
        self._http = client._http
        self._paths = _Paths(agent, id)
        self.agent, self.id = agent, id
        self.conversation_id = self._paths.conversation_id

    async def send(self, text: str, idempotency_key: str | None = None) -> Receipt:
        body: dict[str, Any] = {"message": text}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return _receipt(_check(await self._http.post(self._paths.base, json=body)).json())

    async def signal(
        self,
        type: str,
        body: str = "",
        attributes: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        payload = _Paths.signal_body(type, body, attributes, idempotency_key)
        return _receipt(_check(await self._http.post(self._paths.base, json=payload)).json())

    async def submission(self, submission_id: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        url = f"{self._paths.base}/submissions/{quote(submission_id, safe='')}"
        timeout = httpx2.Timeout((wait or 0) + 30.0, connect=_CONNECT_S)
        response = await self._http.get(url, params=params, timeout=timeout)
        data: dict[str, Any] = _check(response).json()
        return data

    async def read(self, receipt: Receipt | str, timeout: float | None = None) -> Reply:
        """Wait for the settlement (see ``Conversation.read``); ``timeout`` is exact here."""
        sid, offset = self._paths.submission_id(receipt)
        try:
            async with asyncio.timeout(timeout):
                return await self._read(sid, -1 if offset is None else offset)
        except TimeoutError:
            raise TimeoutError(f"submission {sid} has not settled yet") from None

    async def _read(self, sid: str, after: int) -> Reply:
        backoff = _Backoff()
        while True:
            try:
                status = await self.submission(sid)
                if status.get("outcome") is not None:
                    return _reply(sid, status)
                async with contextlib.aclosing(self._follow(after)) as records:
                    async for record in records:
                        after = record["offset"]
                        backoff.reset()
                        if _settled(record, sid):
                            return _reply(sid, record)
            except Exception as exc:
                if not _transient(exc):
                    raise
            await asyncio.sleep(backoff.next())

    async def stream(self, offset: int = -1) -> AsyncIterator[dict[str, Any]]:
        """Every record after ``offset``, live, forever; reconnects from the last one seen."""
        backoff = _Backoff()
        after = offset
        while True:
            try:
                async with contextlib.aclosing(self._follow(after)) as records:
                    async for record in records:
                        after = record["offset"]
                        backoff.reset()
                        yield record
            except Exception as exc:
                if not _transient(exc):
                    raise
            await asyncio.sleep(backoff.next())

    async def _follow(self, after: int) -> AsyncGenerator[dict[str, Any], None]:
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        timeout = httpx2.Timeout(_STREAM_READ_S, connect=_CONNECT_S)
        url = f"{self._paths.base}/stream"
        async with self._http.stream("GET", url, headers=headers, timeout=timeout) as response:
            if response.status_code >= 400:
                await response.aread()
                raise error_from(response)
            parser = _SSEParser()
            async for line in response.aiter_lines():
                record = parser.line(line)
                if record is not None and record["offset"] > after:
                    after = record["offset"]
                    yield record

    async def history(self, offset: int = -1) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            response = await self._http.get(f"{self._paths.base}/stream", params={"offset": offset})
            page = _check(response).json()
            out += page["records"]
            offset = page["next_offset"]
            if page["up_to_date"]:
                return out

    async def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(await self._http.get(self._paths.base)).json()
        return data

    async def abort(self) -> AbortResult:
        data = _check(await self._http.post(f"{self._paths.base}/abort")).json()
        return AbortResult(bool(data["aborted"]), list(data["submission_ids"]))
