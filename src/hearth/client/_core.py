"""Everything the client SDK does that is not I/O, shared by ``Client`` and ``AsyncClient``.

The shells in ``_sync`` and ``_async`` only send what this module builds and hand back what it
decodes: the requests (method, path, headers, body, timeout), the receipts and replies, and the
bookkeeping of ``read`` and ``stream`` — the last offset seen, the reconnect backoff, and the
deadline every wait of a ``read`` is cut to.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx2

from hearth.attachments import Attachment, safe_name
from hearth.client._errors import id_refused_here, is_transient, refused_here
from hearth.jsontext import json_round_trip, unpaired_surrogate
from hearth.receipts import AbortResult, Receipt, Reply, reply_or_raise
from hearth.sse import SSEEvent

CONNECT_S = 5.0
STREAM_READ_S = 45.0  # three missed heartbeats: the connection is dead, reconnect
WAIT_SLACK_S = 30.0  # beyond a long-poll's ``wait``, for the answer to arrive
MAX_WAIT_S = 300.0  # the server refuses a longer long-poll (HTTP 400)
FIRST_ASK_S = 1.0  # at least this for a read's first status request, whatever its timeout
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 2.0
# A read's timeout past this is none (a timer cannot wait ~300 years: 1e12 s raised).
MAX_READ_TIMEOUT_S = 86_400.0 * 365

T = TypeVar("T")
HTTP = TypeVar("HTTP", httpx2.Client, httpx2.AsyncClient)


@dataclass(frozen=True)
class Request:
    """One HTTP call, as data: the shells send it with httpx2."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    timeout: httpx2.Timeout | None = None  # None: the client's own

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``request`` or ``stream`` of either httpx2 client."""
        out: dict[str, Any] = {"method": self.method, "url": self.path, "params": self.params}
        out.update(json=self.json, headers=self.headers)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True)
class Call(Generic[T]):
    """A request and what to make of its answer's JSON object."""

    request: Request
    decode: Callable[[dict[str, Any]], T]


def as_is(data: dict[str, Any]) -> dict[str, Any]:
    return data


def receipt_from(data: dict[str, Any]) -> Receipt:
    return Receipt(
        submission_id=str(data["submission_id"]),
        conversation_id=str(data["conversation_id"]),
        offset=int(data["offset"]),
        accepted_at=float(data.get("accepted_at", time.time())),
        deduplicated=bool(data.get("deduplicated", False)),
    )


def waits_from(data: dict[str, Any]) -> list[dict[str, Any]]:
    waits: list[dict[str, Any]] = data["waits"]
    return waits


def abort_result_from(data: dict[str, Any]) -> AbortResult:
    return AbortResult(bool(data["aborted"]), list(data["submission_ids"]))


class Backoff:
    """Pauses between reconnects: doubling from 0.1 s to 2 s, jittered, reset by progress."""

    def __init__(self) -> None:
        self.delay = BACKOFF_MIN_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX_S)
        return delay * random.uniform(0.75, 1.25)

    def reset(self) -> None:
        self.delay = BACKOFF_MIN_S


