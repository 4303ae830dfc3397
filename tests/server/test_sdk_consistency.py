"""The SDK behaves as the Python API does: the same answers for the same calls, the same
``hearth.errors`` classes for the same faults (against a real server)."""

from __future__ import annotations

import pytest
from httpharness import ThreadServer

import hearth


@pytest.mark.anyio
async def test_a_read_with_no_time_left_still_asks_once(server: ThreadServer) -> None:
    """``read(receipt, timeout=0)`` raised TimeoutError before any request, even for a
    submission long settled; ``Runtime.read`` reads the row once and returns the reply."""
    with hearth.Client(server.url) as client:
        conv = client.conversation("echo", "c-1")
        receipt = conv.send("hello")
        reply = conv.read(receipt, timeout=10)
        assert conv.read(receipt, timeout=0) == reply
        stalled = client.conversation("staller", "c-1")
        with pytest.raises(TimeoutError, match="has not settled yet"):
            stalled.read(stalled.send("hi"), timeout=0)
    async with hearth.AsyncClient(server.url) as aclient:
        aconv = aclient.conversation("echo", "c-1")
        assert await aconv.read(receipt, timeout=0) == reply
        astalled = aclient.conversation("staller", "c-2")
        with pytest.raises(TimeoutError, match="has not settled yet"):
            await astalled.read(await astalled.send("hi"), timeout=0)
