"""Agents: functions rendered before every model call.

Example::

    @hearth.agent(durability=hearth.Durability(max_attempts=5, timeout=7200))
    def support(ctx: hearth.AgentContext) -> str:
        ctx.use_model("openai/gpt-4o-mini")
        ctx.use_tool(lookup_order)
        return "You are a customer support agent."
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, overload

from hearth.errors import ConfigurationError, HearthError, StateWriteDuringRender
from hearth.ids import is_name, name_rule
from hearth.jsontext import canonical_json, json_round_trip
from hearth.steps import MAX_TIMEOUT_S
from hearth.tools import Tool
from hearth.workspace_tools import FILE_TOOLS, RUN_TOOL
from hearth.workspaces.base import Workspace

NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
MAX_CONTINUATIONS = 32
MAX_ATTEMPTS = 2**31 - 1  # (bounded as the stores' columns are)


@dataclass(frozen=True, kw_only=True)
class Durability:
    """Retry budget, wall-clock timeout (seconds) and spending budget (model tokens, input and
    output, across all turns and attempts; None: unbounded) of one submission. Read without
    rendering."""

    max_attempts: int = 10
    timeout: float = 3600.0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or not 1 <= self.max_attempts <= MAX_ATTEMPTS
        ):
            raise ConfigurationError(
                f"Durability.max_attempts must be an integer from 1 to {MAX_ATTEMPTS:,}"
            )
        if (
            not isinstance(self.timeout, int | float)
            or isinstance(self.timeout, bool)
            or not 0 < self.timeout <= MAX_TIMEOUT_S  # (False for NaN too)
        ):
            raise ConfigurationError(
                "Durability.timeout must be a number of seconds above 0 and at most"
                f" {MAX_TIMEOUT_S:,.0f} (100 years)"
            )
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise ConfigurationError("Durability.max_tokens must be an integer ≥ 1, or None")


class StateBuffer:
    """The state writes of one unit of work (a tool batch or a hook seam), committed with it."""

    def __init__(self, committed: dict[str, Any]) -> None:
        self.committed = committed
        self.writes: dict[str, Any] = {}
        self.closed = False  # its writes were taken to be committed: later ones would be lost

    def set(self, name: str, value: Any) -> None:
        if self.closed:
            raise HearthError(
                f"state {name!r} was set after its tool call or event hook ended (from a task it"
                " left running, say): set state before the tool or hook returns"
            )
        current = self.writes.get(name, self.committed.get(name, _MISSING))
        # The same JSON, not only equal in Python: 0 == False and 1 == 1.0, but each is stored
        # as what it is.
        if current is not _MISSING and canonical_json(current) == canonical_json(value):
            return
        self.writes[name] = value


_MISSING = object()
# The unit of work whose state writes a setter joins; set by the runner around tools and hooks.
current_unit: ContextVar[StateBuffer | None] = ContextVar("hearth_state_unit", default=None)


@dataclass(frozen=True)
class Subagent:
    agent: Agent
    description: str


Hook = Callable[[Any], Awaitable[None] | None]


@dataclass
class Rendered:
    """What one render of an agent declared for the coming model call."""

    system: str
    model: str
    model_options: dict[str, Any]
    tools: dict[str, Tool]
    subagents: dict[str, Subagent]
    on_start: list[Hook] = field(default_factory=list)
    on_finish: list[Hook] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # the committed state it rendered with
    workspace: Workspace | None = None  # what ctx.use_workspace declared


class AgentContext:
    """The ``ctx`` an agent function receives: identity, and the ``use_*`` declarations."""

    def __init__(self, agent: str, id: str, state: dict[str, Any]) -> None:
        self.agent = agent
        self.id = id
        self.conversation_id = f"{agent}/{id}"
        self._state = state
        self._rendering = True
        self._model: tuple[str, dict[str, Any]] | None = None
        self._tools: dict[str, Tool] = {}
        self._subagents: dict[str, Subagent] = {}
        self._on_start: list[Hook] = []
        self._on_finish: list[Hook] = []
        self._workspace: Workspace | None = None

    def use_model(self, spec: str, **options: Any) -> None:
        """Choose the model for this turn: ``"provider/model"``. Exactly once per render."""
        if self._model is not None:
            raise ConfigurationError(f"{self.agent}: use_model was called twice in one render")
        if not isinstance(spec, str) or "/" not in spec:
            raise ConfigurationError(f"model spec {spec!r} must look like 'provider/model'")
        self._model = (spec, options)

    def use_tool(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise ConfigurationError(f"use_tool expects a @hearth.tool, got {tool!r}")
        if tool.name in self._tools and self._tools[tool.name] is not tool:
            raise ConfigurationError(f"two different tools are named {tool.name!r}")
        self._tools[tool.name] = tool

    def use_workspace(self, workspace: Workspace, *, run: bool = False) -> None:
        """Give the tools a workspace (``ToolContext.workspace``) and offer the built-in
        ``read_file``, ``write_file`` and ``list_files`` tools, and ``run`` when ``run=True``."""
        if not isinstance(workspace, Workspace):
            raise ConfigurationError(
                f"use_workspace expects a hearth.Workspace (LocalWorkspace, EphemeralWorkspace, "
                f"...), got {workspace!r}"
            )
        if self._workspace is not None and self._workspace != workspace:
            raise ConfigurationError(f"{self.agent}: use_workspace was called with two workspaces")
        self._workspace = workspace
        for builtin in (*FILE_TOOLS, RUN_TOOL) if run else FILE_TOOLS:
            self.use_tool(builtin)

    def use_subagent(self, agent: Agent, *, description: str) -> None:
        """Let the model delegate to ``agent`` through the built-in ``task`` tool."""
        if not isinstance(agent, Agent):
            raise ConfigurationError(f"use_subagent expects a @hearth.agent, got {agent!r}")
        known = self._subagents.get(agent.name)
        if known is not None and known.agent is not agent:
            raise ConfigurationError(f"two different subagents are named {agent.name!r}")
        self._subagents[agent.name] = Subagent(agent, description)

    def use_state(self, name: str, default: Any = None) -> tuple[Any, Callable[[Any], None]]:
        """Persistent per-conversation state: ``(value as committed, setter)``. The setter takes
        a JSON value (stored as JSON gives it back) and raises ``HearthError`` for any other."""
        if not is_name(name):
            raise ConfigurationError(name_rule("state", name))
        # A copy: changed in place and set again, the committed value itself would have
        # changed, and the write been dropped as "the value it already has".
        value = copy.deepcopy(self._state[name]) if name in self._state else default

        def set_value(new: Any) -> None:
            if self._rendering:
                raise StateWriteDuringRender(
                    f"state {name!r} was set while {self.agent} was rendering; "
                    "set state inside a tool or an event hook"
                )
            try:
                new = json_round_trip(new)
            except (TypeError, ValueError) as exc:
                raise HearthError(f"state {name!r} must be set to a JSON value: {exc}") from None
            unit = current_unit.get()
            if unit is None:
                raise HearthError(
                    f"state {name!r} can only be set inside a tool call or an event hook"
                )
            unit.set(name, new)

        return value, set_value

    def on_agent_start(self, fn: Hook) -> Hook:
        """Run ``fn(event)`` once per delivered input, before the model reads it."""
        self._on_start.append(fn)
        return fn

    def on_agent_finish(self, fn: Hook) -> Hook:
        """Run ``fn(event)`` where the response would stop; ``event.append(text)`` continues it."""
        self._on_finish.append(fn)
        return fn


class Agent:
    """A declared agent. Made by ``@hearth.agent``."""

    def __init__(
        self,
        fn: Callable[[AgentContext], str],
        *,
        name: str | None = None,
        durability: Durability | None = None,
    ) -> None:
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            # An async one returns a coroutine, not the prompt: every submission would fail.
            raise ConfigurationError(
                f"an agent is a plain (not async) function of its context returning the system"
                f" prompt, not {fn!r}"
            )
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "").replace("_", "-")
        if not isinstance(self.name, str) or not NAME_RE.fullmatch(self.name):
            raise ConfigurationError(
                f"agent name {self.name!r} must match {NAME_RE.pattern} (lowercase, dashes)"
            )
        if durability is not None and not isinstance(durability, Durability):
            raise ConfigurationError("durability must be a hearth.Durability")
        self.durability = durability or Durability()

    def __repr__(self) -> str:
        return f"<hearth.Agent {self.name}>"

    def render(self, id: str, state: dict[str, Any]) -> Rendered:
        """Run the agent function once and collect what it declared."""
        ctx = AgentContext(self.name, id, state)
        try:
            system = self.fn(ctx)
        finally:
            ctx._rendering = False
        if not isinstance(system, str):
            raise ConfigurationError(f"agent {self.name!r} must return the system prompt (a str)")
        if ctx._model is None:
            raise ConfigurationError(f"agent {self.name!r} did not call ctx.use_model(...)")
        if ctx._subagents and "task" in ctx._tools:
            # Every call named "task" goes to the subagents, and the model would be offered two
            # tools of one name (which providers refuse).
            raise ConfigurationError(
                f"agent {self.name!r} uses subagents, whose built-in tool is named 'task': rename"
                " its own tool 'task'"
            )
        return Rendered(
            system=system,
            model=ctx._model[0],
            model_options=ctx._model[1],
            tools=dict(ctx._tools),
            subagents=dict(ctx._subagents),
            on_start=list(ctx._on_start),
            on_finish=list(ctx._on_finish),
            state=state,
            workspace=ctx._workspace,
        )


@overload
def agent(fn: Callable[[AgentContext], str], /) -> Agent: ...


@overload
def agent(
    *, name: str | None = None, durability: Durability | None = None
) -> Callable[[Callable[[AgentContext], str]], Agent]: ...


def agent(
    fn: Callable[[AgentContext], str] | None = None,
    /,
    *,
    name: str | None = None,
    durability: Durability | None = None,
) -> Agent | Callable[[Callable[[AgentContext], str]], Agent]:
    """Declare an agent: a sync function ``(ctx) -> system prompt``."""
    if fn is not None:
        return Agent(fn)

    def wrap(f: Callable[[AgentContext], str]) -> Agent:
        return Agent(f, name=name, durability=durability)

    return wrap
