"""Reads for the operators' views (dashboard, /metrics, the admin's message and topic pages):
per-topic figures, scanner lags and a message's live state, read from Redis without side
effects; dead-letter counts and running redrives, read from the message log."""
from dataclasses import dataclass

from delayqueue.core.constants import CHART_MINUTES, LATENESS_BOUNDS_MS, MAX_PRIORITY, PRIORITY_BAND
from delayqueue.core.messages import Message
from delayqueue.live import stats
from delayqueue.live.keys import Meta
from delayqueue.live.push_counts import TopicPushFigures, bucket_quantile, topic_figures
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import one_use
from delayqueue.messagelog.dead_letters import Task, left_to_move
from delayqueue.messagelog.routing import by_database
from delayqueue.runtime import Runtime
from delayqueue.services.messages import holding_shards, redis_millis
from delayqueue.services.topics import TopicInfo, topic_infos, topic_shard_lists

OVERDUE_MILLIS = 5_000  # a waiting message this far past its triggerTime means no scanner promotes it
# The score range [low, high) of each priority 1-9 in a topic's prioritised set.
PRIORITY_BANDS = [((MAX_PRIORITY - p) * PRIORITY_BAND, (MAX_PRIORITY - p + 1) * PRIORITY_BAND)
                  for p in range(1, MAX_PRIORITY + 1)]


def _number(value) -> int:
    return int(value) if value is not None else 0


async def topic_overview(rt: Runtime, *, topics: list[str]) -> list[dict]:
    """What the dashboard and /metrics show per topic: its queue sizes (TopicInfo's), the last complete monitor
    interval's counters, lifetime totals, the lateness histogram and per-minute series, how
    many waiting messages are overdue, how long the oldest ready message has been due, how
    many lifecycle events wait for the log writer, whether it is paused, and for a topic with a
    push URL (or push figures) its pushes (`push`, else None). Unknown topics give zeros."""
    if not topics:
        return []
    now = await redis_millis(rt)
    infos = await topic_infos(rt, topics=topics, now=now)
    places = await topic_shard_lists(rt, topics=topics)
    shards = [shard for mine in places for shard in mine]
    interval = rt.config.monitor_interval_millis
    previous = now // interval - 1
    pipe = rt.redis.pipeline(transaction=False)
    for shard in shards:
        k = rt.ns.topic(shard)
        pipe.hgetall(k.stats)
        pipe.zcount(k.waiting, "-inf", now - OVERDUE_MILLIS)
        pipe.xlen(k.events)
        pipe.lindex(k.ready, -1)  # the oldest ready id of priority 0: pulls take from the tail
        pipe.exists(k.prioritised)
        pipe.hmget(k.meta, Meta.PAUSED, Meta.PUSH, Meta.HOT_UNTIL)  # the pause as the pull script reads it
    pipe.hgetall(rt.ns.pushes)
    *replies, push_counts = await pipe.execute()
    pushes = topic_figures(push_counts)
    per_shard = [replies[6 * i:6 * i + 6] for i in range(len(shards))]
    oldest_ids = {shard: [mine[3]] if mine[3] else [] for shard, mine in zip(shards, per_shard)}
    prioritised = [shard for shard, mine in zip(shards, per_shard) if mine[4]]
    if prioritised:
        # The oldest ready message of each priority heads its band (lua/includes/ready_queue.lua).
        pipe = rt.redis.pipeline(transaction=False)
        for shard in prioritised:
            for low, high in PRIORITY_BANDS:
                pipe.zrangebyscore(rt.ns.topic(shard).prioritised, low, f"({high}", start=0, num=1)
        heads = iter(await pipe.execute())
        for shard in prioritised:
            for _band in PRIORITY_BANDS:
                oldest_ids[shard] += next(heads)
    pipe = rt.redis.pipeline(transaction=False)
    wanted = [(shard, msg_id) for shard, ids in oldest_ids.items() for msg_id in ids]
    for shard, msg_id in wanted:
        pipe.hget(rt.ns.topic(shard).msgs, msg_id)
    oldest_ready: dict[str, list[Message]] = {}
    for (shard, msg_id), raw in zip(wanted, await pipe.execute() if wanted else []):
        if raw:
            oldest_ready.setdefault(shard.topic, []).append(Message.from_stored(raw, msg_id))
    this_minute = now // 60_000
    overviews = []
    mine = iter(per_shard)
    for info, its_shards in zip(infos, places):
        figures = [next(mine) for _ in its_shards]
        counts = stats.added([fields for fields, *_ in figures])
        overdue, backlog = sum(f[1] for f in figures), sum(f[2] for f in figures)
        paused, push, _ = figures[0][5]  # the settings' mirror is every shard's
        # A sharded topic's shards have a window each, raised together: the nearest is the topic's.
        hot_until = min((int(f[5][2]) for f in figures if f[5][2] is not None), default=None)
        oldest = min((m.trigger_time for m in oldest_ready.get(info.topic, [])), default=None)

        def number(template: str, **values) -> int:
            return _number(counts.get(stats.field(template, **values)))

        series = []
        for minute in range(this_minute - CHART_MINUTES + 1, this_minute + 1):
            count = number("minute_lateness", minute=minute, part=stats.Part.COUNT)
            series.append({
                "minute": minute,
                "count": count,
                "avg": number("minute_lateness", minute=minute, part=stats.Part.SUM) / count if count else None,
                "max": number("minute_lateness", minute=minute, part=stats.Part.MAX) if count else None,
            })
        overviews.append({
            "topic": info.topic,
            "waiting": info.waiting,
            "waiting_cold": info.waiting_cold,
            "waiting_within": info.waiting_within,
            "ready": info.ready,
            "consuming": info.consuming,
            "overdue": overdue,
            "log_backlog": backlog,
            "paused": paused == "1",
            # The cold tier: how far ahead of now Redis holds every waiting message (None: no window).
            "hot_ahead_ms": None if hot_until is None else hot_until - now,
            "push": _push_overview(info, push == "1", pushes.get(info.topic)),
            "oldest_ready_age_ms": max(now - oldest, 0) if oldest is not None else 0,
            "last_interval": {counter: number("counter", interval=previous, name=counter) for counter in stats.Counter},
            "interval_seconds": rt.config.monitor_interval_seconds,
            "totals": {counter: number("total", name=counter) for counter in stats.Counter},
            "lateness_buckets": [(bound, number("lateness_bucket", bound=bound)) for bound in LATENESS_BOUNDS_MS]
            + [(None, number("lateness_bucket", bound=stats.LATENESS_OVERFLOW))],
            "lateness_sum_ms": number("lateness", part=stats.Part.SUM),
            "lateness_count": number("lateness", part=stats.Part.COUNT),
            "lateness_series": series,
        })
    return overviews


