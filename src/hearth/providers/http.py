"""What the HTTP model clients share: the streamed POST, the httpx2 client, the provider base.

``post_sse`` POSTs a JSON body and yields the answer's events; every transport failure and every
error status comes out of it as a ``ProviderError`` (see ``failures``). ``HTTPProvider`` holds
where to connect, with which key, and each model's context window.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import httpx2

from hearth.errors import ProviderError
from hearth.providers.failures import transport_failure
from hearth.providers.windows import context_window_for
from hearth.sse import SSEEvent, parse_sse

__all__ = ["ClientSlot", "HTTPProvider", "post_sse"]

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
        raise transport_failure(provider, url, exc) from exc
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
