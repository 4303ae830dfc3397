"""Schedules: cron occurrences in a time zone, DST included, fired once by the scheduler over a
real store and an injected clock (no sleeping)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

import hearth
from hearth.providers.registry import ProviderRegistry
from hearth.runtime.env import Env
from hearth.runtime.scheduler import Scheduler
from hearth.schedules import iso
from hearth.store.base import all_submissions
from hearth.store.sqlite import SQLiteStore
from hearth.testing import ScriptedModel, reply
from hearth.testing.clock import ManualClock

pytestmark = pytest.mark.anyio


@hearth.agent
def digest(ctx: hearth.AgentContext) -> str:
    ctx.use_model("scripted/digest")
    return "Write the digest."


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def paris(**options: object) -> hearth.Schedule:
    return hearth.Schedule(
        "nightly", digest, "team", cron="30 2 * * *", tz="Europe/Paris", message="go", **options
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store() -> AsyncIterator[SQLiteStore]:
    made = SQLiteStore(":memory:")
    await made.open()
    try:
        yield made
    finally:
        await made.close()


def scheduler(store: SQLiteStore, clock: ManualClock, *schedules: hearth.Schedule) -> Scheduler:
    env = Env(
        store=store,
        agents={"digest": digest},
        providers=ProviderRegistry([ScriptedModel("digest", [reply("ok")])]),
    )
    return Scheduler(env, schedules, clock)


async def fired(store: SQLiteStore) -> list[str]:
    return [s.payload["scheduled_for"] for s in await store.list_submissions()]


# --- the cron arithmetic ---------------------------------------------------------------------


def test_spring_forward_fires_at_the_jump() -> None:
    # 2026-03-29: Paris goes from 02:00 CET to 03:00 CEST; 02:30 does not exist that night.
    assert iso(paris().next_after(at("2026-03-28T12:00:00"))) == "2026-03-29T01:00:00Z"


def test_fall_back_fires_once_at_the_first_0230() -> None:
    # 2026-10-25: 02:00-03:00 happens twice (CEST, then CET); 02:30 fires once, the first time.
    s = paris()
    first = s.next_after(at("2026-10-24T12:00:00"))
    assert iso(first) == "2026-10-25T00:30:00Z"
    assert iso(s.next_after(first)) == "2026-10-26T01:30:00Z"
    # Even from inside the repeated hour, the second 02:30 is not an occurrence.
    assert iso(s.next_after(at("2026-10-25T01:29:00"))) == "2026-10-26T01:30:00Z"


def test_the_latest_due_occurrence_is_the_catch_up() -> None:
    every = hearth.Schedule("m", digest, "x", cron="* * * * *", message="m")
    assert every.latest_due(at("2026-01-01T00:00:00"), at("2026-01-01T00:00:59")) is None
    late = every.latest_due(at("2026-01-01T00:00:00"), at("2026-03-01T10:30:30"))
    assert iso(late or 0) == "2026-03-01T10:30:00Z"
    yearly = hearth.Schedule("y", digest, "x", cron="0 0 1 1 *", message="y")
    due = yearly.latest_due(at("2020-06-01T00:00:00"), at("2026-06-01T00:00:00"))
    assert iso(due or 0) == "2026-01-01T00:00:00Z"
    # Every minute of two months a year, two years missed: walked forward from the cursor, the
    # search gave up after 100,000 minutes at a January occurrence.
    winter = hearth.Schedule("w", digest, "x", cron="* * * 1,2 *", message="w")
    due = winter.latest_due(at("2024-12-01T00:00:00"), at("2026-12-05T12:00:00"))
    assert iso(due or 0) == "2026-02-28T23:59:00Z"
    assert every.latest_due(at("2026-01-01T00:00:00"), at("2026-01-01T00:01:00")) == at(
        "2026-01-01T00:01:00"
    )  # an occurrence at ``now`` itself is due


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"signal": {"type": "t", "attributes": {"x": float("nan")}}}, "attributes must be JSON"),
        ({"signal": {"type": "t", "attributes": {"x": {1, 2}}}}, "attributes must be JSON"),
        ({"signal": {"type": "t", "body": 7}}, r"signal\.body must be a string"),
        ({"signal": {"type": "t", "attributes": [1]}}, "attributes must be an object"),
        ({"signal": {"type": ""}}, "non-empty string 'type'"),
        ({"signal": "ping"}, "non-empty string 'type'"),
        ({"message": "half \ud83d"}, "unpaired surrogate"),
    ],
)
def test_a_scheduled_input_no_store_can_keep_is_refused_when_declared(
    given: dict[str, Any], says: str
) -> None:
    """It was taken as given and admitted at each occurrence: NaN in a signal's attributes
    spoiled every JSON read of the conversation's stream; the others failed at the store each
    time, or kept a signal of a shape no reader expects."""
    with pytest.raises(hearth.ConfigurationError, match=rf"schedule 'odd'.*{says}"):
        hearth.Schedule("odd", digest, "x", cron="0 9 * * *", **given)


def test_a_scheduled_signal_is_kept_as_json_gives_it_back() -> None:
    sched = hearth.Schedule(
        "tick", digest, "x", cron="0 9 * * *", signal={"type": "t", "attributes": {1: (2, 3)}}
    )
    payload = sched.payload(at("2026-12-04T09:00:00"))
    assert payload["signal"]["attributes"] == {"1": [2, 3], "scheduled_for": "2026-12-04T09:00:00Z"}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * * *"}, "five fields"),
        ({"tz": "Mars/Olympus"}, "unknown time zone"),
        ({"tz": "../etc/passwd"}, "unknown time zone"),
    ],
)
def test_a_bad_cron_or_zone_is_a_configuration_error_naming_the_schedule(
    options: dict[str, str], says: str
) -> None:
    given = {"cron": "0 9 * * *", "tz": "UTC", **options}
    with pytest.raises(hearth.ConfigurationError, match=rf"schedule 'bad'.*{says}"):
        hearth.App(
            [digest],
            db="memory",
            schedules=[hearth.Schedule("bad", digest, "x", message="m", **given)],
        )


def test_a_schedule_for_an_undeclared_agent_is_refused_at_app() -> None:
    other = hearth.Schedule("lost", "ghost", "x", cron="* * * * *", message="m")
    with pytest.raises(hearth.ConfigurationError, match="schedule 'lost': no agent named 'ghost'"):
        hearth.App([digest], db="memory", schedules=[other])
    twice = [paris(), paris()]
    with pytest.raises(hearth.ConfigurationError, match="two schedules are named 'nightly'"):
        hearth.App([digest], db="memory", schedules=twice)


# --- the scheduler, over a real store, on an injected clock -----------------------------------


async def test_the_dst_days_fire_each_night_once(store: SQLiteStore) -> None:
    clock = ManualClock(at("2026-03-27T12:00:00"))
    sched = scheduler(store, clock, paris())
    await sched.tick()
    # Step through both DST weekends a minute at a time around the nights, hourly otherwise.
    for start, end in (("2026-03-27T12:00:00", "2026-03-31T12:00:00"),):
        t = at(start)
        while t < at(end):
            clock.set(t)
            await sched.tick()
            t += 60
    clock.set(at("2026-10-23T12:00:00"))
    await sched.tick()  # the catch-up of the months between: one, for the latest
    t = at("2026-10-23T12:01:00")
    while t < at("2026-10-27T12:00:00"):
        clock.set(t)
        await sched.tick()
        t += 60
    assert await fired(store) == [
        "2026-03-28T01:30:00Z",
        "2026-03-29T01:00:00Z",  # 03:00 CEST: the skipped 02:30 fires at the jump
        "2026-03-30T00:30:00Z",
        "2026-03-31T00:30:00Z",
        "2026-10-23T00:30:00Z",  # the catch-up for 2026-03-31 → 2026-10-23, coalesced
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",  # the first 02:30 (CEST); the second (CET) does not fire
        "2026-10-26T01:30:00Z",
        "2026-10-27T01:30:00Z",
    ]


async def test_a_first_start_catches_nothing_up_and_a_restart_catches_up_once(
    store: SQLiteStore,
) -> None:
    clock = ManualClock(at("2026-05-01T10:00:30"))
    every = hearth.Schedule("m", digest, "x", cron="*/5 * * * *", message="m")
    await scheduler(store, clock, every).tick()
    assert await fired(store) == []
    clock.set(at("2026-05-01T11:07:00"))  # no process ran for an hour: one catch-up
    later = scheduler(store, clock, every)
    await later.tick()
    await later.tick()
    assert await fired(store) == ["2026-05-01T11:05:00Z"]


async def test_a_changed_cron_starts_from_now(store: SQLiteStore) -> None:
    clock = ManualClock(at("2026-05-01T10:00:30"))
    every = hearth.Schedule("m", digest, "x", cron="*/5 * * * *", message="m")
    await scheduler(store, clock, every).tick()
    clock.set(at("2026-05-01T11:07:00"))
    hourly = hearth.Schedule("m", digest, "x", cron="0 * * * *", message="m")
    changed = scheduler(store, clock, hourly)
    await changed.tick()
    assert await fired(store) == []  # 11:00 passed under the old cron: not caught up
    clock.set(at("2026-05-01T12:00:00"))
    await changed.tick()
    assert await fired(store) == ["2026-05-01T12:00:00Z"]


async def test_a_clock_set_back_between_runs_does_not_silence_a_schedule(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A run with the clock a year ahead left the cursor a year ahead: after the clock was set
    right, the schedule stayed silent until it caught up, a year later."""
    ahead = ManualClock(at("2028-01-15T08:00:30"))
    every = hearth.Schedule("m", digest, "x", cron="* * * * *", message="m")
    wrong = scheduler(store, ahead, every)
    await wrong.tick()
    ahead.set(at("2028-01-15T08:02:30"))
    await wrong.tick()
    assert await fired(store) == ["2028-01-15T08:02:00Z"]
    right = ManualClock(at("2027-01-15T08:00:30"))
    later = scheduler(store, right, every)
    await later.tick()
    assert "is ahead of the clock" in caplog.text
    for minute in range(1, 4):
        right.set(at("2027-01-15T08:00:30") + 60 * minute)
        await later.tick()
    assert await fired(store) == [
        "2028-01-15T08:02:00Z",
        "2027-01-15T08:01:00Z",
        "2027-01-15T08:02:00Z",
        "2027-01-15T08:03:00Z",
    ]
    # A clock set back by less than a minute is not taken for a wrong one: nothing fires twice.
    right.set(at("2027-01-15T08:03:10"))
    await later.tick()
    assert len(await fired(store)) == 4


