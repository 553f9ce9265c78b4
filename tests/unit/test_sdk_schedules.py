"""Schedules in the SDK without a server: the Schedule answer and the request fields, every
schedule method of Client and AsyncClient on the FakeServer (its answers, its errors, interval
ticks becoming messages on its clock once each, changes withdrawing the ticks sent ahead), the
task layer's `schedule=` and `sync_schedules()` (a scheduled task run by a burst worker), and
the `delayqueue schedule` commands. tests/integration/test_sdk_schedules.py runs the client
against a real server and test_sdk_fake_parity.py holds the fake's answers to the server's."""
import argparse
import asyncio
import json
import sys
from datetime import datetime, timedelta, timezone

import pytest
from delayqueue_client import (App, AsyncClient, BadRequest, Client, Conflict, NotFound, RateLimited, Schedule,
                               SchedulePage, Worker, cli, schedule_id_for)
from delayqueue_client.schedule import schedule_fields
from delayqueue_client.testing import FakeServer, Settings

WAITING, READY, CONSUMING, ACKED, DELETED = 1, 2, 3, 4, 7
MINUTE = 60_000


@pytest.fixture
def server():
    return FakeServer(seed=3)


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def topic_ids(server: FakeServer, topic: str) -> dict[str, int]:
    """msgId -> status of every message the fake holds for a topic."""
    return {m.msg_id: m.status for m in server._topic(topic).messages.values()}


# --- the answer and the request fields

def test_a_schedule_answer_reads_into_a_frozen_schedule_ignoring_unknown_fields():
    data = {"scheduleId": "s", "topic": "t", "msg": "m", "cron": None, "timezone": None, "everyMillis": 90_000,
            "startTime": 5, "endTime": None, "catchUp": "latest", "priority": 1, "ttlMillis": 0, "maxRetry": -1,
            "paused": False, "nextFireTimes": [5, 90_005], "createTime": 1, "updateTime": 2, "newField": "x"}
    schedule = Schedule.from_api(data)
    assert schedule == Schedule("s", "t", "m", None, None, 90_000, 5, None, "latest", 1, 0, -1, False, (5, 90_005), 1, 2)
    assert schedule.every == timedelta(seconds=90)
    assert hash(schedule)  # frozen, its fire times a tuple
    with pytest.raises(AttributeError):
        schedule.paused = True  # type: ignore[misc]


