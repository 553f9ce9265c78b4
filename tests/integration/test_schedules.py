"""Schedules: the API, and the planner (workers/scheduler.py) that turns each tick into one
message, on a single Redis and on the Redis Cluster where the planner sends."""
import asyncio
import datetime as dt
import zoneinfo

import pytest
from asgiref.sync import sync_to_async
from redis.exceptions import RedisError

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import SCHEDULE_LEAD_MILLIS, SCHEDULE_MISSED_AFTER_MILLIS, Status
from delayqueue.core.exceptions import BadRequest, Conflict, NotFound
from delayqueue.core.schedules import PLAN_PERIOD_MILLIS, plan_time, tick_msg_id
from delayqueue.live.keys import Meta, Shard
from delayqueue.models import ScheduleGap
from delayqueue.services import schedules
from delayqueue.services.consume import ack_messages, pull_messages
from delayqueue.services.messages import delete_message, get_message
from delayqueue.services.restore import restore
from delayqueue.services.schedules import ScheduleSpec, create_schedule, update_schedule
from delayqueue.workers import scheduler as scheduler_module
from delayqueue.workers.loader import Loader
from delayqueue.workers.scheduler import Scheduler
from tests.helpers import REDIS_URL, call, drain_log, make_runtime, query

SECOND = 1000
# The first tick's distance from now: the tests' checks of ticks sent ahead (still waiting, still
# after a change's now) hold however slow a loaded machine makes the steps between.
LEEWAY = 5 * SECOND


@pytest.fixture
async def planner(rt):
    made = []

    def make() -> Scheduler:
        made.append(Scheduler(rt, f"test-{len(made)}"))
        return made[-1]

    yield make
    for scheduler in made:
        await scheduler.close()


async def every(rt, schedule_id="s", every_millis=SECOND, start=None, topic="t", **kw):
    return await create_schedule(rt, spec=ScheduleSpec(schedule_id=schedule_id, topic=topic, payload="tick",
                                                       every_millis=every_millis, start_time=start, **kw))


async def live_ticks(rt, topic="t") -> dict[str, int]:
    """msgId -> triggerTime of the topic's live messages in Redis."""
    k = rt.ns.topic(topic)
    waiting = await rt.redis.zrange(k.waiting, 0, -1, withscores=True)
    return {msg_id: int(score) for msg_id, score in waiting}


async def logged_ticks(topic="t") -> list[tuple[str, int]]:
    """(msgId, status) of every message the log holds for the topic, in msgId order."""
    return [tuple(row) for row in await query(
        "SELECT msg_id, status FROM delayqueue_message WHERE topic = %s ORDER BY msg_id", topic)]


# ---- the API ------------------------------------------------------------------------------------

async def test_a_schedule_is_created_read_listed_changed_paused_resumed_and_deleted_over_the_api(api):
    created = await call(api, "createSchedule", scheduleId="nightly", topic="reports", msg="{}",
                         cron="30 2 * * *", timezone="Europe/Berlin", catchUp="all", priority="3")
    assert created["code"] == 200, created
    s = created["schedule"]
    assert {k: s[k] for k in ("scheduleId", "topic", "msg", "cron", "timezone", "everyMillis", "catchUp", "priority",
                              "ttlMillis", "maxRetry", "paused", "startTime", "endTime")} == {
        "scheduleId": "nightly", "topic": "reports", "msg": "{}", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
        "everyMillis": None, "catchUp": "all", "priority": 3, "ttlMillis": 0, "maxRetry": -1, "paused": False,
        "startTime": None, "endTime": None}
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    fires = [dt.datetime.fromtimestamp(t / 1000, berlin) for t in s["nextFireTimes"]]
    assert len(fires) == 5 and all((f.hour, f.minute, f.second) == (2, 30, 0) for f in fires)
    assert [(b - a).days for a, b in zip(fires, fires[1:])] == [1, 1, 1, 1]

    interval = (await call(api, "createSchedule", scheduleId="pulse", topic="beats", msg="b", everyMillis="60000"))
    p = interval["schedule"]
    assert (p["cron"], p["timezone"], p["everyMillis"]) == (None, None, 60000)
    assert [b - a for a, b in zip(p["nextFireTimes"], p["nextFireTimes"][1:])] == [60000] * 4
    assert p["nextFireTimes"][0] == p["startTime"]  # one interval after its creation
    assert 0 < p["startTime"] - p["createTime"] <= 60000

    got = await call(api, "getSchedule", method="get", scheduleId="nightly")
    assert got["schedule"]["cron"] == "30 2 * * *"
    listed = await call(api, "listSchedules", method="get", limit="1")
    assert [x["scheduleId"] for x in listed["schedules"]] == ["nightly"] and listed["nextCursor"] == "nightly"
    rest = await call(api, "listSchedules", method="get", limit="1", cursor="nightly")
    assert [x["scheduleId"] for x in rest["schedules"]] == ["pulse"] and "nextCursor" not in rest
    only = await call(api, "listSchedules", method="get", topic="beats")
    assert [x["scheduleId"] for x in only["schedules"]] == ["pulse"]

    changed = await call(api, "updateSchedule", scheduleId="nightly", everyMillis="5000", msg="new")
    c = changed["schedule"]
    assert (c["cron"], c["everyMillis"], c["msg"], c["catchUp"]) == (None, 5000, "new", "all")
    paused = await call(api, "pauseSchedule", scheduleId="nightly")
    assert paused["schedule"]["paused"] is True and paused["schedule"]["nextFireTimes"] == []
    resumed = await call(api, "resumeSchedule", scheduleId="nightly")
    assert resumed["schedule"]["paused"] is False and len(resumed["schedule"]["nextFireTimes"]) == 5
    assert (await call(api, "deleteSchedule", scheduleId="nightly")) == {"code": 200, "msg": "success"}
    assert (await call(api, "getSchedule", method="get", scheduleId="nightly"))["code"] == 404


