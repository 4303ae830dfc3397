"""The syntax of the ids callers choose: conversation ids and idempotency keys."""

from __future__ import annotations

import re

from hearth.errors import InvalidId

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_IDEMPOTENCY_KEY = 256


def check_id(id: str) -> str:
    """``id`` unchanged when it is a valid conversation id, else ``InvalidId``."""
    if not isinstance(id, str) or not ID_RE.fullmatch(id):
        raise InvalidId(
            f"conversation id {id!r} must match {ID_RE.pattern} (1-128 letters, digits, . _ : -)"
        )
    return id
