"""One message by its msgId: read, deleted, rescheduled."""
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from delayqueue.core.constants import Status
from delayqueue.core.exceptions import Conflict, LogUnavailable, NotFound
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard, least_position, parse_position, released_life
from delayqueue.live.shards import message_shards, shard_of, topic_shards
from delayqueue.runtime import Runtime
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS


async def redis_millis(rt: Runtime, shard: Shard | None = None) -> int:
    """Redis' clock, the one the scripts stamp every time with. A cluster's nodes each have their own:
    with a `shard`, that of the node holding its keys, by which its scripts stamp its messages (a
    plain TIME goes to one node of redis-py's choosing)."""
    if shard is not None and isinstance(rt.redis, RedisCluster):
        await rt.redis.initialize()  # reads the slot table the first time, then returns at once
        seconds, micros = await rt.redis.time(target_nodes=rt.redis.get_node_from_key(rt.ns.topic(shard).meta))
    else:
        seconds, micros = await rt.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def holding_shards(rt: Runtime, *, topic: str, msg_ids: list[str],
                         counts: tuple[int, ...] | None = None) -> list[Shard]:
    """Each msgId's shard (live/shards.py). While the topic drains other shard counts, the shard
    of theirs that holds it, found in one round trip; the current count's if none does. `counts`:
    the topic's shard counts (default: as the settings in force say)."""
    counts = counts or (await rt.topic_configs.settings(topic)).shard_counts
    return await first_holding(rt, msg_ids=msg_ids, places=[message_shards(topic, msg_id, counts)
                                                            for msg_id in msg_ids])


async def first_holding(rt: Runtime, *, msg_ids: list[str], places: list[list[Shard]]) -> list[Shard]:
    """Per msgId, the first of its `places` whose body hash holds it, else the first; looked up
    in one round trip, and only where a msgId has more than one place."""
    if all(len(mine) == 1 for mine in places):
        return [mine[0] for mine in places]
    pipe = rt.redis.pipeline(transaction=False)
    for msg_id, mine in zip(msg_ids, places):
        if len(mine) > 1:
            for shard in mine:
                pipe.hexists(rt.ns.topic(shard).msgs, msg_id)
    held = iter(await pipe.execute())
    return [next((shard for shard, holds in zip(mine, [next(held) for _ in mine]) if holds), mine[0])
            if len(mine) > 1 else mine[0] for mine in places]


async def newer_counts(rt: Runtime, topic: str, *, msg_id: str, after: float,
                       known: tuple[int, ...]) -> tuple[int, ...] | None:
    """The topic's shard counts as read after `after` (time.monotonic()), for a msgId missing where
    the `known` counts place it, if they are not those (None if they are, or cannot be told): for
    up to refreshed.REFRESH_SECONDS after a reshard, a process that has not read it looks for the
    new count's messages where they are not. Only once a change from the known current count has
    begun (Meta.DRAINING, set in its shards before the change is saved) are the settings read."""
    try:
        if not await given_up(rt, [shard_of(topic, msg_id, known[0])]):
            return None
        counts = (await rt.topic_configs.fresh(after)).get(topic, DEFAULT_SETTINGS).shard_counts
    except (RedisError, LogUnavailable):
        return None
    return None if counts == known else counts


async def given_up(rt: Runtime, shards: list[Shard]) -> bool:
    """Whether a change from the shard count of any of these shards has begun (Meta.DRAINING, set in
    a count's shards before the change is saved), in one round trip: a process that takes their
    counts for current has a reshard to read."""
    pipe = rt.redis.pipeline(transaction=False)
    for shard in shards:
        pipe.hget(rt.ns.topic(shard).meta, Meta.DRAINING)
    return "1" in await pipe.execute()


