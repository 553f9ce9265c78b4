"""The send side of the PostgreSQL message log: group-committed message rows and their
'sent' history rows.

A send is answered 200 only after its row is committed. Sends that arrive while a write is in
flight wait and go together in the next one (one multi-row statement, one commit), so the
number of Postgres round trips grows with time, not with messages.

A write PostgreSQL could not take because it could not be reached (a restart, a connection
refused or lost) is tried again with a short back-off until the retry bound
(DELAYQUEUE_LOG_RETRY_MILLIS) after the log was first found unreachable; then it fails as the
log's other errors do, and so does every write's first failure until one succeeds again. The
bound counts from the outage, not from each send: a send that queued behind a busy log is not
failed sooner, and in a long outage none waits longer. Every statement here may run twice: a try
whose connection was lost may have committed.
"""
import asyncio
import functools
import logging
import time
from collections.abc import Set
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import orjson
import psycopg

from delayqueue.core.constants import Reason, Status
from delayqueue.core.exceptions import LogMaybeWritten, LogUnavailable, LogUnreachable, MaybeSent
from delayqueue.core.messages import Message
from delayqueue.core.retry import retry_pauses
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection

log = logging.getLogger(__name__)


def _rows_json(rows: list[Message]) -> str:
    """Messages as the statements read them (sql.record(Message)), in the order of their keys: two
    processes' statements that take the same rows' locks in opposite orders deadlock, and the
    loser's whole group of sends fails (as after a restart, when clients resend alike)."""
    return orjson.dumps(sorted(rows, key=attrgetter("key"))).decode()


class Recorded(NamedTuple):
    """What MessageLog.record did, per row given."""

    written: list[bool]  # the log now holds the row as given
    # The message the log keeps under the row's msgId instead: ended (within the dedupe window, or
    # a dead letter: the send answers it and sends nothing) or live (Redis answers, if it holds it).
    kept: list[Message | None]
    replaced: list[bool]  # written over another row of the msgId (an ended life, or this send's own try)


class Deleted(NamedTuple):
    """A message the log holds as deleted (MessageLog.deleted_message)."""

    message: Message
    row_id: int
    ended: int  # ms, as its end was stamped (Redis' clock, by the cold tier's deletes and purges)


# What one statement did: the keys it wrote, those of them written over a row, and the messages it kept
# in their place.
_Written = tuple[set[tuple[str, str]], set[tuple[str, str]], dict[tuple[str, str], Message]]


@dataclass
class _Request:
    rows: list[Message]
    keys: Set[tuple[str, str]]  # of the rows, distinct: worked out once per request
    overwrite: bool
    future: asyncio.Future
    started: list[sql.Started]  # an overwrite's: when Redis began the lives it knows of


