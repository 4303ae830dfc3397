"""Telemetry: /metrics read by Prometheus' own parser, trace spans from admission to step (also
across a SIGKILL and a recovery in another process), and JSON log lines with their ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpharness import ServerProcess, ThreadServer, make_app, wait_until
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

# The only label values /metrics may carry: each from a short fixed list, never an id.
BOUNDED_LABELS = {"outcome": {"completed", "failed", "aborted"}, "le": None}


# --- /metrics --------------------------------------------------------------------------------


def settle(http: httpx2.Client, agent: str, id: str, message: str = "hi") -> dict[str, Any]:
    receipt = http.post(f"/agents/{agent}/{id}", json={"message": message}).json()
    done = http.get(f"/agents/{agent}/{id}/submissions/{receipt['submission_id']}?wait=30")
    body: dict[str, Any] = done.json()
    assert body["status"] == "settled", body
    return body


def unbounded_labels(text: str) -> list[Sample]:
    """Samples whose labels are not in ``BOUNDED_LABELS`` (an id as a label, say)."""
    bad = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                allowed = BOUNDED_LABELS.get(name, set())
                if allowed is not None and value not in allowed:
                    bad.append(sample)
    return bad


def test_metrics_parse_as_prometheus_text_with_the_counters_and_histograms(
    server: ThreadServer,
) -> None:
    with server.client() as http:
        settle(http, "echo", "m-1")
        settle(http, "worker", "m-2")  # a durable tool with two steps
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hearth_submissions_admitted"].type == "counter"
    assert families["hearth_submissions_admitted"].samples[0].value == 2
    assert families["hearth_submissions_running"].type == "gauge"
    settled = {s.labels["outcome"]: s.value for s in families["hearth_submissions_settled"].samples}
    assert settled == {"completed": 2, "failed": 0, "aborted": 0}
    assert families["hearth_recoveries"].type == "counter"
    # Every family says what it counts (the streams gauge had no HELP line).
    assert [name for name, f in families.items() if not f.documentation] == []
    assert families["hearth_sse_streams"].type == "gauge"
    for name, at_least in [
        ("hearth_append_seconds", 4),
        ("hearth_step_seconds", 2),
        ("hearth_attempt_seconds", 2),
        ("hearth_model_call_seconds", 3),
    ]:
        family = families[name]
        assert family.type == "histogram"
        count = next(s.value for s in family.samples if s.name == f"{name}_count")
        inf = next(s.value for s in family.samples if s.labels.get("le") == "+Inf")
        assert count == inf >= at_least, name
    assert "m-1" not in text and "m-2" not in text
    assert unbounded_labels(text) == []


def test_the_label_check_catches_an_id_used_as_a_label() -> None:
    planted = (
        "# TYPE hearth_submissions_settled_total counter\n"
        'hearth_submissions_settled_total{outcome="completed"} 1\n'
        'hearth_submissions_settled_total{outcome="completed",conversation="echo/c-1"} 1\n'
        'hearth_submissions_settled_total{outcome="s_123"} 1\n'
    )
    assert len(unbounded_labels(planted)) == 2


# --- traces ----------------------------------------------------------------------------------


class _Switch(SpanProcessor):
    """Hands ended spans to the exporter only while a test of this module listens."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)


_EXPORTER = InMemorySpanExporter()
_SWITCH = _Switch(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SWITCH)
        trace.set_tracer_provider(provider)
    elif _SWITCH not in current._active_span_processor._span_processors:
        pytest.skip("another SDK tracer provider is installed in this process")
    _EXPORTER.clear()
    _SWITCH.on = True
    yield _EXPORTER
    _SWITCH.on = False
    _EXPORTER.clear()


def _hex(value: int) -> str:
    return f"{value:016x}"


def test_spans_run_from_the_admission_through_turns_to_steps(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    server = ThreadServer(make_app(tmp_path / "h.db")).start()
    try:
        with server.client() as http:
            r = http.post(
                "/agents/worker/t-1", json={"message": "go"}, headers={"traceparent": TRACEPARENT}
            )
            sid = r.json()["submission_id"]
            assert http.get(f"/agents/worker/t-1/submissions/{sid}?wait=30").json()["reply"]
    finally:
        server.stop()
    finished = spans.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in finished} == {TRACE_ID}
    by_id = {s.context.span_id: s for s in finished}

    def parent(s: ReadableSpan) -> ReadableSpan:
        assert s.parent is not None
        return by_id[s.parent.span_id]

    [admission] = [s for s in finished if s.name == "hearth.submission"]
    assert admission.parent is not None and _hex(admission.parent.span_id) == PARENT_ID
    assert admission.attributes["hearth.submission_id"] == sid
    [attempt] = [s for s in finished if s.name == "hearth.attempt"]
    assert parent(attempt) is admission and attempt.attributes["hearth.attempt"] == 1
    turns = [s for s in finished if s.name == "hearth.turn"]
    assert len(turns) == 2 and all(parent(t) is attempt for t in turns)
    models = [s for s in finished if s.name == "hearth.model_call"]
    assert sorted(turns.index(parent(m)) for m in models) == [0, 1]  # one call per turn
    [tool] = [s for s in finished if s.name == "hearth.tool_call"]
    assert parent(tool) is turns[0] and tool.attributes["hearth.tool"] == "slow_job"
    steps = [s for s in finished if s.name == "hearth.step"]
    assert [s.attributes["hearth.step"] for s in steps] == ["start", "finish"]
    assert all(parent(s) is tool for s in steps)


