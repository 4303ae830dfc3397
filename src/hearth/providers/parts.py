"""A user turn's parts as a model can take them: text, images and documents, provider-neutral.

The runtime hands a provider a user turn whose attachments carry their bytes (``FilePart``).
``user_blocks`` decides, per model, what each becomes: an image for a model that takes images,
a PDF document where the provider takes documents, text files inline (truncated past the
model's limit, with a note), and anything else a short note naming the file. An attachment
part without bytes (a compaction request, say) is always the note: records and summaries keep
references, never bytes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from hearth.attachments import describe, is_image, is_part, is_text


@dataclass(frozen=True)
class FilePart:
    """An attachment of a user turn with its bytes, as the runtime read them from the store."""

    sha256: str
    name: str
    media_type: str
    size: int
    data: bytes

    def reference(self) -> dict[str, Any]:
        return {
            "type": "attachment",
            "sha256": self.sha256,
            "name": self.name,
            "media_type": self.media_type,
            "size": self.size,
        }


@dataclass(frozen=True)
class FileRules:
    """What one model takes: images, PDF documents, and how many characters of a text file."""

    images: bool = False
    documents: bool = False
    text_limit: int = 32_000


@dataclass(frozen=True)
class TextBlock:
    text: str


@dataclass(frozen=True)
class BinaryBlock:
    """An image or a document, base64-encoded for the wire."""

    kind: str  # "image" | "document"
    media_type: str
    data: str  # base64

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.data}"


Block = TextBlock | BinaryBlock


def user_blocks(content: Any, rules: FileRules) -> list[Block]:
    """The blocks of a user turn's content for a model under ``rules``."""
    if isinstance(content, str):
        return [TextBlock(content)] if content else []
    if not isinstance(content, list):
        return [TextBlock(json.dumps(content, default=str))]
    blocks: list[Block] = []
    for part in content:
        if isinstance(part, FilePart):
            blocks.append(_file_block(part, rules))
        elif is_part(part):
            blocks.append(TextBlock(describe(part)))
        elif isinstance(part, dict) and part.get("type") == "text":
            blocks.append(TextBlock(str(part.get("text", ""))))
        elif isinstance(part, str):
            blocks.append(TextBlock(part))
        else:
            blocks.append(TextBlock(json.dumps(part, default=str)))
    return blocks


def _file_block(part: FilePart, rules: FileRules) -> Block:
    if is_image(part.media_type) and rules.images:
        return BinaryBlock("image", part.media_type, _b64(part.data))
    if part.media_type == "application/pdf" and rules.documents:
        return BinaryBlock("document", part.media_type, _b64(part.data))
    if is_text(part.media_type):
        return TextBlock(inline_text(part, rules.text_limit))
    return TextBlock(describe(part.reference()))


def inline_text(part: FilePart, limit: int) -> str:
    """A text file as the model reads it: a header naming it, then its text, cut at ``limit``
    characters with a note saying how much was left out."""
    text = part.data.decode("utf-8", errors="replace")
    header = f"[attachment {part.name} ({part.media_type}, {part.size} bytes)]"
    if len(text) <= limit:
        return f"{header}\n{text}"
    return (
        f"{header}\n{text[:limit]}\n[… truncated: the first {limit} of {len(text)} characters"
        " are shown]"
    )


def estimate_chars(part: Any) -> int:
    """About how many characters a part costs in a request (images at a fixed rate)."""
    if isinstance(part, FilePart):
        if is_text(part.media_type):
            return part.size
        return 6000 if is_image(part.media_type) else 200
    if is_part(part):  # a reference not yet paired with its bytes: estimated as it will be sent
        media_type, size = str(part.get("media_type", "")), int(part.get("size") or 0)
        if is_text(media_type):
            return size
        return 6000 if is_image(media_type) else 200
    if isinstance(part, dict):
        return len(str(part.get("text", ""))) if part.get("type") == "text" else 200
    return len(str(part))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
