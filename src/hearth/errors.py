"""Errors users can hit, each saying what went wrong and what to do."""

from __future__ import annotations

import asyncio
import math
from typing import Any


class Interruption(BaseException):
    """hearth's own way out of the application's code (a durable wait's pause): a
    ``BaseException``, so that the code's ``except Exception`` lets it by, and never counted as
    that code's failure."""


def app_failure(exc: BaseException, task: asyncio.Task[Any] | None = None) -> bool:
    """Whether ``exc``, out of the application's own code (a tool, a step's function, a render
    function, a hook, a channel's verify or receive, a reconcile, a model provider of its own),
    is that code's failure, which hearth reports and goes on: any exception; ``SystemExit`` (a
    tool that calls ``sys.exit``, as argparse does on arguments it cannot parse, fails its call
    and does not end the process); any other ``BaseException`` a library raises (pytest's
    ``Failed``, say); and a ``CancelledError`` nothing cancelled (a library's, leaked). Not:
    hearth stopping the work (``stopping``), ``KeyboardInterrupt``, or hearth's own
    ``Interruption``, which go on up.

    A ``GeneratorExit`` goes on up too (a close of the suspended coroutine throws it in), unless
    ``task`` — the task that called the code — is the one running now: a closing coroutine is
    never its task's running step, so the code raised it itself (a library's, leaked)."""
    if isinstance(exc, GeneratorExit):
        return task is not None and _running_task() is task
    if isinstance(exc, KeyboardInterrupt | Interruption):
        return False
    return not stopping(exc)


def _running_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: a coroutine closed by the garbage collector
        return None


def message_of(exc: object) -> str:
    """``str(exc)``, or a note saying it cannot be had when its ``__str__`` raises (an error
    that cannot be printed must still be reported, not raise a second time). ``exc`` is an
    exception, or whatever an application gave as one."""
    try:
        return str(exc)
    except Exception:
        return "<its message cannot be printed>"


