"""camellia's health endpoints' state, per host: whether this node reports itself online, and
when it last served a queue request (so `offline` can tell a load balancer that draining is
done). Kept in Redis, so every uvicorn worker of the host answers alike; each worker also
remembers its own, which it answers from when Redis is unreachable."""
import asyncio
import socket
import time

from redis.exceptions import RedisError

IDLE_SECONDS_BEFORE_OFFLINE = 20  # camellia's: offline answers 200 once no request came for 20 s
PUBLISH_USE_EVERY = 1.0  # a worker writes its last use to Redis at most this often

HOST = socket.gethostname()
_online = True
_last_use = 0.0  # epoch seconds; 0: never
_published_use = 0.0
_publishing: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks


def mark_use(rt) -> None:
    """Called for every queue request: cheap, and a Redis write at most once a second."""
    global _last_use, _published_use
    _last_use = time.time()
    if _last_use - _published_use >= PUBLISH_USE_EVERY:
        _published_use = _last_use
        task = asyncio.ensure_future(_publish_use(rt, int(_last_use * 1000)))
        _publishing.add(task)
        task.add_done_callback(_publishing.discard)


async def _publish_use(rt, millis: int) -> None:
    try:
        await rt.redis.hset(rt.ns.health, f"{HOST}:last_use", millis)
    except RedisError:
        pass  # offline then judges by this worker's own last use


async def is_online(rt) -> bool:
    global _online
    try:
        _online = not await rt.redis.hexists(rt.ns.health, f"{HOST}:offline")
    except RedisError:
        pass
    return _online


async def set_online(rt, online: bool) -> bool:
    """Whether the change is kept for every worker of the host; if not (Redis unreachable), this
    worker alone answers by it."""
    global _online
    _online = online
    try:
        if online:
            await rt.redis.hdel(rt.ns.health, f"{HOST}:offline")
        else:
            await rt.redis.hset(rt.ns.health, f"{HOST}:offline", 1)
    except RedisError:
        return False
    return True


async def idle(rt) -> bool:
    """True when no worker of this host has served a queue request for the idle time."""
    last = _last_use
    try:
        published = await rt.redis.hget(rt.ns.health, f"{HOST}:last_use")
        last = max(last, int(published or 0) / 1000)
    except RedisError:
        pass
    return time.time() - last >= IDLE_SECONDS_BEFORE_OFFLINE
