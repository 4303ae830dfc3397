"""The syntax of the ids and names callers choose: conversation ids, idempotency keys, and the
names of steps, waits and state."""

from __future__ import annotations

import re

from hearth.errors import InvalidId
from hearth.jsontext import storable_text

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_IDEMPOTENCY_KEY = 256
# The idempotency keys hearth gives the submissions of schedules and channels; a caller's may
# not start so (it would take an occurrence's or a delivery's place).
RESERVED_KEY_PREFIXES = ("schedule:", "channel:")
# A step's, a wait's or a piece of state's name is part of a unique index's key (a record id, a
# state row's), and PostgreSQL keeps at most 2,704 bytes in one: 256 characters leave room for
# the rest of the key whatever the script.
MAX_NAME = 256


def id_part(text: str) -> str:
    """``text`` as one part of a record id joined with ``:``, where another part follows: with
    ``%`` and ``:`` percent-encoded, so that no two (``text``, rest) pairs make one id (a call
    ``x`` with step ``y:s`` and a call ``x:y`` with step ``s`` did). Text without either (most
    tool-call ids) is unchanged, as are the ids recorded before this encoding."""
    if ":" not in text and "%" not in text:
        return text
    return text.replace("%", "%25").replace(":", "%3A")


def is_name(name: object) -> bool:
    """Whether ``name`` can name a step, a wait or a piece of state on every store alike: a
    non-empty string of at most ``MAX_NAME`` characters, without NUL or half a surrogate pair."""
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME and storable_text(name) == name


def name_rule(what: str, name: object) -> str:
    """The message refusing ``name`` as a ``what`` name."""
    return (
        f"a {what} name must be a non-empty string of at most {MAX_NAME} characters, without"
        f" NUL or half a surrogate pair, got {_short(name)}"
    )


def _short(value: object) -> str:
    text = repr(value)
    if len(text) <= 80 or not isinstance(value, str):
        return text
    return f"{text[:60]}... ({len(value)} characters)"


def check_id(id: str) -> str:
    """``id`` unchanged when it is a valid conversation id, else ``InvalidId``."""
    if not isinstance(id, str) or not ID_RE.fullmatch(id):
        raise InvalidId(
            f"conversation id {id!r} must match {ID_RE.pattern} (1-128 letters, digits, . _ : -)"
        )
    return id
