"""A Redis connection of the script runner's own: commands packed by hiredis and replies read by
a bare asyncio protocol, pipelined, with writes shared within an event-loop turn."""
import asyncio
import collections
import functools

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import AuthenticationError, BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def evalsha(sha: str, keys: list, args: list) -> bytes:
    return hiredis.pack_command(("EVALSHA", sha, len(keys), *keys, *args))


def as_error(reply):
    """hiredis gives every error reply as ResponseError; redis-py's callers look for NOSCRIPT,
    the runner for LOADING (as redis-py's classes name them)."""
    if isinstance(reply, ResponseError):
        text = str(reply)
        if text.startswith("NOSCRIPT"):
            return NoScriptError(text)
        if text.startswith("LOADING"):
            return BusyLoadingError(text)
    return reply


class ConnectionLost(RedisConnectionError):
    """The connection broke with the commands written on it: Redis may have run them."""


# Single calls of one loop turn written together (after the turn's first, written at once).
# Of 4, 8 and all of them, 8 gave the most sendMsg/s with the message log off and on.
HELD_CALLS_MAX = 8


class _Submitted:
    """Commands written together, and the future of their replies, resolved with the last."""

    __slots__ = ("future", "count", "replies")

    def __init__(self, future: asyncio.Future, count: int):
        self.future, self.count, self.replies = future, count, []


class ReplyProtocol(asyncio.Protocol):
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
            self._fail(ConnectionLost(f"bad reply from Redis: {exc}"))

    def connection_lost(self, exc):
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._fail(ConnectionLost(f"connection to Redis lost{f': {exc}' if exc else ''}"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        while self.waiting:
            future = self.waiting.popleft().future
            if not future.done():
                future.set_exception(error)


async def connect_direct(url: str, timeout: float) -> ReplyProtocol:
    """A ReplyProtocol on a plain redis:// or unix:// URL, named, authenticated and on its database."""
    opts = parse_url(url)
    loop = asyncio.get_running_loop()
    protocol_factory = functools.partial(ReplyProtocol, timeout)
    if "path" in opts:
        connecting = loop.create_unix_connection(protocol_factory, opts["path"])
    else:
        connecting = loop.create_connection(protocol_factory, opts.get("host", "localhost"), opts.get("port", 6379))
    return await _set_up(connecting, timeout, username=opts.get("username"), password=opts.get("password"),
                         db=opts.get("db"))


async def connect_node(host: str, port: int, *, timeout: float, username: str | None = None,
                       password: str | None = None) -> ReplyProtocol:
    """A ReplyProtocol to one node of a cluster, named and authenticated."""
    connecting = asyncio.get_running_loop().create_connection(functools.partial(ReplyProtocol, timeout), host, port)
    return await _set_up(connecting, timeout, username=username, password=password, db=None)


async def _set_up(connecting, timeout: float, *, username: str | None, password: str | None,
                  db: int | None) -> ReplyProtocol:
    try:
        _, protocol = await asyncio.wait_for(connecting, timeout)
    except asyncio.TimeoutError:
        raise RedisConnectionError(f"cannot connect to Redis: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise RedisConnectionError(f"cannot connect to Redis: {exc}") from None
    setup = []
    if password:  # first: a Redis with a password answers nothing else before it
        setup.append(("AUTH", *filter(None, (username, password))))
    setup.append(("CLIENT", "SETNAME", "delayqueue-scripts"))  # named in CLIENT LIST
    if db:
        setup.append(("SELECT", db))
    for command in setup:
        [reply] = await protocol.submit([hiredis.pack_command(command)])
        if isinstance(reply, ResponseError):
            protocol.transport.close()
            # Not "refused": its reason (exceptions.connection_reason) would read "connection refused"
            # for a wrong password. Refused credentials are their own class, which no caller retries.
            refused = command[0] == "AUTH" or str(reply).startswith(("NOAUTH", "WRONGPASS"))
            error = AuthenticationError if refused else RedisConnectionError
            raise error(f"Redis answered {command[0]} with an error: {reply}")
    return protocol
