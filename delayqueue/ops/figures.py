"""Reads for the operators' views (dashboard, /metrics, the admin's message page): per-topic
figures, scanner lags and a message's live state, read from Redis without side effects."""
from delayqueue import selectors
from delayqueue.constants import CHART_MINUTES, LATENESS_BOUNDS_MS
from delayqueue.live.keys import topic_keys
from delayqueue.messages import Message
from delayqueue.runtime import Runtime

OVERDUE_MILLIS = 5_000  # a waiting message this far past its triggerTime means no scanner promotes it


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
        pipe.lindex(k.ready, -1)  # the oldest ready id: pulls take from the tail
    replies = await pipe.execute()
    oldest_ids = {topic: replies[4 * i + 3] for i, topic in enumerate(topics) if replies[4 * i + 3]}
    pipe = rt.redis.pipeline(transaction=False)
    for topic, msg_id in oldest_ids.items():
        pipe.hget(rt.ns.topic(topic).msgs, msg_id)
    bodies = dict(zip(oldest_ids, await pipe.execute())) if oldest_ids else {}
    this_minute = now // 60_000
    overviews = []
    for i, info in enumerate(infos):
        stats, overdue, backlog = replies[4 * i:4 * i + 3]
        oldest = bodies.get(info["topic"])
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
            "oldest_ready_age_ms": max(now - Message.from_stored(oldest).trigger_time, 0) if oldest else 0,
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
    pipe.zscore(k.inflight, msg_id)
    pipe.zscore(k.ended, msg_id)
    raw, waiting, ready_pos, ack_deadline, purge_at = await pipe.execute()
    return {
        "message": None if raw is None else Message.from_stored(raw).to_wire(),
        "waiting_until": None if waiting is None else int(waiting),
        "in_ready_list": ready_pos is not None,
        "ack_deadline": None if ack_deadline is None else int(ack_deadline),
        "purge_at": None if purge_at is None else int(purge_at),
    }