async def test_two_schedulers_on_one_store_fire_each_occurrence_once(store: SQLiteStore) -> None:
    clock = ManualClock(at("2026-05-01T10:00:30"))
    every = hearth.Schedule("m", digest, "x", cron="* * * * *", message="m")
    a, b = scheduler(store, clock, every), scheduler(store, clock, every)
    await a.tick()
    await b.tick()
    for minute in range(1, 21):
        clock.set(at("2026-05-01T10:00:30") + 60 * minute)
        await b.tick()  # b read the cursor before a moved it
        await a.tick()
        await b.tick()
    assert len(await fired(store)) == 20
    assert len(set(await fired(store))) == 20


async def two_crons(store: SQLiteStore, clock: ManualClock) -> tuple[Scheduler, Scheduler]:
    """Schedule ``m`` every minute in one process, then every other minute in another that
    started later (which keeps it under its cron): both have looked once."""
    first, later = (
        scheduler(store, clock, hearth.Schedule("m", digest, "x", cron=cron, message="m"))
        for cron in ("* * * * *", "*/2 * * * *")
    )
    await first.tick()
    await later.tick()
    return first, later


async def test_a_schedule_a_canary_changed_and_left_is_fired_again(store: SQLiteStore) -> None:
    """A process that found another's cron in the row stopped firing for its whole life: a
    canary started with another cron and rolled back left the schedule firing nowhere."""
    clock = ManualClock(at("2026-05-01T10:00:30"))
    replica, _ = await two_crons(store, clock)  # the canary takes the schedule over, then is gone
    for minute in range(1, 8):
        clock.set(at("2026-05-01T10:00:30") + 60 * minute)
        await replica.tick()
    # 10:01 went to the canary's cron; its 10:02 unfired for more than a minute at 10:03:30,
    # the replica takes the schedule back from then on.
    assert await fired(store) == [f"2026-05-01T10:0{m}:00Z" for m in (4, 5, 6, 7)]
    assert not replica.yields("m")


