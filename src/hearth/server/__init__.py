"""hearth's HTTP API (docs/http.md): an ASGI app over one ``RuntimeHost`` (an ``App``) or
``Runtime``.

Example::

    api = app.asgi()                       # run it: uvicorn, hypercorn, or `hearth serve`
    outer = Starlette(routes=[Mount("/hearth", api)], lifespan=api.lifespan)
"""

from hearth.server.asgi import HearthASGI, build_asgi
from hearth.server.errors import ApiError
from hearth.server.host import RuntimeHost

__all__ = ["ApiError", "HearthASGI", "RuntimeHost", "build_asgi"]