@pytest.mark.parametrize("params, problem", [
    ({"cron": "61 * * * *"}, "minute"),
    ({"cron": "* * * *"}, "5 fields"),
    ({"cron": "0 0 30 2 *"}, "never"),
    ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "time zone"),
    ({"cron": "0 * * * *", "everyMillis": "1000"}, "either cron or everyMillis"),
    ({}, "either cron or everyMillis"),
    ({"everyMillis": "999"}, "at least 1000"),
    ({"everyMillis": "0"}, "at least 1000"),  # not "at least 1", which is refused too
    ({"everyMillis": "1000", "startTime": "2000000000000", "endTime": "1900000000000"}, "endTime"),
    # No startTime given: the message says which one the endTime is before.
    ({"everyMillis": "60000", "endTime": "1000"}, "endTime must not be before the first tick, one interval from now"),
    # A window with no tick left: stored, it would never fire.
    ({"cron": "* * * * *", "endTime": "1000"}, "endTime must be in the future: the schedule would never fire"),
    ({"everyMillis": "60000", "startTime": "1000", "endTime": "2000"}, "endTime must be in the future"),
    ({"cron": "0 0 1 1 *", "startTime": "2000000000000", "endTime": "2000086400000"},
     "endTime must not be before the first tick after startTime: the schedule would never fire"),
    ({"everyMillis": "86400000", "startTime": "1000", "endTime": "4000000000000"}, None),  # a tick left: taken
    ({"everyMillis": "1000", "catchUp": "some"}, "catchUp"),
    ({"everyMillis": "1000", "scheduleId": "a@b"}, "scheduleId"),
    ({"everyMillis": "1000", "scheduleId": ""}, "scheduleId"),
    ({"everyMillis": "1000", "topic": ""}, "topic"),
    ({"everyMillis": "1000", "timezone": "Europe/Berlin"}, "timezone"),
    ({"everyMillis": "1000", "msg": "x" * (1_048_576 + 1)}, "over the limit"),
])
async def test_a_schedule_that_cannot_be_used_is_refused_with_a_message_naming_the_problem(api, params, problem):
    answer = await call(api, "createSchedule", **{"scheduleId": "x", "topic": "t", "msg": "m", **params})
    if problem is None:
        assert answer["code"] == 200, answer
        return
    assert answer["code"] == 400 and problem in answer["msg"], answer
    assert (await call(api, "listSchedules", method="get"))["schedules"] == []


async def test_an_update_that_leaves_no_tick_is_refused_and_one_of_an_ended_schedule_that_keeps_its_times_is_not(api):
    await call(api, "createSchedule", scheduleId="i", topic="t", msg="m", cron="* * * * *")
    answer = await call(api, "updateSchedule", scheduleId="i", endTime="1000")
    assert answer == {"code": 400, "msg": "endTime must be in the future: the schedule would never fire"}
    assert (await call(api, "getSchedule", method="get", scheduleId="i"))["schedule"]["endTime"] is None
    # One that has ended (its endTime passed since it was stored) is still paused and resumed.
    await query("UPDATE delayqueue_schedule SET end_time = 1000 WHERE schedule_id = 'i'")
    assert (await call(api, "pauseSchedule", scheduleId="i"))["schedule"]["paused"] is True
    assert (await call(api, "resumeSchedule", scheduleId="i"))["schedule"]["paused"] is False
    # Nor is an update that leaves its times as they are (an App's sync changing a task's message).
    assert (await call(api, "updateSchedule", scheduleId="i", msg="new", priority="3"))["schedule"]["msg"] == "new"
    answer = await call(api, "updateSchedule", scheduleId="i", cron="*/5 * * * *")
    assert answer == {"code": 400, "msg": "endTime must be in the future: the schedule would never fire"}


