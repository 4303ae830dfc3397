"""Query parameters: one value each, and integers and flags read strictly."""

from __future__ import annotations

import re

from starlette.requests import Request

from hearth.jsontext import names_something
from hearth.server.errors import ApiError

_INTEGER = re.compile("-?[0-9]{1,20}")
# A decimal number in plain ASCII (an exponent allowed: a client may format 0.00001 as 1e-05).
_NUMBER = re.compile(r"(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][-+]?[0-9]{1,3})?")
FLAGS = {"0": False, "1": True, "false": False, "true": True}


def query(request: Request, name: str) -> str | None:
    """The one value of a query parameter, or None when absent; given twice is a 400 (which
    one would count?)."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ApiError(400, "invalid_request", f"give {name} once", {"field": name})
    return values[0] if values else None


def storable(value: str) -> bool:
    """Whether ``value`` can name something stored (``jsontext.names_something``)."""
    return names_something(value)


def int_param(raw: str | None, name: str, *, default: int, low: int, high: int) -> int:
    """``raw`` as an integer from ``low`` to ``high``, ``default`` when absent, else a 400."""
    if raw is None:
        return default
    # Plain ASCII digits only: ``int()`` also reads "1_0", "+5", " 7 " and other scripts' digits.
    if not _INTEGER.fullmatch(raw):
        raise ApiError(400, "invalid_request", f"{name} must be an integer", {"field": name})
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(
            400, "invalid_request", f"{name} must be between {low} and {high}", {"field": name}
        )
    return value


def number_param(raw: str, name: str, *, high: float, of: str = "") -> float:
    """``raw`` as a number from 0 to ``high``, else a 400. Plain ASCII only, as for integers:
    ``float()`` also reads "1_0", "+1", " 1 ", "nan" and other scripts' digits."""
    value = float(raw) if _NUMBER.fullmatch(raw) else -1.0
    if not 0 <= value <= high:
        raise ApiError(
            400,
            "invalid_request",
            f"{name} must be a number{of} from 0 to {high:g}",
            {"field": name},
        )
    return value


def flag(request: Request, name: str) -> bool:
    """A yes/no query parameter: absent is no; ``0``, ``1``, ``false``, ``true``, else a 400."""
    raw = query(request, name)
    if raw is None:
        return False
    if raw not in FLAGS:
        raise ApiError(
            400, "invalid_request", f"{name} must be one of 0, 1, true, false", {"field": name}
        )
    return FLAGS[raw]
