"""Running and repairing one tool batch (the calls of one assistant message).

Outcomes already recorded are kept; calls made by this attempt run; calls a dead attempt left
unresolved are repaired by ``plan_tool_batch``'s verdict. State writes made by the batch's tools
commit together with its ``tool_results_committed`` record, or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pydantic

from hearth import _faults, telemetry
from hearth.agent import Rendered, StateBuffer, current_unit
from hearth.attachments import ConversationAttachments, parts_of
from hearth.effects import NOT_DONE, Done, NotDone
from hearth.errors import FencedOut, StepError, app_failure, described, hearths_own, stopping
from hearth.ids import id_part
from hearth.records import (
    AssistantToolCall,
    Record,
    StateWrite,
    ToolOutcome,
    ToolStepSettled,
    UserMessage,
)
from hearth.runtime.outcomes import (
    batch_committed,
    call_outcome,
    call_writes,
    error_outcome,
    interrupted_outcome,
    kept_writes,
    reconciled_done,
    replayed_sets,
    rerun_started,
)
from hearth.runtime.reconcile import ask, reconcile_call
from hearth.runtime.recovery import (
    SETS_STEP,
    TASK_TOOL,
    CallPlan,
    InterruptedTool,
    MessageView,
    is_marker,
    plan_tool_batch,
)
from hearth.runtime.scope import AttemptScope
from hearth.runtime.tasks import run_child_task
from hearth.runtime.waits import (
    PauseForWait,
    carried_state,
    recorded_waits,
    wait_started,
)
from hearth.steps import Steps, WaitPending, json_value
from hearth.store.base import Fence
from hearth.tools import Tool, ToolContext

log = logging.getLogger("hearth.tools")


class _StepTimer:
    """Around a step that runs (not one replayed from its record): its latency, and its span
    when tracing records. A plain class: a generator context manager per step cost more than
    the step's own bookkeeping."""

    __slots__ = ("_name", "_observe", "_span", "_t0", "_traced")

    def __init__(self, name: str, traced: bool, observe: Callable[[float], None]) -> None:
        self._name, self._traced, self._observe = name, traced, observe
        self._span: contextlib.AbstractContextManager[Any] | None = None
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()
        if self._traced:
            self._span = telemetry.span("hearth.step", attributes={"hearth.step": self._name})
            self._span.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        try:
            return None if self._span is None else self._span.__exit__(*exc)
        finally:
            self._observe(time.perf_counter() - self._t0)


class _CallState(StateBuffer):
    """The state writes of one call: the batch's, and kept apart, to be recorded with the
    call's outcome while the batch is still open, each with its place among all the batch's
    sets (``counter``)."""

    def __init__(self, batch: StateBuffer, counter: Iterator[int]) -> None:
        super().__init__(batch.committed)
        self.batch = batch
        self.order: dict[str, int] = {}
        self._counter = counter

    def set(self, name: str, value: Any) -> None:
        self.batch.set(name, value)  # (refused once the batch's writes were taken)
        self.writes[name] = value
        self.order[name] = next(self._counter)


