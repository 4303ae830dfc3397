"""The soak's load: many conversations, each sending a seeded sequence of scenarios through the
Python SDK to the server its conversation lives on, retrying through the server's deaths (with
an idempotency key, so a message whose 202 was lost to a kill is not admitted twice), aborting
some submissions mid-work and sending a second message into a busy conversation (a join).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hearth
from hearth.client._errors import is_transient
from hearth.receipts import Receipt

# (scenario, weight) for the ``soak`` and ``brittle`` agents; ``hurried`` adds its deadline.
WEIGHTS = {
    "plain": 3,
    "stream": 4,
    "tools": 4,
    "slow": 2,
    "delegate": 2,
    "deep": 1,
    "transient": 1,
    "overflow": 1,
    "fatal": 1,
    "finish": 2,
    "abort": 2,  # "slow" or "stall", then an abort after a random pause
    "join": 2,  # "slow", then "plain" into the busy conversation
}
HURRIED_EXTRA = {"stall": 3}
AGENTS = (("soak", 7), ("brittle", 2), ("hurried", 2))


@dataclass
class Conversation:
    agent: str
    id: str
    server: int  # index of the slot that serves it
    rng: random.Random
    sent: int = 0


@dataclass
class Load:
    """The conversations of a soak and what the clients saw (the database's view is what counts;
    this is for the progress line)."""

    conversations: list[Conversation]
    urls: list[str]
    seen: Counter[str] = field(default_factory=Counter)
    stopping: bool = False
    owes_abort: set[str] = field(default_factory=set)  # an abort not yet delivered (a stall)

    @classmethod
    def plan(cls, seed: int, conversations: int, urls: list[str]) -> Load:
        rng = random.Random(f"{seed}:conversations")
        convs = []
        for i in range(conversations):
            names = [name for name, _ in AGENTS]
            agent = rng.choices(names, [w for _, w in AGENTS])[0] if i >= 3 else names[i]
            conv_rng = random.Random(f"{seed}:conversation:{i}")
            convs.append(Conversation(agent, f"c{i}", i % len(urls), conv_rng))
        return cls(convs, urls)

    async def run(self) -> None:
        clients = [hearth.AsyncClient(url, timeout=10.0) for url in self.urls]
        try:
            drives = asyncio.gather(
                *(self._drive(conv, clients[conv.server]) for conv in self.conversations)
            )
            while not self.stopping and not drives.done():
                await asyncio.wait({drives}, timeout=0.1)
            # Stopped: what is in flight (a read of a killed server's work, say) is dropped; the
            # final round and the database, not these clients, judge the outcomes.
            drives.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drives
        finally:
            for client in clients:
                await client.aclose()

    async def _drive(self, conv: Conversation, client: hearth.AsyncClient) -> None:
        handle = client.conversation(conv.agent, conv.id)
        while not self.stopping:
            weights = dict(WEIGHTS)
            if conv.agent == "hurried":
                weights |= HURRIED_EXTRA
            names, w = zip(*weights.items(), strict=True)
            scenario = conv.rng.choices(names, w)[0]
            pause = conv.rng.uniform(0.0, 0.8)
            try:
                await self._scenario(handle, conv, scenario, pause)
            except Exception as exc:  # a client that is confused must not end the soak
                self.seen[f"client error {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)

    async def _scenario(self, handle: Any, conv: Conversation, scenario: str, pause: float) -> None:
        if scenario == "abort":
            what = "stall" if conv.rng.random() < 0.4 else "slow"
            self.owes_abort.add(conv.id)  # the final round delivers it if the soak ends first
            receipt = await self._send(handle, conv, what)
            await asyncio.sleep(pause)
            await self._retry(handle.abort)
            self.owes_abort.discard(conv.id)
            await self._read(handle, receipt)
        elif scenario == "join":
            first = await self._send(handle, conv, "slow")
            await asyncio.sleep(pause / 4)
            second = await self._send(handle, conv, "plain")
            await self._read(handle, first)
            await self._read(handle, second)
        else:
            await self._read(handle, await self._send(handle, conv, scenario))

    async def _send(self, handle: Any, conv: Conversation, word: str) -> Receipt:
        conv.sent += 1
        key = f"{conv.id}-{conv.sent}"
        text = f"{word} {key}"
        receipt: Receipt = await self._retry(lambda: handle.send(text, idempotency_key=key))
        return receipt

    async def _read(self, handle: Any, receipt: Receipt) -> None:
        try:
            await handle.read(receipt, timeout=60.0)
            self.seen["completed"] += 1
        except hearth.SubmissionFailed:
            self.seen["failed"] += 1
        except hearth.SubmissionAborted:
            self.seen["aborted"] += 1
        except TimeoutError:
            self.seen["read timed out"] += 1

    async def _retry(self, call: Any) -> Any:
        """``call()`` until the server answers (it may be dead or restarting)."""
        while True:
            try:
                return await call()
            except Exception as exc:
                if not is_transient(exc) or self.stopping:
                    raise
                await asyncio.sleep(0.1)
