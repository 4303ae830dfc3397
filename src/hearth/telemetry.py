"""Tracing with OpenTelemetry: one trace per submission, whichever process runs its attempts.

hearth depends only on ``opentelemetry-api``. Without an SDK configured every span is a no-op;
install ``opentelemetry-sdk`` and an exporter and set a tracer provider to see them (see
docs/telemetry.md). The spans, parent to child::

    hearth.submission   admission (its parent: the caller's W3C ``traceparent``, if any)
      hearth.attempt    one claim of the submission, in whichever process claimed it
        hearth.turn     a model call and the tool calls of its answer
          hearth.model_call
          hearth.tool_call
            hearth.step a ``ctx.step.do`` checkpoint of a durable tool

The admission span's context is stored with the submission as a ``traceparent`` string, so an
attempt after a crash, in another process, continues the same trace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hearth._version import __version__

_W3C = TraceContextTextMapPropagator()
# version-traceid-spanid-flags, lowercase hex (W3C Trace Context, level 1)
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

__all__ = [
    "Span",
    "SpanKind",
    "context_of",
    "current_traceparent",
    "mark_error",
    "parse_traceparent",
    "recording",
    "span",
    "start",
    "tracer",
    "use",
]


def tracer() -> trace.Tracer:
    """hearth's tracer from the global tracer provider (a no-op until one is set)."""
    return trace.get_tracer("hearth", __version__)


def recording() -> bool:
    """Whether a tracer provider is set. Until one is, every span is a no-op, so a hot path may
    skip making one."""
    # ``get_tracer_provider`` looks at os.environ on every call while none is set, which costs
    # more than the rest of a span; the global it fills is read directly when it exists and no
    # provider is named in the environment (then the public call is the only way).
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) if not _NAMED_IN_ENV else _UNKNOWN
    if provider is None:
        return False
    if provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


_UNKNOWN = object()
_NAMED_IN_ENV = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))


def parse_traceparent(value: str | None) -> str | None:
    """``value`` when it is a well-formed W3C ``traceparent`` with a valid trace and span id,
    else None (a malformed header is ignored, as the W3C spec asks)."""
    if not value or len(value) > 55 or not _TRACEPARENT.fullmatch(value.strip().lower()):
        return None
    text = value.strip().lower()
    ctx = trace.get_current_span(_W3C.extract({"traceparent": text})).get_span_context()
    return text if ctx.is_valid else None


def context_of(traceparent: str | None) -> Context | None:
    """The context to start a child span in: the stored ``traceparent``'s, or None (then the
    span starts in the current context)."""
    if parse_traceparent(traceparent) is None:
        return None
    return _W3C.extract({"traceparent": str(traceparent)})


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span, or None when there is no valid one."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def span(
    name: str,
    *,
    parent: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, str | int | float | bool] | None = None,
) -> Iterator[Span]:
    """A current span around the block; an exception leaving it marks the span an error
    (cancellation too: an attempt stopped by a crash test or a shutdown says so)."""
    if parent is None and not recording():
        # Nothing records: a new span would only carry the current span's context again. (Not
        # the current span itself: it may be a caller's, recording through its own provider.)
        yield _stand_in()
        return
    with tracer().start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            mark_error(current, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise


def start(name: str, attributes: dict[str, str | int | float | bool] | None = None) -> Span:
    """A span in the current context that the caller ends (for spans wider than one block)."""
    if not recording():
        return _stand_in()  # as in ``span``: a no-op span would add nothing
    return tracer().start_span(name, attributes=attributes)


def _stand_in() -> Span:
    """A non-recording span with the current span's context: what the no-op tracer would make,
    without attaching it to the context."""
    return trace.NonRecordingSpan(trace.get_current_span().get_span_context())


def use(current: Span) -> AbstractContextManager[Span]:
    """Make ``current`` the current span inside the block, without ending it."""
    if not current.is_recording() and (
        current.get_span_context() == trace.get_current_span().get_span_context()
    ):
        return nullcontext(current)  # a stand-in for the current span: nothing to attach
    return trace.use_span(current, end_on_exit=False)


def mark_error(current: Span, description: str) -> None:
    current.set_status(Status(StatusCode.ERROR, description[:200]))