def test_request_fields_take_seconds_or_timedeltas_and_aware_datetimes_or_epoch_ms():
    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert schedule_fields(topic="t", msg="m", every=1.5, ttl=timedelta(minutes=2), start=start, end=1_900_000_000_000,
                           priority=0, paused=False) == {
        "topic": "t", "msg": "m", "everyMillis": 1500, "ttlMillis": 120_000, "startTime": 1_893_456_000_000,
        "endTime": 1_900_000_000_000, "priority": 0, "paused": False}
    assert schedule_fields(cron="* * * * *", end=0) == {"cron": "* * * * *", "endTime": 0}
    with pytest.raises(ValueError, match="naive datetime"):
        schedule_fields(start=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="0 or more"):
        schedule_fields(every=-1)
    for endless in (float("inf"), float("nan"), 10 ** 400, 1e307):  # no whole ms: a ValueError, not OverflowError
        with pytest.raises(ValueError, match="0 or more"):
            schedule_fields(ttl=endless)
    with pytest.raises(TypeError, match="msg must be a str"):
        schedule_fields(msg=b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="epoch milliseconds"):
        schedule_fields(start=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        schedule_fields(every=True)


# --- the client's methods on the fake

def test_every_method_on_the_fake_answers_as_the_server(server, client):
    now = server.clock.now_ms()
    made = client.create_schedule("beat", "t", "tick", every=timedelta(minutes=1), priority=3, ttl=30, max_retry=2)
    assert (made.schedule_id, made.topic, made.msg, made.cron, made.timezone, made.every_ms) == (
        "beat", "t", "tick", None, None, MINUTE)
    assert (made.start_time, made.create_time, made.update_time) == (now + MINUTE, now, now)
    assert made.next_fire_times == tuple(now + i * MINUTE for i in range(1, 6))
    assert (made.catch_up, made.priority, made.ttl_ms, made.max_retry, made.paused) == ("latest", 3, 30_000, 2, False)

    nightly = client.create_schedule("nightly", "reports", "{}", cron="30 2 * * *", timezone="Europe/Berlin",
                                     catch_up="skip")
    assert (nightly.cron, nightly.timezone, nightly.every_ms, nightly.catch_up) == (
        "30 2 * * *", "Europe/Berlin", None, "skip")
    assert nightly.next_fire_times == ()  # the fake computes no cron ticks
    assert client.get_schedule("beat") == made and client.get_schedule("nope") is None

    assert client.list_schedules() == SchedulePage([made, nightly], None)
    first = client.list_schedules(limit=1)
    assert ([s.schedule_id for s in first.schedules], first.next_cursor) == (["beat"], "beat")
    assert client.list_schedules(limit=1, cursor=first.next_cursor) == SchedulePage([nightly], None)
    assert client.list_schedules("reports").schedules == [nightly]

    server.clock.advance(1)
    changed = client.update_schedule("beat", every=120, end=now + 10 * MINUTE)
    assert (changed.every_ms, changed.start_time, changed.end_time, changed.update_time) == (
        120_000, now + MINUTE, now + 10 * MINUTE, now + 1000)
    assert changed.next_fire_times == (now + MINUTE, now + 3 * MINUTE, now + 5 * MINUTE, now + 7 * MINUTE,
                                       now + 9 * MINUTE)  # none after its end
    assert client.update_schedule("beat", end=0).end_time is None
    to_cron = client.update_schedule("beat", cron="*/5 * * * *")
    assert (to_cron.cron, to_cron.timezone, to_cron.every_ms, to_cron.start_time) == (
        "*/5 * * * *", "UTC", None, None)  # the interval's anchor is not the cron's earliest tick
    back = client.update_schedule("beat", every=60)
    assert (back.cron, back.every_ms, back.start_time) == (None, MINUTE, now + 1000 + MINUTE)  # one interval on

    paused = client.pause_schedule("beat")
    assert paused.paused and paused.next_fire_times == ()
    assert not client.resume_schedule("beat").paused
    assert client.delete_schedule("beat") is True and client.delete_schedule("beat") is False
    assert client.get_schedule("beat") is None
    assert server.calls[-3:] == ["deleteSchedule", "deleteSchedule", "getSchedule"]


def error(action) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:
        action()
    return type(caught.value), caught.value.msg


def test_the_fakes_errors_are_the_servers(client):
    client.create_schedule("s", "t", "x", every=60)
    assert error(lambda: client.create_schedule("s", "t", "x", every=60)) == (
        Conflict, "schedule 's' exists: updateSchedule changes it")
    for action in (lambda: client.update_schedule("nope", priority=1), lambda: client.pause_schedule("nope"),
                   lambda: client.resume_schedule("nope")):
        assert error(action) == (NotFound, "no schedule 'nope'")
    refused = [
        (lambda: client.create_schedule("a b", "t", "x", every=60),
         "scheduleId: must be 1 to 128 letters, digits, '.', '_', ':' or '-'"),
        (lambda: client.create_schedule("a@1", "t", "x", every=60),
         "scheduleId: must be 1 to 128 letters, digits, '.', '_', ':' or '-'"),
        (lambda: client.create_schedule("n", "t", "x"), "cron: give either cron or everyMillis"),
        (lambda: client.create_schedule("n", "t", "x", cron="* * * * *", every=60),
         "cron: give either cron or everyMillis"),
        (lambda: client.create_schedule("n", "t", "x", every=0.5),
         "everyMillis must be at least 1000 (DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS)"),
        (lambda: client.create_schedule("n", "t", "x", cron="* * * * *", timezone="Moon/Base"),
         "unknown time zone 'Moon/Base'"),
        (lambda: client.create_schedule("n", "t", "x", cron="* * *"),
         "cron: needs 5 fields (minute hour day-of-month month day-of-week), got 3"),
        (lambda: client.create_schedule("n", "t", "x", cron="@daily"),
         "cron: macros such as '@daily' are not supported; write the 5 fields (minute hour day-of-month month "
         "day-of-week)"),
        (lambda: client.create_schedule("n", "t", "x", cron="0 0 * * fri-mon"),
         "cron: day-of-week field: range 'fri-mon' runs backwards"),
        (lambda: client.create_schedule("n", "t", "x", cron="0 0 30 2 *"), "cron '0 0 30 2 *' never fires"),
        (lambda: client.create_schedule("n", "t", "x", every=60, start=2_000_000_000_000, end=1_000_000_000_000),
         "endTime must not be before startTime"),
        (lambda: client.create_schedule("n", "t", "x", every=60, catch_up="sometimes"),
         "catchUp: must be one of latest, all, skip"),
        (lambda: client.create_schedule("n", "t", "x" * 1_048_577, every=60),
         "msg: is 1048577 bytes, over the limit of 1048576 bytes"),
        (lambda: client.update_schedule("s"), "give at least one field to change: topic, msg, cron, timezone, "
         "everyMillis, startTime, endTime, catchUp, priority, ttlMillis, maxRetry, paused"),
        (lambda: client.list_schedules(limit=1001), "limit: Ensure this value is less than or equal to 1000."),
        (lambda: client.list_schedules(cursor="a b"), "cursor: not a nextCursor that listSchedules answered"),
    ]
    for action, text in refused:
        assert error(action) == (BadRequest, text)
    # A cron rule that only falls on real dates fires: Feb 29 comes in leap years, names and steps read.
    for rule in ("0 0 29 2 *", "*/15 9-17 * jan-jun mon-fri", "0 0 30 2 1", "0 12 1,15 * *", "00 07 * * 7"):
        assert client.create_schedule(f"ok-{len(client.list_schedules().schedules)}", "t", "x", cron=rule).cron == rule


def test_an_empty_text_the_server_would_take_as_not_given_is_refused_naming_it(server, client):
    """The server takes an empty parameter as not given: `update_schedule(x, cron="")` answered "give at
    least one field to change", beside another field it was dropped unsaid, an empty cursor was the first page."""
    client.create_schedule("s", "t", "x", every=60)
    calls = {"cron": lambda: client.update_schedule("s", cron=""),
             "timezone": lambda: client.update_schedule("s", timezone="", priority=1),
             "catch_up": lambda: client.create_schedule("n", "t", "x", every=60, catch_up=""),
             "cursor": lambda: client.list_schedules("t", cursor="")}
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"^{name} is empty: the server would take it as not given"):
            call()
    with pytest.raises(ValueError, match="^cursor is empty"):
        client.dead_letters("t", cursor="")

    async def on_the_async_client() -> None:
        async with server.async_client() as aclient:
            await aclient.update_schedule("s", cron="")
    with pytest.raises(ValueError, match="^cron is empty"):
        asyncio.run(on_the_async_client())
    assert client.get_schedule("s").priority == 0  # nothing was sent