async def on_its_shard(rt: Runtime, *, topic: str, msg_id: str, call: Callable[[Shard], scripts.ScriptCall],
                       missing: Callable[[Any], bool]) -> tuple[Shard, Any]:
    """The reply of a script run on the msgId's shard (holding_shards), and that shard. A reply
    `missing` the msgId (Redis holds none there) runs again where the settings read since place it,
    if they place it elsewhere (newer_counts)."""
    asked = time.monotonic()
    known = (await rt.topic_configs.settings(topic)).shard_counts
    [shard] = await holding_shards(rt, topic=topic, msg_ids=[msg_id], counts=known)
    reply = await rt.scripts.call(call(shard))
    if missing(reply) and (counts := await newer_counts(rt, topic, msg_id=msg_id, after=asked,
                                                        known=known)) is not None:
        [shard] = await holding_shards(rt, topic=topic, msg_ids=[msg_id], counts=counts)
        reply = await rt.scripts.call(call(shard))
    return shard, reply


async def cold_after(rt: Runtime, shard: Shard) -> tuple[int, int] | None:
    """Where the cold messages of a topic's shard begin: its loader's position there (its
    loaded_to), after which Redis holds no waiting row but those sent hot; None when it has none,
    and nothing is cold. A sharded topic's shard without one (a reshard's new count before the
    loader first works it) goes by the least of the topic's other shards'."""
    [at] = await loader_positions(rt, [shard])
    if at is None and (settings := await rt.topic_configs.settings(shard.topic)).sharded:
        at = least_position(await loader_positions(rt, topic_shards(shard.topic, settings.shard_counts)))
    return None if at is None else parse_position(at)


async def loader_positions(rt: Runtime, shards: list[Shard]) -> list[str | None]:
    """Each shard's loader position (its loaded_to; None for none), in one round trip."""
    pipe = rt.redis.pipeline(transaction=False)
    for shard in shards:
        pipe.hget(rt.ns.topic(shard).meta, Meta.LOADED_TO)
    return await pipe.execute()


async def cold_message(rt: Runtime, shard: Shard, msg_id: str, after: tuple[int, int]) -> Message | None:
    """The msgId's cold message, from the log: its waiting row after the loader's position `after`
    that Redis, which did not hold it a moment ago, has not ended either (is_cold.lua: a message
    due too near to pack waits in the waiting set after loaded_to, and its row reads waiting until
    the log writer catches up). None: the caller asks Redis again (a load may have moved loaded_to
    past the row since Redis was asked)."""
    row = await rt.log.cold_message(shard.topic, msg_id, after)
    if row is None or not await rt.scripts.call(scripts.is_cold(rt.context, shard, msg_id=msg_id,
                                                                trigger_time=row.trigger_time)):
        return None
    return row


async def get_message(rt: Runtime, *, topic: str, msg_id: str) -> Message | None:
    """A live message (in the cold tier, from the message log if it is cold), or an ended one
    inside the retention window; None otherwise. A deleted one whose body Redis does not keep (a
    message deleted in the log: `tombstone`; a cold one purged) is answered from its log row."""
    call = functools.partial(scripts.get, rt.context, msg_id=msg_id)
    shard, message = await on_its_shard(rt, topic=topic, msg_id=msg_id, call=call,
                                        missing=lambda message: message is None)
    if message is None and rt.config.finds_cold and (after := await cold_after(rt, shard)) is not None:
        message = await cold_message(rt, shard, msg_id, after) or await rt.scripts.call(call(shard))
        if message is None:
            return await _purged_cold(rt, shard, msg_id, after)
    if message is not None and message.status == Status.DELETED and not message.payload and rt.config.message_log:
        found = await rt.log.deleted_message(topic, msg_id)
        # The tombstone's life from its row; else a body empty indeed, as Redis holds it.
        return found.message if found is not None and found.message.produce_time == message.produce_time else message
    return message


