"""The child process of ``CrashHarness`` (``python -m hearth.testing._child JSON``)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sys
from typing import Any

from hearth.app import App


def load_app(ref: str) -> App:
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attr or "app")
    if not isinstance(app, App):
        raise SystemExit(f"{ref} is not a hearth.App")
    return app


async def main(spec: dict[str, Any]) -> None:
    app = load_app(spec["app"])
    app.settings = dataclasses.replace(app.settings, db=spec["db"])
    async with app.run() as rt:
        for agent, id, text in spec["dispatch"]:
            receipt = await rt.dispatch(agent, id, text)
            print("receipt " + json.dumps(receipt.to_json()), flush=True)
        for agent, id in spec["abort"]:
            await rt.abort(agent, id)
        await rt.settle_all(timeout=float(spec["timeout"]))
        if spec.get("idle"):
            await asyncio.sleep(float(spec["idle"]))
    print("settled", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
