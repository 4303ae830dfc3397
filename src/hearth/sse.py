"""Server-Sent Events: the one parser for every event stream hearth reads.

``SSEDecoder`` does no I/O: feed it lines, get back each event as it completes (WHATWG
event-stream rules). ``iter_sse`` and ``parse_sse`` run it over sync and async line iterators; the
client SDK reads ``hearth serve``'s streams with them, the model providers their servers' answers.

>>> list(iter_sse(["id: 3", "data: {}", ""]))
[SSEEvent(event='message', data='{}', id='3', retry=None)]
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hearth.errors import ProviderError

__all__ = ["SSEDecoder", "SSEEvent", "iter_sse", "parse_sse"]


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


class SSEDecoder:
    """Builds events from lines, one line at a time.

    A blank line dispatches the event being built; ``:`` lines are comments; a field line without a
    colon is a field with an empty value; one space after the colon is dropped. The last ``id`` and
    ``retry`` carry over to later events, as the standard says.
    """

    def __init__(self) -> None:
        self._name = ""
        self._data: list[str] = []
        self.last_id: str | None = None
        self.retry: int | None = None
        self._first = True

    def feed(self, raw: str) -> SSEEvent | None:
        """Take one line in (its line ending stripped or not); the event it completes, if any."""
        line = raw.rstrip("\r\n")
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")  # a byte order mark may open the stream
        if not line:
            name, data = self._name, self._data
            self._name, self._data = "", []
            if not data:
                return None
            joined = "\n".join(data)
            return SSEEvent(event=name or "message", data=joined, id=self.last_id, retry=self.retry)
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self.last_id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None


_LINE_END = re.compile("\r\n|\r|\n")


class LineSplitter:
    """Lines of an event stream from its text as it arrives, split only where the stream's
    lines end: CR, LF or CRLF (a CR that ends one chunk waits for the next, which may begin
    with its LF). ``str.splitlines``, and with it the lines of httpx2's responses, also splits
    at U+2028, U+2029 and U+0085, which JSON leaves as they are inside its strings: a record
    holding one would be cut in two."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, chunk: str) -> list[str]:
        text = self._pending + chunk
        lines, start = [], 0
        for end in _LINE_END.finditer(text):
            if end.group() == "\r" and end.end() == len(text):
                break  # perhaps the first half of a CRLF
            lines.append(text[start : end.start()])
            start = end.end()
        self._pending = text[start:]
        return lines

    def close(self) -> list[str]:
        """What is left: a last line without its end."""
        rest, self._pending = self._pending.rstrip("\r"), ""
        return [rest] if rest else []


def sse_lines(chunks: Iterable[str]) -> Iterator[str]:
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.close()


async def async_sse_lines(chunks: AsyncIterable[str]) -> AsyncGenerator[str, None]:
    splitter = LineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.close():
        yield line


def iter_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Each complete event from ``lines``; an event cut off by the end of the lines is dropped."""
    decoder = SSEDecoder()
    for line in lines:
        event = decoder.feed(line)
        if event is not None:
            yield event


async def parse_sse(lines: AsyncIterable[str]) -> AsyncGenerator[SSEEvent, None]:
    """``iter_sse`` over an async line iterator."""
    decoder = SSEDecoder()
    async for line in lines:
        event = decoder.feed(line)
        if event is not None:
            yield event
