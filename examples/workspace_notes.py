"""An agent with a durable workspace: it writes a note in one submission and finds it again in
the next, and a tool of its own reads the workspace through ``ctx.workspace``. With bubblewrap
installed, the model also runs a shell command in the sandbox."""

import asyncio
import shutil
import uuid

import hearth
from hearth.records import ToolOutcome
from hearth.testing import ScriptedModel, call, calls, reply

NOTES = hearth.LocalWorkspace("notes-workspaces")  # ./notes-workspaces/{agent}/{id}
SANDBOX = shutil.which("bwrap") is not None


@hearth.tool
async def word_count(path: str, ctx: hearth.ToolContext) -> int:
    """Count the words of a file of the workspace."""
    text = await ctx.workspace.read_file(path)  # a path outside is an error the model reads
    return len(text.split())


@hearth.agent
def scribe(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/scribe")
    ctx.use_workspace(NOTES, run=SANDBOX)  # read_file, write_file, list_files (+ run)
    ctx.use_tool(word_count)
    return "You keep notes in your workspace."


first_visit = [
    calls(call("write_file", path="notes/monday.md", content="Buy milk and call Ada.")),
    reply("Noted."),
]
second_visit = [
    calls(call("list_files"), call("word_count", path="notes/monday.md")),
    *([calls(call("run", command="cat notes/*.md | tr a-z A-Z"))] if SANDBOX else []),
    calls(call("read_file", path="../../outside.txt")),  # refused: an error outcome
    reply("You have one note of five words."),
]
model = ScriptedModel("scribe", [*first_visit, *second_visit])
app = hearth.App([scribe], db="sqlite:///notes.db", providers=[model])


async def main() -> None:
    me = f"me-{uuid.uuid4().hex[:8]}"  # a conversation of its own each run (the script restarts)
    async with app.run() as rt:
        for text in ("Remember: buy milk, call Ada.", "What do my notes say?"):
            print(await rt.read(await rt.dispatch("scribe", me, text)))
        for record in await rt.history("scribe", me):
            if isinstance(record, ToolOutcome):
                print(f"  {record.name}: {record.content}")


asyncio.run(main())