def test_a_malformed_traceparent_is_ignored_and_the_submission_starts_its_own_trace(
    spans: InMemorySpanExporter, server: ThreadServer
) -> None:
    with server.client() as http:
        r = http.post(
            "/agents/echo/t-2", json={"message": "hi"}, headers={"traceparent": "00-zz-bad-01"}
        )
        assert r.status_code == 202
        sid = r.json()["submission_id"]
        http.get(f"/agents/echo/t-2/submissions/{sid}?wait=30")
    [admission] = [s for s in spans.get_finished_spans() if s.name == "hearth.submission"]
    assert admission.parent is None


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.crash
def test_a_recovery_attempt_in_another_process_continues_the_trace(tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {"HEARTH_TEST_SPANS": str(spans_file), "HEARTH_TEST_SLOW_S": "30"}
    server = ServerProcess(tmp_path / "h.db", app="tracedapp:app", env=env).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            r = http.post(
                "/agents/worker/k-1", json={"message": "go"}, headers={"traceparent": TRACEPARENT}
            )
            sid = r.json()["submission_id"]

            def started() -> bool:
                records = http.get("/agents/worker/k-1/stream").json()["records"]
                return any(r["type"] == "tool_step_settled" for r in records)

            wait_until(started, timeout=20)
            first_pid = server.proc.pid if server.proc else None
            server.kill()  # mid-tool: between the two steps of slow_job
            server.env["HEARTH_TEST_SLOW_S"] = "0.1"
            server.start()
            done = http.get(f"/agents/worker/k-1/submissions/{sid}?wait=30").json()
            assert done["status"] == "settled" and done["outcome"] == "completed"

            def attempt_exported() -> bool:  # its span ends after the settlement is answered
                try:
                    found = read_spans(spans_file)
                except ValueError:  # a line being written
                    return False
                return any(s["name"] == "hearth.attempt" and s["pid"] != first_pid for s in found)

            wait_until(attempt_exported, timeout=20)
    finally:
        server.kill()
    found = read_spans(spans_file)
    assert {s["trace_id"] for s in found} == {TRACE_ID}  # one trace, both processes
    [admission] = [s for s in found if s["name"] == "hearth.submission"]
    assert admission["pid"] == first_pid and admission["parent_id"] == PARENT_ID
    # The first attempt never ended (SIGKILL), but its finished step did export.
    first_steps = [s for s in found if s["name"] == "hearth.step" and s["pid"] == first_pid]
    assert [s["attributes"]["hearth.step"] for s in first_steps] == ["start"]
    later = [s for s in found if s["pid"] != first_pid]
    [attempt] = [s for s in later if s["name"] == "hearth.attempt"]
    assert attempt["attributes"]["hearth.attempt"] == 2
    assert attempt["parent_id"] == admission["span_id"]
    by_id = {s["span_id"]: s for s in later}
    [step] = [s for s in later if s["name"] == "hearth.step"]
    assert step["attributes"]["hearth.step"] == "finish"  # "start" was replayed, not re-run
    chain = []
    at: dict[str, Any] | None = step
    while at is not None:
        chain.append(at["name"])
        at = by_id.get(at["parent_id"])
    assert chain == ["hearth.step", "hearth.tool_call", "hearth.turn", "hearth.attempt"]


# --- logs ------------------------------------------------------------------------------------


def test_json_log_lines_carry_the_conversation_and_submission_ids(tmp_path: Path) -> None:
    env = {"HEARTH_TEST_SPANS": str(tmp_path / "spans.jsonl"), "HEARTH_LOG_FORMAT": "json"}
    args = ("--access-log", "--log-level", "info")
    server = ServerProcess(tmp_path / "h.db", app="tracedapp:app", env=env, args=args).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            body = settle(http, "noter", "n-1")
            http.get("/healthz")
    finally:
        server.terminate()
        server.wait(30)
    lines = [line for line in server.log.read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= set(p) for p in parsed)
    [noted] = [p for p in parsed if p["message"] == "noting hello"]
    assert noted["conversation_id"] == "noter/n-1"
    assert noted["submission_id"] == body["id"]
    assert noted["tool"] == "note" and noted["level"] == "warning"
    assert any(p["logger"] == "uvicorn.access" and "/healthz" in p["message"] for p in parsed)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_access_log_is_written_at_the_default_log_level(
    tmp_path: Path, log_format: str
) -> None:
    """``--access-log`` alone wrote nothing: uvicorn set its access logger to the log level,
    warning by default, and the lines it asks for are logged at info."""
    env = {"HEARTH_LOG_FORMAT": log_format}
    server = ServerProcess(tmp_path / "h.db", env=env, args=("--access-log",)).start()
    try:
        with httpx2.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/healthz").status_code == 200
    finally:
        server.terminate()
        server.wait(30)
    # (uvicorn prints its access lines on stdout in text; in JSON, hearth's handler on stderr)
    logged = server.printed() + server.log.read_text()
    assert 'GET /healthz HTTP/1.1\\" 200' in logged or '"GET /healthz HTTP/1.1" 200' in logged
