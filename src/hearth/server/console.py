"""The web console (docs/console.md): HTML pages over the same runtime the API serves.

The pages are rendered by Jinja2 templates; a conversation's page renders its timeline in the
browser (``static/console.js``) from the API's own JSON and SSE answers, so the console shows
exactly what any client would see. No build step: the templates and the script ship as files.
"""

from __future__ import annotations

import hmac
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from hearth.server.body import read_body
from hearth.server.context import ServerContext
from hearth.server.errors import ApiError
from hearth.server.session import SESSION_S, make_session, same_origin, set_cookie_header
from hearth.server.views import conversation_view, decode_cursor, encode_cursor
from hearth.store.base import CONVERSATION_STATUSES

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
STATIC = HERE / "static"
_STATIC_FILES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
LIST_PAGE = 50
_MAX_SIGN_IN_BODY = 8192


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root


def _base(request: Request, **extra: Any) -> dict[str, Any]:
    return {"root": _root(request), "signed_in": bool(request.scope.get("hearth_session")), **extra}


async def conversations_page(server: ServerContext, request: Request) -> Response:
    """``GET /``: the conversations, newest activity first, filtered and paged."""
    rt = await server.runtime()
    query = request.query_params
    agent = query.get("agent") or None
    status = query.get("status") or None
    problem = None
    if agent is not None and not await rt.listed_agent(agent):
        problem, agent = f"there is no agent named {agent!r}", None
    if status is not None and status not in CONVERSATION_STATUSES:
        problem, status = f"status must be one of {', '.join(CONVERSATION_STATUSES)}", None
    try:
        before = decode_cursor(query.get("after") or None)
    except ApiError as exc:
        problem, before = exc.message, None
    page = await rt.conversations(agent, status, before=before, limit=LIST_PAGE + 1)
    more = len(page) > LIST_PAGE
    page = page[:LIST_PAGE]
    next_url = None
    if more:
        params = {k: v for k, v in (("agent", agent), ("status", status)) if v}
        params["after"] = encode_cursor(page[-1].cursor)
        next_url = f"{_root(request)}/?{urlencode(params)}"
    return templates.TemplateResponse(
        request,
        "conversations.html",
        _base(
            request,
            conversations=[conversation_view(c) for c in page],
            agents=sorted(rt.agents),
            statuses=CONVERSATION_STATUSES,
            agent=agent,
            status=status,
            paged=before is not None,
            next_url=next_url,
            problem=problem,
        ),
        status_code=400 if problem else 200,
    )


async def conversation_page(server: ServerContext, request: Request) -> Response:
    """``GET /console/{agent}/{id}``: one conversation; its script loads and follows the rest."""
    rt = await server.runtime()
    agent, id = request.path_params["agent"], request.path_params["id"]
    conversation_id = await rt.addressed(agent, id)
    info = await rt.conversation_info(conversation_id)
    return templates.TemplateResponse(
        request,
        "conversation.html",
        _base(
            request,
            agent=agent,
            id=id,
            conversation_id=conversation_id,
            exists=info is not None,
            last_offset=-1 if info is None else info.last_offset,
            parent=None if info is None else info.parent,
        ),
        status_code=200 if info is not None else 404,
    )


def sign_in_page(request: Request, *, wrong: bool = False, status_code: int = 401) -> Response:
    """The sign-in form, shown instead of any console page while the token is required."""
    return templates.TemplateResponse(
        request,
        "sign_in.html",
        _base(request, wrong=wrong, next=_next_path(request.url.path, _root(request))),
        status_code=status_code,
    )


async def sign_in(server: ServerContext, request: Request) -> Response:
    """``POST /console/session`` with the token in a form body: sets the session cookie."""
    token = server.settings.token
    root = _root(request)
    if not token:
        return RedirectResponse(f"{root}/", status_code=303)
    if not same_origin(request.scope):
        raise ApiError(403, "forbidden", "sign in from the console's own page")
    # Anyone may call this route: its body is read as the API's are, bounded and timed.
    body = await read_body(request, _MAX_SIGN_IN_BODY, "the sign-in form's limit")
    form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    given = (form.get("token") or [""])[0]
    target = _next_path((form.get("next") or [""])[0], root)
    if not hmac.compare_digest(given.encode(), token.encode()):
        return templates.TemplateResponse(
            request,
            "sign_in.html",
            _base(request, wrong=True, next=target),
            status_code=401,
        )
    response = RedirectResponse(target, status_code=303)
    cookie = set_cookie_header(
        make_session(token),
        f"{root}/",
        secure=request.url.scheme == "https",
        max_age=int(SESSION_S),
    )
    response.headers.append("set-cookie", cookie)
    return response


async def sign_out(server: ServerContext, request: Request) -> Response:
    """``POST /console/logout``: clears the session cookie."""
    if not same_origin(request.scope):
        raise ApiError(403, "forbidden", "sign out from the console's own page")
    root = _root(request)
    response = RedirectResponse(f"{root}/", status_code=303)
    clear = set_cookie_header("", f"{root}/", secure=request.url.scheme == "https", max_age=0)
    response.headers.append("set-cookie", clear)
    return response


async def static(server: ServerContext, request: Request) -> Response:
    name = request.path_params["name"]
    media_type = _STATIC_FILES.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", f"no console file {name!r}")
    return FileResponse(STATIC / name, media_type=media_type, headers={"Cache-Control": "no-cache"})


def _next_path(path: str, root: str) -> str:
    """Where to go after signing in: a console page of this server, nothing else."""
    inside = path[len(root) :] if root and path.startswith(root) else path
    return f"{root}{inside}" if is_console_page(inside) else f"{root}/"


def is_console_page(path: str) -> bool:
    """The pages that show the sign-in form instead of a 401 envelope."""
    return path == "/" or (
        _CONVERSATION_PAGE.fullmatch(path) is not None and not path.startswith(PUBLIC_PREFIX)
    )


_CONVERSATION_PAGE = re.compile(r"/console/[A-Za-z0-9._:-]+/[A-Za-z0-9._:-]+")

PUBLIC_PATHS = ("/console/session", "/console/logout")
PUBLIC_PREFIX = "/console/static/"
