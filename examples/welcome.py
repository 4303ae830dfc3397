"""A welcome mail sent at most once per conversation, through crashes.

Two guards work together:

- persistent state (``welcome_sent``) is written by the same hook seam that sends the mail, so
  the flag can never be true while the seam that sent the mail was rolled back;
- an idempotency key (``welcome:<id>``) covers the remaining window: a crash after the mail left
  but before the seam committed runs the hook again, and the mail service drops the repeat.

Run it: ``.venv/bin/python examples/welcome.py`` — it sends three messages and prints the mail log.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import hearth
from hearth.testing import ScriptedModel, reply


class Mailer:
    """A stand-in mail service that keeps a log and ignores a repeated idempotency key."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def entries(self) -> list[dict[str, str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    async def welcome(self, conversation: str, *, key: str) -> None:
        delivered = any(e["key"] == key and e["event"] == "delivered" for e in self.entries())
        event = "duplicate-ignored" if delivered else "delivered"
        with self.log.open("a") as f:
            f.write(json.dumps({"key": key, "to": conversation, "event": event}) + "\n")


mailer = Mailer(Path(os.environ.get("WELCOME_MAIL_LOG", "welcome-mail.log")))


@hearth.agent
def support(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/support")
    welcome_sent, set_welcome_sent = ctx.use_state("welcome_sent", False)

    @ctx.on_agent_start
    async def welcome(event: hearth.AgentStart) -> None:
        if not welcome_sent:
            await mailer.welcome(ctx.id, key=f"welcome:{ctx.id}")
            set_welcome_sent(True)

    return "You are a customer support agent."


model = ScriptedModel("support", lambda request: reply("How can I help?"))
app = hearth.App([support], providers=[model])


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mailer.log = Path(tmp) / "mail.log"
        demo = hearth.App([support], db="memory", providers=[model])
        async with demo.run() as rt:
            for text in ("hello", "are you there?", "thanks"):
                await rt.read(await rt.dispatch("support", "c-1", text), timeout=10)
            print("state:", await rt.store.get_state("support/c-1"))
        for entry in mailer.entries():
            print("mail:", entry)


if __name__ == "__main__":
    asyncio.run(main())
