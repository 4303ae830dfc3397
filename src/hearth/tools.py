"""Tools: plain Python functions the model can call.

Example::

    @hearth.tool
    async def lookup_order(order_id: str) -> dict:
        \"\"\"Look an order up.\"\"\"
        return {"id": order_id, "status": "shipped"}

The input schema comes from the signature through pydantic; a parameter annotated
``hearth.ToolContext`` is injected by the runtime and hidden from the model.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import threading
import types
from collections.abc import Callable
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

import pydantic
import pydantic_core

from hearth._tasks import in_thread
from hearth.attachments import ConversationAttachments
from hearth.effects import RECONCILE_TIMEOUT_S
from hearth.errors import ConfigurationError, WorkspaceError
from hearth.jsontext import json_round_trip, unpaired_surrogate
from hearth.providers.base import ToolSpec
from hearth.steps import Steps

if TYPE_CHECKING:
    from hearth.workspaces.base import OpenWorkspace

_TOOL_NAME_LIMIT = 64
# What the model providers accept as a function name (ASCII only), matched in full.
_TOOL_NAME_RE = re.compile(rf"[A-Za-z0-9_-]{{1,{_TOOL_NAME_LIMIT}}}")

# (conversation id, tool call id) → set when the worker thread running that sync call ends. An
# abort or a lost lease stops waiting for such a thread, not the thread: reconciling the call
# while it still runs here could answer NotDone and run it twice.
_THREADS: dict[tuple[str, str], threading.Event] = {}
_THREADS_LOCK = threading.Lock()


def thread_still_running(conversation_id: str, tool_call_id: str) -> threading.Event | None:
    """The event a sync call's worker thread sets when it ends, while it is still running."""
    with _THREADS_LOCK:
        return _THREADS.get((conversation_id, tool_call_id))


class ToolContext:
    """What a running tool can know about its call. Add a parameter annotated with this type.

    ``step`` (a durable tool's checkpoints) and ``workspace`` (the agent's open workspace) are
    typed as always there, so ``await ctx.step.do(...)`` type-checks as written; reading one a
    call does not have raises an error that says what to declare.
    """

    def __init__(
        self,
        tool_call_id: str,
        conversation_id: str,
        log: logging.LoggerAdapter[logging.Logger],
        step: Steps | None = None,
        workspace: OpenWorkspace | None = None,
        attachments: ConversationAttachments | None = None,
    ) -> None:
        self.tool_call_id = tool_call_id
        self.conversation_id = conversation_id
        self.log = log
        self._step = step
        self._workspace = workspace
        # the conversation's files: ``await ctx.attachments.read(name_or_sha256)``
        self.attachments = (
            ConversationAttachments([], _nothing) if attachments is None else attachments
        )

    @property
    def step(self) -> Steps:
        """The call's ``step.do`` / ``step.wait`` / ``step.transaction`` (durable tools only)."""
        if self._step is None:
            raise ConfigurationError(
                "ctx.step is for durable tools only: declare this tool with"
                " @hearth.tool(durable=True) to record steps"
            )
        return self._step

    @property
    def durable(self) -> bool:
        """Whether this call has ``ctx.step`` (its tool was declared ``durable=True``)."""
        return self._step is not None

    @property
    def workspace(self) -> OpenWorkspace:
        """The attempt's open workspace (when the agent declared ``ctx.use_workspace``)."""
        if self._workspace is None:
            raise WorkspaceError(
                "this agent has no workspace: declare one with ctx.use_workspace(...) in its"
                " render function"
            )
        return self._workspace

    @property
    def has_workspace(self) -> bool:
        """Whether the agent declared a workspace (``ctx.workspace`` can be read)."""
        return self._workspace is not None

    def __repr__(self) -> str:
        return (
            f"ToolContext(tool_call_id={self.tool_call_id!r},"
            f" conversation_id={self.conversation_id!r}, durable={self.durable},"
            f" has_workspace={self.has_workspace})"
        )


async def _nothing(sha256: str) -> bytes | None:
    return None


