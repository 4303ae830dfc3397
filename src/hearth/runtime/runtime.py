"""The in-process runtime: admission, reading outcomes, aborts and history over one store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from hearth import _faults, telemetry
from hearth.agent import Agent
from hearth.attachments import Attachment, is_sha256
from hearth.channels import Channel
from hearth.config import Settings
from hearth.errors import (
    AttachmentNotFound,
    ConversationNotFound,
    DelegatedConversation,
    HearthError,
    InvalidId,
    InvalidInput,
    ReadOfOwnConversation,
    ShuttingDown,
    SubmissionNotFound,
    UnknownAgent,
    WaitNotFound,
)
from hearth.ids import RESERVED_KEY_PREFIXES
from hearth.jsontext import names_something as _names
from hearth.jsontext import unpaired_surrogate
from hearth.receipts import (
    MAX_IDEMPOTENCY_KEY,
    AbortResult,
    Receipt,
    Reply,
    check_id,
    reply_or_raise,
)
from hearth.records import Record
from hearth.runtime.admission import (
    blobs_of,
    check_attachments,
    declared,
    input_payload,
    new_submission,
    refuse_delegated,
)
from hearth.runtime.coordinator import Coordinator
from hearth.runtime.deliveries import Deliveries, DeliveryReceipt
from hearth.runtime.env import Env
from hearth.runtime.scheduler import Scheduler
from hearth.runtime.scope import inside_attempts
from hearth.runtime.settled import SettledLooks
from hearth.runtime.shared_reads import SharedReads
from hearth.runtime.waits import resolution
from hearth.schedules import Schedule, iso
from hearth.store.base import (
    LIST_LIMIT,
    UNSETTLED,
    Blob,
    ConversationInfo,
    ConversationSummary,
    Store,
    StoredDelivery,
    Submission,
    Wait,
    all_submissions,
)

HEALTH_TIMEOUT_S = 1.5  # under a load balancer's usual 2 s health-check timeout
SETTLE_ALL_LOOK_S = 0.25  # how often ``settle_all`` looks at what is still queued or running
# An answer sent before its wait exists (a tool learns the id with ``step.wait_id`` and sends it
# on; the wait is recorded once the call's batch pauses): held this long, under the SDK's 30 s
# request timeout, while a submission of the conversation is queued or running.
EARLY_ANSWER_S = 20.0
EARLY_ANSWER_LOOK_S = 1.0  # how often a held answer looks again when no append wakes it
EARLY_ANSWER_SPACING_S = 0.25  # and at most this often, however busy its conversation
EARLY_ANSWERS_HELD = 64  # answers held at once by one runtime; past them, one is not held


def _stopped_before(submission_id: str) -> ShuttingDown:
    return ShuttingDown(
        f"the runtime stopped before submission {submission_id} settled (its work goes on"
        " when a runtime runs on this database again: read it there)"
    )


class Runtime:
    """What ``async with app.run() as rt`` gives you.

    Example::

        async with app.run() as rt:
            receipt = await rt.dispatch("support", "c-1", "hello")
            reply = await rt.read(receipt)
    """

    def __init__(
        self,
        env: Env,
        settings: Settings,
        *,
        channels: Sequence[Channel] = (),
        schedules: Sequence[Schedule] = (),
        schedule_clock: Callable[[], float] | None = None,
    ) -> None:
        self.env = env
        self.store: Store = env.store
        self.settings = settings
        self.coordinator = Coordinator(env, settings)
        self.shutting_down = False
        self.early_answers = 0  # answers held for their wait to be recorded (``resolve``)
        self.stopped = False  # a read that would wait raises ShuttingDown
        self.tail_reads = SharedReads(env.store)
        self.settled_looks = SettledLooks(env.store)
        self.channels = Deliveries(env, {c.name: c for c in channels})
        self.scheduler = Scheduler(env, schedules, schedule_clock)
        self._home: asyncio.AbstractEventLoop | None = None  # the loop it was started on

    @property
    def agents(self) -> dict[str, Agent]:
        return self.env.agents

    def _at_home(self) -> None:
        """``RuntimeError`` when called from another event loop than the one the runtime was
        started on: its wake-ups would be set from the wrong thread, and a read never end."""
        home = self._home
        if home is not None and asyncio.get_running_loop() is not home:
            raise RuntimeError(
                "this hearth runtime runs on the event loop it was started on; from another"
                " thread, hand it the call: asyncio.run_coroutine_threadsafe(rt.dispatch(...),"
                " loop).result()"
            )

    async def start(self) -> None:
        self._home = asyncio.get_running_loop()
        await self.coordinator.start()
        self.scheduler.start()

    async def stop(self) -> None:
        """Graceful shutdown: admit nothing more, interrupt running work without settling it,
        and release its leases so that the next owner resumes it at once."""
        self.shutting_down = True
        try:
            await self.scheduler.stop()
            await self.coordinator.stop()
        finally:
            # Nothing settles here any more: the reads still waiting end now, not never.
            self.stopped = True
            self.store.events.end_settled_waits()
        await self.settled_looks.close()

    # --- admission ------------------------------------------------------------------------
    def agent(self, name: str) -> Agent:
        return declared(self.env.agents, name)

    async def dispatch(
        self,
        agent: str,
        id: str,
        message: str | None = None,
        *,
        signal: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        attachments: Sequence[Attachment] | None = None,
    ) -> Receipt:
        """Admit one input durably and return at once with its receipt.

        ``attachments`` (``hearth.Attachment``) are stored in the admission's transaction, once
        per distinct content, and referenced from the message; a message with attachments may
        have no text. A file over ``max_attachment`` bytes raises ``AttachmentTooLarge``.

        ``traceparent`` (W3C Trace Context) makes the submission's trace a child of the caller's;
        without it the admission's span continues the current span, if any. Every attempt at the
        submission continues that trace."""
        self._at_home()
        try:
            self.agent(agent)
        except UnknownAgent:
            # A delegated task's conversation of a subagent the App does not list: it takes no
            # input of its own, as any delegated conversation (not "unknown agent").
            await self.addressed(agent, id)
            raise DelegatedConversation(
                f"{agent}/{id} is the conversation of a delegated task: it takes no input of"
                " its own (send to its parent)"
            ) from None
        check_id(id)
        checked = check_attachments(attachments, self.settings.max_attachment)
        kind, payload = input_payload(message, signal, checked)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str)
            or not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY
            or "\x00" in idempotency_key  # no store keeps it alike (PostgreSQL cannot at all)
            or unpaired_surrogate(idempotency_key) is not None  # no UTF-8 form at all
        ):
            raise InvalidInput(
                f"idempotency_key must be a string of 1-{MAX_IDEMPOTENCY_KEY} characters,"
                " without NUL or an unpaired surrogate",
                "idempotency_key",
            )
        if idempotency_key is not None and idempotency_key.startswith(RESERVED_KEY_PREFIXES):
            # One key of a schedule's occurrence taken first kept the occurrence out for good.
            raise InvalidInput(
                "idempotency keys starting with 'schedule:' or 'channel:' are hearth's own (a"
                " schedule's occurrences, a channel's deliveries); choose another",
                "idempotency_key",
            )
        if self.shutting_down:
            raise ShuttingDown("the runtime is shutting down and admits no new work")
        attributes: dict[str, str | int | float | bool] = {
            "hearth.agent": agent,
            "hearth.conversation_id": f"{agent}/{id}",
            "hearth.kind": kind,
        }
        parent = telemetry.context_of(traceparent)
        with telemetry.span(
            "hearth.submission", parent=parent, kind=telemetry.SpanKind.PRODUCER,
            attributes=attributes,
        ) as span:  # fmt: skip
            await refuse_delegated(self.store, f"{agent}/{id}")
            _faults.reached("before:store.admit")
            admission = await self.store.admit(
                new_submission(
                    self.env.agents,
                    agent,
                    id,
                    kind,
                    payload,
                    idempotency_key=idempotency_key,
                    traceparent=telemetry.current_traceparent(),
                    blobs=blobs_of(checked),
                )
            )
            _faults.reached("after:store.admit")
            span.set_attribute("hearth.submission_id", admission.submission.id)
            span.set_attribute("hearth.deduplicated", admission.deduplicated)
        if not admission.deduplicated:
            self.env.metrics.admitted += 1
            self.settled_looks.admitted(admission.submission.id)
        sub = admission.submission
        return Receipt(
            submission_id=sub.id,
            conversation_id=sub.conversation_id,
            offset=admission.offset,
            accepted_at=sub.accepted_at,
            deduplicated=admission.deduplicated,
        )

    # --- inputs from outside: channels and schedules ----------------------------------------
    async def deliver(
        self, channel: str, headers: Mapping[str, str], body: bytes
    ) -> DeliveryReceipt:
        """Verify a request to ``channel`` and admit every dispatch it routes to, once per
        delivery id (``POST /channels/{name}``)."""
        self._at_home()
        self.channels.channel(channel)
        if self.shutting_down:
            raise ShuttingDown("the runtime is shutting down and admits no new work")
        return await self.channels.deliver(channel, headers, body)

    async def replay_delivery(self, channel: str, delivery_id: str) -> DeliveryReceipt:
        """Route a failed delivery of ``channel`` again (after a fix)."""
        self._at_home()
        self.channels.channel(channel)
        if self.shutting_down:
            raise ShuttingDown("the runtime is shutting down and admits no new work")
        return await self.channels.replay(channel, delivery_id)

    async def deliveries(
        self, channel: str, *, status: str | None = None, limit: int = 100
    ) -> list[StoredDelivery]:
        """The channel's kept deliveries, newest first."""
        return await self.channels.kept(channel, status=status, limit=limit)

    async def schedules(self) -> list[dict[str, Any]]:
        """Each schedule with its last admitted and its next occurrence (UTC ISO times)."""
        cursors = {c.name: c for c in await self.store.list_schedules()}
        now = await self.scheduler.now()
        out = []
        for s in self.scheduler.schedules:
            cursor = cursors.get(s.name)
            current = cursor is not None and cursor.spec == s.spec
            # (the last admitted, under whichever cron: another release's too)
            last = cursor.last_occurrence if cursor is not None else None
            # From where the scheduler looks: the cursor, or when it found the cursor ahead of
            # a clock set back (the cursor itself then named an occurrence hours away).
            since = self.scheduler.looks_from(s, cursor, now) if cursor and current else now
            after = max(now, since)
            # None while another process keeps it under another cron: this one fires nothing.
            upcoming = None if self.scheduler.yields(s.name) else s.next_after(after)
            out.append(
                {
                    "name": s.name,
                    "agent": s.agent,
                    "id": s.id,
                    "cron": s.cron,
                    "tz": s.tz,
                    "last_occurrence": None if last is None else iso(last),
                    "next_occurrence": None if upcoming is None else iso(upcoming),
                }
            )
        return out

    # --- outcomes -------------------------------------------------------------------------
    async def submission(self, submission_id: str) -> Submission:
        self._at_home()
        sub = await self.store.get_submission(submission_id) if _names(submission_id) else None
        if sub is None:
            raise SubmissionNotFound(f"no submission {submission_id!r}")
        return sub

    async def wait_settled(self, submission_id: str, timeout: float | None = None) -> Submission:
        """Wait until the submission has its outcome (or ``TimeoutError``). ``timeout``: 0 or
        more seconds, or None for no limit (``ValueError`` for anything else: a NaN waited for
        good)."""
        self._at_home()
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise ValueError(f"timeout must be 0 or more seconds, or None; not {timeout!r}")
        if not _names(submission_id):
            raise SubmissionNotFound(f"no submission {submission_id!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        inside = [a.conversation_id for a in inside_attempts.get() if a.running]
        if inside:  # a tool's (or a step's) read: of its own conversation, it would never end
            sub = await self.submission(submission_id)
            if sub.outcome is not None:
                return sub
            if sub.conversation_id in inside:
                raise ReadOfOwnConversation(
                    f"submission {submission_id} is of conversation {sub.conversation_id}, whose"
                    " attempt this code runs inside: it cannot settle (and a message sent there"
                    " is not taken) until this code returns; read it from outside the attempt"
                )
        events = self.store.events
        first = True
        while True:
            if self.stopped:
                # Nothing settles here any more (and its store may be closed: a read of it said
                # "not open", not why). A stop after this point cancels the watch armed below.
                raise ShuttingDown(
                    f"the runtime has stopped: it cannot tell whether submission {submission_id}"
                    " settled; read it where a runtime runs on this database"
                )
            # Armed before the read: a settlement committed meanwhile still wakes us.
            woken = events.watch_settled(submission_id)
            try:
                known = self.settled_looks.known(submission_id) if first else None
                if isinstance(known, Submission):
                    return known  # this process settled it: the row as committed
                # Admitted here lately, no settlement heard of since: the row says "unsettled"
                # (a settlement would have woken the watch), unless asked not to wait at all.
                if known is None or (timeout is not None and timeout <= 0):
                    sub = await self.submission(submission_id)
                    if sub.outcome is not None:
                        return sub
                first = False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"submission {submission_id} has not settled yet")
                # Woken by the settlement's event, or, when that event was lost (another
                # process's), by the shared look at every waited row.
                self.settled_looks.watch(submission_id)
                try:
                    await asyncio.wait({woken}, timeout=left)
                finally:
                    self.settled_looks.unwatch(submission_id)
                if woken.cancelled():
                    raise _stopped_before(submission_id)  # (the stop ended every wait)
                settled = woken.result() if woken.done() else None
                if settled is not None:
                    return settled  # the row as the settlement committed it
            finally:
                events.unwatch_settled(submission_id, woken)

    async def read(self, receipt: Receipt | str, timeout: float | None = None) -> Reply:
        """Wait for the settlement and return the reply; raises ``SubmissionFailed`` or
        ``SubmissionAborted`` for the other outcomes, and ``ShuttingDown`` when the runtime
        stops first (the submission settles later, in the next process to run it)."""
        sid = receipt.submission_id if isinstance(receipt, Receipt) else receipt
        sub = await self.wait_settled(sid, timeout)
        return reply_or_raise(sub.id, sub.outcome, sub.reply, sub.error)

    async def abort(self, agent: str, id: str) -> AbortResult:
        """Stamp an abort intent on every unsettled submission of the conversation.
        ``DelegatedConversation`` for a delegated task's conversation: it has no submission of
        its own (its parent's attempt runs it), so its parent is what to abort."""
        self._at_home()
        conversation_id = await self.addressed(agent, id)
        info = await self.store.get_conversation(conversation_id)
        if info is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        if info.parent is not None:
            root = await self._root_of(info)
            raise DelegatedConversation(
                f"{conversation_id} is the conversation of a delegated task: it runs inside its"
                f" parent's attempt and has nothing of its own to abort (abort {root})"
            )
        _faults.reached("before:store.request_abort")
        ids = await self.store.request_abort(conversation_id)  # its owner hears of it
        _faults.reached("after:store.request_abort")
        return AbortResult(aborted=bool(ids), submission_ids=ids)

    async def _root_of(self, info: ConversationInfo) -> str:
        """The conversation at the top of a delegated task's parents (the one whose submission
        runs it, and takes an abort)."""
        seen = {info.conversation_id}
        while info.parent is not None:
            parent_id = info.parent.get("conversation_id") or ""
            if not parent_id or parent_id in seen:
                return parent_id or "its parent"
            parent = await self.store.get_conversation(parent_id)
            if parent is None:
                return parent_id
            seen.add(parent.conversation_id)
            info = parent
        return info.conversation_id

    async def resolve(self, agent: str, id: str, wait_id: str, value: Any) -> Wait:
        """Resolve the durable wait ``wait_id`` of conversation ``agent``/``id`` with a JSON
        ``value``: its submission runs again and ``step.wait`` returns the value. An identical
        repeat is accepted; ``WaitNotFound`` / ``WaitConflict`` otherwise (see ``Store``).

        An answer to a wait not recorded yet while a submission of the conversation (or, for a
        delegated task's, of its parent) is queued or running is held, up to ``EARLY_ANSWER_S``,
        and given once the wait is recorded: a tool may send its wait's id (``step.wait_id``)
        before it waits. ``ShuttingDown`` when the runtime stops meanwhile."""
        self._at_home()
        conversation_id = await self.addressed(agent, id)
        if not _names(wait_id):
            raise WaitNotFound(f"no wait {wait_id!r} in conversation {conversation_id}")
        value = resolution(value)
        try:
            return await self._resolve_wait(conversation_id, wait_id, value)
        except WaitNotFound:
            if self.early_answers >= EARLY_ANSWERS_HELD:
                raise
        self.early_answers += 1
        try:
            return await self._resolve_when_recorded(conversation_id, wait_id, value)
        finally:
            self.early_answers -= 1

    async def _resolve_when_recorded(self, conversation_id: str, wait_id: str, value: Any) -> Wait:
        """Resolve a wait not recorded yet once it is, while the submission that would record
        it is queued or running (a delegated task's: its parent's), up to ``EARLY_ANSWER_S``.
        Each look reads (nothing is written before the wait is there)."""
        info = await self.store.get_conversation(conversation_id)
        if info is None:
            raise WaitNotFound(f"no wait {wait_id!r} in conversation {conversation_id}")
        runner = conversation_id if info.parent is None else await self._root_of(info)
        deadline = time.monotonic() + EARLY_ANSWER_S
        while True:
            # Armed before the reads: the pause that records the wait may commit meanwhile.
            with self.next_append(conversation_id) as appended:
                # Read before the wait: a pause that commits between the two is found.
                running = await self.store.list_submissions(runner, UNSETTLED, limit=1)
                if await self.store.get_wait(conversation_id, wait_id) is not None:
                    return await self._resolve_wait(conversation_id, wait_id, value)
                left = deadline - time.monotonic()
                if not running or left <= 0:
                    raise WaitNotFound(f"no wait {wait_id!r} in conversation {conversation_id}")
                if self.shutting_down:
                    # (Not a 404: the answer is good, and the next process takes it.)
                    raise ShuttingDown(
                        f"the runtime is shutting down before the wait {wait_id!r} was recorded:"
                        " send the answer again (to the next process)"
                    )
                await asyncio.wait({appended}, timeout=min(left, EARLY_ANSWER_LOOK_S))
            await asyncio.sleep(EARLY_ANSWER_SPACING_S)

    async def _resolve_wait(self, conversation_id: str, wait_id: str, value: Any) -> Wait:
        _faults.reached("before:wait_resolved")
        _faults.reached("before:store.resolve_wait")
        wait = await self.store.resolve_wait(conversation_id, wait_id, value)
        _faults.reached("after:store.resolve_wait")
        _faults.reached("after:wait_resolved")
        return wait

    async def fork(self, agent: str, id: str, offset: int, new_id: str) -> ConversationInfo:
        """Fork conversation ``agent``/``id`` at the rest point ``offset`` into a new
        conversation ``agent``/``new_id`` (SPEC §17): its stream starts with
        ``conversation_created{forked_from}``, copies the records up to ``offset`` and has the
        state as of then; the source is not touched. A message sent to the fork runs with the
        context the source had at ``offset``.

        ``ConversationNotFound``, ``InvalidInput`` (an offset outside the stream),
        ``NotARestPoint`` (naming the nearest rest points), ``ConversationExists``."""
        self._at_home()
        source = self.conversation_id(agent, id)
        try:
            check_id(new_id)
        except InvalidId as exc:
            raise InvalidInput(str(exc), "new_id") from None
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInput("offset must be an integer of 0 or more", "offset")
        if self.shutting_down:
            raise ShuttingDown("the runtime is shutting down and admits no new work")
        _faults.reached("before:store.fork")
        info = await self.store.fork(source, offset, f"{agent}/{new_id}")
        _faults.reached("after:store.fork")
        return info

    async def waits(self, conversation_id: str | None = None) -> list[Wait]:
        """The pending durable waits, oldest first (of one conversation, or of all)."""
        found: list[Wait] = []
        if conversation_id is not None and not _names(conversation_id):
            return found
        while True:
            after = found[-1].seq if found else 0
            page = await self.store.list_waits(conversation_id, after=after)
            found += page
            if len(page) < LIST_LIMIT:
                return found

    async def history(self, agent: str, id: str, after: int = -1) -> list[Record]:
        """The conversation's canonical stream (records after ``after``)."""
        self._at_home()
        if not isinstance(after, int) or isinstance(after, bool) or not -1 <= after < 2**62:
            raise InvalidInput("after must be an offset: an integer from -1", "after")
        conversation_id = await self.addressed(agent, id)
        if await self.store.get_conversation(conversation_id) is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        return await self.store.read(conversation_id, after=after)

    async def attachment(self, sha256: str, *, with_data: bool = True) -> Blob:
        """The stored attachment with that SHA-256 (64 hex digits, ``InvalidInput`` otherwise);
        ``AttachmentNotFound`` when none is stored."""
        if not isinstance(sha256, str) or not sha256.isascii() or not is_sha256(sha256.lower()):
            raise InvalidInput("sha256 must be 64 hex digits", "sha256")
        sha256 = sha256.lower()  # digits in upper case (as some tools print them) name the same
        blob = await self.store.get_attachment(sha256, with_data=with_data)
        if blob is None:
            raise AttachmentNotFound(f"no attachment with sha256 {sha256} is stored")
        return blob

    async def collect_attachments(self, *, dry_run: bool = False) -> list[Blob]:
        """Delete the attachments that nothing references (``hearth gc``); return them."""
        _faults.reached("before:store.collect_attachments")
        freed = await self.store.collect_attachments(dry_run=dry_run)
        _faults.reached("after:store.collect_attachments")
        return freed

    async def settle_all(self, timeout: float = 30.0) -> None:
        """Wait until no submission is queued or running, and none waits for a wait that will
        time out (handy in scripts and tests; a wait without a timeout is at rest)."""
        self._at_home()
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            pending = await self.store.list_submissions(statuses=UNSETTLED, limit=1)
            if not pending:
                expiry = await self.store.next_wait_expiry()
                if expiry is None:
                    # Unless a wait ended between the two reads and queued its submission.
                    if not await self.store.list_submissions(statuses=UNSETTLED, limit=1):
                        return
                    continue
                if left <= 0:
                    raise TimeoutError("a durable wait has not timed out yet")
                # The coordinator ends it at its expiry and queues its submission again.
                await asyncio.sleep(min(left, max(0.01, expiry - await self.store.now() + 0.02)))
                continue
            if left <= 0:
                raise TimeoutError("work is still queued or running")
            # Looked at again now and then: a submission that starts waiting (for a wait with
            # no timeout, at rest) does not settle, and waiting for its settlement held the
            # caller for its whole timeout.
            with contextlib.suppress(TimeoutError):
                await self.wait_settled(pending[0].id, timeout=min(left, SETTLE_ALL_LOOK_S))

    # --- for the HTTP server ----------------------------------------------------------------
    # What hearth.server reads, so that it goes through the runtime and never around it.
    def conversation_id(self, agent: str, id: str) -> str:
        """The id of ``agent``'s conversation ``id``; ``UnknownAgent`` or ``InvalidId`` when
        either is wrong."""
        self.agent(agent)
        return f"{agent}/{check_id(id)}"

    async def addressed(self, agent: str, id: str) -> str:
        """``conversation_id``, for what is asked of a conversation that exists (reading it,
        aborting it, resolving its waits): also a delegated task's conversation whose agent
        this App does not list (a subagent given only to ``use_subagent``)."""
        try:
            return self.conversation_id(agent, id)
        except UnknownAgent:
            if not _names(agent):
                raise
            conversation_id = f"{agent}/{check_id(id)}"
            info = await self.store.get_conversation(conversation_id)
            if info is None or info.parent is None or info.agent != agent:
                raise
            return conversation_id

    async def listed_agent(self, agent: str) -> bool:
        """Whether the conversation list may be filtered by ``agent``: one the App declares,
        or a subagent with conversations of its own (given only to ``use_subagent``)."""
        if agent in self.env.agents:
            return True
        return _names(agent) and bool(await self.store.list_conversations(agent, limit=1))

    async def require_conversation(self, conversation_id: str) -> None:
        """``ConversationNotFound`` unless the conversation has been admitted some input."""
        if await self.store.get_conversation(conversation_id) is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")

    async def read_stream(
        self, conversation_id: str, after: int, limit: int, max_bytes: int
    ) -> tuple[list[Record], bool]:
        """The conversation's committed records with offset > ``after``, at most ``limit`` and
        about ``max_bytes`` (``Store.read_page``), and whether more follow. Followers asking
        for the same records at once share one store read."""
        return await self.tail_reads.read(conversation_id, after, limit, max_bytes)

    @contextmanager
    def next_append(self, conversation_id: str) -> Iterator[asyncio.Future[int]]:
        """A future done at the conversation's next committed append. Enter it *before* a read:
        an append committed while the read runs then still wakes the reader."""
        events = self.store.events
        woken = events.subscribe(conversation_id)
        try:
            yield woken
        finally:
            events.unsubscribe(conversation_id, woken)

    async def submissions(
        self, conversation_id: str | None = None, statuses: Sequence[str] | None = None
    ) -> list[Submission]:
        """Submissions in admission order: every one (of these ``statuses``), or one
        conversation's (read page by page: an operator's view, not a hot path)."""
        return await all_submissions(self.store, conversation_id, statuses)

    async def submission_counts(
        self, conversation_id: str | None = None
    ) -> dict[tuple[str, str | None], int]:
        """How many submissions there are by status and outcome (``Store.count_submissions``)."""
        return await self.store.count_submissions(conversation_id)

    async def latest_settled(
        self, limit: int, conversation_id: str | None = None
    ) -> list[Submission]:
        """The last ``limit`` settled submissions, newest first (``Store.latest_settled``)."""
        return await self.store.latest_settled(limit, conversation_id)

    async def conversation_info(self, conversation_id: str) -> ConversationInfo | None:
        """The conversation's agent, parent and last offset; None before its first admission."""
        return await self.store.get_conversation(conversation_id)

    async def conversations(
        self,
        agent: str | None = None,
        status: str | None = None,
        *,
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[ConversationSummary]:
        """One page of conversations, newest activity first (``Store.list_conversations``)."""
        if agent is not None and not _names(agent):
            return []
        return await self.store.list_conversations(agent, status, before=before, limit=limit)

    async def conversation_submission(self, agent: str, id: str, submission_id: str) -> Submission:
        """One submission of ``agent``'s conversation ``id``; ``SubmissionNotFound`` when there is
        none by that id in that conversation."""
        conversation_id = await self.addressed(agent, id)
        sub = await self.store.get_submission(submission_id) if _names(submission_id) else None
        if sub is None or sub.conversation_id != conversation_id:
            raise SubmissionNotFound(
                f"no submission {submission_id!r} in conversation {conversation_id}"
            )
        return sub

    async def check_store(self, timeout: float = HEALTH_TIMEOUT_S) -> None:
        """Raise ``StoreUnavailable``, naming the cause, unless the store answers within
        ``timeout`` seconds (what ``/healthz`` asks)."""
        await self.store.ping(timeout)

    async def now(self) -> float:
        """The store's clock, which leases and deadlines are stamped with."""
        return await self.store.now()

    @property
    def owner(self) -> str:
        """The owner id on the leases this runtime takes."""
        return self.coordinator.owner

    def render_metrics(self) -> str:
        """This process's metrics in the Prometheus text format."""
        return self.env.metrics.render()


__all__ = ["HearthError", "Runtime"]
