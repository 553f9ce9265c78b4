"""Topics: their settings' mirror in Redis, purging a topic, and what the API reads of them: the
registry, queue sizes, monitor counters, the settings in force. (Changing the settings:
topic_control.py.)"""
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, replace

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import COLD_HOUR_MILLIS
from delayqueue.core.exceptions import LogUnavailable
from delayqueue.core.messages import Message
from delayqueue.live import scripts, stats
from delayqueue.live.keys import Meta, Shard, least_position, parse_position
from delayqueue.live.shards import message_shards, topic_shards
from delayqueue.runtime import Runtime
from delayqueue.services.messages import loader_positions, redis_millis
from delayqueue.stores.limits import Limits
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import MIRROR_FIELDS, TopicSettings

log = logging.getLogger(__name__)

COLD_PURGE_PAGE = 1000  # log rows read, and ended, per statement


async def purge_topic(rt: Runtime, *, topic: str) -> int:
    """Ends the topic's live messages as deleted (history reason 'purged', counted as deleteMsg
    in the monitor counters), a bounded batch per script call, and returns how many: first those
    the message log alone holds (the cold tier), then those in Redis.

    It ends, even while producers keep sending: it makes no more calls than it takes to purge
    what the topic held when it started (its queues' sizes then), and one more. Messages sent
    while it runs may be purged in place of older ones, which then stay; a purge called again
    takes them."""
    # Its shard counts as saved: a process that has not read a reshard yet would leave the new count's messages.
    with contextlib.suppress(LogUnavailable):
        await rt.topic_configs.fresh()
    purged = await _purge_cold(rt, topic) if rt.config.message_log else 0
    held = await topic_info(rt, topic=topic)
    for shard in (await topic_shard_lists(rt, topics=[topic]))[0]:
        call = scripts.purge_topic(rt.context, shard)
        calls_left = -(-(held.waiting + held.ready + held.consuming) // rt.context.scan_limit) + 1
        while calls_left > 0:
            calls_left -= 1
            reply = await rt.scripts.call(call)
            purged += reply.purged
            if not reply.more:
                break
    log.info("purged topic %s of namespace %s: %d messages", topic, rt.ns.namespace, purged)
    return purged


async def _purge_cold(rt: Runtime, topic: str) -> int:
    """The cold tier's part of a purge: the topic's waiting rows after the loader's position that
    Redis does not hold (in this life) are ended in the log, a page at a time; then purge_cold.lua
    counts them and fences the loader, so a page it read before they were ended loads nothing.
    The Redis part of the purge comes after the fence: it ends whatever a loader brought in
    meanwhile. A topic the loader never worked has no position, and nothing cold. A sharded topic
    is read from the least position of its shards, a row looked for in its shard of each count,
    and counted out of the shard the loader would bring it into."""
    settings = await rt.topic_configs.settings(topic)
    counts = settings.shard_counts
    every = topic_shards(topic, counts)
    if (after := least_position(await loader_positions(rt, every))) is None:
        return 0
    after_time, after_id = parse_position(after)
    hours: dict[Shard, Counter[int]] = {shard: Counter() for shard in every}
    while rows := await rt.log.cold_after(topic, after_time, after_id, COLD_PURGE_PAGE):
        places = [message_shards(topic, msg_id, counts) for _id, msg_id, _produced, _due in rows]
        held = await _held_in_life(rt, rows, places)
        cold: dict[Shard, list[int]] = {}
        for (row_id, *_), mine, kept in zip(rows, places, held):
            if not kept:
                cold.setdefault(mine[0], []).append(row_id)
        for shard, row_ids in cold.items():  # ended on the clock its shard keeps an ended message by
            hours[shard].update(await rt.log.purge_cold(row_ids, now=await redis_millis(rt, shard)))
        after_id, after_time = rows[-1][0], rows[-1][3]
    await rt.scripts.run_all([scripts.purge_cold(rt.context, shard, purged=hours[shard].total(),
                                                 signed=settings.sharded, hours=list(hours[shard].items()))
                              for shard in every])
    return sum(counted.total() for counted in hours.values())


async def _held_in_life(rt: Runtime, rows: list[tuple[int, str, int, int]], places: list[list[Shard]]) -> list[bool]:
    """Per log row (id, msgId, produceTime, triggerTime), whether one of its `places` holds its
    life (the same produceTime), in one round trip."""
    asked: dict[Shard, list[int]] = {}
    for i, mine in enumerate(places):
        for shard in mine:
            asked.setdefault(shard, []).append(i)
    pipe = rt.redis.pipeline(transaction=False)
    for shard, positions in asked.items():
        pipe.hmget(rt.ns.topic(shard).msgs, [rows[i][1] for i in positions])
    held = [False] * len(rows)
    for positions, stored in zip(asked.values(), await pipe.execute()):
        for i, body in zip(positions, stored):
            held[i] = held[i] or (body is not None and Message.from_stored(body, rows[i][1]).produce_time == rows[i][2])
    return held


async def write_mirrors(rt: Runtime, settings: dict[str, TopicSettings], *, draining: bool = True) -> None:
    """Writes each topic's settings into its meta hash (each of its shards', with whether the
    shard's count is draining: Meta.DRAINING, unless not `draining`), in one pipelined round trip.
    Raises RedisError."""
    if not settings:
        return
    pipe = rt.redis.pipeline(transaction=False)
    for topic, values in settings.items():
        mirror = {field: get(values) for field, get in MIRROR_FIELDS.items()}
        for shard in topic_shards(topic, values.shard_counts):
            flag = {Meta.DRAINING: int(shard.count != values.shards)} if draining else {}
            pipe.hset(rt.ns.topic(shard).meta, mapping={**mirror, **flag})
    await pipe.execute()


async def stale_mirrors(rt: Runtime, settings: dict[str, TopicSettings]) -> list[str]:
    """The topics whose meta hash, on any of their shards, mirrors other settings than theirs
    (MIRROR_FIELDS), in one pipelined round trip. A topic without settings of its own may have
    no mirror at all (none was ever written): the scripts take the defaults then. Raises RedisError."""
    shards = {topic: topic_shards(topic, values.shard_counts) for topic, values in settings.items()}
    pipe = rt.redis.pipeline(transaction=False)
    for each in shards.values():
        for shard in each:
            pipe.hmget(rt.ns.topic(shard).meta, list(MIRROR_FIELDS))
    replies = iter(await pipe.execute())
    unwritten = [None] * len(MIRROR_FIELDS)
    stale = []
    for topic, each in shards.items():
        expected = [str(get(settings[topic])) for get in MIRROR_FIELDS.values()]
        found = [next(replies) for _ in each]
        if any(mirror != expected and not (mirror == unwritten and settings[topic] == DEFAULT_SETTINGS)
               for mirror in found):
            stale.append(topic)
    return stale


# getTopicInfo's waiting-delay buckets: each counts the waiting messages due within its bound of
# now (ms) and after the previous one's, (lower, upper], so a message is counted once; the first
# takes the overdue ones, the last (None) everything beyond.
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
WAITING_WITHIN = (MINUTE, 10 * MINUTE, 30 * MINUTE, HOUR, 6 * HOUR, DAY, 7 * DAY, 30 * DAY, None)


@dataclass(frozen=True)
class TopicInfo:
    """getTopicInfo: a topic's queue sizes now."""

    topic: str
    waiting: int  # in Redis and, in the cold tier, in the message log only
    waiting_within: tuple[int, ...]  # waiting messages per WAITING_WITHIN bucket (the cold ones to within an hour)
    ready: int  # every priority
    consuming: int
    waiting_cold: int = 0  # in the message log only (the cold tier): due after the topic's hot window


@dataclass(frozen=True)
class Gap:
    count: int
    avg: float  # ms
    max: int  # ms


@dataclass(frozen=True)
class TopicCounters:
    """A topic's counters over the last complete monitor interval, summed over every process."""

    topic: str
    counters: dict[stats.Counter, int]
    gaps: dict[stats.Gap, Gap]  # only the gaps that have a count


@dataclass(frozen=True)
class TopicConfigInForce:
    """getTopicConfig: every setting of a topic in force, defaults included (a limit of 0: none)."""

    topic: str
    ttl_millis: int
    max_retry: int
    ack_timeout_millis: int
    retry_backoff_millis: int
    retry_backoff_max_millis: int
    dead_letter: bool
    paused: bool
    produce_rate: int
    consume_rate: int
    max_live: int
    push_url: str
    push_concurrency: int
    push_timeout_millis: int
    push_rate: int
    push_secret_rotating: bool  # a rotated-out signing secret still signs
    shards: int
    draining_shards: tuple[int, ...]  # shard counts given up whose shards may still hold messages


async def list_topics(rt: Runtime) -> list[str]:
    """The namespace's registered topics, in the order they were first used."""
    return await rt.redis.zrange(rt.ns.topics, 0, -1)


async def topic_shard_lists(rt: Runtime, *, topics: list[str]) -> list[list[Shard]]:
    """Each topic's shards (live/shards.py), those of every count it may hold messages in: what
    a reader adds up to give the topic's figures."""
    settings = await rt.topic_configs.table()
    return [topic_shards(topic, settings.get(topic, DEFAULT_SETTINGS).shard_counts) for topic in topics]


async def topic_infos(rt: Runtime, *, topics: list[str], now: int | None = None) -> list[TopicInfo]:
    """getTopicInfo for each topic (its shards' added up), in one pipelined round trip. Unknown
    topics give zeros. `now`: Redis' clock as the caller read it (default: read here)."""
    now = now if now is not None else await redis_millis(rt)  # the clock the messages fall due by
    places = await topic_shard_lists(rt, topics=topics)
    pipe = rt.redis.pipeline(transaction=False)
    for shard in (shard for shards in places for shard in shards):
        k = rt.ns.topic(shard)
        pipe.zcard(k.waiting)
        pipe.llen(k.ready)
        pipe.zcard(k.prioritised)
        pipe.zcard(k.inflight)
        pipe.hget(k.meta, Meta.LOADED_TO)
        pipe.hgetall(k.cold_hours)
        lower = "-inf"
        for within in WAITING_WITHIN:
            upper = "+inf" if within is None else now + within
            pipe.zcount(k.waiting, lower, upper)
            lower = f"({upper}"
    replies = iter(await pipe.execute())
    width = 6 + len(WAITING_WITHIN)
    infos = []
    for topic, shards in zip(topics, places):
        info = TopicInfo(topic, 0, (0,) * len(WAITING_WITHIN), 0, 0)
        cold_hours, loaded_tos = Counter(), []
        for _shard in shards:
            waiting, ready, prioritised, inflight, loaded_to, hours, *buckets = [next(replies) for _ in range(width)]
            cold_hours.update({int(hour): int(n) for hour, n in hours.items()})
            loaded_tos += [] if loaded_to is None else [parse_position(loaded_to)[0]]
            info = TopicInfo(topic, info.waiting + waiting,
                             tuple(total + held for total, held in zip(info.waiting_within, buckets)),
                             info.ready + ready + prioritised, info.consuming + inflight)
        # A sharded topic's shards each hold a signed part of its cold count per hour (raise_hot.lua), added up
        # here, each hour no lower than 0 as an unsharded topic's goes (includes/cold_count.lua): what is left
        # below was counted out and never in (a send that died before its script), and would hide later ones.
        in_log = cold_buckets(hours=cold_hours, now=now, after=min(loaded_tos, default=None))
        cold = sum(in_log)
        infos.append(replace(info, waiting=info.waiting + cold, waiting_cold=cold,
                                   waiting_within=tuple(held + logged for held, logged
                                                        in zip(info.waiting_within, in_log))))
    return infos


def cold_buckets(*, hours: dict[int, int], now: int, after: int | None) -> list[int]:
    """The cold messages of each WAITING_WITHIN bucket, from their counts per hour: each hour's
    count goes where the hour's middle falls, or just after `after` (the time of the topic's
    loaded_to) if later: every cold message (packed ones too) is due after it. So a bucket's edge
    beyond loaded_to is right to within an hour."""
    counts = [0] * len(WAITING_WITHIN)
    for hour, count in hours.items():
        due = hour * COLD_HOUR_MILLIS + COLD_HOUR_MILLIS // 2
        if after is not None:
            due = max(due, after + 1)
        at = next((i for i, within in enumerate(WAITING_WITHIN) if within is None or due <= now + within))
        counts[at] += max(count, 0)
    return counts


async def topic_info(rt: Runtime, *, topic: str) -> TopicInfo:
    return (await topic_infos(rt, topics=[topic]))[0]


async def monitor_data(rt: Runtime) -> list[TopicCounters]:
    """getMonitorData: the last complete interval's counters of each registered topic that counted
    anything then, summed over every process (the scripts count in Redis)."""
    topics = await list_topics(rt)
    previous = await redis_millis(rt) // rt.config.monitor_interval_millis - 1
    fields = [stats.field("counter", interval=previous, name=counter) for counter in stats.Counter]
    fields += [stats.field("gap", interval=previous, name=gap, part=part) for gap in stats.Gap
               for part in (stats.Part.COUNT, stats.Part.SUM, stats.Part.MAX)]
    places = await topic_shard_lists(rt, topics=topics)
    pipe = rt.redis.pipeline(transaction=False)
    for shard in (shard for shards in places for shard in shards):
        pipe.hmget(rt.ns.topic(shard).stats, fields)
    replies = iter(await pipe.execute() if topics else [])
    found = []
    for topic, shards in zip(topics, places):
        values = stats.added([{name: value for name, value in zip(fields, next(replies)) if value is not None}
                              for _shard in shards])
        numbers = iter(values.get(name, 0) for name in fields)
        counters = {counter: next(numbers) for counter in stats.Counter}
        gaps = {}
        for gap in stats.Gap:
            count, total, maximum = next(numbers), next(numbers), next(numbers)
            if count:
                gaps[gap] = Gap(count, total / count, maximum)
        if gaps or any(counters.values()):
            found.append(TopicCounters(topic, counters, gaps))
    return found


async def topic_config(rt: Runtime, *, topic: str) -> TopicConfigInForce:
    """Every setting of the topic in force, read from PostgreSQL now. Raises LogUnavailable."""
    cfg = rt.config
    settings = (await rt.topic_configs.fresh()).get(topic, DEFAULT_SETTINGS)
    limits = (await rt.limits.fresh()).get(topic, Limits())
    return TopicConfigInForce(
        topic=topic,
        ttl_millis=settings.ttl_millis if settings.ttl_millis is not None else cfg.ttl_millis,
        max_retry=settings.max_retry if settings.max_retry is not None else cfg.max_retry,
        ack_timeout_millis=settings.ack_timeout_millis if settings.ack_timeout_millis is not None
        else cfg.ack_timeout_millis,
        retry_backoff_millis=settings.retry_backoff_millis,
        retry_backoff_max_millis=settings.retry_backoff_max_millis,
        dead_letter=settings.dead_letter,
        paused=settings.paused,
        produce_rate=limits.produce_rate,
        consume_rate=limits.consume_rate,
        max_live=limits.max_live,
        push_url=settings.push_url,
        push_concurrency=settings.push_concurrency,
        push_timeout_millis=settings.push_timeout_millis,
        push_rate=settings.push_rate,
        push_secret_rotating=settings.push_previous_until > now_millis(),
        shards=settings.shards,
        draining_shards=tuple(settings.draining_shards),
    )
