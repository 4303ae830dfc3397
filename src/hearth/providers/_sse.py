"""Server-Sent Events over httpx2, and the HTTP failure rules both model clients share.

``parse_sse`` is an incremental parser (WHATWG event-stream rules) over an async line iterator.
``post_sse`` POSTs a JSON body and yields the response's events; every transport failure and every
error status comes out of it as a ``ProviderError`` classified transient / overflow / terminal.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2

from hearth.errors import ProviderError
from hearth.providers.windows import context_window_for

__all__ = [
    "ClientSlot",
    "SSEEvent",
    "classify_failure",
    "error_details",
    "parse_sse",
    "post_sse",
    "retry_after_seconds",
]


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its ``event:`` name (default ``"message"``) and joined ``data:``."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None

    @property
    def is_done(self) -> bool:
        """The OpenAI-style end marker ``data: [DONE]``."""
        return self.data.strip() == "[DONE]"

    def json(self) -> dict[str, Any]:
        """The data as a JSON object; anything else is a (transient) ``ProviderError``."""
        try:
            value = json.loads(self.data)
        except ValueError as exc:
            raise ProviderError(
                f"the model server sent an event that is not JSON: {self.data[:200]!r}",
                kind="transient",
            ) from exc
        if not isinstance(value, dict):
            raise ProviderError(
                f"the model server sent an event that is not a JSON object: {self.data[:200]!r}",
                kind="transient",
            )
        return value


async def parse_sse(lines: AsyncIterable[str]) -> AsyncGenerator[SSEEvent, None]:
    """Yield each complete event from ``lines`` (line endings already stripped or not).

    A blank line dispatches the event being built; ``:`` lines are comments; a field line without a
    colon is a field with an empty value; one space after the colon is dropped. An event still being
    built when the lines end is discarded, as the standard says: it may have been cut in half.
    """
    name = ""
    data: list[str] = []
    last_id: str | None = None
    retry: int | None = None
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                joined = "\n".join(data)
                yield SSEEvent(event=name or "message", data=joined, id=last_id, retry=retry)
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            if "\0" not in value:
                last_id = value
        elif field == "retry" and value.isdigit():
            retry = int(value)


# --- failure classification -------------------------------------------------------------------

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
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _transport_failure(provider: str, url: str, exc: Exception) -> ProviderError:
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


ErrorResponse = Callable[[int, str, httpx2.Headers], ProviderError]


async def post_sse(
    client: httpx2.AsyncClient,
    url: str,
    *,
    body: dict[str, Any],
    headers: Mapping[str, str],
    provider: str,
    on_error: ErrorResponse,
) -> AsyncGenerator[SSEEvent, None]:
    """POST ``body`` to ``url`` and yield the events of the streamed answer.

    A status >= 400 (or a JSON answer where a stream was expected) is handed, with its body, to
    ``on_error``, whose ``ProviderError`` is raised. Transport failures are classified here. The
    response is closed when the generator is closed, so closing it early drops the connection.
    """
    try:
        async with client.stream("POST", url, json=body, headers=dict(headers)) as response:
            content_type = response.headers.get("content-type", "")
            if response.status_code >= 400 or "application/json" in content_type:
                raw = await response.aread()
                raise on_error(
                    response.status_code, raw.decode("utf-8", "replace"), response.headers
                )
            async for event in parse_sse(response.aiter_lines()):
                yield event
    except httpx2.HTTPError as exc:
        raise _transport_failure(provider, url, exc) from exc
    except httpx2.InvalidURL as exc:
        raise ProviderError(f"{provider}: invalid URL {url!r}: {exc}") from exc
    except OSError as exc:  # a socket error the transport did not wrap
        raise ProviderError(
            f"{provider}: the connection to {url} failed: {exc}", kind="transient"
        ) from exc


class ClientSlot:
    """A provider's httpx2 client: the one it was given, or one it makes on first use.

    A client it made is closed by ``aclose`` and remade when used from another event loop (its
    pooled connections belong to the loop that opened them); a given client is never touched.
    """

    def __init__(self, client: httpx2.AsyncClient | None, timeout: httpx2.Timeout) -> None:
        self._client = client
        self._owned = client is None
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx2.AsyncClient:
        if not self._owned and self._client is not None:
            return self._client
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._client is None or loop is not self._loop:
            # The old client's connections died with their loop: let it be collected.
            self._client = httpx2.AsyncClient(timeout=self._timeout)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._owned and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class HTTPProvider:
    """What the HTTP model clients share: where to connect and with which key (read from the
    environment at request time unless given), per-model context windows, and the client."""

    name = "http"
    base_url_env = ""
    api_key_env = ""
    default_base_url = ""
    default_window = 8192

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        context_windows: Mapping[str, int] | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        client: httpx2.AsyncClient | None = None,
    ) -> None:
        self._base_url = base_url
        self._api_key = api_key
        self._windows = dict(context_windows or {})
        self._headers = dict(headers or {})
        self._client = ClientSlot(client, httpx2.Timeout(timeout, connect=connect_timeout))

    @property
    def base_url(self) -> str:
        url = self._base_url or os.environ.get(self.base_url_env) or self.default_base_url
        return url.rstrip("/")

    @property
    def api_key(self) -> str | None:
        return self._api_key or os.environ.get(self.api_key_env) or None

    def supports(self, model: str) -> bool:
        return bool(model)

    def context_window(self, model: str) -> int:
        return context_window_for(model, default=self.default_window, overrides=self._windows)

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it."""
        await self._client.aclose()
