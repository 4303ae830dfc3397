"""What the HTTP model clients share: the streamed POST, the httpx2 client, the provider base.

``post_sse`` POSTs a JSON body and yields the answer's events; every transport failure and every
error status comes out of it as a ``ProviderError`` (see ``failures``). ``HTTPProvider`` holds
where to connect, with which key, each model's context window, and the ``stream`` loop; a provider
adds only its API's request shape and a ``StreamedAnswer`` that decodes its events.
"""

from __future__ import annotations

import asyncio
import json
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any, Protocol

import httpx2

from hearth.errors import ProviderError
from hearth.providers.base import (
    Finished,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
)
from hearth.providers.failures import transport_failure
from hearth.providers.windows import context_window_for
from hearth.sse import SSEEvent, async_sse_lines, parse_sse

__all__ = ["ClientSlot", "HTTPProvider", "StreamedAnswer", "post_sse"]

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
    A body that cannot be sent as JSON fails at once: sending it again would fail the same way.
    """
    content = _encoded(provider, url, body)
    sent = dict(headers)
    if not any(name.lower() == "content-type" for name in sent):
        sent["content-type"] = "application/json"
    try:
        async with client.stream("POST", url, content=content, headers=sent) as response:
            content_type = response.headers.get("content-type", "")
            if response.status_code == 204 or 300 <= response.status_code < 400:
                raise ProviderError(
                    _no_answer(provider, url, response), status=response.status_code
                )
            if response.status_code >= 400 or "application/json" in content_type:
                raw = await response.aread()
                raise on_error(
                    response.status_code, raw.decode("utf-8", "replace"), response.headers
                )
            async for event in parse_sse(async_sse_lines(response.aiter_text())):
                yield event
    except httpx2.HTTPError as exc:
        raise transport_failure(provider, url, exc) from exc
    except httpx2.InvalidURL as exc:
        raise ProviderError(f"{provider}: invalid URL {url!r}: {exc}") from exc
    except OSError as exc:  # a socket error the transport did not wrap
        raise ProviderError(
            f"{provider}: the connection to {url} failed: {exc}", kind="transient"
        ) from exc


def _encoded(provider: str, url: str, body: dict[str, Any]) -> bytes:
    """``body`` as the bytes of its JSON (as httpx2 would send it), or a terminal
    ``ProviderError`` saying why it has none."""
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProviderError(
            f"{provider}: the request to {url} cannot be sent as JSON ({exc}); look for half a"
            " surrogate pair or a NaN or infinite number in the agent's instructions and its"
            " tools' descriptions and schemas"
        ) from None


def _no_answer(provider: str, url: str, response: httpx2.Response) -> str:
    """Why a 204 or a redirect is no answer: the base URL is wrong (a redirect is not followed,
    as it would send the key elsewhere). Read as a stream, it was an empty one, and retried."""
    status = response.status_code
    location = response.headers.get("location")
    if status == 204 or not location:
        return f"{provider}: {url} answered HTTP {status} with nothing; check the base URL"
    return (
        f"{provider}: {url} answered HTTP {status}, a redirect to {location}; redirects are not"
        " followed (they would carry the API key): give the base URL it points to"
    )


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced."""
    if not secret or len(secret) < 4:
        return text
    return text.replace(secret, "[redacted]")


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


class StreamedAnswer(Protocol):
    """What a provider folds its server's events into while they stream in."""

    @property
    def ended(self) -> bool:
        """The server said it has sent everything: read no further."""
        ...

    @property
    def complete(self) -> bool:
        """The answer is whole (its stop reason came), even if the end of the stream did not."""
        ...

    def feed(self, event: SSEEvent) -> str:
        """Take one event in; return its text delta ("" if none). Error events raise."""
        ...

    def tool_calls(self) -> list[ToolCall]:
        """The answer's complete tool calls, in order."""
        ...

    def finished(self) -> Finished:
        """The stop reason and token usage."""
        ...


class HTTPProvider(ABC):
    """What the HTTP model clients share: where to connect and with which key (read from the
    environment at request time unless given), per-model context windows, the client, and the
    ``stream`` loop.

    A subclass names its endpoint (``stream_path``) and supplies ``request_body``,
    ``request_headers``, ``error_response`` and ``new_answer``.
    """

    name = "http"
    base_url_env = ""
    api_key_env = ""
    default_base_url = ""
    default_window = 8192
    stream_path = ""  # appended to the base URL
    # How errors name a malformed event and a stream cut short (``name`` is in neither: a
    # subclass registered under another name still speaks its API's dialect).
    malformed_event = "malformed stream event"
    incomplete_stream = "the stream ended before the response was complete"

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

    @abstractmethod
    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""

    @abstractmethod
    def request_headers(self) -> dict[str, str]:
        """The headers sent with every request (the key among them)."""

    @abstractmethod
    def error_response(self, status: int, body: str, headers: httpx2.Headers) -> ProviderError:
        """The error for an answer that is not a stream (an error status, or JSON)."""

    @abstractmethod
    def new_answer(self) -> StreamedAnswer:
        """An empty answer to feed one request's events to."""

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Stream one answer: text deltas, then every tool call, then ``Finished``."""
        headers = self.request_headers()
        body = self.request_body(request)
        answer = self.new_answer()
        key = self.api_key

        def on_error(status: int, text: str, headers: httpx2.Headers) -> ProviderError:
            # Some APIs quote the key they were sent in their error; it must not travel on into
            # the submission's error, the log or a client's answer.
            return self.error_response(status, redact(text, key), headers)

        events = post_sse(
            self._client.get(),
            f"{self.base_url}{self.stream_path}",
            body=body,
            headers=headers,
            provider=self.name,
            on_error=on_error,
        )
        try:
            async with aclosing(events):
                async for event in events:
                    try:
                        text = answer.feed(event)
                    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
                        raise ProviderError(
                            f"{self.malformed_event} {event.data[:200]!r}",
                            kind="transient",
                        ) from exc
                    if text:
                        yield TextDelta(text)
                    if answer.ended:
                        break
        except ProviderError as exc:
            # Cut after the stop reason: the answer is whole, only its trailer was lost.
            if exc.kind != "transient" or not answer.complete:
                raise
        if not answer.complete:
            raise ProviderError(self.incomplete_stream, kind="transient")
        for call in answer.tool_calls():
            yield ToolCallEvent(call)
        yield answer.finished()