def test_over_the_namespaces_cap_of_schedules_is_a_rate_limit_that_waiting_does_not_lift():
    server = FakeServer(settings=Settings(max_schedules=1, schedule_min_interval_millis=60_000))
    with server.client() as client:
        client.create_schedule("one", "t", "x", every=60)
        assert error(lambda: client.create_schedule("two", "t", "x", every=60)) == (
            RateLimited, "namespace 'default' has 1 schedules: the cap is 1 (DELAYQUEUE_MAX_SCHEDULES)")
        assert error(lambda: client.create_schedule("one", "t", "x", every=60)) == (  # taken: a conflict
            Conflict, "schedule 'one' exists: updateSchedule changes it")
        assert error(lambda: client.update_schedule("one", every=30)) == (
            BadRequest, "everyMillis must be at least 60000 (DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS)")


def test_the_async_client_has_the_same_methods():
    server = FakeServer()

    async def main() -> None:
        client = server.async_client()
        made = await client.create_schedule("a", "t", "x", every=10)
        assert await client.get_schedule("a") == made
        assert (await client.list_schedules()).schedules == [made]
        assert (await client.pause_schedule("a")).paused
        assert not (await client.resume_schedule("a")).paused
        assert (await client.update_schedule("a", priority=5)).priority == 5
        assert await client.delete_schedule("a") is True
        assert await client.get_schedule("a") is None
        await client.aclose()
    asyncio.run(main())


# --- ticks on the fake's clock

