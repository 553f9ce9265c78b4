"""Dead letters: messages that ended as status 6 (their deliveries or TTL ran out after a
delivery, or their consumer dead-lettered them), kept in the message log, not in Redis, for
DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS (retention.py).

Listing and purging are single statements. A redrive is a task row that the scanners run
(`Redriver`, one per scanner): a scanner takes an unfinished task whose lease ran out (SKIP
LOCKED), then moves its dead letters in batches at the task's rate. Each batch is one
transaction that turns the rows into new lives (ready now, retry 0, history reason 'redriven'),
advances the task's position and count, and records the batch as `sending`; the send scripts
then put them into Redis, and `sending` is cleared. A scanner killed at any point leaves a task
whose lease runs out: the next one sends what `sending` names that Redis does not hold yet
(the same life, by produceTime), and goes on from the position. A row moves only while it is
still dead, in one transaction holding its lock, so nothing is moved twice; the position
follows the rows in their (updated_at, id) order, so nothing is skipped.
"""
import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime

import orjson
from psycopg.types.json import Jsonb

from delayqueue.core.constants import Status
from delayqueue.core.clock import now_millis
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection, one_use
from delayqueue.core.messages import Message
from delayqueue.core.outage import Outage, describe
from delayqueue.services import send_call

log = logging.getLogger(__name__)

# How often an idle scanner looks for a redrive task to take.
CLAIM_EVERY_SECONDS = 1.0
# A batch is a tenth of a second's worth at the task's rate (at least 1, at most this many).
MAX_BATCH = 1000
RETRY_AFTER_FAILURE = 0.5


def _scope(rt, topic: str, msg_ids: list[str] | None) -> dict:
    return {"namespace": rt.ns.namespace, "topic": topic, "msg_ids": msg_ids}


def parse_cursor(cursor: str | None) -> tuple[int | None, int]:
    """A page's position from the nextCursor an earlier page answered (validated by the API:
    digits, a dot, digits); none: the first page."""
    if not cursor:
        return None, 0
    micros, _, row_id = cursor.partition(".")
    return int(micros), int(row_id)


async def dead_letters(rt, *, topic: str, limit: int, cursor: str | None,
                       msg_ids: list[str] | None = None) -> tuple[list[dict], str | None]:
    """One page of the topic's dead letters, oldest death first, each as the API shows a message
    plus deadReason and deadTime (ms); and the cursor of the next page (None after the last)."""
    after, after_id = parse_cursor(cursor)
    async with one_use(rt.config.log_timeout_millis) as conn:
        found = await conn.execute(sql.DEAD_PAGE, {**_scope(rt, topic, msg_ids), "after": after, "after_id": after_id,
                                                   "limit": limit + 1})
        rows = await found.fetchall()
    page = []
    for row in rows[:limit]:
        wire = Message(*row[2:11]).to_wire()
        wire["deadReason"] = row[12] or ""
        wire["deadTime"] = row[11]
        page.append(wire)
    next_cursor = f"{rows[limit - 1][1]}.{rows[limit - 1][0]}" if len(rows) > limit else None
    return page, next_cursor


async def purge_dead_letters(rt, *, topic: str, msg_ids: list[str] | None = None, batch: int = 5000) -> int:
    """Removes the topic's dead letters (only those in msg_ids when given) and their history, in
    batches of one transaction each; answers how many messages went."""
    removed = 0
    async with one_use(rt.config.log_timeout_millis) as conn:
        while True:
            found = await conn.execute(sql.PURGE_DEAD, {**_scope(rt, topic, msg_ids), "batch": batch})
            count = (await found.fetchone())[0]
            removed += count
            if count < batch:
                return removed


