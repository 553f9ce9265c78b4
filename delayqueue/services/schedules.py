"""Schedules: created, read, changed, paused, resumed and deleted (PostgreSQL holds them; the
scanners' planner, workers/scheduler.py, sends their ticks).

A change takes the schedule's row lock, which the planner holds while it sends the schedule's
ticks, so the two never interleave. A change that ends the current plan (any update, a pause, a
delete) first deletes the ticks already sent ahead and not yet due, then commits the new row
under a new generation (new tick msgIds) planned from now. Killed between the two, the row is
unchanged with those ticks gone (and those _send_past_ended was sending under the new plan sent):
the caller's call failed, and calling again completes it."""
import dataclasses
from dataclasses import dataclass

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import SCHEDULE_LEAD_MILLIS, SCHEDULE_MAX_TICKS_PER_ROUND, CatchUp, Status
from delayqueue.core.exceptions import BadRequest, CapReached, Conflict, NotFound
from delayqueue.core.messages import Message
from delayqueue.core.schedule_rules import CronRule, RuleError
from delayqueue.core.schedules import (INTERVAL_ZONE, NOT_AN_INTERVAL_SETTING, ScheduleRow, plan_time, rule_of,
                                       run_now_msg_id, tick_msg_id)
from delayqueue.messagelog import sql
from delayqueue.runtime import Runtime
from delayqueue.services.messages import delete_message, get_message
from delayqueue.services.send import SendRequest, send_message, send_messages

# The fields a caller sets (updateSchedule changes any of them); the others are the planner's.
SETTABLE = ("topic", "payload", "cron", "timezone", "every_millis", "start_time", "end_time", "catch_up", "priority",
            "ttl_millis", "max_retry", "paused")
