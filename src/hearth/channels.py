"""Channels: webhooks that admit submissions (SPEC §14).

A ``Channel`` serves ``POST /channels/{name}``. Its ``verify(headers, body)`` authenticates the
request and normalises it into a ``Delivery`` (or raises ``InvalidSignature`` → 401); its
``receive(delivery)`` routes the delivery to zero or more ``Dispatch`` targets. All of them are
admitted in one transaction, once per delivery id, however often the sender retries.

Example::

    def route(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
        if delivery.type != "issues":
            return []
        issue = delivery.data["issue"]["number"]
        return [hearth.Dispatch("triage", f"issue-{issue}", message=delivery.data["action"])]

    github = hearth.Channel("github", verify=hearth.channels.github(), receive=route)
    app = hearth.App([triage], channels=[github])

The built-in verifiers, ``github`` and ``hmac``, read their secret from an argument or an
environment variable, compare signatures in constant time, and never show the secret.
"""

from __future__ import annotations

import hashlib
import hmac as _hmac
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from hearth.errors import ConfigurationError, InvalidInput, InvalidSignature
from hearth.ids import ID_RE
from hearth.jsontext import parsed_unpaired_surrogate, strict_json

if TYPE_CHECKING:
    from hearth.agent import Agent

NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
_STAMP_RE = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,9})?$")  # unix seconds; never nan or inf


class Arrival(float):
    """A ``received_at`` that ``verify`` left to its default: the time this host read it. The
    runtime stamps such a delivery with the store's clock instead (on PostgreSQL, the database
    server's), so that deliveries taken by hosts whose clocks differ list in the order they came.
    """


def _arrival() -> float:
    return Arrival(time.time())


@dataclass(frozen=True)
class Delivery:
    """One authenticated webhook request, as ``verify`` normalised it.

    ``id`` is the sender's delivery id (a retry carries the same one), ``type`` the event's
    kind, ``data`` its JSON payload, ``headers`` the request headers worth keeping with a failed
    delivery (never a signature or a token), ``received_at`` unix seconds: left out, the store's
    clock when the delivery is taken (one clock for every process on PostgreSQL).
    """

    id: str
    type: str
    data: Any
    received_at: float = field(default_factory=_arrival)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dispatch:
    """One target of a delivery: admit ``message`` (or ``signal``) to conversation ``agent/id``.

    ``agent`` is an agent's name or the agent itself; ``signal`` is
    ``{"type": str, "body": str, "attributes": {...}}``."""

    agent: str | Agent
    id: str
    message: str | None = None
    signal: dict[str, Any] | None = None

    @property
    def agent_name(self) -> str:
        return self.agent if isinstance(self.agent, str) else self.agent.name


Verify = Callable[[Mapping[str, str], bytes], "Delivery | Awaitable[Delivery]"]
Routed = Iterable[Dispatch] | Dispatch | None
Receive = Callable[[Delivery], "Routed | Awaitable[Routed]"]


class Channel:
    """A webhook endpoint, ``POST /channels/{name}``, that admits what ``receive`` routes."""

    def __init__(self, name: str, *, verify: Verify, receive: Receive) -> None:
        if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
            raise ConfigurationError(
                f"channel name {name!r} must match {NAME_PATTERN} (lowercase, dashes)"
            )
        if not callable(verify) or not callable(receive):
            raise ConfigurationError(f"channel {name!r}: verify and receive must be callables")
        self.name = name
        self.verify = verify
        self.receive = receive

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


# --- built-in verifiers ------------------------------------------------------------------------
def _secret(secret: str | None, env: str, who: str) -> bytes:
    value = secret if secret is not None else os.environ.get(env)
    if not value:
        raise ConfigurationError(f"{who} needs a secret: pass secret=... or set ${env}")
    return value.encode()


def _signed(secret: bytes, message: bytes) -> str:
    return "sha256=" + _hmac.new(secret, message, hashlib.sha256).hexdigest()


def _check_signature(given: str | None, expected: str, header: str) -> None:
    if not given:
        raise InvalidSignature(f"the {header} header is missing")
    if not _hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise InvalidSignature(f"the {header} signature does not match this channel's secret")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name) or headers.get(name.lower())
    if not value:
        raise InvalidInput(f"the {name} header is missing", name)
    return value


def _delivery_id(headers: Mapping[str, str], name: str) -> str:
    value = _header(headers, name)
    if not ID_RE.match(value):
        raise InvalidInput(f"the {name} header must match {ID_RE.pattern}", name)
    return value


def _json(body: bytes, what: str) -> Any:
    try:
        value = strict_json(body)  # NaN, Infinity or 1e999: no reader could take it back
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the {what} body is not JSON: {exc}") from None
    where = parsed_unpaired_surrogate(body, value)
    if where is not None:
        raise InvalidInput(f"the {what} body's JSON has {where}; no UTF-8 text can hold it")
    return value


