"""Topics: their settings (written to PostgreSQL, then mirrored into Redis), pause, resume and
purge; and what the API reads of them: the registry, queue sizes, monitor counters, the
settings in force."""
import logging

from asgiref.sync import sync_to_async

from delayqueue.config.push_hosts import push_url_problem
from delayqueue.core.clock import now_millis
from delayqueue.core.exceptions import BadRequest
from delayqueue.live import scripts
from delayqueue.runtime import Runtime
from delayqueue.stores.limits import Limits
from delayqueue.stores.rows import save_topic_config
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import MIRROR_FIELDS, TopicSettings

log = logging.getLogger(__name__)


async def set_topic_config(rt: Runtime, *, topic: str, changes: dict, limits: dict,
                           rotate_push_secret: bool = False) -> str | None:
    """Changes a topic's settings (TopicConfig fields; None: back to the default) and its limits
    (stores.rows.set_limits' keywords) in PostgreSQL, then its Redis mirror; in force in this
    process at once, in every other within a second. A new push URL must be one
    DELAYQUEUE_PUSH_ALLOWED_HOSTS allows (BadRequest). Answers a new push signing secret
    (save_topic_config), or None. Raises RedisError when the mirror could not be written
    (PostgreSQL has the change: calling again is safe)."""
    url = changes.get("push_url")
    # A URL the topic has already is not judged again: the pushers judge every connection, and
    # its other settings stay changeable after the operator narrowed the allowed hosts.
    if url and url != (await rt.topic_configs.settings(topic)).push_url:
        problem = await push_url_problem(rt.config.push_hosts, url)
        if problem:
            raise BadRequest(f"pushUrl {problem}")
    secret = await sync_to_async(save_topic_config, thread_sensitive=False)(
        namespace=rt.ns.namespace, topic=topic, changes=changes, limits=limits,
        rotate_push_secret=rotate_push_secret, secret_grace_millis=rt.config.push_secret_grace_seconds * 1000)
    table = await rt.topic_configs.fresh()
    if limits:
        await rt.limits.fresh()
    await write_mirrors(rt, {topic: table.get(topic, DEFAULT_SETTINGS)})
    return secret


async def pause_topic(rt: Runtime, *, topic: str) -> None:
    """Pulls of the topic hand out nothing (long polls are held) until resume_topic; its messages
    still fall due."""
    await set_topic_config(rt, topic=topic, changes={"paused": True}, limits={})


async def resume_topic(rt: Runtime, *, topic: str) -> None:
    """Undoes pause_topic and wakes the topic's held long polls."""
    await set_topic_config(rt, topic=topic, changes={"paused": False}, limits={})
    await rt.redis.publish(rt.ns.ready_channel, topic)


async def purge_topic(rt: Runtime, *, topic: str) -> int:
    """Ends every live message of the topic as deleted (history reason 'purged', counted as
    deleteMsg in the monitor counters), a bounded batch per script call, and returns how many. Messages sent while it runs may be purged too."""
    cfg = rt.config
    call = scripts.purge_topic(rt.ns.topic(topic), limit=cfg.scanner_batch,
                               retention_millis=cfg.ended_retention_millis, actor=rt.actor,
                               stats_interval_millis=cfg.monitor_interval_millis)
    purged = 0
    while True:
        reply = await rt.scripts.call(call)
        purged += reply.purged
        if not reply.more:
            break
    log.info("purged topic %s of namespace %s: %d messages", topic, rt.ns.namespace, purged)
    return purged


async def write_mirrors(rt: Runtime, settings: dict[str, TopicSettings]) -> None:
    """Writes each topic's settings into its meta hash, in one pipelined round trip. Raises RedisError."""
    if not settings:
        return
    pipe = rt.redis.pipeline(transaction=False)
    for topic, values in settings.items():
        pipe.hset(rt.ns.topic(topic).meta, mapping={field: get(values) for field, get in MIRROR_FIELDS.items()})
    await pipe.execute()

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
