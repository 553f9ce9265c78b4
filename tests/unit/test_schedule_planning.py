"""The planner's choice of ticks (workers/scheduler.plan_ticks) and of when to plan again
(core/schedules.plan_time), and the admin page's recent ticks (ops/admin/schedules.recent_ticks):
pure logic on a schedule's row."""
import dataclasses
import time

from delayqueue.core.constants import (SCHEDULE_LEAD_MILLIS, SCHEDULE_MAX_TICKS_PER_ROUND,
                                       SCHEDULE_MISSED_AFTER_MILLIS)
from delayqueue.core.schedules import PLAN_PERIOD_MILLIS, ScheduleRow, plan_phase, plan_time
from delayqueue.ops.admin.schedules import recent_ticks
from delayqueue.workers.scheduler import plan_ticks

NOW = 1_800_000_000_000
SECOND = 1000


def every_second(planned_until: int, catch_up: str = "all", schedule_id: str = "s",
                 every_millis: int = SECOND) -> ScheduleRow:
    return ScheduleRow(id=1, namespace="n", schedule_id=schedule_id, topic="t", payload="x", cron="", timezone="UTC",
                       every_millis=every_millis, start_time=0, end_time=None, catch_up=catch_up, priority=0,
                       ttl_millis=0, max_retry=-1, paused=False, generation=0, planned_until=planned_until,
                       plan_at=0, created_at=0, updated_at=0)


def test_catching_up_all_of_a_long_outage_goes_on_over_rounds_each_tick_once():
    """3,000 s without a planner: 'all' sends at most a round's limit, then the rest next rounds."""
    down_since = NOW - 3000 * SECOND
    row = every_second(down_since, "all")
    cutoff = NOW - SCHEDULE_MISSED_AFTER_MILLIS
    sent = []
    while True:
        plan = plan_ticks(row, NOW, budget=10**9)
        assert len(plan.ticks) <= SCHEDULE_MAX_TICKS_PER_ROUND
        sent += plan.ticks
        row = dataclasses.replace(row, planned_until=plan.planned_until)
        if plan.gap is None:
            break
        assert plan.gap.fired == plan.gap.missed == len([t for t in plan.ticks if t <= cutoff])
    assert sent == list(range(down_since + SECOND, NOW + SCHEDULE_LEAD_MILLIS + 1, SECOND))


def test_latest_and_skip_count_every_missed_tick_and_send_at_most_the_last():
    down_since = NOW - 86_400 * SECOND  # a day: counted, not walked tick by tick
    cutoff = NOW - SCHEDULE_MISSED_AFTER_MILLIS
    for policy, fired in (("latest", [cutoff]), ("skip", [])):
        plan = plan_ticks(every_second(down_since, policy), NOW, budget=10**9)
        assert (plan.gap.first_tick, plan.gap.last_tick, plan.gap.missed, plan.gap.fired) == (
            down_since + SECOND, cutoff, (cutoff - down_since) // SECOND, len(fired))
        assert plan.ticks == fired + list(range(cutoff + SECOND, NOW + SCHEDULE_LEAD_MILLIS + 1, SECOND))


def test_a_round_budget_bounds_the_ticks_of_a_schedule():
    plan = plan_ticks(every_second(NOW, "latest"), NOW, budget=3)
    assert plan.ticks == [NOW + SECOND, NOW + 2 * SECOND, NOW + 3 * SECOND] and plan.planned_until == NOW + 3 * SECOND
    assert plan.gap is None


def test_a_frequent_schedule_is_planned_once_a_period_at_its_phase_each_tick_well_ahead():
    row = every_second(NOW - 1)
    now, rounds = NOW, []
    for _ in range(6):
        plan = plan_ticks(row, now, 20_000)
        assert plan.ticks[0] == row.next_tick(row.planned_until)  # no tick skipped, none twice
        row = dataclasses.replace(row, planned_until=plan.planned_until)
        now = plan_time(row, row.planned_until)
        ahead = row.next_tick(row.planned_until) - now  # the next tick is sent this long before it is due
        assert SCHEDULE_LEAD_MILLIS - PLAN_PERIOD_MILLIS < ahead <= SCHEDULE_LEAD_MILLIS, ahead
        assert now % PLAN_PERIOD_MILLIS == plan_phase("s")
        rounds.append(now)
    assert {b - a for a, b in zip(rounds, rounds[1:])} == {PLAN_PERIOD_MILLIS}  # as often as with one phase for all


def test_schedules_created_together_spread_their_planning_over_the_period():
    tenth = PLAN_PERIOD_MILLIS // 10
    per_tenth = [0] * 10
    for i in range(10_000):
        per_tenth[plan_time(every_second(NOW, schedule_id=f"s{i}"), NOW) % PLAN_PERIOD_MILLIS // tenth] += 1
    assert all(800 <= count <= 1200 for count in per_tenth), per_tenth  # about 1,000 each, not 10,000 in one


def test_a_sparse_schedule_is_planned_a_lead_ahead_of_its_next_tick_at_its_phase():
    hourly = every_second(NOW, every_millis=3_600_000)
    earliest = hourly.next_tick(NOW) - SCHEDULE_LEAD_MILLIS
    at = plan_time(hourly, NOW)
    assert earliest <= at < earliest + PLAN_PERIOD_MILLIS and at % PLAN_PERIOD_MILLIS == plan_phase("s")
    assert plan_time(dataclasses.replace(hourly, paused=True), NOW) is None


def test_the_recent_ticks_of_a_schedule_ended_long_ago_are_found_without_walking_the_years_since():
    """Its page looks back from its endTime: a window widened from now would be walked tick by tick
    across the years since (a second's ticks over a decade took minutes)."""
    year = 365 * 86_400 * SECOND
    ended = dataclasses.replace(every_second(NOW), start_time=NOW - 40 * year, end_time=NOW - 11 * year,
                                created_at=NOW - 40 * year)
    started = time.monotonic()
    assert recent_ticks(ended, NOW, 20) == list(range(NOW - 11 * year - 19 * SECOND, NOW - 11 * year + 1, SECOND))
    assert time.monotonic() - started < 1
