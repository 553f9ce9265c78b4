"""Redis clients: the asyncio client factory for every URL config/redis_urls.py accepts (single
Redis, Cluster, Sentinel, TLS, unix sockets), with reconnection on a broken connection."""
import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue.config.redis_urls import is_cluster_url, is_sentinel_url, sentinel_target, url_credentials, url_nodes


class HiredisPackingConnection(aioredis.Connection):
    """Packs commands with hiredis (C) as redis-py's sync client does; its asyncio client packs in
    Python, which costs more than the rest of a send."""

    def pack_command(self, *args):
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]


def _retry() -> Retry:
    """A command whose connection broke (Redis restarted or failed over) is sent again on a new
    one. redis-py's clients made by from_url do not retry at all: after a restart, every pooled
    connection would fail its next command (a send answered 500). A command that timed out is
    not sent again: Redis is there but not answering, and the caller should hear so at once.
    The cluster client retries on its own."""
    return Retry(ExponentialBackoff(cap=0.5, base=0.01), 3, supported_errors=(RedisConnectionError,))


class SentinelMasterRedis(aioredis.Redis):
    """The master a Sentinel names, asked again after a failover (a lost connection, or READONLY
    from a demoted master); closing it closes the connections to the sentinels too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:
            await sentinel.aclose()


def _sentinel_master(url: str, **options) -> SentinelMasterRedis:
    service, db, sentinel_auth = sentinel_target(url)
    sockets = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = Sentinel(url_nodes(url), sentinel_kwargs={**sockets, **sentinel_auth})
    return sentinel.master_for(service, redis_class=SentinelMasterRedis, db=db, **url_credentials(url), **options)


def connect(url: str, timeout: float, **options) -> aioredis.Redis | RedisCluster:
    """An asyncio client for any URL checked_url takes. A command not answered within `timeout`
    seconds fails with redis' TimeoutError."""
    options.setdefault("decode_responses", True)
    options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    if is_cluster_url(url):
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in url_nodes(url)],
                            **url_credentials(url), **options)
    if is_sentinel_url(url):
        return _sentinel_master(url, retry=_retry(), **options)
    if url.startswith("redis://"):
        options.setdefault("connection_class", HiredisPackingConnection)
    return aioredis.Redis.from_url(url, retry=_retry(), **options)


def connect_pubsub_node(url: str, timeout: float) -> aioredis.Redis:
    """A plain client for pub/sub. On a cluster any node will do: PUBLISH reaches every node.
    `timeout` bounds commands and (re)subscribing; waiting for the next message has none."""
    options = dict(decode_responses=True, retry=_retry(), socket_timeout=timeout, socket_connect_timeout=timeout)
    if is_cluster_url(url):
        host, port = url_nodes(url)[0]
        return aioredis.Redis(host=host, port=port, **url_credentials(url), **options)
    if is_sentinel_url(url):
        return _sentinel_master(url, **options)
    return aioredis.Redis.from_url(url, **options)
