"""hearth's HTTP API (docs/http.md): an ASGI app over one ``App`` or ``Runtime``.

Example::

    api = app.asgi()                       # run it: uvicorn, hypercorn, or `hearth serve`
    outer = Starlette(routes=[Mount("/hearth", api)], lifespan=api.lifespan)
"""

from hearth.server.asgi import HearthASGI, build_asgi
from hearth.server.errors import ApiError

__all__ = ["ApiError", "HearthASGI", "build_asgi"]