class ToolBatch:
    """The calls of one assistant message, run (or repaired) and committed together."""

    def __init__(self, scope: AttemptScope, rendered: Rendered, view: MessageView) -> None:
        self.scope = scope
        self.journal = scope.journal
        self.rendered = rendered
        self.view = view
        self.waiting: PauseForWait | None = None  # set when a call of the batch waits
        self._unfinished = 0  # jobs of the batch not finished yet
        self._troubled = False  # a job raised: the batch will not commit now
        # The outcome of the call that finished last, when the batch commits at once: appended
        # with the state writes and the commit in one write (and with the record of its own
        # writes should the batch not commit now after all). Every other outcome is appended
        # with the record of its call's writes, which a recovery that completes the batch
        # commits.
        self._held: ToolOutcome | None = None
        self._held_writes: list[Record] = []
        # A call of the batch is marked interrupted (cut off, its outcome unknown): the batch
        # then commits none of its state writes, those of the calls with real outcomes included.
        self._cut = any(is_marker(o) for o in view.outcomes.values())
        self._sets = itertools.count()  # the order of the calls' sets of state

    async def run(self) -> None:
        view = self.view
        tools = self.rendered.tools
        declared = {name: t.durable for name, t in tools.items()}
        reconcilable = [name for name, t in tools.items() if t.reconcile is not None]
        plan = plan_tool_batch(
            view, self.scope.sub.attempt, declared, list(self.rendered.subagents), reconcilable
        )
        buffer = StateBuffer(self.rendered.state)
        row = self.scope.sub.carried or {}
        carried = row.get(self.scope.conversation_id)
        records = self.journal.records
        paused_writes, since = carried_state(records, view.message_id, carried)
        buffer.writes.update(paused_writes)
        # And those of calls whose outcomes were recorded since (by an attempt that then died).
        buffer.writes.update(kept_writes(records, view.message_id, since))
        # Made when their task first runs: a coroutine made first and cancelled before its task
        # started (an abort as the batch begins) was never awaited, and Python said so on stderr.
        jobs: list[Callable[[], Awaitable[None]]] = []
        for call in view.calls:
            verdict = plan[call.tool_call_id]
            if verdict is CallPlan.KEEP:
                continue
            if verdict is CallPlan.INTERRUPTED:
                self._cut = True
                tool = InterruptedTool(call.name, call.tool_call_id)
                await self.journal.append(interrupted_outcome(view.message_id, tool))
            elif verdict is CallPlan.CHILD_GONE:
                await self.journal.append(
                    error_outcome(
                        call, "subagent_missing", "the subagent for this task is no longer declared"
                    )
                )
            elif verdict is CallPlan.RECONCILE:
                jobs.append(functools.partial(self._reconcile, call, buffer))
            else:
                jobs.append(functools.partial(self._run_call, call, verdict, buffer))
        if jobs:
            _faults.reached("batch:start")
            self._unfinished = len(jobs)
            try:
                results = await asyncio.gather(*map(self._job, jobs), return_exceptions=True)
            except BaseException:
                await self._record_held()  # cancelled as the last call finished: keep its outcome
                raise
            for r in results:
                if isinstance(r, BaseException):
                    await self._record_held()
                    raise r
        if self.waiting is not None:
            # Every other call has its outcome recorded: the batch stays open, the attempt pauses,
            # and the batch's uncommitted state writes travel in its wait records.
            buffer.closed = True
            self.waiting.carry_state(
                self.scope.conversation_id, view.message_id, self.scope.sub.attempt, buffer.writes
            )
            raise self.waiting
        _faults.reached("batch:commit")
        buffer.closed = True
        writes: list[Record] = [
            StateWrite(id=f"{view.message_id}:state:{name}", name=name, value=value)
            for name, value in ({} if self._cut else buffer.writes).items()
        ]
        held = [] if self._held is None else [self._held]
        await self.journal.append(*held, *writes, batch_committed(view))

    async def _job(self, job: Callable[[], Awaitable[None]]) -> None:
        try:
            await job()
        except BaseException:
            self._troubled = True
            raise
        finally:
            self._unfinished -= 1

    def _hold(self, outcome: ToolOutcome, writes: list[Record] | None = None) -> bool:
        """Keep ``outcome`` (and the record of its call's ``writes``) to append with the
        batch's commit when its call is the batch's last to finish and the batch will commit
        now (nothing waits, nothing raised)."""
        if self._unfinished != 1 or self._troubled or self.waiting is not None:
            return False
        self._held, self._held_writes = outcome, list(writes or [])
        return True

    async def _record_held(self) -> None:
        """The batch will not commit now: the held outcome is recorded alone, as any other."""
        held, self._held = self._held, None
        if held is not None:
            await asyncio.shield(self.journal.append(held, *self._held_writes))

    async def _reconcile(self, call: AssistantToolCall, buffer: StateBuffer) -> None:
        """Ask the tool's reconcile about a call a dead attempt left unresolved: ``Done`` settles
        it with the real result, ``NotDone`` runs it again (once: the re-run is recorded
        first), anything else keeps the ``interrupted`` marker."""
        tool = self.rendered.tools[call.name]
        _faults.reached(f"reconcile:{call.name}")
        answer = await ask(tool, reconcile_call(call, self.scope.conversation_id))
        _faults.reached(f"reconcile-done:{call.name}")
        if isinstance(answer, NotDone):
            await self.journal.append(rerun_started(call))
            await self._run_call(call, CallPlan.RECONCILE, buffer, reconciled=NOT_DONE)
            return
        if isinstance(answer, Done):
            outcome = reconciled_done(call.message_id, call, answer)
        else:
            self._cut = True
            outcome = interrupted_outcome(
                call.message_id, InterruptedTool(call.name, call.tool_call_id)
            )
        # The batch's last outcome travels with its state writes, as a call's that ran does.
        if not self._hold(outcome):
            await self.journal.append(outcome)

    async def _run_call(
        self,
        call: AssistantToolCall,
        verdict: CallPlan,
        buffer: StateBuffer,
        *,
        reconciled: str | None = None,
    ) -> None:
        started = time.monotonic()
        attributes: dict[str, str | int | float | bool] = {
            "hearth.tool": call.name,
            "hearth.tool_call_id": call.tool_call_id,
            "hearth.resumed": verdict is not CallPlan.RUN,
        }
        mine = _CallState(buffer, self._sets)
        with telemetry.span("hearth.tool_call", attributes=attributes) as span:
            try:
                outcome = await self._call_outcome(call, verdict, mine, started)
            except WaitPending as pending:
                span.set_attribute("hearth.waiting", True)
                await self._wait(call, pending)
                return
            except PauseForWait as child:  # a delegated task's child waits: so does this call
                span.set_attribute("hearth.waiting", True)
                self._pause().add(child)
                return
            if outcome.is_error:
                telemetry.mark_error(span, "the tool call failed")
            if reconciled is not None:
                outcome = dataclasses.replace(outcome, reconciled=reconciled)
        # The body ran (or failed); its outcome is not recorded yet: the window a kill here
        # exposes is the one where an ordinary call must be marked interrupted, never re-run.
        _faults.reached(f"tool-done:{call.name}")
        writes: list[Record] = [call_writes(call, mine.writes, mine.order)] if mine.writes else []
        if not self._hold(outcome, writes):
            await self.journal.append(outcome, *writes)

    async def _call_outcome(
        self, call: AssistantToolCall, verdict: CallPlan, buffer: StateBuffer, started: float
    ) -> ToolOutcome:
        def ms() -> int:
            return int((time.monotonic() - started) * 1000)

        if verdict is CallPlan.RESUME_CHILD or (
            verdict is CallPlan.RUN and call.name == TASK_TOOL and self.rendered.subagents
        ):
            resume = verdict is CallPlan.RESUME_CHILD
            return await run_child_task(self.scope, call, self.rendered, resume=resume)
        tool = self.rendered.tools.get(call.name)
        if tool is None:
            return error_outcome(
                call, "unknown_tool", f"there is no tool named {call.name!r}", ms()
            )
        token = current_unit.set(buffer)
        caller = asyncio.current_task()
        try:
            content = await self._invoke(tool, call)
        except asyncio.CancelledError as exc:
            if stopping(exc):
                raise  # hearth stops the call: an abort, the deadline, a shutdown, a lost lease
            # The tool's own failure, as any exception is; re-running it would only raise it
            # again, each attempt.
            return error_outcome(
                call, "exception", "CancelledError raised by the tool (nothing cancelled it)", ms()
            )
        except FencedOut:
            raise
        except pydantic.ValidationError as exc:
            return error_outcome(call, "validation", _validation_message(exc), ms())
        except BaseException as exc:
            if isinstance(exc, BaseExceptionGroup) and (own := hearths_own(exc)) is not None:
                raise own from None  # a wait's pause (say) in a task group of the tool's
            if not app_failure(exc, caller):
                raise  # hearth's own: a durable wait's pause, an interrupt
            return error_outcome(call, "exception", described(exc), ms())
        finally:
            current_unit.reset(token)
        return call_outcome(call, content, ms())

    async def _invoke(self, tool: Tool, call: AssistantToolCall) -> Any:
        arguments = tool.validate(call.arguments)
        steps = self._steps(call) if tool.durable else None
        declared = self.rendered.workspace
        workspace = None if declared is None else await self.scope.workspace(declared)
        ctx = ToolContext(
            tool_call_id=call.tool_call_id,
            conversation_id=self.scope.conversation_id,
            log=logging.LoggerAdapter(log, {"tool": tool.name, "tool_call_id": call.tool_call_id}),
            step=steps,
            workspace=workspace,
            attachments=ConversationAttachments(self._attachment_parts(), self.scope.attachment),
        )
        _faults.reached(f"tool:{tool.name}")
        return await tool.invoke(arguments, ctx)

    def _attachment_parts(self) -> list[dict[str, Any]]:
        records = self.journal.records
        return [p for r in records if isinstance(r, UserMessage) for p in parts_of(r.content)]

    def _pause(self) -> PauseForWait:
        if self.waiting is None:
            self.waiting = PauseForWait()
        return self.waiting

    async def _wait(self, call: AssistantToolCall, pending: WaitPending) -> None:
        pause = self._pause()
        if pending.started:
            return  # still pending from an earlier attempt: its record and row are there
        now = await self.scope.store.now()
        record, expires = wait_started(call.message_id, call.tool_call_id, pending, now)
        fence = self.journal.fence
        pause.started.append((self.scope.conversation_id, record.stamped(*fence_of(fence))))
        if expires is not None:
            pause.expiries.append(expires)

    def _steps(self, call: AssistantToolCall) -> Steps:
        prefix = f"{call.message_id}:step:{id_part(call.tool_call_id)}:"
        # Found by the call's id, not by the record id's prefix: a sibling call whose id has
        # this one's and a ':' before it shared the prefix, and its steps replayed here.
        ours = f"{call.message_id}:step:"
        steps = [
            r
            for r in self.journal.records
            if isinstance(r, ToolStepSettled)
            and r.tool_call_id == call.tool_call_id
            and r.id.startswith(ours)
        ]
        recorded = {r.step: r.value for r in steps if not r.step.startswith(SETS_STEP)}
        recorded_sets = replayed_sets(steps)
        metrics = self.scope.env.metrics
        traced = telemetry.recording()  # asked once per call: the answer costs an environ lookup

        async def record(name: str, value: Any, gathered: dict[str, Any]) -> None:
            step = ToolStepSettled(
                id=f"{prefix}{name}", tool_call_id=call.tool_call_id, step=name, value=value
            )
            if not gathered.get("sets"):
                await self.journal.append(step)
                return
            kept = ToolStepSettled(
                id=f"{prefix}{SETS_STEP}{name}",
                tool_call_id=call.tool_call_id,
                step=f"{SETS_STEP}{name}",
                # (copies: a task the function started may set more, too late for the step)
                value={
                    "step": name,
                    "sets": dict(gathered["sets"]),
                    "order": dict(gathered["order"]),
                },
            )
            await self.journal.append(step, kept)  # (one transaction)

        async def transact(name: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
            async def work(conn: Any) -> Any:
                value = fn(conn)
                if not inspect.isawaitable(value):
                    raise StepError(
                        f"step.transaction {name!r} needs an async function: async def fn(conn)"
                    )
                value = json_value(name, await value)
                # Inside the transaction: the function's writes are made, not committed.
                _faults.reached(f"step-done:{name}")
                return value

            def records(value: Any) -> list[Record]:
                step = ToolStepSettled(
                    id=f"{prefix}{name}", tool_call_id=call.tool_call_id, step=name, value=value
                )
                return [step]

            (stored,) = await self.journal.transact(work, records, [f"{prefix}{name}"])
            assert isinstance(stored, ToolStepSettled)
            return stored.value

        def around(name: str) -> _StepTimer:
            return _StepTimer(name, traced, metrics.observe_step)

        started, ended = recorded_waits(self.journal.records, call.message_id, call.tool_call_id)
        return Steps(
            call.tool_call_id,
            recorded,
            record,
            around,
            message_id=call.message_id,
            waits_started=started,
            waits_ended=ended,
            transact=transact,
            before_run=self.scope.confirm_claim,
            capture=_Capture,
            replay=_set_again,
            recorded_sets=recorded_sets,
        )


class _StepSets(StateBuffer):
    """The state a step's function sets: the call's, and kept apart for the step's record, each
    with its place among the batch's sets (``order``, as the call keeps it): of two steps of
    one call (run at once) that set a name, the one that set it last wins on replay too."""

    def __init__(self, call: _CallState) -> None:
        super().__init__(call.committed)
        self.call = call
        self.order: dict[str, int] = {}

    def set(self, name: str, value: Any) -> None:
        self.call.set(name, value)  # (refused once the call's writes were taken)
        self.writes.pop(name, None)  # (in the order of the last sets)
        self.writes[name] = value
        self.order[name] = self.call.order[name]


class _Capture:
    """While a step's function runs: what it sets, set as in the call and gathered (``sets``
    and ``order`` for the step's record). A plain class: a generator context manager per step
    costs more than the rest of its bookkeeping."""

    __slots__ = ("_token",)

    def __enter__(self) -> dict[str, Any]:
        self._token: contextvars.Token[StateBuffer | None] | None = None
        gathered: dict[str, Any] = {}
        unit = current_unit.get()
        if not isinstance(unit, _CallState):  # (steps are a tool call's: always one)
            return gathered
        sets = _StepSets(unit)
        self._token = current_unit.set(sets)
        gathered["sets"], gathered["order"] = sets.writes, sets.order
        return gathered

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            current_unit.reset(self._token)


def _set_again(sets: dict[str, Any]) -> None:
    """A replayed step's sets, made again in the call (its function does not run)."""
    unit = current_unit.get()
    if unit is not None:
        for name, value in sets.items():
            unit.set(name, value)


def fence_of(fence: Fence) -> tuple[str, int]:
    return fence.submission_id, fence.attempt


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid arguments: " + "; ".join(parts)