class MessageLog:
    """Group commit over one autocommit connection per event loop. `actor` ('process@host')
    is who the 'sent' history rows name; `timeout_millis` bounds each statement, `retry_millis`
    the retries of a write while PostgreSQL cannot be reached; a send does not replace a message
    that ended less than `dedupe_window_millis` ago, nor a dead letter."""

    MAX_ROWS = 5000
    # After a group whose plain INSERT met a logged msgId, this many go straight to sql.RECORD:
    # a producer that resends msgIds then wastes one statement in this many, not every other.
    UPSERTS_AFTER_CONFLICT = 100

    def __init__(self, namespace: str, actor: str, timeout_millis: int, retry_millis: int,
                 dedupe_window_millis: int, database: str):
        self._namespace = namespace
        self._dedupe_window_millis = dedupe_window_millis
        process, _, host = actor.rpartition("@")
        self._actor = {"process": process, "host": host}  # who the 'sent' history rows name
        self._db = LogConnection(timeout_millis, database)
        self._retry_seconds = retry_millis / 1000
        self._pending: list[_Request] = []
        self._flusher: asyncio.Task | None = None
        self._upserts_left = 0
        self._unreachable_since: float | None = None  # time.monotonic() of this outage's first failure

    async def record(self, rows: list[Message]) -> Recorded:
        """Writes new messages and their 'sent' history rows. A row is not written where a live
        message with that msgId is already logged or an ended one the dedupe window or the dead
        letters keep is (either answered in `kept`, and left untouched), or where it repeats an
        earlier msgId of the same call (a batch naming one msgId twice)."""
        first: dict[tuple[str, str], int] = {}
        for i, row in enumerate(rows):
            first.setdefault(row.key, i)
        written, replaced, kept = await self._submit([rows[i] for i in first.values()], first.keys(),
                                                     overwrite=False)
        recorded = Recorded([False] * len(rows), [None] * len(rows), [False] * len(rows))
        for key, i in first.items():
            recorded.written[i] = key in written
            recorded.kept[i] = kept.get(key)
            recorded.replaced[i] = key in replaced
        return recorded

    async def overwrite(self, rows: list[Message], started_us: list[int | None]) -> None:
        """Makes the log hold exactly these rows (what Redis answered a send with), each life that Redis
        began at `started_us` (its clock, µs; None: not known) in place of one it began before."""
        by_key = {row.key: row for row in rows}
        started = [sql.Started(row.topic, row.msg_id, row.produce_time, at)
                   for row, at in zip(rows, started_us) if at is not None]
        await self._submit(list(by_key.values()), by_key.keys(), overwrite=True, started=started)

    async def forget(self, rows: list[Message]) -> None:
        """Removes rows (and their 'sent' history) this process wrote for sends that Redis then
        did not take."""
        params = {"namespace": self._namespace, "unsent": _rows_json(rows)}
        await self._retried(lambda conn, _again: conn.execute(sql.FORGET, params))

    async def correct_sent(self, unsent: list[Message], sent: list[Message]) -> None:
        """Removes the 'sent' history of `unsent` rows and writes (or corrects) that of `sent`."""
        params = {"namespace": self._namespace, "unsent": _rows_json(unsent), "rows": _rows_json(sent), **self._actor}
        await self._retried(lambda conn, _again: conn.execute(sql.CORRECT_SENT, params))

    async def settle(self, rows: list[Message], recorded: Recorded, replies: list, outcomes: list) -> None:
        """Makes the log agree with what Redis did with recorded sends (`replies`: the send
        script's SendReply or the error per row; `outcomes`: the message each send answers with,
        replaced here by the error when the log cannot be corrected). Rows for sends Redis refused
        are removed (not those it may have taken: MaybeSent); a msgId whose state only Redis knew
        (the log lags a few ms behind it: a live duplicate, or one ended within the dedupe window)
        gets Redis' message; so does a message that was due
        by the time Redis took it (ready, where the row said waiting); and a row written over another
        that Redis took (a correction of an earlier life may have moved it meanwhile). The 'sent' history
        follows: it names exactly the sends Redis took, with their status."""
        refused, corrections, started, unsent, sent = [], [], [], [], []
        for i, (row, was_written, replaced, reply) in enumerate(zip(rows, recorded.written, recorded.replaced,
                                                                    replies)):
            if isinstance(reply, MaybeSent):
                continue  # Redis may have taken it: the row stays
            if isinstance(reply, Exception):
                if was_written:
                    refused.append(row)
            elif reply.created and (not was_written or reply.status != row.status):
                corrections.append(i)  # only Redis knew the last life had ended, or it was due by then
                sent.append(outcomes[i])
            elif reply.created and replaced:
                started.append(i)  # its start, for a late correction of an earlier life not to undo it
            elif not reply.created and was_written:
                corrections.append(i)  # a duplicate only Redis knew
                unsent.append(row)
        if refused:
            try:
                await self.forget(refused)
            except LogUnavailable as exc:
                log.error("could not remove %d logged sends that Redis refused: %s", len(refused), exc)
        if corrections or started:
            both = corrections + started
            try:
                await self.overwrite([outcomes[i] for i in both], [replies[i].started_us for i in both])
                if corrections:
                    await self.correct_sent(unsent, sent)
            except LogUnavailable as exc:
                for i in corrections:
                    outcomes[i] = exc
                if started:  # their rows are the sends' own: answered, as Redis took them
                    log.error("could not record when Redis began %d logged sends: %s", len(started), exc)

    def _submit(self, rows: list[Message], keys: Set[tuple[str, str]], overwrite: bool,
                started: list[sql.Started] = ()) -> asyncio.Future:
        """Queues rows with distinct keys; resolves to what the statement did (_Written)."""
        future = asyncio.get_running_loop().create_future()
        if not rows:
            future.set_result((set(), set(), {}))
            return future
        self._pending.append(_Request(rows, keys, overwrite, future, list(started)))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return future

    def _take_batch(self) -> tuple[list[_Request], set[tuple[str, str]]]:
        """Pending requests of the first one's kind whose keys do not clash (one statement may
        touch a row only once), and their keys."""
        kind = self._pending[0].overwrite
        batch, keys, rest, size = [], set(), [], 0
        for request in self._pending:
            if request.overwrite == kind and size < self.MAX_ROWS and keys.isdisjoint(request.keys):
                batch.append(request)
                keys.update(request.keys)
                size += len(request.rows)
            else:
                rest.append(request)
        self._pending = rest
        return batch, keys

    async def _flush(self) -> None:
        while self._pending:
            batch, keys = self._take_batch()
            write = functools.partial(self._write, rows=[row for request in batch for row in request.rows], keys=keys,
                                      overwrite=batch[0].overwrite,
                                      started=[at for request in batch for at in request.started])
            try:
                written = await self._retried(write)
            except LogUnavailable as exc:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request in batch:
                if not request.future.done():
                    request.future.set_result(written)

    async def _retried(self, statement):
        """`await statement(conn, again)` on the log's connection, tried again while PostgreSQL
        cannot be reached, until the retry bound after the outage began; `again` says an earlier
        try failed (and may have committed). Raises LogMaybeWritten when a try that may have
        committed (its connection lost, or no answer in time) is not followed by one that answers."""
        pauses, again, sent = None, False, False
        while True:
            try:
                async with self._db.use() as conn:
                    sent = True
                    result = await statement(conn, again)
                self._unreachable_since = None
                return result
            except LogUnreachable as exc:
                if self._unreachable_since is None:
                    self._unreachable_since = time.monotonic()
                if pauses is None:
                    pauses = retry_pauses(self._unreachable_since + self._retry_seconds)
                pause = next(pauses, None)
                if pause is None:
                    raise LogMaybeWritten(str(exc), exc.detail) if sent else exc
            await asyncio.sleep(pause)
            again = True

    async def _write(self, conn: psycopg.AsyncConnection, again: bool, *, rows: list[Message],
                     keys: set[tuple[str, str]], overwrite: bool, started: list[sql.Started]) -> _Written:
        if overwrite:
            params = {"namespace": self._namespace, "rows": _rows_json(rows), "started": orjson.dumps(started).decode()}
            async with conn.transaction():
                await conn.execute(sql.LOCK_TOPICS_MOVED, params)
                cursor = await conn.execute(sql.OVERWRITE, params)
                moved = {tuple(row) for row in await cursor.fetchall()}
                if started:
                    await conn.execute(sql.STAMP_STARTED, params)
                return moved, set(), {}
        params = {"namespace": self._namespace, "rows": _rows_json(rows), **self._actor}
        # Tried again, the rows may be there already: RECORD knows them as this send's own.
        if self._upserts_left == 0 and not again:
            try:
                await conn.execute(sql.INSERT_NEW, params)
                return keys, set(), {}
            except psycopg.errors.UniqueViolation:  # the statement left nothing behind
                self._upserts_left = self.UPSERTS_AFTER_CONFLICT
        self._upserts_left = max(self._upserts_left - 1, 0)
        cursor = await conn.execute(sql.RECORD, {**params, "ended": Status.ACKED,
                                                 "dedupe_window": self._dedupe_window_millis})
        written, replaced, kept = set(), set(), {}
        for topic, msg_id, was_written, was_replaced, *message in await cursor.fetchall():
            if was_written:
                written.add((topic, msg_id))
                if was_replaced:
                    replaced.add((topic, msg_id))
            else:
                kept[topic, msg_id] = Message(topic, msg_id, *message)
        return written, replaced, kept

    # A cold message is a waiting row after its topic's loader position, `after`: (triggerTime ms,
    # row id), Meta.LOADED_TO's.

    async def cold_message(self, topic: str, msg_id: str, after: tuple[int, int]) -> Message | None:
        """The cold message the log holds under the msgId (getMsg of one Redis does not hold)."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id, "after_time": after[0],
                  "after_id": after[1]}
        row = await self._retried(lambda conn, _again: self._fetch_one(conn, sql.COLD_MESSAGE, params))
        return None if row is None else Message(*row)

    async def delete_cold(self, topic: str, msg_id: str, after: tuple[int, int], *, now: int) -> Message | None:
        """Deletes the cold message the log holds under the msgId (one Redis does not hold), with
        its history row, stamped `now` (Redis' clock, ms); the message as deleted, None if the log
        held none cold."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id, "deleted": Status.DELETED, "now": now,
                  "waiting": Status.WAITING, "reason": Reason.DELETED.value, "after_time": after[0],
                  "after_id": after[1], **self._actor}
        row = await self._retried(lambda conn, _again: self._fetch_one(conn, sql.DELETE_COLD, params))
        return None if row is None else Message(*row)

    async def live_message(self, topic: str, msg_id: str) -> Message | None:
        """The live message the log holds under the msgId, whatever its status (sql.LIVE_MESSAGE)."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id}
        row = await self._retried(lambda conn, _again: self._fetch_one(conn, sql.LIVE_MESSAGE, params))
        return None if row is None else Message(*row)

    async def deleted_message(self, topic: str, msg_id: str) -> Deleted | None:
        """The message the log holds under the msgId if it ended deleted (sql.DELETED_MESSAGE)."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id, "deleted": Status.DELETED}
        row = await self._retried(lambda conn, _again: self._fetch_one(conn, sql.DELETED_MESSAGE, params))
        return None if row is None else Deleted(Message(*row[:-2]), row[-2], row[-1])

    async def delete_lost(self, message: Message, *, now: int) -> None:
        """Deletes the message's life, if still live, with its history row stamped `now` (Redis'
        clock, ms; sql.DELETE_LOST)."""
        params = {"namespace": self._namespace, "topic": message.topic, "msg_id": message.msg_id, "now": now,
                  "produce_time": message.produce_time, "deleted": Status.DELETED, "reason": Reason.DELETED.value,
                  **self._actor}
        await self._retried(lambda conn, _again: conn.execute(sql.DELETE_LOST, params))

    async def end_released(self, topic: str, msg_id: str, after: tuple[int, int], *, now: int) -> None:
        """Ends as deleted, stamped `now` (Redis' clock, ms), the waiting row after `after` of a
        message Redis deleted with its body released (sql.END_RELEASED)."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id, "deleted": Status.DELETED, "now": now,
                  "after_time": after[0], "after_id": after[1]}
        await self._retried(lambda conn, _again: conn.execute(sql.END_RELEASED, params))

    async def reschedule_cold(self, topic: str, msg_id: str, after: tuple[int, int],
                              trigger_time: int, *, now: int) -> tuple[Message, int] | None:
        """Gives the cold message the log holds under the msgId (one Redis does not hold) a new
        trigger time, with its history row stamped `now` (Redis' clock, ms); the message as
        rescheduled and its trigger time before, None if the log held none cold."""
        params = {"namespace": self._namespace, "topic": topic, "msg_id": msg_id, "trigger": trigger_time, "now": now,
                  "reason": Reason.RESCHEDULED.value, "after_time": after[0], "after_id": after[1], **self._actor}
        row = await self._retried(lambda conn, _again: self._fetch_one(conn, sql.RESCHEDULE_COLD, params))
        return None if row is None else (Message(*row[:-1]), row[-1])

    async def cold_after(self, topic: str, after_time: int, after_id: int, limit: int) -> list[tuple[int, str, int, int]]:
        """Up to `limit` of the topic's waiting rows after the position (triggerTime ms, row id),
        in that order: (row id, msgId, produceTime, triggerTime) each."""
        params = {"namespace": self._namespace, "topic": topic, "after_time": after_time, "after_id": after_id,
                  "limit": limit}

        async def page(conn, _again):
            async with conn.transaction():
                await conn.execute(sql.IN_INDEX_ORDER)
                return await (await conn.execute(sql.COLD_AFTER, params)).fetchall()

        return await self._retried(page)

    async def purge_cold(self, row_ids: list[int], *, now: int) -> dict[int, int]:
        """Ends those of the rows still waiting as deleted, with their history rows, stamped `now`
        (Redis' clock, ms; purgeTopic in the cold tier); how many, per hour they fell due in
        (triggerTime // COLD_HOUR_MILLIS)."""
        params = {"namespace": self._namespace, "ids": row_ids, "deleted": Status.DELETED, "waiting": Status.WAITING,
                  "now": now,
                  "reason": Reason.PURGED.value, **self._actor}
        return dict(await self._retried(lambda conn, _again: self._fetch_all(conn, sql.PURGE_COLD, params)))

    @staticmethod
    async def _fetch_one(conn: psycopg.AsyncConnection, statement: str, params: dict):
        return await (await conn.execute(statement, params)).fetchone()

    @staticmethod
    async def _fetch_all(conn: psycopg.AsyncConnection, statement: str, params: dict):
        return await (await conn.execute(statement, params)).fetchall()

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._db.close()
