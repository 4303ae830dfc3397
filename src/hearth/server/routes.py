"""The routes of the HTTP API (docs/http.md).

Each endpoint is ``async (server, request) -> Response``; errors are raised (``ApiError`` or
``hearth.errors``) and turned into the envelope by the server."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import ConversationNotFound, SubmissionNotFound
from hearth.ids import MAX_IDEMPOTENCY_KEY, check_id
from hearth.runtime.runtime import Runtime
from hearth.server import ops
from hearth.server.body import read_json
from hearth.server.errors import ApiError
from hearth.server.stream import PAGE_LIMIT, json_page, sse_response, wait_for_settlement
from hearth.server.views import snapshot, submission_view

if TYPE_CHECKING:
    from hearth.server.asgi import Endpoint, HearthASGI

MAX_WAIT_S = 300.0
_ADMISSION_KEYS = frozenset({"message", "signal", "idempotency_key"})
_SIGNAL_KEYS = frozenset({"type", "body", "attributes"})


def routes() -> list[tuple[str, Endpoint, list[str]]]:
    base = "/agents/{agent}/{id}"
    return [
        ("/", ops.console, ["GET"]),
        ("/healthz", ops.healthz, ["GET"]),
        ("/metrics", ops.metrics, ["GET"]),
        ("/openapi.json", ops.openapi, ["GET"]),
        ("/admin/submissions", ops.admin_submissions, ["GET"]),
        (base, admit, ["POST"]),
        (base, get_snapshot, ["GET"]),
        (base + "/stream", stream, ["GET"]),
        (base + "/submissions/{sid}", get_submission, ["GET"]),
        (base + "/abort", abort, ["POST"]),
    ]


async def _conversation(server: HearthASGI, request: Request) -> tuple[Runtime, str, str]:
    """The runtime, agent name and id of an ``/agents`` route: 404 unknown agent, 400 bad id."""
    rt = await server.runtime()
    agent, id = request.path_params["agent"], request.path_params["id"]
    rt.agent(agent)
    check_id(id)
    return rt, agent, id


async def _existing(rt: Runtime, conversation_id: str) -> None:
    if await rt.store.get_conversation(conversation_id) is None:
        raise ConversationNotFound(f"no conversation {conversation_id!r}: send it a message first")


# --- POST /agents/{agent}/{id} ---------------------------------------------------------------
async def admit(server: HearthASGI, request: Request) -> Response:
    rt, agent, id = await _conversation(server, request)
    if server.shutting_down:
        raise ApiError(
            503,
            "shutting_down",
            "the server is shutting down and admits no new work",
            headers={"Retry-After": "1"},
        )
    body = await read_json(request, server.settings.max_body)
    message, signal, key = parse_admission(body)
    try:
        receipt = await rt.dispatch(agent, id, message, signal=signal, idempotency_key=key)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    root = request.scope.get("root_path", "")
    stream_url = f"{root}/agents/{agent}/{id}/stream?offset={receipt.offset}"
    return JSONResponse(
        {
            "submission_id": receipt.submission_id,
            "conversation_id": receipt.conversation_id,
            "offset": receipt.offset,
            "stream_url": stream_url,
            "deduplicated": receipt.deduplicated,
            "accepted_at": receipt.accepted_at,
        },
        status_code=202,
        headers={"Location": stream_url},
    )


def parse_admission(body: Any) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """``(message, signal, idempotency_key)`` from a POST body, or a 400."""

    def bad(message: str, field: str | None = None) -> ApiError:
        return ApiError(400, "invalid_request", message, {"field": field} if field else None)

    if not isinstance(body, dict):
        raise bad('the body must be a JSON object: {"message": "..."} or {"signal": {...}}')
    unknown = sorted(set(body) - _ADMISSION_KEYS)
    if unknown:
        raise bad(f"unknown field(s): {', '.join(unknown)}", unknown[0])
    if ("message" in body) == ("signal" in body):
        raise bad('give exactly one of "message" or "signal"')
    key = body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY):
        raise bad(
            f"idempotency_key must be a string of 1-{MAX_IDEMPOTENCY_KEY} characters",
            "idempotency_key",
        )
    if "message" in body:
        message = body["message"]
        if not isinstance(message, str) or not message:
            raise bad("message must be a non-empty string", "message")
        return message, None, key
    signal = body["signal"]
    if not isinstance(signal, dict):
        raise bad('signal must be an object {"type", "body", "attributes"}', "signal")
    unknown = sorted(set(signal) - _SIGNAL_KEYS)
    if unknown:
        raise bad(f"unknown signal field(s): {', '.join(unknown)}", "signal")
    kind, text, attributes = signal.get("type"), signal.get("body", ""), signal.get("attributes")
    if not isinstance(kind, str) or not kind:
        raise bad("signal.type must be a non-empty string", "signal.type")
    if not isinstance(text, str):
        raise bad("signal.body must be a string", "signal.body")
    if attributes is not None and not isinstance(attributes, dict):
        raise bad("signal.attributes must be an object", "signal.attributes")
    return None, {"type": kind, "body": text, "attributes": attributes or {}}, key


# --- GET /agents/{agent}/{id} ----------------------------------------------------------------
async def get_snapshot(server: HearthASGI, request: Request) -> Response:
    rt, agent, id = await _conversation(server, request)
    conversation_id = f"{agent}/{id}"
    await _existing(rt, conversation_id)
    records = await rt.store.read(conversation_id)
    subs = await rt.store.list_submissions(conversation_id)
    return JSONResponse(snapshot(conversation_id, records, subs))


# --- GET /agents/{agent}/{id}/stream ---------------------------------------------------------
async def stream(server: HearthASGI, request: Request) -> Response:
    rt, agent, id = await _conversation(server, request)
    conversation_id = f"{agent}/{id}"
    after = _int_param(request.query_params.get("offset"), "offset", default=-1, low=-1)
    resume = request.headers.get("last-event-id")
    if resume is not None and resume.strip():
        after = _int_param(resume.strip(), "Last-Event-ID", default=-1, low=-1)
    await _existing(rt, conversation_id)
    if "text/event-stream" in request.headers.get("accept", "").lower():
        if server.shutting_down:
            raise ApiError(
                503, "shutting_down", "the server is shutting down", headers={"Retry-After": "1"}
            )
        return sse_response(
            rt, conversation_id, after, server.closing, server.sse_heartbeat_s, server.count_sse
        )
    limit = _int_param(request.query_params.get("limit"), "limit", default=PAGE_LIMIT, low=1)
    wait = _wait_param(request)
    page = await json_page(rt, conversation_id, after, min(limit, PAGE_LIMIT), wait, server.closing)
    return JSONResponse(page)


# --- GET /agents/{agent}/{id}/submissions/{sid} ----------------------------------------------
async def get_submission(server: HearthASGI, request: Request) -> Response:
    rt, agent, id = await _conversation(server, request)
    sid = request.path_params["sid"]
    sub = await rt.store.get_submission(sid)
    if sub is None or sub.conversation_id != f"{agent}/{id}":
        raise SubmissionNotFound(f"no submission {sid!r} in conversation {agent}/{id}")
    wait = _wait_param(request)
    if wait > 0 and sub.outcome is None:
        sub = await wait_for_settlement(rt, sub, wait, server.closing)
    return JSONResponse(submission_view(sub))


# --- POST /agents/{agent}/{id}/abort ---------------------------------------------------------
async def abort(server: HearthASGI, request: Request) -> Response:
    rt, agent, id = await _conversation(server, request)
    result = await rt.abort(agent, id)
    return JSONResponse({"aborted": result.aborted, "submission_ids": result.submission_ids})


# --- query parameters ------------------------------------------------------------------------
def _int_param(raw: str | None, name: str, *, default: int, low: int) -> int:
    high = 2**62
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(
            400, "invalid_request", f"{name} must be an integer", {"field": name}
        ) from None
    if not low <= value <= high:
        raise ApiError(
            400, "invalid_request", f"{name} must be between {low} and {high}", {"field": name}
        )
    return value


def _wait_param(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise ApiError(
            400, "invalid_request", "wait must be a number of seconds ≥ 0", {"field": "wait"}
        )
    return min(wait, MAX_WAIT_S)
