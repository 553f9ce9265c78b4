"""Tick times of cron and interval rules (delayqueue/core/schedule_rules.py): the cron syntax and
its refusals, day matching, clock changes in America/New_York and Europe/Berlin, and the bounds
of ticks() and next_ticks(). Expected times are written out as wall times in their zone."""
import time
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from delayqueue.core.schedule_rules import CronRule, EveryRule, RuleError

NEW_YORK, BERLIN = "America/New_York", "Europe/Berlin"
MINUTE, HALF_HOUR = 60_000, 1_800_000
FAR = 2**62


def wall(zone: str, *fields: int, fold: int = 0) -> int:
    """Epoch ms of a wall time in a zone (fold=1: the second of a repeated one)."""
    moment = datetime(*fields, tzinfo=ZoneInfo(zone), fold=fold)
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def utc(*fields: int) -> int:
    return wall("UTC", *fields)


JUST_BEFORE_2026 = utc(2026, 1, 1) - 1  # a Thursday


@pytest.mark.parametrize("expression, expected", [
    ("*/20 * * * *", [(0, 0), (0, 20), (0, 40), (1, 0)]),
    ("10-30/10 * * * *", [(0, 10), (0, 20), (0, 30), (1, 10)]),
    ("50/5 * * * *", [(0, 50), (0, 55), (1, 50), (1, 55)]),  # a/n runs to the field's end
    (" \t7\t\t3-4,20  * *   *  ", [(3, 7), (4, 7), (20, 7), (27, 7)]),  # hours: day 2 starts at 24
])
def test_minute_and_hour_syntax(expression, expected):
    assert CronRule.parse(expression).next_ticks(JUST_BEFORE_2026, 4) == [
        utc(2026, 1, 1) + hour * 3_600_000 + minute * MINUTE for hour, minute in expected]


@pytest.mark.parametrize("expression, expected_days", [
    ("0 9 1 jan-may/2 *", [date(2026, 1, 1), date(2026, 3, 1), date(2026, 5, 1), date(2027, 1, 1)]),
    ("0 9 * * MON-wed", [date(2026, 1, 5), date(2026, 1, 6), date(2026, 1, 7), date(2026, 1, 12)]),
    ("0 9 * * 4/2", [date(2026, 1, 1), date(2026, 1, 3), date(2026, 1, 8), date(2026, 1, 10)]),  # Thu, Sat
])
def test_month_and_weekday_syntax_with_names(expression, expected_days):
    assert CronRule.parse(expression).next_ticks(JUST_BEFORE_2026, 4) == [
        utc(day.year, day.month, day.day, 9) for day in expected_days]


@pytest.mark.parametrize("expression, zone, message", [
    ("0 25 * * *", "UTC", "cron: hour field: 25 is out of range 0-23"),
    ("0 0 * * 8", "UTC", "cron: day-of-week field: 8 is out of range 0-7"),
    ("0 0 * foo *", "UTC", "cron: month field: unknown name 'foo'"),
    ("jan 0 * * *", "UTC", "cron: minute field: 'jan' is not a number"),
    ("5-2 * * * *", "UTC", "cron: minute field: range '5-2' runs backwards"),
    ("*/0 * * * *", "UTC", "cron: minute field: step 0 in '*/0'"),
    ("1,,2 * * * *", "UTC", "cron: minute field: empty item in '1,,2'"),
    ("0 0 ? * *", "UTC", "cron: day-of-month field: cannot read '?'"),
    ("0 0 * * 5#3", "UTC", "cron: day-of-week field: cannot read '5#3'"),
    ("0 0 * * * *", "UTC", "cron: needs 5 fields (minute hour day-of-month month day-of-week), got 6"),
    ("@hourly", "UTC", "cron: macros such as '@hourly' are not supported"),
    ("0 0 30 2 *", "UTC", "cron '0 0 30 2 *' never fires"),
    ("0 0 31 4 *", "UTC", "cron '0 0 31 4 *' never fires"),
    ("0 0 * * *", "Europe/Nowhere", "unknown time zone 'Europe/Nowhere'"),
    ("0 0 * * *", "", "unknown time zone ''"),
    ("0 0 * * *", "../etc/passwd", "unknown time zone '../etc/passwd'"),
    ("0 0 * * *", None, "unknown time zone 'None'"),
])
def test_refusals_name_the_problem(expression, zone, message):
    with pytest.raises(RuleError) as refused:
        CronRule.parse(expression, zone)
    assert isinstance(refused.value, ValueError)
    assert str(refused.value).startswith(message)


