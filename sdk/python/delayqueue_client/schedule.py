"""Schedules as the client hands them out: `Schedule` (the server's camelCase fields in
snake_case), `SchedulePage`, and the request fields of createSchedule and updateSchedule, taking
durations as seconds or a timedelta and instants as an aware datetime or epoch ms."""
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

Duration = float | timedelta
Instant = datetime | int
CATCH_UP = ("latest", "all", "skip")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring message: each tick of `cron` (in `timezone`) or of `every_ms` becomes one message
    of `topic` with body `msg`, msgId `<schedule_id>@<tick>` (`...#<generation>` once changed) and
    the tick as its trigger time. Times are epoch ms."""

    schedule_id: str
    topic: str
    msg: str
    cron: str | None  # None: an interval schedule
    timezone: str | None  # the cron's IANA zone; None for an interval schedule
    every_ms: int | None  # None: a cron schedule
    start_time: int | None  # an interval schedule's first tick, a cron schedule's earliest; None: none
    end_time: int | None  # no tick after it; None: none
    catch_up: str  # "latest", "all" or "skip": ticks missed while no scanner ran
    priority: int
    ttl_ms: int  # 0: the topic's
    max_retry: int  # -1: the topic's
    paused: bool
    next_fire_times: tuple[int, ...]  # the next five ticks; empty while paused or ended
    create_time: int
    update_time: int

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> "Schedule":
        """From a `schedule` of the API; fields this client does not know are ignored."""
        return cls(schedule_id=data["scheduleId"], topic=data["topic"], msg=data["msg"], cron=data.get("cron"),
                   timezone=data.get("timezone"), every_ms=data.get("everyMillis"), start_time=data.get("startTime"),
                   end_time=data.get("endTime"), catch_up=data["catchUp"], priority=data["priority"],
                   ttl_ms=data["ttlMillis"], max_retry=data["maxRetry"], paused=bool(data["paused"]),
                   next_fire_times=tuple(data.get("nextFireTimes") or ()), create_time=data["createTime"],
                   update_time=data["updateTime"])

    @property
    def every(self) -> timedelta | None:
        """An interval schedule's interval."""
        return None if self.every_ms is None else timedelta(milliseconds=self.every_ms)


class SchedulePage(NamedTuple):
    schedules: list[Schedule]
    next_cursor: str | None  # None on the last page


def duration_ms(value: Duration, what: str) -> int:
    """Seconds (int or float) or a timedelta, in whole ms; ValueError below 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, got {type(value).__name__}")
    try:
        ms = (value.total_seconds() if isinstance(value, timedelta) else float(value)) * 1000
    except OverflowError:  # an int beyond any float
        ms = math.inf
    if not 0 <= ms < math.inf:  # NaN fails both; round() would raise OverflowError on infinity
        raise ValueError(f"{what} must be 0 or more (seconds or a timedelta), and finite, got {value!r}")
    return round(ms)


def instant_ms(value: Instant, what: str) -> int:
    """An aware datetime, or epoch ms (an int), in epoch ms; a naive datetime is a ValueError."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{what}: a naive datetime ({value.isoformat()}) has no time zone, so no one instant: "
                             "give an aware one, e.g. datetime(2030, 1, 1, tzinfo=timezone.utc)")
        return round(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an aware datetime or epoch milliseconds (an int), got {type(value).__name__}")
    return value


def given_text(value: str | None, what: str) -> str | None:
    """A text parameter, None when not given; "" is a ValueError: the server takes an empty parameter as not
    given, so it would be dropped unsaid (or an update of it alone refused as changing nothing)."""
    if value == "":
        raise ValueError(f"{what} is empty: the server would take it as not given; give a value, or None to leave "
                         "it out")
    return value


def schedule_fields(*, topic: str | None = None, msg: str | None = None, cron: str | None = None,
                    timezone: str | None = None, every: Duration | None = None, start: Instant | None = None,
                    end: Instant | None = None, catch_up: str | None = None, priority: int | None = None,
                    ttl: Duration | None = None, max_retry: int | None = None,
                    paused: bool | None = None) -> dict[str, Any]:
    """createSchedule's or updateSchedule's fields of the API, those given (not None) only."""
    if msg is not None and not isinstance(msg, str):
        raise TypeError(f"msg must be a str, got {type(msg).__name__} (encode it, e.g. json.dumps)")
    fields = {"topic": topic, "msg": msg, "cron": given_text(cron, "cron"),
              "timezone": given_text(timezone, "timezone"),
              "everyMillis": None if every is None else duration_ms(every, "every"),
              "startTime": None if start is None else instant_ms(start, "start"),
              "endTime": None if end is None else instant_ms(end, "end"), "catchUp": given_text(catch_up, "catch_up"),
              "priority": priority, "ttlMillis": None if ttl is None else duration_ms(ttl, "ttl"),
              "maxRetry": max_retry, "paused": paused}
    return {name: value for name, value in fields.items() if value is not None}
