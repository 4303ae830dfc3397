"""The two built-in workspaces: directories on this machine.

``LocalWorkspace(root)`` is durable: the conversation ``agent/id`` always opens ``root/agent/id``,
in every submission and every recovery attempt. ``EphemeralWorkspace()`` gives every attempt a
fresh empty directory and removes it when the attempt ends; a later attempt of the same
submission also removes what a killed one left behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path

from hearth.errors import ConfigurationError, WorkspaceError
from hearth.ids import ID_RE
from hearth.workspaces import confine
from hearth.workspaces.base import OpenWorkspace, RunLimits, RunResult, Workspace
from hearth.workspaces.sandbox import run_command

_AGENT_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_SUBMISSION_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class LocalFiles(OpenWorkspace):
    """An open workspace that is a directory on this machine."""

    def __init__(
        self, directory: Path, limits: RunLimits, *, sandbox: bool, remove_on_close: bool = False
    ) -> None:
        self._top = os.path.realpath(directory)
        self._limits = limits
        self._sandbox = sandbox
        self._remove = remove_on_close

    @property
    def path(self) -> Path:
        return Path(self._top)

    async def read_file(self, path: str) -> str:
        return await asyncio.to_thread(confine.read_text, self._top, path)

    async def read_file_head(self, path: str, limit: int) -> tuple[str, int]:
        return await asyncio.to_thread(confine.read_head, self._top, path, limit)

    async def write_file(self, path: str, content: str) -> int:
        if not isinstance(content, str):
            raise WorkspaceError("content must be text")
        return await asyncio.to_thread(confine.write_text, self._top, path, content)

    async def list_files(self, path: str = ".") -> list[str]:
        return await asyncio.to_thread(confine.list_tree, self._top, path)

    async def run(self, command: str, *, timeout: float) -> RunResult:
        return await run_command(self._top, command, timeout, self._limits, sandbox=self._sandbox)

    async def close(self) -> None:
        if not self._remove:
            return
        try:
            await asyncio.to_thread(confine.remove_tree, self._top)
        except asyncio.CancelledError:
            # Cancelled (a shutdown) before a thread took the removal, it would never run: the
            # process may exit first. Remove the directory here, then let the cancellation on.
            confine.remove_tree(self._top)
            raise


class LocalWorkspace(Workspace):
    """A durable workspace: ``root/{agent}/{id}`` for the conversation ``agent/id``.

    ``root`` is made when missing and must be writable (``ConfigurationError`` otherwise, when
    the workspace is declared). ``sandbox=False`` lets ``run`` execute commands without
    bubblewrap, unconfined, where it is not installed."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        sandbox: bool = True,
        limits: RunLimits | None = None,
    ) -> None:
        self.root = _writable_root(Path(root))
        self.sandbox = sandbox
        self.limits = _limits(limits)

    def __repr__(self) -> str:
        return f"<hearth.LocalWorkspace {self.root}>"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and _identity(other) == _identity(self)

    def __hash__(self) -> int:
        return hash(_identity(self))

    def directory(self, conversation_id: str) -> Path:
        """Where the files of ``conversation_id`` live."""
        agent, id = _split(conversation_id)
        return self.root / agent / id

    async def open(self, conversation_id: str, *, submission_id: str, attempt: int) -> LocalFiles:
        directory = self.directory(conversation_id)
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        return LocalFiles(directory, self.limits, sandbox=self.sandbox)


class EphemeralWorkspace(Workspace):
    """A fresh empty directory for every attempt, removed when the attempt ends.

    The directories live under ``root`` (default: ``hearth-ephemeral`` in the system's temporary
    directory), at ``root/{agent}/{id}/{submission}-{attempt}``."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        sandbox: bool = True,
        limits: RunLimits | None = None,
    ) -> None:
        base = Path(tempfile.gettempdir()) / "hearth-ephemeral" if root is None else Path(root)
        self.root = _writable_root(base)
        self.sandbox = sandbox
        self.limits = _limits(limits)

    def __repr__(self) -> str:
        return f"<hearth.EphemeralWorkspace {self.root}>"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and _identity(other) == _identity(self)

    def __hash__(self) -> int:
        return hash(_identity(self))

    async def open(self, conversation_id: str, *, submission_id: str, attempt: int) -> LocalFiles:
        agent, id = _split(conversation_id)
        if not _SUBMISSION_RE.fullmatch(submission_id):
            raise WorkspaceError(f"submission id {submission_id!r} cannot name a directory")
        parent = self.root / agent / id
        directory = parent / f"{submission_id}-{int(attempt)}"
        await asyncio.to_thread(_fresh, parent, directory, submission_id, attempt)
        return LocalFiles(directory, self.limits, sandbox=self.sandbox, remove_on_close=True)


def _fresh(parent: Path, directory: Path, submission_id: str, attempt: int) -> None:
    """An empty ``directory``; the directories earlier attempts of the submission left behind
    (they were killed: a finished attempt removes its own) are removed."""
    parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{submission_id}-"
    for entry in parent.iterdir():
        tail = entry.name[len(prefix) :]
        if (
            entry.name.startswith(prefix)
            and tail.isascii()
            and tail.isdigit()
            and int(tail) <= attempt
        ):
            confine.remove_tree(str(entry))
    directory.mkdir()


def _identity(ws: Workspace) -> tuple[object, ...]:
    """Two declarations of the same directory with the same settings are one workspace (an
    agent may build its workspace anew at every render)."""
    return (type(ws), getattr(ws, "root", None), getattr(ws, "sandbox", None), ws.limits)


def _split(conversation_id: str) -> tuple[str, str]:
    agent, _, id = conversation_id.partition("/")
    if not _AGENT_RE.fullmatch(agent) or not ID_RE.fullmatch(id) or id in (".", ".."):
        raise WorkspaceError(f"conversation id {conversation_id!r} cannot name a directory")
    return agent, id


def _limits(limits: RunLimits | None) -> RunLimits:
    if limits is None:
        return RunLimits()
    if not isinstance(limits, RunLimits):
        raise ConfigurationError("limits must be a hearth.RunLimits")
    return limits


_PROVEN: set[Path] = set()  # roots proven writable in this process


def _writable_root(root: Path) -> Path:
    """``root``, made when missing and proven writable by making and removing a file in it
    (once per process and root)."""
    if root.is_absolute() and root in _PROVEN:
        return root
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".hearth-probe-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigurationError(
            f"workspace root {str(root)!r} is not a writable directory ({exc.strerror or exc}); "
            "give a directory hearth's user can write"
        ) from None
    resolved = root.resolve()
    _PROVEN.update({root, resolved} if root.is_absolute() else {resolved})
    return resolved
