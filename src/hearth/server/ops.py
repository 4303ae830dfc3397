"""Operational routes: liveness, metrics, the OpenAPI description, the admin view."""

from __future__ import annotations

from collections import Counter

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from hearth.errors import ConversationNotFound
from hearth.ids import ID_RE
from hearth.server.context import ServerContext
from hearth.server.errors import ApiError
from hearth.server.openapi import openapi_document
from hearth.server.params import query, storable
from hearth.store.base import Submission
from hearth.store.rows import JOINED, OPEN

RECENT = 20  # settled submissions listed by the admin view
_QUEUED_TOO_LONG_S = 60.0


async def healthz(server: ServerContext, request: Request) -> Response:
    """200 while this process can serve; 503 with the reason while shutting down or while its
    database does not answer (a load balancer then sends the traffic elsewhere)."""
    rt = await server.runtime()
    if server.shutting_down:
        raise ApiError(503, "shutting_down", "the server is shutting down")
    await rt.check_store()
    return JSONResponse({"status": "ok"})


async def metrics(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    text = rt.render_metrics()
    text += (
        "# HELP hearth_sse_streams SSE streams open in this process (capped by"
        " HEARTH_MAX_STREAMS).\n"
        f"# TYPE hearth_sse_streams gauge\nhearth_sse_streams {server.sse_streams}\n"
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    root = request.scope.get("root_path", "")
    document = openapi_document(
        root, list(rt.agents), token=bool(server.settings.token), max_wait_s=server.max_wait_s
    )
    return JSONResponse(document)


async def admin_submissions(server: ServerContext, request: Request) -> Response:
    """Submissions by status, the leases held, and work that looks stuck (for ``hearth inspect``).

    What it reads grows with the unsettled work, not with the history: the database counts the
    rows, and the latest settled ones are read from the newest back (it read every row, 1.6 s
    and 80 MB for 100,000 settled submissions).
    """
    rt = await server.runtime()
    conversation = query(request, "conversation")
    if conversation is not None:
        # (An agent no longer declared is fine: its work is what an operator may look for.)
        agent, slash, id = conversation.partition("/")
        if not slash or not agent or not storable(agent) or not ID_RE.fullmatch(id):
            raise ApiError(
                400,
                "invalid_request",
                f"conversation must be agent/id (as support/c-1), not {conversation!r}",
                {"field": "conversation"},
            )
        if await rt.conversation_info(conversation) is None:
            # (An empty answer read as "nothing stuck there", for a name mistyped.)
            raise ConversationNotFound(f"no conversation {conversation!r}")
    counted = await rt.submission_counts(conversation)
    open_work = await rt.submissions(conversation, OPEN)
    # Messages joined to a response that has not settled: in the conversations of open work.
    joined: list[Submission] = []
    for conversation_id in dict.fromkeys(s.conversation_id for s in open_work):
        found = await rt.submissions(conversation_id, [JOINED])
        joined += [s for s in found if s.outcome is None]
    settled = await rt.latest_settled(RECENT, conversation)
    settled.sort(key=lambda s: s.settled_at or 0.0, reverse=True)
    # Read after the open work: one that settled in between is listed as settled, not twice.
    done = {s.id for s in settled}
    unsettled = sorted([s for s in [*open_work, *joined] if s.id not in done], key=lambda s: s.seq)
    now = await rt.now()  # the clock the leases were stamped with
    waiting = {s.conversation_id for s in unsettled if s.status == "waiting"}
    counts: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for (status, outcome), n in counted.items():
        counts[status] += n
        if outcome is not None:
            outcomes[outcome] += n
    return JSONResponse(
        {
            "now": now,
            "owner": rt.owner,
            "counts": dict(counts),
            "outcomes": dict(outcomes),
            "unsettled": [s.to_json() for s in unsettled],
            "recent": [s.to_json() for s in settled],
            "leases": [
                {
                    "submission_id": s.id,
                    "conversation_id": s.conversation_id,
                    "owner": s.lease_owner,
                    "expires_in_s": round((s.lease_expires_at or now) - now, 3),
                    "attempt": s.attempt,
                }
                for s in unsettled
                if s.status == "running"
            ],
            "stuck": [
                {"submission_id": s.id, "conversation_id": s.conversation_id, "reason": reason}
                for s in unsettled
                if (reason := stuck_reason(s, now, waiting))
            ],
        }
    )


def stuck_reason(sub: Submission, now: float, waiting: set[str] | None = None) -> str | None:
    """Why an unsettled submission looks stuck, or None. ``waiting``: the conversations with a
    submission waiting for a durable wait (what is queued behind one is not stuck)."""
    if sub.status == "waiting":
        return None  # it waits for a value from outside (GET /waits); its deadline is paused
    if sub.status == "queued" and waiting is not None and sub.conversation_id in waiting:
        return None  # queued behind a submission that waits: its turn comes after the wait
    if sub.status == "running" and sub.lease_expires_at is not None and sub.lease_expires_at < now:
        return "its lease expired: its owner is gone and the next scan will take it over"
    if sub.deadline is not None and sub.deadline < now:
        return "it is past its deadline and should settle failed at once"
    if sub.status == "queued" and now - sub.accepted_at > _QUEUED_TOO_LONG_S:
        waited = now - sub.accepted_at
        return f"queued for {waited:.0f} s (is an earlier one of its conversation running?)"
    return None
