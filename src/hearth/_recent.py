"""A bounded memory of the most recently noted keys."""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")


def keep_recent(kept: dict[str, V], key: str, value: V, limit: int) -> None:
    """Note ``key``'s newest ``value`` in ``kept``, forgetting the least recently noted key
    once more than ``limit`` are kept (a dict keeps insertion order)."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > limit:
        del kept[next(iter(kept))]
