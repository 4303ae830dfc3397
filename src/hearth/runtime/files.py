"""The files of a model request: the attachment parts of its user turns, read from the store.

Records hold references only; right before a model call (also the first one after a crash) each
attachment part of the rebuilt context is paired with its bytes, so the provider can send an image
or a document. A file the store no longer has stays a reference, which the model sees as a note.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from hearth.attachments import is_part
from hearth.providers.base import Message, UserTurn
from hearth.providers.parts import FilePart


async def with_files(
    load: Callable[[str], Awaitable[bytes | None]], messages: Sequence[Message]
) -> tuple[Message, ...]:
    """``messages`` with every attachment part of a user turn carrying its bytes (``load``
    gives them by SHA-256, None when the store no longer has them)."""
    out: list[Message] = []
    for message in messages:
        if not (isinstance(message, UserTurn) and isinstance(message.content, list)):
            out.append(message)
            continue
        if not any(is_part(p) for p in message.content):
            out.append(message)
            continue
        parts: list[object] = []
        for part in message.content:
            if not is_part(part):
                parts.append(part)
                continue
            sha256 = str(part["sha256"])
            data = await load(sha256)
            if data is None:
                parts.append(part)
                continue
            parts.append(
                FilePart(
                    sha256=sha256,
                    name=str(part.get("name", "attachment")),
                    media_type=str(part.get("media_type", "application/octet-stream")),
                    size=len(data),
                    data=data,
                )
            )
        out.append(UserTurn(parts))
    return tuple(out)
