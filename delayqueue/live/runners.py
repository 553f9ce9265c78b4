"""Running the Lua scripts: by SHA, pipelined, over redis-py (a Cluster, TLS) or over the
direct connection (protocol.py) on a plain single Redis. Every call is a scripts.ScriptCall and
comes back as its script's typed reply."""
import asyncio
import time

from redis.exceptions import AuthenticationError, AuthorizationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from delayqueue.config.redis_urls import is_cluster_url, url_credentials
from delayqueue.core.retry import retry_pauses
from delayqueue.live.protocol import ConnectionLost, ReplyProtocol, as_error, connect_direct, connect_node, evalsha
from delayqueue.live.scripts import ScriptCall, load_scripts

# Redis' refusals of the credentials: redis-py raises them as connection errors, but they are not transient.
_REFUSED_CREDENTIALS = (AuthenticationError, AuthorizationError)


def _typed(call: ScriptCall, raw):
    return raw if isinstance(raw, Exception) else call.script.reply(raw)


async def _replies(protocol: ReplyProtocol, commands: list[bytes]) -> list:
    """The replies to commands written on a direct connection, in order, each error as its
    redis-py class (protocol.as_error)."""
    future = protocol.submit(commands)
    try:
        return [as_error(reply) for reply in await future]
    except BaseException:
        # Failed with the connection, or abandoned (cancelled caller): nobody else will look at
        # it, so its error must not be left unretrieved.
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()
        raise


def _trips(calls: list[ScriptCall], per_trip: int | None) -> list[list[ScriptCall]]:
    """The calls in round trips of at most `per_trip` (None: all in one)."""
    step = per_trip or max(len(calls), 1)
    return [calls[start:start + step] for start in range(0, len(calls), step)]


