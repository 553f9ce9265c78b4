"""Reads: messages, topic sizes and the monitor figures."""

from delayqueue.core.clock import now_millis
from delayqueue.live import scripts
from delayqueue.core.messages import Message
from delayqueue.stores.limits import Limits
from delayqueue.runtime import Runtime
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS

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


async def get_message(rt: Runtime, *, topic: str, msg_id: str) -> dict | None:
    """A live message, or an ended one inside the retention window; None otherwise."""
    cfg = rt.config
    raw = await rt.scripts.call(scripts.get(
        rt.ns.topic(topic), msg_id=msg_id, retention_millis=cfg.ended_retention_millis,
        stats_interval_millis=cfg.monitor_interval_millis, actor=rt.actor))
    return None if raw is None else Message.from_stored(raw).to_wire()


async def list_topics(rt: Runtime) -> list[str]:
    return await rt.redis.zrange(rt.ns.topics, 0, -1)


async def topic_infos(rt: Runtime, *, topics: list[str]) -> list[dict]:
    """getTopicInfo for each topic, in one pipelined round trip. Unknown topics give zeros."""
    now = now_millis()
    pipe = rt.redis.pipeline(transaction=False)
    for topic in topics:
        k = rt.ns.topic(topic)
        pipe.zcard(k.waiting)
        pipe.llen(k.ready)
        pipe.zcard(k.prioritised)
        pipe.zcard(k.inflight)
        lower = "-inf"
        for _name, upper in WAITING_BUCKETS:
            upper_bound = "+inf" if upper is None else now + upper
            pipe.zcount(k.waiting, lower, upper_bound)
            lower = f"({upper_bound}"
    replies = await pipe.execute()
    infos = []
    width = 4 + len(WAITING_BUCKETS)
    for i, topic in enumerate(topics):
        waiting, ready, prioritised, inflight, *buckets = replies[i * width:(i + 1) * width]
        infos.append({
            "topic": topic,
            "waitingQueueSize": waiting,
            "waitingQueueInfo": {name: count for (name, _), count in zip(WAITING_BUCKETS, buckets)},
            "readyQueueSize": ready + prioritised,  # every priority
            "ackQueueSize": inflight,
        })
    return infos


async def topic_info(rt: Runtime, *, topic: str) -> dict:
    return (await topic_infos(rt, topics=[topic]))[0]


async def redis_millis(rt: Runtime) -> int:
    """Redis' clock, the one the scripts stamp every time with."""
    seconds, micros = await rt.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def monitor_data(rt: Runtime) -> dict:
    """getMonitorData: the last complete interval's counters, summed over every process
    (the scripts count in Redis), for each registered topic that saw activity."""
    topics = await list_topics(rt)
    previous = await redis_millis(rt) // rt.config.monitor_interval_millis - 1
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


async def topic_config(rt: Runtime, *, topic: str) -> dict:
    """getTopicConfig's `data`: every setting of the topic in force, defaults included (a limit
    of 0: none), read from PostgreSQL now. Raises LogUnavailable."""
    cfg = rt.config
    settings = (await rt.topic_configs.fresh()).get(topic, DEFAULT_SETTINGS)
    limits = (await rt.limits.fresh()).get(topic, Limits())
    return {
        "topic": topic,
        "ttlMillis": settings.ttl_millis if settings.ttl_millis is not None else cfg.ttl_millis,
        "maxRetry": settings.max_retry if settings.max_retry is not None else cfg.max_retry,
        "ackTimeoutMillis": settings.ack_timeout_millis if settings.ack_timeout_millis is not None
        else cfg.ack_timeout_millis,
        "retryBackoffMillis": settings.retry_backoff_millis,
        "retryBackoffMaxMillis": settings.retry_backoff_max_millis,
        "deadLetter": settings.dead_letter,
        "paused": settings.paused,
        "produceRatePerSecond": limits.produce_rate,
        "consumeRatePerSecond": limits.consume_rate,
        "maxLiveMessages": limits.max_live,
        "pushUrl": settings.push_url,
        "pushConcurrency": settings.push_concurrency,
        "pushTimeoutMillis": settings.push_timeout_millis,
        "pushRatePerSecond": settings.push_rate,
        "pushSecretRotating": settings.push_previous_until > now_millis(),
    }