def test_interval_ticks_become_messages_on_the_fake_clock_exactly_once_each(server, client):
    start = server.clock.now_ms()
    client.create_schedule("beat", "t", "tick", every=60, priority=2)
    pulled: list = []
    for seconds in (0.5, 59.4, 0.1, 0.001, 125, 3.999, 30, 381):  # 600 s in uneven steps
        server.clock.advance(seconds)
        batch = client.pull("t", batch=100)
        assert all(client.ack("t", m.msg_id) for m in batch)
        pulled += batch
    ticks = [start + i * MINUTE for i in range(1, 11)]
    assert [m.msg_id for m in pulled] == [f"beat@{tick}" for tick in ticks]
    assert [m.trigger_time for m in pulled] == ticks
    assert {(m.msg, m.priority, m.retry) for m in pulled} == {("tick", 2, 1)}
    # Each sent ahead, up to 10 s before its tick: the next one waits already.
    assert all(m.trigger_time - 10_000 <= m.produce_time < m.trigger_time for m in pulled)
    upcoming = client.get("t", f"beat@{start + 11 * MINUTE}")
    assert upcoming is None  # 60 s away: not sent yet
    server.clock.advance(55)
    assert client.get("t", f"beat@{start + 11 * MINUTE}").status == WAITING
    assert client.pull("t") == []


def test_one_long_jump_fires_every_tick_in_between_in_order_each_within_its_ttl(server, client):
    start = server.clock.now_ms()
    client.create_schedule("s", "t", "x", every=60, ttl=300)
    server.clock.advance(3600)
    ticks = [start + i * MINUTE for i in range(1, 61)]
    assert set(topic_ids(server, "t")) == {f"s@{tick}" for tick in ticks}
    # Sent when the planner would have (10 s ahead): those whose TTL ended meanwhile are dead letters.
    pulled = client.pull("t", batch=100)
    assert [m.trigger_time for m in pulled] == [t for t in ticks if t + 300_000 > server.clock.now_ms()]
    assert len(client.dead_letters("t").messages) == 60 - len(pulled)


def test_a_change_withdraws_the_ticks_sent_ahead_and_the_new_plan_has_new_msg_ids(server, client):
    start = server.clock.now_ms()
    client.create_schedule("s", "t", "x", every=2)  # ticks up to 10 s ahead: 5 sent
    assert topic_ids(server, "t") == {f"s@{start + i * 2000}": WAITING for i in range(1, 6)}
    server.clock.advance(3)
    [first] = client.pull("t")
    client.update_schedule("s", msg="y")
    held = topic_ids(server, "t")
    assert held[first.msg_id] == CONSUMING  # delivered: kept
    assert [held[f"s@{start + i * 2000}"] for i in range(2, 7)] == [DELETED] * 5  # not yet due: withdrawn
    assert {msg_id: status for msg_id, status in held.items() if "#" in msg_id} == {
        f"s@{start + i * 2000}#1": WAITING for i in range(2, 7)}  # the same grid, generation 1
    server.clock.advance(1)
    [second] = client.pull("t")
    assert (second.msg_id, second.msg) == (f"s@{start + 4000}#1", "y")


def test_a_change_after_a_tick_sent_ahead_was_deleted_keeps_it_cancelled_and_every_other_tick_once(server, client):
    start = server.clock.now_ms()
    tick = [start + i * 2000 for i in range(8)]
    client.create_schedule("s", "t", "x", every=2)  # 5 ticks sent ahead
    assert client.delete("t", f"s@{tick[4]}")  # the fourth cancelled by hand
    client.update_schedule("s", msg="y")
    held = topic_ids(server, "t")
    # As on the server: all withdrawn, and the new plan sent up to the cancelled one, which it ends at once.
    assert [held[f"s@{tick[i]}"] for i in range(1, 6)] == [DELETED] * 5
    assert {msg_id: status for msg_id, status in held.items() if msg_id.endswith("#1")} == {
        **{f"s@{tick[i]}#1": WAITING for i in (1, 2, 3, 5)}, f"s@{tick[4]}#1": DELETED}
    # A second change finds every tick sent ahead (before, those before the cancelled one were missed:
    # sent twice), and keeps the cancelled one cancelled; a pause leaves none to fire.
    client.update_schedule("s", msg="z")
    server.clock.advance(10)
    fired = client.pull("t", batch=100)
    assert [(m.trigger_time, m.msg) for m in fired] == [(tick[i], "z") for i in (1, 2, 3, 5)]
    assert all(client.ack("t", m.msg_id) for m in fired)
    client.pause_schedule("s")
    server.clock.advance(60)
    assert client.pull("t", batch=100) == []


