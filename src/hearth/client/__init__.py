"""The client SDK: talk to a ``hearth serve`` over HTTP (docs/http.md).

Example::

    client = hearth.Client("http://127.0.0.1:8000", token=None)
    conv = client.conversation("support", "c-1")
    receipt = conv.send("Where is my order 7?")
    reply = conv.read(receipt)          # follows the stream; survives server restarts
    print(reply.text)

``hearth.AsyncClient`` has the same methods, awaitable (``stream`` is an async iterator).

A receipt is plain data: ``read`` works from any process. ``read`` and ``stream`` reconnect with
backoff whenever the server is unreachable, restarting or shutting down, and resume after the last
offset they saw, so no record is missed or seen twice. ``read``'s ``timeout`` is exact in both.

Inside: ``_core`` builds every request and decodes every answer without doing I/O; ``_sync`` and
``_async`` are the thin shells that do it, over ``httpx2.Client`` and ``httpx2.AsyncClient``.
"""

from hearth.client._async import AsyncClient, AsyncConversation
from hearth.client._errors import HTTPError, ServerUnavailable, Unauthorized
from hearth.client._errors import error_from as error_from
from hearth.client._sync import Client, Conversation

__all__ = [
    "AsyncClient",
    "AsyncConversation",
    "Client",
    "Conversation",
    "HTTPError",
    "ServerUnavailable",
    "Unauthorized",
]
