"""Redis clients and the Lua scripts: loaded once per server, called by SHA."""
import asyncio
import collections
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

LUA_DIR = Path(__file__).with_name("lua")
_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)


def _read_script(name: str) -> str:
    source = (LUA_DIR / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: (LUA_DIR / "includes" / f"{m.group(1)}.lua").read_text(), source)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


SCRIPT_NAMES = (
    "send", "pull", "ack", "nack", "delete", "get",
    "promote_due", "requeue_timed_out", "expire", "purge_ended",
    "retire_topic", "prune_stats", "lock_renew", "lock_release", "restore",
)


def _load_all() -> dict[str, Script]:
    scripts = {}
    for name in SCRIPT_NAMES:
        source = _read_script(name)
        scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    return scripts


SCRIPTS = _load_all()


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


async def load_scripts(client) -> None:
    """SCRIPT LOAD every script (on a cluster, on every primary)."""
    for script in SCRIPTS.values():
        await client.script_load(script.source)  # redis-py sends it to every primary of a cluster


class ScriptBatcher:
    """Coalesces the script calls made during one event-loop turn (concurrent requests) into one
    pipelined round trip, so the cost of a round trip is shared."""

    def __init__(self, runner: "ScriptRunner"):
        self._runner = runner
        self._pending: list[tuple[str, list, list, asyncio.Future]] = []
        self._running: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def call(self, name: str, keys, args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((name, keys, args, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, batch) -> None:
        try:
            results = await self._runner.run([(name, keys, args) for name, keys, args, _ in batch])
        except Exception as exc:  # the whole round trip failed: every caller gets the error
            results = [exc] * len(batch)
        for (_name, _keys, _args, future), result in zip(batch, results):
            if future.done():  # the caller went away (cancelled request)
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


class ScriptRunner:
    """Runs the Lua scripts by SHA through redis-py's pipeline (one round trip per node on a
    cluster). `run` takes many calls at once; `call` runs one, sharing a round trip with the
    other calls of the same event-loop turn.

    Results come back in call order; a call's Redis error comes back as the exception.
    Calls refused for a missing script cache (Redis restarted) are loaded and run again.
    """

    def __init__(self, client):
        self.client = client  # redis-py's client: loads the scripts, and runs them on a cluster
        self._batcher: ScriptBatcher | None = None

    async def call(self, name: str, keys, args):
        if self._batcher is None:
            self._batcher = ScriptBatcher(self)
        return await self._batcher.call(name, keys, args)

    async def run(self, calls: list[tuple[str, list, list]]) -> list:
        if not calls:
            return []
        results = await self._pipeline(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            await load_scripts(self.client)
            again = await self._pipeline([calls[i] for i in missing])
            for i, result in zip(missing, again):
                results[i] = result
        return results

    async def _pipeline(self, calls):
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.execute_command("EVALSHA", SCRIPTS[name].sha, len(keys), *keys, *args)
        return await pipe.execute(raise_on_error=False)

    async def close(self) -> None:
        pass


def _evalsha(name: str, keys, args) -> bytes:
    return hiredis.pack_command(("EVALSHA", SCRIPTS[name].sha, len(keys), *keys, *args))


def _as_error(reply):
    """hiredis gives every error reply as ResponseError; redis-py's callers look for NOSCRIPT."""
    if isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
        return NoScriptError(str(reply))
    return reply


# Single calls of one loop turn written together (after the turn's first, written at once).
# Of 4, 8 and all of them, 8 gave the most sendMsg/s with the message log off and on.
HELD_CALLS_MAX = 8


class _Submitted:
    """Commands written together, and the future of their replies, resolved with the last."""

    __slots__ = ("future", "count", "replies")

    def __init__(self, future: asyncio.Future, count: int):
        self.future, self.count, self.replies = future, count, []


class _ReplyProtocol(asyncio.Protocol):
    """One Redis connection answering in order: replies fill the oldest submission, whose
    future resolves with all of them at its last (one future per batch of 100 sends, not one
    per call).

    The first submission of an event-loop turn is written at once; single calls that follow
    in the same turn are written HELD_CALLS_MAX at a time, and the rest when the turn ends.
    Each write wakes Redis on the other core, which costs this machine's kernel about 20 us: a
    sendMsg under load spent a quarter of its CPU there (docs/benchmarks.md). A call that is
    alone in its turn waits for nothing, one that has company for a few more calls at most.
    Holding every call to the turn's end saved as much CPU, but left Redis idle while the turn
    went on: logged single sends, which resume together when their group commit returns, lost
    a tenth of their rate. A pipeline (a batch send) shares its wake among its calls already,
    and is written at once, with the calls held before it.

    A watchdog looks every quarter of `timeout`: when calls have waited and nothing has come
    back for `timeout` seconds, they fail with redis' TimeoutError and the connection is
    dropped. A timer per connection instead of one per call: a call's own timer would cost
    more than the rest of its bookkeeping."""

    def __init__(self, timeout: float):
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError, protocolError=InvalidResponse)
        self.waiting: collections.deque[_Submitted] = collections.deque()
        self.transport = None
        self.loop = None
        self.lost = False
        self.timeout = timeout
        self._heard_at = 0.0  # loop time of the last reply, or of a call made while none waited
        self._watchdog: asyncio.TimerHandle | None = None
        self._held: list[bytes] | None = None  # this turn's commands after its first write

    def submit(self, commands: list[bytes]) -> asyncio.Future:
        """Writes the commands (now, or with the rest of this loop turn's); the future of
        their replies, in order."""
        future = self.loop.create_future()
        if self.lost:
            future.set_exception(RedisConnectionError("connection to Redis lost"))
            return future
        if not self.waiting:
            self._heard_at = self.loop.time()  # the silence a watchdog counts starts now
        self.waiting.append(_Submitted(future, len(commands)))
        first_of_turn = self._held is None
        if first_of_turn:
            self._held = []
            self.loop.call_soon(self._write_held)
        self._held += commands
        # A pipeline shares its wake among its calls already: it goes at once, after those held.
        if first_of_turn or len(commands) > 1 or len(self._held) >= HELD_CALLS_MAX:
            self.transport.write(b"".join(self._held))
            self._held.clear()
        return future

    def _write_held(self) -> None:
        held, self._held = self._held, None
        if held and not self.lost:
            self.transport.write(b"".join(held))

    def connection_made(self, transport):
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self._watchdog = self.loop.call_later(self.timeout / 4, self._watch)

    def _watch(self) -> None:
        if self.waiting and self.loop.time() - self._heard_at >= self.timeout:
            self._fail(RedisTimeoutError(f"Redis did not answer within {self.timeout:g} s"))
            self.transport.abort()
        else:
            self._watchdog = self.loop.call_later(self.timeout / 4, self._watch)

    def data_received(self, data):
        self._heard_at = self.loop.time()
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                oldest = self.waiting[0]
                oldest.replies.append(reply)
                if len(oldest.replies) == oldest.count:
                    self.waiting.popleft()
                    if not oldest.future.done():
                        oldest.future.set_result(oldest.replies)
        except InvalidResponse as exc:
            self.transport.close()
            self._fail(RedisConnectionError(f"bad reply from Redis: {exc}"))

    def connection_lost(self, exc):
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._fail(RedisConnectionError(f"connection to Redis lost{f': {exc}' if exc else ''}"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        while self.waiting:
            future = self.waiting.popleft().future
            if not future.done():
                future.set_exception(error)


class DirectScriptRunner(ScriptRunner):
    """Script calls on a single Redis over a connection of their own, written with hiredis and
    read by a bare asyncio protocol: redis-py's pipeline spends more per call (retry wrapper,
    timeout context, response callbacks) than the rest of a send."""

    def __init__(self, client, url: str, timeout: float):
        super().__init__(client)
        self._options = parse_url(url)
        self._timeout = timeout
        self._protocol: _ReplyProtocol | None = None
        self._connecting = asyncio.Lock()

    async def call(self, name: str, keys, args):
        command = _evalsha(name, keys, args)
        [result] = await self._send([command])
        if isinstance(result, NoScriptError):
            await load_scripts(self.client)
            [result] = await self._send([command])
        if isinstance(result, Exception):
            raise result
        return result

    async def _pipeline(self, calls):
        return await self._send([_evalsha(name, keys, args) for name, keys, args in calls])

    async def _send(self, commands: list[bytes]) -> list:
        """The commands' replies, in order. A connection lost under them is replaced and the
        commands sent once more, as redis-py's client retries (Redis restarted, failed over)."""
        for attempt in (1, 2):
            protocol = self._protocol
            if protocol is None or protocol.lost:
                protocol = await self._connect()
            future = protocol.submit(commands)
            try:
                return [_as_error(reply) for reply in await future]
            except BaseException as exc:
                # Failed with the connection, or abandoned (cancelled caller): nobody else will
                # look at it, so its error must not be left unretrieved.
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()
                if attempt == 2 or not isinstance(exc, RedisConnectionError):
                    raise

    async def _connect(self) -> _ReplyProtocol:
        async with self._connecting:
            if self._protocol is not None and not self._protocol.lost:
                return self._protocol
            loop = asyncio.get_running_loop()
            opts = self._options
            protocol_factory = functools.partial(_ReplyProtocol, self._timeout)
            try:
                if "path" in opts:
                    connecting = loop.create_unix_connection(protocol_factory, opts["path"])
                else:
                    connecting = loop.create_connection(protocol_factory, opts.get("host", "localhost"),
                                                        opts.get("port", 6379))
                _, protocol = await asyncio.wait_for(connecting, self._timeout)
            except asyncio.TimeoutError:
                raise RedisConnectionError(f"cannot connect to Redis: no answer within {self._timeout:g} s") from None
            except OSError as exc:
                raise RedisConnectionError(f"cannot connect to Redis: {exc}") from None
            setup = [("CLIENT", "SETNAME", "delayqueue-scripts")]  # named in CLIENT LIST
            if opts.get("password"):
                setup.append(("AUTH", *filter(None, (opts.get("username"), opts["password"]))))
            if opts.get("db"):
                setup.append(("SELECT", opts["db"]))
            for command in setup:
                [reply] = await protocol.submit([hiredis.pack_command(command)])
                if isinstance(reply, ResponseError):
                    protocol.transport.close()
                    raise RedisConnectionError(f"Redis refused {command[0]}: {reply}")
            self._protocol = protocol
            return protocol

    async def close(self) -> None:
        if self._protocol is not None:
            self._protocol.transport.close()
            self._protocol = None


def script_runner(client, url: str, timeout: float) -> ScriptRunner:
    """The direct runner for a plain (redis:// or unix://) single Redis; redis-py's pipeline
    for a cluster (it routes by slot) and for TLS."""
    if url.startswith(("redis://", "unix://")):
        return DirectScriptRunner(client, url, timeout)
    return ScriptRunner(client)