def described(exc: BaseException) -> str:
    """``Name: message`` of ``exc`` (``message_of``)."""
    text = message_of(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def stopping(exc: BaseException) -> bool:
    """Whether ``exc`` is hearth stopping the work (an abort, a deadline, a shutdown, a lost
    lease: a cancellation of the running task), which goes on up. A ``CancelledError`` raised
    while nothing cancels the task is not: the application's own code raised it (a library's
    cancellation, leaked), and it is that code's failure, like any exception."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def hearths_own(exc: BaseException) -> BaseException | None:
    """The exception of hearth's own in ``exc``, or None. Application code that runs work in a
    task group (``asyncio.TaskGroup``, anyio's) gets hearth's exceptions back wrapped in an
    exception group: a durable wait's pause, a fence, hearth stopping the work. The first such
    leaf goes on up as if raised alone; counted as the code's failure, a wait failed its call."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc if _ours(exc) else None
    for leaf in exc.exceptions:
        own = hearths_own(leaf)
        if own is not None:
            return own
    return None


def _ours(exc: BaseException) -> bool:
    return isinstance(exc, Interruption | KeyboardInterrupt | FencedOut) or stopping(exc)


class HearthError(Exception):
    """Base class of every error hearth raises on purpose."""


class ConfigurationError(HearthError):
    """The app, an agent or a tool was declared in a way hearth cannot run."""


class UnknownAgent(HearthError):
    """No agent with that name is declared on the app."""


class InvalidId(HearthError):
    """A conversation id does not match ``^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$``."""


class InvalidInput(HearthError, ValueError):
    """A message, signal or idempotency key given to ``dispatch`` is malformed.

    ``field`` names the part at fault (``"message"``, ``"signal.type"``, ...) when one is.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownChannel(HearthError):
    """No channel with that name is declared on the app."""


class DeliveryNotFound(HearthError):
    """The channel has kept no delivery with that id."""


class InvalidSignature(HearthError):
    """A channel request is not signed as its channel requires (HTTP 401): nothing is
    admitted. Raise it from your own ``verify`` to refuse a request."""


class ChannelFailed(HearthError):
    """A channel could not route a delivery: its ``verify`` or ``receive`` raised, or
    ``receive`` named an unknown agent or a bad id (HTTP 500, so the sender retries). Nothing
    was admitted; a delivery that passed ``verify`` is kept as ``failed`` to be replayed."""

    def __init__(self, message: str, channel: str, delivery_id: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel
        self.delivery_id = delivery_id


class ConversationNotFound(HearthError):
    """The conversation has never been admitted any input."""


class ConversationExists(HearthError):
    """A fork names a conversation that already exists (HTTP 409); pick another ``new_id``."""


class DelegatedConversation(HearthError):
    """Input sent to the conversation of a delegated task (HTTP 409): it runs inside its
    parent's attempt and takes no input of its own; read it, or send to the parent."""


class NotARestPoint(HearthError):
    """A fork's offset is not a rest point of the conversation (HTTP 409): the offset of a
    settlement with no submission still open at it, or 0 (before any submission).
    ``rest_points`` holds the nearest ones below and above it."""

    def __init__(self, message: str, rest_points: list[int] | None = None) -> None:
        super().__init__(message)
        self.rest_points = list(rest_points or [])


class SubmissionNotFound(HearthError):
    """No submission with that id exists in that conversation."""


class IdempotencyConflict(HearthError):
    """An idempotency key was reused with a different payload."""


class AttachmentTooLarge(HearthError):
    """An attachment is over ``HEARTH_MAX_ATTACHMENT`` (HTTP 413); nothing was admitted."""

    def __init__(self, message: str, name: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.name = name
        self.size = size
        self.limit = limit


class AttachmentNotFound(HearthError):
    """No attachment with that SHA-256 is stored (HTTP 404)."""


class ShuttingDown(HearthError):
    """The runtime is shutting down and admits no new work; a read still waiting when it has
    stopped ends with this too."""


class StoreError(HearthError):
    """The store failed or holds data hearth cannot use."""


class IntegrityError(StoreError):
    """A record id was re-appended with different content."""


class FencedOut(StoreError):
    """An append or settlement came from an attempt that no longer owns the submission.

    The attempt that gets this must stop: another owner has taken the work over.
    """


class CorruptData(StoreError):
    """The database holds a record or row hearth cannot read: it was changed outside hearth,
    or the disk damaged it. Retrying cannot help; the work that needs it fails."""


class StoreUnavailable(StoreError):
    """The database cannot be reached right now; nothing was lost. Retry shortly."""


class SchemaTooNew(StoreError):
    """The database was created by a newer hearth; upgrade hearth before using it."""


class StateWriteDuringRender(HearthError):
    """A state setter was called while the agent function was rendering."""


class ReadOfOwnConversation(HearthError):
    """Code running inside an attempt (a tool, a step) waited for an unsettled submission of
    that attempt's conversation (or of a conversation it runs inside, a delegated task's
    parent): it cannot settle before that code returns."""


class StepError(HearthError):
    """A ``step.do`` call broke a rule (empty or reused name, non-JSON value)."""


class AbortRequested(HearthError):
    """An attempt may not pause for a durable wait: an abort intent is stamped on its
    submission. The attempt classifies again, which settles it aborted."""


class WaitTimedOut(HearthError):
    """Raised inside a durable tool by ``step.wait`` when nobody answered before its timeout."""


class WaitNotFound(HearthError):
    """No wait with that id exists in that conversation."""


class WaitConflict(HearthError):
    """The wait cannot take this value: it was resolved with another value, it timed out, or its
    submission no longer waits (settled or aborted)."""


class SubmissionError(HearthError):
    """Base of the errors ``read`` raises for a submission that did not complete."""

    def __init__(self, submission_id: str, error: dict[str, Any] | None) -> None:
        self.submission_id = submission_id
        self.error: dict[str, Any] = dict(error or {})
        self.type: str = str(self.error.get("type", "unknown"))
        self.interrupted_tools: list[dict[str, Any]] = list(self.error.get("interrupted_tools", []))
        message = self.error.get("message") or self.type
        super().__init__(f"submission {submission_id}: {message}")


class SubmissionFailed(SubmissionError):
    """The submission settled ``failed``; ``.error`` holds the structured reason."""


class SubmissionAborted(SubmissionError):
    """The submission settled ``aborted``."""


class ProviderError(HearthError):
    """A model provider failed.

    ``kind`` is ``"transient"`` (retried under the durable budget), ``"overflow"`` (the context is
    too long: compact and retry) or ``"terminal"`` (the submission fails with ``provider_error``).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "terminal",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        if kind not in ("transient", "overflow", "terminal"):
            raise ValueError(f"unknown provider error kind {kind!r}")
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        # Seconds to wait, as a number JSON can hold: a header of "inf" or "nan" (or a provider
        # of the application's own) gives none, and stored it would spoil every read.
        self.retry_after = retry_after if _seconds(retry_after) else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after is not None:
            out["retry_after"] = self.retry_after
        return out


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


class WorkspaceError(HearthError):
    """A workspace operation failed: a missing file, a directory where a file was expected, a
    path that is not valid. Raised inside a tool, it becomes an error outcome the model sees."""


class PathOutsideWorkspace(WorkspaceError):
    """A path leads outside the workspace: an absolute path, ``..`` past its top, or a symbolic
    link that points out of it. Nothing was read or written."""


class SandboxUnavailable(WorkspaceError):
    """The ``run`` tool cannot sandbox a command because bubblewrap (``bwrap``) is not
    installed. Install Debian's ``bubblewrap``, or opt out with ``sandbox=False``."""