class Tool:
    """A declared tool. Made by ``@hearth.tool``; calling it calls the wrapped function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        durable: bool = False,
        reconcile: Callable[..., Any] | None = None,
        reconcile_timeout: float = RECONCILE_TIMEOUT_S,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"a tool must be a function, not {type(fn).__name__}")
        self.fn = fn
        given = name or getattr(fn, "__name__", None)  # (a partial has none: give name=)
        if not isinstance(given, str) or not _TOOL_NAME_RE.fullmatch(given):
            raise ConfigurationError(
                f"tool name {given!r} must be 1-{_TOOL_NAME_LIMIT} letters, digits, _ or -"
            )
        self.name: str = given
        if description is not None and not isinstance(description, str):
            raise ConfigurationError(f"tool {self.name!r}: description must be a string")
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.durable = durable
        # (an object whose __call__ is async too)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self.context_param, self.input_model = _input_model(fn, self.name)
        self._spec: ToolSpec | None = None
        if durable and self.context_param is None:
            raise ConfigurationError(
                f"durable tool {self.name!r} needs a parameter annotated hearth.ToolContext "
                "to reach ctx.step"
            )
        if durable and not self.is_async:
            raise ConfigurationError(
                f"durable tool {self.name!r} must be an async function: its ctx.step calls are"
                " awaited (a sync one would never run them)"
            )
        if reconcile is not None and durable:
            raise ConfigurationError(
                f"tool {self.name!r}: reconcile= is for ordinary tools; a durable tool re-executes"
                " after a crash, its steps replaying, so it has no unknown outcome to reconcile"
            )
        if reconcile is not None and not callable(reconcile):
            raise ConfigurationError(f"tool {self.name!r}: reconcile= must be a function")
        if not isinstance(reconcile_timeout, int | float) or not reconcile_timeout > 0:
            raise ConfigurationError(
                f"tool {self.name!r}: reconcile_timeout must be a positive number of seconds"
            )
        self.reconcile = reconcile
        self.reconcile_timeout = float(reconcile_timeout)
        self.spec()  # now: a schema pydantic cannot make fails the declaration, not every turn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<hearth.Tool {self.name}{' durable' if self.durable else ''}>"

    def spec(self) -> ToolSpec:
        """What the model is told of the tool. Built once: every model request carries it, and
        pydantic's schema generation costs far more than the request itself."""
        if self._spec is None:
            try:
                schema = self.input_model.model_json_schema()
                schema.pop("title", None)
                # What a provider is sent: JSON as JSON gives it back (a default of NaN has none)
                schema = json_round_trip(schema)
            except (pydantic.PydanticUserError, TypeError, ValueError, RecursionError) as exc:
                raise ConfigurationError(
                    f"tool {self.name!r}: no JSON schema can describe its parameters: {exc}"
                ) from None
            odd = unpaired_surrogate([self.name, self.description, schema])
            if odd is not None:
                raise ConfigurationError(
                    f"tool {self.name!r}: its name, description or schema holds {odd}, which no"
                    " request to a model can carry"
                )
            self._spec = ToolSpec(self.name, self.description, schema)
        return self._spec

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validate the model's arguments; raises ``pydantic.ValidationError``."""
        if not isinstance(arguments, dict):
            arguments = {} if arguments is None else {"_": arguments}
        model = self.input_model.model_validate(arguments)
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the tool with validated arguments; return its result as JSON."""
        kwargs = dict(arguments)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            # A sync tool runs on a worker thread so it cannot stall the event loop (and with it
            # heartbeats and other conversations); context variables travel with it.
            result = await in_thread(_tracked, ctx, self.fn, kwargs)
            if inspect.isawaitable(result):
                result = await result
        return to_json_value(result)


def _tracked(ctx: ToolContext, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync tool on this worker thread, registered while it runs (``_THREADS``)."""
    key = (ctx.conversation_id, ctx.tool_call_id)
    ended = threading.Event()
    with _THREADS_LOCK:
        _THREADS[key] = ended
    try:
        return fn(**kwargs)
    finally:
        with _THREADS_LOCK:
            if _THREADS.get(key) is ended:
                del _THREADS[key]
        ended.set()


def to_json_value(value: Any) -> Any:
    """A tool's return value as JSON: pydantic models are dumped; anything else must already be
    JSON-serialisable (``TypeError`` otherwise: NaN and the infinities too, a model's fields
    included, and a value nested too deep to encode)."""
    try:
        if _holds_a_model(value):
            # Models anywhere in it (a list of them, say) are dumped; a float field's NaN
            # stays NaN here, and is refused below.
            value = pydantic_core.to_jsonable_python(value)
        return json_round_trip(value)  # NaN has no JSON form: no reader could take it
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"tool result is not JSON-serialisable: {exc}") from None


