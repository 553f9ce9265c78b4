"""Rebuilding Redis from the message log after a loss: `manage.py restore`, the
restore endpoints, the admin's restore action and the Spark restore all come through here.

A logged message that is live (waiting, ready or in flight) goes back waiting if it is not yet
due and ready otherwise, with its logged triggerTime, expireTime and retry count. A msgId Redis
still holds is left alone, so a restore is idempotent and safe while the service runs; a rerun
after an interrupted one finishes it. Every restored message gets a 'restored' history row. The
topics' settings go back into their Redis mirrors first (stores/topic_settings.py).
"""
import asyncio
import json
import shlex
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice

import psycopg
from psycopg.rows import dict_row

from delayqueue.config.settings import QueueConfig
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import COLD_HOUR_MILLIS, IN_FLIGHT_MILLIS, LIVE_STATUSES, Status
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard, parse_position, position
from delayqueue.live.shards import deal_hours, shard_of, topic_shards
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import connect, log_unavailable
from delayqueue.runtime import Runtime
from delayqueue.services.caps import restore_turn
from delayqueue.services.send import target_shards
from delayqueue.services.topics import write_mirrors
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings

PAGE_ROWS = 10_000

PAGES_IN_FLIGHT = 3

SCRIPT_MESSAGES = 500  # messages per restore script call: long enough to amortise, short enough not to stall Redis
# A page's calls sent at a time. The restore shares its process' Redis connection, which Redis serves
# in order: a pull of the web process waited behind every call of the pages in flight (60, up to 430 ms).
CALLS_PER_TRIP = 4
# Rows read or built between two returns to the event loop: the web process' loop serves other namespaces
# meanwhile, and a page of 10,000 rows built at once held it 40-70 ms.
ROWS_PER_TURN = 500


@dataclass
class RestoreCounts:
    restored: int = 0
    already_live: int = 0  # Redis already holds the msgId
    skipped: int = 0  # ended, or past its TTL without --include-expired
    left_cold: int = 0  # waiting in the message log only, for the loader (the cold tier)

    def __iadd__(self, other: "RestoreCounts") -> "RestoreCounts":
        self.restored += other.restored
        self.already_live += other.already_live
        self.skipped += other.skipped
        self.left_cold += other.left_cold
        return self

    @property
    def seen(self) -> int:
        return self.restored + self.already_live + self.skipped + self.left_cold


def restorable(row: dict, now: int, include_expired: bool) -> dict | None:
    """The row as it should go back into Redis, or None when it stays out. With include_expired a
    message whose TTL ran out (live past it, or expired before it was ever delivered) comes back
    with the TTL it was sent with (the row's `ttl`, sql.RESTORE_TTL) anew, from when it is due."""
    status = row["status"]
    expired = status == Status.EXPIRED or (status in LIVE_STATUSES and row["expire_time"] <= now)
    if expired and include_expired:
        return {**row, "expire_time": max(now, row["trigger_time"]) + max(row["ttl"], 1)}
    if status in LIVE_STATUSES and not expired:
        return row
    return None


