"""The PostgreSQL store's notification payloads, and what its listener does with each: its own
are dropped unread, a peer's are published, a malformed one is logged and dropped. No server is
needed: the listener is fed payloads directly."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from hearth.store.events import APPENDED, SETTLED, Event, StoreEvents
from hearth.store.postgres_listen import PAYLOAD_LIMIT, Listener, decode, encode_all, own_prefix


def encode(event: Event, sender: str) -> str:
    [payload] = encode_all([event], sender)
    return payload


def listener(sender: str) -> tuple[Listener, list[Event]]:
    events = StoreEvents()
    heard: list[Event] = []
    events.listen(heard.append)

    async def unused() -> Any:
        raise AssertionError("not connected in these tests")

    return Listener(unused, "hearth", sender, events, lambda: None), heard


@pytest.mark.parametrize("sender", ["p1", 'odd "sender" \\ é', ""])
def test_a_payload_decodes_to_its_sender_and_event(sender: str) -> None:
    event = Event(SETTLED, "support/c-1", 4, "s_1")
    payload = encode(event, sender)
    assert payload.startswith(own_prefix(sender))
    assert decode(payload) == (sender, [event])


def test_one_events_payload_reads_as_before_events_were_packed() -> None:
    """A process of the previous release, during a rolling redeploy, still reads these."""
    event = Event(APPENDED, "support/c-1", 7)
    assert encode(event, "p1") == '["p1","appended","support/c-1",7,null]'


def test_many_events_share_payloads_each_under_the_limit_in_order() -> None:
    events = [
        Event(SETTLED if n % 3 else APPENDED, f"support/{'c' * 200}-{n}", n, f"s_{n}")
        for n in range(300)
    ]
    payloads = encode_all(events, "p1")
    assert 1 < len(payloads) < 20
    assert all(len(p.encode()) <= PAYLOAD_LIMIT for p in payloads)
    decoded = [decode(p) for p in payloads]
    assert all(d is not None and d[0] == "p1" for d in decoded)
    assert [e for d in decoded if d is not None for e in d[1]] == events
    assert encode_all([], "p1") == []


def test_the_listener_drops_its_own_notifications_and_publishes_a_peers() -> None:
    mine, heard = listener("p1")
    event = Event(APPENDED, "support/c-1", 7)
    mine._deliver(encode(event, "p1"))
    assert heard == []
    for peer in ("p10", "p", "p1x"):  # senders that share the start of this one's name
        mine._deliver(encode(event, peer))
    assert heard == [event, event, event]


def test_the_listener_publishes_every_event_of_a_peers_packed_payload() -> None:
    mine, heard = listener("p1")
    events = [Event(APPENDED, f"support/c-{n}", n) for n in range(5)]
    [payload] = encode_all(events, "p2")
    mine._deliver(payload)
    assert heard == events
    [own] = encode_all(events, "p1")
    mine._deliver(own)
    assert heard == events


def test_a_malformed_notification_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    mine, heard = listener("p1")
    with caplog.at_level(logging.WARNING, logger="hearth.store.postgres"):
        mine._deliver("not json")
        mine._deliver('["p2","no such kind","c",1,null]')
        # One bad event spoils its payload: nothing of it is published.
        mine._deliver('["p2","appended","c",1,null,"appended","c"]')
        mine._deliver('["p2","appended","c",1,null,"appended","c","x",null]')
        mine._deliver('{"p2": 1}')
    assert heard == []
    assert caplog.text.count("malformed notification") == 5


@pytest.mark.anyio
async def test_a_listen_the_server_refuses_is_tried_ever_less_often() -> None:
    """A standby refuses LISTEN after the connection succeeds: the listener tried again every
    0.1 s, for good (a warning each time)."""
    tries = 0

    class Refusing:
        async def execute(self, *args: Any) -> None:
            raise psycopg.errors.FeatureNotSupported("cannot execute LISTEN during recovery")

        async def close(self) -> None:
            pass

    async def connect() -> Any:
        nonlocal tries
        tries += 1
        return Refusing()

    listening = Listener(connect, "hearth", "p1", StoreEvents(), lambda: None)
    listening.start()
    await asyncio.sleep(1.5)
    await listening.stop()
    assert 2 <= tries <= 6  # 0, 0.1, 0.3, 0.7, 1.5 s: not every 0.1 s
