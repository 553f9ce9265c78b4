"""Redis URLs as the settings, ./dev and the Spark jobs take them: which forms are accepted
(single Redis, Cluster, Sentinel, TLS, unix sockets), their parts, and the URL without its
passwords for messages and logs. live/client.py connects with them."""
import re
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio.connection import parse_url

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
