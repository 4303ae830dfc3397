"""An app with channels and schedules (``inputsapp:app``), served in a thread or by processes.

- channel ``hooks`` (``hearth.channels.hmac``): the JSON body ``{"to": [{"id", "message"}...]}``
  routes one message per entry to ``triage/{id}``; ``{"fail": true}`` raises until the file
  ``$HEARTH_TEST_FIXED`` exists (a routing bug, then its fix).
- channel ``github`` (``hearth.channels.github``): an ``issues`` event goes to ``triage/issue-N``.
- schedule ``tick`` (every minute, ``triage/ticks``) when ``$HEARTH_TEST_SCHEDULES`` is set, on
  the clock in the file ``$HEARTH_TEST_CLOCK`` when that is set.

Every call of a ``receive`` appends a line ``receive|channel|delivery id|pid`` to
``$HEARTH_TEST_LOG`` (when set), so a test counts how often routing ran.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hearth
from hearth.providers.base import ModelRequest, SystemNote, UserTurn
from hearth.testing import ScriptedModel, Step, reply
from hearth.testing.clock import FileClock

SECRET = os.environ.get("HEARTH_TEST_SECRET", "not-a-real-secret-7f3a9c")
GITHUB_SECRET = os.environ.get("HEARTH_TEST_GITHUB_SECRET", "github-test-secret-51e0")


def _echo(request: ModelRequest) -> Step:
    said = [
        m.content if isinstance(m, UserTurn) else m.text
        for m in request.messages
        if isinstance(m, UserTurn | SystemNote)
    ]
    return reply(f"echo: {said[-1] if said else ''}")


@hearth.agent
def triage(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/echo")
    return "Triage what comes in."


def _ran(channel: str, delivery: hearth.Delivery) -> None:
    log = os.environ.get("HEARTH_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"receive|{channel}|{delivery.id}|{os.getpid()}\n")


def route_hooks(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    _ran("hooks", delivery)
    data: dict[str, Any] = delivery.data
    fixed = os.environ.get("HEARTH_TEST_FIXED")
    if data.get("fail") and not (fixed and Path(fixed).exists()):
        raise RuntimeError("the routing table is broken")
    if data.get("find"):  # a next() that finds nothing: StopIteration
        return [next(d for d in [] if d == data["find"])]
    if data.get("fail"):
        return [hearth.Dispatch("triage", "fixed", message="routed after the fix")]
    return [
        hearth.Dispatch(
            to.get("agent", "triage"), to["id"], message=to.get("message"), signal=to.get("signal")
        )
        for to in data.get("to", [])
    ]


def route_github(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
    _ran("github", delivery)
    if delivery.type != "issues":
        return []  # ping, and whatever else the hook is subscribed to
    issue = delivery.data["issue"]
    text = f"issue #{issue['number']} {delivery.data['action']}: {issue['title']}"
    return [hearth.Dispatch(triage, f"issue-{issue['number']}", message=text)]


SCHEDULES = (
    [hearth.Schedule("tick", triage, "ticks", cron="* * * * *", message="tick")]
    if os.environ.get("HEARTH_TEST_SCHEDULES")
    else []
)
CLOCK = FileClock(os.environ["HEARTH_TEST_CLOCK"]) if os.environ.get("HEARTH_TEST_CLOCK") else None

AGENTS = [triage]
MODELS = [ScriptedModel("echo", _echo)]
CHANNELS = [
    hearth.Channel("hooks", verify=hearth.channels.hmac(SECRET), receive=route_hooks),
    hearth.Channel("github", verify=hearth.channels.github(GITHUB_SECRET), receive=route_github),
]

app = hearth.App(
    AGENTS, channels=CHANNELS, schedules=SCHEDULES, providers=MODELS, schedule_clock=CLOCK
)
