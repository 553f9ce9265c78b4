"""Redis clients: URL checks and the asyncio client factory (single Redis or Cluster, TLS,
unix sockets), with reconnection on a broken connection."""
from urllib.parse import urlsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError


def is_cluster_url(url: str) -> bool:
    return url.startswith("redis-cluster://")


def checked_url(url: str) -> str:
    """The URL, if this module can connect with it; else ValueError saying what is wrong (redis-py
    would only fail at the first connection, or quietly use database 0 for a path it cannot read)."""
    if not url.startswith(("redis://", "rediss://", "unix://", "redis-cluster://")):
        raise ValueError("must be a redis://, rediss://, unix:// or redis-cluster://host:port[,host:port...] URL")
    try:
        if is_cluster_url(url):
            cluster_nodes(url)
        else:
            parse_url(url)
    except ValueError:
        raise ValueError("has a port that is not a number from 0 to 65535") from None
    database = urlsplit(url).path.strip("/")
    if url.startswith(("redis://", "rediss://")) and database and not database.isdigit():
        raise ValueError(f"names the database {database!r}: the path must be a database number")
    return url


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """redis-cluster://host:port[,host:port...] -> [(host, port), ...]"""
    netloc = url[len("redis-cluster://"):].split("/", 1)[0].split("?", 1)[0]
    nodes = []
    for part in netloc.split(","):
        parsed = urlsplit("//" + part)
        nodes.append((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    return nodes


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


def connect(url: str, timeout: float, **options) -> aioredis.Redis | RedisCluster:
    """An asyncio client for redis://, rediss://, unix:// or redis-cluster:// URLs. A command
    not answered within `timeout` seconds fails with redis' TimeoutError."""
    options.setdefault("decode_responses", True)
    options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    if is_cluster_url(url):
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_nodes(url)], **options)
    if url.startswith("redis://"):
        options.setdefault("connection_class", HiredisPackingConnection)
    return aioredis.Redis.from_url(url, retry=_retry(), **options)


def connect_pubsub_node(url: str, timeout: float) -> aioredis.Redis:
    """A plain client for pub/sub. On a cluster any node will do: PUBLISH reaches every node.
    `timeout` bounds commands and (re)subscribing; waiting for the next message has none."""
    options = dict(decode_responses=True, retry=_retry(), socket_timeout=timeout, socket_connect_timeout=timeout)
    if is_cluster_url(url):
        host, port = cluster_nodes(url)[0]
        return aioredis.Redis(host=host, port=port, **options)
    return aioredis.Redis.from_url(url, **options)
