"""The history side of the message log, run inside `manage.py run_scanners`.

The Lua scripts append one entry per status change to their topic's Redis stream, atomically
with the change. The writer reads the streams of the topics its scanner holds, inserts the
entries as history rows and moves each message row's status along, in one transaction, and
only then deletes the entries from Redis. A crash between commit and delete means the entries
are read again: the history insert skips rows it already has (unique on the stream entry id)
and the status update is idempotent, so nothing is lost and nothing is written twice. While
Postgres is down the entries wait in Redis.
"""
import asyncio
import logging
from dataclasses import dataclass

import psycopg

from .messagelog import EVENT_TABLE, MESSAGE_TABLE, LogUnavailable, connect, first_line

log = logging.getLogger(__name__)

ERROR_BACKOFF = 1.0

_INSERT_EVENTS = f"""
INSERT INTO {EVENT_TABLE} (namespace, topic, msg_id, event_id, at, from_status, to_status, retry, reason, process, host)
SELECT %s, t, i, e, to_timestamp(at / 1000.0), f, s, r, w, pr, h
FROM unnest(%s::text[], %s::text[], %s::text[], %s::int8[], %s::int2[], %s::int2[], %s::int4[], %s::text[],
            %s::text[], %s::text[]) AS u(t, i, e, at, f, s, r, w, pr, h)
ON CONFLICT (namespace, topic, msg_id, event_id) DO NOTHING
"""
# Only the life of the message the row describes (same produceTime) moves its status, and
# never backwards in time (two writers may briefly overlap while a topic changes hands).
_UPDATE_MESSAGES = f"""
UPDATE {MESSAGE_TABLE} m SET status = u.s, retry = u.r, updated_at = to_timestamp(u.at / 1000.0)
FROM unnest(%s::text[], %s::text[], %s::int2[], %s::int4[], %s::int8[], %s::int8[]) AS u(t, i, s, r, at, pt)
WHERE m.namespace = %s AND m.topic = u.t AND m.msg_id = u.i
  AND m.produce_time = to_timestamp(u.pt / 1000.0) AND m.updated_at <= to_timestamp(u.at / 1000.0)
"""


@dataclass(frozen=True, slots=True)
class Event:
    topic: str
    entry_id: str
    msg_id: str
    from_status: int
    to_status: int
    retry: int
    produce_time: int
    reason: str
    process: str
    host: str

    @property
    def at(self) -> int:
        return int(self.entry_id.split("-", 1)[0])

    @classmethod
    def parse(cls, topic: str, entry_id: str, fields: dict) -> "Event":
        process, _, host = fields["a"].rpartition("@")
        return cls(topic, entry_id, fields["i"], int(fields["f"]), int(fields["t"]), int(fields["r"]),
                   int(fields["p"]), fields["w"], process, host)


def history_columns(events: list[Event]) -> list[list]:
    return [[e.topic for e in events], [e.msg_id for e in events], [e.entry_id for e in events],
            [e.at for e in events], [e.from_status for e in events], [e.to_status for e in events],
            [e.retry for e in events], [e.reason for e in events], [e.process for e in events],
            [e.host for e in events]]


def latest_per_message(events: list[Event]) -> list[Event]:
    """The last event of each message: a stream is read in order, so later wins."""
    return list({(e.topic, e.msg_id): e for e in events}.values())


class LogWriter:
    def __init__(self, rt, topics):
        """`topics` returns the topics whose streams this writer drains (its scanner's)."""
        self.rt = rt
        self.topics = topics
        self.written = 0
        self._conn: psycopg.AsyncConnection | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        interval = self.rt.config.log_writer_interval_millis / 1000
        while not stopping.is_set():
            try:
                full = await self.drain_once()
                delay = 0 if full else interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("log writer: %s; events wait in Redis", first_line(exc))
                await self._drop_connection()
                delay = ERROR_BACKOFF
            if delay:
                try:
                    await asyncio.wait_for(stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        await self._drop_connection()

    async def drain_once(self) -> bool:
        """Writes one batch of every held topic's pending events; True if a stream had more."""
        topics = list(self.topics())
        if not topics:
            return False
        batch = self.rt.config.log_writer_batch
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic in topics:
            pipe.xrange(self.rt.ns.topic(topic).events, count=batch)
        replies = await pipe.execute()
        events, ids_by_topic, full = [], {}, False
        for topic, entries in zip(topics, replies):
            if not entries:
                continue
            full = full or len(entries) == batch
            ids_by_topic[topic] = [entry_id for entry_id, _ in entries]
            events.extend(Event.parse(topic, entry_id, fields) for entry_id, fields in entries)
        if not events:
            return False
        await self._commit(events)
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic, ids in ids_by_topic.items():
            pipe.xdel(self.rt.ns.topic(topic).events, *ids)
        await pipe.execute()
        self.written += len(events)
        return full

    async def _commit(self, events: list[Event]) -> None:
        ns = self.rt.config.namespace
        latest = latest_per_message(events)
        if self._conn is None or self._conn.closed:
            self._conn = await connect()
        try:
            async with self._conn.transaction():
                await self._conn.execute(_INSERT_EVENTS, [ns, *history_columns(events)])
                await self._conn.execute(_UPDATE_MESSAGES, [
                    [e.topic for e in latest], [e.msg_id for e in latest], [e.to_status for e in latest],
                    [e.retry for e in latest], [e.at for e in latest], [e.produce_time for e in latest], ns,
                ])
        except psycopg.Error as exc:
            await self._drop_connection()
            raise LogUnavailable(f"message log unavailable: {first_line(exc)}") from None

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:
                pass
