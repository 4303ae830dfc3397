"""The PostgreSQL store's notification payloads, and what its listener does with each: its own
are dropped unread, a peer's are published, a malformed one is logged and dropped. No server is
needed: the listener is fed payloads directly."""

from __future__ import annotations

import logging

import pytest

from hearth.store.events import APPENDED, SETTLED, Event, StoreEvents
from hearth.store.postgres_listen import Listener, decode, encode, own_prefix


def listener(sender: str) -> tuple[Listener, list[Event]]:
    events = StoreEvents()
    heard: list[Event] = []
    events.listen(heard.append)
    return Listener("postgresql://unused", {}, "hearth", sender, events, lambda: None), heard


@pytest.mark.parametrize("sender", ["p1", 'odd "sender" \\ é', ""])
def test_a_payload_decodes_to_its_sender_and_event(sender: str) -> None:
    event = Event(SETTLED, "support/c-1", 4, "s_1")
    payload = encode(event, sender)
    assert payload.startswith(own_prefix(sender))
    assert decode(payload) == (sender, event)


def test_the_listener_drops_its_own_notifications_and_publishes_a_peers() -> None:
    mine, heard = listener("p1")
    event = Event(APPENDED, "support/c-1", 7)
    mine._deliver(encode(event, "p1"))
    assert heard == []
    for peer in ("p10", "p", "p1x"):  # senders that share the start of this one's name
        mine._deliver(encode(event, peer))
    assert heard == [event, event, event]


def test_a_malformed_notification_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    mine, heard = listener("p1")
    with caplog.at_level(logging.WARNING, logger="hearth.store.postgres"):
        mine._deliver("not json")
        mine._deliver('["p2","no such kind","c",1,null]')
    assert heard == []
    assert caplog.text.count("malformed notification") == 2