async def create_redrive(rt, *, topic: str, msg_ids: list[str] | None, max_per_second: int) -> int | None:
    """A redrive task for the topic's dead letters (those in msg_ids when given); its id, or None
    when there is no such dead letter. The scanners run it."""
    async with one_use(rt.config.log_timeout_millis) as conn:
        found = await conn.execute(sql.CREATE_REDRIVE, {
            **_scope(rt, topic, msg_ids), "msg_ids_json": None if msg_ids is None else Jsonb(msg_ids),
            "rate": max_per_second})
        row = await found.fetchone()
    return None if row is None else row[0]


@dataclass
class Task:
    id: int
    topic: str
    msg_ids: list[str] | None
    max_per_second: int
    created_at: datetime
    after_time: datetime | None
    after_id: int
    moved: int
    sending: list | None
    done: bool

    def bounds(self, namespace: str, limit: int | None) -> dict:
        return {"namespace": namespace, "topic": self.topic, "msg_ids": self.msg_ids, "created_at": self.created_at,
                "after_time": self.after_time, "after_id": self.after_id, "limit": limit}


async def redrive_state(rt, *, task_id: int) -> dict | None:
    """moved, left and state (running, done) of a task of this namespace; None if there is none."""
    async with one_use(rt.config.log_timeout_millis) as conn:
        found = await conn.execute(sql.REDRIVE_STATE, {"id": task_id, "namespace": rt.ns.namespace})
        row = await found.fetchone()
        if row is None:
            return None
        task = Task(*row)
        left = 0 if task.done else await left_to_move(conn, namespace=rt.ns.namespace, task=task)
    return {"moved": task.moved, "left": left, "state": "done" if task.done else "running"}


async def left_to_move(conn, *, namespace: str, task: Task) -> int:
    """How many dead letters an unfinished task has still to move."""
    counted = await conn.execute(sql.REDRIVE_LEFT, task.bounds(namespace, None))
    return (await counted.fetchone())[0]


