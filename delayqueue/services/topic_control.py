"""A topic's settings changed (in PostgreSQL through the ORM, then mirrored into Redis), and its
pause and resume."""
import asyncio

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from redis.asyncio.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from delayqueue.config.push_hosts import push_url_problem
from delayqueue.core.exceptions import BadRequest
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard, place_shards
from delayqueue.live.shards import spread, topic_shards
from delayqueue.messagelog.connection import orm_unavailable
from delayqueue.runtime import Runtime
from delayqueue.services.topics import stale_mirrors, write_mirrors
from delayqueue.stores.rows import TopicConfigCaps, save_topic_config
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings


async def set_topic_config(rt: Runtime, *, topic: str, changes: dict, limits: dict,
                           rotate_push_secret: bool = False, by_operator: bool = False) -> str | None:
    """Changes a topic's settings (TopicConfig fields; None: back to the default) and its limits
    (stores.rows.set_limits' keywords; a tenant's, unless `by_operator`: a tenant cannot change
    the operator's, Refused 403) in PostgreSQL, then its Redis mirror; in force in this
    process at once, in every other within a second. A new push URL must be one
    DELAYQUEUE_PUSH_ALLOWED_HOSTS allows, its name resolved within the topic's push timeout
    (BadRequest). CapReached (429) for a topic's first
    settings beyond DELAYQUEUE_MAX_TOPIC_CONFIGS, or push concurrency beyond the namespace's
    DELAYQUEUE_MAX_PUSH_CONCURRENCY. Answers a new push signing secret
    (save_topic_config), or None. Raises RedisError when the mirror could not be written
    (PostgreSQL has the change: calling again is safe)."""
    placement = None
    # A count change is judged on the settings as saved, not as this process last read them.
    before = ((await rt.topic_configs.fresh()).get(topic, DEFAULT_SETTINGS) if "shards" in changes
              else await rt.topic_configs.settings(topic))
    url = changes.get("push_url")
    # A URL the topic has already is not judged again: the pushers judge every connection, and
    # its other settings stay changeable after the operator narrowed the allowed hosts.
    if url and url != before.push_url:
        problem = await push_url_problem(rt.config.push_hosts, url,
                                         changes.get("push_timeout_millis") or before.push_timeout_millis,
                                         namespace=rt.ns.namespace)
        if problem:
            raise BadRequest(f"pushUrl {problem}")
    # The shard count the change takes the topic to (a "shards" of None: back to the default);
    # None when the change leaves the count alone.
    taken_up = (changes["shards"] or DEFAULT_SETTINGS.shards) if "shards" in changes else None
    if taken_up is not None and taken_up not in before.shard_counts:
        placement = await _placement(rt, taken_up)
        if placement is not None:
            place_shards(rt.ns.namespace, topic, taken_up, placement)
        await _start_afresh(rt, topic_shards(topic, (taken_up,)))
    given_up = topic_shards(topic, (before.shards,)) if taken_up not in (None, before.shards) else []
    if given_up:
        await _unpack_all(rt, given_up)
    try:
        secret = await sync_to_async(save_topic_config, thread_sensitive=False)(
            namespace=rt.ns.namespace, topic=topic, changes=changes, limits=limits, by_operator=by_operator,
            rotate_push_secret=rotate_push_secret, secret_grace_millis=rt.config.push_secret_grace_seconds * 1000,
            caps=TopicConfigCaps(rows=rt.config.max_topic_configs, push_concurrency=rt.config.max_push_concurrency),
            placement=placement)
    except BaseException as exc:
        if given_up:  # the count stays, it may pack again, unless the save went through and only its answer was lost
            try:
                await _mirror_saved(rt, topic)
            except Exception:  # PostgreSQL unreadable: the save most likely failed with it
                await write_mirrors(rt, {topic: before})
        if isinstance(exc, DatabaseError):  # the ORM's: answered as every other failure of the log is
            raise orm_unavailable(exc) from None
        raise
    if limits:
        await rt.limits.fresh()
    await _mirror_saved(rt, topic)
    if "push_url" in changes or secret is not None:
        # A pusher that read the new settings before their mirror was written had its pull
        # refused, and messages already ready send it no wake of their own.
        await _wake_pulls(rt, topic)
    return secret


async def _mirror_saved(rt: Runtime, topic: str, *, draining: bool = True) -> None:
    """Writes the topic's mirror from its settings as saved, until a read after the write finds
    them unchanged: a change saved by another process after this one's read may have written its
    mirror first, and this write would leave Redis with the older settings (a count given up
    marked current again, a pause undone), as no later change would mend them."""
    written = None
    while (saved := (await rt.topic_configs.fresh()).get(topic, DEFAULT_SETTINGS)) != written:
        await write_mirrors(rt, {topic: saved}, draining=draining)
        written = saved


