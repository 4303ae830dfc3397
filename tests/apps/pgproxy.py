"""A loopback TCP proxy in front of a test's PostgreSQL server, to play the network faults a
deployment meets between hearth and its database.

Each connection made through it is a *link*: two pipes, one each way, that pass on what they
read. ``strand()`` holds links open for good, forwarding nothing more and closing nothing (a flow
a firewall dropped); ``freeze()`` strands them all and leaves new connections accepted but never
answered (a server that stopped answering); ``latency`` holds each chunk before passing it on;
``hold_on``: a link whose client sends these bytes holds from then on (a server that stops
answering at that statement); ``down_rate`` limits what the server sends (a slow link).
A subclass may take a link over whole by overriding ``_link``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class PgProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.latency = 0.0  # seconds each chunk is held: half a round trip
        self.hold_on: bytes | None = None
        self.down_rate: float | None = None  # bytes a second from the server, if limited
        self.server: asyncio.Server | None = None
        self.port = 0
        self._frozen = False
        # (the link's local port towards the server, set while it forwards) for each link
        self._links: list[tuple[int, asyncio.Event]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def conninfo(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.transport.abort()

    def strand(self, port: int | None = None) -> int:
        """Hold every link made so far, or only the one whose connection to the server has
        local port ``port`` (``client_port`` in ``pg_stat_activity``); links made afterwards
        still go through. How many were held."""
        held = [flowing for at, flowing in self._links if port in (None, at)]
        for flowing in held:
            flowing.clear()
        return len(held)

    def freeze(self) -> None:
        """Answer nothing more, on the links made so far or on new ones."""
        self._frozen = True
        self.strand()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError, OSError):  # (stopped with the test)
            if self._frozen:
                await asyncio.sleep(3600)  # accepted, never answered
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            self._writers += [writer, up_writer]
            await self._link(reader, writer, up_reader, up_writer)

    async def _link(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        flowing = asyncio.Event()
        flowing.set()
        self._links.append((up_writer.get_extra_info("sockname")[1], flowing))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                if source is reader and self.hold_on is not None and self.hold_on in data:
                    flowing.clear()
                await flowing.wait()  # stranded: held here for good
                if self.latency:
                    await asyncio.sleep(self.latency)
                if self.down_rate and source is up_reader:
                    await asyncio.sleep(len(data) / self.down_rate)
                sink.write(data)
                await sink.drain()

        await self._until_one_ends(
            [pipe(reader, up_writer), pipe(up_reader, writer)], writer, up_writer
        )

    async def _until_one_ends(
        self,
        pipes: list[Coroutine[Any, Any, None]],
        writer: asyncio.StreamWriter,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """Run both pipes of a link until either ends, then close both sides."""
        tasks = [asyncio.create_task(p) for p in pipes]
        self._tasks.update(tasks)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
