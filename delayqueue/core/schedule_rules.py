"""The tick times of recurring schedules: a cron rule in a time zone (CronRule) or a fixed interval
(EveryRule). Times are epoch milliseconds (int, UTC).

A cron rule, as users write it:
- Five fields, separated by spaces or tabs: minute (0-59), hour (0-23), day of month (1-31),
  month (1-12 or jan-dec) and day of week (0-7 or sun-sat; 0 and 7 are both Sunday). Names are
  three letters, in any case.
- A field is a comma list of parts. A part is `*`, a number, a range `a-b` (names too: mon-fri),
  or a step over one of them: `*/n`, `a-b/n`, or `a/n` (from a to the field's end).
- Not supported: a seconds field, macros such as @hourly, and `?`, `L`, `W`, `#`.
- Days: when both day of month and day of week are restricted (neither field starts with `*`),
  a day fires if either matches: `0 12 13 * 5` fires on the 13th and on every Friday. Otherwise
  a day must match both.
- Ticks fall on whole minutes of the wall clock in the rule's time zone (an IANA name).
- A wall time that a clock change skips (spring forward) fires as late as the clock jumped:
  02:30 fires at 03:30 on a day the clock goes from 02:00 to 03:00. An instant the rule reaches
  twice fires once.
- A wall time that a clock change repeats (fall back) fires once, at its first occurrence; when
  the hour field matches every hour, it fires at both, so `*/30 * * * *` stays 30 minutes apart.
- A rule that can never fire (`0 0 30 2 *`) is refused; `0 0 29 2 *` fires in leap years.
"""
import calendar
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from functools import cache, lru_cache
from zoneinfo import ZoneInfo, available_timezones

_MINUTE_MS = 60_000
_HOUR_MS = 3_600_000
_DAY_MS = 86_400_000
_ONE_DAY = timedelta(days=1)
_ONE_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_ORDINAL = _EPOCH.toordinal()
# The instants cron ticks are computed within: datetime's years 1-9999 less two days at each
# end, as the search looks at the local days next to its bounds.
_FIRST_MS = (date(1, 1, 3).toordinal() - _EPOCH_ORDINAL) * _DAY_MS
_LAST_MS = (date(9999, 12, 29).toordinal() - _EPOCH_ORDINAL) * _DAY_MS
# How far one search looks ahead. The longest any rule goes without a tick is 40 years (Feb 29
# on a given weekday, across 2100, which is no leap year), so a search never stops short of one.
_SEARCH_MS = 41 * 366 * _DAY_MS
# Calendar years that hold every (month, day, weekday) there is, Feb 29 on each weekday included.
_CALENDAR_YEARS = range(2000, 2028)

_MONTH_NAMES = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_WEEKDAY_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_FIELD_NAMES = "minute hour day-of-month month day-of-week"
_PART = re.compile(r"(?:\*|([0-9]+|[A-Za-z]+)(?:-([0-9]+|[A-Za-z]+))?)(?:/([0-9]+))?")


class RuleError(ValueError):
    """A rule that cannot be used; str() is one readable line naming the problem."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]
    name_range: str = ""


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTH_NAMES, "jan-dec"),
    _Field("day-of-week", 0, 7, _WEEKDAY_NAMES, "sun-sat"),
)


def _number(digits: str) -> int:
    """The digits' value; past two significant digits (beyond every field) just 100, as int()
    refuses thousands of digits."""
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= 2 else 100


def _value(text: str, spec: _Field) -> int:
    if text.isdigit():
        value = _number(text)
        if not spec.low <= value <= spec.high:
            raise RuleError(f"cron: {spec.name} field: {text} is out of range {spec.low}-{spec.high}")
        return value
    if not spec.names:
        raise RuleError(f"cron: {spec.name} field: {text!r} is not a number")
    named = spec.names.get(text.lower())
    if named is None:
        raise RuleError(f"cron: {spec.name} field: unknown name {text!r} (use {spec.low}-{spec.high} "
                        f"or {spec.name_range})")
    return named


def _parse_field(text: str, spec: _Field) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise RuleError(f"cron: {spec.name} field: empty item in {text!r}")
        match = _PART.fullmatch(part)
        if match is None:
            raise RuleError(f"cron: {spec.name} field: cannot read {part!r} (a part is *, a number, a range a-b, "
                            "or one of these with /step)")
        first, last, step_text = match.groups()
        if first is None:
            low, high = spec.low, spec.high
        else:
            low = _value(first, spec)
            high = _value(last, spec) if last else spec.high if step_text else low
            if low > high:
                raise RuleError(f"cron: {spec.name} field: range {part!r} runs backwards")
        step = 1 if step_text is None else _number(step_text)
        if step == 0:
            raise RuleError(f"cron: {spec.name} field: step 0 in {part!r} (a step is at least 1)")
        values.update(range(low, high + 1, step))
    return values


@cache
def _zone_names() -> frozenset[str]:
    # 'localtime' is this machine's zone under another name, no IANA name.
    return frozenset(available_timezones() - {"localtime"})


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or name not in _zone_names():
        raise RuleError(f"unknown time zone {str(name)!r}")
    return ZoneInfo(name)


def _utc_ms(moment: datetime) -> int:
    """An aware datetime in epoch ms; a wall time's fold picks its occurrence."""
    return (moment - _EPOCH) // _ONE_MS


