"""A FUSE file system that forgets what was not fsynced, for power cuts (after Jepsen's LazyFS).

    python lazyfs.py BACKING MOUNTPOINT

mounts BACKING at MOUNTPOINT. Writes and truncations of a file's contents stay in this process's
memory, as a kernel page cache would hold them, until the file is fsynced (or fdatasynced): only
then do they reach BACKING. Closing a file does not sync it. A power cut is therefore: SIGKILL
the programs using the mount, SIGKILL this process (its memory — every unsynced write — is gone),
``umount`` the dead mount, and mount BACKING again with a new process.

Simplifications, all on the side of keeping data: file creation, removal and renames reach BACKING
at once (as if the directory were always synced), and only contents are held back. The whole file
system is served under one lock, one request at a time. On SIGUSR1 it prints to stderr how many
files and bytes are waiting for a sync, so a test can see the cut will drop something.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]

PAGE = 4096


@dataclass
class Unsynced:
    """A file's contents as its users see them: the backing file's bytes below ``cut`` (zeros
    past it, after a truncation), with ``pages`` written over them, ``size`` bytes long."""

    size: int
    cut: int
    pages: dict[int, bytearray] = field(default_factory=dict)


class LazyFS(Operations):  # type: ignore[misc]
    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self.unsynced: dict[str, Unsynced] = {}
        self.mutex = threading.Lock()

    def __call__(self, op: str, path: str, *args: Any) -> Any:
        with self.mutex:
            try:
                return super().__call__(op, path, *args)
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None

    def real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # --- held-back contents ---------------------------------------------------------------
    def held(self, path: str) -> Unsynced:
        if path not in self.unsynced:
            size = os.path.getsize(self.real(path))
            self.unsynced[path] = Unsynced(size=size, cut=size)
        return self.unsynced[path]

    def backing_bytes(self, path: str, held: Unsynced, start: int, end: int) -> bytes:
        """What the backing file holds in [start, end), zeros past ``cut`` or its end."""
        stop = min(end, held.cut)
        data = b""
        if stop > start:
            fd = os.open(self.real(path), os.O_RDONLY)
            try:
                data = os.pread(fd, stop - start, start)
            finally:
                os.close(fd)
        return data.ljust(end - start, b"\0")

    def page(self, path: str, held: Unsynced, n: int) -> bytearray:
        if n not in held.pages:
            held.pages[n] = bytearray(self.backing_bytes(path, held, n * PAGE, (n + 1) * PAGE))
            tail = held.size - n * PAGE  # bytes past the size read as zeros when it grows again
            if 0 <= tail < PAGE:
                held.pages[n][tail:] = bytes(PAGE - tail)
        return held.pages[n]

    def sync(self, path: str) -> None:
        held = self.unsynced.pop(path, None)
        fd = os.open(self.real(path), os.O_WRONLY)
        try:
            if held is not None:
                os.ftruncate(fd, min(held.cut, os.fstat(fd).st_size))
                for n, data in sorted(held.pages.items()):
                    os.pwrite(fd, bytes(data[: max(0, held.size - n * PAGE)]), n * PAGE)
                os.ftruncate(fd, held.size)
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- contents ---------------------------------------------------------------------------
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        held = self.unsynced.get(path)
        if held is None:
            return os.pread(fh, size, offset)
        end = min(offset + size, held.size)
        if end <= offset:
            return b""
        out = bytearray(self.backing_bytes(path, held, offset, end))
        for n in range(offset // PAGE, (end - 1) // PAGE + 1):
            if n in held.pages:
                lo, hi = max(offset, n * PAGE), min(end, (n + 1) * PAGE)
                out[lo - offset : hi - offset] = held.pages[n][lo - n * PAGE : hi - n * PAGE]
        return bytes(out)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        held = self.held(path)
        at = offset
        while at < offset + len(data):
            n = at // PAGE
            page = self.page(path, held, n)
            take = min(offset + len(data), (n + 1) * PAGE) - at
            page[at - n * PAGE : at - n * PAGE + take] = data[at - offset : at - offset + take]
            at += take
        held.size = max(held.size, offset + len(data))
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        held = self.held(path)
        if length < held.size:
            for n in [n for n in held.pages if n * PAGE >= length]:
                del held.pages[n]
            if length % PAGE and length // PAGE in held.pages:
                page = held.pages[length // PAGE]
                page[length % PAGE :] = bytes(PAGE - length % PAGE)
            held.cut = min(held.cut, length)
        held.size = length

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self.sync(path)

    def flush(self, path: str, fh: int) -> None:
        pass  # a close is not a sync

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self.real(path))
        attrs = {
            key: getattr(st, key)
            for key in (
                "st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                "st_atime", "st_mtime", "st_ctime",
            )
        }  # fmt: skip
        if path in self.unsynced:
            attrs["st_size"] = self.unsynced[path].size
        return attrs

    # --- names (passed through at once) -----------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        return os.open(self.real(path), os.O_RDONLY)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        os.close(os.open(self.real(path), os.O_WRONLY | os.O_CREAT, mode))
        return os.open(self.real(path), os.O_RDONLY)

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def unlink(self, path: str) -> None:
        self.unsynced.pop(path, None)
        os.unlink(self.real(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self.real(old), self.real(new))
        self.unsynced.pop(new, None)
        if old in self.unsynced:
            self.unsynced[new] = self.unsynced.pop(old)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self.real(path))]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self.real(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self.real(path))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self.real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self.real(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self.real(path), times)

    def access(self, path: str, amode: int) -> None:
        if not os.access(self.real(path), amode):
            raise FuseOSError(errno.EACCES)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        pass  # names are never held back

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self.real(path))
        names = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {key: getattr(st, key) for key in (*names, "f_flag", "f_frsize", "f_namemax")}

    def report(self, *_: Any) -> None:
        waiting = sum(len(h.pages) * PAGE for h in self.unsynced.values())
        print(f"unsynced: {len(self.unsynced)} files, {waiting} bytes", file=sys.stderr, flush=True)


def main() -> None:
    backing, mountpoint = sys.argv[1], sys.argv[2]
    fs = LazyFS(backing)
    signal.signal(signal.SIGUSR1, fs.report)
    FUSE(fs, mountpoint, foreground=True, nothreads=True)


if __name__ == "__main__":
    main()
