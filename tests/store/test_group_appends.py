"""``GroupAppends`` on its own, with a stand-in for the statement: every append is answered,
however appends and groups interleave, and an append alone is written without a hand-off."""

from __future__ import annotations

import asyncio
import random

import pytest

from hearth.records import UserMessage
from hearth.store.postgres_group import GroupAppends, GroupItem
from hearth.store.rows import Fence

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