class Tail:
    """How far a ``stream`` or ``read`` has got: the last offset seen and the reconnect backoff.

    A ``read`` with a timeout also has a ``deadline``: each request's timeout and each pause is cut
    to what is left of it, and ``TimeoutError`` is raised once nothing is.
    """

    def __init__(self, base: str, after: int, deadline: float | None = None) -> None:
        self.base = base
        self.after = after
        self.deadline = deadline
        self.backoff = Backoff()

    def stream_request(self) -> Request:
        """The SSE connection that resumes after the last record seen."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(self.after)}
        timeout = self.timeout(STREAM_READ_S)
        return Request("GET", f"{self.base}/stream", headers=headers, timeout=timeout)

    def record(self, event: SSEEvent) -> dict[str, Any] | None:
        """The record an event carries, or None when it was seen already."""
        record: dict[str, Any] = json.loads(event.data)
        if record["offset"] <= self.after:
            return None
        self.after = record["offset"]
        self.backoff.reset()
        return record

    def raise_unless_transient(self, exc: Exception) -> None:
        """Re-raise ``exc`` unless it is worth reconnecting after."""
        if not is_transient(exc):
            raise exc

    def pause(self) -> float:
        """How long to wait before reconnecting."""
        return min(self.backoff.next(), self.left())

    def timeout(self, read_s: float) -> httpx2.Timeout:
        """A request's timeouts (``read_s`` to read), cut to what is left of the deadline."""
        left = self.left()
        return httpx2.Timeout(min(read_s, left), connect=min(CONNECT_S, left))

    def left(self) -> float:
        """Seconds until the deadline (infinite without one); ``TimeoutError`` past it."""
        left = self.remaining()
        if left <= 0:
            raise self.expired()
        return left

    def remaining(self) -> float:
        """Seconds until the deadline: infinite without one, 0 or less past it."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> TimeoutError:
        return TimeoutError("the deadline has passed")


def read_timeout(timeout: float | None) -> float | None:
    """A ``read``'s timeout in seconds, None for none (so too infinity, or over a year);
    ``ValueError`` for a negative one or NaN."""
    if timeout is None:
        return None
    if not timeout >= 0:  # (NaN too: it fails every comparison)
        raise ValueError(f"timeout must be 0 or more seconds, or None; not {timeout!r}")
    return None if timeout > MAX_READ_TIMEOUT_S else float(timeout)


class Reading(Tail):
    """A ``read``: the tail of the conversation, until one submission settles."""

    def __init__(self, base: str, submission_id: str, after: int, timeout: float | None) -> None:
        self.seconds = read_timeout(timeout)
        deadline = None if self.seconds is None else time.monotonic() + self.seconds
        super().__init__(base, after, deadline)
        self.submission_id = submission_id
        self.asked = False

    def status_call(self) -> Call[Reply | None]:
        """The submission's status now; decodes to its reply if it has settled.

        The first is asked even at the deadline, given at least ``FIRST_ASK_S``: a ``read`` with
        ``timeout=0`` returns the reply of a submission that has settled, as ``Runtime.read``
        does, and raises ``TimeoutError`` only for one that has not."""
        if self.asked:
            timeout = self.timeout(WAIT_SLACK_S)
        else:
            self.asked = True
            left = max(self.remaining(), FIRST_ASK_S)
            timeout = httpx2.Timeout(min(WAIT_SLACK_S, left), connect=min(CONNECT_S, left))
        path = submission_path(self.base, self.submission_id)
        return Call(Request("GET", path, timeout=timeout), self.reply_from_status)

    def reply_from_status(self, status: dict[str, Any]) -> Reply | None:
        """The reply when the submission's status says it has settled."""
        if status.get("outcome") is None:
            return None
        return self._reply(status)

    def reply_from_record(self, record: dict[str, Any]) -> Reply | None:
        """The reply when ``record`` is the submission's settlement."""
        settled = record.get("type") == "submission_settled"
        if not settled or record.get("submission_id") != self.submission_id:
            return None
        return self._reply(record)

    def expired(self) -> TimeoutError:
        return TimeoutError(f"submission {self.submission_id} has not settled yet")

    def _reply(self, data: dict[str, Any]) -> Reply:
        sid = self.submission_id
        return reply_or_raise(sid, data.get("outcome"), data.get("reply"), data.get("error"))


class History:
    """The JSON pages of ``history``: which one to ask for next, and the records so far."""

    def __init__(self, base: str, offset: int) -> None:
        self.base = base
        self.offset = offset
        self.records: list[dict[str, Any]] = []
        self.complete = False

    def next_page(self) -> Call[None]:
        request = Request("GET", f"{self.base}/stream", params={"offset": self.offset})
        return Call(request, self._take)

    def _take(self, page: dict[str, Any]) -> None:
        self.records += page["records"]
        self.offset = page["next_offset"]
        self.complete = bool(page["up_to_date"])


