"""Channels in-process: the built-in verifiers (signed as the senders document), and routing
through ``Runtime.deliver`` with sync or async callbacks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Mapping
from urllib.parse import urlencode

import pytest

import hearth
from hearth.channels import sign
from hearth.testing import ScriptedModel, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@hearth.agent
def inbox(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/inbox")
    return "Read the mail."


MODELS = [ScriptedModel("inbox", [reply("ok")], repeat_last=True)]


def test_the_github_signature_matches_githubs_documented_example() -> None:
    # GitHub's docs: secret "It's a Secret to Everybody", payload "Hello, World!".
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign("It's a Secret to Everybody", b"Hello, World!") == expected
    verify = hearth.channels.github("It's a Secret to Everybody")
    with pytest.raises(hearth.InvalidInput, match="not JSON"):  # signed, but not a payload
        verify(
            {
                "x-hub-signature-256": expected,
                "x-github-delivery": "d",
                "x-github-event": "ping",
            },
            b"Hello, World!",
        )


def test_a_signed_payload_with_an_unpaired_surrogate_is_refused() -> None:
    body = b'{"zen": "cut \\ud83d"}'  # JSON's escape of half a surrogate pair
    verify = hearth.channels.github("s3")
    with pytest.raises(hearth.InvalidInput, match="unpaired surrogate"):
        verify(
            {
                "x-hub-signature-256": sign("s3", body),
                "x-github-delivery": "d-1",
                "x-github-event": "push",
            },
            body,
        )


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_signed_payload_with_a_number_json_has_no_form_for_is_the_senders_error(
    number: str,
) -> None:
    """Python's reader takes these; the delivery then failed as the channel's own fault (a 500,
    which senders retry for ever) instead of a 400."""
    body = f'{{"n": {number}}}'.encode()
    verify = hearth.channels.hmac("k")
    with pytest.raises(hearth.InvalidInput, match="not JSON"):
        verify({"x-signature": sign("k", body), "x-delivery-id": "d-1"}, body)


def test_github_form_encoded_payloads_are_read_too() -> None:
    body = urlencode({"payload": json.dumps({"zen": "Keep it simple."})}).encode()
    verify = hearth.channels.github("s3")
    delivery = verify(
        {
            "x-hub-signature-256": sign("s3", body),
            "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "x-github-event": "ping",
            "content-type": "application/x-www-form-urlencoded",
        },
        body,
    )
    assert (delivery.type, delivery.data) == ("ping", {"zen": "Keep it simple."})
    assert delivery.headers["x-github-delivery"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_a_verifier_without_a_secret_names_the_variable_not_a_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_WEBHOOK_SECRET", raising=False)
    with pytest.raises(hearth.ConfigurationError, match=r"\$GITHUB_WEBHOOK_SECRET"):
        hearth.channels.github()
    monkeypatch.setenv("HEARTH_WEBHOOK_SECRET", "from-the-environment")
    verify = hearth.channels.hmac()
    body = b"{}"
    headers = {"x-signature": sign("from-the-environment", body), "x-delivery-id": "e-1"}
    assert verify(headers, body).type == "message"
    assert "from-the-environment" not in repr(verify)


@pytest.mark.parametrize("max_age", [0, -5, float("nan"), float("inf"), "300", True])
def test_hmac_max_age_is_a_positive_number_of_seconds(max_age: object) -> None:
    """NaN was taken, and accepted a timestamp ten years old (every comparison with it fails);
    a string raised a bare TypeError."""
    with pytest.raises(hearth.ConfigurationError, match="max_age must be a positive number"):
        hearth.channels.hmac("k", max_age=max_age)  # type: ignore[arg-type]


def test_hmac_timestamps_are_judged_both_ways_against_max_age() -> None:
    now = 1_900_000_000.0
    verify = hearth.channels.hmac("k", max_age=60, clock=lambda: now)
    body = b'{"a": 1}'

    def headers(stamp: float) -> dict[str, str]:
        text = str(int(stamp))
        return {"x-signature": sign("k", body, text), "x-timestamp": text, "x-delivery-id": "t"}

    assert verify(headers(now - 59), body).data == {"a": 1}
    for stamp in (now - 61, now + 61):
        with pytest.raises(hearth.InvalidSignature, match="60 s"):
            verify(headers(stamp), body)


async def test_a_replay_under_another_delivery_id_is_a_duplicate_when_the_id_is_signed() -> None:
    """The hmac signature covers the body (and X-Timestamp), not X-Delivery-Id: a captured
    request sent again under a new id is a new delivery. docs/channels.md's way out, the id
    taken from the signed body, makes it a duplicate."""
    signed = hearth.channels.hmac("k")

    def verify(headers: Mapping[str, str], body: bytes) -> hearth.Delivery:
        delivery = signed(headers, body)
        return dataclasses.replace(delivery, id=str(delivery.data["event_id"]))

    def receive(delivery: hearth.Delivery) -> hearth.Dispatch:
        return hearth.Dispatch(inbox, "box", message=delivery.data["subject"])

    body = json.dumps({"event_id": "ev-7", "subject": "hi"}).encode()
    captured = {"x-signature": sign("k", body), "x-delivery-id": "d-1"}
    replayed = {**captured, "x-delivery-id": "evil-2"}
    assert signed(replayed, body).id == "evil-2"  # the header's id is not signed
    channel = hearth.Channel("mail", verify=verify, receive=receive)
    app = hearth.App([inbox], channels=[channel], db="memory", providers=MODELS)
    async with app.run() as rt:
        first = await rt.deliver("mail", captured, body)
        again = await rt.deliver("mail", replayed, body)
        assert not first.deduplicated and again.deduplicated
        assert again.submission_ids == first.submission_ids
        assert len(await rt.submissions()) == 1


async def test_async_callbacks_and_concurrent_redeliveries_admit_once() -> None:
    calls: list[str] = []

    async def verify(headers: object, body: bytes) -> hearth.Delivery:
        await asyncio.sleep(0)
        return hearth.Delivery(id="x-1", type="mail", data=json.loads(body))

    async def receive(delivery: hearth.Delivery) -> list[hearth.Dispatch]:
        calls.append(delivery.id)
        await asyncio.sleep(0.01)
        return [hearth.Dispatch(inbox, "box", message=delivery.data["subject"])]

    channel = hearth.Channel("mail", verify=verify, receive=receive)
    app = hearth.App([inbox], channels=[channel], db="memory", providers=MODELS)
    async with app.run() as rt:
        body = json.dumps({"subject": "hi"}).encode()
        results = await asyncio.gather(*(rt.deliver("mail", {}, body) for _ in range(5)))
        assert sorted(r.deduplicated for r in results) == [False, True, True, True, True]
        assert len({tuple(r.submission_ids) for r in results}) == 1
        assert len(await rt.submissions()) == 1


async def test_a_delivery_verify_left_unstamped_takes_the_stores_clock() -> None:
    """``received_at`` was this host's wall clock: on PostgreSQL, deliveries taken by a host
    whose clock drifted listed out of the order they came in. Left out by ``verify``, it is the
    store's clock (here set a day back); a verifier's own stamp is kept as it is."""
    seen: list[float] = []

    def verify(headers: Mapping[str, str], body: bytes) -> hearth.Delivery:
        data = json.loads(body)
        if "at" in data:
            return hearth.Delivery(id=data["id"], type="mail", data=data, received_at=data["at"])
        return hearth.Delivery(id=data["id"], type="mail", data=data)

    def receive(delivery: hearth.Delivery) -> hearth.Dispatch:
        seen.append(delivery.received_at)
        return hearth.Dispatch(inbox, "box", message="hi")

    channel = hearth.Channel("mail", verify=verify, receive=receive)
    app = hearth.App([inbox], channels=[channel], db="memory", providers=MODELS)
    async with app.run() as rt:
        rt.env.store.clock = lambda: 1_700_000_000.0
        await rt.deliver("mail", {}, json.dumps({"id": "d-1"}).encode())
        await rt.deliver("mail", {}, json.dumps({"id": "d-2", "at": 1_600_000_000.5}).encode())
        kept = {d.delivery_id: d.received_at for d in await rt.deliveries("mail")}
    assert kept == {"d-1": 1_700_000_000.0, "d-2": 1_600_000_000.5}
    assert seen == [1_700_000_000.0, 1_600_000_000.5]  # what receive was given, too
    assert type(seen[0]) is float


async def test_sync_callbacks_run_off_the_event_loop() -> None:
    """A sync verify or receive (a blocking lookup, say) ran on the event loop: every request,
    stream and lease renewal of the process waited for it. Each blocks here until the loop,
    still running, lets it go."""
    loop_ran = {"verify": False, "receive": False}
    go = {"verify": threading.Event(), "receive": threading.Event()}

    def blocking(name: str) -> None:
        loop_ran[name] = go[name].wait(5)  # set from the loop: False if the loop was blocked

    def verify(headers: object, body: bytes) -> hearth.Delivery:
        blocking("verify")
        return hearth.Delivery(id="s-1", type="mail", data=json.loads(body))

    def receive(delivery: hearth.Delivery) -> hearth.Dispatch:
        blocking("receive")
        return hearth.Dispatch(inbox, "box", message="hi")

    async def release() -> None:
        for name in ("verify", "receive"):
            await asyncio.sleep(0.05)
            go[name].set()

    channel = hearth.Channel("mail", verify=verify, receive=receive)
    app = hearth.App([inbox], channels=[channel], db="memory", providers=MODELS)
    async with app.run() as rt:
        releasing = asyncio.create_task(release())
        receipt = await rt.deliver("mail", {}, b"{}")
        await releasing
    assert loop_ran == {"verify": True, "receive": True}
    assert len(receipt.submission_ids) == 1


async def test_a_verify_that_raises_or_returns_garbage_admits_and_keeps_nothing() -> None:
    def crashing(headers: object, body: bytes) -> hearth.Delivery:
        raise KeyError("boom")

    def bad_id(headers: object, body: bytes) -> hearth.Delivery:
        return hearth.Delivery(id="has spaces", type="t", data={})

    def never(delivery: hearth.Delivery) -> None:
        raise AssertionError("receive must not run")

    app = hearth.App(
        [inbox],
        channels=[
            hearth.Channel("crashing", verify=crashing, receive=never),
            hearth.Channel("bad-id", verify=bad_id, receive=never),
        ],
        db="memory",
        providers=MODELS,
    )
    async with app.run() as rt:
        with pytest.raises(hearth.ChannelFailed, match="verify raised KeyError"):
            await rt.deliver("crashing", {}, b"{}")
        with pytest.raises(hearth.ChannelFailed, match="'has spaces'"):
            await rt.deliver("bad-id", {}, b"{}")
        with pytest.raises(hearth.UnknownChannel):
            await rt.deliver("nope", {}, b"{}")
        assert await rt.deliveries("crashing") == [] and await rt.deliveries("bad-id") == []
        assert await rt.submissions() == []


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        (hearth.Delivery(id="d-1", type="t", data={"x": float("nan")}), "data is not JSON"),
        (hearth.Delivery(id="d-1", type="t\x00", data={}), "type is not a string without NUL"),
        (
            hearth.Delivery(id="d-1", type="t", data={}, received_at=float("inf")),
            "received_at is not a finite number",
        ),
    ],
)
async def test_a_verify_that_returns_what_no_store_keeps_is_refused_and_keeps_nothing(
    returned: hearth.Delivery, why: str
) -> None:
    """NaN in the data was kept, after which every JSON listing of the channel's deliveries
    answered 500; a NUL in the type failed inside PostgreSQL."""

    def verify(headers: object, body: bytes) -> hearth.Delivery:
        return returned

    def never(delivery: hearth.Delivery) -> None:
        raise AssertionError("receive must not run")

    channel = hearth.Channel("odd", verify=verify, receive=never)
    app = hearth.App([inbox], channels=[channel], db="memory", providers=MODELS)
    async with app.run() as rt:
        with pytest.raises(hearth.ChannelFailed, match=why):
            await rt.deliver("odd", {}, b"{}")
        assert await rt.deliveries("odd") == []


def test_channel_names_and_duplicates_are_checked_at_app() -> None:
    def verify(headers: object, body: bytes) -> hearth.Delivery:
        return hearth.Delivery(id="x", type="t", data={})

    with pytest.raises(hearth.ConfigurationError, match="channel name 'Bad_Name'"):
        hearth.Channel("Bad_Name", verify=verify, receive=lambda d: [])
    twice = [hearth.Channel("c", verify=verify, receive=lambda d: []) for _ in range(2)]
    with pytest.raises(hearth.ConfigurationError, match="two channels are named 'c'"):
        hearth.App([inbox], channels=twice, db="memory")


def test_hmac_refuses_timestamps_that_are_not_plain_unix_seconds() -> None:
    verify = hearth.channels.hmac("k", clock=lambda: 1_900_000_000.0)
    body = b"{}"
    for stamp in ("nan", "inf", "-1e9", " ", "1900000000x"):
        headers = {
            "x-signature": sign("k", body, stamp),
            "x-timestamp": stamp,
            "x-delivery-id": "n",
        }
        with pytest.raises(hearth.InvalidSignature):
            verify(headers, body)


def test_a_delivery_id_that_is_not_an_id_is_the_senders_error() -> None:
    verify = hearth.channels.hmac("k")
    headers = {"x-signature": sign("k", b"{}"), "x-delivery-id": "../etc"}
    with pytest.raises(hearth.InvalidInput, match="X-Delivery-Id"):
        verify(headers, b"{}")


def test_a_body_with_nul_is_kept_as_text_every_store_takes() -> None:
    """PostgreSQL's text holds no NUL: the same delivery was 202 on SQLite and a 503 on
    PostgreSQL, which senders retry for ever."""
    from hearth.runtime.deliveries import _kept

    kept = _kept("bin", hearth.Delivery(id="d-1", type="t", data={}), b"ab\x00cd\xff")
    assert kept.body == "ab\ufffdcd\ufffd"