def test_paused_no_tick_fires_and_resumed_ticks_go_on_from_now_without_those_missed(server, client):
    start = server.clock.now_ms()
    client.create_schedule("s", "t", "x", every=60)
    client.pause_schedule("s")
    assert topic_ids(server, "t") == {}
    server.clock.advance(600)
    assert client.pull("t", batch=100) == []
    client.resume_schedule("s")
    server.clock.advance(120)
    assert [m.msg_id for m in client.pull("t", batch=100)] == [f"s@{start + 11 * MINUTE}#2", f"s@{start + 12 * MINUTE}#2"]
    created_paused = client.create_schedule("p", "t", "x", every=60, paused=True)
    assert created_paused.paused and created_paused.next_fire_times == ()
    server.clock.advance(600)
    assert not [m for m in client.pull("t", batch=100) if m.msg_id.startswith("p@")]


def test_a_start_and_an_end_bound_the_ticks_and_a_deleted_schedule_stops(server, client):
    now = server.clock.now_ms()
    client.create_schedule("s", "t", "x", every=60, start=now + 30_000, end=now + 30_000 + 2 * MINUTE)
    server.clock.advance(3600)
    assert sorted(m.trigger_time for m in client.pull("t", batch=100)) == [
        now + 30_000, now + 90_000, now + 150_000]
    client.create_schedule("d", "u", "x", every=1)
    client.delete_schedule("d")
    server.clock.advance(60)
    assert set(topic_ids(server, "u").values()) == {DELETED}  # the 10 sent ahead withdrawn, none after


def test_a_schedule_created_again_under_a_deleted_ones_id_fires_at_the_times_the_delete_withdrew(server, client):
    start = server.clock.now_ms() + 2000
    client.create_schedule("s", "t", "x", every=2, start=start)  # ticks up to 10 s ahead: 5 sent
    withdrawn = set(topic_ids(server, "t"))
    client.delete_schedule("s")
    client.create_schedule("s", "t", "y", every=2, start=start)
    held = topic_ids(server, "t")
    assert {held[msg_id] for msg_id in withdrawn} == {DELETED}
    assert {msg_id: status for msg_id, status in held.items() if msg_id not in withdrawn} == {
        f"s@{start + i * 2000}#1": WAITING for i in range(5)}  # the same times under msgIds of their own
    server.clock.advance(2)
    assert [(m.msg_id, m.msg) for m in client.pull("t")] == [(f"s@{start}#1", "y")]


def test_a_cron_schedule_is_kept_and_answered_but_never_fires_on_the_fake(server, client):
    client.create_schedule("c", "t", "x", cron="* * * * *")
    server.clock.advance(timedelta(days=1))
    assert client.pull("t", batch=100) == [] and topic_ids(server, "t") == {}


def test_real_time_fake_fires_a_one_second_schedule_to_a_long_poll():
    server = FakeServer(real_time=True)
    with server.client() as client:
        made = client.create_schedule("s", "t", "x", every=1)
        [message] = client.pull("t", wait_ms=3000)
        assert message.msg_id == f"s@{made.start_time}"
        client.delete_schedule("s")
        later = client.create_schedule("later", "t", "x", every=60, start=made.start_time + 3_600_000)
        # A long poll wakes when the planner has a tick to send (10 s ahead), not only at its end.
        assert server._next_plan_ms() == later.start_time - 10_000


# --- the task layer

def test_schedule_ids_derive_from_task_names_within_the_servers_rule():
    assert schedule_id_for("reports.nightly") == "task:reports.nightly"
    assert schedule_id_for("a b") != schedule_id_for("a-b") == "task:a-b"
    assert schedule_id_for("a b").startswith("task:a-b-") and len(schedule_id_for("a b")) == len("task:a-b-") + 16
    assert schedule_id_for("m.<locals>.f").startswith("task:m.-locals-.f-")
    long = schedule_id_for("x" * 300)
    assert len(long) == 128 and long != schedule_id_for("x" * 301)
    assert len(schedule_id_for("x" * 123)) == 128 and schedule_id_for("x" * 123) == "task:" + "x" * 123
    assert schedule_id_for("名前").startswith("task:") and len(schedule_id_for("名前")) == 5 + 16
    import re
    for name in ("reports.nightly", "a b", "x" * 300, "名前", "m.<locals>.f", "@#"):
        assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", schedule_id_for(name))