def _steady_offset(zone: ZoneInfo, day: date, first_hour: int, last_hour: int) -> int | None:
    """The zone's UTC offset in ms through the day's wall hours first_hour:00-last_hour:59, or
    None when a clock change falls inside them. Both ends read alike at fold 0 and 1 only when
    neither is skipped or repeated; with the two ends on the same offset, a change between them
    would need a second one to undo it, and no zone has had two within four days."""
    start = datetime(day.year, day.month, day.day, first_hour, 0, tzinfo=zone)
    end = datetime(day.year, day.month, day.day, last_hour, 59, tzinfo=zone)
    offset = start.utcoffset()
    if offset == start.replace(fold=1).utcoffset() == end.utcoffset() == end.replace(fold=1).utcoffset():
        return offset // _ONE_MS
    return None


@lru_cache(maxsize=4096)
def _day_offset(zone: ZoneInfo, day: date) -> int | None:
    """_steady_offset over the whole day, remembered: thousands of rules a second ask about the
    same few days of the same few zones."""
    return _steady_offset(zone, day, 0, 23)


def _local_date(millis: int, zone: ZoneInfo) -> date:
    return (_EPOCH + timedelta(milliseconds=millis)).astimezone(zone).date()


def _add_ticks(found: list[int], more: list[int], limit: int) -> None:
    """Adds more to found (each ascending, without repeats), keeping the first limit. A clock
    change near midnight can put a day's ticks before or on the previous day's last ones."""
    if found and more and more[0] <= found[-1]:
        found[:] = sorted(set(found).union(more))
    else:
        found.extend(more)
    del found[limit:]


@dataclass(frozen=True, slots=True)
class _Compiled:
    zone: ZoneInfo
    hours: tuple[int, ...]
    minutes: tuple[int, ...]
    every_hour: bool
    minute_offsets_ms: tuple[int, ...]  # each minute's offset into its hour, ascending
    day_offsets_ms: tuple[int, ...]  # each (hour, minute)'s offset into the day, ascending
    months: frozenset[int]
    # The days of a month that match, by the month's first weekday (0 Sunday) and length - 28.
    days_by_month_shape: tuple[tuple[tuple[int, ...], ...], ...]


def _compile(expression: object, zone_name: object) -> _Compiled:
    zone = _zone(zone_name)
    if not isinstance(expression, str):
        raise RuleError(f"cron: the expression must be text, not {type(expression).__name__}")
    text = expression.strip()
    if text.startswith("@"):
        raise RuleError(f"cron: macros such as {text.split()[0]!r} are not supported; write the 5 fields "
                        f"({_FIELD_NAMES})")
    field_texts = re.split(r"[ \t]+", text) if text else []
    if len(field_texts) != 5:
        raise RuleError(f"cron: needs 5 fields ({_FIELD_NAMES}), got {len(field_texts)}")
    minutes, hours, days, months, weekdays = (_parse_field(field_text, spec)
                                              for field_text, spec in zip(field_texts, _FIELDS))
    weekdays = {weekday % 7 for weekday in weekdays}  # 7 is Sunday too
    either_day = not field_texts[2].startswith("*") and not field_texts[4].startswith("*")

    def day_matches(day: int, weekday: int) -> bool:
        if either_day:
            return day in days or weekday in weekdays
        return day in days and weekday in weekdays

    days_by_month_shape = tuple(
        tuple(tuple(day for day in range(1, length + 1) if day_matches(day, (first_weekday + day - 1) % 7))
              for length in range(28, 32))
        for first_weekday in range(7))
    compiled = _Compiled(
        zone=zone, hours=tuple(sorted(hours)), minutes=tuple(sorted(minutes)), every_hour=len(hours) == 24,
        minute_offsets_ms=tuple(minute * _MINUTE_MS for minute in sorted(minutes)),
        day_offsets_ms=tuple((hour * 60 + minute) * _MINUTE_MS for hour in sorted(hours) for minute in sorted(minutes)),
        months=frozenset(months), days_by_month_shape=days_by_month_shape)
    if not any(_month_days(compiled, year, month) for year in _CALENDAR_YEARS for month in compiled.months):
        raise RuleError(f"cron {expression!r} never fires")
    return compiled


