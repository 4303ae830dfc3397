"""What a signal is, wherever one enters (``dispatch``, HTTP, a channel, a schedule): an object
``{"type", "body", "attributes"}`` with a non-empty string type, a string body and attributes
that are a JSON object."""

from __future__ import annotations

from typing import Any

from hearth.jsontext import json_round_trip


class BadSignal(ValueError):
    """Why a signal was refused, and the field that was wrong (``signal.type`` …): each caller
    words the refusal its own way (``InvalidInput`` at admission, ``ConfigurationError`` for a
    schedule)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field
        self.why = why


_FIELDS = frozenset({"type", "body", "attributes"})


def checked_signal(signal: Any) -> dict[str, Any]:
    """``signal`` as it is stored: its type, its body (``""`` by default) and its attributes
    (``{}`` by default) as JSON gives them back. ``BadSignal`` otherwise: another key (a
    misspelt ``atributes`` was dropped, and the attributes stored empty; HTTP refused it), and
    NaN and the infinities, which have no JSON form and stored would spoil every read of the
    stream."""
    if not isinstance(signal, dict):
        raise BadSignal("signal", "signal must be an object with a non-empty string 'type'")
    unknown = sorted(str(key) for key in set(signal) - _FIELDS)
    if unknown:
        raise BadSignal("signal", f"unknown signal field(s): {', '.join(unknown)}")
    kind = signal.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadSignal("signal.type", "signal must be an object with a non-empty string 'type'")
    body = signal.get("body", "")
    if not isinstance(body, str):
        raise BadSignal("signal.body", "signal.body must be a string")
    attributes = signal.get("attributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise BadSignal("signal.attributes", "signal.attributes must be an object")
    try:
        attributes = json_round_trip(attributes or {})
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadSignal("signal.attributes", f"signal.attributes must be JSON: {exc}") from None
    return {"type": kind, "body": body, "attributes": attributes}