def test_a_scheduled_task_is_declared_with_a_cron_or_an_interval_and_runs_with_no_arguments():
    app = App(Client("http://127.0.0.1:9"))

    @app.task(topic="r", name="r.cron", schedule=" 0 2 * * * ", schedule_timezone="Europe/Berlin", ttl=60)
    def cron_task() -> None:
        pass

    @app.task(name="r.every", schedule=timedelta(minutes=5))
    def every_task(optional: int = 1) -> None:
        pass

    @app.task(name="r.plain")
    def plain(x: int) -> None:
        pass

    assert (cron_task.schedule_id, every_task.schedule_id, plain.schedule_id) == ("task:r.cron", "task:r.every", None)
    assert app.scheduled_tasks() == [cron_task, every_task]
    fields = cron_task._schedule_fields()
    assert json.loads(fields.pop("msg")) == {"v": 1, "task": "r.cron", "args": [], "kwargs": {}, "headers": {}}
    assert fields == {"topic": "r", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "every_ms": None,
                      "priority": 0, "ttl_ms": 60_000, "max_retry": -1}
    assert every_task._schedule_fields()["every_ms"] == 300_000
    with pytest.raises(TypeError, match="runs with no arguments"):
        @app.task(name="r.args", schedule=60)
        def needs(x: int) -> None:
            pass
    assert "r.args" not in [t.name for t in app.scheduled_tasks()]
    for bad, kind in (({"schedule_timezone": "UTC"}, ValueError), ({"schedule": 60, "schedule_timezone": "UTC"},
                      ValueError), ({"schedule": 0}, ValueError), ({"schedule": ""}, ValueError),
                      ({"schedule": True}, TypeError), ({"schedule": [1]}, TypeError)):
        with pytest.raises(kind):
            app.task(**bad)
    app.client.close()


def test_sync_schedules_creates_then_leaves_alone_then_updates_and_prunes(server, client):
    app = App(client)

    @app.task(topic="r", name="r.cron", schedule="0 2 * * *", priority=4)
    def cron_task() -> None:
        pass

    @app.task(topic="r", name="r.every", schedule=30)
    def every_task() -> None:
        pass

    client.create_schedule("task:r.gone", "r", "x", every=60)  # a task removed since
    client.create_schedule("mine", "r", "x", every=60)  # not the task layer's
    assert app.sync_schedules() == {"task:r.cron": "created", "task:r.every": "created"}
    before = client.list_schedules().schedules
    calls = len(server.calls)
    assert app.sync_schedules() == {"task:r.cron": "unchanged", "task:r.every": "unchanged"}
    assert server.calls[calls:] == ["getSchedule", "getSchedule"]
    assert client.list_schedules().schedules == before  # untouched: no new generation of ticks
    cron = client.get_schedule("task:r.cron")
    assert (cron.topic, cron.cron, cron.timezone, cron.priority, cron.ttl_ms, cron.max_retry) == (
        "r", "0 2 * * *", "UTC", 4, 0, -1)
    client.pause_schedule("task:r.every")  # an operator's pause stays

    redeployed = App(client)

    @redeployed.task(topic="r", name="r.cron", schedule=timedelta(hours=1), max_retry=1)
    def cron_now_every() -> None:
        pass

    @redeployed.task(topic="r", name="r.every", schedule=30)
    def every_again() -> None:
        pass

    assert redeployed.sync_schedules(prune=True) == {"task:r.cron": "updated", "task:r.every": "unchanged",
                                                     "task:r.gone": "deleted"}
    changed = client.get_schedule("task:r.cron")
    assert (changed.cron, changed.every_ms, changed.priority, changed.max_retry) == (None, 3_600_000, 0, 1)
    assert client.get_schedule("task:r.every").paused
    assert [s.schedule_id for s in client.list_schedules().schedules] == ["mine", "task:r.cron", "task:r.every"]
    assert App(eager=True).sync_schedules() == {}


def test_sync_schedules_compares_with_a_schedule_another_process_created_meanwhile(server, client):
    app = App(client)

    @app.task(topic="r", name="r.every", schedule=30)
    def every_task() -> None:
        pass

    with server.client() as other:
        other.create_schedule("task:r.every", "r", "another body", every=30)
        real_get = client.get_schedule
        answers = iter([None])  # the first look found none: the other sync had not created it yet
        client.get_schedule = lambda schedule_id: next(answers, None) or real_get(schedule_id)  # type: ignore
        assert app.sync_schedules() == {"task:r.every": "updated"}  # its create met a Conflict: compared, updated
        assert server.calls[-3:] == ["createSchedule", "getSchedule", "updateSchedule"]
        assert json.loads(other.get_schedule("task:r.every").msg)["task"] == "r.every"


