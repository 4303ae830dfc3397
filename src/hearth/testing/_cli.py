"""Argument types of the test tools' commands (``enumerate``, ``soak``): each turns a bad value
into ``argparse.ArgumentTypeError``, so argparse ends with one line naming the option, before any
work starts."""

from __future__ import annotations

import argparse

from hearth.config import postgres_conninfo, shown_db
from hearth.testing.points import check_crash_at


def count_from_1(text: str) -> int:
    """A whole number ≥ 1, in plain ASCII decimal (as ``#N`` of a kill point is read)."""
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, not {text!r}")
    return int(text)


def crash_point(text: str) -> str:
    """A kill point as ``HEARTH_CRASH_AT`` takes it (``name``, ``name#N``, ``a>b#N``), checked as
    ``CrashHarness`` checks it."""
    try:
        return check_crash_at(text)
    except ValueError as exc:  # its message opens with the harness's argument name
        raise argparse.ArgumentTypeError(str(exc).removeprefix("crash_at ")) from None


def postgres_url(text: str) -> str:
    """A PostgreSQL URL (``postgresql://…`` or ``postgres://…``) libpq can read; messages show
    it with any password masked."""
    scheme, sep, _ = text.strip().partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        raise argparse.ArgumentTypeError(
            f"{shown_db(text)!r} is not a PostgreSQL URL (postgresql://… or postgres://…)"
        )
    try:
        postgres_conninfo(text)
    except ValueError as exc:  # its message holds no password
        raise argparse.ArgumentTypeError(f"bad PostgreSQL URL {shown_db(text)}: {exc}") from None
    return text