async def test_an_interval_schedule_refuses_a_time_zone_on_update_as_on_create(api):
    """Taken and dropped, it would read as done: the caller meant a cron schedule in that zone."""
    await call(api, "createSchedule", scheduleId="i", topic="t", msg="m", everyMillis="60000")
    answer = await call(api, "updateSchedule", scheduleId="i", timezone="Europe/Berlin")
    assert answer == {"code": 400, "msg": "timezone: is a cron schedule's: not with everyMillis"}
    changed = await call(api, "updateSchedule", scheduleId="i", cron="0 2 * * *", timezone="Europe/Berlin")
    assert (changed["schedule"]["cron"], changed["schedule"]["timezone"]) == ("0 2 * * *", "Europe/Berlin")
    # Back to an interval: the cron's zone goes with its cron, unasked.
    back = await call(api, "updateSchedule", scheduleId="i", everyMillis="60000")
    assert (back["schedule"]["everyMillis"], back["schedule"]["timezone"]) == (60000, None)


async def test_a_schedule_whose_rule_this_process_cannot_read_is_still_read_and_listed(api):
    for schedule_id in ("a", "b"):
        await call(api, "createSchedule", scheduleId=schedule_id, topic="t", msg="m", cron="0 2 * * *")
    # As if created and planned ahead where its time zone was known, and read where the tzdata lacks it.
    await query("UPDATE delayqueue_schedule SET timezone = 'Mars/Olympus', planned_until = planned_until + 60000"
                " WHERE schedule_id = 'a'")
    got = await call(api, "getSchedule", method="get", scheduleId="a")
    assert got["code"] == 200 and (got["schedule"]["timezone"], got["schedule"]["nextFireTimes"]) == (
        "Mars/Olympus", [])
    listed = await call(api, "listSchedules", method="get")
    assert [(s["scheduleId"], len(s["nextFireTimes"])) for s in listed["schedules"]] == [("a", 0), ("b", 5)]
    changed = await call(api, "updateSchedule", scheduleId="a", msg="new")
    assert changed["code"] == 400 and "Mars/Olympus" in changed["msg"]
    paused = await call(api, "pauseSchedule", scheduleId="a")
    assert paused["code"] == 400 and "Mars/Olympus" in paused["msg"]
    assert (await call(api, "updateSchedule", scheduleId="a", timezone="UTC"))["code"] == 200
    # One with ticks planned ahead is deleted all the same (they cannot be told apart without the rule).
    await query("UPDATE delayqueue_schedule SET timezone = 'Mars/Olympus', planned_until = planned_until + 60000"
                " WHERE schedule_id = 'b'")
    assert (await call(api, "deleteSchedule", scheduleId="b"))["code"] == 200
    assert (await call(api, "getSchedule", method="get", scheduleId="b"))["code"] == 404


async def test_a_second_schedule_under_one_id_is_refused_and_the_cap_holds(api, settings):
    assert (await call(api, "createSchedule", scheduleId="a", topic="t", msg="m", everyMillis="1000"))["code"] == 200
    again = await call(api, "createSchedule", scheduleId="a", topic="t", msg="other", everyMillis="2000")
    assert again["code"] == 409 and "exists" in again["msg"]
    from delayqueue.runtime import close_current
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_SCHEDULES": 2}
    await close_current()
    assert (await call(api, "createSchedule", scheduleId="b", topic="t", msg="m", everyMillis="1000"))["code"] == 200
    capped = await call(api, "createSchedule", scheduleId="c", topic="t", msg="m", everyMillis="1000")
    assert capped["code"] == 429 and "DELAYQUEUE_MAX_SCHEDULES" in capped["msg"], capped
    assert (await call(api, "getSchedule", method="get", scheduleId="c"))["code"] == 404
    # At the cap, a scheduleId that is taken is still a conflict: the other process made it (sync_schedules).
    taken = await call(api, "createSchedule", scheduleId="b", topic="t", msg="m", everyMillis="1000")
    assert taken["code"] == 409 and "exists" in taken["msg"], taken
    assert (await call(api, "updateSchedule", scheduleId="zzz", msg="m"))["code"] == 404
    assert (await call(api, "updateSchedule", scheduleId="a"))["code"] == 400  # nothing to change


