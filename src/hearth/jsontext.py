"""JSON as hearth writes, reads and checks it: one compact form for storage and one canonical
form for digests, strict parsing of what comes in, and the text no store can keep (half a
surrogate pair anywhere, NUL in a plain text column) replaced or refused."""

from __future__ import annotations

import json
import math
import re
from typing import Any

JSON = Any  # a value that json.dumps accepts

# ``json.dumps`` with these options builds a new encoder on every call; one of each, kept:
# compact JSON with UTF-8 kept as is, and the same with sorted keys (canonical, for digests).
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
# Half of a UTF-16 surrogate pair, alone: JSON's "\ud83d" escape decodes to one, a model may
# stream one at the end of a chunk, a tool may return one. It has no UTF-8 form, so no store can
# keep it and no HTTP answer can carry it.
_UNPAIRED = re.compile("[\ud800-\udfff]")
# What a plain text column cannot keep in every store: that, and NUL (PostgreSQL's text refuses
# it; inside JSON it is the escape "\u0000", which any store keeps).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Arrays and objects inside each other, at most: deeper, a value that parses could still fail to
# encode where an answer is made (Python's encoder recurses, from deeper in the stack), and one
# stored would make every read of its conversation fail.
MAX_DEPTH = 256


def storable_text(text: str) -> str:
    """``text`` as every store keeps it alike: each unpaired surrogate and each NUL replaced by
    U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def names_something(value: object) -> bool:
    """Whether ``value`` can name something stored: text every store keeps as it is. One with
    a NUL or half a surrogate pair names nothing (PostgreSQL refuses it outright, which reads as
    the database being down)."""
    return isinstance(value, str) and storable_text(value) == value


def compact_json(value: JSON) -> str:
    """The stored JSON form of ``value``: compact, UTF-8 as is (unpaired surrogates replaced)."""
    return _paired(_compact(value))


def canonical_json(value: JSON) -> str:
    """``compact_json`` with sorted keys: the form a digest is taken of."""
    return _paired(_canonical(value))


def holds_unpaired(value: JSON) -> bool:
    """Whether ``compact_json`` would replace an unpaired surrogate somewhere in ``value``."""
    text = _compact(value)
    return not text.isascii() and _UNPAIRED.search(text) is not None


def _paired(text: str) -> str:
    # JSON text never holds a raw NUL (it is escaped), so only the surrogates need replacing.
    return text if text.isascii() else _UNPAIRED.sub("\ufffd", text)


def json_round_trip(value: JSON) -> JSON:
    """``value`` as JSON gives it back (what a replay or a reader sees); ``TypeError`` or
    ``ValueError`` for what has no JSON form, ``NaN`` and the infinities included, and for
    nesting deeper than ``MAX_DEPTH``."""
    text = json.dumps(value, allow_nan=False)
    back = json.loads(text)
    if text.count("[") + text.count("{") > MAX_DEPTH:  # (only then can it be too deep)
        check_depth(back)
    return back


_strict_compact = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def stored_round_trip(value: JSON) -> JSON:
    """``value`` as a store gives it back once kept in ``compact_json``'s form: as
    ``json_round_trip`` gives it, and with each unpaired surrogate replaced by U+FFFD. Raises
    as ``json_round_trip`` does (and ``RecursionError`` for nesting too deep to encode)."""
    if type(value) is str:
        return _paired(value)
    text = _strict_compact(value)
    back = json.loads(_paired(text))
    if text.count("[") + text.count("{") > MAX_DEPTH:
        check_depth(back)
    return back


def check_depth(value: JSON) -> None:
    """``ValueError`` when arrays and objects nest deeper than ``MAX_DEPTH`` in ``value``."""
    if not isinstance(value, dict | list):
        return
    pending: list[tuple[JSON, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > MAX_DEPTH:
            raise ValueError(f"arrays and objects nest deeper than {MAX_DEPTH} levels")
        pending.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def unpaired_surrogate(value: JSON) -> str | None:
    """Where a JSON ``value`` holds a string with an unpaired surrogate (input to refuse, as no
    UTF-8 text can hold it): a short description, or None when it holds none."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and (found := _UNPAIRED.search(item)) is not None:
                return (
                    f"an unpaired surrogate U+{ord(found.group()):04X} at character"
                    f" {found.start()} of {item[:40]!r}"
                )
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def strict_json(raw: str | bytes) -> JSON:
    """``json.loads`` refusing what has no JSON form once parsed (``ValueError``): ``NaN``,
    ``Infinity``, numbers beyond a float's range, and nesting deeper than ``MAX_DEPTH``."""
    value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    if isinstance(raw, bytes):
        opened = raw.count(b"[") + raw.count(b"{")
    else:
        opened = raw.count("[") + raw.count("{")
    if opened > MAX_DEPTH:  # (only then can it be too deep)
        check_depth(value)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parsed_unpaired_surrogate(raw: bytes, value: JSON) -> str | None:
    """``unpaired_surrogate`` for ``value`` parsed from the JSON text ``raw``, looked for only
    when ``raw`` has a surrogate's escape (raw UTF-8 cannot hold one; most bodies have none)."""
    return unpaired_surrogate(value) if _SURROGATE_ESCAPE.search(raw) else None