def test_every_15_minutes_in_utc_with_the_upper_bound_inclusive():
    rule = CronRule.parse("*/15 * * * *")
    assert rule.ticks(utc(2026, 5, 1, 10, 7), utc(2026, 5, 1, 11), 10) == [
        utc(2026, 5, 1, 10, 15), utc(2026, 5, 1, 10, 30), utc(2026, 5, 1, 10, 45), utc(2026, 5, 1, 11)]


def test_weekdays_in_berlin_skip_the_weekend():
    rule = CronRule.parse("30 2 * * 1-5", BERLIN)
    # After Friday 2026-01-09's tick: Monday to Wednesday, 02:30 CET = 01:30 UTC.
    assert rule.next_ticks(wall(BERLIN, 2026, 1, 9, 3), 3) == [
        wall(BERLIN, 2026, 1, 12, 2, 30), wall(BERLIN, 2026, 1, 13, 2, 30), wall(BERLIN, 2026, 1, 14, 2, 30)]
    assert wall(BERLIN, 2026, 1, 12, 2, 30) == utc(2026, 1, 12, 1, 30)


def test_first_of_the_month():
    assert CronRule.parse("0 0 1 * *").next_ticks(utc(2026, 1, 15), 3) == [
        utc(2026, 2, 1), utc(2026, 3, 1), utc(2026, 4, 1)]


def test_day_of_month_or_day_of_week_when_both_are_restricted():
    # April 2026: the 13th is a Monday, the Fridays are the 3rd, 10th, 17th and 24th.
    assert CronRule.parse("0 12 13 * 5").ticks(utc(2026, 4, 1), utc(2026, 5, 1), 10) == [
        utc(2026, 4, day, 12) for day in (3, 10, 13, 17, 24)]


def test_day_of_month_and_day_of_week_when_one_starts_with_a_star():
    # */5 is Sunday and Friday, but starts with *: only a 13th that is a Sunday or a Friday fires.
    assert CronRule.parse("0 12 13 * */5").next_ticks(JUST_BEFORE_2026, 5) == [
        utc(2026, month, 13, 12) for month in (2, 3, 9, 11, 12)]


def test_day_of_week_7_is_sunday_like_0():
    sundays = [utc(2026, 1, day, 9) for day in (4, 11, 18)]
    for expression in ("0 9 * * 0", "0 9 * * 7", "0 9 * * Sun"):
        assert CronRule.parse(expression).next_ticks(JUST_BEFORE_2026, 3) == sundays
    assert CronRule.parse("0 9 * * 6-7").next_ticks(JUST_BEFORE_2026, 4) == [
        utc(2026, 1, day, 9) for day in (3, 4, 10, 11)]


def at(zone: str, day: date, hour: int = 0, minute: int = 0, fold: int = 0) -> int:
    return wall(zone, day.year, day.month, day.day, hour, minute, fold=fold)


# (zone, 2026's spring-forward day, its fall-back day, the wall hour that day repeats).
CLOCK_CHANGES = [(NEW_YORK, date(2026, 3, 8), date(2026, 11, 1), 1), (BERLIN, date(2026, 3, 29), date(2026, 10, 25), 2)]


def around(day: date) -> tuple[date, date, date]:
    return day - timedelta(days=1), day, day + timedelta(days=1)


@pytest.mark.parametrize("zone, spring, fall, repeated_hour", CLOCK_CHANGES)
def test_a_skipped_wall_time_fires_once_as_late_as_the_jump(zone, spring, fall, repeated_hour):
    before, change, after = around(spring)
    ticks = CronRule.parse("30 2 * * *", zone).ticks(at(zone, before), at(zone, after, 12), 10)
    # 02:30 does not exist that day: the clock jumps from 02:00 to 03:00.
    assert ticks == [at(zone, before, 2, 30), at(zone, change, 3, 30), at(zone, after, 2, 30)]
    assert ticks[1] == {NEW_YORK: utc(2026, 3, 8, 7, 30), BERLIN: utc(2026, 3, 29, 1, 30)}[zone]