def segment(value: str, what: str) -> str:
    """``value`` (the ``what`` of a request: "agent", "conversation id", ...) as one segment of
    a path: every ``/``, ``?`` and ``#`` escaped, and ``.`` or ``..`` too (a client drops such a
    segment, or goes up one, so the request would reach another route); the server judges what
    is left. An empty one would reach another route too: ``InvalidId``. A part with half a
    surrogate pair has no UTF-8 form, so no URL can carry it: ``InvalidInput`` (``quote``
    raised UnicodeEncodeError)."""
    if not value:
        raise id_refused_here(f"the {what} is empty", what)
    where = unpaired_surrogate(value)
    if where is not None:
        raise refused_here(f"{value!r} has {where}: no URL can carry it", "path")
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def submission_path(base: str, submission_id: str) -> str:
    return f"{base}/submissions/{segment(submission_id, 'submission id')}"


class BaseClient(Generic[HTTP]):
    """What both clients share: the server's URL, the httpx2 client, the server-wide calls."""

    _http_class: type[HTTP]  # which httpx2 client the shell does its I/O with

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        """``url`` of the server; ``token`` if it wants one; ``timeout`` for a plain request."""
        self.url = url.rstrip("/")
        if token is not None and not (token.isascii() and token.isprintable()):
            raise refused_here(
                "the token must be printable ASCII: it goes in an HTTP header", "token"
            )
        self._http: HTTP = self._http_class(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=httpx2.Timeout(timeout, connect=CONNECT_S),
            # No cap on connections: each pending read or stream holds one for as long as it
            # follows, and with httpx's 100 the 101st call of any kind waited for the pool (a
            # resolve could not reach the waits the reads were waiting on).
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=20),
        )

    def _health_call(self) -> Call[dict[str, Any]]:
        return Call(Request("GET", "/healthz"), as_is)

    def _waits_call(self) -> Call[list[dict[str, Any]]]:
        return Call(Request("GET", "/waits"), waits_from)

    def _admin_submissions_call(self, conversation: str | None) -> Call[dict[str, Any]]:
        params = {"conversation": conversation} if conversation else None
        return Call(Request("GET", "/admin/submissions", params=params), as_is)

    def _conversations_call(
        self, agent: str | None, status: str | None, after: str | None, limit: int | None
    ) -> Call[dict[str, Any]]:
        given = {"agent": agent, "status": status, "after": after, "limit": limit}
        params = {k: v for k, v in given.items() if v is not None}
        return Call(Request("GET", "/conversations", params=params or None), as_is)

    def _schedules_call(self) -> Call[dict[str, Any]]:
        return Call(Request("GET", "/schedules"), as_is)

    def _deliveries_call(self, channel: str, status: str | None) -> Call[dict[str, Any]]:
        params = {"status": status} if status else None
        path = f"/channels/{segment(channel, 'channel')}/deliveries"
        return Call(Request("GET", path, params=params), as_is)

    def _replay_call(self, channel: str, delivery_id: str) -> Call[dict[str, Any]]:
        channel_part = segment(channel, "channel")
        path = f"/channels/{channel_part}/deliveries/{segment(delivery_id, 'delivery id')}/replay"
        return Call(Request("POST", path), as_is)

    def _gc_call(self, dry_run: bool) -> Call[dict[str, Any]]:
        params = {"dry_run": "1"} if dry_run else None
        return Call(Request("POST", "/admin/gc", params=params), as_is)


