"""The planner of a namespace's schedules (one per scanner, in its log process: workers/log_process.py).

Each round, in one PostgreSQL transaction, it claims the schedules whose plan_at has come
(FOR UPDATE SKIP LOCKED: another scanner skips them, and takes them the moment this one commits
or dies), sends each one's ticks up to SCHEDULE_LEAD_MILLIS ahead as ordinary messages (with the
tick as triggerTime, so they fire with the queue's precision), and moves its planned_until past
them. A tick's msgId is fixed by the schedule and the tick (core/schedules.tick_msg_id): a
planner killed after sending and before committing leaves the row as it was, and the next one
sends the same ticks again, which msgId dedupe answers as duplicates. So every tick is one
message, whoever plans it and however often.

A tick first reached SCHEDULE_MISSED_AFTER_MILLIS or more after its time was missed (no
scanner ran): the schedule's catch-up policy fires each missed tick once, only the latest, or
none, and a ScheduleGap row says which. A tick whose send is refused (a limit, Redis or the log
down) stops its schedule's plan there; it is tried again RETRY_MILLIS later, as is a schedule
whose rule this process cannot read (a time zone its tzdata lacks): the others go on.
"""
import asyncio
import logging
from dataclasses import dataclass

import orjson

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import (SCHEDULE_LEAD_MILLIS, SCHEDULE_MAX_TICKS_PER_ROUND,
                                       SCHEDULE_MISSED_AFTER_MILLIS, CatchUp)
from delayqueue.core.exceptions import QueueError
from delayqueue.core.outage import Outage
from delayqueue.core.schedule_rules import RuleError
from delayqueue.core.schedules import ScheduleRow, plan_time
from delayqueue.core.stopping import repeat
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.services.schedules import tick_request
from delayqueue.services.send import SendRequest, send_messages

log = logging.getLogger(__name__)

PLAN_EVERY_SECONDS = 0.5  # how often an idle planner looks (one indexed query per namespace)
RETRY_AFTER_FAILURE = 0.5
RETRY_MILLIS = 1_000  # a schedule whose tick could not be sent is planned again this much later
CLAIM_LIMIT = 500  # schedules per round
TICKS_PER_ROUND = 20_000  # ticks per round, over all its schedules; the rest wait for the next round
SEND_CHUNK = 200  # ticks per call of the send service
# A round's calls in flight at once. They take turns at Redis (a due promotion then waits behind
# one call's scripts, not all of theirs) while the others write their log rows; with two the
# planner still fell behind 10,000 ticks a second in some runs (docs/benchmarks.md, "Schedules").
SENDS_IN_FLIGHT = 3