class Redriver:
    """A scanner's runner of redrive tasks: takes one whose lease ran out, runs it to the end
    (renewing the lease with every batch), then looks for the next."""

    def __init__(self, rt, owner: str):
        self.rt = rt
        self.owner = owner
        self.lease_millis = rt.config.scanner_lock_ttl_millis
        self._db = LogConnection(rt.config.log_timeout_millis)
        process, _, host = rt.actor.rpartition("@")
        self._actor = {"process": process, "host": host}

    async def run(self, stopping: asyncio.Event) -> None:
        outage = Outage(log, f"redrive runner {self.owner}")
        try:
            while not stopping.is_set():
                try:
                    task = await self._claim()
                    if task is not None:
                        log.info("scanner %s runs redrive task %d of topic %s", self.owner, task.id, task.topic)
                        await self._run_task(task, stopping)
                    outage.ok()
                    pause = 0 if task is not None else CLAIM_EVERY_SECONDS
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    outage.failed(describe(exc))
                    await self._db.close()
                    pause = RETRY_AFTER_FAILURE
                if pause:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stopping.wait(), pause)
        finally:
            await self._db.close()

    async def _claim(self) -> Task | None:
        async with self._db.use() as conn:
            found = await conn.execute(sql.CLAIM_REDRIVE, {"owner": self.owner, "lease_millis": self.lease_millis,
                                                           "namespace": self.rt.ns.namespace})
            row = await found.fetchone()
        return None if row is None else Task(*row)

    async def _run_task(self, task: Task, stopping: asyncio.Event) -> None:
        """Moves the task's dead letters at its rate: batch i + 1 goes no sooner than
        (messages moved so far) / rate after the first, so the rate holds over the run."""
        if task.sending:
            await self._send(task.topic, task.sending, resumed=True)
            await self._finish_sending(task)
        size = max(1, min(MAX_BATCH, task.max_per_second // 10))
        started, moved = time.monotonic(), 0
        while not stopping.is_set():
            if not await self._pause_until(task, started + moved / task.max_per_second, stopping):
                return
            batch = await self._take_batch(task, size)
            if batch is None:
                return  # the lease went to another scanner
            if not batch:
                async with self._db.use() as conn:
                    await conn.execute(sql.REDRIVE_DONE, {"id": task.id})
                log.info("redrive task %d of topic %s done: %d moved", task.id, task.topic, task.moved)
                return
            await self._send(task.topic, batch, resumed=False)
            await self._finish_sending(task)
            moved += len(batch)

    async def _pause_until(self, task: Task, until: float, stopping: asyncio.Event) -> bool:
        """Waits for the rate, renewing the lease meanwhile; False if stopping or the lease is lost."""
        while (left := until - time.monotonic()) > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), min(left, self.lease_millis / 3000))
            if stopping.is_set():
                return False
            async with self._db.use() as conn:
                found = await conn.execute(sql.HOLD_REDRIVE, {"id": task.id, "owner": self.owner,
                                                              "lease_millis": self.lease_millis})
                if await found.fetchone() is None:
                    return False
        return not stopping.is_set()

    async def _take_batch(self, task: Task, size: int) -> list | None:
        """One transaction: the lease held and renewed, the next dead letters turned into new
        lives, the progress and the batch to send recorded. None if the lease was lost."""
        now = now_millis()
        async with self._db.use() as conn, conn.transaction():
            held = await conn.execute(sql.HOLD_REDRIVE, {"id": task.id, "owner": self.owner,
                                                         "lease_millis": self.lease_millis})
            if await held.fetchone() is None:
                return None
            found = await conn.execute(sql.NEXT_DEAD, task.bounds(self.rt.ns.namespace, size))
            rows = await found.fetchall()
            if not rows:
                return []
            batch = [[msg_id, payload, max_retry, max(ttl, 1), now, rid, priority]
                     for rid, _at, msg_id, payload, max_retry, ttl, priority in rows]
            await conn.execute(sql.REDRIVE_ROWS, {
                "rows": orjson.dumps([{"id": b[5], "pt": now, "et": now + b[3]} for b in batch]).decode(),
                "ready": Status.READY, "dead": Status.EXHAUSTED, **self._actor})
            task.after_time, task.after_id = rows[-1][1], rows[-1][0]
            await conn.execute(sql.REDRIVE_PROGRESS, {"id": task.id, "after_time": task.after_time,
                                                      "after_id": task.after_id, "moved": len(rows),
                                                      "sending": Jsonb(batch)})
        task.moved += len(rows)
        return batch

    async def _finish_sending(self, task: Task) -> None:
        async with self._db.use() as conn:
            await conn.execute(sql.REDRIVE_SENT, {"id": task.id})
        task.sending = None

    async def _send(self, topic: str, batch: list, resumed: bool) -> None:
        """Puts the batch's new lives into Redis with the send script (no limits: a redrive is the
        operator's, paced by its own rate). Resumed after a scanner died, a life Redis already
        holds (same produceTime, in any status) is not sent again. Raises if Redis fails: the
        batch stays `sending`, and is sent by whoever runs the task next."""
        rt = self.rt
        # A batch recorded before priorities has no seventh value: priority 0.
        messages = [Message(topic, msg_id, payload, pt, pt, pt + ttl, max_retry, 0, Status.READY, (*priority, 0)[0])
                    for msg_id, payload, max_retry, ttl, pt, _rid, *priority in batch]
        if resumed:
            stored = await rt.redis.hmget(rt.ns.topic(topic).msgs, [m.msg_id for m in messages])
            messages = [m for m, raw in zip(messages, stored)
                        if raw is None or orjson.loads(raw)["produceTime"] != m.produce_time]
        if not messages:
            return
        replies = await rt.scripts.run_all([send_call(rt, m) for m in messages])
        for message, reply in zip(messages, replies):
            if not reply.created and Message.from_stored(reply.stored).produce_time != message.produce_time:
                # A live message under this msgId that only Redis knew of (the log lags it by
                # milliseconds): Redis' message is the one that is live, as for a send.
                await rt.log.overwrite([Message.from_stored(reply.stored)])