@pytest.mark.parametrize("zone, spring, fall, repeated_hour", CLOCK_CHANGES)
def test_every_half_hour_across_the_jump_keeps_its_rhythm_without_repeats(zone, spring, fall, repeated_hour):
    start, end = at(zone, spring), at(zone, spring, 6)
    ticks = CronRule.parse("*/30 * * * *", zone).ticks(start, end, 100)
    assert ticks == list(range(start + HALF_HOUR, end + 1, HALF_HOUR))


@pytest.mark.parametrize("zone, spring, fall, repeated_hour", CLOCK_CHANGES)
def test_a_repeated_wall_time_fires_once_at_its_first_occurrence(zone, spring, fall, repeated_hour):
    before, change, after = around(fall)
    rule = CronRule.parse(f"30 {repeated_hour} * * *", zone)
    ticks = rule.ticks(at(zone, before), at(zone, after, 12), 10)
    assert ticks == [at(zone, day, repeated_hour, 30) for day in (before, change, after)]
    # The first occurrence is still on summer time: 01:30 EDT, 02:30 CEST.
    assert ticks[1] == {NEW_YORK: utc(2026, 11, 1, 5, 30), BERLIN: utc(2026, 10, 25, 0, 30)}[zone]


@pytest.mark.parametrize("hours", ["*", "0-23", "*/1"])  # each matches every hour, as docs/schedules.md says
@pytest.mark.parametrize("zone, spring, fall, repeated_hour", CLOCK_CHANGES)
def test_every_half_hour_fires_at_both_occurrences_of_a_repeated_hour(zone, spring, fall, repeated_hour, hours):
    first_start = at(zone, fall, repeated_hour, 0, fold=0)
    second_end = at(zone, fall, repeated_hour, 59, fold=1)
    assert second_end - first_start == 2 * 3_600_000 - MINUTE  # the wall hour lasts two hours
    rule = CronRule.parse(f"*/30 {hours} * * *", zone)
    assert rule.ticks(first_start - 1, second_end, 10) == [first_start + step * HALF_HOUR for step in range(4)]
    start, end = at(zone, fall), at(zone, fall, 6)
    assert rule.ticks(start, end, 100) == list(range(start + HALF_HOUR, end + 1, HALF_HOUR))


def test_a_restricted_hour_fires_only_in_the_first_occurrence_of_a_repeated_hour():
    ticks = CronRule.parse("*/30 2 * * *", BERLIN).ticks(wall(BERLIN, 2026, 10, 25), wall(BERLIN, 2026, 10, 25, 12), 10)
    assert ticks == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30)]  # 02:00 and 02:30 CEST


def test_a_jump_that_ends_at_midnight_moves_the_evening_into_the_next_day():
    # Pyongyang went from +08:30 to +09:00 at 23:30 on 2018-05-04 (15:00 UTC): 23:30-23:59 were
    # skipped, and fire at 00:00-00:29 on May 5, once each even where May 5's own ticks fall too.
    zone = "Asia/Pyongyang"
    assert CronRule.parse("*/15 23,0 * * *", zone).ticks(utc(2018, 5, 4, 13), utc(2018, 5, 4, 17), 20) == list(
        range(utc(2018, 5, 4, 14, 30), utc(2018, 5, 4, 15, 45) + 1, 15 * MINUTE))
    # May 4's 23:45 fires after May 5 00:05 local.
    assert CronRule.parse("45 23 * * *", zone).next_ticks(wall(zone, 2018, 5, 5, 0, 5), 2) == [
        utc(2018, 5, 4, 15, 15), utc(2018, 5, 5, 14, 45)]