class ScriptBatcher:
    """Coalesces the script calls made during one event-loop turn (concurrent requests) into one
    pipelined round trip, so the cost of a round trip is shared."""

    def __init__(self, runner: "ScriptRunner"):
        self._runner = runner
        self._pending: list[tuple[ScriptCall, asyncio.Future]] = []
        self._running: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def call(self, call: ScriptCall) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((call, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, batch) -> None:
        try:
            results = await self._runner.run([call for call, _ in batch])
        except Exception as exc:  # the whole round trip failed: every caller gets the error
            results = [exc] * len(batch)
        for (_call, future), result in zip(batch, results):
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

    Results come back in call order, typed; a call's Redis error comes back as the exception.
    Calls refused for a missing script cache (Redis restarted) are loaded and run again.
    """

    def __init__(self, client, timeout: float):
        self.client = client  # redis-py's client: loads the scripts, and runs them on a cluster
        self._timeout = timeout
        self._batcher: ScriptBatcher | None = None

    async def call(self, call: ScriptCall):
        if self._batcher is None:
            self._batcher = ScriptBatcher(self)
        return await self._batcher.call(call)

    async def run(self, calls: list[ScriptCall]) -> list:
        if not calls:
            return []
        results = await self._pipeline(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            await self._load_scripts()
            again = await self._pipeline([calls[i] for i in missing])
            for i, result in zip(missing, again):
                results[i] = result
        return [_typed(call, raw) for call, raw in zip(calls, results)]

    async def run_in_trips(self, calls: list[ScriptCall], per_trip: int) -> list:
        """As run, the calls sent in round trips of at most `per_trip`, each after the last answered:
        a call of another caller on the same connection waits behind one trip, not all of them."""
        return [reply for trip in _trips(calls, per_trip) for reply in await self.run(trip)]

    async def run_all(self, calls: list[ScriptCall], *, per_trip: int | None = None) -> list:
        """As run (or run_in_trips, with `per_trip`), for callers that need every call done: raises
        the first call's error (no trip is sent after one that failed)."""
        replies = []
        for trip in _trips(calls, per_trip):
            answered = await self.run(trip)
            if error := next((reply for reply in answered if isinstance(reply, Exception)), None):
                raise error
            replies += answered
        return replies

    async def _pipeline(self, calls: list[ScriptCall]) -> list:
        return await self._send(calls)

    async def _load_scripts(self) -> None:
        """Loads the scripts a NOSCRIPT found missing, retried as _send retries a call: the
        Redis that answered it may restart, or still be loading its data, while they load."""
        pauses = retry_pauses(time.monotonic() + self._timeout)
        while True:
            try:
                return await load_scripts(self.client)
            except _REFUSED_CREDENTIALS:
                raise
            except RedisConnectionError:  # LOADING too
                pause = next(pauses, None)
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def _send(self, commands: list) -> list:
        """The commands' replies, in order (a command: what _send_once takes). Transient
        failures are retried with a short back-off until `timeout` after the call started: a
        connection lost or refused (Redis restarting or failing over; the connection is
        replaced; on a cluster, redis-py may answer that per command) and LOADING replies (a
        restarted Redis reading its data back); only the commands that failed go again. A command whose connection broke
        may have run: sending it again is safe for every script the service sends, a send being
        a no-op on its own live msgId (services/send.py answers that as the send it is); one not sent
        again in time answers ConnectionLost, whatever its later tries met. Not retried: a timeout (the
        watchdog's), as Redis may still run what it was sent."""
        deadline = time.monotonic() + self._timeout
        try:
            replies = await self._send_once(commands)
        except _REFUSED_CREDENTIALS:
            raise  # a wrong password stays wrong: trying again only delays the answer
        except RedisConnectionError as exc:
            return await self._retry(commands, [exc] * len(commands), exc, deadline)
        if any(isinstance(reply, RedisConnectionError) for reply in replies):  # LOADING too
            return await self._retry(commands, replies, None, deadline)
        return replies

    async def _retry(self, commands: list, replies: list, error: RedisConnectionError | None,
                     deadline: float) -> list:
        """_send's tries after the first: `error` is the connection's failure, else the
        commands answered with one (or LOADING) go again."""
        pending = [i for i, reply in enumerate(replies) if isinstance(reply, RedisConnectionError)]  # LOADING too
        lost = {i for i in pending if isinstance(replies[i], ConnectionLost)}  # sent: they may have run
        for pause in retry_pauses(deadline):
            await asyncio.sleep(pause)
            try:
                for i, reply in zip(pending, await self._send_once([commands[i] for i in pending])):
                    replies[i] = reply
            except _REFUSED_CREDENTIALS:
                raise
            except RedisConnectionError as exc:
                error = exc
                lost.update(pending if isinstance(exc, ConnectionLost) else ())
                continue
            error = None
            lost.update(i for i in pending if isinstance(replies[i], ConnectionLost))
            pending = [i for i in pending if isinstance(replies[i], RedisConnectionError)]
            if not pending:
                return replies
        if error is not None and not lost.intersection(pending):
            raise error
        for i in pending:
            if i in lost:  # it reached Redis before its connection broke: it may have run (a send keeps its log row)
                replies[i] = ConnectionLost("connection to Redis lost after the call was sent; it could not be sent "
                                            "again")
            elif error is not None:
                replies[i] = error
        return replies  # still loading (or failing): those calls answer so

    async def _send_once(self, calls: list[ScriptCall]) -> list:
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        return await pipe.execute(raise_on_error=False)

    async def close(self) -> None:
        pass


class DirectScriptRunner(ScriptRunner):
    """Script calls on a single Redis over a connection of their own, written with hiredis and
    read by a bare asyncio protocol: redis-py's pipeline spends more per call (retry wrapper,
    timeout context, response callbacks) than the rest of a send."""

    def __init__(self, client, url: str, timeout: float):
        super().__init__(client, timeout)
        self._url = url
        self._protocol: ReplyProtocol | None = None
        self._connecting = asyncio.Lock()

    async def call(self, call: ScriptCall):
        command = evalsha(call.script.sha, call.keys, call.args)
        [result] = await self._send([command])
        if isinstance(result, NoScriptError):
            await self._load_scripts()
            [result] = await self._send([command])
        if isinstance(result, Exception):
            raise result
        return call.script.reply(result)

    async def _pipeline(self, calls: list[ScriptCall]) -> list:
        return await self._send([evalsha(call.script.sha, call.keys, call.args) for call in calls])

    async def _send_once(self, commands: list[bytes]) -> list:
        protocol = self._protocol
        if protocol is None or protocol.lost:
            protocol = await self._connect()
        return await _replies(protocol, commands)

    async def _connect(self) -> ReplyProtocol:
        async with self._connecting:
            if self._protocol is None or self._protocol.lost:
                self._protocol = await connect_direct(self._url, self._timeout)
            return self._protocol

    async def close(self) -> None:
        if self._protocol is not None:
            self._protocol.transport.close()
            self._protocol = None


# Replies that say the slot table redis-py holds is out of date, or the cluster is changing.
_CLUSTER_REDIRECTS = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


class DirectClusterScriptRunner(ScriptRunner):
    """Script calls on a Redis Cluster over connections of their own to each primary, as
    DirectScriptRunner's: a call goes to the primary that redis-py's slot table names for its
    keys, a node's calls written together. redis-py's cluster pipeline spends about 50 us of
    CPU a call more (a pull over a sharded topic's 7 shards: 521 us against 158 for one shard).
    What the table does not foresee (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, a node's connection
    lost) goes through redis-py's pipeline, which follows the cluster, once the table is read
    again. A node that does not answer within `timeout` fails its calls with TimeoutError, as
    on a single Redis: they may have run, so they are not sent again."""

    def __init__(self, client, url: str, timeout: float):
        super().__init__(client, timeout)
        self._credentials = url_credentials(url)
        self._nodes: dict[str, ReplyProtocol] = {}  # "host:port" -> its connection
        self._connecting = asyncio.Lock()

    async def _send_once(self, calls: list[ScriptCall]) -> list:
        await self.client.initialize()  # reads the slot table the first time, then returns at once
        by_node: dict[str, list[int]] = {}
        nodes = {}
        for i, call in enumerate(calls):
            node = self.client.get_node_from_key(call.keys[0])
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(i)
        answers = await asyncio.gather(*(self._node_send(nodes[name], [calls[i] for i in positions])
                                         for name, positions in by_node.items()), return_exceptions=True)
        replies: list = [None] * len(calls)
        redo = []
        for positions, answer in zip(by_node.values(), answers):
            if isinstance(answer, RedisConnectionError):
                redo += positions
                continue
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancelled
                answer = [answer] * len(positions)
            for i, reply in zip(positions, answer):
                if isinstance(reply, ResponseError) and str(reply).startswith(_CLUSTER_REDIRECTS):
                    redo.append(i)
                else:
                    replies[i] = reply
        if redo:
            try:
                await self.client.nodes_manager.initialize()
            except Exception:  # the cluster is changing: redis-py's pipeline follows it as it can
                pass
            for i, reply in zip(redo, await super()._send_once([calls[i] for i in redo])):
                replies[i] = reply
        return replies

    async def _node_send(self, node, calls: list[ScriptCall]) -> list:
        protocol = self._nodes.get(node.name)
        if protocol is None or protocol.lost:
            protocol = await self._connect(node)
        return await _replies(protocol, [evalsha(call.script.sha, call.keys, call.args) for call in calls])

    async def _connect(self, node) -> ReplyProtocol:
        async with self._connecting:
            protocol = self._nodes.get(node.name)
            if protocol is None or protocol.lost:
                protocol = self._nodes[node.name] = await connect_node(node.host, node.port, timeout=self._timeout,
                                                                       **self._credentials)
            return protocol

    async def close(self) -> None:
        for protocol in self._nodes.values():
            protocol.transport.close()
        self._nodes.clear()


def script_runner(client, url: str, timeout: float) -> ScriptRunner:
    """The direct runners for a plain (redis:// or unix://) single Redis and for a cluster;
    redis-py's pipeline for a Sentinel's master (it follows failovers) and TLS."""
    if url.startswith(("redis://", "unix://")):
        return DirectScriptRunner(client, url, timeout)
    if is_cluster_url(url):
        return DirectClusterScriptRunner(client, url, timeout)
    return ScriptRunner(client, timeout)
