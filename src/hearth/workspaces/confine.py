"""Keeping file access inside a workspace directory.

A path is resolved (``..`` and symbolic links included) and refused when the result is not under
the workspace's top. The file is then opened one component at a time from the top with
``O_NOFOLLOW``, so a link swapped in after the check (by a ``run`` command, say) is refused too
instead of being followed out.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import stat
import subprocess
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
    text, _ = read_head(top, path, None)
    return text


def read_head(top: str, path: str, limit: int | None) -> tuple[str, int]:
    """The text (UTF-8) of the file at ``path``: all of it, or its first ``limit`` characters
    read without the rest (at most four bytes each), with how many bytes are left unread."""
    parts = parts_inside(top, path)
    if not parts or path in (".", ".."):
        raise WorkspaceError(f"{path!r} is a directory")
    with open_dir(top, parts[:-1]) as dir_fd:
        try:
            # Non-blocking: opening a FIFO would wait for a writer, in a thread nothing can stop.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(parts[-1], flags, dir_fd=dir_fd)
        except OSError as exc:
            raise _explain(exc, path) from None
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            # (reading it would fail inside ``open_dir``, which names the parent instead)
            os.close(fd)
            raise WorkspaceError(f"{path!r} is a directory")
        if _names_a_directory(path):  # "notes.md/": a file where the path says a directory
            os.close(fd)
            raise WorkspaceError(f"{path!r} ends in '/', but {parts[-1]!r} is a file")
        with os.fdopen(fd, "rb") as f:
            _regular(f.fileno(), path)
            data = f.read() if limit is None else f.read(4 * limit)
            size = os.fstat(f.fileno()).st_size
    try:
        if limit is None:
            return data.decode("utf-8"), 0
        # A character cut in two at the end of the head is not an error: it is left unread.
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) >= size)
    except UnicodeDecodeError:
        raise WorkspaceError(f"{path!r} is not UTF-8 text") from None
    text = text[:limit]
    return text, max(0, size - len(text.encode("utf-8")))


def write_text(top: str, path: str, content: str) -> int:
    parts = parts_inside(top, path)
    if not parts or _names_a_directory(path):
        # ("dir/" or "dir/." resolve to "dir": they would have made a file of that name.)
        raise WorkspaceError(f"{path!r} is a directory")
    data = content.encode("utf-8")
    name = parts[-1]
    with open_dir(top, parts[:-1], create=True) as dir_fd:
        try:
            _replaceable(dir_fd, name, path)
            # Written beside it, then renamed over it: a failed write (a full disk, a size
            # limit, a crash) leaves the old file as it was, never half of the new one.
            temp = f".{name[:200]}.hearth-{os.getpid()}-{os.urandom(4).hex()}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
        except OSError as exc:
            raise _explain(exc, path) from None
    return len(data)


def _names_a_directory(path: str) -> bool:
    return path.endswith(("/", "/.", "/..")) or path in (".", "..")


def _regular(fd: int, path: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise WorkspaceError(f"{path!r} is not a regular file (a pipe, a device or a socket)")


def _replaceable(dir_fd: int, name: str, path: str) -> None:
    """Refuse to replace what is not a regular file (a directory, a pipe, a link)."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(found.st_mode):
        raise PathOutsideWorkspace(f"{path!r} is a symbolic link; it is not followed")
    if stat.S_ISDIR(found.st_mode):
        raise WorkspaceError(f"{path!r} is a directory")
    if not stat.S_ISREG(found.st_mode):
        raise WorkspaceError(f"{path!r} is not a regular file (a pipe, a device or a socket)")


def list_tree(top: str, path: str) -> list[str]:
    parts = parts_inside(top, path)
    prefix = "/".join(parts)
    found: list[str] = []
    with open_dir(top, parts) as fd:
        try:
            _walk(fd, prefix, found)
        except OSError as exc:
            raise _explain(exc, path) from None
    return found


def _walk(top_fd: int, prefix: str, found: list[str]) -> None:
    """Everything under ``top_fd``, sorted depth first, into ``found``. Without recursion (a
    command may nest directories thousands deep) and never following a link: each directory is
    opened from its parent's descriptor, whose own list of names is read whole first, so at most
    one descriptor is open besides ``top_fd``."""
    # A stack of (path to the directory, its entries not yet listed, reversed).
    pending: list[tuple[list[str], list[tuple[str, bool]]]] = [([], _entries(top_fd))]
    while pending:
        where, entries = pending[-1]
        if not entries:
            pending.pop()
            continue
        name, is_dir = entries.pop()
        rel = "/".join([prefix, *where, name] if prefix else [*where, name])
        if not is_dir:
            found.append(rel)
            continue
        found.append(rel + "/")
        try:
            with _opened(top_fd, [*where, name]) as sub:
                pending.append(([*where, name], _entries(sub)))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                raise  # (a directory that was removed, or swapped for a link, meanwhile)


def _entries(fd: int) -> list[tuple[str, bool]]:
    with os.scandir(fd) as it:
        listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    return sorted(listed, reverse=True)


@contextlib.contextmanager
def _opened(top_fd: int, parts: list[str]) -> Iterator[int]:
    fd = os.dup(top_fd)
    try:
        for part in parts:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and everything in it, however deep and whatever the modes
    a command left (a read-only directory keeps its entries from a user who is not root);
    what cannot be removed stays. GNU coreutils walk the tree without recursion and without
    following links."""
    if not os.path.lexists(path):
        return
    for argv in (
        ["chmod", "-R", "u+rwX", "--", path],
        ["rm", "-rf", "--one-file-system", "--", path],
    ):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


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