def test_a_repeated_hour_across_midnight():
    # Goose Bay went back from 00:01 (-03:00) to 23:01 (-04:00) at 03:01 UTC on 1987-10-25, so
    # 23:01-00:00 came twice, and Oct 25's first midnight fell while the clock then read Oct 24.
    zone = "America/Goose_Bay"
    rule = CronRule.parse("*/30 * * * *", zone)
    every_half_hour = list(range(utc(1987, 10, 25, 2), utc(1987, 10, 25, 4, 30) + 1, HALF_HOUR))
    assert rule.ticks(utc(1987, 10, 25, 1, 45), utc(1987, 10, 25, 4, 45), 20) == every_half_hour
    assert rule.ticks(utc(1987, 10, 25, 1, 45), utc(1987, 10, 25, 4, 45), 3) == every_half_hour[:3]
    assert CronRule.parse("0 0 * * *", zone).ticks(utc(1987, 10, 25, 2), utc(1987, 10, 25, 3, 30), 5) == [
        utc(1987, 10, 25, 3)]


@pytest.mark.parametrize("expression, zone", [
    ("*/7 * * * *", NEW_YORK), ("* * * * *", BERLIN), ("0,30 1-3 * * *", BERLIN)])
def test_ticks_stay_between_the_bounds_strictly_increasing_and_within_the_limit(expression, zone):
    rule = CronRule.parse(expression, zone)
    after, until = utc(2026, 10, 24, 12), utc(2026, 11, 2, 12)  # both of 2026's autumn changes
    ticks = rule.ticks(after, until, 100_000)
    assert ticks and all(after < tick <= until for tick in ticks)
    assert all(earlier < later for earlier, later in zip(ticks, ticks[1:]))
    assert rule.ticks(after, until, 3) == ticks[:3]
    assert rule.next_ticks(after, 5) == ticks[:5]
    assert rule.ticks(ticks[0], ticks[2], 10) == ticks[1:3]  # after exclusive, until inclusive
    assert rule.ticks(after, until, 0) == [] and rule.ticks(until, after, 10) == []


def test_february_29_is_found_years_ahead_quickly():
    rule = CronRule.parse("0 0 29 2 *")
    started = time.perf_counter()
    assert rule.next_ticks(utc(2026, 3, 1), 1) == [utc(2028, 2, 29)]
    assert time.perf_counter() - started < 0.05
    assert rule.next_ticks(utc(2028, 2, 29), 2) == [utc(2032, 2, 29), utc(2036, 2, 29)]


def test_february_29_on_a_sunday_is_found_across_the_40_years_around_2100():
    # */7 is Sunday alone but starts with *, so the day must be both Feb 29 and a Sunday.
    sundays = [year for year in range(2089, 2200) if year % 4 == 0 and (year % 100 or year % 400 == 0)
               and date(year, 2, 29).weekday() == 6]
    assert sundays[0] == 2128  # 2100 is no leap year
    assert CronRule.parse("0 0 29 2 */7").next_ticks(utc(2089, 1, 1), 1) == [utc(2128, 2, 29)]


def test_31_april_on_mondays_fires_on_mondays():
    assert CronRule.parse("0 0 31 4 1").next_ticks(utc(2026, 4, 1), 3) == [utc(2026, 4, day) for day in (6, 13, 20)]


def test_every_rule_with_its_anchor_in_the_past_or_the_future():
    assert EveryRule(every=1000, anchor=500).ticks(10_000, 13_500, 10) == [10_500, 11_500, 12_500, 13_500]
    assert EveryRule(every=1000, anchor=1_000_000).ticks(-1500, 2000, 10) == [-1000, 0, 1000, 2000]


def test_every_rule_bounds_and_limit():
    rule = EveryRule(every=1000, anchor=500)
    assert rule.ticks(10_500, 11_500, 10) == [11_500]  # after exclusive, until inclusive
    assert rule.ticks(10_500, 11_499, 10) == []
    assert rule.ticks(0, FAR, 3) == [500, 1500, 2500]
    assert rule.ticks(0, FAR, 0) == []
    assert rule.next_ticks(-600, 3) == [-500, 500, 1500]


@pytest.mark.parametrize("every", [0, -1000])
def test_every_rule_refuses_an_interval_that_is_not_positive(every):
    with pytest.raises(RuleError, match="interval must be above 0 ms"):
        EveryRule(every=every, anchor=0)
