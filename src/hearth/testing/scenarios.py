"""The situations the kill-point enumeration kills in (``python -m hearth.testing.enumerate``).

A scenario is what one process is asked to do on a fresh database: messages to dispatch, actions
to take while a tool runs (a second message that joins, an abort, a shutdown), and, before that,
earlier runs (killed ones, so that the process under test starts by recovering their work). Its
``followup`` is one more message to the same conversation once everything settled: the
conversation must still work. The agents are in ``hearth.testing.scenario_apps``.

Example::

    from hearth.testing.scenarios import SCENARIOS
    for scenario in SCENARIOS:
        print(scenario.name, scenario.summary)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hearth.testing.crash import Message, MidTool

APP = "hearth.testing.scenario_apps:app"

Dispatch = tuple[str, str, Message]  # (agent, conversation id, message or signal)


@dataclass(frozen=True)
class Prelude:
    """An earlier run: killed at ``crash_at`` (the kill must fire), or run until it settles."""

    dispatch: tuple[Dispatch, ...]
    crash_at: str | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    dispatch: tuple[Dispatch, ...]
    followup: tuple[str, str, str]  # (agent, conversation id, text)
    mid_tool: tuple[MidTool, ...] = ()
    prelude: tuple[Prelude, ...] = ()
    app: str = APP


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "parallel",
        "three ordinary tool calls in one batch",
        dispatch=(("parallel", "p1", "look up"),),
        followup=("parallel", "p1", "one more"),
    ),
    Scenario(
        "durable",
        "a durable tool with three step.do steps and a wait between two",
        dispatch=(("durable", "d1", "provision"),),
        followup=("durable", "d1", "one more"),
    ),
    Scenario(
        "subagents",
        "a task whose child delegates to a grandchild that calls a tool",
        dispatch=(("parent", "s1", "delegate"),),
        followup=("parent", "s1", "one more"),
    ),
    Scenario(
        "hooks",
        "on_agent_start and on_agent_finish write state and continue; a tool writes state;"
        " a signal arrives in another conversation",
        dispatch=(("hooks", "h1", "count"), ("hooks", "h2", {"type": "ping", "body": "hi"})),
        followup=("hooks", "h1", "one more"),
    ),
    Scenario(
        "join",
        "a second message arrives while the first one's tool runs, and joins it",
        dispatch=(("pausing", "j1", "pause"),),
        mid_tool=(("dispatch", "pausing", "j1", "and this too"),),
        followup=("pausing", "j1", "one more"),
    ),
    Scenario(
        "abort",
        "the conversation is aborted while its tool runs",
        dispatch=(("pausing", "a1", "pause"),),
        mid_tool=(("abort", "pausing", "a1", None),),
        followup=("pausing", "a1", "one more"),
    ),
    Scenario(
        "transient",
        "the provider fails with a transient error, and the turn is retried",
        dispatch=(("flaky", "f1", "stumble"),),
        followup=("flaky", "f1", "one more"),
    ),
    Scenario(
        "overflow",
        "the context overflows after a tool call, and the earlier exchange is compacted",
        prelude=(Prelude((("compacting", "c1", "hello"),)),),
        dispatch=(("compacting", "c1", "fill up"),),
        followup=("compacting", "c1", "one more"),
    ),
    Scenario(
        "shutdown",
        "the process shuts down while a tool runs, releasing its claim",
        dispatch=(("pausing", "r1", "pause"),),
        mid_tool=(("shutdown", "pausing", "r1", None),),
        followup=("pausing", "r1", "one more"),
    ),
    Scenario(
        "recovery",
        "a process died once the child conversation started; this one takes the dead owner's"
        " lease over and resumes the child",
        prelude=(Prelude((("parent", "r2", "delegate"),), crash_at="child:start"),),
        dispatch=(),
        followup=("parent", "r2", "one more"),
    ),
    Scenario(
        "wait",
        "a durable tool waits for an approval that never comes: the attempt pauses, the wait"
        " times out, and the tool runs again with its first step replayed",
        dispatch=(("approving", "w1", "approve"),),
        followup=("approving", "w1", "one more"),
    ),
)

BY_NAME: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in SCENARIOS})

# Listed kill points no scenario reaches, each with the reason (the enumeration fails on any
# other unreached point).
UNREACHED: Mapping[str, str] = MappingProxyType({})

__all__ = ["APP", "BY_NAME", "SCENARIOS", "UNREACHED", "Dispatch", "Prelude", "Scenario"]