class Scheduler:
    def __init__(self, rt, owner: str):
        self.rt = rt
        self.owner = owner
        self._db = LogConnection(rt.config.log_timeout_millis, rt.log_database)
        self._refusals = Outage(log, f"schedule planner {owner}: ticks refused")

    async def run(self, stopping: asyncio.Event) -> None:
        async def step() -> float:
            return 0 if await self.plan_once() >= CLAIM_LIMIT else PLAN_EVERY_SECONDS

        try:
            await repeat(step, stopping, outage=Outage(log, f"schedule planner {self.owner}"),
                         after_failure=self._db.close, retry_seconds=RETRY_AFTER_FAILURE)
        finally:
            await self._db.close()

    async def plan_once(self, now: int | None = None) -> int:
        """One round: claims, sends and records; answers how many schedules it claimed."""
        now = now_millis() if now is None else now
        async with self._db.use() as conn, conn.transaction():
            found = await conn.execute(sql.CLAIM_SCHEDULES, {"namespace": self.rt.ns.namespace, "now": now,
                                                             "limit": CLAIM_LIMIT})
            rows = [ScheduleRow(*row) for row in await found.fetchall()]
            if not rows:
                return 0
            budget = TICKS_PER_ROUND
            plans, saved, refused = [], [], None
            for row in rows:
                if budget <= 0:
                    break  # the rows left keep their plan_at: the next round takes them
                try:
                    plans.append(plan_ticks(row, now, budget))
                except RuleError as exc:
                    # A rule this process cannot read (a time zone its tzdata lacks) holds up no other schedule.
                    refused = refused or RuleError(f"schedule {row.schedule_id!r}: {exc}")
                    saved.append(sql.Planned(row.id, row.planned_until, now + RETRY_MILLIS))
                    continue
                budget -= len(plans[-1].ticks)
            requests = [tick_request(plan.row, tick) for plan in plans for tick in plan.ticks]
            outcomes = await self._send(requests)
            gaps, start = [], 0
            for plan in plans:
                mine, start = outcomes[start:start + len(plan.ticks)], start + len(plan.ticks)
                failed = next((i for i, outcome in enumerate(mine) if isinstance(outcome, QueueError)), None)
                if failed is None:
                    planned_until, plan_at = plan.planned_until, plan_time(plan.row, plan.planned_until)
                else:
                    refused = refused or mine[failed]
                    # The refused tick and those after it are sent again later.
                    planned_until = plan.ticks[failed - 1] if failed else plan.row.planned_until
                    plan_at = now + RETRY_MILLIS
                saved.append(sql.Planned(plan.row.id, planned_until, plan_at))
                if plan.gap is not None and planned_until >= plan.gap.last_tick:
                    gaps.append(plan.gap)
            await conn.execute(sql.SAVE_PLANS, {"rows": orjson.dumps(saved).decode()})
            if gaps:
                await conn.execute(sql.INSERT_GAPS, {"rows": orjson.dumps(gaps).decode()})
        if refused is None:
            self._refusals.ok()
        else:
            self._refusals.failed(str(refused))
        return len(rows)

    async def _send(self, requests: list[SendRequest]) -> list:
        """The sends' outcomes, in order: SEND_CHUNK a call, SENDS_IN_FLIGHT calls at once. A call
        that raises fails the round; no call starts after it, and those in flight are cancelled."""
        in_flight, redis_turn, failed = asyncio.Semaphore(SENDS_IN_FLIGHT), asyncio.Lock(), False

        async def send(chunk: list[SendRequest]) -> list:
            nonlocal failed
            async with in_flight:
                if failed:  # woken by the failed call's room, before the round's cancellation reached it
                    return []
                try:
                    return await send_messages(self.rt, requests=chunk, redis_turn=redis_turn)
                except Exception:
                    failed = True
                    raise

        sends = [asyncio.ensure_future(send(requests[first:first + SEND_CHUNK]))
                 for first in range(0, len(requests), SEND_CHUNK)]
        try:
            chunks = await asyncio.gather(*sends)
        finally:
            for unfinished in sends:  # a failed round sends nothing more
                unfinished.cancel()
        return [outcome for chunk in chunks for outcome in chunk]

    async def close(self) -> None:
        await self._db.close()


@dataclass(frozen=True, slots=True)
class TickPlan:
    """A claimed schedule's ticks to send this round, how far that plans it, and the gap it
    records if it missed ticks."""

    row: ScheduleRow
    ticks: list[int]
    planned_until: int
    gap: sql.Gap | None


def plan_ticks(row: ScheduleRow, now: int, budget: int) -> TickPlan:
    """The ticks of `row` to send at `now`: the missed ones its policy keeps, then those up to
    SCHEDULE_LEAD_MILLIS ahead; at most min(budget, SCHEDULE_MAX_TICKS_PER_ROUND)."""
    limit = min(budget, SCHEDULE_MAX_TICKS_PER_ROUND)
    after, ticks, gap = row.planned_until, [], None
    cutoff = now - SCHEDULE_MISSED_AFTER_MILLIS
    following = row.next_tick(after)
    if following is not None and following <= cutoff:
        if row.catch_up == CatchUp.ALL:
            ticks = row.ticks(after, cutoff, limit)
            count, first, last = len(ticks), ticks[0], ticks[-1]
        else:
            count, first, last = row.missed(after, cutoff)
            ticks = [last] if row.catch_up == CatchUp.LATEST else []
        gap = sql.Gap(row.id, now, first, last, count, len(ticks), row.catch_up)
        after = last
    ticks += row.ticks(after, now + SCHEDULE_LEAD_MILLIS, limit - len(ticks))
    return TickPlan(row, ticks, ticks[-1] if ticks else after, gap)