def _holds_a_model(value: Any, depth: int = 0) -> bool:
    """Whether a pydantic model is in ``value`` (itself, or in its lists and dicts)."""
    if isinstance(value, pydantic.BaseModel):
        return True
    if depth > 64:
        return False  # too deep to be JSON anyway: refused by the round trip
    if isinstance(value, list | tuple):
        return any(_holds_a_model(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_a_model(v, depth + 1) for v in value.values())
    return False


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The type hints of ``fn``'s parameters: of the function a ``functools.partial`` wraps,
    and of the ``__call__`` of a callable object."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)) and callable(target):
        target = type(target).__call__
    return get_type_hints(target, include_extras=True)


def _is_context(annotation: Any) -> bool:
    """``hearth.ToolContext``, also as ``Optional[...]`` or ``Annotated[...]``."""
    if annotation is ToolContext:
        return True
    if get_origin(annotation) is Annotated:
        return _is_context(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return len(rest) == 1 and _is_context(rest[0])
    return False


def _input_model(fn: Callable[..., Any], name: str) -> tuple[str | None, type[pydantic.BaseModel]]:
    try:
        hints = _hints(fn)
    except Exception as exc:
        raise ConfigurationError(f"tool {name!r}: cannot resolve type hints: {exc}") from exc
    context_param: str | None = None
    fields: dict[str, Any] = {}
    parameters = list(inspect.signature(fn).parameters.values())
    if parameters and parameters[0].name in ("self", "cls") and "self" not in hints:
        if parameters[0].annotation is inspect.Parameter.empty:
            raise ConfigurationError(
                f"tool {name!r}: its first parameter is {parameters[0].name!r}: declare a"
                " function (or a staticmethod), not a method; the model cannot give"
                f" {parameters[0].name!r}"
            )
    fixed: set[str] = set()  # what a functools.partial gives: not the model's to choose
    target: Any = fn
    while isinstance(target, functools.partial):
        fixed |= set(target.keywords)
        target = target.func
    for param in parameters:
        if param.name in fixed:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {name!r}: *args/**kwargs cannot be described to a model"
            )
        # Arguments are passed by name: these could never be given one.
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"tool {name!r}: parameter {param.name!r} is positional-only; the model's"
                " arguments are passed by name"
            )
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            if context_param is not None:
                raise ConfigurationError(
                    f"tool {name!r}: one parameter may take hearth.ToolContext, not"
                    f" {context_param!r} and {param.name!r}"
                )
            context_param = param.name
            continue
        if param.name.startswith(("_", "model_")):
            # pydantic leaves out a name with a leading _ and keeps model_ for its own: the
            # model would be told of no such argument, and any it sent would be refused.
            raise ConfigurationError(
                f"tool {name!r}: parameter {param.name!r} cannot be an argument (names that"
                " start with _ or model_ are not); rename it"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    try:
        model = pydantic.create_model(
            f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise ConfigurationError(
            f"tool {name!r}: its parameters cannot be described to a model: {exc}"
        ) from None
    return context_param, model


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    durable: bool = False,
    reconcile: Callable[..., Any] | None = None,
    reconcile_timeout: float = RECONCILE_TIMEOUT_S,
) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    durable: bool = False,
    reconcile: Callable[..., Any] | None = None,
    reconcile_timeout: float = RECONCILE_TIMEOUT_S,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    durable: bool = False,
    reconcile: Callable[..., Any] | None = None,
    reconcile_timeout: float = RECONCILE_TIMEOUT_S,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. Use bare (``@hearth.tool``) or with options
    (``@hearth.tool(durable=True)``). The docstring is the description the model sees.

    ``reconcile=fn`` (ordinary tools only): after a crash, recovery asks ``fn(call)`` (a
    ``hearth.ReconcileCall``; sync or async; at most ``reconcile_timeout`` seconds) whether the
    cut-off call took effect, instead of marking its outcome unknown (docs/effects.md)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            durable=durable,
            reconcile=reconcile,
            reconcile_timeout=reconcile_timeout,
        )

    # ``hearth.tool(fn, durable=True)`` took ``fn`` and dropped the options: a tool declared
    # durable ran as an ordinary one.
    return wrap if fn is None else wrap(fn)
