"""Attachments: files that come with a message, stored once by the SHA-256 of their bytes.

``Attachment`` is the value an application hands to ``rt.dispatch`` or ``conv.send``. Records
never hold the bytes: a ``user_message`` carries a *part* per file — ``{"type": "attachment",
"sha256", "name", "media_type", "size"}`` — and the bytes live in the store's attachment table.

The media type is the declared one when there is one; else it is sniffed from the bytes
(``filetype``, magic numbers), else guessed from the name (``mimetypes``), else ``text/plain``
for bytes that decode as UTF-8, else ``application/octet-stream``. A name is only a label: it
is sanitised (no ``/``, ``\\``, ``..`` or control characters) and never used as a path.

Example::

    receipt = await rt.dispatch("support", "c-1", "What is on this invoice?",
                                attachments=[hearth.Attachment.from_path("invoice.pdf")])
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import filetype  # type: ignore[import-untyped]

from hearth.errors import InvalidInput

MAX_ATTACHMENT = 20 * 1024 * 1024  # bytes per file (HEARTH_MAX_ATTACHMENT)
MAX_UPLOAD = 64 * 1024 * 1024  # bytes per request that carries attachments (HEARTH_MAX_UPLOAD)
MAX_ATTACHMENTS = 32  # files per message
MAX_NAME = 255
OCTET_STREAM = "application/octet-stream"
# Served inline by GET /attachments/{sha256}; everything else is a download.
RASTER_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
PART_TYPE = "attachment"

_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/javascript",
        "application/sql",
    }
)


@dataclass(frozen=True)
class Attachment:
    """A file to send with a message: its bytes, a name (a label, never a path) and a media type
    (sniffed when not given)."""

    data: bytes
    name: str = "attachment"
    media_type: str | None = None

    @classmethod
    def from_path(cls, path: str | PathLike[str], media_type: str | None = None) -> Attachment:
        """The file's bytes, named after its last path component."""
        p = Path(path)
        return cls(p.read_bytes(), p.name, media_type)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class Checked:
    """An attachment accepted for admission: its part (what records hold) and its bytes."""

    part: dict[str, Any]
    data: bytes

    @property
    def sha256(self) -> str:
        return str(self.part["sha256"])

    @property
    def media_type(self) -> str:
        return str(self.part["media_type"])


def check(att: Attachment, index: int, limit: int) -> Checked:
    """``att`` ready to store: non-empty, within ``limit`` bytes, with a safe name and a media
    type. ``InvalidInput`` (or ``AttachmentTooLarge``) naming the file otherwise."""
    from hearth.errors import AttachmentTooLarge

    field = f"attachments[{index}]"
    if not isinstance(att, Attachment):
        raise InvalidInput(f"{field} must be a hearth.Attachment", field)
    if not isinstance(att.data, bytes | bytearray | memoryview):
        raise InvalidInput(f"{field}: data must be bytes", f"{field}.data")
    data = bytes(att.data)
    name = safe_name(att.name if isinstance(att.name, str) else "")
    if not data:
        raise InvalidInput(f"{field} ({name}) is an empty file", field)
    if len(data) > limit:
        raise AttachmentTooLarge(
            f"the attachment {name!r} is {len(data)} bytes, over the limit of {limit} bytes"
            " (HEARTH_MAX_ATTACHMENT)",
            name,
            len(data),
            limit,
        )
    media_type = media_type_of(data, name, att.media_type, field=f"{field}.media_type")
    part = {
        "type": PART_TYPE,
        "sha256": hashlib.sha256(data).hexdigest(),
        "name": name,
        "media_type": media_type,
        "size": len(data),
    }
    return Checked(part, data)


