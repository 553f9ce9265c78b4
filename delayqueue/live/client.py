"""Redis clients: URL checks and the asyncio client factory (single Redis, Cluster, Sentinel,
TLS, unix sockets), with reconnection on a broken connection."""
import re
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError


URL_FORMS = ("redis://, rediss://, unix://, redis-cluster://host:port[,host:port...] or "
             "redis+sentinel://host:port[,host:port...]/service_name[/db]")


def is_cluster_url(url: str) -> bool:
    return url.startswith("redis-cluster://")


def is_sentinel_url(url: str) -> bool:
    return url.startswith("redis+sentinel://")


def checked_url(url: str) -> str:
    """The URL, if this module can connect with it; else ValueError saying what is wrong (redis-py
    would only fail at the first connection, or quietly use database 0 for a path it cannot read)."""
    if not url.startswith(("redis://", "rediss://", "unix://", "redis-cluster://", "redis+sentinel://")):
        raise ValueError(f"must be a {URL_FORMS} URL")
    try:
        if is_cluster_url(url) or is_sentinel_url(url):
            url_nodes(url)
        else:
            parse_url(url)
    except ValueError:
        raise ValueError("has a port that is not a number from 0 to 65535") from None
    if is_sentinel_url(url):
        sentinel_target(url)
        return url
    database = urlsplit(url).path.strip("/")
    if url.startswith(("redis://", "rediss://")) and database and not database.isdigit():
        raise ValueError(f"names the database {database!r}: the path must be a database number")
    return url


def _netloc(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]


def url_nodes(url: str) -> list[tuple[str, int]]:
    """redis-cluster:// or redis+sentinel://[credentials@]host:port[,host:port...] -> [(host, port), ...]
    (ValueError for a port that is not a number)."""
    nodes = []
    for part in _netloc(url).rpartition("@")[2].split(","):
        parsed = urlsplit("//" + part)
        nodes.append((parsed.hostname or "127.0.0.1", parsed.port or (26379 if is_sentinel_url(url) else 6379)))
    return nodes


def url_credentials(url: str) -> dict[str, str]:
    """The username and password a multi-node URL carries (percent-decoded), as redis-py's keywords."""
    userinfo, at, _ = _netloc(url).rpartition("@")
    if not at:
        return {}
    username, colon, password = userinfo.partition(":")
    credentials = {"username": unquote(username)} if username else {}
    if colon:
        credentials["password"] = unquote(password)
    return credentials


def without_password(url: str) -> str:
    """The URL with its passwords (in the credentials or the query) replaced by ***, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    netloc, _, tail = rest.partition("/") if "/" in rest else (rest, "", "")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    tail = re.sub(r"((?:^|[?&])(?:sentinel_)?password=)[^&]*", r"\1***", tail)
    return f"{scheme}{sep}{netloc}{'/' if '/' in rest else ''}{tail}"


def sentinel_target(url: str) -> tuple[str, int, dict[str, str]]:
    """redis+sentinel://.../service_name[/db][?sentinel_password=...] -> (service_name, db,
    the keywords for the sentinels' own connections); ValueError saying what is wrong."""
    parts = urlsplit(url)
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("must name the master's service after the sentinels: redis+sentinel://host:port[,...]"
                         "/service_name[/db]")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"names the database {path[1]!r}: the path must be a database number")
    query = parse_qs(parts.query)
    sentinel_auth = {"password": query["sentinel_password"][0]} if query.get("sentinel_password") else {}
    return path[0], int(path[1]) if len(path) == 2 else 0, sentinel_auth


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
