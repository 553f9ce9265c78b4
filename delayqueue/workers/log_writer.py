"""The history side of the message log, run by `manage.py run_scanners` in its log process
(workers/log_process.py).

The Lua scripts append an entry per status change to their topic's Redis stream, atomically
with the change (a restore, one entry for all the messages of a script call); the send path
writes 'sent' rows itself, with the message row (services/send.py). The writer reads the streams
of the topics its scanner holds that have entries (a script publishes a notice when a stream
goes from empty to non-empty, which the writer subscribes to; every held stream is read every
few seconds all the same),
inserts the entries as history rows and moves each message row's status along, in one
transaction, and only then deletes the entries from Redis. A crash
between commit and delete means the entries are read again: the history insert fails on a row
it already has (unique on the stream entry id), and the writer inserts again skipping such rows;
the status update is idempotent, so nothing is lost and nothing is written twice. While Postgres
is down the entries wait in Redis.
"""
import asyncio
import dataclasses
import logging
import time
from operator import attrgetter

import orjson
import psycopg

from delayqueue.core.outage import Outage, describe
from delayqueue.core.stopping import cancel_and_wait
from delayqueue.live.history import Event
from delayqueue.live.keys import Shard
from delayqueue.live.pubsub import subscribe_forever
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection

log = logging.getLogger(__name__)

ERROR_BACKOFF = 1.0
# Every held stream is read at least this often, notice or not: a safety net only (a lost
# subscription marks every stream), which bounds what thousands of idle topics cost.
SWEEP_SECONDS = 5.0

def latest_per_message(events: list[Event]) -> list[Event]:
    """The last event of each life of each message: a stream is read in order, so later wins, but
    a sharded topic's streams are read one after another, so an ended life's last event may come
    after the next life's (UPDATE_MESSAGES applies only that of the life the row holds). It carries
    the latest times an earlier event of the same life moved (a reschedule followed by 'due')."""
    latest: dict[tuple[str, str, int], Event] = {}
    for e in events:
        key = (e.topic, e.msg_id, e.produce_time)
        before = latest.get(key)
        if e.trigger_time is None and before is not None and before.trigger_time is not None:
            e = dataclasses.replace(e, trigger_time=before.trigger_time, expire_time=before.expire_time)
        latest[key] = e
    return list(latest.values())