async def restore_rows(rt: Runtime, *, rows: Iterable[dict], include_expired: bool = False, dry_run: bool = False,
                       settings: dict[str, TopicSettings] | None = None, cold_counted: bool = False) -> RestoreCounts:
    """Puts logged messages back into Redis (see the module doc), each into its shard. Each row:
    Message.to_row()'s columns (times as epoch ms) and its `id`; other columns are ignored. `settings`: the
    namespace's topic settings as the caller read them (default: the runtime's). `cold_counted`:
    the caller has set the topics' cold counts (sets_cold_counts); else each message brought back
    that was cold, or packed, is counted out of them (and out of its packed list).
    Works ROWS_PER_TURN rows at a time, giving the event loop back between; a shard's messages go
    SCRIPT_MESSAGES a call, sent CALLS_PER_TRIP calls a round trip as they fill."""
    now = now_millis()
    counts = RestoreCounts()
    filling: dict[Shard, list[tuple]] = defaultdict(list)  # per shard, the messages of its next call
    calls: list[scripts.ScriptCall] = []
    shards: set[Shard] = set()

    def call(shard: Shard, messages: list[tuple]) -> scripts.ScriptCall:
        return scripts.restore(rt.context, shard, dry_run=dry_run, with_times=include_expired,
                               cold_counted=cold_counted, messages=messages)

    async def send(trip: list[scripts.ScriptCall]) -> None:
        for result in await rt.scripts.run_all(trip, per_trip=CALLS_PER_TRIP):
            counts.restored += result.restored
            counts.already_live += result.already_held

    left = iter(rows)
    while part := list(islice(left, ROWS_PER_TURN)):
        going, row_ids = [], []
        for row in part:
            ready = restorable(row, now, include_expired)
            if ready is None:
                counts.skipped += 1
            else:
                going.append(Message.from_row(ready))
                row_ids.append(row["id"])
        placed = await target_shards(rt, going, going, settings=settings)
        shards.update(placed)
        for m, row_id, shard in zip(going, row_ids, placed):
            messages = filling[shard]
            messages.append((m.msg_id, m.payload, m.produce_time, m.trigger_time, m.expire_time, m.max_retry, m.retry,
                             m.priority, row_id))
            if len(messages) == SCRIPT_MESSAGES:
                calls.append(call(shard, filling.pop(shard)))
        await asyncio.sleep(0)  # the slice's work and a trip's (its calls packed) in turns of their own
        if len(calls) >= CALLS_PER_TRIP:
            await send(calls)
            calls = []
    await send(calls + [call(shard, messages) for shard, messages in filling.items()])
    if counts.restored and not dry_run:
        await rt.scripts.call(scripts.register_topics(rt.context, at=now,
                                                      topics=list({shard.topic for shard in shards})))
    return counts


async def restore(rt: Runtime, *, topic: str | None = None, msg_id: str | None = None, ids: list[int] | None = None,
                  include_expired: bool = False, dry_run: bool = False,
                  progress: Callable[[RestoreCounts, int], None] | None = None) -> RestoreCounts:
    """Restores every logged message in scope (the namespace's; of `topic`, `msg_id`, the log rows
    `ids` if given) that should be live. Reads the log in id order, a
    page at a time, while earlier pages are written to Redis (reading, building the script calls
    and Redis' work overlap), and reports progress (counts so far, total candidates) per page.
    Raises LogUnavailable when the log fails part-way; what was restored stays, and a rerun
    finishes the rest. A full restore clears the scanners' report that Redis lost its data. One
    restore of a namespace runs at a time: Throttled (429) while another runs (caps.restore_turn)."""
    try:
        async with restore_turn(rt):
            if not dry_run:
                await restore_topic_settings(rt, topic=topic)
            counts = await _restore(rt, topic, msg_id, ids, include_expired, dry_run, progress)
    except psycopg.Error as exc:
        raise log_unavailable(exc) from None
    if answers_loss_report(topic, msg_id, dry_run, ids):
        # The marker too: a scanner that had not looked since the loss would report it after this.
        await rt.redis.set(rt.ns.marker, now_millis(), nx=True)
        await rt.redis.delete(rt.ns.data_lost)
    return counts


async def restore_topic_settings(rt: Runtime, *, topic: str | None = None,
                                 table: dict[str, TopicSettings] | None = None) -> None:
    """Writes the topics' settings (pause, backoff, dead letters) back into their Redis mirrors
    from PostgreSQL, before their messages come back: a paused topic's restored messages are not
    handed out. `table`: the namespace's settings as read by the caller (spark.restore, from its
    own database); default: read now."""
    if table is None:
        table = await rt.topic_configs.fresh()
    await write_mirrors(rt, {name: settings for name, settings in table.items() if topic in (None, name)})