def media_type_of(data: bytes, name: str, declared: str | None, *, field: str = "") -> str:
    """The declared media type (lower case, parameters dropped), else one sniffed from the bytes
    or guessed from the name; ``InvalidInput`` for a declared one that is not ``type/subtype``."""
    if declared is not None and not isinstance(declared, str):
        raise InvalidInput("media_type must be a string like image/png", field or None)
    given = (declared or "").split(";", 1)[0].strip().lower()
    if given and not _MEDIA_TYPE.match(given):
        raise InvalidInput(f"media_type {declared!r} is not a type/subtype", field or None)
    if given and given != OCTET_STREAM:
        return given
    sniffed = filetype.guess_mime(data[:8192])
    if isinstance(sniffed, str) and _MEDIA_TYPE.match(sniffed):
        return sniffed
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed:
        return guessed.lower()
    try:
        text = data[:65536].decode("utf-8")
    except UnicodeDecodeError as exc:
        text = "" if exc.start < 65532 else data[: exc.start].decode("utf-8")
        if not text:
            return OCTET_STREAM
    return "text/plain" if "\x00" not in text else OCTET_STREAM


def safe_name(name: str) -> str:
    """A file name that is only a label: separators and ``..`` become ``_``, control and
    format characters go, half a surrogate pair (a byte of a name that is not UTF-8, as Python
    reads one from the disk) becomes U+FFFD, at most 255 characters; ``attachment`` when
    nothing is left."""
    kept = "".join(
        "_" if ch in "/\\" else "\ufffd" if unicodedata.category(ch) == "Cs" else ch
        for ch in name
        if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp")
    )
    while ".." in kept:
        kept = kept.replace("..", "_")
    kept = kept.strip().lstrip(".")
    return kept[:MAX_NAME] or "attachment"


def is_sha256(text: str) -> bool:
    """64 lower-case hex digits."""
    return bool(_SHA256.match(text))


def is_text(media_type: str) -> bool:
    """Whether a model reads this type as text (``text/*``, JSON, CSV, XML, logs, ...)."""
    return (
        media_type.startswith("text/")
        or media_type in _TEXT_TYPES
        or media_type.endswith(("+json", "+xml"))
    )


def is_image(media_type: str) -> bool:
    return media_type in RASTER_IMAGES


def is_part(value: Any) -> bool:
    """Whether ``value`` is an attachment part of a message's content."""
    return isinstance(value, dict) and value.get("type") == PART_TYPE and "sha256" in value


def parts_of(content: Any) -> Iterator[dict[str, Any]]:
    """The attachment parts of a message's content (a string has none)."""
    if isinstance(content, list):
        yield from (p for p in content if is_part(p))


def message_content(text: str, parts: list[dict[str, Any]]) -> Any:
    """A ``user_message``'s content: the text alone, or the text part (when there is text)
    followed by the attachment parts."""
    if not parts:
        return text
    head: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return head + parts


def describe(part: dict[str, Any]) -> str:
    """A short note naming an attachment, for a model that cannot read its bytes."""
    return (
        f"[attachment {part.get('name')!s} ({part.get('media_type')}, {part.get('size')} bytes,"
        f" sha256 {str(part.get('sha256'))[:12]}…): not shown to this model]"
    )


class ConversationAttachments:
    """The attachments a tool can read: ``ctx.attachments`` in a ``hearth.ToolContext``.

    ``parts`` are the conversation's attachment parts as its records hold them (oldest first);
    ``read`` fetches a file's bytes from the store by SHA-256 or by name (the latest file sent
    under that name)::

        @hearth.tool
        async def count_lines(name: str, ctx: hearth.ToolContext) -> int:
            return (await ctx.attachments.read(name)).data.count(b"\\n")
    """

    def __init__(
        self, parts: list[dict[str, Any]], load: Callable[[str], Awaitable[bytes | None]]
    ) -> None:
        self.parts = parts
        self._load = load

    def find(self, key: str) -> dict[str, Any] | None:
        """The part with that SHA-256, else the latest part with that name, else None."""
        for key_field in ("sha256", "name"):
            found: list[dict[str, Any]] = [p for p in self.parts if p.get(key_field) == key]
            if found:
                return found[-1]
        return None

    async def read(self, key: str) -> Attachment:
        """The file (bytes, name, media type) by SHA-256 or name; ``AttachmentNotFound`` when
        the conversation has none such."""
        from hearth.errors import AttachmentNotFound

        part = self.find(key)
        data = None if part is None else await self._load(str(part["sha256"]))
        if part is None or data is None:
            raise AttachmentNotFound(f"this conversation has no attachment {key!r}")
        return Attachment(data, str(part.get("name")), str(part.get("media_type")))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)
