"""``ctx.use_workspace`` in a running app (SPEC §16): the built-in tools, ``ctx.workspace`` in
a tool of your own, and every refusal reaching the model as an error outcome."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import hearth
from hearth.providers.base import ModelRequest, ToolResult
from hearth.records import Record, SubmissionSettled, ToolOutcome
from hearth.testing import ScriptedModel, Step, call, calls, reply
from hearth.workspace_tools import READ_LIMIT

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def coder(workspace: hearth.Workspace, *tools: hearth.Tool, run: bool = False) -> hearth.Agent:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/coder")
        ctx.use_workspace(workspace, run=run)
        for t in tools:
            ctx.use_tool(t)
        return "You edit files."

    return hearth.Agent(render, name="coder")


async def play(agent: hearth.Agent, script: list[Step]) -> list[Record]:
    app = hearth.App([agent], db="memory", providers=[ScriptedModel("coder", script)])
    async with app.run() as rt:
        receipt = await rt.dispatch("coder", "c-1", "go")
        await rt.read(receipt, timeout=30)
        return await rt.history("coder", "c-1")


def outcomes(records: list[Record]) -> dict[str, ToolOutcome]:
    return {r.tool_call_id: r for r in records if isinstance(r, ToolOutcome)}


def refused(outcome: ToolOutcome, error: str) -> bool:
    content = outcome.content
    return outcome.is_error and content["type"] == "exception" and error in content["message"]


def seen(request: ModelRequest) -> Step:
    """The final reply: what each tool result looked like to the model."""
    parts = []
    for m in request.messages:
        if isinstance(m, ToolResult):
            parts.append(f"{m.tool_call_id}={'error' if m.is_error else 'ok'}")
    return reply(" ".join(parts))


async def test_the_built_in_tools_work_in_the_conversations_directory(tmp_path: Path) -> None:
    ws = hearth.LocalWorkspace(tmp_path / "ws")
    records = await play(
        coder(ws),
        [
            calls(call("write_file", id="w", path="src/a.txt", content="hello")),
            calls(call("read_file", id="r", path="src/a.txt"), call("list_files", id="l")),
            seen,
        ],
    )
    got = outcomes(records)
    assert got["w"].content == {"path": "src/a.txt", "bytes": 5}
    assert got["r"].content == "hello"
    assert got["l"].content == {"files": ["src/", "src/a.txt"]}
    assert (tmp_path / "ws" / "coder" / "c-1" / "src" / "a.txt").read_text() == "hello"
    (done,) = [r for r in records if isinstance(r, SubmissionSettled)]
    assert done.outcome == "completed" and done.reply == "w=ok r=ok l=ok"


async def test_read_file_reads_only_the_head_of_a_big_file(tmp_path: Path) -> None:
    """It read the whole file, then kept 200,000 characters: a 1 GB file took two of memory."""
    top = tmp_path / "ws" / "coder" / "c-1"
    top.mkdir(parents=True)
    size = 64 * 2**20
    (top / "big.log").write_bytes(b"a" * (size - 2) + b"\xff\xfe")  # a tail never read
    tracemalloc.start()
    try:
        records = await play(
            coder(hearth.LocalWorkspace(tmp_path / "ws")),
            [calls(call("read_file", id="r", path="big.log")), seen],
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    shown = outcomes(records)["r"].content
    assert (
        shown == "a" * READ_LIMIT + f"\n[file truncated: {size - READ_LIMIT} more bytes were cut]"
    )
    assert peak < size / 4, f"reading the head of a 64 MiB file took {peak:,} bytes at its peak"


@pytest.mark.parametrize("kind", ["durable", "ephemeral"])
async def test_parallel_calls_of_one_batch_share_the_attempts_workspace(
    tmp_path: Path, kind: str
) -> None:
    """Each call opened the workspace: an ephemeral one's opening wiped what a sibling call had
    written (or failed with FileExistsError), so files the model was told were written were gone."""
    ws = (hearth.LocalWorkspace if kind == "durable" else hearth.EphemeralWorkspace)(tmp_path)
    writes = [call("write_file", id=f"w{n}", path=f"{n}.txt", content=str(n)) for n in range(4)]
    records = await play(coder(ws), [calls(*writes), calls(call("list_files", id="l")), seen])
    got = outcomes(records)
    assert got["l"].content == {"files": ["0.txt", "1.txt", "2.txt", "3.txt"]}
    assert not any(o.is_error for o in got.values())


@pytest.mark.parametrize("path", ["../../escape.txt", "/etc/passwd"])
async def test_a_path_outside_is_an_error_outcome_the_model_sees(tmp_path: Path, path: str) -> None:
    ws = hearth.LocalWorkspace(tmp_path / "ws")
    records = await play(
        coder(ws),
        [
            calls(
                call("write_file", id="w", path=path, content="x"),
                call("read_file", id="r", path=path),
            ),
            seen,
        ],
    )
    got = outcomes(records)
    assert refused(got["w"], "PathOutsideWorkspace") and refused(got["r"], "PathOutsideWorkspace")
    assert not (tmp_path / "escape.txt").exists()
    (done,) = [r for r in records if isinstance(r, SubmissionSettled)]
    assert done.outcome == "completed" and done.reply == "w=error r=error"


@hearth.tool
async def save_report(path: str, ctx: hearth.ToolContext) -> str:
    """Save a report where the model says."""
    await ctx.workspace.write_file(path, "report")
    return path


async def test_a_tool_of_your_own_writes_through_ctx_workspace_and_is_confined_too(
    tmp_path: Path,
) -> None:
    ws = hearth.LocalWorkspace(tmp_path / "ws")
    records = await play(
        coder(ws, save_report),
        [
            calls(
                call("save_report", id="in", path="out/report.txt"),
                call("save_report", id="out", path="../../../report.txt"),
            ),
            seen,
        ],
    )
    got = outcomes(records)
    assert got["in"].content == "out/report.txt" and not got["in"].is_error
    assert refused(got["out"], "PathOutsideWorkspace")
    assert (tmp_path / "ws" / "coder" / "c-1" / "out" / "report.txt").read_text() == "report"
    assert not (tmp_path / "report.txt").exists()


async def test_a_symbolic_link_made_by_run_does_not_lead_the_file_tools_out(
    tmp_path: Path, bwrap: str
) -> None:
    ws = hearth.LocalWorkspace(tmp_path / "ws")
    records = await play(
        coder(ws, run=True),
        [
            calls(call("run", id="ln", command="ln -s /etc etc && ln -s / top && echo linked")),
            calls(
                call("read_file", id="r", path="etc/hostname"),
                call("write_file", id="w", path="top/tmp/pwned", content="x"),
            ),
            seen,
        ],
    )
    got = outcomes(records)
    assert got["ln"].content == {"exit_code": 0, "output": "linked\n"}
    assert refused(got["r"], "PathOutsideWorkspace") and refused(got["w"], "PathOutsideWorkspace")
    assert not exists(Path("/tmp/pwned"))


async def test_without_bubblewrap_run_is_an_error_outcome_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    ws = hearth.LocalWorkspace(tmp_path / "ws")
    records = await play(coder(ws, run=True), [calls(call("run", id="x", command="echo hi")), seen])
    outcome = outcomes(records)["x"]
    assert refused(outcome, "SandboxUnavailable")
    assert (
        "bubblewrap" in outcome.content["message"] and "sandbox=False" in outcome.content["message"]
    )


def exists(path: Path) -> bool:
    return path.exists()


def tool_names(request: ModelRequest) -> list[str]:
    return sorted(t.name for t in request.tools)


async def test_run_is_offered_only_when_asked_for(tmp_path: Path) -> None:
    offered: list[list[str]] = []

    def note(request: ModelRequest) -> Step:
        offered.append(tool_names(request))
        return reply("ok")

    ws = hearth.LocalWorkspace(tmp_path / "ws")
    for run in (False, True):
        app = hearth.App(
            [coder(ws, run=run)], db="memory", providers=[ScriptedModel("coder", note)]
        )
        async with app.run() as rt:
            await rt.read(await rt.dispatch("coder", "c-1", "go"), timeout=30)
    assert offered == [
        ["list_files", "read_file", "write_file"],
        ["list_files", "read_file", "run", "write_file"],
    ]


@hearth.tool
async def has_workspace(ctx: hearth.ToolContext) -> bool:
    """Whether a workspace is there."""
    return ctx.has_workspace


async def test_an_agent_without_a_workspace_has_none_in_its_tools() -> None:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/coder")
        ctx.use_tool(has_workspace)
        return "plain"

    agent = hearth.Agent(render, name="coder")
    records = await play(agent, [calls(call("has_workspace", id="h")), reply("done")])
    assert outcomes(records)["h"].content is False


@hearth.tool
async def read_workspace(ctx: hearth.ToolContext) -> str:
    """Read a file of the workspace the agent may not have."""
    return await ctx.workspace.read_file("notes.txt")


async def test_reading_the_workspace_an_agent_has_not_declared_says_what_to_declare() -> None:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/coder")
        ctx.use_tool(read_workspace)
        return "plain"

    agent = hearth.Agent(render, name="coder")
    records = await play(agent, [calls(call("read_workspace", id="r")), reply("done")])
    outcome = outcomes(records)["r"]
    assert refused(outcome, "declare one with ctx.use_workspace")


def test_a_root_that_is_not_writable_is_a_configuration_error(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for root in (a_file, a_file / "below", Path("/proc/hearth-workspaces")):
        with pytest.raises(hearth.ConfigurationError, match="not a writable directory"):
            hearth.LocalWorkspace(root)
        with pytest.raises(hearth.ConfigurationError, match="not a writable directory"):
            hearth.EphemeralWorkspace(root)


async def test_use_workspace_refuses_what_is_not_a_workspace(tmp_path: Path) -> None:
    agent = coder(str(tmp_path))  # type: ignore[arg-type]
    app = hearth.App([agent], db="memory", providers=[ScriptedModel("coder", [reply("x")])])
    async with app.run() as rt:
        receipt = await rt.dispatch("coder", "c-1", "go")
        with pytest.raises(
            hearth.SubmissionFailed, match=r"use_workspace expects a hearth\.Workspace"
        ):
            await rt.read(receipt, timeout=30)


def test_run_limits_refuse_nonsense() -> None:
    bad: list[dict[str, Any]] = [
        {"max_timeout": 0},
        {"max_timeout": float("nan")},  # (it bounded nothing: min(1e9, nan) is 1e9)
        {"max_timeout": float("inf")},
        {"max_timeout": True},
        {"output_bytes": 0},
        {"processes": True},
    ]
    for kwargs in bad:
        with pytest.raises(hearth.ConfigurationError):
            hearth.RunLimits(**kwargs)


@hearth.tool(durable=True)
async def draft(ctx: hearth.ToolContext) -> dict[str, Any]:
    """Write a draft, wait for a go-ahead, then list the workspace."""
    workspace = ctx.workspace

    async def write() -> int:
        return await workspace.write_file("draft.txt", "first draft")

    await ctx.step.do("write", write)  # replayed, not run, after the wait
    await ctx.step.wait("go-ahead")
    return {"files": await workspace.list_files()}


async def until_waiting(rt: hearth.Runtime, submission_id: str) -> None:
    for _ in range(2000):
        if (await rt.submission(submission_id)).status == "waiting":
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the submission never started waiting")


@pytest.mark.parametrize(("kind", "files"), [("durable", ["draft.txt"]), ("ephemeral", [])])
async def test_after_a_durable_wait_an_ephemeral_workspace_is_fresh_again(
    tmp_path: Path, kind: str, files: list[str]
) -> None:
    ws: hearth.Workspace = (
        hearth.LocalWorkspace(tmp_path / "ws")
        if kind == "durable"
        else hearth.EphemeralWorkspace(tmp_path / "ws")
    )
    agent = coder(ws, draft)
    script = [calls(call("draft", id="d")), reply("drafted")]
    app = hearth.App([agent], db="memory", providers=[ScriptedModel("coder", script)])
    async with app.run() as rt:
        receipt = await rt.dispatch("coder", "c-1", "go")
        await until_waiting(rt, receipt.submission_id)
        [wait] = await rt.waits()
        await rt.resolve("coder", "c-1", wait.wait_id, True)
        await rt.read(receipt, timeout=30)
        records = await rt.history("coder", "c-1")
    result = outcomes(records)["d"]
    assert result.attempt == 2 and result.content == {"files": files}


async def test_a_workspace_built_anew_at_every_render_is_the_same_within_an_attempt(
    tmp_path: Path,
) -> None:
    def render(ctx: hearth.AgentContext) -> str:
        ctx.use_model("scripted/coder")
        ctx.use_workspace(hearth.EphemeralWorkspace(tmp_path / "ws"))
        return "inline"

    records = await play(
        hearth.Agent(render, name="coder"),
        [
            calls(call("write_file", id="w", path="a.txt", content="kept between turns")),
            calls(call("read_file", id="r", path="a.txt")),
            seen,
        ],
    )
    assert outcomes(records)["r"].content == "kept between turns"
