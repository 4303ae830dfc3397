"""The JSON error envelope, and how hearth's exceptions map onto HTTP statuses.

Every error answer is ``{"error": {"type": str, "message": str, "details": ...}}``. The ``type`` is
a stable snake_case word that the client SDK maps back onto ``hearth.errors``.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.responses import JSONResponse

from hearth.errors import (
    AttachmentNotFound,
    AttachmentTooLarge,
    ChannelFailed,
    ConfigurationError,
    ConversationExists,
    ConversationNotFound,
    CorruptData,
    DelegatedConversation,
    DeliveryNotFound,
    HearthError,
    IdempotencyConflict,
    InvalidId,
    InvalidInput,
    InvalidSignature,
    NotARestPoint,
    ShuttingDown,
    StoreError,
    SubmissionNotFound,
    UnknownAgent,
    UnknownChannel,
    WaitConflict,
    WaitNotFound,
)

log = logging.getLogger("hearth.server")


class ApiError(Exception):
    """An answer other than success, raised anywhere below an endpoint."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.details = details
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.type, self.message, self.details, self.headers)


def error_response(
    status: int,
    type: str,
    message: str,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"type": type, "message": message, "details": details}}
    return JSONResponse(body, status_code=status, headers=headers)


# The statuses of hearth's own errors; anything unlisted is a server fault (500).
_MAPPED: list[tuple[type[BaseException], int, str]] = [
    (UnknownAgent, 404, "unknown_agent"),
    (UnknownChannel, 404, "unknown_channel"),
    (DeliveryNotFound, 404, "delivery_not_found"),
    (InvalidSignature, 401, "invalid_signature"),
    (ConversationNotFound, 404, "conversation_not_found"),
    (SubmissionNotFound, 404, "submission_not_found"),
    (WaitNotFound, 404, "wait_not_found"),
    (AttachmentNotFound, 404, "attachment_not_found"),
    (WaitConflict, 409, "wait_conflict"),
    (InvalidId, 400, "invalid_id"),
    (InvalidInput, 400, "invalid_request"),
    (IdempotencyConflict, 409, "idempotency_conflict"),
    (ConversationExists, 409, "conversation_exists"),
    (DelegatedConversation, 409, "delegated_conversation"),
    (NotARestPoint, 409, "not_a_rest_point"),
    (ShuttingDown, 503, "shutting_down"),
    (CorruptData, 500, "corrupt_data"),  # (not the database away: no retry can read it)
    (StoreError, 503, "unavailable"),
    (ConfigurationError, 503, "unavailable"),
]


def api_error(exc: BaseException) -> ApiError:
    """The answer for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ChannelFailed):  # the sender retries on a 5xx; its log has the cause
        where = {"channel": exc.channel, "delivery_id": exc.delivery_id}
        return ApiError(500, "channel_failed", str(exc), where)
    if isinstance(exc, AttachmentTooLarge):
        about = {"name": exc.name, "size": exc.size, "limit": exc.limit}
        return ApiError(413, "attachment_too_large", str(exc), about)
    for kind, status, name in _MAPPED:
        if isinstance(exc, kind):
            headers = {"Retry-After": "1"} if status == 503 else None
            field = exc.field if isinstance(exc, InvalidInput) else None
            details: Any = {"field": field} if field else None
            if isinstance(exc, NotARestPoint):
                details = {"rest_points": exc.rest_points}
            message = str(exc) or name.replace("_", " ")
            return ApiError(status, name, message, details, headers)
    if isinstance(exc, HearthError):
        return ApiError(500, "internal", f"{type(exc).__name__}: {exc}")
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal", "the server failed; see its log")
