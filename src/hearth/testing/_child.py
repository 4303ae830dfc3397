"""The child process of ``CrashHarness`` (``python -m hearth.testing._child JSON``)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sys
import time
from typing import Any

from hearth.app import App
from hearth.errors import ConversationNotFound
from hearth.records import AssistantToolCall
from hearth.runtime.runtime import Runtime


def load_app(ref: str) -> App:
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attr or "app")
    if not isinstance(app, App):
        raise SystemExit(f"{ref} is not a hearth.App")
    return app


async def dispatch(rt: Runtime, agent: str, id: str, message: str | dict[str, Any]) -> None:
    if isinstance(message, dict):  # a signal
        receipt = await rt.dispatch(agent, id, signal=message)
    else:
        receipt = await rt.dispatch(agent, id, message)
    print("receipt " + json.dumps(receipt.to_json()), flush=True)


async def until_a_tool_call(rt: Runtime, agent: str, id: str, timeout: float) -> None:
    """Wait until the conversation's model has asked for a tool (its call is recorded)."""
    end = time.monotonic() + timeout
    while True:
        try:
            history = await rt.history(agent, id)
        except ConversationNotFound:
            history = []
        if any(isinstance(r, AssistantToolCall) for r in history):
            return
        if time.monotonic() > end:
            raise TimeoutError(f"{agent}/{id} never called a tool")
        await asyncio.sleep(0.01)


async def main(spec: dict[str, Any]) -> None:
    app = load_app(spec["app"])
    app.settings = dataclasses.replace(app.settings, db=spec["db"])
    timeout = float(spec["timeout"])
    async with app.run() as rt:
        for agent, id, message in spec["dispatch"]:
            await dispatch(rt, agent, id, message)
        for agent, id in spec["abort"]:
            await rt.abort(agent, id)
        shutdown = False
        # Actions taken once a conversation's tool call is recorded (its tool is running).
        for action, agent, id, message in spec.get("mid_tool", []):
            await until_a_tool_call(rt, agent, id, timeout)
            if action == "dispatch":
                await dispatch(rt, agent, id, message)
            elif action == "abort":
                await rt.abort(agent, id)
            else:  # "shutdown": stop with the work still running; the next process resumes it
                shutdown = True
        if not shutdown:
            await rt.settle_all(timeout=timeout)
        if spec.get("idle"):
            await asyncio.sleep(float(spec["idle"]))
    print("stopped" if shutdown else "settled", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