def test_a_scheduled_task_is_routed_to_its_function_by_a_burst_worker(server, client):
    app = App(client)
    runs = []

    @app.task(topic="beats", name="beats.minute", schedule=timedelta(minutes=1))
    def minute() -> None:
        runs.append(server.clock.now_ms())

    @app.task(topic="beats", name="beats.plain")
    def plain(n: int) -> None:
        runs.append(-n)

    app.sync_schedules()
    plain.send(7)
    server.clock.advance(180)
    app.worker().run(burst=True, install_signal_handlers=False)
    assert sorted(runs) == [-7] + [server.clock.now_ms()] * 3  # three ticks, run with no arguments
    assert {m.status for m in server._topic("beats").messages.values()} == {ACKED}


def test_an_async_worker_runs_a_scheduled_async_task():
    server = FakeServer()
    app = App(server.client(), async_client=server.async_client())
    runs = []

    @app.task(topic="beats", name="beats.async", schedule=1)
    async def beat() -> None:
        runs.append(server.clock.now_ms())

    app.sync_schedules()
    server.clock.advance(2)
    worker: Worker = app.worker(asynchronous=True)
    asyncio.run(worker.run_async(burst=True, install_signal_handlers=False))
    assert len(runs) == 2


# --- the command line on the fake

@pytest.fixture
def run_cli(server, monkeypatch, capsys):
    monkeypatch.setattr(cli, "Client", lambda url, token: server.client())

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


def test_the_schedule_commands(server, run_cli):
    now = server.clock.now_ms()
    code, out, _ = run_cli("schedule", "create", "beat", "t", "hello", "--every", "90s", "--priority", "3",
                           "--ttl", "1h", "--max-retry", "2", "--catch-up", "all")
    assert code == 0 and out == f"created schedule beat on t: every 90s, next {cli.iso(now + 90_000)}\n"
    code, out, _ = run_cli("schedule", "create", "nightly", "r", "{}", "--cron", "0 2 * * *", "--timezone",
                           "Europe/Berlin", "--paused", "--start", "2030-01-01T00:00:00+00:00", "--end",
                           "1999999999000")
    assert code == 0 and out == "created schedule nightly on r: cron '0 2 * * *' (Europe/Berlin), paused\n"
    nightly = server.client().get_schedule("nightly")
    assert (nightly.start_time, nightly.end_time, nightly.paused) == (1_893_456_000_000, 1_999_999_999_000, True)

    code, out, _ = run_cli("schedule", "get", "beat")
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert code == 0 and lines["rule"] == "every 90s" and lines["ttl"] == "1h" and lines["max_retry"] == "2"
    assert lines["catch_up"] == "all" and lines["msg"] == "hello" and lines["paused"] == "no"
    code, out, _ = run_cli("schedule", "get", "beat", "--json")
    assert json.loads(out)["every_ms"] == 90_000 and json.loads(out)["next_fire_times"][0] == now + 90_000
    code, out, _ = run_cli("schedule", "list")
    assert out.splitlines() == [f"beat\tt\tevery 90s\tnext {cli.iso(now + 90_000)}",
                                "nightly\tr\tcron '0 2 * * *' (Europe/Berlin)\tpaused"]
    code, out, _ = run_cli("schedule", "list", "--limit", "1", "--topic", "t")
    assert out.splitlines() == [f"beat\tt\tevery 90s\tnext {cli.iso(now + 90_000)}"]
    code, out, _ = run_cli("schedule", "list", "--limit", "1")
    assert out.splitlines()[-1] == "more: delayqueue schedule list --limit 1 --cursor beat"  # the same page size
    # A topic the shell would split is quoted; the default page size is left out.
    assert cli.more_hint(["dead", "list", "a b"], argparse.Namespace(limit=cli.DEFAULT_PAGE), "c") == (
        "more: delayqueue dead list 'a b' --cursor c")
    code, out, _ = run_cli("--json", "schedule", "list", "--topic", "none")
    assert json.loads(out) == {"schedules": [], "next_cursor": None}

    code, out, _ = run_cli("schedule", "update", "beat", "--every", "2m", "--msg", "changed", "--end", "none")
    assert code == 0 and out.startswith("updated schedule beat on t: every 2m, next ")
    assert server.client().get_schedule("beat").msg == "changed"
    assert run_cli("schedule", "pause", "beat")[1] == "paused schedule beat on t: every 2m, paused\n"
    assert run_cli("schedule", "resume", "beat")[1].startswith("resumed schedule beat on t: every 2m, next ")
    assert run_cli("schedule", "delete", "beat") == (0, "deleted schedule beat\n", "")
    assert run_cli("schedule", "delete", "beat", "--json") == (1, "", "delayqueue: error: 404 no schedule 'beat'\n")
    assert run_cli("schedule", "get", "beat") == (1, "", "delayqueue: error: 404 no schedule 'beat'\n")
    assert run_cli("schedule", "pause", "beat") == (1, "", "delayqueue: error: 404 no schedule 'beat'\n")
    assert run_cli("schedule", "create", "x", "t", "m", "--cron", "* * *") == (
        1, "", "delayqueue: error: 400 cron: needs 5 fields (minute hour day-of-month month day-of-week), got 3\n")