TIMING = {"cron", "timezone", "every_millis", "start_time", "end_time"}  # the fields that say when it fires


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as its creator gives it: `cron` (with `timezone`) or `every_millis`."""

    schedule_id: str
    topic: str
    payload: str
    cron: str = ""
    timezone: str = "UTC"
    every_millis: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    catch_up: str = CatchUp.LATEST
    priority: int = 0
    ttl_millis: int = 0  # 0: the topic's default
    max_retry: int = -1  # below 0: the topic's default
    paused: bool = False


async def create_schedule(rt: Runtime, *, spec: ScheduleSpec) -> ScheduleRow:
    """Stores a new schedule; its first ticks are sent by the planner within a second. Conflict
    (409) when the namespace has one under that scheduleId; CapReached (429) beyond
    DELAYQUEUE_MAX_SCHEDULES; BadRequest naming the problem for a rule that cannot be used."""
    now = now_millis()
    fields = _checked(rt, {name: getattr(spec, name) for name in SETTABLE}, now, must_fire=True)
    planned_until = _plan_from(fields, now)
    draft = ScheduleRow(id=0, namespace=rt.ns.namespace, schedule_id=spec.schedule_id, generation=0,
                        planned_until=planned_until, plan_at=None, created_at=now, updated_at=now, **fields)
    async with rt.schedule_db.use() as conn, conn.transaction():
        params = {"namespace": rt.ns.namespace}
        await conn.execute(sql.LOCK_SCHEDULE_CREATION, params)
        draft = dataclasses.replace(draft, generation=await _free_generation(rt, conn, draft, now))
        found = await conn.execute(sql.INSERT_SCHEDULE, {
            **dataclasses.asdict(draft), "plan_at": plan_time(draft, planned_until), "now": now})
        row = await found.fetchone()
        if row is None:  # a taken scheduleId is a conflict even at the cap: the caller may compare with it
            raise Conflict(f"schedule {spec.schedule_id!r} exists: updateSchedule changes it")
        count = (await (await conn.execute(sql.SCHEDULE_COUNT, params)).fetchone())[0] - 1
        if count >= rt.config.max_schedules:  # raised in the transaction: the insert is rolled back
            raise CapReached(f"namespace {rt.ns.namespace!r} has {count} schedules", setting="DELAYQUEUE_MAX_SCHEDULES",
                             cap=rt.config.max_schedules)
    return ScheduleRow(*row)


async def get_schedule(rt: Runtime, *, schedule_id: str) -> ScheduleRow:
    """The schedule; NotFound (404) if the namespace has none under that scheduleId."""
    async with rt.schedule_reads.use() as conn:
        found = await conn.execute(sql.GET_SCHEDULE, {"namespace": rt.ns.namespace, "schedule_id": schedule_id})
        row = await found.fetchone()
    if row is None:
        raise _missing(schedule_id)
    return ScheduleRow(*row)


async def list_schedules(rt: Runtime, *, topic: str | None = None, limit: int,
                         cursor: str | None = None) -> tuple[list[ScheduleRow], str | None]:
    """A page of the namespace's schedules (of one topic if given) in scheduleId order after
    `cursor`, and the cursor of the next page (None on the last)."""
    async with rt.schedule_reads.use() as conn:
        found = await conn.execute(sql.LIST_SCHEDULES, {"namespace": rt.ns.namespace, "topic": topic,
                                                        "after": cursor or "", "limit": limit + 1})
        rows = [ScheduleRow(*row) for row in await found.fetchall()]
    return rows[:limit], rows[limit - 1].schedule_id if len(rows) > limit else None


async def update_schedule(rt: Runtime, *, schedule_id: str, changes: dict) -> ScheduleRow:
    """Changes the fields given (SETTABLE's names); the ticks already sent ahead and not yet due
    are deleted and the schedule is planned anew from now under the new rule. Giving `cron`
    makes it a cron schedule, `every_millis` an interval one (first tick one interval from now
    unless `start_time` is given)."""
    unknown = set(changes) - set(SETTABLE)
    if unknown:
        raise ValueError(f"not settable: {sorted(unknown)}")
    # Only a change of when it fires is refused for leaving no tick: one of an ended schedule's
    # message or settings (an App's sync of its tasks) is not.
    return await _change(rt, schedule_id, lambda row: _updated(row, changes),
                         must_fire=bool(changes.keys() & TIMING))


async def pause_schedule(rt: Runtime, *, schedule_id: str) -> ScheduleRow:
    """No tick fires until resume_schedule: those already sent ahead are deleted."""
    return await _change(rt, schedule_id, lambda row: {**_settable(row), "paused": True})


async def resume_schedule(rt: Runtime, *, schedule_id: str) -> ScheduleRow:
    """Ticks fire again from now; those that fell while paused are not caught up."""
    return await _change(rt, schedule_id, lambda row: {**_settable(row), "paused": False})


async def delete_schedule(rt: Runtime, *, schedule_id: str) -> None:
    """Deletes the schedule and the ticks it sent ahead that are not yet due (those of a rule this
    process cannot read, a time zone its tzdata lacks, cannot be found: they fire, a lead at most)."""
    async with rt.schedule_db.use() as conn, conn.transaction():
        row = await _locked(conn, rt, schedule_id)
        await _withdraw(rt, row, now_millis())
        await conn.execute(sql.DELETE_SCHEDULE, {"id": row.id})


async def run_schedule_now(rt: Runtime, *, schedule_id: str) -> Message:
    """Sends the schedule's message once, now, apart from its ticks (the admin's "run now")."""
    row = await get_schedule(rt, schedule_id=schedule_id)
    now = now_millis()
    return await send_message(rt, request=SendRequest(
        topic=row.topic, msg=row.payload, delay_millis=0, msg_id=run_now_msg_id(row.schedule_id, now),
        ttl_millis=row.ttl_millis, max_retry=row.max_retry, priority=row.priority))


def _missing(schedule_id: str) -> NotFound:
    return NotFound(f"no schedule {schedule_id!r}")


async def _locked(conn, rt: Runtime, schedule_id: str) -> ScheduleRow:
    found = await conn.execute(sql.LOCK_SCHEDULE, {"namespace": rt.ns.namespace, "schedule_id": schedule_id})
    row = await found.fetchone()
    if row is None:
        raise _missing(schedule_id)
    return ScheduleRow(*row)


def _settable(row: ScheduleRow) -> dict:
    return {name: getattr(row, name) for name in SETTABLE}


def _updated(row: ScheduleRow, changes: dict) -> dict:
    fields = {**_settable(row), **changes}
    if changes.get("cron"):
        fields["every_millis"] = None
    elif changes.get("every_millis") is not None:
        fields["cron"] = ""
    if not fields["cron"] and changes.get("timezone", INTERVAL_ZONE) != INTERVAL_ZONE:
        raise BadRequest(f"timezone: {NOT_AN_INTERVAL_SETTING}")  # dropped, it would seem to be in force
    if bool(fields["cron"]) != bool(row.cron) and "start_time" not in changes:
        fields["start_time"] = None  # a cron schedule's earliest tick is not an interval's anchor, nor the reverse
    return fields


async def _change(rt: Runtime, schedule_id: str, change, *, must_fire: bool = False) -> ScheduleRow:
    """Under the row lock: the new fields from change(row), checked (`must_fire`: see _checked);
    the current plan's ticks not yet due deleted; the row written under the next generation,
    planned from now."""
    async with rt.schedule_db.use() as conn, conn.transaction():
        row = await _locked(conn, rt, schedule_id)
        now = now_millis()
        fields = _checked(rt, change(row), now, must_fire=must_fire)
        ended = {} if row.paused else await _withdraw(rt, row, now)  # nothing is planned while paused
        start = _plan_from(fields, now)
        new = dataclasses.replace(row, **fields, generation=row.generation + 1, planned_until=start)
        if not new.paused:  # a paused one is checked when resumed
            new = dataclasses.replace(new, generation=await _free_generation(rt, conn, new, now))
            if ended:  # the planner goes on after the latest of them, which _send_past_ended sends up to
                new = dataclasses.replace(new, planned_until=max(start, max(ended)))
        found = await conn.execute(sql.UPDATE_SCHEDULE, {
            **dataclasses.asdict(new), "plan_at": plan_time(new, new.planned_until), "now": now})
        updated = ScheduleRow(*await found.fetchone())
        if ended and not new.paused:  # last before the commit: a failed write sends nothing
            await _send_past_ended(rt, updated, start, ended)
        return updated


async def _free_generation(rt: Runtime, conn, row: ScheduleRow, now: int) -> int:
    """row.generation, or the first after it whose msgIds of the row's first ticks no message of
    the topic holds. A schedule deleted moments before under the same scheduleId left its ticks
    sent ahead as deleted messages under those msgIds, and msgId dedupe would answer the new
    ticks with them: none would fire. Twice the lead: room for the clocks of other processes."""
    ticks = row.ticks(row.planned_until, now + 2 * SCHEDULE_LEAD_MILLIS, SCHEDULE_MAX_TICKS_PER_ROUND)
    generation = row.generation
    while ticks:
        msg_ids = [tick_msg_id(row.schedule_id, tick, generation) for tick in ticks]
        if rt.config.message_log:  # the log holds every message Redis does, and the ended ones longer
            found = await conn.execute(sql.TICKS_TAKEN, {"msg_ids": msg_ids, "topic": row.topic,
                                                         "namespace": rt.ns.namespace})
            taken = await found.fetchone() is not None
        else:
            taken = any([await get_message(rt, topic=row.topic, msg_id=msg_id) is not None for msg_id in msg_ids])
        if not taken:
            break
        generation += 1
    return generation


async def _withdraw(rt: Runtime, row: ScheduleRow, now: int) -> dict[int, Status]:
    """Deletes the ticks sent ahead (after now), the latest first: up to planned_until, and past it
    those a round that died before committing (or stopped at a refused tick) sent, a lead past its
    own clock at most (twice the lead: room for the clocks of other processes). Answers the status
    of each that could not be deleted (delivered, or ended by hand) by its time: a new plan must not
    send it again. Those of a rule this process cannot read (a time zone its tzdata lacks) cannot be
    found: they fire."""
    try:
        ticks = row.ticks(now, max(row.planned_until, now + 2 * SCHEDULE_LEAD_MILLIS), SCHEDULE_MAX_TICKS_PER_ROUND)
    except RuleError:
        return {}
    ended = {}
    for tick in reversed(ticks):
        msg_id = row.msg_id(tick)
        if await delete_message(rt, topic=row.topic, msg_id=msg_id):
            continue
        if (message := await get_message(rt, topic=row.topic, msg_id=msg_id)) is not None:
            ended[tick] = message.status
    return ended


async def _send_past_ended(rt: Runtime, row: ScheduleRow, start: int, ended: dict[int, Status]) -> None:
    """Sends the new plan's ticks after `start` up to the latest `ended` one (the old plan's ticks
    that could not be withdrawn), none at the time of one delivered. One at the time of one ended by
    hand is sent and deleted at once: a later change finds it cancelled as this one did. A send
    refused fails the change, as one that died after its deletes."""
    ticks = [tick for tick in row.ticks(start, max(ended), SCHEDULE_MAX_TICKS_PER_ROUND)
             if ended.get(tick, Status.DELETED) == Status.DELETED]
    for tick, outcome in zip(ticks, await send_messages(rt, requests=[tick_request(row, tick) for tick in ticks])):
        if isinstance(outcome, Exception):
            raise outcome
        if tick in ended:
            await delete_message(rt, topic=row.topic, msg_id=row.msg_id(tick))


def tick_request(row: ScheduleRow, tick: int) -> SendRequest:
    """The send of a tick's message: the tick as its triggerTime, under its msgId."""
    return SendRequest(topic=row.topic, msg=row.payload, msg_id=row.msg_id(tick), ttl_millis=row.ttl_millis,
                       max_retry=row.max_retry, trigger_time=tick, priority=row.priority)


