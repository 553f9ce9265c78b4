"""Reads for the operators' views (dashboard, /metrics, the admin's message page): per-topic
figures, scanner lags and a message's live state, read from Redis without side effects."""
from delayqueue import selectors
from delayqueue.constants import CHART_MINUTES, LATENESS_BOUNDS_MS, MAX_PRIORITY, PRIORITY_BAND
from delayqueue.live.keys import topic_keys
from delayqueue.messages import Message
from delayqueue.runtime import Runtime

OVERDUE_MILLIS = 5_000  # a waiting message this far past its triggerTime means no scanner promotes it
# The score range [low, high) of each priority 1-9 in a topic's prioritised set.
PRIORITY_BANDS = [((MAX_PRIORITY - p) * PRIORITY_BAND, (MAX_PRIORITY - p + 1) * PRIORITY_BAND)
                  for p in range(1, MAX_PRIORITY + 1)]


def _number(value) -> int:
    return int(value) if value is not None else 0


async def topic_overview(rt: Runtime, *, topics: list[str]) -> list[dict]:
    """What the dashboard and /metrics show per topic: getTopicInfo, the last complete monitor
    interval's counters, lifetime totals, the lateness histogram and per-minute series, how
    many waiting messages are overdue, how long the oldest ready message has been due, and how
    many lifecycle events wait for the log writer. Unknown topics give zeros."""
    if not topics:
        return []
    infos = await selectors.topic_infos(rt, topics=topics)
    now = await selectors.redis_millis(rt)
    interval = rt.config.monitor_interval_millis
    previous = now // interval - 1
    pipe = rt.redis.pipeline(transaction=False)
    for topic in topics:
        k = rt.ns.topic(topic)
        pipe.hgetall(k.stats)
        pipe.zcount(k.waiting, "-inf", now - OVERDUE_MILLIS)
        pipe.xlen(k.events)
        pipe.lindex(k.ready, -1)  # the oldest ready id of priority 0: pulls take from the tail
        pipe.exists(k.prioritised)
    replies = await pipe.execute()
    oldest_ids = {topic: [replies[5 * i + 3]] if replies[5 * i + 3] else [] for i, topic in enumerate(topics)}
    prioritised = [topic for i, topic in enumerate(topics) if replies[5 * i + 4]]
    if prioritised:
        # The oldest ready message of each priority heads its band (lua/includes/ready_queue.lua).
        pipe = rt.redis.pipeline(transaction=False)
        for topic in prioritised:
            for low, high in PRIORITY_BANDS:
                pipe.zrangebyscore(rt.ns.topic(topic).prioritised, low, f"({high}", start=0, num=1)
        heads = iter(await pipe.execute())
        for topic in prioritised:
            for _band in PRIORITY_BANDS:
                oldest_ids[topic] += next(heads)
    pipe = rt.redis.pipeline(transaction=False)
    wanted = [(topic, msg_id) for topic, ids in oldest_ids.items() for msg_id in ids]
    for topic, msg_id in wanted:
        pipe.hget(rt.ns.topic(topic).msgs, msg_id)
    bodies: dict[str, list[str]] = {}
    for (topic, _), raw in zip(wanted, await pipe.execute() if wanted else []):
        if raw:
            bodies.setdefault(topic, []).append(raw)
    this_minute = now // 60_000
    overviews = []
    for i, info in enumerate(infos):
        stats, overdue, backlog = replies[5 * i:5 * i + 3]
        oldest = min((Message.from_stored(raw).trigger_time for raw in bodies.get(info["topic"], [])), default=None)
        last = {name: _number(stats.get(f"{previous}:{name}")) for name in selectors.REQUEST_COUNTERS}
        series = []
        for minute in range(this_minute - CHART_MINUTES + 1, this_minute + 1):
            count = _number(stats.get(f"m{minute}:lateness:count"))
            series.append({
                "minute": minute,
                "count": count,
                "avg": _number(stats.get(f"m{minute}:lateness:sum")) / count if count else None,
                "max": _number(stats.get(f"m{minute}:lateness:max")) if count else None,
            })
        overviews.append({
            **info,
            "overdue": overdue,
            "log_backlog": backlog,
            "oldest_ready_age_ms": max(now - oldest, 0) if oldest is not None else 0,
            "last_interval": last,
            "interval_seconds": rt.config.monitor_interval_seconds,
            "totals": {name: _number(stats.get(f"total:{name}")) for name in selectors.REQUEST_COUNTERS},
            "lateness_buckets": [
                (bound, _number(stats.get(f"lateness:le:{bound}"))) for bound in LATENESS_BOUNDS_MS
            ] + [(None, _number(stats.get("lateness:le:inf")))],
            "lateness_sum_ms": _number(stats.get("lateness:sum")),
            "lateness_count": _number(stats.get("lateness:count")),
            "lateness_series": series,
        })
    return overviews


SCANNER_REPORT_STALE_MILLIS = 10_000  # a scanner that has not reported for this long is gone


async def scanner_lags(rt: Runtime) -> dict[str, float]:
    """Each running scanner's latest event-loop lag in ms (see Scanner._report_lag)."""
    now = await selectors.redis_millis(rt)
    lags = {}
    for token, value in (await rt.redis.hgetall(rt.ns.scanners)).items():
        lag, _, reported = value.partition(":")
        if now - int(reported or 0) <= SCANNER_REPORT_STALE_MILLIS:
            lags[token] = float(lag)
    return lags


async def live_state(rt: Runtime, *, namespace: str, topic: str, msg_id: str) -> dict:
    """Where a message is in Redis right now, read without side effects (unlike getMsg, which
    counts a request and ends an expired message): its stored body and every structure holding it."""
    k = topic_keys(namespace, topic)
    pipe = rt.redis.pipeline(transaction=False)
    pipe.hget(k.msgs, msg_id)
    pipe.zscore(k.waiting, msg_id)
    pipe.lpos(k.ready, msg_id)
    pipe.zscore(k.prioritised, msg_id)
    pipe.zscore(k.inflight, msg_id)
    pipe.zscore(k.ended, msg_id)
    raw, waiting, ready_pos, prioritised, ack_deadline, purge_at = await pipe.execute()
    return {
        "message": None if raw is None else Message.from_stored(raw).to_wire(),
        "waiting_until": None if waiting is None else int(waiting),
        "in_ready_list": ready_pos is not None or prioritised is not None,
        "ack_deadline": None if ack_deadline is None else int(ack_deadline),
        "purge_at": None if purge_at is None else int(purge_at),
    }