async def test_a_schedule_another_process_keeps_under_its_cron_is_left_to_it(
    store: SQLiteStore,
) -> None:
    clock = ManualClock(at("2026-05-01T10:00:30"))
    old, newer = await two_crons(store, clock)
    for minute in range(1, 8):
        clock.set(at("2026-05-01T10:00:30") + 60 * minute)
        await old.tick()
        await newer.tick()
    # Every other minute, by the newer cron alone: the older process never takes it back.
    assert await fired(store) == [f"2026-05-01T10:0{m}:00Z" for m in (2, 4, 6)]
    assert old.yields("m") and not newer.yields("m")


async def test_a_tick_with_nothing_due_evaluates_no_cron_expression(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tick (at most a second apart) evaluated every schedule's cron twice, on the event
    loop: 5,000 schedules took 0.4 s of it every second, whether or not any was due."""
    clock = ManualClock(at("2026-05-01T10:00:30"))
    many = [
        hearth.Schedule(f"s{n}", digest, f"x{n}", cron="0 3 * * *", tz="Europe/Paris", message="m")
        for n in range(200)
    ]
    sched = scheduler(store, clock, *many)
    await sched.tick()  # opens the cursors, learns each next occurrence
    evaluated = 0
    for name in ("next_after", "latest_due"):
        real = getattr(hearth.Schedule, name)

        def counted(self: hearth.Schedule, *args: Any, real: Any = real) -> Any:
            nonlocal evaluated
            evaluated += 1
            return real(self, *args)

        monkeypatch.setattr(hearth.Schedule, name, counted)
    for _ in range(5):
        clock.advance(1)
        await sched.tick()
    assert evaluated == 0
    clock.set(at("2026-05-02T01:00:01"))  # 03:00 in Paris: every one is due, and fires once
    await sched.tick()
    assert len(await all_submissions(store)) == 200
    await sched.tick()
    assert len(await all_submissions(store)) == 200


async def test_on_sqlite_schedules_follow_the_wall_clock_not_the_steady_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SQLite's clock is the wall clock read at start, then the monotonic one: a wall clock
    set right (10 minutes) after the start made every occurrence fire 10 minutes late, for the
    rest of the process's life."""
    import hearth.store.sqlite as sqlite_module

    wall = time.time
    monkeypatch.setattr(sqlite_module.time, "time", lambda: wall() - 600)  # slow at start
    made = SQLiteStore(":memory:")
    monkeypatch.undo()  # then set right
    await made.open()
    try:
        every = hearth.Schedule("m", digest, "x", cron="* * * * *", message="m")
        env = Env(store=made, agents={"digest": digest}, providers=ProviderRegistry([]))
        looks = Scheduler(env, [every])
        assert abs(await made.now() - (wall() - 600)) < 5  # leases keep the steady clock
        assert abs(await looks.now() - wall()) < 5  # cron is wall time
    finally:
        await made.close()


async def test_the_next_occurrence_shown_after_a_clock_set_back_is_the_one_that_fires(
    store: SQLiteStore,
) -> None:
    """``GET /schedules`` showed the occurrence after the cursor a run with the clock two hours
    ahead had left, while the scheduler fired the one a minute away."""
    from hearth.runtime.runtime import Runtime

    every = hearth.Schedule("m", digest, "x", cron="* * * * *", message="m")
    ahead = ManualClock(at("2026-05-01T12:00:30"))
    await scheduler(store, ahead, every).tick()  # the cursor: noon
    right = ManualClock(at("2026-05-01T10:00:30"))
    runtime = Runtime.__new__(Runtime)
    runtime.store, runtime.scheduler = store, scheduler(store, right, every)
    [shown] = await runtime.schedules()
    assert shown["next_occurrence"] == "2026-05-01T10:01:00Z"


async def test_a_process_that_leaves_its_schedule_to_another_cron_shows_its_last_occurrence(
    store: SQLiteStore,
) -> None:
    """``GET /schedules`` of the process that yields showed ``last_occurrence: null`` although
    the other release's cron had admitted occurrences of the schedule."""
    from hearth.runtime.runtime import Runtime

    clock = ManualClock(at("2026-05-01T10:00:30"))
    old, newer = await two_crons(store, clock)
    clock.set(at("2026-05-01T10:02:30"))
    await newer.tick()
    assert await fired(store) == ["2026-05-01T10:02:00Z"]
    for process in (old, newer):
        runtime = Runtime.__new__(Runtime)
        runtime.store, runtime.scheduler = store, process
        [shown] = await runtime.schedules()
        assert shown["last_occurrence"] == "2026-05-01T10:02:00Z"
    assert shown["next_occurrence"] == "2026-05-01T10:04:00Z"  # (the newer's; the old's: None)
