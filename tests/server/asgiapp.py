"""``serverapp``'s agents behind a plain ASGI server (``uvicorn asgiapp:api`` in a child process):
``api`` run directly, ``outer`` mounted at ``/hearth`` with ``lifespan=api.lifespan`` as
docs/http.md "Mounting" shows. The database is ``$HEARTH_DB``."""

from __future__ import annotations

import serverapp
from starlette.applications import Starlette
from starlette.routing import Mount

api = serverapp.app.asgi()
outer = Starlette(routes=[Mount("/hearth", api)], lifespan=api.lifespan)
