"""Workspaces: the files an agent works on (``ctx.use_workspace``, ``ctx.workspace``)."""

from hearth.workspaces.base import OpenWorkspace, RunLimits, RunResult, Workspace
from hearth.workspaces.local import EphemeralWorkspace, LocalWorkspace

__all__ = [
    "EphemeralWorkspace",
    "LocalWorkspace",
    "OpenWorkspace",
    "RunLimits",
    "RunResult",
    "Workspace",
]
