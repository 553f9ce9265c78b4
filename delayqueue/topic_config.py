"""A topic's own settings (the TopicConfig model) as the queue uses them.

PostgreSQL holds them. Two copies serve the hot paths:

- Each Runtime reads its namespace's settings on first use and every REFRESH_SECONDS after
  (TopicConfigCache, as limits.LimitCache does), so a send or a pull never waits on PostgreSQL or
  depends on Redis for its defaults, and a change is in force on every web process within a
  second (at once on the process that made it, which reads again).
- The topic's Redis meta hash mirrors the settings the scripts act on (MIRROR_FIELDS): the retry
  backoff (requeue_timed_out.lua, nack.lua) and the pause (pull.lua); and the dead-letter switch,
  which no script reads (dead letters are judged in the message log, sql.KEEPS_DEAD). Written by
  every change and written back by restore (messagelog/recovery.py, spark/restore.py) after Redis
  lost its data; a topic retired by the scanner keeps them (retire_topic.lua only drops its
  registration).

A pull of a paused topic hands out nothing if either copy says paused: the mirror makes a pause
exact the moment it is answered, the cache keeps it while a Redis that lost its data waits for
its restore. Reading fails open as the limits do: the settings last read stay in force.
"""
import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delayqueue.constants import RETRY_BACKOFF_MAX_MILLIS
from delayqueue.exceptions import LogUnavailable
from delayqueue.live.keys import NamespaceKeys
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection

if TYPE_CHECKING:
    from delayqueue.runtime import Runtime

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5
READ_TIMEOUT_MILLIS = 2_000


@dataclass(frozen=True)
class TopicSettings:
    ttl_millis: int | None = None  # None: the service's default (conf.py)
    max_retry: int | None = None
    ack_timeout_millis: int | None = None
    retry_backoff_millis: int = 0  # 0: ready again at once after an ack timeout
    retry_backoff_max_millis: int = RETRY_BACKOFF_MAX_MILLIS
    dead_letter: bool = True
    paused: bool = False


DEFAULT = TopicSettings()

# Meta hash field -> how a TopicSettings gives its value, as the scripts read it.
MIRROR_FIELDS = {
    "retry_backoff": lambda s: s.retry_backoff_millis,
    "retry_backoff_max": lambda s: s.retry_backoff_max_millis,
    "dead_letter": lambda s: int(s.dead_letter),
    "paused": lambda s: int(s.paused),
}


def settings_table(rows) -> dict[str, TopicSettings]:
    """Topic -> settings, from the rows of sql.TOPIC_CONFIGS."""
    return {topic: TopicSettings(*values) for topic, *values in rows}


class TopicConfigCache:
    """One namespace's topic settings, read from PostgreSQL on first use and every
    REFRESH_SECONDS after. The hot paths read `current` and call table() only before the first read."""

    def __init__(self, ns: NamespaceKeys):
        self._ns = ns
        self._db = LogConnection(READ_TIMEOUT_MILLIS)
        self.current: dict[str, TopicSettings] | None = None
        self._first_read: asyncio.Future | None = None
        self._refresher: asyncio.Task | None = None
        self._failing = False

    async def table(self) -> dict[str, TopicSettings]:
        if self.current is None:
            if self._first_read is None:
                self._first_read = asyncio.ensure_future(self._read())
                self._refresher = asyncio.ensure_future(self._refresh_forever())
            await asyncio.shield(self._first_read)
        return self.current

    async def settings(self, topic: str) -> TopicSettings:
        table = self.current if self.current is not None else await self.table()
        return table.get(topic, DEFAULT)

    async def fresh(self) -> dict[str, TopicSettings]:
        """The table read now (and in force in this process from now). Raises LogUnavailable."""
        async with self._db.use() as conn:
            cursor = await conn.execute(sql.TOPIC_CONFIGS, [self._ns.namespace])
            rows = await cursor.fetchall()
        self.current = settings_table(rows)
        return self.current

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await self._read()
            except Exception:  # the refresher must outlive any one failed read
                log.exception("reading the topic settings of namespace %s failed", self._ns.namespace)

    async def _read(self) -> None:
        try:
            await self.fresh()
        except LogUnavailable as exc:
            if not self._failing:
                log.warning("topic settings of namespace %s could not be read, %s: %s", self._ns.namespace,
                            "the defaults are in force until they can" if self.current is None else
                            "the settings last read stay in force", exc)
                self._failing = True
            if self.current is None:
                self.current = {}  # requests are not held by it
            return
        if self._failing:
            log.warning("topic settings of namespace %s read again", self._ns.namespace)
            self._failing = False

    async def close(self) -> None:
        for task in (self._refresher, self._first_read):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._refresher = self._first_read = None
        await self._db.close()


async def write_mirrors(rt: "Runtime", settings: dict[str, TopicSettings]) -> None:
    """Writes each topic's settings into its meta hash, in one pipelined round trip. Raises RedisError."""
    if not settings:
        return
    pipe = rt.redis.pipeline(transaction=False)
    for topic, values in settings.items():
        pipe.hset(rt.ns.topic(topic).meta, mapping={field: get(values) for field, get in MIRROR_FIELDS.items()})
    await pipe.execute()
