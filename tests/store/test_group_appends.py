"""``GroupAppends`` on its own, with a stand-in for the statement: every append is answered,
however appends and groups interleave, and an append alone is written without a hand-off."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import pytest

from hearth.records import UserMessage
from hearth.store.postgres_group import GroupAppends, Grouped, GroupItem
from hearth.store.rows import Fence

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Waiter:
    conversation_id: str
    done: asyncio.Future[str]


RECORD = UserMessage(id="m", message_id="m", content="x", submission_id="s")


def writer(pauses: random.Random) -> tuple[GroupAppends, list[list[str]]]:
    groups: list[list[str]] = []

    async def run(items: list[GroupItem]) -> set[int]:
        groups.append([item.conversation_id for item in items])
        for _ in range(pauses.choice([0, 1, 2])):  # the statement's own waits
            await asyncio.sleep(0)
        return {ix for ix, item in enumerate(items) if not item.conversation_id.endswith("-x")}

    return GroupAppends(run), groups


@pytest.mark.parametrize("seed", range(12))
async def test_every_append_is_answered_however_they_interleave(seed: int) -> None:
    rng = random.Random(seed)
    group, groups = writer(rng)

    async def steps(conversation: str) -> list[bool]:
        answers = []
        for n in range(50):
            answers.append(await group.append(conversation, [RECORD], n, Fence("s", 1)))
            for _ in range(rng.choice([0, 0, 1])):
                await asyncio.sleep(0)
        return answers

    names = [f"c{i}" for i in range(20)] + ["c20-x"]
    answers = await asyncio.wait_for(asyncio.gather(*(steps(c) for c in names)), timeout=10)
    assert answers == [[True] * 50] * 20 + [[False] * 50]  # each item judged alone
    assert sum(len(g) for g in groups) == 21 * 50
    assert len(groups) < 21 * 50 / 2  # grouped
    assert all(len(g) == len(set(g)) for g in groups)  # one append per conversation a group


async def test_an_append_alone_is_written_in_the_callers_own_task() -> None:
    seen: list[asyncio.Task[object] | None] = []

    async def run(items: list[GroupItem]) -> set[int]:
        seen.append(asyncio.current_task())
        return {0}

    group = GroupAppends(run)
    assert await group.append("c", [RECORD], 0, Fence("s", 1))
    assert seen == [asyncio.current_task()]


@pytest.mark.parametrize("seed", range(8))
async def test_groups_in_flight_never_share_a_conversation(seed: int) -> None:
    """Two statements in flight would wait for each other's row locks: an item of a
    conversation being written waits for a later group, and every item is still answered."""
    rng = random.Random(seed)
    in_flight: list[str] = []
    overlaps: list[str] = []

    async def run(items: list[Waiter]) -> list[str]:
        names = [item.conversation_id for item in items]
        overlaps.extend(set(names) & set(in_flight))
        in_flight.extend(names)
        for _ in range(rng.choice([1, 2, 3])):
            await asyncio.sleep(0)
        for name in names:
            in_flight.remove(name)
        return [f"{name}!" for name in names]

    grouped: Grouped[Waiter, str] = Grouped(run, flushers=3)

    async def one(name: str) -> str:
        for _ in range(rng.choice([0, 1])):
            await asyncio.sleep(0)
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        return await grouped.submit(Waiter(name, done))

    names = [f"c{rng.randrange(6)}" for _ in range(300)]
    answers = await asyncio.wait_for(asyncio.gather(*(one(n) for n in names)), timeout=10)
    assert answers == [f"{n}!" for n in names]
    assert overlaps == []
    assert grouped.statements < len(names)


def _gated() -> tuple[Grouped[Waiter, str], list[list[str]], asyncio.Event]:
    """A ``Grouped`` of two writers whose statements wait for ``gate``: what they wrote."""
    written: list[list[str]] = []
    gate = asyncio.Event()

    async def run(items: list[Waiter]) -> list[str]:
        await gate.wait()
        written.append([item.conversation_id for item in items])
        return [f"{item.conversation_id}!" for item in items]

    return Grouped(run, flushers=2), written, gate


def _waiter(name: str) -> Waiter:
    return Waiter(name, asyncio.get_running_loop().create_future())


async def test_an_item_no_group_took_by_its_time_is_dropped_and_never_written() -> None:
    grouped, written, gate = _gated()
    first = asyncio.create_task(grouped.submit(_waiter("a")))  # written alone: held at the gate
    await asyncio.sleep(0)
    second = asyncio.create_task(grouped.submit(_waiter("b")))  # the other writer's: held
    await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):  # both writers busy: no group takes "c" in time
        await grouped.submit(_waiter("c"), until=time.monotonic() + 0.1)
    gate.set()
    assert await first == "a!" and await second == "b!"
    await asyncio.sleep(0.05)
    assert sorted(written) == [["a"], ["b"]]  # "c" was dropped: never written


async def test_an_item_a_group_took_is_answered_though_its_writer_outlasts_its_time() -> None:
    grouped, written, gate = _gated()
    first = asyncio.create_task(grouped.submit(_waiter("a")))  # written alone: held
    await asyncio.sleep(0)
    second = asyncio.create_task(grouped.submit(_waiter("b"), until=time.monotonic() + 0.1))
    await asyncio.sleep(0.3)  # the other writer took "b" at once; its statement is held
    gate.set()
    assert await first == "a!"
    assert await second == "b!"  # the writer's answer, not a TimeoutError
    assert sorted(written) == [["a"], ["b"]]


async def test_an_item_whose_caller_is_cancelled_is_not_written() -> None:
    grouped, written, gate = _gated()
    held = [asyncio.create_task(grouped.submit(_waiter(name))) for name in ("a", "b")]
    await asyncio.sleep(0.01)  # "a" written alone, "b" by the other writer: both held
    waiting = asyncio.create_task(grouped.submit(_waiter("c"), until=time.monotonic() + 30))
    await asyncio.sleep(0)
    waiting.cancel()
    gate.set()
    assert await asyncio.gather(*held) == ["a!", "b!"]
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.05)
    assert sorted(written) == [["a"], ["b"]]