def _plan_from(fields: dict, now: int) -> int:
    """Where planning starts: after now, or just before the start time."""
    start = fields["start_time"]
    return now if start is None else max(now, start - 1)


def _checked(rt: Runtime, fields: dict, now: int, *, must_fire: bool) -> dict:
    """The fields with a rule that can be used (BadRequest naming the problem otherwise); an
    interval schedule without a start first fires one interval from now. `must_fire` (a create,
    an update of its times; not a pause or resume of one that has ended): BadRequest also when no tick is left
    after now between its start and end, as such a schedule would be stored and never fire."""
    cron, every = fields["cron"], fields["every_millis"]
    if bool(cron) == (every is not None):
        raise BadRequest("give either cron or everyMillis")
    if every is not None:
        if every < rt.config.schedule_min_interval_millis:
            raise BadRequest(f"everyMillis must be at least {rt.config.schedule_min_interval_millis} "
                             "(DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS)")
        if fields["start_time"] is None:
            if fields["end_time"] is not None and fields["end_time"] < now + every:  # the caller gave no startTime
                raise BadRequest("endTime must not be before the first tick, one interval from now (or give startTime)")
            fields = {**fields, "start_time": now + every}
        fields = {**fields, "timezone": INTERVAL_ZONE}
    else:
        try:
            CronRule.parse(cron, fields["timezone"])
        except RuleError as exc:
            raise BadRequest(str(exc)) from None
    start, end = fields["start_time"], fields["end_time"]
    if end is not None and start is not None and end < start:
        raise BadRequest("endTime must not be before startTime")
    if fields["catch_up"] not in CatchUp.values:
        raise BadRequest(f"catchUp must be one of {', '.join(CatchUp.values)}")
    if must_fire:
        _check_fires(fields, now)
    return fields


def _check_fires(fields: dict, now: int) -> None:
    """BadRequest when the checked fields leave no tick after now by endTime (planning starts at now)."""
    start, end = fields["start_time"], fields["end_time"]
    if end is None:
        return  # a rule that can be used fires at last
    if end <= now:
        raise BadRequest("endTime must be in the future: the schedule would never fire")
    after = now if start is None else max(now, start - 1)
    if not rule_of(fields["cron"], fields["timezone"], fields["every_millis"], start).ticks(after, end, 1):
        bound = "startTime" if start is not None and start > now else "now"
        raise BadRequest(f"endTime must not be before the first tick after {bound}: the schedule would never fire")