def _push_overview(info: TopicInfo, has_url: bool, figures: TopicPushFigures | None) -> dict | None:
    """A topic's push figures as the dashboard and /metrics show them; in flight: its in-flight
    messages, which are all pushes while it has a push URL."""
    if not has_url and figures is None:
        return None
    figures = figures or TopicPushFigures()
    buckets = figures.lateness_buckets
    return {"url_set": has_url, "pushed": figures.pushed, "failed": sum(figures.failures.values()),
            "failures": sorted(figures.failures.items()), "in_flight": info.consuming if has_url else 0,
            "lateness_buckets": buckets, "lateness_sum_ms": figures.lateness_sum_ms,
            "lateness_p50_ms": bucket_quantile(buckets, 0.5), "lateness_p99_ms": bucket_quantile(buckets, 0.99)}


SCANNER_REPORT_STALE_MILLIS = 10_000  # a scanner that has not reported for this long is gone


async def scanner_lags(rt: Runtime) -> dict[str, float]:
    """Each running scanner's latest event-loop lag in ms (see Scanner._report_lag)."""
    now = await redis_millis(rt)
    lags = {}
    for token, value in (await rt.redis.hgetall(rt.ns.scanners)).items():
        lag, _, reported = value.partition(":")
        if now - int(reported or 0) <= SCANNER_REPORT_STALE_MILLIS:
            lags[token] = float(lag)
    return lags


