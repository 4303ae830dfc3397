"""The ``hearth.Workspace`` contract (SPEC §16), passed by both built-ins. A workspace of your own
(a remote sandbox, say) can run these tests by adding its factory to ``FACTORIES``.

Everything goes through the interface: files are made with ``write_file``, links with ``run``,
so nothing here depends on the workspace being a local directory."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import hearth
from hearth.workspaces.base import close_all

pytestmark = pytest.mark.anyio

Factory = Callable[[Path], hearth.Workspace]
FACTORIES: dict[str, Factory] = {
    "local": lambda tmp: hearth.LocalWorkspace(tmp / "durable"),
    "ephemeral": lambda tmp: hearth.EphemeralWorkspace(tmp / "ephemeral"),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=sorted(FACTORIES))
def declared(request: pytest.FixtureRequest, tmp_path: Path) -> hearth.Workspace:
    return FACTORIES[request.param](tmp_path)


@pytest.fixture
async def ws(declared: hearth.Workspace) -> AsyncIterator[hearth.OpenWorkspace]:
    opened = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_written_file_reads_back(ws: hearth.OpenWorkspace) -> None:
    assert await ws.write_file("notes.txt", "héllo\n") == len("héllo\n".encode())
    assert await ws.read_file("notes.txt") == "héllo\n"


async def test_the_head_of_a_file_is_its_first_characters_and_the_bytes_left(
    ws: hearth.OpenWorkspace,
) -> None:
    await ws.write_file("short.txt", "héllo")
    assert await ws.read_file_head("short.txt", 100) == ("héllo", 0)
    assert await ws.read_file_head("short.txt", 5) == ("héllo", 0)
    await ws.write_file("euros.txt", "a" + "€" * 5)  # € is three bytes
    assert await ws.read_file_head("euros.txt", 2) == ("a€", 12)
    await ws.write_file("empty.txt", "")
    assert await ws.read_file_head("empty.txt", 10) == ("", 0)
    with pytest.raises(hearth.WorkspaceError, match="does not exist"):
        await ws.read_file_head("nope.txt", 10)


async def test_writing_replaces_a_file_and_makes_missing_directories(
    ws: hearth.OpenWorkspace,
) -> None:
    await ws.write_file("src/pkg/a.py", "first version, longer")
    await ws.write_file("src/pkg/a.py", "second")
    assert await ws.read_file("src/pkg/a.py") == "second"


async def test_listing_is_recursive_sorted_and_marks_directories(ws: hearth.OpenWorkspace) -> None:
    await ws.write_file("b.txt", "")
    await ws.write_file("a/z.txt", "")
    await ws.write_file("a/y/x.txt", "")
    assert await ws.list_files() == ["a/", "a/y/", "a/y/x.txt", "a/z.txt", "b.txt"]
    assert await ws.list_files("a/y") == ["a/y/x.txt"]


async def test_a_new_workspace_is_empty(ws: hearth.OpenWorkspace) -> None:
    assert await ws.list_files() == []


async def test_reading_a_missing_file_is_a_workspace_error(ws: hearth.OpenWorkspace) -> None:
    with pytest.raises(hearth.WorkspaceError, match="does not exist"):
        await ws.read_file("nope.txt")


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "/tmp/x"])
async def test_paths_outside_are_refused(ws: hearth.OpenWorkspace, path: str) -> None:
    with pytest.raises(hearth.PathOutsideWorkspace):
        await ws.write_file(path, "x")
    with pytest.raises(hearth.PathOutsideWorkspace):
        await ws.read_file(path)
    with pytest.raises(hearth.PathOutsideWorkspace):
        await ws.list_files(path)


async def test_a_dot_dot_that_stays_inside_is_allowed(ws: hearth.OpenWorkspace) -> None:
    await ws.write_file("a/../b.txt", "inside")
    assert await ws.read_file("b.txt") == "inside"


async def test_symbolic_links_pointing_outside_are_refused(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    made = await ws.run("ln -s /etc out && ln -s /etc/passwd pw && ln -s a.txt in", timeout=30)
    assert made.exit_code == 0, made.output
    for path in ("out/passwd", "pw"):
        with pytest.raises(hearth.PathOutsideWorkspace):
            await ws.read_file(path)
    with pytest.raises(hearth.PathOutsideWorkspace):
        await ws.write_file("out/hearth-was-here", "x")
    with pytest.raises(hearth.PathOutsideWorkspace):
        await ws.list_files("out")
    # A link that stays inside is followed.
    await ws.write_file("a.txt", "through the link")
    assert await ws.read_file("in") == "through the link"


async def test_run_sees_the_files_and_reports_the_exit_code(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    await ws.write_file("in.txt", "three\nlines\nhere\n")
    result = await ws.run("wc -l < in.txt; echo made > out.txt; exit 3", timeout=30)
    assert result.exit_code == 3
    assert result.output.strip() == "3"
    assert not result.timed_out
    assert await ws.read_file("out.txt") == "made\n"


async def test_run_output_is_cut_at_the_limit_with_a_note(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    limit = hearth.RunLimits().output_bytes  # both built-ins use the default limits here
    result = await ws.run(f"head -c {limit + 5000} /dev/zero | tr '\\0' a", timeout=30)
    assert result.exit_code == 0
    assert result.output == "a" * limit
    assert result.cut_bytes == 5000
    shown = result.as_json()["output"]
    assert isinstance(shown, str) and shown.endswith("[output truncated: 5000 more bytes were cut]")


async def test_run_is_killed_at_its_timeout(ws: hearth.OpenWorkspace, bwrap: str) -> None:
    # Output from before the kill is kept (3 s leaves the sandbox ample time to start).
    result = await ws.run("echo started; sleep 60", timeout=3)
    assert result.timed_out
    assert result.exit_code is None
    assert "started" in result.output


async def test_the_durable_workspace_opens_the_same_files_for_every_attempt(
    tmp_path: Path,
) -> None:
    declared = hearth.LocalWorkspace(tmp_path / "root")
    first = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    await first.write_file("kept.txt", "from attempt 1")
    await first.close()
    later = await declared.open("coder/c-1", submission_id="s_2", attempt=3)
    assert await later.read_file("kept.txt") == "from attempt 1"
    other = await declared.open("coder/c-2", submission_id="s_3", attempt=1)
    assert await other.list_files() == []
    assert (tmp_path / "root" / "coder" / "c-1" / "kept.txt").read_text() == "from attempt 1"


async def test_the_ephemeral_workspace_is_fresh_for_every_attempt_and_removed_after(
    tmp_path: Path,
) -> None:
    declared = hearth.EphemeralWorkspace(tmp_path / "root")
    first = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    await first.write_file("lost.txt", "from attempt 1")
    assert first.path is not None and first.path.exists()
    await first.close()
    assert not first.path.exists()
    second = await declared.open("coder/c-1", submission_id="s_1", attempt=2)
    assert await second.list_files() == []
    await second.close()


async def test_an_ephemeral_workspace_closed_by_a_shutdown_is_still_removed(
    tmp_path: Path,
) -> None:
    """A shutdown cancels an attempt while it closes its workspace. With every executor thread
    busy, the removal has not started when the cancellation comes; it must happen anyway (the
    process may exit before a thread would have taken it)."""
    declared = hearth.EphemeralWorkspace(tmp_path / "root")
    opened = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    await opened.write_file("notes.txt", "x")
    assert opened.path is not None
    loop = asyncio.get_running_loop()
    busy, release = concurrent.futures.ThreadPoolExecutor(max_workers=1), threading.Event()
    loop.set_default_executor(busy)
    blocker = loop.run_in_executor(None, release.wait, 10)
    try:
        closing = asyncio.create_task(opened.close())
        await asyncio.sleep(0)  # the removal is queued behind the blocker
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not opened.path.exists()
    finally:
        release.set()
        await blocker


async def test_an_ephemeral_attempt_clears_what_a_killed_attempt_left(tmp_path: Path) -> None:
    declared = hearth.EphemeralWorkspace(tmp_path / "root")
    killed = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    await killed.write_file("left.txt", "x")  # never closed: its process died
    assert killed.path is not None
    second = await declared.open("coder/c-1", submission_id="s_1", attempt=2)
    assert not killed.path.exists()
    assert await second.list_files() == []
    await second.close()


async def test_run_ends_with_its_command_even_when_a_background_child_holds_the_output(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    result = await ws.run("sleep 60 & echo done", timeout=30)
    assert result.exit_code == 0 and not result.timed_out
    assert result.output == "done\n"


async def test_a_shutdown_that_cancels_one_close_still_closes_the_rest(tmp_path: Path) -> None:
    """An attempt that opened several workspaces closes them all when a shutdown cancels it in
    the first close; the cancellation still reaches the attempt afterwards."""
    declared = hearth.EphemeralWorkspace(tmp_path / "root")
    first = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    second = await declared.open("coder/c-2", submission_id="s_2", attempt=1)
    assert first.path is not None and second.path is not None
    loop = asyncio.get_running_loop()
    busy, release = concurrent.futures.ThreadPoolExecutor(max_workers=1), threading.Event()
    loop.set_default_executor(busy)
    blocker = loop.run_in_executor(None, release.wait, 10)
    try:
        closing = asyncio.create_task(close_all([first, second], logging.getLogger("test")))
        await asyncio.sleep(0)  # the first removal is queued behind the blocker
        closing.cancel()
        release.set()  # the second close's removal can run on the thread
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not first.path.exists()
        assert not second.path.exists()
    finally:
        release.set()
        await blocker


async def test_a_pipe_is_refused_instead_of_blocking_for_ever(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    """Reading a FIFO waited for a writer in a thread nothing could stop: the submission never
    settled and the process could not exit."""
    assert (await ws.run("mkfifo pipe", timeout=10)).exit_code == 0
    with pytest.raises(hearth.WorkspaceError, match="not a regular file"):
        await asyncio.wait_for(ws.read_file("pipe"), 5)
    with pytest.raises(hearth.WorkspaceError, match="not a regular file"):
        await asyncio.wait_for(ws.write_file("pipe", "x"), 5)
    for directory in (".", "new/", "new/."):  # the last two made a file named "new"
        with pytest.raises(hearth.WorkspaceError, match="is a directory"):
            await ws.write_file(directory, "x")
    assert await ws.list_files() == ["pipe"]


async def test_reading_a_directory_names_it_and_a_file_with_a_slash_is_no_file(
    ws: hearth.OpenWorkspace,
) -> None:
    """``read_file("notes")`` of a directory said "'.' is a directory" (its parent), and
    ``read_file("big.txt/")`` read the file, where a path ending in "/" names a directory."""
    await ws.write_file("notes/monday.md", "hi")
    await ws.write_file("big.txt", "data")
    for path in ("notes", "notes/"):
        with pytest.raises(hearth.WorkspaceError, match=f"^{path!r} is a directory"):
            await ws.read_file(path)
        with pytest.raises(hearth.WorkspaceError, match=f"^{path!r} is a directory"):
            await ws.read_file_head(path, 10)
    with pytest.raises(hearth.WorkspaceError, match=r"'big.txt/' ends in '/', but 'big.txt'"):
        await ws.read_file("big.txt/")
    with pytest.raises(hearth.WorkspaceError, match="nothere"):
        await ws.read_file("nothere/")
    assert await ws.read_file("big.txt") == "data"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """The file was truncated, then written: a write that failed half way (here a file size
    limit; a full disk alike) lost the old content and left half of the new."""
    notes = tmp_path / "notes.md"
    notes.write_text("IMPORTANT NOTES\n" * 100)
    script = (
        "import resource, signal, sys\n"
        "from hearth.workspaces import confine\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))\n"
        "try:\n"
        "    confine.write_text(sys.argv[1], 'notes.md', 'NEW ' * 5000)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("WorkspaceError 'notes.md'"), done.stdout + done.stderr
    assert notes.read_text() == "IMPORTANT NOTES\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]  # no temporary file left


async def test_a_tree_thousands_deep_is_listed_and_removed(
    ws: hearth.OpenWorkspace, bwrap: str
) -> None:
    """Walks and removals recursed: a command that nested 1,500 directories broke ``run`` and
    ``list_files`` of a durable workspace for good (RecursionError), and an ephemeral one
    was left on disk."""
    deep = "for i in $(seq 1500); do mkdir d && cd d; done; touch leaf"
    assert (await ws.run(deep, timeout=60)).exit_code == 0
    listed = await ws.list_files()
    assert len(listed) == 1501 and listed[-1].endswith("/d/leaf")
    assert (await ws.run("chmod 555 d", timeout=10)).exit_code == 0  # read-only, as a command may
    assert (await ws.run("chmod 755 d && rm -rf d", timeout=60)).exit_code == 0  # it repairs
    assert await ws.list_files() == []


async def test_closing_removes_an_ephemeral_tree_however_deep_and_read_only(
    tmp_path: Path, bwrap: str
) -> None:
    declared = hearth.EphemeralWorkspace(tmp_path / "root")
    opened = await declared.open("coder/c-1", submission_id="s_1", attempt=1)
    made = "for i in $(seq 1500); do mkdir d && cd d; done; touch leaf; cd ..; chmod 555 ."
    assert (
        await opened.run(f"mkdir keep && echo x > keep/f && chmod 555 keep; {made}", timeout=60)
    ).exit_code == 0
    assert opened.path is not None
    await opened.close()
    assert not opened.path.exists()