def nothing_matches(topic: str | None, msg_id: str | None) -> str | None:
    """A command line's error for a restore scoped to a topic or msgId that no log row matches (as
    the restore endpoints' 404: a mistyped one must not read as success); None for a full restore.
    Quoted as a shell would take it back: a topic may have spaces or quotes."""
    if topic is None and msg_id is None:
        return None
    scope = " ".join(f"--{name} {shlex.quote(value)}" for name, value in (("topic", topic), ("msg-id", msg_id))
                     if value is not None)
    return f"no message in the message log matches {scope}"


def sets_cold_counts(config: QueueConfig, msg_id: str | None, ids: list[int] | None = None) -> bool:
    """Whether a restore in this scope sets its topics' cold counts (count_and_leave_cold): one of a
    topic or of all, in the cold tier. One of a single message, or of chosen rows, brings them back
    counted out instead."""
    return config.cold_tier and msg_id is None and ids is None


def answers_loss_report(topic: str | None, msg_id: str | None, dry_run: bool, ids: list[int] | None = None) -> bool:
    """Whether a restore in this scope answers a scanner's report that Redis lost its data: a
    full one (every topic, every message) that writes."""
    return topic is None and msg_id is None and ids is None and not dry_run


async def _restore(rt: Runtime, topic: str | None, msg_id: str | None, ids: list[int] | None, include_expired: bool,
                   dry_run: bool, progress: Callable[[RestoreCounts, int], None] | None) -> RestoreCounts:
    scope, candidates, params = sql.restore_scope(rt.ns.namespace, topic, msg_id, include_expired, ids)
    counts = RestoreCounts()
    async with await connect(rt.config.log_timeout_millis, rt.log_database) as conn:
        params, scanned = await count_and_leave_cold(rt, conn, scope=scope, candidates=candidates, params=params,
                                                     topic=topic, msg_id=msg_id, ids=ids, dry_run=dry_run)
        page = sql.restore_page(scope, candidates, rt.config.cold_tier)
        total = ended = 0  # total: every candidate, those left cold too (done from the start)
        for _name, _hour, candidates_in_group, rest, left in scanned:
            total, ended, counts.left_cold = total + candidates_in_group + left, ended + rest, counts.left_cold + left
        if progress:
            progress(counts, total)
        writing: set[asyncio.Task] = set()

        async def collect(when) -> None:
            nonlocal counts, writing
            done, writing = await asyncio.wait(writing, return_when=when)
            for task in done:
                counts += task.result()  # raises the first Redis error
            if progress:
                progress(counts, total)

        try:
            last_id = 0
            async with conn.cursor(row_factory=dict_row) as cursor:
                while True:
                    await cursor.execute(page, {**params, "after": last_id, "limit": PAGE_ROWS})
                    rows = []
                    while part := await cursor.fetchmany(ROWS_PER_TURN):
                        rows += part
                        await asyncio.sleep(0)
                    if not rows:
                        break
                    last_id = rows[-1]["id"]
                    writing.add(asyncio.ensure_future(
                        restore_rows(rt, rows=rows, include_expired=include_expired, dry_run=dry_run,
                                     cold_counted=sets_cold_counts(rt.config, msg_id, ids))))
                    if len(writing) >= PAGES_IN_FLIGHT:
                        await collect(asyncio.FIRST_COMPLETED)
            if writing:
                await collect(asyncio.ALL_COMPLETED)
        finally:
            for task in writing:
                task.cancel()
            # Wait for them to end (an interrupt closes Redis next), and retrieve how they ended.
            await asyncio.gather(*writing, return_exceptions=True)
    counts.skipped += ended
    return counts


