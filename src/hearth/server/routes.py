"""The routes of the HTTP API (docs/http.md).

Each endpoint is ``async (server, request) -> Response``; errors are raised (``ApiError`` or
``hearth.errors``) and turned into the envelope by the server."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth import telemetry
from hearth.errors import SubmissionNotFound, WaitNotFound
from hearth.runtime.runtime import Runtime
from hearth.server import attachments, console, inputs, ops
from hearth.server.body import read_json
from hearth.server.context import Endpoint, ServerContext
from hearth.server.errors import ApiError
from hearth.server.params import int_param, number_param, query, storable
from hearth.server.snapshot import newest_records, newest_submissions
from hearth.server.tail import (
    MAX_OFFSET,
    MAX_WAIT_S,
    PAGE_BYTES,
    PAGE_LIMIT,
    ConversationStream,
    json_page,
    unless_closing,
    wait_for_settlement,
)
from hearth.server.views import (
    conversation_view,
    decode_cursor,
    encode_cursor,
    snapshot,
    submission_view,
)
from hearth.store.base import CONVERSATION_STATUSES

CONVERSATION_PAGE = 50  # conversations in one page of GET /conversations, by default
MAX_CONVERSATION_PAGE = 500
_ADMISSION_KEYS = frozenset({"message", "signal", "idempotency_key"})  # + attachments
_NULL: Any = ()  # neither a string nor an object: refused as a message and as a signal


def routes() -> list[tuple[str, Endpoint, list[str]]]:
    base = "/agents/{agent}/{id}"
    return [
        ("/", console.conversations_page, ["GET"]),
        ("/console/static/{name}", console.static, ["GET"]),
        ("/console/session", console.sign_in, ["POST"]),
        ("/console/logout", console.sign_out, ["POST"]),
        ("/console/{agent}/{id}", console.conversation_page, ["GET"]),
        ("/healthz", ops.healthz, ["GET"]),
        ("/metrics", ops.metrics, ["GET"]),
        ("/openapi.json", ops.openapi, ["GET"]),
        ("/admin/submissions", ops.admin_submissions, ["GET"]),
        ("/admin/gc", attachments.admin_gc, ["POST"]),
        ("/attachments/{sha256}", attachments.get_attachment, ["GET", "HEAD"]),
        ("/conversations", list_conversations, ["GET"]),
        (base, admit, ["POST"]),
        (base, get_snapshot, ["GET"]),
        (base + "/stream", stream, ["GET"]),
        (base + "/submissions/{sid}", get_submission, ["GET"]),
        (base + "/abort", abort, ["POST"]),
        (base + "/fork", fork, ["POST"]),
        ("/channels/{name}", inputs.deliver, ["POST"]),
        ("/channels/{name}/deliveries", inputs.list_deliveries, ["GET"]),
        ("/channels/{name}/deliveries/{delivery_id}/replay", inputs.replay, ["POST"]),
        ("/schedules", inputs.schedules, ["GET"]),
        (base + "/waits", conversation_waits, ["GET"]),
        (base + "/waits/{wait_id}", resolve_wait, ["POST"]),
        ("/waits", all_waits, ["GET"]),
    ]


async def _runtime_for(server: ServerContext, request: Request) -> tuple[Runtime, str, str]:
    """The runtime and the checked agent name and id of an ``/agents`` route (404 unknown agent,
    400 bad id), so that a wrong address is answered before anything else."""
    rt = await server.runtime()
    agent, id = request.path_params["agent"], request.path_params["id"]
    await rt.addressed(agent, id)
    return rt, agent, id


# --- GET /conversations ---------------------------------------------------------------------
async def list_conversations(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    agent = query(request, "agent") or None
    if agent is not None and not await rt.listed_agent(agent):
        raise ApiError(
            400,
            "invalid_request",
            f"agent must be one of: {', '.join(sorted(rt.agents))}",
            {"field": "agent"},
        )
    status = query(request, "status") or None
    if status is not None and status not in CONVERSATION_STATUSES:
        raise ApiError(
            400,
            "invalid_request",
            f"status must be one of: {', '.join(CONVERSATION_STATUSES)}",
            {"field": "status"},
        )
    before = decode_cursor(query(request, "after") or None)
    limit = int_param(
        query(request, "limit"), "limit", default=CONVERSATION_PAGE, low=1,
        high=MAX_CONVERSATION_PAGE,
    )  # fmt: skip
    page = await rt.conversations(agent, status, before=before, limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return JSONResponse(
        {
            "conversations": [conversation_view(c) for c in page],
            "next": encode_cursor(page[-1].cursor) if more else None,
        }
    )


# --- POST /agents/{agent}/{id} ---------------------------------------------------------------
async def admit(server: ServerContext, request: Request) -> Response:
    rt, agent, id = await _runtime_for(server, request)
    if server.shutting_down:
        raise ApiError(
            503,
            "shutting_down",
            "the server is shutting down and admits no new work",
            headers={"Retry-After": "1"},
        )
    body, files = await attachments.read_admission_body(request, server.settings)
    message, signal, key = parse_admission(body)
    # A malformed traceparent is ignored (W3C): the submission then starts a trace of its own.
    traceparent = telemetry.parse_traceparent(request.headers.get("traceparent"))
    receipt = await rt.dispatch(
        agent,
        id,
        message,
        signal=signal,
        idempotency_key=key,
        traceparent=traceparent,
        attachments=files or None,
    )
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


def parse_admission(body: Any) -> tuple[Any, Any, Any]:
    """``(message, signal, idempotency_key)`` from a POST body, or a 400 for a body of the wrong
    shape. The values themselves are the runtime's to check (``dispatch``)."""

    def bad(message: str, field: str | None = None) -> ApiError:
        return ApiError(400, "invalid_request", message, {"field": field} if field else None)

    if not isinstance(body, dict):
        raise bad('the body must be a JSON object: {"message": "..."} or {"signal": {...}}')
    unknown = sorted(set(body) - _ADMISSION_KEYS)
    if unknown:
        raise bad(f"unknown field(s): {', '.join(unknown)}", unknown[0])
    message, signal = _given(body, "message"), _given(body, "signal")  # (checked_signal's)
    key = body.get("idempotency_key")
    if "idempotency_key" in body and not isinstance(key, str):
        raise bad("idempotency_key must be a string of 1-256 characters", "idempotency_key")
    return message, signal, key


