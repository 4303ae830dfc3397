"""The task helpers the runtime's parts stop their background work with."""

from __future__ import annotations

import asyncio

import pytest

from hearth._tasks import cancel_and_wait, run_to_end

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _winds_down(ended: list[str]) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.2)  # it takes a moment to end
        ended.append("worker")
        raise


async def test_a_stop_cancelled_while_it_waits_for_a_task_is_cancelled() -> None:
    """``await task`` under ``suppress(CancelledError)`` swallowed the waiter's own
    cancellation too: a stop cancelled meanwhile went on as if nothing had asked it to end."""
    ended: list[str] = []
    worker = asyncio.create_task(_winds_down(ended))
    await asyncio.sleep(0)

    async def stop() -> None:
        await cancel_and_wait(worker)
        ended.append("stop went on")

    stopping = asyncio.create_task(stop())
    await asyncio.sleep(0.05)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await asyncio.wait({worker})
    assert ended == ["worker"]


async def test_cancel_and_wait_waits_for_the_end_and_raises_what_the_task_raised() -> None:
    ended: list[str] = []
    worker = asyncio.create_task(_winds_down(ended))
    await asyncio.sleep(0)
    await cancel_and_wait(worker)
    assert ended == ["worker"]

    async def fails_as_it_ends() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ValueError("while ending") from None

    failing = asyncio.create_task(fails_as_it_ends())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="while ending"):
        await cancel_and_wait(failing)
    await cancel_and_wait(None)


async def test_run_to_end_finishes_the_work_then_lets_the_cancellation_go_on() -> None:
    ended: list[str] = []

    async def stop() -> None:
        await asyncio.sleep(0.1)
        ended.append("stopped")

    running = asyncio.create_task(run_to_end(stop()))
    await asyncio.sleep(0.01)
    running.cancel()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert ended == ["stopped"]
