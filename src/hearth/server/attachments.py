"""Attachments over HTTP: admission bodies that carry files (JSON with base64 ``attachments``,
or ``multipart/form-data``), ``GET``/``HEAD /attachments/{sha256}``, and ``POST /admin/gc``.

A request that carries attachments may be up to ``HEARTH_MAX_UPLOAD`` bytes; one without stays
under ``HEARTH_MAX_BODY``. Each file is at most ``HEARTH_MAX_ATTACHMENT`` bytes (413 naming it).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import re
from collections.abc import AsyncGenerator
from typing import Any

from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.attachments import MAX_ATTACHMENTS, RASTER_IMAGES, Attachment, safe_name
from hearth.config import Settings
from hearth.server.body import is_json_media_type, parse_json, read_body
from hearth.server.context import ServerContext
from hearth.server.errors import ApiError
from hearth.server.params import flag

_ENTRY_KEYS = frozenset({"name", "media_type", "data"})
# As the OpenAPI description states it (parameters such as ``; charset=`` are not taken here).
MEDIA_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$"
MEDIA_TYPE = re.compile(MEDIA_TYPE_PATTERN)
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
_FORM_FIELDS = frozenset({"message", "idempotency_key"})


class _InMemoryParser(MultiPartParser):
    # The body is already in memory (bounded by HEARTH_MAX_UPLOAD): no temporary files.
    spool_max_size = 1 << 62
    ended = False  # the closing delimiter was read

    async def parse(self) -> FormData:
        # A charset nobody knows would be read as Latin-1 (and stored as mojibake).
        _, params = parse_options_header(self.headers.get("content-type", ""))
        charset = params.get(b"charset")
        if charset is not None:
            try:
                codecs.lookup(charset.decode("latin-1"))
            except LookupError:
                raise MultiPartException(f"unknown charset {charset.decode('latin-1')!r}") from None
        form = await super().parse()
        # A body cut short ends inside a part: what that part held so far would be taken, or the
        # part left out, and the rest admitted as if whole.
        if not self.ended:
            raise MultiPartException(
                "it ends before its closing boundary (--BOUNDARY--): the body was cut short"
            )
        return form

    def on_end(self) -> None:
        self.ended = True
        super().on_end()

    def on_part_end(self) -> None:
        # A text field that is not in its charset (UTF-8 unless the body says otherwise) is
        # refused: the parser would read it as Latin-1, and store mojibake as the message.
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset or "utf-8")
            except (UnicodeDecodeError, LookupError):
                raise MultiPartException(
                    f"the form field {part.field_name!r} is not {self._charset or 'utf-8'} text"
                ) from None
        super().on_part_end()


def is_multipart(request: Request) -> bool:
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    return media == "multipart/form-data"


async def read_admission_body(request: Request, settings: Settings) -> tuple[Any, list[Attachment]]:
    """The admission body as JSON (without its files) and its attachments.

    JSON bodies may reach ``max_upload`` bytes only when their first ``max_body`` bytes show an
    ``attachments`` key; multipart bodies always may. 415 for any other media type."""
    if is_multipart(request):
        raw = await read_body(request, settings.max_upload, "HEARTH_MAX_UPLOAD")
        return await _read_form(request, raw, settings)
    if not is_json_media_type(request.headers.get("content-type")):
        raise ApiError(
            415,
            "unsupported_media_type",
            "send the body as JSON (Content-Type: application/json), or as multipart/form-data"
            " with a message field and file parts",
        )
    too_big = _too_big("the body", settings)
    upload = (settings.max_upload, "HEARTH_MAX_UPLOAD", _shows_attachments)
    raw = await read_body(request, settings.max_body, upload=upload)
    body = parse_json(raw)
    entries = None
    if isinstance(body, dict) and "attachments" in body:
        entries = body.pop("attachments")
        if not isinstance(entries, list):
            raise _bad("attachments must be a list of {name, media_type, data}", "attachments")
    # The files may take the upload limit; the rest of the body (the message) only the body's.
    if len(raw) > settings.max_body and (not entries or _size(body) > settings.max_body):
        raise too_big
    return body, _decode_entries(entries, settings.max_attachment)


# An "attachments" key: only a body whose first HEARTH_MAX_BODY bytes show one may pass that
# limit, so a body without files is never buffered past it.
_ATTACHMENTS_KEY = re.compile(rb'"attachments"\s*:')


def _too_big(what: str, settings: Settings) -> ApiError:
    return ApiError(
        413,
        "payload_too_large",
        f"{what} is over the limit of {settings.max_body} bytes (HEARTH_MAX_BODY)",
        {"max_body": settings.max_body},
    )


def _shows_attachments(head: bytes) -> bool:
    return _ATTACHMENTS_KEY.search(head) is not None


def _size(body: Any) -> int:
    return len(json.dumps(body, ensure_ascii=False).encode())


def _decode_entries(entries: Any, limit: int) -> list[Attachment]:
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise _bad("attachments must be a list of {name, media_type, data}", "attachments")
    if len(entries) > MAX_ATTACHMENTS:
        raise _bad(f"at most {MAX_ATTACHMENTS} attachments per message", "attachments")
    found: list[Attachment] = []
    for i, entry in enumerate(entries):
        field = f"attachments[{i}]"
        if not isinstance(entry, dict):
            raise _bad(f"{field} must be an object {{name, media_type, data}}", field)
        unknown = sorted(set(entry) - _ENTRY_KEYS)
        if unknown:
            raise _bad(f"{field}: unknown field(s): {', '.join(unknown)}", f"{field}.{unknown[0]}")
        name = entry.get("name", "attachment")
        media_type = entry.get("media_type")
        data = entry.get("data")
        if not isinstance(name, str):
            raise _bad(f"{field}.name must be a string", f"{field}.name")
        if "media_type" in entry and not (
            isinstance(media_type, str) and MEDIA_TYPE.match(media_type)
        ):
            raise _bad(
                f"{field}.media_type must be a type/subtype such as image/png (leave it out to"
                " have it sniffed)",
                f"{field}.media_type",
            )
        if not isinstance(data, str):
            raise _bad(f"{field}.data must be the file's bytes in base64", f"{field}.data")
        encoded = data
        # The decoded size, from the text alone (nothing past the limit is decoded): the 413
        # says it, as one for raw bytes does (the SDK's AttachmentTooLarge.size read 0).
        size = len(encoded) // 4 * 3 - encoded[-2:].count("=")
        if size > limit:
            shown = safe_name(name)
            raise ApiError(
                413,
                "attachment_too_large",
                f"the attachment {shown!r} is {size} bytes, over the limit of {limit} bytes"
                " (HEARTH_MAX_ATTACHMENT)",
                {"name": shown, "size": size, "limit": limit},
            )
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"{field}.data is not valid base64", f"{field}.data") from None
        found.append(Attachment(raw, name, media_type))
    return found


async def _read_form(
    request: Request, raw: bytes, settings: Settings
) -> tuple[dict[str, Any], list[Attachment]]:
    async def chunks() -> AsyncGenerator[bytes, None]:
        yield raw

    parser = _InMemoryParser(
        request.headers,
        chunks(),
        max_files=MAX_ATTACHMENTS,
        max_fields=len(_FORM_FIELDS) + 1,
        max_part_size=len(raw),  # (the limits below are HEARTH_MAX_BODY's, with its 413)
    )
    try:
        form = await parser.parse()
    except (MultiPartException, ValueError) as exc:
        raise _bad(f"the multipart body cannot be read: {exc}") from None
    body: dict[str, Any] = {}
    files: list[Attachment] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            data = await value.read()
            media_type = value.content_type
            files.append(Attachment(data, value.filename or name or "attachment", media_type))
            continue
        if name not in _FORM_FIELDS:
            raise _bad(f"unknown form field {name!r}: send message, idempotency_key and files",
                       name)  # fmt: skip
        if name in body:
            raise _bad(f"give the {name} field once", name)
        body[name] = value
    if "message" not in body and not files:
        raise _bad("a multipart body needs a message field or a file", "message")
    # As for JSON: a request without files stays under the body's limit, and the message of one
    # with files too.
    if not files and len(raw) > settings.max_body:
        raise _too_big("the body", settings)
    if _size(body) > settings.max_body:
        raise _too_big("the message (the form's fields)", settings)
    return body, files


# --- GET / HEAD /attachments/{sha256} --------------------------------------------------------
async def get_attachment(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    sha256 = request.path_params["sha256"]
    head = request.method == "HEAD"
    blob = await rt.attachment(sha256, with_data=not head)
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "ETag": f'"{blob.sha256}"',
        "Cache-Control": "private, max-age=31536000, immutable",
    }
    if blob.media_type not in RASTER_IMAGES:
        headers["Content-Disposition"] = "attachment"
    if head:
        headers["Content-Length"] = str(blob.size)
        return Response(None, media_type=blob.media_type, headers=headers)
    return Response(blob.data, media_type=blob.media_type, headers=headers)


# --- POST /admin/gc --------------------------------------------------------------------------
async def admin_gc(server: ServerContext, request: Request) -> Response:
    """Delete the attachments nothing references; ``?dry_run=1`` only lists them."""
    rt = await server.runtime()
    dry_run = flag(request, "dry_run")
    freed = await rt.collect_attachments(dry_run=dry_run)
    return JSONResponse(
        {
            "dry_run": dry_run,
            "deleted": [b.to_json() for b in freed],
            "count": len(freed),
            "bytes": sum(b.size for b in freed),
        }
    )


def _bad(message: str, field: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request", message, {"field": field} if field else None)