async def count_and_leave_cold(rt: Runtime, conn, *, scope, candidates, params: dict, topic: str | None,
                               msg_id: str | None, dry_run: bool, settings: dict[str, TopicSettings] | None = None,
                               ids: list[int] | None = None) -> tuple[dict, list[tuple]]:
    """What a restore does before its messages: in the cold tier, finds each topic's loader position
    (the rows after it stay in the log), sets the topics' cold counts and registers the topics
    left cold. Answers the params of sql.restore_page (with the positions) and one scan's counts
    (sql.restore_counts' rows: per topic and hour, the candidates, the rest, those left cold).
    `settings`: the namespace's topic settings as the caller read them (default: the runtime's)."""
    cold = rt.config.cold_tier
    positions = await _loader_positions(rt, await _waiting_topics(rt, conn, scope, params, topic, msg_id, ids),
                                        dry_run, settings) if cold else []
    if cold:
        params = {**params, "cold_after": json.dumps(positions)}
    scanned = await (await conn.execute(sql.restore_counts(scope, candidates, cold=cold), params)).fetchall()
    # Per topic, per hour; every topic with waiting rows has one: what was counted cold before
    # may have been packed (lua/includes/packed.lua), and the restore brings those back.
    left_cold: dict[str, dict[int, int]] = {position["cold_topic"]: {} for position in positions}
    for name, hour, _candidates, _rest, left in scanned:
        if left:
            left_cold.setdefault(name, {})[hour] = left
    if left_cold and not dry_run and sets_cold_counts(rt.config, msg_id, ids):
        young = await (await conn.execute(sql.restore_young_cold(scope, candidates),
                                          {**params, "young_after": now_millis() - 2 * IN_FLIGHT_MILLIS})).fetchall()
        await _set_cold_counts(rt, await _less_held(rt, left_cold, positions, settings), young, settings)
    if not dry_run and (cold_topics := [name for name, hours in left_cold.items() if hours]):
        # The loaders work registered topics only: one whose messages all stay cold has none
        # restored to register it, and they would never be loaded.
        await rt.scripts.call(scripts.register_topics(rt.context, at=now_millis(), topics=cold_topics))
    return params, scanned


async def _waiting_topics(rt: Runtime, conn, scope, params: dict, topic: str | None, msg_id: str | None,
                          ids: list[int] | None) -> list[str]:
    """The topics in a restore's scope with waiting rows in the log: a restore of chosen messages (a
    msgId, row ids) raises no other topic's window, and sets no count (sets_cold_counts)."""
    if topic is not None:
        return [topic]
    statement, params = ((sql.WAITING_TOPICS, {"namespace": rt.ns.namespace}) if msg_id is None and ids is None
                         else (sql.scoped_waiting_topics(scope), params))
    return [name for (name,) in await (await conn.execute(statement, params)).fetchall()]


async def _loader_positions(rt: Runtime, topics: list[str], dry_run: bool,
                            settings: dict[str, TopicSettings] | None) -> list[dict]:
    """Per topic of `topics` (those in scope with waiting rows in the log), where
    its loader stands: the restore brings back the rows up to there and leaves those after it to
    the loader, so a restore after a loss rebuilds only the hot window. The loader stands at its
    fetched_to where it has one: the rows in its packed lists (lua/includes/packed.lua) are
    brought back too, and the scanner then finds each held and leaves it. A topic without a
    window (Redis lost it) gets one first, as the loader's step 1 would give it (hot_until now +
    window, loaded up to there); a dry run only looks. A sharded topic stands where the furthest of its current count's shards does:
    a row brought back before another shard's position is one its loader then finds held."""
    settings = settings if settings is not None else await rt.topic_configs.table()
    every = {name: topic_shards(name, settings.get(name, DEFAULT_SETTINGS).shard_counts) for name in topics}
    hot_until = now_millis() + rt.config.hot_window_millis
    shards = [shard for name in topics for shard in every[name]]
    if dry_run:
        pipe = rt.redis.pipeline(transaction=False)
        for shard in shards:
            pipe.hmget(rt.ns.topic(shard).meta, [Meta.FETCHED_TO, Meta.LOADED_TO])
        read = await pipe.execute() if shards else []
        loaded_to = [fetched or loaded or position(hot_until) for fetched, loaded in read]
    else:
        windows = await rt.scripts.run_all([
            scripts.raise_hot(rt.context, shard, hot_until=hot_until, loaded_to=position(hot_until), start=True,
                              signed=settings.get(shard.topic, DEFAULT_SETTINGS).sharded)
            for shard in shards])
        loaded_to = [window.loaded_to for window in windows]
    at = dict(zip(shards, loaded_to))
    furthest = {name: max((at[shard] for shard in every[name]
                           if shard.count == settings.get(name, DEFAULT_SETTINGS).shards), key=parse_position)
                for name in topics}
    return [dict(zip(("cold_topic", "after_time", "after_id"), (name, *parse_position(furthest[name]))))
            for name in topics]