async def mend_mirrors(rt: Runtime, settings: dict[str, TopicSettings]) -> list[str]:
    """Writes the mirror again, from the settings as saved, of each topic whose mirror is not
    `settings` (as this process read them): a change whose mirror could not be written
    (set_topic_config raised RedisError) left the old settings in force for the scripts until the
    next change. Meta.DRAINING is left alone: a count change marks it before it saves (_unpack_all),
    and its own mirror write follows the save. Answers the topics written. Raises RedisError,
    LogUnavailable."""
    stale = await stale_mirrors(rt, settings)
    for topic in stale:
        await _mirror_saved(rt, topic, draining=False)
        await _wake_pulls(rt, topic)  # the pullers the old mirror held back (a pusher of the new URL)
    return stale


async def _placement(rt: Runtime, count: int) -> list[tuple[int, int]] | None:
    """On a cluster, a slot range for each of `count` shards, spread over its masters as they own
    the slots now (live/shards.spread); None on a single Redis, or for one shard."""
    if count == 1 or not isinstance(rt.redis, RedisCluster):
        return None
    await rt.redis.nodes_manager.initialize()  # the slots as they are, not as redis-py last saw them
    masters = [nodes[0].name if (nodes := rt.redis.nodes_manager.slots_cache.get(slot)) else None
               for slot in range(REDIS_CLUSTER_HASH_SLOTS)]
    if None in masters:  # a cluster with slots no master serves: equal runs, as without a placement
        return None
    owners, first = [], 0
    for slot in range(1, REDIS_CLUSTER_HASH_SLOTS + 1):
        if slot == REDIS_CLUSTER_HASH_SLOTS or masters[slot] != masters[first]:
            owners.append((first, slot - 1, masters[first]))
            first = slot
    return spread(count, owners)


async def _start_afresh(rt: Runtime, shards: list[Shard]) -> None:
    """A shard count taken up again after it was retired starts as a new one: without a hot
    window, so every send goes to Redis until its loader raises one. The window it kept would be
    stale, and a send beyond it would go cold while the loading waits out the reshard. Unregistered
    too: the topic may have been retired as idle since, and only a first send that finds its shard
    unregistered puts it back in the registry. Done before the change is saved: until then, no
    process sends to those shards."""
    pipe = rt.redis.pipeline(transaction=False)
    for shard in shards:
        k = rt.ns.topic(shard)
        pipe.hdel(k.meta, Meta.HOT_UNTIL, Meta.LOADED_TO, Meta.FETCHED_TO, Meta.COLD, Meta.REGISTERED)
        pipe.delete(k.cold_hours)
    await pipe.execute()


async def _unpack_all(rt: Runtime, shards: list[Shard]) -> None:
    """The shards of a count the topic is giving up pack nothing from now on (Meta.DRAINING) and
    move every packed list into their waiting sets (unpack_due.lua, a scanner batch a call), before
    the change is saved: from then on a lookup by msgId finds their messages in them (HEXISTS),
    however soon a process reads the change, and the next count's loader cannot load one twice."""
    pipe = rt.redis.pipeline(transaction=False)
    for shard in shards:
        pipe.hset(rt.ns.topic(shard).meta, Meta.DRAINING, 1)
    await pipe.execute()
    while shards:
        replies = await rt.scripts.run_all([scripts.unpack_due(rt.context, shard, limit=rt.context.scan_limit)
                                            for shard in shards])
        shards = [shard for shard, reply in zip(shards, replies) if reply.next_due_us == 0]  # more lists left


async def pause_topic(rt: Runtime, *, topic: str) -> None:
    """Pulls of the topic hand out nothing (long polls are held) until resume_topic; its messages
    still fall due."""
    await set_topic_config(rt, topic=topic, changes={"paused": True}, limits={})


async def resume_topic(rt: Runtime, *, topic: str) -> None:
    """Undoes pause_topic and wakes the topic's held long polls."""
    await set_topic_config(rt, topic=topic, changes={"paused": False}, limits={})
    await _wake_pulls(rt, topic)


async def _wake_pulls(rt: Runtime, topic: str) -> None:
    """Publishes each of the topic's ready lists on the ready channel: the long polls and pushers
    it wakes pull again (a poll a shard's name wakes, of a sharded topic, fills its batch from that
    shard alone, so every shard is named)."""
    shards = topic_shards(topic, (await rt.topic_configs.settings(topic)).shard_counts)
    await asyncio.gather(*(rt.redis.publish(rt.ns.ready_channel, rt.ns.topic(shard).ready) for shard in shards))