async def _purged_cold(rt: Runtime, shard: Shard, msg_id: str, after: tuple[int, int]) -> Message | None:
    """A cold message a purge ended (its row deleted after the loader's position `after`), inside the
    retention window, as Redis keeps a hot one the purge ended; None if there is none, or if a
    deleteMsg released its body (not found, as a hot one released)."""
    found = await rt.log.deleted_message(shard.topic, msg_id)
    if found is None:
        return None
    message = found.message
    if (message.trigger_time, found.row_id) <= after:
        return None  # Redis' to answer for (its row ended after the loader passed it)
    if found.ended <= await redis_millis(rt, shard) - rt.context.retention_millis:
        return None
    released = await rt.redis.zscore(rt.ns.topic(shard).released, released_life(msg_id, message.produce_time))
    return message if released is None else None


def tombstone(message: Message) -> str:
    """What Redis keeps of a message deleted in the log for the retention: the message as deleted
    without its body (getMsg reads that from the log), so a loader or a restore that read its row
    before finds its life held. A cold message's body was never in Redis, nor comes in with its end."""
    return dataclasses.replace(message, status=Status.DELETED, payload="").to_stored()


async def delete_message(rt: Runtime, *, topic: str, msg_id: str, release: bool = False) -> bool:
    """Deletes a live message (status deleted); False if it is missing or already ended.
    `release` frees its body at once instead of keeping it readable for the retention. In the
    cold tier, a cold message is deleted in the message log, and Redis keeps it as deleted for the
    retention in the shard the loader would bring it into (with `release`, only a mark of its life,
    in `released`), so a loader that read it before cannot bring it in. A message Redis holds
    nothing of, and not cold, that the log holds live (Redis lost its data, or its send died between
    the log and Redis) is deleted there and kept in Redis as deleted alike, so a restore does not
    bring it back."""
    call = functools.partial(scripts.delete, rt.context, msg_id=msg_id, release=release)
    shard, outcome = await on_its_shard(rt, topic=topic, msg_id=msg_id, call=call,
                                        missing=lambda outcome: outcome == -1)
    if outcome == -1 and rt.config.finds_cold and (after := await cold_after(rt, shard)) is not None:
        logged = await cold_message(rt, shard, msg_id, after) and await _delete_logged(rt, shard, msg_id, after,
                                                                                      release)
        # Not in the log after loaded_to: a load may have moved loaded_to past it since Redis was asked.
        outcome = await rt.scripts.call(call(shard)) if logged is None else logged
    if outcome == -1 and rt.config.message_log:
        outcome = await _delete_lost(rt, shard, msg_id, release)
    if outcome == 3:
        # Its log row, waiting after loaded_to until the log writer catches up, would read as a cold
        # message's: Redis keeps the body, as deleted, until the row is ended, then frees it.
        try:
            if rt.config.finds_cold and (after := await cold_after(rt, shard)) is not None:
                await rt.log.end_released(topic, msg_id, after, now=await redis_millis(rt, shard))
        except LogUnavailable:  # deleted all the same: the body stays for the retention, the writer ends the row
            return True
        await rt.scripts.call(scripts.delete(rt.context, shard, msg_id=msg_id, release=True, release_ended=True))
    return outcome in (1, 2, 3)


async def _delete_logged(rt: Runtime, shard: Shard, msg_id: str, after: tuple[int, int],
                         release: bool) -> int | None:
    """Deletes the msgId's waiting row after the position `after` in the log (as a cold message's),
    then asks Redis again with the deleted message as a tombstone: delete.lua's outcome; None if the
    log held no such row."""
    deleted = await rt.log.delete_cold(shard.topic, msg_id, after, now=await redis_millis(rt, shard))
    if deleted is None:
        return None
    # Loaded meanwhile, Redis deletes it as any other (1, or 3 with release); else it keeps the tombstone (2).
    signed = (await rt.topic_configs.settings(shard.topic)).sharded
    return await rt.scripts.call(scripts.delete(rt.context, shard, msg_id=msg_id, release=release,
                                                tombstone=tombstone(deleted), counted_cold=True, signed=signed))


