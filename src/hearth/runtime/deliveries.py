"""Channel deliveries on their way to admission: verify, look the delivery up, route it, admit
every dispatch at once (SPEC §14).

The ``deliveries`` row is read before ``receive`` runs, so a redelivery of an admitted delivery
never routes again (routing that changed since cannot admit twice), and it is written in the
admission's own transaction, so two processes given the same delivery at once admit it once.
A delivery whose routing fails is kept as ``failed``, to be routed again by a redelivery or a
replay once the code is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hearth import _faults
from hearth._tasks import in_thread
from hearth.channels import Arrival, Channel, Delivery, Dispatch
from hearth.errors import (
    ChannelFailed,
    DeliveryNotFound,
    HearthError,
    InvalidInput,
    InvalidSignature,
    StoreUnavailable,
    UnknownChannel,
    app_failure,
    message_of,
)
from hearth.ids import ID_RE
from hearth.jsontext import json_round_trip, storable_text
from hearth.runtime.admission import input_payload, new_submission, refuse_delegated
from hearth.runtime.env import Env
from hearth.store.base import LIST_LIMIT, NewDelivery, NewSubmission, StoredDelivery
from hearth.store.rows import DELIVERY_ADMITTED

log = logging.getLogger("hearth.channels")
# How long the look for a kept delivery may take: as long as an admission waits for the database.
LOOKUP_S = 1.5


@dataclass(frozen=True)
class DeliveryReceipt:
    """What a channel answers once a delivery is admitted (HTTP 202)."""

    delivery_id: str
    submission_ids: list[str]
    deduplicated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "delivery_id": self.delivery_id,
            "submission_ids": self.submission_ids,
            "deduplicated": self.deduplicated,
        }


class Deliveries:
    """The app's channels, and how their deliveries are admitted."""

    def __init__(self, env: Env, channels: Mapping[str, Channel]) -> None:
        self.env = env
        self.channels = dict(channels)

    def channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            declared = ", ".join(sorted(self.channels)) or "none"
            raise UnknownChannel(f"no channel named {name!r}; declared: {declared}")
        return channel

    async def deliver(self, name: str, headers: Mapping[str, str], body: bytes) -> DeliveryReceipt:
        """Verify one request to channel ``name`` and admit what it routes to, once."""
        channel = self.channel(name)
        lowered = {k.lower(): v for k, v in headers.items()}
        caller = asyncio.current_task()
        try:
            delivery = await _called(channel.verify, lowered, body)
        except InvalidSignature as exc:
            log.warning("channel %s refused a request: %s", name, exc)  # never a secret in it
            raise
        except InvalidInput:
            raise
        except BaseException as exc:
            if not app_failure(exc, caller):
                raise
            log.error("channel %s: verify raised", name, exc_info=exc)
            raise ChannelFailed(
                f"channel {name!r} could not verify the request: its verify raised"
                f" {type(exc).__name__} (see the server log)",
                name,
            ) from None
        new = _kept(name, delivery, body)
        async with _database_within(LOOKUP_S, "the delivery was not taken"):
            if type(delivery.received_at) is Arrival:
                # This host's clock may be off; the store's is every process's.
                at = await self.env.store.now()
                delivery = dataclasses.replace(delivery, received_at=at)
                new = dataclasses.replace(new, received_at=at)
            known = await self.env.store.get_delivery(name, new.delivery_id)
        if known is not None and known.status == DELIVERY_ADMITTED:
            return _receipt(known, True)
        return await self._route(channel, delivery, new)

    async def replay(self, name: str, delivery_id: str) -> DeliveryReceipt:
        """Route a kept delivery again (a failed one, after a fix); an admitted one is only
        answered again."""
        channel = self.channel(name)
        async with _database_within(LOOKUP_S, "the delivery was not replayed"):
            known = await self.env.store.get_delivery(name, delivery_id)
        if known is None:
            raise DeliveryNotFound(f"channel {name!r} has no delivery {delivery_id!r}")
        if known.status == DELIVERY_ADMITTED:
            return _receipt(known, True)
        delivery = Delivery(
            id=known.delivery_id,
            type=known.type,
            data=known.data,
            received_at=known.received_at,
            headers=dict(known.headers),
        )
        new = NewDelivery(
            channel=name,
            delivery_id=known.delivery_id,
            type=known.type,
            data=known.data,
            body=known.body,
            headers=dict(known.headers),
            received_at=known.received_at,
        )
        return await self._route(channel, delivery, new)

    async def kept(
        self, name: str, *, status: str | None = None, limit: int = LIST_LIMIT
    ) -> list[StoredDelivery]:
        self.channel(name)
        return await self.env.store.list_deliveries(name, status=status, limit=limit)

    async def _route(
        self, channel: Channel, delivery: Delivery, new: NewDelivery
    ) -> DeliveryReceipt:
        name = channel.name
        caller = asyncio.current_task()
        try:
            routed = await _called(channel.receive, delivery)
            subs = [
                self._submission(name, delivery.id, i, d) for i, d in enumerate(_listed(routed))
            ]
            for sub in subs:  # a delegated task takes input only from its parent's attempt
                await refuse_delegated(self.env.store, sub.conversation_id)
        except BaseException as exc:
            if not app_failure(exc, caller):
                raise
            # A routing bug is fixed in code, then the delivery replayed: keep it meanwhile.
            ours = isinstance(exc, HearthError)
            if not ours:
                log.error(
                    "channel %s: receive raised on delivery %s", name, new.delivery_id, exc_info=exc
                )
            error = {"type": type(exc).__name__, "message": message_of(exc)}
            _faults.reached("before:store.fail_delivery")
            await self.env.store.fail_delivery(new, error)
            _faults.reached("after:store.fail_delivery")
            why = str(exc) if ours else f"its receive raised {type(exc).__name__} (see the log)"
            raise ChannelFailed(
                f"channel {name!r} could not route delivery {new.delivery_id!r}: {why}; it is kept"
                f" as failed: replay it with POST /channels/{name}/deliveries/"
                f"{new.delivery_id}/replay",
                name,
                new.delivery_id,
            ) from None
        _faults.reached("before:store.admit_delivery")
        admission = await self.env.store.admit_delivery(new, subs)
        _faults.reached("after:store.admit_delivery")
        if not admission.deduplicated:
            self.env.metrics.admitted += len(subs)
        return _receipt(admission.delivery, admission.deduplicated)

    def _submission(self, name: str, delivery_id: str, index: int, d: Any) -> NewSubmission:
        if not isinstance(d, Dispatch):
            raise InvalidInput(f"receive returned {type(d).__name__}, not a hearth.Dispatch")
        # The kind says where it came from (a channel); the payload says what it is.
        _, payload = input_payload(d.message, d.signal)
        return new_submission(
            self.env.agents,
            d.agent_name,
            d.id,
            "channel",
            payload,
            idempotency_key=f"channel:{name}:{delivery_id}:{index}",
            source={"channel": name, "delivery_id": delivery_id},
        )


