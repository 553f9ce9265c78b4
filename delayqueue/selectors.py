"""Reads: messages, topic sizes and the monitor figures."""
import time

from delayqueue.live.keys import topic_keys
from delayqueue.messages import decode_message
from delayqueue.runtime import Runtime

# getTopicInfo's waiting-delay buckets (camellia's names), as upper bounds from now in ms.
# Ranges are half-open (lower, upper] so a message is counted once; the first takes overdue ones.
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
WAITING_BUCKETS = (
    ("sizeOf0To1min", MINUTE),
    ("sizeOf1minTo10min", 10 * MINUTE),
    ("sizeOf10minTo30min", 30 * MINUTE),
    ("sizeOf30minTo1hour", HOUR),
    ("sizeOf1hourTo6hour", 6 * HOUR),
    ("sizeOf6hourTo1day", DAY),
    ("sizeOf1dayTo7day", 7 * DAY),
    ("sizeOf7dayTo30day", 30 * DAY),
    ("sizeOf30dayToInfinite", None),
)

REQUEST_COUNTERS = (
    "sendMsg", "pullMsg", "deleteMsg", "ackMsg", "getMsg",
    "triggerMsgReady", "triggerMsgEndLife", "triggerMsgTimeout",
)
GAP_STATS = (("pullGap", "pullMsgTimeGapStatsList"), ("readyGap", "readyQueueTimeGapStatsList"))


async def get_message(rt: Runtime, topic: str, msg_id: str) -> dict | None:
    """A live message, or an ended one inside the retention window; None otherwise."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    raw = await rt.call(
        "get",
        [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.events],
        [msg_id, cfg.ended_retention_millis, cfg.monitor_interval_millis, rt.actor],
    )
    return None if raw is None else decode_message(raw)


async def list_topics(rt: Runtime) -> list[str]:
    return await rt.redis.zrange(rt.ns.topics, 0, -1)


async def topic_infos(rt: Runtime, topics: list[str]) -> list[dict]:
    """getTopicInfo for each topic, in one pipelined round trip. Unknown topics give zeros."""
    now = int(time.time() * 1000)
    pipe = rt.redis.pipeline(transaction=False)
    for topic in topics:
        k = rt.ns.topic(topic)
        pipe.zcard(k.waiting)
        pipe.llen(k.ready)
        pipe.zcard(k.inflight)
        lower = "-inf"
        for _name, upper in WAITING_BUCKETS:
            upper_bound = "+inf" if upper is None else now + upper
            pipe.zcount(k.waiting, lower, upper_bound)
            lower = f"({upper_bound}"
    replies = await pipe.execute()
    infos = []
    width = 3 + len(WAITING_BUCKETS)
    for i, topic in enumerate(topics):
        waiting, ready, inflight, *buckets = replies[i * width:(i + 1) * width]
        infos.append({
            "topic": topic,
            "waitingQueueSize": waiting,
            "waitingQueueInfo": {name: count for (name, _), count in zip(WAITING_BUCKETS, buckets)},
            "readyQueueSize": ready,
            "ackQueueSize": inflight,
        })
    return infos


async def topic_info(rt: Runtime, topic: str) -> dict:
    return (await topic_infos(rt, [topic]))[0]


async def monitor_data(rt: Runtime) -> dict:
    """getMonitorData: the last complete interval's counters, summed over every process
    (the scripts count in Redis), for each registered topic that saw activity."""
    topics = await list_topics(rt)
    seconds, micros = await rt.redis.time()
    interval = rt.config.monitor_interval_millis
    previous = (int(seconds) * 1000 + int(micros) // 1000) // interval - 1
    fields = [f"{previous}:{name}" for name in REQUEST_COUNTERS]
    for prefix, _ in GAP_STATS:
        fields += [f"{previous}:{prefix}:{part}" for part in ("count", "sum", "max")]
    pipe = rt.redis.pipeline(transaction=False)
    for topic in topics:
        pipe.hmget(rt.ns.topic(topic).stats, fields)
    replies = await pipe.execute() if topics else []

    data = {"requestStatsList": [], "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": []}
    for topic, values in zip(topics, replies):
        numbers = [int(v) if v is not None else 0 for v in values]
        counters = dict(zip(REQUEST_COUNTERS, numbers))
        if any(counters.values()):
            data["requestStatsList"].append({"topic": topic, **counters})
        offset = len(REQUEST_COUNTERS)
        for _prefix, list_name in GAP_STATS:
            count, total, maximum = numbers[offset:offset + 3]
            offset += 3
            if count:
                data[list_name].append({"topic": topic, "count": count, "avg": total / count, "max": maximum})
    return data


async def live_state(rt: Runtime, namespace: str, topic: str, msg_id: str) -> dict:
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
        "message": None if raw is None else decode_message(raw),
        "waiting_until": None if waiting is None else int(waiting),
        "in_ready_list": ready_pos is not None,
        "ack_deadline": None if ack_deadline is None else int(ack_deadline),
        "purge_at": None if purge_at is None else int(purge_at),
    }


# Fire lateness (promotion time - triggerTime) histogram bounds in ms; promote_due.lua counts
# each promoted message under the first bound it does not exceed ("inf" past the last).
LATENESS_BOUNDS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
CHART_MINUTES = 60  # the per-minute lateness series prune_stats.lua keeps
OVERDUE_MILLIS = 5_000  # a waiting message this far past its triggerTime means no scanner promotes it


async def redis_millis(rt: Runtime) -> int:
    """Redis' clock, the one the scripts stamp every time with."""
    seconds, micros = await rt.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _number(value) -> int:
    return int(value) if value is not None else 0


async def topic_overview(rt: Runtime, topics: list[str]) -> list[dict]:
    """What the dashboard and /metrics show per topic: getTopicInfo, the last complete monitor
    interval's counters, lifetime totals, the lateness histogram and per-minute series, how
    many waiting messages are overdue, how long the oldest ready message has been due, and how
    many lifecycle events wait for the log writer. Unknown topics give zeros."""
    if not topics:
        return []
    infos = await topic_infos(rt, topics)
    now = await redis_millis(rt)
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
        last = {name: _number(stats.get(f"{previous}:{name}")) for name in REQUEST_COUNTERS}
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
            "oldest_ready_age_ms": max(now - decode_message(oldest)["triggerTime"], 0) if oldest else 0,
            "last_interval": last,
            "interval_seconds": rt.config.monitor_interval_seconds,
            "totals": {name: _number(stats.get(f"total:{name}")) for name in REQUEST_COUNTERS},
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
    now = await redis_millis(rt)
    lags = {}
    for token, value in (await rt.redis.hgetall(rt.ns.scanners)).items():
        lag, _, reported = value.partition(":")
        if now - int(reported or 0) <= SCANNER_REPORT_STALE_MILLIS:
            lags[token] = float(lag)
    return lags