async def _less_held(rt: Runtime, left: dict[str, dict[int, int]], positions: list[dict],
                     settings: dict[str, TopicSettings] | None) -> dict[str, dict[int, int]]:
    """`left` (per topic, per hour, its rows after its loader position) less the messages its
    shards' waiting sets hold due in that hour after the position: a restore run while Redis keeps
    its data finds them there (sent hot after the window rose past them, rescheduled or nacked
    beyond it), and they are not cold."""
    settings = settings if settings is not None else await rt.topic_configs.table()
    after = {at["cold_topic"]: at["after_time"] for at in positions}
    asked = [(name, hour, shard) for name, hours in left.items() for hour in hours
             for shard in topic_shards(name, settings.get(name, DEFAULT_SETTINGS).shard_counts)]
    pipe = rt.redis.pipeline(transaction=False)
    for name, hour, shard in asked:
        pipe.zcount(rt.ns.topic(shard).waiting, max(hour * COLD_HOUR_MILLIS, after[name] + 1),
                    (hour + 1) * COLD_HOUR_MILLIS - 1)
    less = {name: dict(hours) for name, hours in left.items()}
    for (name, hour, _shard), held in zip(asked, await pipe.execute() if asked else []):
        less[name][hour] -= held
    return {name: {hour: n for hour, n in hours.items() if n > 0} for name, hours in less.items()}


async def _set_cold_counts(rt: Runtime, left: dict[str, dict[int, int]], young: list[tuple[str, str, int]],
                           settings: dict[str, TopicSettings] | None) -> None:
    """Sets each topic's count of cold messages and their hours (its meta's and cold_hours, which
    getTopicInfo and the caps read, and which went with a lost Redis) to the rows the restore
    leaves to its loader, `left` per topic per hour: a sharded topic's dealt over its current count's
    shards (deal_hours), its other counts' parts at 0. A send going cold between the count and the
    write may be missed; the loader drops the count once it finds nothing left after the window.
    The rows counted that were sent just before, `young` (topic, msgId, produceTime), are noted in
    their shard's cold_sent as send.lua notes the sends it counts: the loader counts so young a row
    out only if noted, and a send whose script runs after this does not count it again."""
    settings = settings if settings is not None else await rt.topic_configs.table()
    pipe = rt.redis.pipeline(transaction=False)
    for name, msg_id, produced in young:
        k = rt.ns.topic(shard_of(name, msg_id, settings.get(name, DEFAULT_SETTINGS).shards))
        pipe.zadd(k.cold_sent, {msg_id: produced})
        pipe.pexpire(k.cold_sent, 2 * IN_FLIGHT_MILLIS)
    for name, hours in left.items():
        counts = settings.get(name, DEFAULT_SETTINGS).shard_counts
        current = topic_shards(name, counts[:1])
        parts = dict(zip(current, deal_hours(hours, len(current))))
        for shard in topic_shards(name, counts):
            k, part = rt.ns.topic(shard), parts.get(shard, {})
            pipe.delete(k.cold_hours)
            pipe.hset(k.meta, Meta.COLD, sum(part.values()))
            if part:
                pipe.hset(k.cold_hours, mapping=part)
    await pipe.execute()

