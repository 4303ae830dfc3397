"""Keeping file access inside a workspace directory.

A path is resolved (``..`` and symbolic links included) and refused when the result is not under
the workspace's top. The file is then opened one component at a time from the top with
``O_NOFOLLOW``, so a link swapped in after the check (by a ``run`` command, say) is refused too
instead of being followed out.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from hearth.errors import PathOutsideWorkspace, WorkspaceError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def parts_inside(top: str, path: str) -> list[str]:
    """The components of ``path`` below ``top`` (a resolved directory) once resolved; empty for
    the top itself. ``PathOutsideWorkspace`` when it leads out."""
    if not isinstance(path, str) or path == "" or "\x00" in path:
        raise WorkspaceError(f"{path!r} is not a usable path")
    if os.path.isabs(path):
        raise PathOutsideWorkspace(
            f"{path!r} is an absolute path; give a path relative to the workspace"
        )
    resolved = os.path.realpath(os.path.join(top, path))
    if resolved == top:
        return []
    if not resolved.startswith(top + os.sep):
        raise PathOutsideWorkspace(f"{path!r} leads outside the workspace")
    return resolved[len(top) + 1 :].split(os.sep)


@contextlib.contextmanager
def open_dir(top: str, parts: list[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``top/parts…``, walked without following links; missing
    directories are made when ``create``."""
    fd = os.open(top, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    except OSError as exc:
        raise _explain(exc, "/".join(parts) or ".") from None
    finally:
        os.close(fd)


def read_text(top: str, path: str) -> str:
    parts = parts_inside(top, path)
    if not parts:
        raise WorkspaceError(f"{path!r} is a directory")
    with open_dir(top, parts[:-1]) as dir_fd:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            raise _explain(exc, path) from None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkspaceError(f"{path!r} is not UTF-8 text") from None


def write_text(top: str, path: str, content: str) -> int:
    parts = parts_inside(top, path)
    if not parts:
        raise WorkspaceError(f"{path!r} is a directory")
    data = content.encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with open_dir(top, parts[:-1], create=True) as dir_fd:
        try:
            fd = os.open(parts[-1], flags, 0o666, dir_fd=dir_fd)
        except OSError as exc:
            raise _explain(exc, path) from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return len(data)


def list_tree(top: str, path: str) -> list[str]:
    parts = parts_inside(top, path)
    prefix = "/".join(parts)
    found: list[str] = []

    def walk(fd: int, rel: str) -> None:
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                found.append(name + "/")
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                try:
                    walk(sub, name)
                finally:
                    os.close(sub)
            else:
                found.append(name)

    with open_dir(top, parts) as fd:
        try:
            walk(fd, prefix)
        except OSError as exc:
            raise _explain(exc, path) from None
    return found


def _explain(exc: OSError, path: str) -> WorkspaceError:
    if exc.errno == errno.ELOOP:
        return PathOutsideWorkspace(f"{path!r} goes through a symbolic link; it is not followed")
    if exc.errno == errno.ENOENT:
        return WorkspaceError(f"{path!r} does not exist")
    if exc.errno == errno.ENOTDIR:
        return WorkspaceError(f"{path!r}: a part of it is not a directory")
    if exc.errno == errno.EISDIR:
        return WorkspaceError(f"{path!r} is a directory")
    return WorkspaceError(f"{path!r}: {exc.strerror or exc}")