async def _delete_lost(rt: Runtime, shard: Shard, msg_id: str, release: bool) -> int:
    """Deletes a message Redis holds nothing of that is not cold, but live in the log (Redis lost its
    data, or its send died between the log and Redis), which a restore would bring back: the log ends
    that life first, so a delete that fails part-way leaves it live there for a retry to finish; then
    Redis keeps it as deleted for the retention (with `release`, a mark of its life; not counted out
    of the cold count it was never in),
    so a restore that read its row before does not bring it in. A life deleteMsg released the body
    of (keys.py's `released`), the log writer not caught up, is left alone: it ended, and a resend
    of its msgId is a new life."""
    live = await rt.log.live_message(shard.topic, msg_id)
    if live is None:
        return 0
    if await rt.redis.zscore(rt.ns.topic(shard).released, released_life(msg_id, live.produce_time)) is not None:
        return 0
    await rt.log.delete_lost(live, now=await redis_millis(rt, shard))
    # 1 (or 3): its send's script, or a restore, ran meanwhile, and Redis deleted it as any other.
    return await rt.scripts.call(scripts.delete(rt.context, shard, msg_id=msg_id, release=release,
                                                tombstone=tombstone(live)))


async def _reschedule_cold(rt: Runtime, shard: Shard, msg_id: str, trigger_time: int,
                           delay_millis: int) -> scripts.RescheduleReply | None:
    """A cold message is rescheduled in the message log, then brought into Redis (into the shard
    the loader would bring it into) if its new time is within the hot window or its old one was
    (reschedule.lua); None if nothing of the topic is cold. Not cold in the log, Redis is asked again."""
    if (after := await cold_after(rt, shard)) is None:
        return None
    now = await redis_millis(rt, shard)  # the clock reschedule.lua counts a hot message's delay from
    moved = await cold_message(rt, shard, msg_id, after) and await rt.log.reschedule_cold(
        shard.topic, msg_id, after, max(now + delay_millis if trigger_time < 0 else trigger_time, now), now=now)
    if moved is None:
        # Not in the log after loaded_to: a load may have moved loaded_to past it since Redis was asked.
        return await rt.scripts.call(scripts.reschedule(rt.context, shard, msg_id=msg_id, trigger_time=trigger_time,
                                                        delay_millis=delay_millis))
    message, old_trigger = moved
    signed = (await rt.topic_configs.settings(shard.topic)).sharded
    return await rt.scripts.call(scripts.reschedule(rt.context, shard, msg_id=msg_id, trigger_time=message.trigger_time,
                                                    delay_millis=0, cold=message.to_stored(),
                                                    old_trigger_time=old_trigger, signed=signed))


async def reschedule_message(rt: Runtime, *, topic: str, msg_id: str, trigger_time: int = -1,
                             delay_millis: int = 0) -> Message:
    """A waiting or ready message gets a new trigger time: `trigger_time` (epoch ms), or with -1
    Redis' now + `delay_millis`; one not in the future makes it ready now. Its expireTime moves
    with it (the TTL counts from the new trigger time), unless it came before the triggerTime (the
    TTL ends during a nack's delay or a backoff): then it stays. Answers the message as stored.
    Raises Conflict when it is consuming, NotFound when it is unknown or ended."""
    shard, reply = await on_its_shard(rt, topic=topic, msg_id=msg_id,
                                      call=lambda shard: scripts.reschedule(rt.context, shard, msg_id=msg_id,
                                                                            trigger_time=trigger_time,
                                                                            delay_millis=delay_millis),
                                      missing=lambda reply: reply.stored is None and reply.status == 0)
    if reply.stored is None and reply.status == 0 and rt.config.finds_cold:
        reply = await _reschedule_cold(rt, shard, msg_id, trigger_time, delay_millis) or reply
    if reply.stored is not None:
        return reply.stored
    if reply.status == Status.CONSUMING:
        raise Conflict(f"message {msg_id} is being consumed: only a waiting or ready message can be rescheduled")
    if reply.status == 0:
        raise NotFound(f"message {msg_id} not found in topic {topic}")
    raise NotFound(f"message {msg_id} has already ended (status {reply.status}) in topic {topic}")
