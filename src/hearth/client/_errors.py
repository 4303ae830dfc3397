"""The errors the client SDK raises for the server's answers, and which of them are worth a retry.

An error answer carries an envelope ``{"error": {"type", "message", "details"}}`` (docs/http.md);
types ``hearth.errors`` knows come back as those classes, the rest as ``HTTPError`` and its kin.
"""

from __future__ import annotations

from typing import Any

import httpx2

from hearth.errors import (
    AttachmentNotFound,
    AttachmentTooLarge,
    ConversationExists,
    ConversationNotFound,
    DelegatedConversation,
    HearthError,
    IdempotencyConflict,
    InvalidId,
    NotARestPoint,
    ShuttingDown,
    SubmissionNotFound,
    UnknownAgent,
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
    away). A server that cannot be reached at all raises httpx2's ``TransportError``s
    (``ConnectError``, ``ReadTimeout``, ...), which ``read`` and ``stream`` retry."""


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
}


def error_from(response: httpx2.Response) -> HearthError:
    """The typed error for an error answer (``hearth.errors`` where one fits)."""
    try:
        envelope = response.json()["error"]
        kind, message = str(envelope["type"]), str(envelope["message"])
        details = envelope.get("details")
    except Exception:
        kind, message, details = "http_error", response.reason_phrase or "error", None
    if kind == "not_a_rest_point":
        points = (details or {}).get("rest_points") if isinstance(details, dict) else None
        rest = NotARestPoint(message, [int(p) for p in points or []])
        rest.status = response.status_code  # type: ignore[attr-defined]
        return rest
    if kind == "attachment_too_large" and isinstance(details, dict):
        too_large = AttachmentTooLarge(
            message,
            str(details.get("name", "")),
            int(details.get("size") or 0),
            int(details.get("limit") or 0),
        )
        too_large.status = response.status_code  # type: ignore[attr-defined]
        return too_large
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
    return isinstance(exc, httpx2.TransportError | ShuttingDown | ServerUnavailable)