def _given(body: dict[str, Any], name: str) -> Any:
    """The field's value for ``dispatch``, where None means "not given": so a JSON null that
    was given becomes a value that ``dispatch`` refuses."""
    if name not in body:
        return None
    return _NULL if body[name] is None else body[name]


# --- GET /agents/{agent}/{id} ----------------------------------------------------------------
async def get_snapshot(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    conversation_id = await rt.addressed(request.path_params["agent"], request.path_params["id"])
    records = await newest_records(rt, conversation_id)
    subs = await newest_submissions(rt, conversation_id)
    # Folded and encoded on a thread: a long conversation's took over a second, every other
    # request of the process waiting.
    return await asyncio.to_thread(lambda: JSONResponse(snapshot(conversation_id, records, subs)))


# --- GET /agents/{agent}/{id}/stream ---------------------------------------------------------
async def stream(server: ServerContext, request: Request) -> Response:
    rt, agent, id = await _runtime_for(server, request)
    conversation_id = await rt.addressed(agent, id)
    after = int_param(query(request, "offset"), "offset", default=-1, low=-1, high=MAX_OFFSET)
    resume = request.headers.get("last-event-id")
    if resume is not None and resume.strip():
        after = int_param(resume.strip(), "Last-Event-ID", default=-1, low=-1, high=MAX_OFFSET)
    await rt.require_conversation(conversation_id)
    if "text/event-stream" in request.headers.get("accept", "").lower():
        # The next record read before the 200 goes out: one the store cannot read is a 500
        # ``corrupt_data`` (mid-stream, it could only end the stream, and a client resuming
        # from the last record it got asks here again, for that one).
        await rt.read_stream(conversation_id, after, 1, PAGE_BYTES)
        if server.shutting_down:
            raise ApiError(
                503, "shutting_down", "the server is shutting down", headers={"Retry-After": "1"}
            )
        limit = server.settings.max_streams
        if server.sse_streams >= limit:
            raise ApiError(
                503,
                "too_many_streams",
                f"this server process already has {limit} open streams (HEARTH_MAX_STREAMS);"
                " retry later, or read JSON pages with ?wait= instead",
                {"max_streams": limit},
                headers={"Retry-After": "5"},
            )
        server.count_sse(+1)  # taken now, with no await since the check: the cap holds
        return ConversationStream(
            rt,
            conversation_id,
            after,
            server.closing,
            server.sse_heartbeat_s,
            release=lambda: server.count_sse(-1),
        )
    limit = int_param(query(request, "limit"), "limit", default=PAGE_LIMIT, low=1, high=PAGE_LIMIT)
    wait = _wait_param(request, server.max_wait_s)
    page = await json_page(rt, conversation_id, after, limit, wait, server.closing, request.receive)
    return JSONResponse(page)


# --- GET /agents/{agent}/{id}/submissions/{sid} ----------------------------------------------
async def get_submission(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    path = request.path_params
    if not storable(path["sid"]):
        conversation_id = rt.conversation_id(path["agent"], path["id"])
        raise SubmissionNotFound(f"no submission {path['sid']!r} in conversation {conversation_id}")
    sub = await rt.conversation_submission(path["agent"], path["id"], path["sid"])
    wait = _wait_param(request, server.max_wait_s)
    if wait > 0 and sub.outcome is None:
        sub = await wait_for_settlement(rt, sub, wait, server.closing, request.receive)
    return JSONResponse(submission_view(sub))


# --- POST /agents/{agent}/{id}/abort ---------------------------------------------------------
async def abort(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    result = await rt.abort(request.path_params["agent"], request.path_params["id"])
    return JSONResponse({"aborted": result.aborted, "submission_ids": result.submission_ids})


# --- POST /agents/{agent}/{id}/fork ----------------------------------------------------------
async def fork(server: ServerContext, request: Request) -> Response:
    """``{"offset": N, "new_id": "..."}``: a new conversation from the records up to the rest
    point N (SPEC §17); 201 with the new conversation's ``Location``."""
    rt, agent, id = await _runtime_for(server, request)
    body = await read_json(request, server.settings.max_body)
    if not isinstance(body, dict):
        raise ApiError(
            400, "invalid_request", 'the body must be a JSON object: {"offset": N, "new_id": "..."}'
        )
    unknown = sorted(set(body) - {"offset", "new_id"})
    if unknown:
        raise ApiError(
            400, "invalid_request", f"unknown field(s): {', '.join(unknown)}", {"field": unknown[0]}
        )
    offset, new_id = body.get("offset"), body.get("new_id")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ApiError(
            400, "invalid_request", "offset must be an integer of 0 or more", {"field": "offset"}
        )
    if not isinstance(new_id, str):
        raise ApiError(400, "invalid_request", "new_id must be a string", {"field": "new_id"})
    if server.shutting_down:
        raise ApiError(
            503,
            "shutting_down",
            "the server is shutting down and creates no new conversations",
            headers={"Retry-After": "1"},
        )
    info = await rt.fork(agent, id, offset, new_id)
    root = request.scope.get("root_path", "")
    location = f"{root}/agents/{agent}/{new_id}"
    return JSONResponse(
        {"conversation_id": info.conversation_id, "agent": agent, "id": new_id, "offset": offset},
        status_code=201,
        headers={"Location": location},
    )


# --- durable waits ---------------------------------------------------------------------------
async def resolve_wait(server: ServerContext, request: Request) -> Response:
    """``POST /agents/{agent}/{id}/waits/{wait_id}`` ``{"value": ...}``: resolve it once."""
    rt, agent, id = await _runtime_for(server, request)
    body = await read_json(request, server.settings.max_body)
    if not isinstance(body, dict) or "value" not in body:
        raise ApiError(400, "invalid_request", 'the body must be a JSON object: {"value": ...}')
    unknown = sorted(set(body) - {"value"})
    if unknown:
        raise ApiError(
            400, "invalid_request", f"unknown field(s): {', '.join(unknown)}", {"field": unknown[0]}
        )
    wait_id = request.path_params["wait_id"]
    if not storable(wait_id):
        raise WaitNotFound(f"no wait {wait_id!r} in conversation {agent}/{id}")
    # Held while its wait is not recorded yet (``Runtime.resolve``): not past a shutdown.
    resolving = rt.resolve(agent, id, wait_id, body["value"])
    wait = await unless_closing(resolving, server.closing, request.receive)
    return JSONResponse(
        {"wait_id": wait.wait_id, "submission_id": wait.submission_id, "resolved": True}
    )


async def conversation_waits(server: ServerContext, request: Request) -> Response:
    """``GET /agents/{agent}/{id}/waits``: the conversation's pending waits."""
    rt, agent, id = await _runtime_for(server, request)
    conversation_id = await rt.addressed(agent, id)
    await rt.require_conversation(conversation_id)
    return JSONResponse({"waits": [w.to_json() for w in await rt.waits(conversation_id)]})


async def all_waits(server: ServerContext, request: Request) -> Response:
    """``GET /waits``: every pending wait, oldest first."""
    rt = await server.runtime()
    return JSONResponse({"waits": [w.to_json() for w in await rt.waits()]})


# --- query parameters ------------------------------------------------------------------------
def _wait_param(request: Request, longest: float = MAX_WAIT_S) -> float:
    raw = query(request, "wait")
    if raw is None:
        return 0.0
    return number_param(raw, "wait", high=longest, of=" of seconds")
