"""The built-in file tools ``ctx.use_workspace`` offers: ``read_file``, ``write_file``,
``list_files`` and (when asked for) ``run``. Each works through ``ctx.workspace``; an error there
(a path outside, a missing file, no sandbox) is an error outcome the model reads."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from hearth.tools import Tool, ToolContext, tool

READ_LIMIT = 200_000  # characters of a file returned to the model
LIST_LIMIT = 2_000  # entries of a listing returned to the model

Relative = Annotated[str, Field(description="a path relative to the workspace")]


@tool(name="read_file")
async def read_file(path: Relative, ctx: ToolContext) -> str:
    """Read a text file of the workspace."""
    # Only the head is read: a file of a gigabyte cost two of memory, to keep 200,000
    # characters of it.
    text, cut = await ctx.workspace.read_file_head(path, READ_LIMIT)
    if cut:
        return text + f"\n[file truncated: {cut} more bytes were cut]"
    return text


@tool(name="write_file")
async def write_file(path: Relative, content: str, ctx: ToolContext) -> dict[str, Any]:
    """Write a text file of the workspace, replacing it if it exists; missing directories are
    made."""
    written = await ctx.workspace.write_file(path, content)
    return {"path": path, "bytes": written}


@tool(name="list_files")
async def list_files(ctx: ToolContext, path: Relative = ".") -> dict[str, Any]:
    """List the files under a directory of the workspace, recursively (directories end with
    /)."""
    entries = await ctx.workspace.list_files(path)
    result: dict[str, Any] = {"files": entries[:LIST_LIMIT]}
    if len(entries) > LIST_LIMIT:
        result["truncated"] = f"{len(entries) - LIST_LIMIT} more entries were left out"
    return result


@tool(name="run")
async def run(
    command: Annotated[str, Field(description="a shell command line, run with /bin/sh -c")],
    ctx: ToolContext,
    timeout: Annotated[float, Field(gt=0, description="seconds before it is killed")] = 30,
) -> dict[str, object]:
    """Run a shell command in the workspace's top directory (usually in a sandbox: no network,
    only the workspace writable). Returns its exit code and its output (stdout and stderr)."""
    result = await ctx.workspace.run(command, timeout=timeout)
    return result.as_json()


FILE_TOOLS: tuple[Tool, ...] = (read_file, write_file, list_files)
RUN_TOOL: Tool = run
