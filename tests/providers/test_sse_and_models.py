"""The SSE parser, failure classification helpers and the context-window table."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hearth.errors import ProviderError
from hearth.providers.failures import error_details, retry_after_seconds
from hearth.providers.windows import context_window_for
from hearth.sse import LineSplitter, SSEEvent, parse_sse, sse_lines

pytestmark = pytest.mark.anyio


async def lines_of(text: str) -> AsyncIterator[str]:
    for line in text.splitlines():
        yield line


async def parse(text: str) -> list[SSEEvent]:
    return [event async for event in parse_sse(lines_of(text))]


async def test_events_carry_their_name_and_data() -> None:
    events = await parse('event: ping\ndata: {"type": "ping"}\n\ndata: plain\n\n')
    assert events == [SSEEvent("ping", '{"type": "ping"}'), SSEEvent("message", "plain")]


async def test_multi_line_data_is_joined_with_newlines() -> None:
    assert await parse("data: first\ndata: second\ndata:third\n\n") == [
        SSEEvent("message", "first\nsecond\nthird")
    ]


async def test_comments_and_unknown_fields_are_ignored() -> None:
    events = await parse(": keep-alive\n\n: another\nfoo: bar\ndata: x\n\n")
    assert events == [SSEEvent("message", "x")]


async def test_crlf_line_endings_and_ids_and_retry_are_understood() -> None:
    events = await parse("id: 7\r\nretry: 1500\r\ndata: x\r\n\r\ndata: y\r\n\r\n")
    assert events == [SSEEvent("message", "x", "7", 1500), SSEEvent("message", "y", "7", 1500)]


async def test_a_byte_order_mark_before_the_first_field_is_dropped() -> None:
    """With it, the first field's name was ``\\ufeffdata`` and the first event was lost."""
    assert await parse("\ufeffdata: first\n\ndata: second\n\n") == [
        SSEEvent("message", "first"),
        SSEEvent("message", "second"),
    ]


async def test_a_retry_that_is_not_ascii_digits_is_ignored() -> None:
    """``²`` is a digit to ``str.isdigit`` but not to ``int()``: the stream raised."""
    assert await parse("retry: \u00b2\ndata: x\n\n") == [SSEEvent("message", "x")]


def test_lines_end_only_at_cr_lf_and_crlf_whatever_the_chunks() -> None:
    chunks = ["data: a\u2028b\u2029c\x85d\r", "\ndata: e\rdata: f", "\n\n", "data: tail"]
    assert list(sse_lines(chunks)) == [
        "data: a\u2028b\u2029c\x85d",
        "data: e",
        "data: f",
        "",
        "data: tail",
    ]
    splitter = LineSplitter()
    assert splitter.feed("x\r") == []  # a CRLF may be split between chunks
    assert splitter.feed("\ny") == ["x"]
    assert splitter.close() == ["y"]


async def test_an_event_still_open_when_the_stream_ends_is_dropped() -> None:
    assert await parse('data: {"whole": true}\n\ndata: {"cut') == [
        SSEEvent("message", '{"whole": true}')
    ]


async def test_a_field_without_colon_and_an_empty_data_line_dispatch_empty_data() -> None:
    assert await parse("data\n\n") == [SSEEvent("message", "")]


def test_done_marker_and_json() -> None:
    assert SSEEvent(data="[DONE]").is_done
    assert SSEEvent(data='{"a": 1}').json() == {"a": 1}
    with pytest.raises(ProviderError) as info:
        SSEEvent(data="[1, 2]").json()
    assert info.value.kind == "transient"


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "inf"},
        {"retry-after": "1e999"},
        {"retry-after": "nan"},
        {"retry-after-ms": "Infinity"},
        {"retry-after-ms": "-inf", "retry-after": "NaN"},
    ],
)
def test_a_retry_after_that_is_no_finite_number_says_nothing(headers: dict[str, str]) -> None:
    """``float()`` reads "inf" and "nan": recorded, they spoiled every JSON read of the stream."""
    assert retry_after_seconds(headers) is None


def test_a_provider_error_keeps_only_a_finite_retry_after() -> None:
    """A provider of the application's own builds its errors itself."""
    for odd in (float("inf"), float("nan"), -1.0, True, "3"):
        assert ProviderError("x", kind="transient", retry_after=odd).retry_after is None  # type: ignore[arg-type]
    assert ProviderError("x", kind="transient", retry_after=2).retry_after == 2


def test_error_details_reads_the_common_shapes() -> None:
    assert error_details('{"error": {"message": "m", "type": "t", "code": "c"}}') == ("m", "t", "c")
    assert error_details('{"error": "plain"}') == ("plain", None, None)
    assert error_details('{"detail": "fastapi"}') == ("fastapi", None, None)
    assert error_details("<html>bad gateway</html>") == (None, None, None)


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("ft:gpt-4o-mini:acme::abc123", 128_000),
        ("gpt-4", 8_192),
        ("gpt-4-1106-preview", 128_000),
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-5-mini", 400_000),
        ("o3-mini", 200_000),
        ("o4-mini-2025-04-16", 200_000),
        ("claude-3-5-sonnet-20241022", 200_000),
        ("anthropic/claude-3.7-sonnet", 200_000),
        ("claude-opus-4-1-20250805", 200_000),
        ("llama3:8b", 8_192),
        ("llama3.1:8b-instruct-q4_K_M", 131_072),
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("qwen2.5:7b", 32_768),
        ("Qwen/Qwen2.5-7B-Instruct", 32_768),
        ("mistral:7b", 32_768),
        ("mistral-nemo", 131_072),
        ("HuggingFaceTB/SmolLM2-360M-Instruct", 8_192),
        ("totally-unknown", 8_192),
    ],
)
def test_context_window_table(model: str, window: int) -> None:
    assert context_window_for(model, default=8_192) == window


def test_overrides_win_and_star_replaces_the_default() -> None:
    overrides = {"qwen2.5": 8_192, "*": 4_096}
    assert context_window_for("qwen2.5:14b", default=1, overrides=overrides) == 8_192
    assert context_window_for("gpt-4o", default=1, overrides=overrides) == 128_000
    assert context_window_for("my-finetune", default=1, overrides=overrides) == 4_096
