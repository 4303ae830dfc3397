"""One attempt at one submission: the turn loop, driven by ``classify_recovery``.

The loop is the same for a fresh attempt and a recovered one: read the evidence, let the
classifier decide, do that one step, repeat until the submission settles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from hearth import _faults
from hearth.agent import Agent, Rendered
from hearth.errors import ConfigurationError, FencedOut, ProviderError
from hearth.providers.base import ModelRequest, TextDelta, ToolCallEvent, ToolSpec, estimate_tokens
from hearth.records import (
    AssistantMessageCompleted,
    AssistantMessageStarted,
    AssistantToolCall,
    Compaction,
    Record,
    Signal,
    ToolOutcome,
    UserMessage,
)
from hearth.runtime.batch import ToolBatch, mark_interrupted
from hearth.runtime.compaction import compact, input_budget
from hearth.runtime.deltas import DeltaWriter
from hearth.runtime.env import Env
from hearth.runtime.hooks import HookFailure, finish_seam, start_seam
from hearth.runtime.journal import Journal
from hearth.runtime.model_context import STREAM_INTERRUPTED_NOTE, build_context
from hearth.runtime.recovery import (
    Action,
    Decision,
    Evidence,
    assemble_messages,
    classify_recovery,
    close_open_messages,
)
from hearth.runtime.tasks import (
    MAX_DEPTH,
    TaskPreempted,
    bring_child_to_rest,
    run_child_task,
    task_tool_spec,
)
from hearth.store.base import Submission

log = logging.getLogger("hearth.runner")


class Attempt:
    """Runs one claimed submission until it settles, or until it is cancelled."""

    def __init__(self, env: Env, sub: Submission) -> None:
        self.env = env
        self.sub = sub
        self.store = env.store
        self.conversation_id = sub.conversation_id
        self.agent_name, _, self.id = sub.conversation_id.partition("/")
        self.journal = Journal(env.store, sub.conversation_id, sub.fence)
        self.input_id = f"{sub.id}:input"
        self.log = logging.LoggerAdapter(log, {"submission_id": sub.id})

    # --- the loop -------------------------------------------------------------------------
    depth = 0  # delegation depth: 0 for a submission, 1 for its task's child, ...

    @property
    def agent(self) -> Agent | None:
        return self.env.agents.get(self.agent_name)

    async def run(self) -> None:
        compaction = await self.store.last_of_type(self.conversation_id, Compaction.type)
        after = compaction.first_kept_offset - 1 if isinstance(compaction, Compaction) else -1
        await self.journal.load(after)
        while True:
            rendered, render_error = await self._try_render()
            evidence = await self._evidence(rendered)
            decision = classify_recovery(evidence)
            if rendered is None and decision.action not in _SETTLING:
                assert render_error is not None
                await self._settle_failed(render_error)
                return
            try:
                if await self._step(decision, rendered):
                    return
            except (ConfigurationError, _AgentFailure) as exc:
                await self._settle_failed({"type": "agent_error", "message": str(exc)})
                return
            except HookFailure as exc:
                await self._settle_failed({"type": "hook_error", "message": str(exc)})
                return
            except TaskPreempted:
                continue  # a child stopped for an abort or the deadline: classify again

    async def _try_render(self) -> tuple[Rendered | None, dict[str, Any] | None]:
        if self.agent is None:
            message = f"agent {self.agent_name!r} is not declared"
            return None, {"type": "agent_missing", "message": message}
        try:
            return await self._render(), None
        except (ConfigurationError, _AgentFailure) as exc:
            return None, {"type": "agent_error", "message": str(exc)}

    async def _evidence(self, rendered: Rendered | None) -> Evidence:
        await self.journal.refresh()
        mine = self.submission_records()
        closes = close_open_messages(mine)
        if closes:
            await self.journal.append(*closes)
            mine = self.submission_records()
        abort, deadline_passed = await self._stop_requests()
        return Evidence(
            records=mine,
            input_appended=bool(mine),
            attempt=self.sub.attempt,
            max_attempts=self.sub.max_attempts,
            deadline_passed=deadline_passed,
            abort_requested=abort,
            start_hooks=bool(rendered and rendered.on_start),
            finish_hooks=bool(rendered and rendered.on_finish),
        )

    async def _stop_requests(self) -> tuple[bool, bool]:
        """Whether an abort intent is stamped, and whether the deadline has passed."""
        row = await self.store.get_submission(self.sub.id)
        abort = row is not None and row.abort_requested_at is not None
        deadline = self.sub.deadline
        return abort, deadline is not None and time.time() >= deadline

    def submission_records(self) -> list[Record]:
        """The records of this submission, from its input on (empty before the input)."""
        records = self.journal.records
        for i in range(len(records) - 1, -1, -1):
            if records[i].id == self.input_id:
                return records[i:]
        return []

    async def _step(self, d: Decision, rendered: Rendered | None) -> bool:
        """Do what the decision says; True once the submission is settled."""
        if d.action in _SETTLING:
            return await self._settle(d)
        assert rendered is not None
        match d.action:
            case Action.START:
                await self._append_input()
            case Action.RUN_START_HOOKS:
                assert d.message_id is not None
                await start_seam(self, d.message_id, rendered)
            case Action.RUN_FINISH_HOOKS:
                assert d.message_id is not None
                await finish_seam(self, d.message_id, rendered)
            case Action.CONTINUE:
                if not await self._join_queued():
                    await self._model_turn(rendered)
            case Action.CONTINUE_PARTIAL:
                await self._signal_interrupted_stream(d.message_id)
                await self._model_turn(rendered)
            case Action.RETRY_TRANSIENT:
                if d.partial:
                    await self._signal_interrupted_stream(d.message_id)
                self.log.info("transient provider error; retrying in %.1fs", d.delay)
                await asyncio.sleep(d.delay)
                await self._model_turn(rendered)
            case Action.RUN_TOOLS:
                assert d.message_id is not None
                await self._tool_batch(d.message_id, rendered)
            case Action.COMPACT:
                try:
                    compacted = await self._compact(rendered)
                except ProviderError as exc:
                    compacted, reason = False, f"compaction failed: {exc.message}"
                else:
                    reason = (
                        "the context exceeds the model's window and nothing older can be compacted"
                    )
                if not compacted:
                    await self._settle_failed({"type": "provider_error", "message": reason})
                    return True
        return False

    async def _settle(self, d: Decision) -> bool:
        if d.action is Action.SETTLE_COMPLETED:
            await self._finish("completed", reply=d.reply or "", error=None, records=[])
        else:
            await self._bring_to_rest(d)
        return True

    async def _finish(
        self,
        outcome: str,
        *,
        reply: str | None,
        error: dict[str, Any] | None,
        records: list[Record],
    ) -> None:
        """Write the settlement (after ``records``) exactly once."""
        await self.journal.settle(outcome=outcome, reply=reply, error=error, records_before=records)
        self.env.metrics.settled(outcome)

    # --- steps ----------------------------------------------------------------------------
    async def _append_input(self) -> None:
        payload = self.sub.payload
        record: Record
        if self.sub.kind == "signal":
            sig = payload.get("signal", {})
            record = Signal(
                id=self.input_id,
                signal_type=str(sig.get("type", "signal")),
                body=str(sig.get("body", "")),
                attributes=dict(sig.get("attributes") or {}),
            )
        else:
            record = UserMessage(
                id=self.input_id, message_id=self.sub.id, content=payload.get("message", "")
            )
        await self.journal.append(record)

    async def _signal_interrupted_stream(self, message_id: str | None) -> None:
        await self.journal.append(
            Signal(
                id=f"{message_id}:interrupted",
                signal_type="stream_interrupted",
                body=STREAM_INTERRUPTED_NOTE,
                attributes={"message_id": message_id},
            )
        )

    async def _render(self) -> Rendered:
        agent = self.agent
        assert agent is not None
        state = await self.store.get_state(self.conversation_id)
        try:
            return agent.render(self.id, state)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise _AgentFailure(
                f"rendering {self.agent_name!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _request(self, rendered: Rendered, model: str) -> ModelRequest:
        summary, messages = build_context(self.journal.records)
        tools = tuple(t.spec() for t in rendered.tools.values())
        return ModelRequest(
            model=model,
            system=rendered.system,
            messages=tuple(messages),
            tools=tools + self._extra_tools(rendered),
            options=dict(rendered.model_options),
            summary=summary,
            conversation_id=self.conversation_id,
        )

    def _extra_tools(self, rendered: Rendered) -> tuple[ToolSpec, ...]:
        if rendered.subagents and self.depth < MAX_DEPTH:
            return (task_tool_spec(rendered),)
        return ()

    async def _model_turn(self, rendered: Rendered) -> None:
        provider, model = self.env.providers.resolve(rendered.model)
        request = self._request(rendered, model)
        window = provider.context_window(model)
        if estimate_tokens(request) > input_budget(window):
            if await self._compact(rendered):
                request = self._request(rendered, model)
        mid = f"m_{uuid.uuid4().hex[:20]}"
        writer = DeltaWriter(self.journal, mid)
        started = False

        async def ensure_started() -> None:
            nonlocal started
            if not started:
                started = True
                await self.journal.append(
                    AssistantMessageStarted(
                        id=f"{mid}:started", message_id=mid, model=rendered.model
                    )
                )

        calls: list[AssistantToolCall] = []
        stop_reason, usage = "stop", None
        try:
            async with contextlib.aclosing(provider.stream(request)) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        if event.text:
                            await ensure_started()
                            await writer.add(event.text)
                    elif isinstance(event, ToolCallEvent):
                        c = event.call
                        calls.append(
                            AssistantToolCall(
                                id=f"{mid}:call:{c.id}",
                                message_id=mid,
                                tool_call_id=c.id,
                                name=c.name,
                                arguments=c.arguments,
                            )
                        )
                    else:
                        stop_reason, usage = event.stop_reason, event.usage
        except ProviderError as exc:
            await writer.close()
            await ensure_started()
            await self.journal.append(
                AssistantMessageCompleted(
                    id=f"{mid}:completed",
                    message_id=mid,
                    stop_reason="error",
                    text="".join(writer.text),
                    error=exc.to_json(),
                )
            )
            return
        finally:
            writer.abandon()
        await writer.close()
        await ensure_started()
        await self.journal.append(
            *calls,
            AssistantMessageCompleted(
                id=f"{mid}:completed",
                message_id=mid,
                stop_reason="tool_use" if calls else stop_reason,
                text="".join(writer.text),
                usage=usage,
            ),
        )

    async def _tool_batch(self, message_id: str, rendered: Rendered) -> None:
        views = assemble_messages(self.submission_records())
        view = next(v for v in views if v.message_id == message_id)
        await ToolBatch(self, rendered, view).run()

    async def run_task(self, call: AssistantToolCall, rendered: Rendered) -> ToolOutcome:
        """Run (or resume) a delegated task in its child conversation."""
        return await run_child_task(self, call, rendered)

    async def _compact(self, rendered: Rendered) -> bool:
        provider, model = self.env.providers.resolve(rendered.model)
        return await compact(self, provider, model)

    # --- hooks and joining ----------------------------------------------------------------
    async def _join_queued(self) -> bool:
        """At a turn boundary (a tool batch just committed), let messages that arrived
        meanwhile join the live response. True when any joined."""
        views = assemble_messages(self.submission_records())
        if not views or not views[-1].committed:
            return False
        queued = await self.store.list_submissions(self.conversation_id, statuses=("queued",))
        joined = False
        for sub in queued:
            if sub.kind != "message" or sub.abort_requested_at is not None:
                break  # order is kept: nothing joins past one that cannot
            record = UserMessage(
                id=f"{sub.id}:input", message_id=sub.id, content=sub.payload.get("message", "")
            )
            _faults.reached("before:user_message")
            if not await self.store.join(self.sub.fence, sub.id, self.journal.stamp([record])):
                break
            _faults.reached("after:user_message")
            joined = True
        return joined

    async def _bring_to_rest(self, d: Decision) -> None:
        """Settle aborted or failed: mark unresolved calls, leave an advisory, settle."""
        for tool in d.interrupted:
            if tool.child_conversation_id:
                await bring_child_to_rest(self, tool.child_conversation_id)
        views = assemble_messages(self.submission_records())
        records = mark_interrupted(views[-1], d.interrupted) if views else []
        error = d.error
        if d.signal is not None:
            records.append(
                Signal(
                    id=f"{self.sub.id}:{d.signal}",
                    signal_type=d.signal,
                    body=(error or {}).get("message", ""),
                    attributes={
                        "reason": (error or {}).get("type"),
                        "interrupted_tools": [t.to_json() for t in d.interrupted],
                    },
                )
            )
        outcome = "aborted" if d.action is Action.SETTLE_ABORTED else "failed"
        if outcome == "aborted" and error is not None:
            error = {**error, "interrupted_tools": [t.to_json() for t in d.interrupted]}
        await self._finish(outcome, reply=None, error=error, records=records)

    async def _settle_failed(self, error: dict[str, Any]) -> None:
        await self._finish(
            "failed", reply=None, error={"interrupted_tools": [], **error}, records=[]
        )


class _AgentFailure(Exception):
    """The agent's own code raised while rendering: a bug to report, not a crash to retry."""


_SETTLING = (Action.SETTLE_ABORTED, Action.SETTLE_FAILED, Action.SETTLE_COMPLETED)

__all__ = ["Attempt", "Env", "FencedOut", "ToolOutcome"]