# ---- the planner --------------------------------------------------------------------------------

async def test_the_planner_sends_each_tick_ahead_once_with_the_tick_as_its_trigger_time(rt, planner):
    start = now_millis() + 2 * SECOND
    row = await every(rt, start=start)
    p = planner()
    assert await p.plan_once() == 1
    ticks = await live_ticks(rt)
    expected = {tick_msg_id("s", t, 0): t for t in range(start, now_millis() + SCHEDULE_LEAD_MILLIS + 1, SECOND)}
    assert ticks.items() >= {k: v for k, v in expected.items() if v <= start + 7 * SECOND}.items()
    assert all(v == start + (v - start) // SECOND * SECOND for v in ticks.values())
    stored = await schedules.get_schedule(rt, schedule_id="s")
    assert stored.planned_until == max(ticks.values())
    # Planned again at its phase, while its next tick is still more than half the lead ahead.
    assert stored.plan_at == plan_time(stored, stored.planned_until)
    assert SCHEDULE_LEAD_MILLIS // 2 < stored.planned_until + SECOND - stored.plan_at <= SCHEDULE_LEAD_MILLIS
    assert await p.plan_once(now=stored.plan_at - 1) == 0  # nothing to plan before then
    assert await p.plan_once(now=stored.plan_at) == 1
    more = await live_ticks(rt)
    assert len(more) > len(ticks) and more.items() >= ticks.items()
    assert sorted(more.values()) == list(range(start, max(more.values()) + 1, SECOND))  # no gap, none twice
    message = await get_message(rt, topic="t", msg_id=tick_msg_id("s", start, 0))
    assert (message.payload, message.trigger_time, message.status) == ("tick", start, Status.WAITING)
    assert row.generation == stored.generation == 0  # planning keeps the generation: the msgIds stay


async def test_a_planner_killed_after_sending_before_committing_leaves_each_tick_one_message(rt, planner, monkeypatch):
    await every(rt, start=now_millis() + LEEWAY)
    real = scheduler_module.send_messages

    async def sent_then_killed(rt_, *, requests, **options):
        await real(rt_, requests=requests, **options)
        raise asyncio.CancelledError  # as if the process died: the transaction never commits

    monkeypatch.setattr(scheduler_module, "send_messages", sent_then_killed)
    now = now_millis()  # both rounds at one moment, so the second plans no further than the first
    with pytest.raises(asyncio.CancelledError):
        await planner().plan_once(now=now)
    first = await live_ticks(rt)
    assert first and (await schedules.get_schedule(rt, schedule_id="s")).planned_until < min(first.values())
    monkeypatch.setattr(scheduler_module, "send_messages", real)
    assert await planner().plan_once(now=now) == 1  # another scanner: the row lock went with the dead transaction
    assert await live_ticks(rt) == first  # the same ticks: duplicates, nothing new
    await drain_log(rt, ["t"])
    assert [status for _, status in await logged_ticks()] == [Status.WAITING] * len(first)


@pytest.mark.parametrize("change", ["update", "pause", "delete"])
async def test_a_change_after_a_planner_died_before_committing_deletes_the_ticks_that_round_sent(rt, planner,
                                                                                                monkeypatch, change):
    """The dead round's ticks lie past the row's planned_until; a change withdraws them all the same."""
    await every(rt, start=now_millis() + LEEWAY)
    real = scheduler_module.send_messages

    async def sent_then_killed(rt_, *, requests, **options):
        await real(rt_, requests=requests, **options)
        raise asyncio.CancelledError

    monkeypatch.setattr(scheduler_module, "send_messages", sent_then_killed)
    with pytest.raises(asyncio.CancelledError):
        await planner().plan_once()
    orphans = await live_ticks(rt)
    assert orphans
    await CHANGES[change](rt)
    assert set(await live_ticks(rt)).isdisjoint(orphans)  # none of them fires for a schedule changed or gone


@pytest.mark.parametrize("policy, fired", [("all", 5), ("latest", 1), ("skip", 0)])
async def test_ticks_missed_while_no_scanner_ran_follow_the_catch_up_policy(rt, planner, policy, fired):
    """Planned at t0, then no planner until five ticks past the lead went missing."""
    t0 = now_millis()
    await every(rt, start=t0 + SECOND, every_millis=2 * SECOND, catch_up=policy)
    p = planner()
    await p.plan_once(now=t0)
    planned = await live_ticks(rt)
    last_planned = max(planned.values())
    later = last_planned + 5 * 2 * SECOND + SCHEDULE_MISSED_AFTER_MILLIS  # five more ticks are past the cutoff
    await p.plan_once(now=later)
    missed = [last_planned + i * 2 * SECOND for i in range(1, 6)]
    sent = {t for t in (await live_ticks(rt)).values() if t > last_planned}
    kept = {"all": set(missed), "latest": {missed[-1]}, "skip": set()}[policy]
    assert sent & set(missed) == kept and len(kept) == fired
    assert min(sent - set(missed)) == missed[-1] + 2 * SECOND  # and on from there, none skipped after
    [gap] = await sync_to_async(list)(ScheduleGap.objects.values_list("first_tick", "last_tick", "missed", "fired",
                                                                      "policy"))
    assert gap == (missed[0], missed[-1], 5, fired, policy)
    await schedules.delete_schedule(rt, schedule_id="s")  # and its gaps with it
    assert await sync_to_async(ScheduleGap.objects.count)() == 0


CHANGES = {
    "update": lambda rt: update_schedule(rt, schedule_id="s", changes={"payload": "v2"}),
    "pause": lambda rt: schedules.pause_schedule(rt, schedule_id="s"),
    "delete": lambda rt: schedules.delete_schedule(rt, schedule_id="s"),
}


async def test_a_round_sends_its_calls_overlapped_through_one_redis_turn_and_each_tick_once(rt, planner,
                                                                                           monkeypatch):
    for n in range(4):
        await every(rt, schedule_id=f"s{n}", start=now_millis() + LEEWAY)
    monkeypatch.setattr(scheduler_module, "SEND_CHUNK", 2)  # many calls in one round
    real, in_flight, most, turns = scheduler_module.send_messages, 0, 0, set()

    async def counted(rt_, *, requests, **options):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        turns.add(id(options["redis_turn"]))
        try:
            return await real(rt_, requests=requests, **options)
        finally:
            in_flight -= 1

    monkeypatch.setattr(scheduler_module, "send_messages", counted)
    assert await planner().plan_once() == 4
    assert most == scheduler_module.SENDS_IN_FLIGHT and len(turns) == 1
    ticks = await live_ticks(rt)
    assert len(ticks) >= 4 * 5
    assert sorted(await logged_ticks()) == [(msg_id, Status.WAITING) for msg_id in sorted(ticks)]


async def test_a_round_whose_call_fails_starts_no_more_calls_and_plans_nothing(rt, planner, monkeypatch):
    for n in range(4):
        await every(rt, schedule_id=f"s{n}", start=now_millis() + LEEWAY)
    monkeypatch.setattr(scheduler_module, "SEND_CHUNK", 2)  # ten calls or more in the round
    real, started, all_in = scheduler_module.send_messages, 0, asyncio.Event()

    async def first_fails(rt_, *, requests, **options):
        nonlocal started
        started += 1
        if started == scheduler_module.SENDS_IN_FLIGHT:
            all_in.set()
        if started == 1:
            await all_in.wait()  # fails with the others in flight and the next waiting for its room
            raise RedisError("down for the test")
        await asyncio.sleep(0.05)  # the calls in flight beside it are cancelled here
        return await real(rt_, requests=requests, **options)

    monkeypatch.setattr(scheduler_module, "send_messages", first_fails)
    with pytest.raises(RedisError):
        await planner().plan_once()
    await asyncio.sleep(0.3)  # what was left running would have sent by now
    assert started == scheduler_module.SENDS_IN_FLIGHT
    assert await live_ticks(rt) == {} and await logged_ticks() == []
    monkeypatch.setattr(scheduler_module, "send_messages", real)
    assert await planner().plan_once() == 4  # the round committed nothing: every schedule is due again
    ticks = await live_ticks(rt)
    assert sorted(await logged_ticks()) == [(msg_id, Status.WAITING) for msg_id in sorted(ticks)]


async def held_round(planner, monkeypatch) -> tuple[asyncio.Task, asyncio.Event]:
    """A planning round that holds the rows it claimed, stopped before its sends until the event is set."""
    real = scheduler_module.send_messages
    sending, release = asyncio.Event(), asyncio.Event()

    async def slow(rt_, *, requests, **options):
        sending.set()
        await release.wait()
        return await real(rt_, requests=requests, **options)

    monkeypatch.setattr(scheduler_module, "send_messages", slow)
    round_ = asyncio.create_task(planner().plan_once())
    await sending.wait()
    return round_, release


@pytest.mark.parametrize("change", CHANGES)
async def test_a_change_waits_for_the_planning_round_then_replaces_the_ticks_sent_ahead(rt, planner, monkeypatch,
                                                                                       change):
    await every(rt, start=now_millis() + LEEWAY)
    round_, release = await held_round(planner, monkeypatch)
    changing = asyncio.create_task(CHANGES[change](rt))
    await asyncio.sleep(0.3)
    assert not changing.done()  # the planner holds the row
    release.set()
    await round_
    await changing
    assert await live_ticks(rt) == {}  # every tick that round sent ahead was deleted
    monkeypatch.undo()
    await planner().plan_once()
    new = await live_ticks(rt)
    if change != "update":
        assert new == {}  # paused or gone: nothing planned
        return
    row = await schedules.get_schedule(rt, schedule_id="s")
    assert row.generation == 1 and row.payload == "v2"
    assert new and all(k.endswith("#1") for k in new)
    assert len(set(new.values())) == len(new)
    assert (await get_message(rt, topic="t", msg_id=next(iter(new)))).payload == "v2"


async def test_reads_are_answered_while_a_change_waits_for_the_planning_round(rt, planner, monkeypatch):
    """A change waits for the round that holds its schedule's row, up to the log's timeout; the
    process' reads of schedules do not wait behind it."""
    await every(rt, start=now_millis() + LEEWAY)
    round_, release = await held_round(planner, monkeypatch)
    pausing = asyncio.create_task(schedules.pause_schedule(rt, schedule_id="s"))
    try:
        await asyncio.sleep(0.3)
        assert not pausing.done()  # the planner holds the row
        read = await asyncio.wait_for(schedules.get_schedule(rt, schedule_id="s"), 5)
        listed, _ = await asyncio.wait_for(schedules.list_schedules(rt, limit=10), 5)
        assert not read.paused and [row.schedule_id for row in listed] == ["s"]
        assert not pausing.done()
    finally:
        release.set()
        await round_
        await pausing
    assert (await schedules.get_schedule(rt, schedule_id="s")).paused


async def test_an_update_after_one_tick_sent_ahead_was_deleted_keeps_every_other_tick_once(rt, planner):
    """An occurrence cancelled by hand (deleteMsg) stays cancelled; the ticks before it are not lost."""
    await every(rt, start=now_millis() + LEEWAY)
    await planner().plan_once()
    sent = await live_ticks(rt)
    assert len(sent) >= 4
    cancelled_id, cancelled = sorted(sent.items(), key=lambda item: item[1])[3]
    assert await delete_message(rt, topic="t", msg_id=cancelled_id)
    await update_schedule(rt, schedule_id="s", changes={"payload": "v2"})
    await planner().plan_once(now=now_millis() + PLAN_PERIOD_MILLIS)  # its next round, wherever its phase falls
    fired = sorted((await live_ticks(rt)).values())
    assert cancelled not in fired and len(fired) == len(set(fired))  # none twice
    assert set(sent.values()) - {cancelled} <= set(fired)  # and none lost
    # A later change finds every tick sent ahead, those before the cancelled one too, and keeps it cancelled.
    await update_schedule(rt, schedule_id="s", changes={"payload": "v3"})
    await planner().plan_once(now=now_millis() + PLAN_PERIOD_MILLIS)
    fired = sorted((await live_ticks(rt)).values())
    assert cancelled not in fired and len(fired) == len(set(fired))
    assert set(sent.values()) - {cancelled} <= set(fired)
    await schedules.pause_schedule(rt, schedule_id="s")
    assert await live_ticks(rt) == {}


async def test_a_paused_schedule_sends_nothing_and_resumes_with_new_ticks(rt, planner):
    await every(rt, start=now_millis() + LEEWAY)
    p = planner()
    await p.plan_once()
    assert await live_ticks(rt)
    paused = await schedules.pause_schedule(rt, schedule_id="s")
    assert paused.paused and paused.plan_at is None and await live_ticks(rt) == {}
    assert await p.plan_once(now=now_millis() + 60 * SECOND) == 0
    resumed = await schedules.resume_schedule(rt, schedule_id="s")
    assert resumed.plan_at is not None and resumed.planned_until >= paused.updated_at
    await p.plan_once()
    ticks = await live_ticks(rt)
    assert resumed.generation > paused.generation > 0
    assert ticks and all(k.endswith(f"#{resumed.generation}") and v > resumed.updated_at for k, v in ticks.items())


async def test_deleting_a_schedule_deletes_the_ticks_it_sent_ahead(rt, planner):
    await every(rt, start=now_millis() + LEEWAY)
    await planner().plan_once()
    assert await live_ticks(rt)
    await schedules.delete_schedule(rt, schedule_id="s")
    assert await live_ticks(rt) == {}
    with pytest.raises(NotFound):
        await schedules.get_schedule(rt, schedule_id="s")
    assert await planner().plan_once(now=now_millis() + 60 * SECOND) == 0


@pytest.mark.parametrize("changed_before", [False, True])
async def test_a_schedule_created_again_under_a_deleted_ones_id_fires_at_the_times_the_delete_withdrew(
        rt, planner, changed_before):
    """The deleted schedule's ticks sent ahead stay, deleted, under their msgIds, which msgId
    dedupe would answer for the new schedule's ticks of the same times and generation: also
    for a change of the new one, when the old one had been changed."""
    start = now_millis() + LEEWAY
    await every(rt, start=start)
    if changed_before:
        await update_schedule(rt, schedule_id="s", changes={"payload": "v2"})
    await planner().plan_once()
    withdrawn = await live_ticks(rt)
    await schedules.delete_schedule(rt, schedule_id="s")
    await every(rt, start=start)
    if changed_before:
        await update_schedule(rt, schedule_id="s", changes={"payload": "v3"})
    await planner().plan_once()
    ticks = await live_ticks(rt)
    assert withdrawn and set(ticks.values()) >= set(withdrawn.values())
    assert not set(ticks) & set(withdrawn)  # new msgIds: the withdrawn ticks stay deleted
    assert {(await get_message(rt, topic="t", msg_id=m)).status for m in withdrawn} == {Status.DELETED}


async def test_a_restore_after_redis_lost_its_data_brings_the_ticks_back_and_none_twice(rt, planner):
    await every(rt, start=now_millis() + LEEWAY)
    p = planner()
    await p.plan_once()
    before = await live_ticks(rt)
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    await restore(rt)
    assert await live_ticks(rt) == before
    stored = await schedules.get_schedule(rt, schedule_id="s")
    await p.plan_once(now=stored.plan_at)
    after = await live_ticks(rt)
    assert after.items() >= before.items() and len(set(after.values())) == len(after)


@pytest.mark.parametrize("raised", [False, True])
@pytest.mark.parametrize("change", CHANGES)
async def test_a_change_made_after_redis_lost_its_data_is_not_undone_by_the_restore(rt, planner, change, raised):
    """The change finds none of the ticks sent ahead in Redis; the log still holds them waiting,
    and the restore must not bring back ticks of a plan the change ended. `raised`: a scanner's
    loader gave the topic a new window meanwhile, which reads the ticks' rows as neither cold nor Redis'."""
    await every(rt, start=now_millis() + LEEWAY)
    await planner().plan_once()
    before = await live_ticks(rt)
    assert before
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    if raised:
        loader = Loader(rt, lambda: [Shard("t")])
        await loader.load_topic("t", force=True)
        await loader.close()
        assert await rt.redis.hget(rt.ns.topic("t").meta, Meta.LOADED_TO)
    await CHANGES[change](rt)
    await restore(rt)
    assert set(await live_ticks(rt)).isdisjoint(before)  # none of the old plan's ticks fires
    assert {status for msg_id, status in await logged_ticks() if msg_id in before} == {Status.DELETED}


async def test_a_refused_tick_is_sent_again_later_and_the_plan_does_not_pass_it(rt, planner, monkeypatch):
    created = await every(rt, start=now_millis() + LEEWAY)
    real = scheduler_module.send_messages

    async def refused(rt_, *, requests, **options):
        return [BadRequest("refused for the test")] * len(requests)

    monkeypatch.setattr(scheduler_module, "send_messages", refused)
    p = planner()
    await p.plan_once()
    row = await schedules.get_schedule(rt, schedule_id="s")
    assert row.planned_until == created.planned_until == created.start_time - 1 and await live_ticks(rt) == {}
    monkeypatch.setattr(scheduler_module, "send_messages", real)
    assert await p.plan_once(now=row.plan_at) == 1
    assert min((await live_ticks(rt)).values()) == row.start_time


async def test_a_schedule_whose_rule_the_planner_cannot_read_holds_up_no_other(rt, planner):
    await every(rt, schedule_id="good", start=now_millis() + LEEWAY)
    await every(rt, schedule_id="bad", start=now_millis() + LEEWAY)
    # As if created where its time zone was known and planned where the tzdata lacks it.
    await query("UPDATE delayqueue_schedule SET cron = '* * * * *', every_millis = NULL, timezone = 'Mars/Olympus' "
                "WHERE schedule_id = 'bad'")
    before = await schedules.get_schedule(rt, schedule_id="bad")
    now = now_millis()
    assert await planner().plan_once(now=now) == 2
    assert (await live_ticks(rt)) and all(msg_id.startswith("good@") for msg_id in await live_ticks(rt))
    after = await schedules.get_schedule(rt, schedule_id="bad")
    assert (after.planned_until, after.plan_at) == (before.planned_until, now + scheduler_module.RETRY_MILLIS)


async def test_a_cron_schedule_over_a_daylight_saving_change_fires_each_wall_time_once(rt, planner):
    """America/New_York sprang forward on 2026-03-08 at 02:00 (to 03:00) and fell back on
    2026-11-01 at 02:00 (to 01:00): planned in virtual time across both."""
    ny = zoneinfo.ZoneInfo("America/New_York")
    for day, expected in [
        # 02:30 did not exist: it fired at 03:30 EDT, once with the real 03:30.
        (dt.date(2026, 3, 8), [("01:30", "06:30"), ("03:30", "07:30"), ("04:30", "08:30")]),
        # 01:30 happened twice: it fired at the first (EDT) only.
        (dt.date(2026, 11, 1), [("01:30", "05:30"), ("02:30", "07:30"), ("03:30", "08:30")]),
    ]:
        midnight = int(dt.datetime(day.year, day.month, day.day, tzinfo=ny).timestamp() * 1000)
        topic = f"dst{day.month}"
        await create_schedule(rt, spec=ScheduleSpec(schedule_id=topic, topic=topic, payload="x", cron="30 1-4 * * *",
                                                    timezone="America/New_York", start_time=midnight))
        # As if created at that midnight: planned from there.
        await query("UPDATE delayqueue_schedule SET planned_until = %s, plan_at = %s WHERE schedule_id = %s",
                    midnight - 1, midnight - SCHEDULE_LEAD_MILLIS, topic)
        p = planner()
        now = midnight
        while now < midnight + 5 * 3600 * SECOND:
            await p.plan_once(now=now)
            now = (await schedules.get_schedule(rt, schedule_id=topic)).plan_at
        # Sent in the past, the ticks are due at once: their msgIds name them.
        ticks = sorted(int(msg_id.split("@")[1]) for msg_id in await rt.redis.hkeys(rt.ns.topic(topic).msgs))
        assert len(set(ticks)) == len(ticks)
        fired = [(dt.datetime.fromtimestamp(t / 1000, ny).strftime("%H:%M"),
                  dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc).strftime("%H:%M")) for t in ticks[:3]]
        assert fired == expected, day


