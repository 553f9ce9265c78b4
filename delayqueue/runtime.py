"""What the services need at run time: the config, the Redis client and script runner, the
script context every call shares, the long-poll notifier, the message log's writer and the
operator data in force (limits, topic settings, token checks).

asyncio Redis connections belong to one event loop, so the web process keeps one Runtime per
loop (`current()`); the scanner and the tests build their own. A runtime serves one namespace
(`ns`); `for_namespace` gives the runtime of another, sharing the Redis connections.
"""
import asyncio
import os
import socket
import weakref

from asgiref.sync import async_to_sync

from delayqueue.config.settings import QueueConfig, load_config
from delayqueue.core.fair_share import FairShare
from delayqueue.live import client
from delayqueue.live.keys import namespace_keys
from delayqueue.live.notifier import ReadyNotifier
from delayqueue.live.runners import script_runner
from delayqueue.live.scripts import ScriptContext
from delayqueue.messagelog.connection import SharedConnection
from delayqueue.messagelog.group_commit import MessageLog
from delayqueue.stores.limits import LimitCache
from delayqueue.stores.tokens import TokenCache
from delayqueue.stores.topic_settings import TopicConfigCache

# Scanner passes in flight at once on a process' script connection, every namespace's together
# (workers/topic_worker.py). Redis serves the connection in order, so what is in flight is what a
# namespace's newly due message waits behind. A pass of DELAYQUEUE_SCANNER_BATCH (1,000) messages
# holds Redis about 10 ms.
SCANNER_PASSES_IN_FLIGHT = 16


class Runtime:
    def __init__(self, config: QueueConfig, process: str | None = None, *, namespace: str | None = None,
                 root: "Runtime | None" = None):
        self.config = config
        self.ns = namespace_keys(namespace or config.namespace)
        self.log_database = config.log_database_of(self.ns.namespace)  # the Django alias of its rows
        if root is None:
            self.redis = client.connect(config.redis_url, config.redis_timeout)
            self.scripts = script_runner(self.redis, config.redis_url, config.redis_timeout)
            # Granted round-robin among the namespaces waiting: one with hundreds of topics due waits
            # behind the others' passes as much as they wait behind its own.
            self.scanner_passes = FairShare(SCANNER_PASSES_IN_FLIGHT)
        else:
            self.redis, self.scripts, self.scanner_passes = root.redis, root.scripts, root.scanner_passes
        self._root = root
        self._namespaces: dict[str, Runtime] = {}
        self._notifier = None
        self._notifier_lock = asyncio.Lock()
        self._log = None
        self._schedule_db = self._schedule_reads = None
        self.limits = LimitCache(self.ns, self.log_database)  # read on first use
        self.topic_configs = TopicConfigCache(self.ns, self.log_database)  # read on first use
        self._tokens = None
        self.set_process(process or f"web pid {os.getpid()}")

    def set_process(self, process: str) -> None:
        """Names who makes the transitions this runtime runs: 'process@host' in the history
        rows, or '' when the message log is off (the scripts then record nothing)."""
        self.process = process
        self.actor = f"{process}@{socket.gethostname()}" if self.config.message_log else ""
        cfg = self.config
        self.context = ScriptContext(ns=self.ns, actor=self.actor, stats_interval_millis=cfg.monitor_interval_millis,
                                     retention_millis=cfg.ended_retention_millis, scan_limit=cfg.scanner_batch,
                                     pack_lead_millis=cfg.pack_lead)

    def for_namespace(self, namespace: str) -> "Runtime":
        """The runtime of `namespace`: this one's Redis client and scripts, its own keys, message
        log writer and notifier. Made once per namespace and closed with this one."""
        if namespace == self.ns.namespace:
            return self
        if self._root is not None:
            return self._root.for_namespace(namespace)
        rt = self._namespaces.get(namespace)
        if rt is None:
            rt = self._namespaces[namespace] = Runtime(self.config, self.process, namespace=namespace, root=self)
        return rt

    @property
    def tokens(self) -> TokenCache:
        """This process' cache of API token checks (stores/tokens.py)."""
        if self._tokens is None:
            config = self.config
            self._tokens = TokenCache(timeout_millis=config.log_timeout_millis, trust_seconds=config.token_trust_seconds,
                                      failure_limit=config.auth_failure_limit,
                                      failure_window_seconds=config.auth_failure_window_seconds)
        return self._tokens

    @property
    def log(self) -> MessageLog:
        """The message log's group-commit writer, connected on first use."""
        if self._log is None:
            self._log = MessageLog(self.ns.namespace, self.actor, self.config.log_timeout_millis,
                                   self.config.log_retry_millis, self.config.dedupe_window_millis,
                                   database=self.log_database)
        return self._log

    @property
    def schedule_db(self) -> SharedConnection:
        """The connection this namespace's schedule changes take in turn (services/schedules.py): a
        change waits on it for a planning round that holds its schedule's row."""
        if self._schedule_db is None:
            self._schedule_db = SharedConnection(self.config.log_timeout_millis, self.log_database)
        return self._schedule_db

    @property
    def schedule_reads(self) -> SharedConnection:
        """The connection this namespace's schedule reads take in turn, apart from the changes: a
        read waits for no planning round."""
        if self._schedule_reads is None:
            self._schedule_reads = SharedConnection(self.config.log_timeout_millis, self.log_database)
        return self._schedule_reads

    async def notifier(self) -> ReadyNotifier:
        """This namespace's long-poll wakes, subscribed on first use."""
        if self._notifier is None:
            async with self._notifier_lock:
                if self._notifier is None:
                    notifier = ReadyNotifier(self.config.redis_url, self.config.redis_timeout, self.ns)
                    await notifier.start()
                    self._notifier = notifier
        return self._notifier

    async def close(self) -> None:
        """Closes this runtime's connections; a root runtime also closes its namespaces' and the
        Redis client they share."""
        for rt in self._namespaces.values():
            await rt.close()
        self._namespaces.clear()
        if self._tokens is not None:
            await self._tokens.close()
            self._tokens = None
        await self.limits.close()
        await self.topic_configs.close()
        if self._log is not None:
            await self._log.close()
            self._log = None
        for db in (self._schedule_db, self._schedule_reads):
            if db is not None:
                await db.close()
        self._schedule_db = self._schedule_reads = None
        if self._notifier is not None:
            await self._notifier.stop()
            self._notifier = None
        if self._root is None:
            await self.scripts.close()
            await self.redis.aclose()


_runtimes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime]" = weakref.WeakKeyDictionary()


_last: tuple = (None, None)  # (loop, runtime) of the last call: a server process has one loop


def current() -> Runtime:
    global _last
    loop = asyncio.get_running_loop()
    if _last[0] is loop:
        return _last[1]
    rt = _runtimes.get(loop)
    if rt is None:
        rt = _runtimes[loop] = Runtime(load_config())
    _last = (loop, rt)
    return rt


async def close_current() -> None:
    """Closes this loop's runtime (its Redis and Postgres connections), if it has one."""
    global _last
    _last = (None, None)
    rt = _runtimes.pop(asyncio.get_running_loop(), None)
    if rt is not None:
        await rt.close()


def run_with_runtime(func, *args, **kwargs):
    """Runs `await func(rt, *args, **kwargs)` from sync code (the admin, the dashboard) with a
    fresh Runtime, closed before returning: asyncio Redis connections belong to one event loop,
    and async_to_sync may run each call on a different one."""

    async def call():
        rt = Runtime(load_config(), process=f"admin pid {os.getpid()}")
        try:
            return await func(rt, *args, **kwargs)
        finally:
            await rt.close()

    return async_to_sync(call)()
