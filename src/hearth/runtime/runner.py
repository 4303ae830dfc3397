"""One attempt at one submission: the turn loop, driven by ``classify_recovery``.

The loop is the same for a fresh attempt and a recovered one, and for a delegated task's child
conversation: read the evidence, let the classifier decide, do that one step, repeat until the
loop settles. What differs between a submission and a child is the loop's ``TurnPolicy``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from hearth import _faults, telemetry
from hearth.agent import Agent, Rendered
from hearth.errors import (
    AbortRequested,
    ConfigurationError,
    CorruptData,
    FencedOut,
    ProviderError,
    app_failure,
    described,
)
from hearth.providers.base import estimate_tokens
from hearth.records import Record, ToolOutcome
from hearth.runtime.batch import ToolBatch
from hearth.runtime.budget import Spending
from hearth.runtime.compaction import ContextTooLong, compact, input_budget
from hearth.runtime.env import Env
from hearth.runtime.hooks import HookFailure, finish_seam, start_seam
from hearth.runtime.journal import Journal
from hearth.runtime.model_turn import build_request, model_turn, note_interrupted_stream
from hearth.runtime.recovery import (
    TURNS,
    Action,
    Decision,
    Evidence,
    assemble_messages,
    classify_recovery,
    close_open_messages,
    unknown_outcomes,
    unresolved_tools,
)
from hearth.runtime.rest import settlement_at_rest
from hearth.runtime.scope import InAttempt, Lease, Settlement, TurnPolicy, inside_attempts
from hearth.runtime.submission import SubmissionPolicy
from hearth.runtime.tasks import TaskPreempted
from hearth.runtime.waits import PauseForWait
from hearth.store.base import Submission
from hearth.store.rules import check_fence
from hearth.tools import Tool
from hearth.workspaces.base import OpenWorkspace, Workspace, close_all


class Attempt:
    """Runs one claimed submission until it settles, or until it is cancelled.

    ``Attempt(env, sub)`` runs the submission's own conversation. Given a ``policy``, the same
    loop runs another conversation under the submission's claim (a delegated task's child).
    """

    def __init__(
        self,
        env: Env,
        sub: Submission,
        policy: TurnPolicy | None = None,
        spending: Spending | None = None,
        lease: Lease | None = None,
        past_deadline: bool = False,
    ) -> None:
        self.env = env
        self.sub = sub  # the claim: fence, attempt number, budget and deadline
        self.lease = lease  # None: not watched (the row is read before each step runs)
        # The deadline's timer fired already: it has passed, whatever the store's clock says
        # (a clock read a little behind would start a new turn that no timer watches).
        self.past_deadline = past_deadline
        self.policy: TurnPolicy = policy if policy is not None else SubmissionPolicy(sub)
        self.store = env.store
        self.conversation_id = self.policy.conversation_id
        self.agent_name, _, self.id = self.conversation_id.partition("/")
        self.journal = Journal(
            env.store, self.conversation_id, sub.fence, env.metrics.observe_append
        )
        self.input_id = self.policy.input_id
        self.depth = self.policy.depth
        self.log = self.policy.log
        self._turn_span: telemetry.Span | None = None
        self._turns = 0
        # The submission's token count: its own loop's, shared with its children's loops.
        self.spending = spending or Spending(env.store, sub.id, self.journal)
        self.paused = False  # the attempt ended by a durable wait (the submission waits)
        self.next_expiry: float | None = None  # the earliest expiry of the waits it began
        # The workspaces this attempt opened (or is opening), closed when it ends (an ephemeral
        # one is removed).
        self._workspaces: dict[Workspace, asyncio.Future[OpenWorkspace]] = {}
        self._attachments: dict[str, bytes | None] = {}

    # --- the loop -------------------------------------------------------------------------
    @property
    def agent(self) -> Agent | None:
        return self.policy.agent(self.env)

    async def run(self) -> None:
        inside = InAttempt(self.conversation_id)
        token = inside_attempts.set((*inside_attempts.get(), inside))
        try:
            if self.sub.damage is not None:
                await self._settle_corrupt(f"submission {self.sub.id}: {self.sub.damage}")
                return
            await self._run()
        except CorruptData as exc:
            if self.depth > 0:
                raise  # a child's: its task call fails, and its parent goes on
            await self._settle_corrupt(str(exc))
        finally:
            inside.running = False  # (a task its code started may outlive it)
            inside_attempts.reset(token)
            self._end_turn()
            await self._close_workspaces()

    async def workspace(self, declared: Workspace) -> OpenWorkspace:
        """``declared`` opened for this attempt at this conversation, once: the parallel calls
        of a batch share one opening (each opened it, and an ephemeral workspace's opening
        wiped what a sibling had written). One that failed is tried again by the next call."""
        opening = self._workspaces.get(declared)
        if opening is None or (opening.done() and opening.exception() is not None):
            opening = self._workspaces[declared] = asyncio.ensure_future(
                declared.open(
                    self.conversation_id, submission_id=self.sub.id, attempt=self.sub.attempt
                )
            )
        return await asyncio.shield(opening)  # a call cancelled leaves the opening to the rest

    async def confirm_claim(self) -> None:
        if self.lease is not None and self.lease.known_held():
            return
        # Past its lease (this process stood still): the row says whether the claim still holds,
        # by the rule every fenced write is judged by.
        row = await self.store.get_submission(self.sub.id)
        check_fence(
            self.sub.fence,
            None if row is None else row.status,
            None if row is None else row.attempt,
        )

    async def attachment(self, sha256: str) -> bytes | None:
        if sha256 not in self._attachments:
            blob = await self.store.get_attachment(sha256)
            self._attachments[sha256] = None if blob is None else blob.data
        return self._attachments[sha256]

    async def _close_workspaces(self) -> None:
        openings, self._workspaces = list(self._workspaces.values()), {}
        pending = [o for o in openings if not o.done()]
        for opening in pending:  # (an opening whose every caller was cancelled)
            opening.cancel()
        if pending:
            await asyncio.wait(pending)
        opened = [o.result() for o in openings if not o.cancelled() and o.exception() is None]
        await close_all(opened, self.log)

    def _turn(self, *, begin: bool) -> telemetry.Span:
        """The span of the current turn: a model call and the tool calls of its answer. A
        recovered attempt that starts at a tool batch opens one for it."""
        if begin or self._turn_span is None:
            self._end_turn()
            self._turns += 1
            self._turn_span = telemetry.start(
                "hearth.turn",
                {"hearth.conversation_id": self.conversation_id, "hearth.turn": self._turns},
            )
        return self._turn_span

    def _end_turn(self) -> None:
        if self._turn_span is not None:
            self._turn_span.end()
            self._turn_span = None

    async def _run(self) -> None:
        await self.journal.load_for(self.sub.id)
        while True:
            # One read per turn boundary: new records, the state, the submission's row.
            view = await self.store.turn_view(
                self.conversation_id, self.journal.last_offset, self.sub.id
            )
            self.journal.take(view.records)
            rendered, render_error = self._try_render(view.state)
            evidence = await self._evidence(rendered, view.submission)
            decision = classify_recovery(evidence)
            if decision.action in TURNS and rendered is not None and self._over_budget(rendered):
                decision = classify_recovery(dataclasses.replace(evidence, over_budget=True))
            if rendered is None and decision.action not in _SETTLING:
                assert render_error is not None
                await self._settle_failed(render_error)
                return
            try:
                if await self._step(decision, rendered):
                    return
            except (ConfigurationError, _AgentFailure) as exc:
                tools = None if rendered is None else rendered.tools
                await self._settle_failed({"type": "agent_error", "message": str(exc)}, tools)
                return
            except HookFailure as exc:
                tools = None if rendered is None else rendered.tools
                await self._settle_failed({"type": "hook_error", "message": str(exc)}, tools)
                return
            except TaskPreempted:
                continue  # a child stopped for an abort or the deadline: classify again
            except PauseForWait as pause:
                if self.depth > 0:
                    raise  # a child's wait pauses its parent's batch, then the submission
                if await self._pause(pause):
                    return
                # An abort came first: classifying again settles the submission aborted.

    async def _pause(self, pause: PauseForWait) -> bool:
        """End the attempt for durable waits: the submission waits, without a lease. False
        when an abort intent is stamped (nothing was written)."""
        for _, record in pause.started:
            _faults.reached(f"before:{record.type}")
        _faults.reached("before:store.begin_wait")
        try:
            await self.store.begin_wait(self.sub.fence, pause.started, pause.carried)
        except AbortRequested:
            return False
        _faults.reached("after:store.begin_wait")
        for _, record in pause.started:
            _faults.reached(f"after:{record.type}")
        self.paused = True
        self.next_expiry = pause.next_expiry
        self.log.info("waiting for %d wait(s)", len(pause.started) or 1)
        return True

    async def run_child(self, policy: TurnPolicy) -> None:
        """Run a delegated task's child conversation through this loop, under this claim."""
        await Attempt(self.env, self.sub, policy, self.spending, self.lease).run()

    def _try_render(self, state: dict[str, Any]) -> tuple[Rendered | None, dict[str, Any] | None]:
        if self.agent is None:
            message = f"agent {self.agent_name!r} is not declared"
            return None, {"type": "agent_missing", "message": message}
        try:
            return self._render(state), None
        except (ConfigurationError, _AgentFailure) as exc:
            return None, {"type": "agent_error", "message": str(exc)}

    async def _evidence(self, rendered: Rendered | None, row: Submission | None) -> Evidence:
        mine = self.submission_records()
        closes = close_open_messages(mine)
        if closes:
            await self.journal.append(*closes)
            mine = self.submission_records()
        abort, deadline_passed = await self._stop_requests(row)
        max_tokens = self._max_tokens()
        spent = 0 if max_tokens is None else await self.spending.count()
        return Evidence(
            records=mine,
            input_appended=bool(mine),
            attempt=self.sub.attempt,
            waits=self.sub.waits,
            releases=self.sub.releases,
            max_attempts=self.sub.max_attempts,
            deadline_passed=deadline_passed,
            abort_requested=abort,
            start_hooks=bool(rendered and rendered.on_start),
            finish_hooks=bool(rendered and rendered.on_finish),
            tokens_spent=spent,
            max_tokens=max_tokens,
        )

    def _max_tokens(self) -> int | None:
        """The submission's spending budget (its own agent's, also in a delegated task's child:
        a child runs under its parent's budget), checked at every turn boundary."""
        agent = self.env.agents.get(self.sub.agent)
        return None if agent is None else agent.durability.max_tokens

    async def _stop_requests(self, row: Submission | None) -> tuple[bool, bool]:
        """Whether an abort intent is stamped on ``row`` (the submission as just read), and
        whether the deadline has passed."""
        abort = row is not None and row.abort_requested_at is not None
        deadline = self.sub.deadline
        if deadline is None:
            return abort, False
        return abort, self.past_deadline or await self.store.now() >= deadline

    async def _retry_too_late(self, d: Decision) -> bool:
        """Fail the submission now, naming the provider's error, when the retry's delay (a
        ``Retry-After`` of an hour, say) ends past the deadline; True once settled."""
        deadline = self.sub.deadline
        if deadline is None:
            return False
        left = deadline - await self.store.now()
        if d.delay <= left:
            return False
        said = (d.error or {}).get("message", "the model provider failed")
        message = (
            f"{said} (a retry was due in {d.delay:.0f} s, past the submission's deadline in"
            f" {max(left, 0):.0f} s)"
        )
        await self._settle_failed({"type": "provider_error", "message": message})
        return True

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
            return await self._settle(d, rendered)
        assert rendered is not None
        match d.action:
            case Action.START:
                await self.journal.append(self.policy.input_record())
            case Action.RUN_START_HOOKS:
                assert d.message_id is not None
                await start_seam(self, d.message_id, rendered)
            case Action.RUN_FINISH_HOOKS:
                assert d.message_id is not None
                await finish_seam(self, d.message_id, rendered)
            case Action.CONTINUE:
                if not await self.policy.join_queued(self):
                    with telemetry.use(self._turn(begin=True)):
                        await model_turn(self, rendered)
            case Action.CONTINUE_PARTIAL:
                await note_interrupted_stream(self, d.message_id)
                with telemetry.use(self._turn(begin=True)):
                    await model_turn(self, rendered)
            case Action.RETRY_TRANSIENT:
                if await self._retry_too_late(d):
                    return True
                if d.partial:
                    await note_interrupted_stream(self, d.message_id)
                self.log.info("transient provider error; retrying in %.1fs", d.delay)
                await asyncio.sleep(d.delay)
                with telemetry.use(self._turn(begin=True)):
                    await model_turn(self, rendered)
            case Action.RUN_TOOLS:
                assert d.message_id is not None
                with telemetry.use(self._turn(begin=False)):
                    await self._tool_batch(d.message_id, rendered)
            case Action.COMPACT:
                try:
                    await self._compact(rendered, refused=d.error)
                except ContextTooLong as exc:
                    await self._settle_failed({"type": "context_overflow", "message": str(exc)})
                    return True
                except ProviderError as exc:
                    message = f"compaction failed: {exc.message}"
                    await self._settle_failed({"type": "provider_error", "message": message})
                    return True
        return False

    async def _settle(self, d: Decision, rendered: Rendered | None) -> bool:
        if d.action is Action.SETTLE_COMPLETED:
            settlement = Settlement("completed", reply=d.reply or "")
        else:
            tools = rendered.tools if rendered is not None else None
            subagents = (
                {} if rendered is None else {n: s.agent for n, s in rendered.subagents.items()}
            )
            settlement = await settlement_at_rest(self, d, tools, subagents)
        await self.policy.finish(self, settlement)
        return True

    async def _settle_corrupt(self, message: str) -> None:
        """Fail the submission at once: what it needs cannot be read, and no attempt could read
        it (each spun through releases and retries, never settling). Nothing of the stream is
        read to settle it."""
        self.log.error("hearth: %s; the submission fails (corrupt_data)", message)
        await self.policy.finish(
            self, Settlement("failed", error={"type": "corrupt_data", "message": message})
        )

    async def _settle_failed(
        self, error: dict[str, Any], tools: Mapping[str, Tool] | None = None
    ) -> None:
        """Settle failed for ``error``, with the conversation at rest as for every failure: a
        recovered attempt whose agent cannot render left its tool batch open, and every later
        request carried calls without results (refused by the provider, for good)."""
        views = assemble_messages(self.submission_records())
        interrupted = unresolved_tools(views)  # (what is marked now)
        # Named, with an advisory, as the settlement names them: also a call an earlier
        # recovery marked, in a batch that never committed.
        unknown = unknown_outcomes(views)
        decision = Decision(
            Action.SETTLE_FAILED,
            error={**error, "interrupted_tools": [t.to_json() for t in unknown]},
            interrupted=interrupted,
            signal="submission_interrupted" if unknown else None,
        )
        await self.policy.finish(self, await settlement_at_rest(self, decision, tools))

    # --- steps ----------------------------------------------------------------------------
    def _render(self, state: dict[str, Any]) -> Rendered:
        agent = self.agent
        assert agent is not None
        _faults.reached("render")
        try:
            return agent.render(self.id, state)
        except ConfigurationError:
            raise
        except BaseException as exc:
            if not app_failure(exc, asyncio.current_task()):  # (a sync call: none was closed)
                raise
            raise _AgentFailure(f"rendering {self.agent_name!r} raised {described(exc)}") from exc

    async def _tool_batch(self, message_id: str, rendered: Rendered) -> None:
        views = assemble_messages(self.submission_records())
        view = next(v for v in views if v.message_id == message_id)
        await ToolBatch(self, rendered, view).run()

    def _over_budget(self, rendered: Rendered) -> bool:
        """Whether the next turn's request, as the records rebuild it, is too long to send."""
        try:
            provider, model = self.env.providers.resolve(rendered.model)
        except ConfigurationError:
            return False  # the turn itself reports it
        request = build_request(self, rendered, model)
        return estimate_tokens(request) > input_budget(provider.context_window(model))

    async def _compact(self, rendered: Rendered, refused: dict[str, Any] | None = None) -> None:
        provider, model = self.env.providers.resolve(rendered.model)
        request = build_request(self, rendered, model)
        said = None if refused is None else str(refused.get("message", ""))
        await compact(self, provider, model, request, refused=said)


class _AgentFailure(Exception):
    """The agent's own code raised while rendering: a bug to report, not a crash to retry."""


_SETTLING = (Action.SETTLE_ABORTED, Action.SETTLE_FAILED, Action.SETTLE_COMPLETED)

__all__ = ["Attempt", "Env", "FencedOut", "ToolOutcome"]
