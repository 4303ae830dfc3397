"""What the HTTP server serves: a ``RuntimeHost``, anything that can run a hearth ``Runtime``.

``hearth.App`` is one. The server depends on this small protocol, never on ``App`` itself, so
that the app can build its server without the two importing each other.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from hearth.config import Settings
from hearth.runtime.runtime import Runtime


class RuntimeHost(Protocol):
    """Starts a runtime and stops it: ``async with host.run() as runtime: ...``.

    Example::

        api = hearth.server.build_asgi(app)  # app: hearth.App, or your own RuntimeHost
    """

    @property
    def settings(self) -> Settings:
        """The settings the server reads: token, body limit, host, port, shutdown time."""
        ...

    def run(self) -> AbstractAsyncContextManager[Runtime]:
        """Start the runtime on entry, yield it, and stop it gracefully on exit."""
        ...
