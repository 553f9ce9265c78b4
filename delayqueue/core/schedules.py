"""A schedule as stored (the Schedule model's row), the ticks its rule gives, and the msgId of
each tick's message. The planner (workers/scheduler.py), the services and the operators' views
all read a schedule through this."""
import functools
import zlib
from dataclasses import dataclass

from delayqueue.core.constants import SCHEDULE_LEAD_MILLIS
from delayqueue.core.schedule_rules import CronRule, EveryRule

# Columns of the schedule table in ScheduleRow's field order (sql.py selects them so).
FIELDS = ("id", "namespace", "schedule_id", "topic", "payload", "cron", "timezone", "every_millis", "start_time",
          "end_time", "catch_up", "priority", "ttl_millis", "max_retry", "paused", "generation", "planned_until",
          "plan_at", "created_at", "updated_at")

# An interval schedule has no time zone of its own (stored as UTC): another one given is refused.
INTERVAL_ZONE = "UTC"
NOT_AN_INTERVAL_SETTING = "is a cron schedule's: not with everyMillis"


@dataclass(frozen=True)
class ScheduleRow:
    id: int
    namespace: str
    schedule_id: str
    topic: str
    payload: str
    cron: str  # '': an interval schedule
    timezone: str
    every_millis: int | None
    start_time: int | None  # epoch ms; an interval schedule's first tick, a cron schedule's earliest
    end_time: int | None  # epoch ms; no tick after it
    catch_up: str
    priority: int
    ttl_millis: int
    max_retry: int
    paused: bool
    generation: int
    planned_until: int
    plan_at: int | None
    created_at: int
    updated_at: int

    @property
    def rule(self) -> CronRule | EveryRule:
        return rule_of(self.cron, self.timezone, self.every_millis, self.start_time)

    def ticks(self, after: int, until: int, limit: int) -> list[int]:
        """The schedule's ticks in (after, until], within its start and end, at most `limit`."""
        if self.start_time is not None:
            after = max(after, self.start_time - 1)
        if self.end_time is not None:
            until = min(until, self.end_time)
        return self.rule.ticks(after, until, limit) if until > after else []

    def next_tick(self, after: int) -> int | None:
        """The first tick after `after`, or None when the schedule has no more."""
        if self.start_time is not None:
            after = max(after, self.start_time - 1)
        [following] = self.rule.next_ticks(after, 1) or [None]
        return following if following is None or self.end_time is None or following <= self.end_time else None

    def next_fire_times(self, now: int, count: int = 5) -> list[int]:
        """The next `count` ticks after `now` (none while paused)."""
        if self.paused:
            return []
        after = now if self.start_time is None else max(now, self.start_time - 1)
        ticks = self.rule.next_ticks(after, count)
        return [t for t in ticks if self.end_time is None or t <= self.end_time]

    def missed(self, after: int, cutoff: int) -> tuple[int, int, int]:
        """The ticks in (after, cutoff]: how many, the first and the last (0, 0, 0 for none).
        An interval's are counted, a cron rule's walked (at most one a minute)."""
        if self.end_time is not None:
            cutoff = min(cutoff, self.end_time)
        rule = self.rule
        if isinstance(rule, EveryRule):
            [first] = self.ticks(after, cutoff, 1) or [0]
            if not first:
                return 0, 0, 0
            last = first + (cutoff - first) // rule.every * rule.every
            return (last - first) // rule.every + 1, first, last
        count, first, last = 0, 0, 0
        while ticks := self.ticks(after, cutoff, MISSED_WALK):
            count, first, last = count + len(ticks), first or ticks[0], ticks[-1]
            after = last
        return count, first, last

    def msg_id(self, tick: int) -> str:
        return tick_msg_id(self.schedule_id, tick, self.generation)


# A schedule is planned at points of its own phase (from its id) of a PLAN_PERIOD_MILLIS grid:
# schedules created together then spread their rounds over the period. With one phase for all,
# 10,000 schedules of 1 s were all planned in the same second of every 5 s: their ticks went out
# in bursts of up to 28,000 sends a second, then next to none.
PLAN_PERIOD_MILLIS = SCHEDULE_LEAD_MILLIS // 2


def plan_phase(schedule_id: str) -> int:
    """Where in each planning period the schedule's rounds fall (ms), the same in every process."""
    return zlib.crc32(schedule_id.encode()) % PLAN_PERIOD_MILLIS


def plan_time(row: ScheduleRow, planned_until: int) -> int | None:
    """When the planner should next look at the schedule, planned up to `planned_until`: at the
    first point of its phase once its next tick is SCHEDULE_LEAD_MILLIS ahead, so that tick is
    sent between the lead less a period and the lead ahead (a frequent schedule is then planned
    once a period, a few ticks at a time); None while paused or when it has no more ticks."""
    if row.paused:
        return None
    following = row.next_tick(planned_until)
    if following is None:
        return None
    earliest = following - SCHEDULE_LEAD_MILLIS
    return earliest + (plan_phase(row.schedule_id) - earliest) % PLAN_PERIOD_MILLIS


MISSED_WALK = 10_000  # ticks per step of a cron rule's walk over a long outage

@functools.lru_cache(maxsize=4096)
def rule_of(cron: str, timezone: str, every_millis: int | None, anchor: int | None) -> CronRule | EveryRule:
    if cron:
        return CronRule.parse(cron, timezone)
    return EveryRule(every_millis, anchor)


def tick_msg_id(schedule_id: str, tick: int, generation: int) -> str:
    """The msgId of a tick's message: the same for every planner, so a tick sent twice is one
    message (msgId dedupe). A change to the schedule starts a new generation, whose ticks are new
    msgIds even at the times of ticks the change deleted."""
    return f"{schedule_id}@{tick}" if generation == 0 else f"{schedule_id}@{tick}#{generation}"


def run_now_msg_id(schedule_id: str, now: int) -> str:
    """The msgId of a message an operator sent at once ("run now"), apart from every tick's."""
    return f"{schedule_id}@run-{now}"
