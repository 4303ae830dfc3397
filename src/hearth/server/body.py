"""Reading a request body: size limit (enforced while reading); for JSON, media type and parsing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request

from hearth.jsontext import parsed_unpaired_surrogate, strict_json
from hearth.server.context import CLOSING_KEY, Closing
from hearth.server.errors import ApiError

# Past the limit the rest of a body is read and dropped up to this many bytes, so that an
# ordinary client, still uploading, reads the 413 instead of a broken pipe. Never buffered.
_DRAIN_LIMIT = 16 * 1024 * 1024
# A body must arrive within this long of its head: a client that stalls mid-body is answered
# 408 and its handler freed, instead of waiting on it for good.
BODY_TIMEOUT_S = 30.0


def is_json_media_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def read_json(request: Request, max_body: int) -> Any:
    """The parsed body, or an ``ApiError`` (415, 413 or 400)."""
    if not is_json_media_type(request.headers.get("content-type")):
        raise ApiError(
            415,
            "unsupported_media_type",
            "send the body as JSON, with the header Content-Type: application/json",
        )
    return parse_json(await read_body(request, max_body))


async def read_body(
    request: Request,
    max_body: int,
    setting: str = "HEARTH_MAX_BODY",
    *,
    upload: tuple[int, str, Callable[[bytes], bool]] | None = None,
) -> bytes:
    """The raw body, or an ``ApiError`` (413 over ``max_body``, named as ``setting``; 400).

    ``upload``, ``(limit, setting, carries_files)``: a body may go past ``max_body``, up to
    ``limit``, when ``carries_files`` says yes to its first ``max_body`` bytes. Any other body
    is refused as soon as it passes ``max_body``: nothing is buffered past that first."""
    too_big = _too_big(max_body, setting)
    most = max_body if upload is None else max(max_body, upload[0])
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding != "identity":
        # Read as sent, a compressed body would be reported as bad JSON (or bad UTF-8).
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
        )
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise ApiError(400, "invalid_request", "Content-Length is not a number") from None
        if length > most:
            if most > max_body and upload is not None:
                max_body, setting = most, upload[1]  # (what the refusal names)
            if length > _DRAIN_LIMIT:
                # not worth reading at all; the connection is closed
                raise _too_big(max_body, setting, close=True)
            await _drain(request)
            raise _too_big(max_body, setting)
    else:
        length = None
    chunks: list[bytes] = []
    size = 0
    limit = max_body  # raised to the upload limit once the body shows it carries files
    named = setting  # (the limit's setting, for the 413)
    looked = False  # (whether it was asked)
    closing: Closing | None = request.scope.get(CLOSING_KEY)
    undo = None
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S) as deadline:
            if closing is not None:
                # A shutdown does not wait for a slow body (the server would cancel the read
                # past its grace and answer a bare 500): it ends the read at once.
                undo = closing.on_set(functools.partial(_end_now, deadline))
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit and upload is not None and not looked:
                    looked = True
                    head = b"".join(chunks) + chunk[: max_body - (size - len(chunk))]
                    if upload[2](head):
                        limit, named, too_big = most, upload[1], _too_big(most, upload[1])
                    elif length is not None and length > _DRAIN_LIMIT:
                        too_big = _too_big(limit, named, close=True)
                        break  # not worth draining, as a declared length past it is (above)
                if size > limit:
                    if size <= _DRAIN_LIMIT:
                        continue
                    too_big = _too_big(limit, named, close=True)  # (the rest is not read)
                    break
                chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "invalid_request", "the client went away mid-body") from None
    except TimeoutError:
        if closing is not None and closing.is_set():
            raise ApiError(
                503,
                "shutting_down",
                "the server is shutting down and admits no new work",
                headers={"Retry-After": "1", "Connection": "close"},
            ) from None
        raise ApiError(
            408,
            "request_timeout",
            f"the body did not arrive within {BODY_TIMEOUT_S:g} s",
            headers={"Connection": "close"},
        ) from None
    finally:
        if undo is not None:
            undo()
    if size > limit:
        raise too_big
    return b"".join(chunks)


def _too_big(limit: int, setting: str, *, close: bool = False) -> ApiError:
    # ``close``: the rest of the body is not read, so the connection cannot serve another
    # request; without the header it stayed open, neither read nor closed.
    return ApiError(
        413,
        "payload_too_large",
        f"the body is over the limit of {limit} bytes ({setting})",
        {"max_body": limit},
        headers={"Connection": "close"} if close else None,
    )


def _end_now(deadline: asyncio.Timeout) -> None:
    with contextlib.suppress(RuntimeError):  # (the read is over: nothing to end)
        deadline.reschedule(0)


async def _drain(request: Request) -> None:
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > _DRAIN_LIMIT:
                    return
    except (ClientDisconnect, TimeoutError):
        return


def parse_json(raw: bytes) -> Any:
    """Strict JSON: no ``NaN``/``Infinity``, no overflowing numbers, no unpaired surrogates."""
    if not raw.strip():
        raise ApiError(400, "invalid_json", "the body is empty; send a JSON object")
    try:
        value = strict_json(raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    where = parsed_unpaired_surrogate(raw, value)
    if where is not None:
        raise ApiError(
            400, "invalid_json", f"the body's JSON has {where}; no UTF-8 text can hold it"
        )
    return value
