"""``serverapp``'s agents in a process that exports its trace spans, one JSON line each, to
``$HEARTH_TEST_SPANS`` (``tracedapp:app``): what a real OTLP exporter would send, kept where a
test can read it after the process is SIGKILLed."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

import serverapp
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import hearth
from hearth.testing import ScriptedModel, call, calls, reply


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock, open(self.path, "a") as out:
            for s in spans:
                ctx = s.get_span_context()
                assert ctx is not None
                out.write(json.dumps(span_json(s)) + "\n")
            out.flush()
            os.fsync(out.fileno())  # the process may be SIGKILLed right after
        return SpanExportResult.SUCCESS


def span_json(s: ReadableSpan) -> dict[str, object]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
        "attributes": dict(s.attributes or {}),
        "status": s.status.status_code.name,
        "pid": os.getpid(),
    }


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["HEARTH_TEST_SPANS"])))
trace.set_tracer_provider(provider)


@hearth.tool
async def note(ctx: hearth.ToolContext, text: str) -> str:
    """Write a note to the log."""
    ctx.log.warning("noting %s", text)
    return "noted"


@hearth.agent
def noter(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/noter")
    ctx.use_tool(note)
    return "Take notes."


NOTER = ScriptedModel("noter", [calls(call("note", text="hello")), reply("noted it")])
app = hearth.App([*serverapp.AGENTS, noter], providers=[*serverapp.MODELS, NOTER])