def sendable(value: Any, field: str) -> Any:
    """``value``, checked to have a JSON body's form: ``InvalidInput`` naming ``field`` for one
    without (NaN, the infinities, a set; a string with half a surrogate pair, which no UTF-8
    holds), as ``Runtime.dispatch`` and ``Runtime.resolve`` refuse it, where httpx2 raised its
    own ``ValueError``, ``TypeError`` or ``UnicodeEncodeError``."""
    if not isinstance(value, str):
        try:
            json_round_trip(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise refused_here(f"{field} is not JSON: {exc}", field) from None
    where = unpaired_surrogate(value)
    if where is not None:
        raise refused_here(f"{field} has {where}: text that is not UTF-8 cannot be sent", field)
    return value


def attachment_entry(att: Attachment | str | PathLike[str]) -> dict[str, Any]:
    """An attachment as the JSON body carries it: name, media type (when known) and base64."""
    if not isinstance(att, Attachment):
        att = Attachment.from_path(att)
    # A name read from the disk may not be UTF-8 (no JSON text could carry it): only a label.
    name = safe_name(att.name)
    entry: dict[str, Any] = {"name": name, "data": base64.b64encode(att.data).decode()}
    if att.media_type is not None:
        entry["media_type"] = att.media_type
    return entry


class BaseConversation(Generic[HTTP]):
    """What both conversation shells share: the conversation's name and the calls about it."""

    def __init__(self, client: BaseClient[HTTP], agent: str, id: str) -> None:
        self._client: BaseClient[HTTP] = client
        self._http: HTTP = client._http
        self.agent, self.id = agent, id
        self.conversation_id = f"{agent}/{id}"
        self._base = f"/agents/{segment(agent, 'agent')}/{segment(id, 'conversation id')}"

    def _send_call(
        self,
        text: str,
        idempotency_key: str | None,
        attachments: Sequence[Attachment | str | PathLike[str]] | None = None,
    ) -> Call[Receipt]:
        body: dict[str, Any] = {"message": sendable(text, "message")}
        if idempotency_key is not None:
            body["idempotency_key"] = sendable(idempotency_key, "idempotency_key")
        if attachments:
            body["attachments"] = [attachment_entry(a) for a in attachments]
        return Call(Request("POST", self._base, json=body), receipt_from)

    def _signal_call(
        self, type: str, body: str, attributes: dict[str, Any] | None, key: str | None
    ) -> Call[Receipt]:
        signal = {
            "type": sendable(type, "signal.type"),
            "body": sendable(body, "signal.body"),
            "attributes": sendable(attributes or {}, "signal.attributes"),
        }
        payload: dict[str, Any] = {"signal": signal}
        if key is not None:
            payload["idempotency_key"] = sendable(key, "idempotency_key")
        return Call(Request("POST", self._base, json=payload), receipt_from)

    def _submission_call(self, submission_id: str, wait: float | None) -> Call[dict[str, Any]]:
        params = {"wait": min(wait, MAX_WAIT_S)} if wait else None
        timeout = httpx2.Timeout((wait or 0) + WAIT_SLACK_S, connect=CONNECT_S)
        path = submission_path(self._base, submission_id)
        return Call(Request("GET", path, params=params, timeout=timeout), as_is)

    def _snapshot_call(self) -> Call[dict[str, Any]]:
        return Call(Request("GET", self._base), as_is)

    def _resolve_call(self, wait_id: str, value: Any) -> Call[dict[str, Any]]:
        path = f"{self._base}/waits/{segment(wait_id, 'wait id')}"
        return Call(Request("POST", path, json={"value": sendable(value, "value")}), as_is)

    def _waits_call(self) -> Call[list[dict[str, Any]]]:
        return Call(Request("GET", f"{self._base}/waits"), waits_from)

    def _fork_call(self, offset: int, new_id: str) -> Call[dict[str, Any]]:
        body = {"offset": offset, "new_id": sendable(new_id, "new_id")}
        return Call(Request("POST", f"{self._base}/fork", json=body), as_is)

    def _abort_call(self) -> Call[AbortResult]:
        return Call(Request("POST", f"{self._base}/abort"), abort_result_from)

    def _reading(self, receipt: Receipt | str, timeout: float | None) -> Reading:
        """A read of ``receipt``'s settlement, from the offset it was admitted at."""
        if not isinstance(receipt, Receipt):
            return Reading(self._base, str(receipt), -1, timeout)
        if receipt.conversation_id != self.conversation_id:
            raise ValueError(
                f"the receipt belongs to {receipt.conversation_id}, not {self.conversation_id}"
            )
        return Reading(self._base, receipt.submission_id, receipt.offset, timeout)

    def _tail(self, offset: int) -> Tail:
        return Tail(self._base, offset)

    def _history(self, offset: int) -> History:
        return History(self._base, offset)
