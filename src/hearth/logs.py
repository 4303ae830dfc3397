"""Log lines that say which conversation and submission they are about.

While an attempt runs (and while a request is admitted), ``ids(...)`` puts the conversation and
submission ids in a context variable; every record logged meanwhile carries them. With
``HEARTH_LOG_FORMAT=json`` (``hearth serve --log-format json``) each line is one JSON object::

    {"ts": "2026-01-02T03:04:05.678Z", "level": "warning", "logger": "hearth.coordinator",
     "message": "...", "conversation_id": "support/c-1", "submission_id": "s_..."}
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

_NONE: tuple[tuple[str, str], ...] = ()
_IDS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "hearth_log_ids", default=_NONE
)
# Attributes that LoggerAdapters of hearth put on records; copied into the JSON line when set.
_EXTRA = ("conversation_id", "submission_id", "tool", "tool_call_id", "child")


@contextmanager
def ids(**given: str | None) -> Iterator[None]:
    """Log records made inside the block carry these ids (None values are left out)."""
    merged = {**dict(_IDS.get()), **{k: v for k, v in given.items() if v is not None}}
    token = _IDS.set(tuple(merged.items()))
    try:
        yield
    finally:
        _IDS.reset(token)


def current_ids() -> dict[str, str]:
    return dict(_IDS.get())


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, with the ids known where it was logged."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(dict(_IDS.get()))
        for name in _EXTRA:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class Redact(logging.Filter):
    """Replaces secrets in a record's message (a token a client put in a URL, say, on its way
    into the access log) before any handler writes it.

    A secret is found as written and as a URL writes it (any of its characters percent-encoded,
    in either case of hex, a space as ``+``). The record keeps its shape: the secret is
    replaced inside its message and its arguments, since a formatter may read the arguments
    themselves (uvicorn's access log unpacks them)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s and len(s) >= 4]
        alternatives = "|".join(_spellings(s) for s in sorted(self.secrets, key=len, reverse=True))
        self._pattern = re.compile(alternatives) if alternatives else None

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is None or not self._pattern.search(_message(record)):
            return True
        if isinstance(record.msg, str):
            record.msg = self._clean(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(self._clean_arg(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: self._clean_arg(v) for k, v in record.args.items()}
        message = _message(record)
        if self._pattern.search(message):  # (put together, the pieces spelled a secret)
            record.msg, record.args = self._clean(message), ()
        return True

    def _clean(self, text: str) -> str:
        assert self._pattern is not None
        return self._pattern.sub("[redacted]", text)

    def _clean_arg(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._clean(value)
        if isinstance(value, int | float | bytes | type(None)):
            return value  # (formatted with %d and the like: kept as is)
        text = str(value)
        clean = self._clean(text)
        return value if clean == text else clean


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a record whose arguments do not fit: its message as written
        return str(record.msg)


def _spellings(secret: str) -> str:
    """A pattern of ``secret`` as written or percent-encoded, character by character."""
    parts = []
    for char in secret:
        encoded = "".join(
            "%" + "".join(f"[{d.upper()}{d.lower()}]" if d.isalpha() else d for d in f"{b:02x}")
            for b in char.encode()
        )
        also = "|\\+" if char == " " else ""
        parts.append(f"(?:{re.escape(char)}|{encoded}{also})")
    return "".join(parts)


def redact(*secrets: str | None) -> None:
    """Install ``Redact`` for these secrets on every handler there is now (hearth's, uvicorn's,
    the root logger's, Python's last-resort one)."""
    keep = [s for s in secrets if s]
    if not keep:
        return
    handlers = {logging.lastResort} if logging.lastResort is not None else set()
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            handlers.update(logger.handlers)
    for handler in handlers:
        if handler is None:
            continue
        for old in [f for f in handler.filters if isinstance(f, Redact)]:
            handler.removeFilter(old)
        handler.addFilter(Redact(keep))


TRACE = 5  # uvicorn's level below DEBUG


class _UnlessRootPrints(logging.StreamHandler):  # type: ignore[type-arg]
    """hearth's text lines on stderr, unless the root logger has handlers of its own (an
    application that called ``logging.basicConfig``): hearth's lines reach those too, and
    were printed twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        super().emit(record)


def _writes_to_console(handler: logging.Handler) -> bool:
    return (
        isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
        and handler.stream in (sys.stderr, sys.stdout)
    )


def configure(log_format: str, level: str = "warning") -> dict[str, Any] | None:
    """Send hearth's log lines (and every other library's) to stderr in ``log_format``.

    Returns the logging config to give uvicorn for its own loggers in that format (None for
    text: uvicorn keeps its own).
    """
    number = TRACE if level.lower() == "trace" else logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    if log_format != "json":
        # hearth's own lines, at that level, with their level and logger (without a handler,
        # Python's last resort printed warnings alone, as bare messages, whatever the level).
        # So are those of psycopg's pool (a connection discarded, one that failed to open).
        text = _UnlessRootPrints(sys.stderr)
        text.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        text._hearth_text = True  # type: ignore[attr-defined]
        for name in ("hearth", "psycopg"):
            logger = logging.getLogger(name)
            for old in [h for h in logger.handlers if getattr(h, "_hearth_text", False)]:
                logger.removeHandler(old)
            logger.addHandler(text)
        logging.getLogger("hearth").setLevel(number)
        return None
    for old in [h for h in root.handlers if getattr(h, "_hearth_json", False)]:
        root.removeHandler(old)
    # An application that called ``logging.basicConfig`` has a handler on stderr already:
    # that one writes JSON now (with one of hearth's beside it, each line came out twice, once
    # in the application's format). Its handlers to files keep their format.
    consoles = [h for h in root.handlers if _writes_to_console(h)]
    for console in consoles:
        console.setFormatter(JsonFormatter())
    if not consoles:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._hearth_json = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(number)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "json": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": number, "propagate": False},
            "uvicorn.error": {"level": number},
            "uvicorn.access": {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
    }