def _month_days(compiled: _Compiled, year: int, month: int) -> tuple[int, ...]:
    """The days of that month the rule fires on (the month itself unchecked)."""
    first_weekday, length = calendar.monthrange(year, month)
    return compiled.days_by_month_shape[(first_weekday + 1) % 7][length - 28]


@dataclass(frozen=True, slots=True)
class CronRule:
    expression: str
    timezone: str  # an IANA name: "UTC", "Europe/Berlin"
    _compiled: _Compiled = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_compiled", _compile(self.expression, self.timezone))

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> "CronRule":
        """The rule, checked whole; RuleError names what is wrong."""
        return cls(expression, timezone)

    def ticks(self, after: int, until: int, limit: int) -> list[int]:
        """The tick times t with after < t <= until, ascending, at most limit of them, and within
        41 years of after."""
        if limit <= 0:
            return []
        after = max(after, _FIRST_MS)
        until = min(until, after + _SEARCH_MS, _LAST_MS)
        if until <= after:
            return []
        zone = self._compiled.zone
        found: list[int] = []
        # A clock change moves a tick by at most a day, so a tick in (after, until] falls on a
        # local day at most one away from those of the bounds.
        last_day = _local_date(until, zone) + _ONE_DAY
        for day in self._matching_days(_local_date(after, zone) - _ONE_DAY, last_day):
            if day > last_day:
                break
            _add_ticks(found, self._day_ticks(day, after, until, limit), limit)
            if len(found) == limit and found[-1] < until:
                # From now on only ticks before the last one found can still count.
                until = found[-1]
                last_day = _local_date(until, zone) + _ONE_DAY
        return found

    def next_ticks(self, after: int, count: int) -> list[int]:
        """The next count tick times after `after` (fewer only past the year 9999)."""
        found: list[int] = []
        while len(found) < count:
            more = self.ticks(after, _LAST_MS, count - len(found))
            if not more:
                break
            found += more
            after = more[-1]
        return found

    def _matching_days(self, first: date, last: date) -> Iterator[date]:
        """The days from first to last the rule fires on, ascending."""
        compiled = self._compiled
        year, month, from_day = first.year, first.month, first.day
        while (year, month) <= (last.year, last.month):
            if month in compiled.months:
                days = _month_days(compiled, year, month)
                for day in days[bisect_left(days, from_day):]:
                    yield date(year, month, day)
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
            from_day = 1

    def _day_ticks(self, day: date, after: int, until: int, limit: int) -> list[int]:
        """The day's tick times in (after, until], ascending, at most limit of them."""
        compiled = self._compiled
        midnight_ms = (day.toordinal() - _EPOCH_ORDINAL) * _DAY_MS  # the day's wall midnight read as UTC
        offset = _day_offset(compiled.zone, day)
        if offset is not None:
            start = midnight_ms - offset
            into_day = compiled.day_offsets_ms
            first = bisect_right(into_day, after - start)
            last = min(bisect_right(into_day, until - start), first + limit)
            return [start + tick_ms for tick_ms in into_day[first:last]]
        ticks: set[int] = set()
        for hour in compiled.hours:
            hour_ms = midnight_ms + hour * _HOUR_MS
            offset = _steady_offset(compiled.zone, day, hour, hour)
            if offset is not None:
                ticks.update(hour_ms - offset + minute_ms for minute_ms in compiled.minute_offsets_ms)
                continue
            for minute in compiled.minutes:
                wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=compiled.zone)
                # fold 0 reads a repeated wall time at its first occurrence, and a skipped one
                # with the offset from before the jump, which moves it forward by the jump.
                at_fold_0 = _utc_ms(wall)
                ticks.add(at_fold_0)
                at_fold_1 = _utc_ms(wall.replace(fold=1))
                if at_fold_1 > at_fold_0 and compiled.every_hour:  # repeated: the second occurrence
                    ticks.add(at_fold_1)
        return sorted(tick for tick in ticks if after < tick <= until)[:limit]


@dataclass(frozen=True, slots=True)
class EveryRule:
    every: int  # ms, > 0
    anchor: int  # the ticks are anchor + k * every, for any integer k

    def __post_init__(self):
        if self.every <= 0:
            raise RuleError(f"every: the interval must be above 0 ms, got {self.every}")

    def ticks(self, after: int, until: int, limit: int) -> list[int]:
        """The tick times t with after < t <= until, ascending, at most limit of them."""
        first = self.anchor + ((after - self.anchor) // self.every + 1) * self.every
        if limit <= 0 or first > until:
            return []
        last = min(until, first + (limit - 1) * self.every)
        return list(range(first, last + 1, self.every))

    def next_ticks(self, after: int, count: int) -> list[int]:
        """The next count tick times after `after`."""
        return self.ticks(after, after + count * self.every, count)