class LogWriter:
    def __init__(self, rt, topics):
        """`topics` returns the topics (a sharded topic's shards: live/keys.Shard) whose streams
        this writer drains (its scanner's)."""
        self.rt = rt
        self.topics = topics
        self.written = 0
        self._db = LogConnection(rt.config.log_timeout_millis, rt.log_database)
        # Per topic, the last entry read: the next read starts after it, so a batch can be read
        # while the previous one is still being committed. Forgotten after a failure, so what
        # was not committed is read again.
        self._read_up_to: dict[Shard, str] = {}
        self._noticed: set[Shard] = set()  # topics whose streams may hold unread entries
        self._held: set[Shard] = set()
        self._sweep_at = 0.0  # when to read every held stream, noticed or not
        # Set once the notices are subscribed to, or once subscribing failed (Redis down: the
        # reads fail too, and the sweep after a resubscription reads every stream).
        self.subscribed = asyncio.Event()

    def notice_all(self) -> None:
        """Notices may have been missed (the subscription was lost): read every stream."""
        self._sweep_at = 0.0

    async def run(self, stopping: asyncio.Event) -> None:
        listener = asyncio.ensure_future(self._listen())
        try:
            await self.subscribed.wait()  # a notice sent before it would be missed until a sweep
            await self._drain(stopping)
        finally:
            await cancel_and_wait(listener)

    async def _listen(self) -> None:
        def subscribed(rescan: bool) -> None:
            if rescan:
                self.notice_all()
            self.subscribed.set()

        def received(message: dict) -> None:
            shard = self.rt.ns.shard_of_history(message["channel"])
            if shard is not None:
                self._noticed.add(shard)

        await subscribe_forever(
            self.rt.config.redis_url, self.rt.config.redis_timeout, what=f"log writer ({self.rt.ns.namespace})",
            patterns=(self.rt.ns.history_pattern,), on_message=received, on_subscribed=subscribed,
            on_lost=self.subscribed.set)

    async def _drain(self, stopping: asyncio.Event) -> None:
        interval = self.rt.config.log_writer_interval_millis / 1000
        writing: asyncio.Task | None = None
        # Named by its namespace: one log process writes every namespace's, each to its own database.
        outage = Outage(log, f"log writer of namespace {self.rt.ns.namespace}: events wait in Redis")
        while not stopping.is_set():
            try:
                batch, full = await self._read()
                if writing is not None:
                    await writing
                    writing = None
                    outage.ok()  # a write went through (reads alone say nothing of PostgreSQL)
                if batch:
                    writing = asyncio.ensure_future(self._write(*batch))
                delay = 0 if full else interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outage.failed(describe(exc))
                if writing is not None:
                    writing.cancel()  # whatever it did not commit is read again
                    writing = None
                self._read_up_to.clear()
                self.notice_all()
                await self._db.close()
                delay = ERROR_BACKOFF
            if delay:
                try:
                    await asyncio.wait_for(stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        if writing is not None:
            await asyncio.gather(writing, return_exceptions=True)
        await self.close()

    async def drain_once(self) -> bool:
        """Reads and writes one batch of every held topic's pending events; True if a stream had more."""
        self.notice_all()
        batch, full = await self._read()
        if batch:
            await self._write(*batch)
        return full

    async def _read(self) -> tuple[tuple[list[Event], dict[str, list[str]]] | None, bool]:
        held = set(self.topics())
        for gone in self._read_up_to.keys() - held:
            del self._read_up_to[gone]
        taken, self._held = held - self._held, held  # a topic's previous holder may have left entries
        now = time.monotonic()
        if now >= self._sweep_at:
            topics = list(held)
            self._sweep_at = now + SWEEP_SECONDS
        else:
            topics = [t for t in held if t in self._noticed or t in taken]
        self._noticed.difference_update(topics)  # a notice arriving during the read marks it again
        if not topics:
            return None, False
        # The batch is shared by the topics read: a transaction of every held stream's backlog (after an
        # outage) grew with the topics past the statement timeout, and was tried again whole, for ever.
        count = max(1, self.rt.config.log_writer_batch // len(topics))
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic in topics:
            after = self._read_up_to.get(topic)
            pipe.xrange(self.rt.ns.topic(topic).events, min=f"({after}" if after else "-", count=count)
        replies = await pipe.execute()
        events, ids_by_topic, full = [], {}, False
        for topic, entries in zip(topics, replies):
            full = full or len(entries) == count
            ids, read = [], 0
            for entry_id, fields in entries:
                if read >= count:  # an entry may hold many events: a topic's share stops near `count`
                    full = True
                    break
                parsed = Event.parse(topic.topic, entry_id, fields)
                events += parsed
                read += len(parsed)
                ids.append(entry_id)
            if ids:
                ids_by_topic[topic] = ids
                self._read_up_to[topic] = ids[-1]
                self._noticed.add(topic)  # read on until a read finds nothing
        return ((events, ids_by_topic) if events else None), full

    async def _write(self, events: list[Event], ids_by_topic: dict[str, list[str]]) -> None:
        await self._commit(events)
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic, ids in ids_by_topic.items():
            pipe.xdel(self.rt.ns.topic(topic).events, *ids)
            # An entry added while these were still there sent no notice: read on if one is left.
            pipe.xlen(self.rt.ns.topic(topic).events)
        replies = await pipe.execute()
        for topic, left in zip(ids_by_topic, replies[1::2]):
            if left:
                self._noticed.add(topic)
        self.written += len(events)

    async def _commit(self, events: list[Event]) -> None:
        ns = self.rt.ns.namespace
        # The rows locked in msgId order, as the send path's group commit locks them: in other orders two
        # statements on the same rows deadlock, and PostgreSQL fails one (maybe a group of sends).
        latest = sorted(latest_per_message(events), key=attrgetter("topic", "msg_id"))
        inserted = {"namespace": ns, "events": orjson.dumps(events).decode()}
        topics = list({e.topic for e in latest})
        updated = {"namespace": ns, "events": orjson.dumps(latest).decode(), "topics": topics} if latest else None
        async with self._db.use() as conn:
            try:
                await self._commit_with(conn, sql.INSERT_EVENTS, inserted, updated)
            except psycopg.errors.UniqueViolation:  # rows written before: the transaction left nothing
                await self._commit_with(conn, sql.RECORD_EVENTS, inserted, updated)

    @staticmethod
    async def _commit_with(conn, insert: str, inserted: dict, updated: dict | None) -> None:
        async with conn.transaction():
            if updated:
                await conn.execute(sql.LOCK_TOPICS_WRITTEN, updated)
            await conn.execute(insert, inserted)
            if updated:
                await conn.execute(sql.UPDATE_MESSAGES, updated)

    async def close(self) -> None:
        """Closes the writer's PostgreSQL connection (it reconnects if used again)."""
        await self._db.close()
