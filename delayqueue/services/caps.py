"""Caps that keep one tenant from using up what a shared deployment has (docs/deploy.md, "Limits
and caps"), each set by an operator through its DELAYQUEUE_* variable and refused with code 429
naming it: the topics a namespace registers, the long polls one API token holds at once, and
one restore per namespace at a time. (Topic settings' caps: stores/rows.save_topic_config.)"""
import asyncio
import secrets
import time
from contextlib import asynccontextmanager

import psycopg
from redis.exceptions import RedisError

from delayqueue.core.exceptions import CapReached, Throttled
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import connect
from delayqueue.runtime import Runtime

# --- Topics per namespace (DELAYQUEUE_MAX_TOPICS)

# Topics this process has seen registered, per namespace, trusted this long: a send to one of them
# costs no Redis round trip. (One retired meanwhile and sent to again is registered past the check.)
KNOWN_TOPICS_SECONDS = 10.0
_known: dict[tuple[str, str], tuple[float, set[str]]] = {}  # (Redis URL, registry key) -> (since, topics)


def _known_topics(rt: Runtime) -> set[str]:
    """The topics this process saw registered in the namespace within KNOWN_TOPICS_SECONDS."""
    now = time.monotonic()
    registry = (rt.config.redis_url, rt.ns.topics)
    since, known = _known.get(registry, (now, set()))
    if now - since > KNOWN_TOPICS_SECONDS:
        since, known = now, set()
    _known[registry] = (since, known)
    return known


def remember_topics(rt: Runtime, *, topics: list[str]) -> None:
    """Topics a send just registered (or found registered): their next sends need not ask Redis."""
    _known_topics(rt).update(topics)


async def new_topic_refusals(rt: Runtime, *, topics: list[str]) -> list[CapReached | None]:
    """Per send (given by its topic), the refusal of a topic its namespace has not registered when
    the namespace has DELAYQUEUE_MAX_TOPICS registered already (counting new topics of the same
    call in order), else None. Sends racing each other with new topics may each pass, so a
    namespace can pass the cap by the new topics sent at the same moment. When Redis cannot be
    asked, nothing is refused: the send itself then meets Redis' failure."""
    known = _known_topics(rt)
    asked = list(dict.fromkeys(topic for topic in topics if topic not in known))
    if not asked:
        return [None] * len(topics)
    pipe = rt.redis.pipeline(transaction=False)
    pipe.zmscore(rt.ns.topics, asked)
    pipe.zcard(rt.ns.topics)
    try:
        scores, registered = await pipe.execute()
    except RedisError:
        return [None] * len(topics)
    known.update(topic for topic, score in zip(asked, scores) if score is not None)
    cap = rt.config.max_topics
    room = cap - registered
    refused = set()
    for topic, score in zip(asked, scores):
        if score is None:
            if room > 0:
                room -= 1
            else:
                refused.add(topic)
    if not refused:
        return [None] * len(topics)
    refusal = CapReached(f"too many topics: namespace {rt.ns.namespace} has {registered} topics registered, and a "
                         "send to a new one would add one more (an idle, empty topic is retired after "
                         "DELAYQUEUE_TOPIC_IDLE_SECONDS)", setting="DELAYQUEUE_MAX_TOPICS", cap=cap)
    return [refusal if topic in refused else None for topic in topics]


# --- Long polls held per API token (DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN)

# A long poll held by a process that died is counted until its hold would have ended and this long after.
HOLD_MARGIN_MILLIS = 5_000
# What a refused long poll suggests: a held one of the same token ends within its timeout, often sooner.
LONG_POLL_RETRY_AFTER_MILLIS = 1_000


@asynccontextmanager
async def long_poll_hold(rt: Runtime, *, holder: str, hold_millis: int):
    """Counts a long poll of `holder` (its API token's sha256) as held for up to `hold_millis` (0
    or less: the default long-poll hold), over every web process,
    for the block; Throttled (429) when the token holds DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN
    already. The count lives in Redis, one sorted set per token of hold id -> when the hold ends
    (this process' clock, plus a margin): a hold whose process died stops counting then, and the
    set itself expires after its last hold. Two polls racing for the last place may both be
    refused, never both held. When Redis cannot be asked, the poll is not refused (its pulls
    then meet Redis' failure)."""
    cap = rt.config.max_long_polls_per_token
    key = rt.ns.long_polls(holder)
    hold_id = secrets.token_hex(8)
    now = int(time.time() * 1000)
    hold_millis = hold_millis if hold_millis > 0 else rt.config.long_polling_timeout_millis
    until = now + min(hold_millis, rt.config.max_long_polling_timeout_millis) + HOLD_MARGIN_MILLIS
    # In this order on one connection (no MULTI: a Cluster node too): each poll counts itself and
    # every poll added before it, so a count is never below the polls held.
    pipe = rt.redis.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", now)
    pipe.zadd(key, {hold_id: until})
    pipe.zcard(key)
    # No hold lasts longer than the longest long poll: the set outlives every hold in it.
    pipe.pexpire(key, rt.config.max_long_polling_timeout_millis + HOLD_MARGIN_MILLIS)
    try:
        held = (await pipe.execute())[2]
    except RedisError:
        held = 0
    if held > cap:
        await _release_hold(rt, key, hold_id)
        raise Throttled(f"too many long polls: this API token holds {held - 1} at once, the cap "
                        f"(DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN={cap})", LONG_POLL_RETRY_AFTER_MILLIS,
                        limit="max_long_polls_per_token", topic="")
    try:
        yield
    finally:
        if held:
            # A request cancelled (its client went away) still gives its place back.
            await asyncio.shield(_release_hold(rt, key, hold_id))


async def _release_hold(rt: Runtime, key: str, hold_id: str) -> None:
    try:
        await rt.redis.zrem(key, hold_id)
    except RedisError:
        pass  # counted until its hold would have ended


# --- One restore per namespace at a time

# What a refused restore suggests: the running one takes a while, and a repeat finds what it left.
RESTORE_RETRY_AFTER_MILLIS = 5_000


def restore_running(namespace: str) -> str:
    return f"a restore of namespace {namespace} is running: one restore per namespace at a time"


@asynccontextmanager
async def restore_turn(rt: Runtime):
    """Holds the namespace's restore lock (a PostgreSQL session advisory lock: released when the
    block ends, or when its process or connection dies) for the block; Throttled (429) while
    another restore of the namespace holds it, whichever process runs it (the API, the admin,
    `manage.py restore`; spark.restore takes it alike). Raises LogUnavailable."""
    async with await connect(rt.config.log_timeout_millis, rt.log_database) as conn:
        got = (await (await conn.execute(sql.RESTORE_LOCK, [rt.ns.namespace])).fetchone())[0]
        if not got:
            raise Throttled(restore_running(rt.ns.namespace), RESTORE_RETRY_AFTER_MILLIS, limit="restore", topic="")
        try:
            yield
        finally:
            try:
                await conn.execute(sql.RESTORE_UNLOCK, [rt.ns.namespace])
            except psycopg.Error:  # the connection broke: its session's end releases the lock
                pass