async def live_state(rt: Runtime, *, namespace: str, topic: str, msg_id: str) -> dict:
    """Where a message is in Redis right now, read without side effects (unlike getMsg, which
    counts a request and ends an expired message): its stored body and every structure holding it,
    in the shard that holds it (a sharded topic's)."""
    rt = rt.for_namespace(namespace)
    [shard] = await holding_shards(rt, topic=topic, msg_ids=[msg_id])
    k = rt.ns.topic(shard)
    pipe = rt.redis.pipeline(transaction=False)
    pipe.hget(k.msgs, msg_id)
    pipe.zscore(k.waiting, msg_id)
    pipe.lpos(k.ready, msg_id)
    pipe.zscore(k.prioritised, msg_id)
    pipe.zscore(k.inflight, msg_id)
    pipe.zscore(k.ended, msg_id)
    raw, waiting, ready_pos, prioritised, ack_deadline, purge_at = await pipe.execute()
    return {
        "message": None if raw is None else Message.from_stored(raw, msg_id).to_wire(),
        "waiting_until": None if waiting is None else int(waiting),
        "in_ready_list": ready_pos is not None or prioritised is not None,
        "ack_deadline": None if ack_deadline is None else int(ack_deadline),
        "purge_at": None if purge_at is None else int(purge_at),
    }


# A backoff never waits longer than its topic's retryBackoffMaxMillis, so the messages waiting
# for one are among those due within it; at most this many of them are read.
BACKOFF_SCAN_LIMIT = 10_000


async def waiting_after_delivery(rt: Runtime, *, topic: str, within_millis: int) -> tuple[int, bool]:
    """How many waiting messages due within `within_millis` have been delivered before (retry >
    0: given back by their ack timeout or a nack, waiting out a backoff or a nack's delay), read
    from their bodies; and whether the scan stopped at BACKOFF_SCAN_LIMIT (then the count is a
    lower bound). The waiting set holds only trigger times, so this reads bodies: one topic's
    page, not every scrape. A sharded topic's shards are read each up to the limit."""
    now = await redis_millis(rt)
    count, capped = 0, False
    for shard in (await topic_shard_lists(rt, topics=[topic]))[0]:
        k = rt.ns.topic(shard)
        ids = await rt.redis.zrangebyscore(k.waiting, "-inf", now + within_millis, start=0,
                                           num=BACKOFF_SCAN_LIMIT + 1)
        capped |= len(ids) > BACKOFF_SCAN_LIMIT
        for start in range(0, min(len(ids), BACKOFF_SCAN_LIMIT), 1000):
            page = ids[start:start + 1000]
            bodies = await rt.redis.hmget(k.msgs, page)
            count += sum(1 for msg_id, raw in zip(page, bodies)
                         if raw is not None and Message.from_stored(raw, msg_id).retry > 0)
    return count, capped


@dataclass(frozen=True)
class RunningRedrive:
    task_id: int
    namespace: str
    topic: str
    max_per_second: int
    moved: int
    left: int


async def log_figures(rt: Runtime, *, namespaces: list[str], topic: str | None = None
                      ) -> tuple[dict[tuple[str, str], int], list[RunningRedrive]]:
    """Dead letters per (namespace, topic) and the unfinished redrive tasks with their progress,
    of the namespaces given (of one topic when given): two statements on one connection, and one
    more per unfinished task.
    Raises LogUnavailable."""
    dead: dict[tuple[str, str], int] = {}
    redrives = []
    for database, in_database in by_database(namespaces).items():
        scope = {"namespaces": in_database, "topic": topic}
        async with one_use(rt.config.log_timeout_millis, database) as conn:
            found = await conn.execute(sql.DEAD_COUNTS, scope)
            dead.update({(namespace, name): count for namespace, name, count in await found.fetchall()})
            found = await conn.execute(sql.RUNNING_REDRIVES, scope)
            for namespace, *row in await found.fetchall():
                task = Task(*row)
                redrives.append(RunningRedrive(task.id, namespace, task.topic, task.max_per_second, task.moved,
                                               await left_to_move(conn, namespace=namespace, task=task)))
    return dead, redrives
