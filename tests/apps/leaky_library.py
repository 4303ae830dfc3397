"""What a library with a cancellation bug does, for tests of hearth's boundaries: its own inner
task is cancelled, and the CancelledError comes out to its caller, though nothing cancelled the
caller."""

from __future__ import annotations

import asyncio


async def leak_a_cancellation() -> None:
    inner = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    inner.cancel()
    await inner
