"""A scanner's runner of redrive tasks (one per scanner, started beside its log writer).

A scanner takes an unfinished task whose lease ran out (SKIP LOCKED), then moves its dead letters
in batches at the task's rate. Each batch is one transaction that turns the rows into new lives
(ready now, retry 0, history reason 'redriven'), advances the task's position and count, and
records the batch as `sending`; the send scripts then put them into Redis, and `sending` is
cleared. A scanner killed at any point leaves a task whose lease runs out: the next one sends
what `sending` names that Redis does not hold yet (the same life, by produceTime), and goes on
from the position. A row moves only while it is still dead, in one transaction holding its lock,
so nothing is moved twice; the position follows the rows in their (updated_at, id) order, so
nothing is skipped.
"""
import asyncio
import contextlib
import logging
import time

import orjson
from psycopg.types.json import Jsonb

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Status
from delayqueue.core.messages import Message
from delayqueue.core.outage import Outage
from delayqueue.core.stopping import repeat
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.messagelog.dead_letters import Task
from delayqueue.services.send import register_shards, run_sends, send_calls, target_shards

log = logging.getLogger(__name__)

# How often an idle scanner looks for a redrive task to take.
CLAIM_EVERY_SECONDS = 1.0

# A batch is a tenth of a second's worth at the task's rate (at least 1, at most this many).
MAX_BATCH = 1000

RETRY_AFTER_FAILURE = 0.5


class Redriver:
    """A scanner's runner of redrive tasks: takes one whose lease ran out, runs it to the end
    (renewing the lease with every batch), then looks for the next."""

    def __init__(self, rt, owner: str):
        self.rt = rt
        self.owner = owner
        self.lease_millis = rt.config.scanner_lock_ttl_millis
        self._db = LogConnection(rt.config.log_timeout_millis, rt.log_database)
        process, _, host = rt.actor.rpartition("@")
        self._actor = {"process": process, "host": host}

    async def run(self, stopping: asyncio.Event) -> None:
        async def step() -> float:
            task = await self._claim()
            if task is None:
                return CLAIM_EVERY_SECONDS
            log.info("scanner %s runs redrive task %d of topic %s", self.owner, task.id, task.topic)
            await self._run_task(task, stopping)
            return 0

        try:
            await repeat(step, stopping, outage=Outage(log, f"redrive runner {self.owner}"),
                         after_failure=self._db.close, retry_seconds=RETRY_AFTER_FAILURE)
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
        # A task made before DELAYQUEUE_MAX_REDRIVE_RATE was lowered runs at the cap.
        rate = min(task.max_per_second, self.rt.config.max_redrive_rate)
        size = max(1, min(MAX_BATCH, rate // 10))
        started, moved = time.monotonic(), 0
        while not stopping.is_set():
            if not await self._pause_until(task, started + moved / rate, stopping):
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
                     for rid, _at, msg_id, payload, max_retry, ttl, priority, _status in rows]
            lives = [sql.NewLife(b[5], now, now + b[3], row[-1]) for b, row in zip(batch, rows)]
            await conn.execute(sql.REDRIVE_ROWS, {"rows": orjson.dumps(lives).decode(), "ready": Status.READY,
                                                  **self._actor})
            task.after_time, task.after_id = rows[-1][1], rows[-1][0]
            await conn.execute(sql.REDRIVE_PROGRESS, {"id": task.id, "after_time": task.after_time,
                                                      "after_id": task.after_id, "moved": len(rows),
                                                      "sending": Jsonb(batch)})
        task.moved += len(rows)
        return batch

    async def _finish_sending(self, task: Task) -> None:
        async with self._db.use() as conn:
            await conn.execute(sql.REDRIVE_SENT, {"id": task.id, "owner": self.owner})
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
        # Resumed, the lives are looked for in every count: the topic may have been resharded since they were sent.
        shards = await target_shards(rt, messages, messages if resumed else None)
        # A resumed batch may have reached Redis but not the registry: its shards are registered again.
        new_shards = set(shards) if resumed else set()
        if resumed:
            pipe = rt.redis.pipeline(transaction=False)
            for m, shard in zip(messages, shards):
                pipe.hget(rt.ns.topic(shard).msgs, m.msg_id)
            going = [i for i, raw in enumerate(await pipe.execute())
                     if raw is None or Message.from_stored(raw, messages[i].msg_id).produce_time
                     != messages[i].produce_time]
            messages, shards = [messages[i] for i in going], [shards[i] for i in going]
        replies = await run_sends(rt, send_calls(rt, messages, shards=shards, redrive=True)) if messages else []
        if failed := next((reply for reply in replies if isinstance(reply, Exception)), None):
            raise failed
        # A topic retired since its messages died is registered again, as a send does, for the scanners to run it.
        new_shards |= {shard for shard, reply in zip(shards, replies) if reply.new_topic}
        if new_shards:
            await register_shards(rt, shards=list(new_shards), at=now_millis())
        for message, reply in zip(messages, replies):
            if not reply.created and reply.stored.produce_time != message.produce_time:
                # A live message under this msgId that only Redis knew of (the log lags it by
                # milliseconds): Redis' message is the one that is live, as for a send.
                await rt.log.overwrite([reply.stored], [None])
