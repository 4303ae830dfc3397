"""The routes of inputs from outside (docs/channels.md): channel deliveries and schedules.

``POST /channels/{name}`` is authenticated by its channel's ``verify`` (a webhook sender has no
bearer token); the other routes here are operators' and stay behind the token."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import DeliveryNotFound
from hearth.server.body import read_body
from hearth.server.context import ServerContext
from hearth.server.errors import ApiError
from hearth.server.params import flag, int_param, query, storable

MAX_LIST = 1000
_STATUSES = ("admitted", "failed")


async def deliver(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    name = request.path_params["name"]
    rt.channels.channel(name)  # 404 before the body is read
    if server.shutting_down:
        raise ApiError(
            503,
            "shutting_down",
            "the server is shutting down and admits no new work",
            headers={"Retry-After": "1"},
        )
    body = await read_body(request, server.settings.max_body)
    receipt = await rt.deliver(name, dict(request.headers), body)
    return JSONResponse(receipt.to_json(), status_code=202)


async def list_deliveries(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    status = query(request, "status") or None
    if status is not None and status not in _STATUSES:
        raise ApiError(
            400, "invalid_request", "status must be admitted or failed", {"field": "status"}
        )
    limit = int_param(query(request, "limit") or None, "limit", default=100, low=1, high=MAX_LIST)
    full = flag(request, "full")
    found = await rt.deliveries(request.path_params["name"], status=status, limit=limit)
    return JSONResponse({"deliveries": [d.to_json(full=full) for d in found]})


async def replay(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    name, delivery_id = request.path_params["name"], request.path_params["delivery_id"]
    if not storable(delivery_id):
        rt.channels.channel(name)  # (an unknown channel is still the first 404)
        raise DeliveryNotFound(f"channel {name!r} has no delivery {delivery_id!r}")
    receipt = await rt.replay_delivery(name, delivery_id)
    return JSONResponse(receipt.to_json(), status_code=202)


async def schedules(server: ServerContext, request: Request) -> Response:
    rt = await server.runtime()
    return JSONResponse({"schedules": await rt.schedules()})
