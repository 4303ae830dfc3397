"""The errors the client SDK raises for the server's answers, and which of them are worth a retry.

An error answer carries an envelope ``{"error": {"type", "message", "details"}}`` (docs/http.md);
types ``hearth.errors`` knows come back as those classes (with ``status`` set to the HTTP status),
the rest as ``HTTPError`` and its kin.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx2

from hearth.errors import (
    AttachmentNotFound,
    AttachmentTooLarge,
    ChannelFailed,
    ConversationExists,
    ConversationNotFound,
    CorruptData,
    DelegatedConversation,
    DeliveryNotFound,
    HearthError,
    IdempotencyConflict,
    InvalidId,
    InvalidInput,
    NotARestPoint,
    ShuttingDown,
    SubmissionNotFound,
    UnknownAgent,
    UnknownChannel,
    WaitConflict,
    WaitNotFound,
)

__all__ = [
    "HTTPError",
    "ServerUnavailable",
    "Unauthorized",
    "check",
    "error_from",
    "is_transient",
]


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
    """The server answered 5xx: it failed, or cannot serve now (shutting down, its database
    away). ``read`` and ``stream`` retry it, unless its type is ``internal`` (a fault of the
    server's own: the same request would fail the same way). A server that cannot be reached at
    all raises httpx2's ``TransportError``s (``ConnectError``, ``ReadTimeout``, ...), which they
    retry too."""


_BY_TYPE: dict[str, type[HearthError]] = {
    "unknown_agent": UnknownAgent,
    "conversation_not_found": ConversationNotFound,
    "submission_not_found": SubmissionNotFound,
    "invalid_id": InvalidId,
    "idempotency_conflict": IdempotencyConflict,
    "shutting_down": ShuttingDown,
    "wait_not_found": WaitNotFound,
    "wait_conflict": WaitConflict,
    "conversation_exists": ConversationExists,
    "delegated_conversation": DelegatedConversation,
    "attachment_not_found": AttachmentNotFound,
    "unknown_channel": UnknownChannel,
    "delivery_not_found": DeliveryNotFound,
    "corrupt_data": CorruptData,  # (a 500, but no retry can read it)
}
# 5xx answers that no retry helps: the server's own faults.
_NOT_TRANSIENT = frozenset({"internal"})


def error_from(response: httpx2.Response) -> HearthError:
    """The typed error for an error answer (``hearth.errors`` where one fits)."""
    try:
        envelope = response.json()["error"]
        kind, message = str(envelope["type"]), str(envelope["message"])
        details = envelope.get("details")
    except Exception:
        kind, message, details = "http_error", response.reason_phrase or "error", None
    known = _known(kind, message, details if isinstance(details, dict) else None)
    if known is not None:
        # What every error of the client carries (docs/http.md), on the typed ones too.
        known.status = response.status_code  # type: ignore[attr-defined]
        known.type = kind  # type: ignore[attr-defined]
        known.message = message  # type: ignore[attr-defined]
        known.details = details  # type: ignore[attr-defined]
        return known
    if response.status_code == 401:
        return Unauthorized(401, kind, message, details)
    if response.status_code >= 500:
        return ServerUnavailable(response.status_code, kind, message, details)
    return HTTPError(response.status_code, kind, message, details)


def _known(kind: str, message: str, details: dict[str, Any] | None) -> HearthError | None:
    """The ``hearth.errors`` class for an error type, with what its details say; None when the
    type has none."""
    about = details or {}
    if kind == "not_a_rest_point":
        return NotARestPoint(message, [int(p) for p in about.get("rest_points") or []])
    if kind == "attachment_too_large" and details is not None:
        name, size, limit = about.get("name", ""), about.get("size"), about.get("limit")
        return AttachmentTooLarge(message, str(name), int(size or 0), int(limit or 0))
    if kind == "channel_failed":
        delivery_id = about.get("delivery_id")
        channel = str(about.get("channel") or "")
        return ChannelFailed(message, channel, None if delivery_id is None else str(delivery_id))
    if kind == "invalid_request":
        field = about.get("field")
        return InvalidInput(message, None if field is None else str(field))
    known = _BY_TYPE.get(kind)
    return None if known is None else known(message)


def refused_here(message: str, field: str) -> InvalidInput:
    """``InvalidInput`` for what the client itself cannot send (no request was made): it
    carries what a server's 400 carries, ``status`` None."""
    return _carrying(InvalidInput(message, field), "invalid_request", field)


def id_refused_here(message: str, field: str) -> InvalidId:
    """``InvalidId`` for an id or name the client cannot put in a URL (no request was made),
    carrying what the server's would, ``status`` None."""
    return _carrying(InvalidId(message), "invalid_id", field)


_E = TypeVar("_E", bound=HearthError)


def _carrying(error: _E, kind: str, field: str) -> _E:
    error.status = None  # type: ignore[attr-defined]
    error.type = kind  # type: ignore[attr-defined]
    error.message = str(error)  # type: ignore[attr-defined]
    error.details = {"field": field}  # type: ignore[attr-defined]
    return error


def check(response: httpx2.Response) -> dict[str, Any]:
    """The JSON object of a successful answer; the typed error of any other, and an
    ``HTTPError`` for an answer that is not hearth's (a redirect, a page of HTML: the URL names
    something else)."""
    if response.status_code >= 400:
        raise error_from(response)
    if response.is_redirect:
        where = response.headers.get("location", "elsewhere")
        raise HTTPError(
            response.status_code,
            "not_hearth",
            f"{response.url} redirects to {where}: give the URL of hearth's server itself",
        )
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        kind = response.headers.get("content-type", "no content type")
        raise HTTPError(
            response.status_code,
            "not_hearth",
            f"{response.url} did not answer as hearth's server does (a JSON object; got {kind})",
        )
    return data


def is_transient(exc: BaseException) -> bool:
    """Worth retrying after a pause: the server is away, restarting or shutting down."""
    if isinstance(exc, ServerUnavailable):
        return exc.type not in _NOT_TRANSIENT
    return isinstance(exc, httpx2.TransportError | ShuttingDown)