async def _called(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, awaited when it is async; a sync callback runs on a worker thread, so that
    a blocking call in it (a lookup over the network, say) does not stall the server."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await in_thread(fn, *args)
    return await value if inspect.isawaitable(value) else value


def _listed(routed: Any) -> list[Any]:
    if routed is None:
        return []
    if isinstance(routed, Dispatch):
        return [routed]
    return list(routed)


def _kept(name: str, delivery: Any, body: bytes) -> NewDelivery:
    """The delivery as it is kept; a ``verify`` that returned something else is a bug in it."""

    def bad(why: str) -> ChannelFailed:
        return ChannelFailed(f"channel {name!r}: verify {why}", name)

    if not isinstance(delivery, Delivery):
        raise bad(f"returned {type(delivery).__name__}, not a hearth.Delivery")
    if not isinstance(delivery.id, str) or not ID_RE.match(delivery.id):
        raise bad(f"returned the delivery id {delivery.id!r}, which must match {ID_RE.pattern}")
    if not isinstance(delivery.type, str) or storable_text(delivery.type) != delivery.type:
        raise bad("returned a delivery whose type is not a string without NUL or half a pair")
    try:
        # As JSON gives it back: NaN and the infinities have no JSON form, and kept they would
        # spoil every listing of the channel's deliveries.
        data = json_round_trip(delivery.data)
        headers = {str(k): str(v) for k, v in dict(delivery.headers).items()}
    except (TypeError, ValueError, RecursionError):
        raise bad("returned a delivery whose data is not JSON") from None
    if not isinstance(delivery.received_at, int | float) or not math.isfinite(delivery.received_at):
        raise bad("returned a delivery whose received_at is not a finite number of seconds")
    return NewDelivery(
        channel=name,
        delivery_id=delivery.id,
        type=delivery.type,
        data=data,
        # Kept as text every store takes (PostgreSQL's text holds no NUL): a label of what came.
        body=storable_text(body.decode("utf-8", "replace")),
        headers=headers,
        received_at=float(delivery.received_at),
    )


def _receipt(stored: StoredDelivery, deduplicated: bool) -> DeliveryReceipt:
    return DeliveryReceipt(stored.delivery_id, list(stored.submission_ids), deduplicated)


@contextlib.asynccontextmanager
async def _database_within(limit: float, then: str) -> AsyncIterator[None]:
    """What the delivery asks of the store before routing, within what an admission waits for
    the database: a read retries for longer, and a webhook waited 10 s for its 503 while the
    database was down (past where senders give up) where a message is answered within 2 s."""
    try:
        async with asyncio.timeout(limit):
            yield
    except TimeoutError:
        raise StoreUnavailable(
            f"the database did not answer within {limit:g} s; {then} (send it again)"
        ) from None