def _kept(headers: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    return {n: headers[n] for n in names if headers.get(n) is not None}


class GitHubVerifier:
    """Verifies GitHub's webhooks: ``X-Hub-Signature-256`` (HMAC-SHA256 of the raw body),
    ``X-GitHub-Delivery`` (the id), ``X-GitHub-Event`` (the type); JSON or form-encoded."""

    _KEPT = ("x-github-event", "x-github-delivery", "x-github-hook-id", "content-type")

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def __repr__(self) -> str:
        return "hearth.channels.github(secret=***)"

    def __call__(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        signature = headers.get("x-hub-signature-256")
        _check_signature(signature, _signed(self._secret, body), "X-Hub-Signature-256")
        delivery_id = _delivery_id(headers, "X-GitHub-Delivery")
        event = _header(headers, "X-GitHub-Event")
        if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            form = parse_qs(body.decode("utf-8", "replace"))
            data = _json((form.get("payload") or [""])[0].encode(), "form payload")
        else:
            data = _json(body, "GitHub")
        return Delivery(id=delivery_id, type=event, data=data, headers=_kept(headers, self._KEPT))


def github(
    secret: str | None = None, *, secret_env: str = "GITHUB_WEBHOOK_SECRET"
) -> GitHubVerifier:
    """The verifier of GitHub webhooks, for ``Channel(verify=...)``. ``secret`` is the
    webhook's secret (default: ``$GITHUB_WEBHOOK_SECRET``)."""
    return GitHubVerifier(_secret(secret, secret_env, "hearth.channels.github"))


class HMACVerifier:
    """Verifies any sender that signs with a shared secret: ``X-Signature: sha256=<hex>`` over
    the body, or over ``{X-Timestamp}.{body}`` when ``X-Timestamp`` is sent (then a timestamp
    more than ``max_age`` seconds away from now is refused); ``X-Delivery-Id`` is the id,
    ``X-Event-Type`` the type (default ``message``)."""

    _KEPT = ("x-delivery-id", "x-event-type", "x-timestamp", "content-type")

    def __init__(
        self, secret: bytes, max_age: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._secret = secret
        self.max_age = max_age
        self._clock = clock

    def __repr__(self) -> str:
        return f"hearth.channels.hmac(secret=***, max_age={self.max_age:g})"

    def __call__(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        stamp = headers.get("x-timestamp")
        signed = body
        if stamp is not None:
            if not _STAMP_RE.match(stamp.strip()):
                raise InvalidSignature("the X-Timestamp header is not unix seconds")
            if abs(self._clock() - float(stamp)) > self.max_age:
                raise InvalidSignature(
                    f"the X-Timestamp is more than {self.max_age:g} s away from now: a replayed"
                    " or delayed request"
                )
            signed = stamp.strip().encode() + b"." + body
        _check_signature(headers.get("x-signature"), _signed(self._secret, signed), "X-Signature")
        delivery_id = _delivery_id(headers, "X-Delivery-Id")
        return Delivery(
            id=delivery_id,
            type=headers.get("x-event-type") or "message",
            data=_json(body, "request"),
            headers=_kept(headers, self._KEPT),
        )


def hmac(
    secret: str | None = None,
    *,
    max_age: float = 300.0,
    secret_env: str = "HEARTH_WEBHOOK_SECRET",
    clock: Callable[[], float] = time.time,
) -> HMACVerifier:
    """A verifier for senders that sign the body with a shared secret (default:
    ``$HEARTH_WEBHOOK_SECRET``), for ``Channel(verify=...)``. ``clock`` (wall-clock unix
    seconds) judges ``X-Timestamp``; tests may inject one."""
    if (
        isinstance(max_age, bool)
        or not isinstance(max_age, int | float)
        or not 0 < max_age < math.inf  # (NaN too: it fails every comparison, and limited nothing)
    ):
        raise ConfigurationError(
            f"hearth.channels.hmac: max_age must be a positive number of seconds, not {max_age!r}"
        )
    return HMACVerifier(_secret(secret, secret_env, "hearth.channels.hmac"), max_age, clock)


def sign(secret: str, body: bytes, timestamp: str | None = None) -> str:
    """The ``sha256=<hex>`` signature a sender puts in ``X-Signature`` (or GitHub in
    ``X-Hub-Signature-256``): handy for tests and for senders written in Python."""
    message = body if timestamp is None else timestamp.encode() + b"." + body
    return _signed(secret.encode(), message)


__all__ = [
    "Channel",
    "Delivery",
    "Dispatch",
    "GitHubVerifier",
    "HMACVerifier",
    "github",
    "hmac",
    "sign",
]
