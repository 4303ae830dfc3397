"""The workspace interface: where an agent's files live, and what its tools may do with them.

A ``Workspace`` is declared once (``hearth.LocalWorkspace(root)``, ``hearth.EphemeralWorkspace()``
or your own) and handed to ``ctx.use_workspace``. Each attempt opens it for the conversation it
runs and gets an ``OpenWorkspace``, which tools reach as ``ctx.workspace``; the attempt closes it
when it ends. Paths are relative to the workspace; one that leads outside raises
``PathOutsideWorkspace``.

A remote sandbox (a container service, say) plugs in by implementing both classes; the tests in
``tests/workspaces/test_workspace_conformance.py`` are the contract the built-ins pass.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hearth.errors import ConfigurationError


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    """Bounds of one ``run`` command: the largest timeout a call may ask for (seconds), how much
    output (stdout and stderr, bytes) is kept, the address space (bytes) and processes the
    command may use, and the largest file it may write (bytes)."""

    max_timeout: float = 300.0
    output_bytes: int = 32_000
    memory_bytes: int = 2 * 1024**3
    processes: int = 64
    file_bytes: int = 1024**3

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_timeout, bool)
            or not isinstance(self.max_timeout, int | float)
            or not 0 < self.max_timeout < math.inf  # (NaN: every timeout passed it unbounded)
        ):
            raise ConfigurationError("RunLimits.max_timeout must be a positive number of seconds")
        for name in ("output_bytes", "memory_bytes", "processes", "file_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"RunLimits.{name} must be an integer ≥ 1")


@dataclass(frozen=True)
class RunResult:
    """How a ``run`` command ended. ``output`` is stdout and stderr interleaved, cut after the
    limit; ``cut_bytes`` says how much was dropped. ``exit_code`` is None when it timed out."""

    exit_code: int | None
    output: str
    cut_bytes: int = 0
    timed_out: bool = False

    def as_json(self) -> dict[str, object]:
        """What the ``run`` tool returns to the model."""
        output = self.output
        if self.cut_bytes:
            output += f"\n[output truncated: {self.cut_bytes} more bytes were cut]"
        result: dict[str, object] = {"exit_code": self.exit_code, "output": output}
        if self.timed_out:
            result["timed_out"] = True
        return result


class OpenWorkspace(abc.ABC):
    """A workspace opened for one attempt at one conversation: ``ctx.workspace`` in a tool.

    Every path is relative to the workspace's top; ``PathOutsideWorkspace`` when it leads out,
    ``WorkspaceError`` when it cannot be used (missing, a directory, not UTF-8 text)."""

    @property
    def path(self) -> Path | None:
        """The workspace's directory on this machine, or None when it is remote."""
        return None

    @abc.abstractmethod
    async def read_file(self, path: str) -> str:
        """The file's text (UTF-8)."""

    async def read_file_head(self, path: str, limit: int) -> tuple[str, int]:
        """The first ``limit`` characters of the file's text, and how many bytes of it are left
        after them (0 when it is all there). The built-in ``read_file`` tool reads this way.
        This default reads the whole file; a workspace whose files can be large reads only
        what it returns."""
        text = await self.read_file(path)
        return text[:limit], len(text[limit:].encode("utf-8", "surrogatepass"))

    @abc.abstractmethod
    async def write_file(self, path: str, content: str) -> int:
        """Write ``content`` (UTF-8), making missing parent directories; return the bytes
        written. An existing file is replaced."""

    @abc.abstractmethod
    async def list_files(self, path: str = ".") -> list[str]:
        """Everything under ``path``, recursively, sorted, relative to the workspace's top;
        directories end with ``/``. Symbolic links are listed, not followed."""

    @abc.abstractmethod
    async def run(self, command: str, *, timeout: float) -> RunResult:
        """Run a shell command (``/bin/sh -c``) in the workspace's top directory, bounded by
        ``timeout`` seconds and the workspace's ``RunLimits``."""

    async def close(self) -> None:
        """The attempt that opened it has ended (an ephemeral workspace is removed)."""
        return None


class Workspace(abc.ABC):
    """What ``ctx.use_workspace`` takes: opened by every attempt for its conversation."""

    limits: RunLimits = RunLimits()

    @abc.abstractmethod
    async def open(
        self, conversation_id: str, *, submission_id: str, attempt: int
    ) -> OpenWorkspace:
        """The workspace of ``conversation_id`` (``"agent/id"``) for this attempt of that
        submission."""


async def close_all(
    opened: Iterable[OpenWorkspace], log: logging.Logger | logging.LoggerAdapter[logging.Logger]
) -> None:
    """Close every workspace in ``opened``. A close that fails is logged and the rest still
    close; a cancelled one (a shutdown) does not stop the rest either: the cancellation goes on
    once all have been closed, so no ephemeral directory outlives its attempt."""
    cancelled: asyncio.CancelledError | None = None
    for handle in opened:
        try:
            await handle.close()
        except asyncio.CancelledError as exc:
            cancelled = exc
        except Exception:
            log.exception("closing a workspace failed")
    if cancelled is not None:
        raise cancelled
