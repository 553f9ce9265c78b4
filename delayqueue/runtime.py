"""What the services need at run time: the config, the Redis client, the long-poll notifier and
the limits in force.

asyncio Redis connections belong to one event loop, so the web process keeps one Runtime per
loop (`current()`); the scanner and the tests build their own.
"""
import asyncio
import os
import socket
import weakref

from delayqueue.live import client
from delayqueue.live.runners import script_runner
from delayqueue.conf import QueueConfig, load_config
from delayqueue.limits import LimitCache
from delayqueue.live.keys import namespace_keys


class Runtime:
    def __init__(self, config: QueueConfig, process: str | None = None):
        self.config = config
        self.ns = namespace_keys(config.namespace)
        self.redis = client.connect(config.redis_url, config.redis_timeout)
        self.scripts = script_runner(self.redis, config.redis_url, config.redis_timeout)
        self._notifier = None
        self._notifier_lock = asyncio.Lock()
        self._log = None
        self.limits = LimitCache(self.redis, self.ns)  # read on first use
        self.set_process(process or f"web pid {os.getpid()}")

    def set_process(self, process: str) -> None:
        """Names who makes the transitions this runtime runs: 'process@host' in the history
        rows, or '' when the message log is off (the scripts then record nothing)."""
        self.actor = f"{process}@{socket.gethostname()}" if self.config.message_log else ""

    @property
    def log(self):
        """The message log's group-commit writer, connected on first use."""
        if self._log is None:
            from delayqueue.messagelog.group_commit import MessageLog

            self._log = MessageLog(self.config.namespace, self.actor, self.config.log_timeout_millis)
        return self._log

    async def notifier(self):
        if self._notifier is None:
            async with self._notifier_lock:
                if self._notifier is None:
                    from delayqueue.live.notifier import ReadyNotifier

                    notifier = ReadyNotifier(self.config.redis_url, self.config.redis_timeout, self.ns.ready_channel)
                    await notifier.start()
                    self._notifier = notifier
        return self._notifier

    async def close(self) -> None:
        await self.limits.close()
        if self._log is not None:
            await self._log.close()
            self._log = None
        if self._notifier is not None:
            await self._notifier.stop()
            self._notifier = None
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