@pytest.mark.process
@pytest.mark.fault
def test_a_one_second_schedule_fires_every_tick_once_for_a_minute_through_a_scanner_killed(scanner_process):
    """Two real run_scanners processes plan a 1 s schedule for a minute; one is killed (SIGKILL)
    halfway. Every one of the 60 ticks is delivered once, none before its time."""
    first, second = scanner_process("plan-a"), scanner_process("plan-b")
    first.wait_started()
    second.wait_started()

    async def run():
        rt = make_runtime(REDIS_URL)
        try:
            start = now_millis() + 2 * SECOND
            await every(rt, start=start, end_time=start + 59 * SECOND, topic="minute")
            expected = {tick_msg_id("s", start + i * SECOND, 0): start + i * SECOND for i in range(60)}
            delivered, early, killed = [], [], False
            while len(set(delivered)) < len(expected) and now_millis() < start + 90 * SECOND:
                pulled, _ = await pull_messages(rt, topic="minute", batch=100)
                now = now_millis()
                for m in pulled:
                    delivered.append(m.msg_id)
                    # A tick the planner sent late (a loaded machine) is due when sent: late, never early.
                    if now < expected.get(m.msg_id, 0) or m.trigger_time < expected.get(m.msg_id, 0):
                        early.append((m.msg_id, m.trigger_time, now))
                if pulled:
                    await ack_messages(rt, topic="minute", msg_ids=[m.msg_id for m in pulled])
                if not killed and now > start + 30 * SECOND:
                    first.kill()
                    killed = True
                await asyncio.sleep(0.02)
            assert killed and early == []
            assert sorted(delivered) == sorted(expected)  # each tick once, no other message
        finally:
            await rt.close()

    asyncio.run(run())