@pytest.mark.parametrize("argv,problem", [
    (("schedule", "create", "x", "t", "m"), "schedule create needs --cron EXPRESSION or --every DURATION"),
    (("schedule", "create", "x", "t", "m", "--cron", "* * * * *", "--every", "1s"),
     "argument --every: not allowed with argument --cron"),
    (("schedule", "create", "x", "t", "m", "--every", "5"), "argument --every: invalid duration '5'"),
    (("schedule", "create", "x", "t", "m", "--every", "1m", "--timezone", "UTC"), "--timezone is the time zone"),
    (("schedule", "create", "x", "t", "m", "--every", "1m", "--catch-up", "some"), "argument --catch-up: invalid choice"),
    (("schedule", "create", "x", "t", "m", "--every", "1m", "--start", "soon"), "argument --start: invalid time 'soon'"),
    # Argparse's own 'invalid instant_ms value' would name neither the forms taken nor what is wrong.
    (("schedule", "create", "x", "t", "m", "--every", "1m", "--start", "0001-01-01"),
     "argument --start: invalid time '0001-01-01': epoch milliseconds or ISO 8601"),
    (("schedule", "create", "x", "t", "m", "--every", "1m", "--end", "¹²³"),
     "argument --end: invalid time '¹²³'"),
    (("schedule", "update", "x"), "schedule update changes what it is given"),
    # An empty value: the server would take it as not given, and say no field to change was given.
    (("schedule", "update", "x", "--cron", ""), "argument --cron: empty: the server would take it as not given"),
    (("schedule", "update", "x", "--timezone", "", "--priority", "1"), "argument --timezone: empty"),
    (("schedule", "list", "--cursor", ""), "argument --cursor: empty"),  # not the first page again
    (("dead", "list", "t", "--cursor", ""), "argument --cursor: empty"),
    (("schedule", "frobnicate"), "argument COMMAND: invalid choice"),
    (("schedule", "sync", "no_such_module_here"), "cannot import no_such_module_here"),
])
def test_bad_schedule_command_lines_are_usage_errors(run_cli, argv, problem):
    code, out, err = run_cli(*argv)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].startswith("delayqueue") and problem in err.splitlines()[-1], err


def test_schedule_sync_syncs_an_apps_scheduled_tasks(server, run_cli, tmp_path, monkeypatch):
    (tmp_path / "beats_app.py").write_text(
        "from delayqueue_client import App\n"
        "from delayqueue_client.testing import FakeServer\n"
        "app = App(FakeServer().client())  # replaced by the test\n"
        "@app.task(topic='beats', name='beats.hourly', schedule=3600)\n"
        "def hourly() -> None: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import beats_app  # type: ignore[import-not-found]
    beats_app.app._client = server.client()
    try:
        assert run_cli("schedule", "sync", "beats_app") == (0, "created task:beats.hourly\n", "")
        assert run_cli("schedule", "sync", "beats_app:app", "--json") == (0, '{"task:beats.hourly": "unchanged"}\n', "")
    finally:
        sys.modules.pop("beats_app", None)
    assert server.client().get_schedule("task:beats.hourly").every_ms == 3_600_000


def test_the_worker_command_takes_sync_schedules():
    parser = cli.build_parser()
    args = parser.parse_args(["worker", "myapp", "--sync-schedules"])
    assert args.sync_schedules is True
    assert parser.parse_args(["worker", "myapp"]).sync_schedules is False
