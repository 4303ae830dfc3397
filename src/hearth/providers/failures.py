"""How the HTTP model clients classify failures: transient, overflow or terminal.

Model servers word their errors in many ways; these helpers read the common error body shapes,
spot context-overflow messages, honour ``Retry-After`` and name transport failures, so each
provider only says what is particular to its API.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import httpx2

from hearth.errors import ProviderError

__all__ = [
    "OVERFLOW_MARKERS",
    "classify_failure",
    "error_details",
    "retry_after_seconds",
    "transport_failure",
]

# Phrases model servers use when the prompt does not fit: OpenAI and vLLM ("maximum context
# length"), llama.cpp ("exceeds the available context size"), Anthropic ("prompt is too long").
OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "exceeds the available context size",
    "exceed_context_size",
    "exceed context limit",
    "context window",
    "prompt is too long",
    "input is too long",
    "too many tokens",
    "reduce the length of the messages",
)

# Statuses that say nothing about the prompt's size, whatever their message mentions.
_NOT_OVERFLOW = frozenset({401, 403, 404, 429})


def error_details(body: str) -> tuple[str | None, str | None, str | None]:
    """``(message, type, code)`` from an error body in any of the shapes servers use.

    Covers ``{"error": {"message", "type", "code"}}`` (OpenAI, Anthropic, vLLM, llama.cpp),
    ``{"error": "text"}`` (Ollama), ``{"message": ...}`` and ``{"detail": ...}``.
    """
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return None, None, None
    if isinstance(payload, list) and payload:
        payload = payload[0]
    if not isinstance(payload, dict):
        return None, None, None
    err = payload.get("error", payload)
    if isinstance(err, str):
        return err, None, None
    if not isinstance(err, dict):
        return None, None, None
    message = err.get("message") or err.get("detail")
    kind = err.get("type")
    code = err.get("code")
    return (
        None if message is None else str(message),
        None if kind is None else str(kind),
        None if code is None else str(code),
    )


def classify_failure(
    provider: str,
    status: int | None,
    message: str,
    *,
    hints: tuple[str | None, ...] = (),
    transient: bool | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """Build the ``ProviderError`` for a failed request (``status``) or a mid-stream error (None).

    ``hints`` are the error's type/code strings, searched for overflow markers with the message.
    ``transient`` overrides the status-based rule (429, 408 and 5xx are transient; mid-stream
    errors too, since the server accepted the request before failing).
    """
    where = f"HTTP {status}" if status is not None else "error in stream"
    text = f"{provider} ({where}): {message}"
    haystack = " ".join([message, *(h for h in hints if h)]).lower()
    if status not in _NOT_OVERFLOW and any(marker in haystack for marker in OVERFLOW_MARKERS):
        return ProviderError(text, kind="overflow", status=status)
    if transient is None:
        transient = status is None or status in (408, 409, 425, 429) or status >= 500
    kind = "transient" if transient else "terminal"
    return ProviderError(
        text, kind=kind, status=status, retry_after=retry_after if transient else None
    )


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date);
    None when neither says a finite number (``inf`` and ``nan`` parse as floats)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            seconds = float(millis) / 1000.0
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def transport_failure(provider: str, url: str, exc: Exception) -> ProviderError:
    """The ``ProviderError`` for a request that failed on the way (no status to go by)."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx2.ConnectTimeout):
        return ProviderError(f"{provider}: timed out connecting to {url}", kind="transient")
    if isinstance(exc, httpx2.TimeoutException):
        return ProviderError(
            f"{provider}: timed out waiting for {url} ({type(exc).__name__})", kind="transient"
        )
    if isinstance(exc, httpx2.ConnectError):
        return ProviderError(f"{provider}: could not connect to {url}: {detail}", kind="transient")
    if isinstance(exc, httpx2.UnsupportedProtocol | httpx2.LocalProtocolError):
        return ProviderError(f"{provider}: cannot send a request to {url}: {detail}")
    if isinstance(exc, httpx2.TooManyRedirects):
        return ProviderError(f"{provider}: too many redirects from {url}")
    # Reset, dropped or garbled connections: the stream was cut mid-way.
    return ProviderError(f"{provider}: the connection to {url} failed: {detail}", kind="transient")
