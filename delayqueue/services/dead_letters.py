"""Dead letters: messages that ended as status 5 (their TTL ran out before any delivery) or 6
(their deliveries or TTL ran out after a delivery, or their consumer dead-lettered them), kept in
the message log, not in Redis, for
DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS (retention.py).

Listing and purging are single statements; a redrive is a task row that the scanners run
(workers/redriver.py)."""
from dataclasses import dataclass

from psycopg.types.json import Jsonb

from delayqueue.core.constants import REDRIVE_DEFAULT_RATE, Reason, Status
from delayqueue.core.exceptions import CapReached
from delayqueue.core.messages import Message
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import one_use
from delayqueue.messagelog.dead_letters import Task, left_to_move, parse_cursor
from delayqueue.runtime import Runtime
from delayqueue.services.messages import redis_millis


@dataclass(frozen=True)
class DeadLetter:
    message: Message
    reason: str  # the history reason it died with ('' when its history is gone)
    died_at: int  # epoch ms
    detail: str = ""  # the consumer's reason on the nack that ended it ('' when none)


@dataclass(frozen=True)
class RedriveProgress:
    moved: int  # dead letters sent back so far
    left: int  # dead letters still to send back
    done: bool


def _scope(rt: Runtime, topic: str, msg_ids: list[str] | None) -> dict:
    return {"namespace": rt.ns.namespace, "topic": topic, "msg_ids": msg_ids}


async def dead_letters(rt: Runtime, *, topic: str, limit: int,
                       cursor: str | None) -> tuple[list[DeadLetter], str | None]:
    """One page of the topic's dead letters, oldest death first; and the cursor of the next page
    (None after the last)."""
    after, after_id = parse_cursor(cursor)
    async with one_use(rt.config.log_timeout_millis, rt.log_database) as conn:
        found = await conn.execute(sql.DEAD_PAGE, {**_scope(rt, topic, None), "after": after, "after_id": after_id,
                                                   "limit": limit + 1})
        rows = await found.fetchall()
    page = [DeadLetter(Message(*row[2:12]), row[13] or "", row[12], row[14] or "") for row in rows[:limit]]
    next_cursor = f"{rows[limit - 1][1]}.{rows[limit - 1][0]}" if len(rows) > limit else None
    return page, next_cursor


async def purge_dead_letters(rt: Runtime, *, topic: str, msg_ids: list[str] | None = None, batch: int = 5000) -> int:
    """Removes the topic's dead letters (only those in msg_ids when given): ends them as deleted
    (sql.PURGE_DEAD), in batches of one transaction each; answers how many messages went."""
    removed = 0
    process, _, host = rt.actor.rpartition("@")
    params = {**_scope(rt, topic, msg_ids), "batch": batch, "deleted": Status.DELETED, "reason": Reason.PURGED.value,
              "process": process, "host": host}
    async with one_use(rt.config.log_timeout_millis, rt.log_database) as conn:
        while True:
            # Redis' clock read per batch: a letter dying meanwhile is stamped after its death.
            found = await conn.execute(sql.PURGE_DEAD, {**params, "now": await redis_millis(rt)})
            count = (await found.fetchone())[0]
            removed += count
            if count < batch:
                return removed


async def create_redrive(rt: Runtime, *, topic: str, msg_ids: list[str] | None,
                         max_per_second: int | None = None) -> int | None:
    """A redrive task for the topic's dead letters (those in msg_ids when given); its id, or None
    when there is no such dead letter. The scanners run it. CapReached (429) for a rate above
    DELAYQUEUE_MAX_REDRIVE_RATE, as every cap of a namespace answers; no rate given: the default, or
    the cap when that is lower (the caller asked for no rate the cap could refuse)."""
    if max_per_second is None:
        max_per_second = min(REDRIVE_DEFAULT_RATE, rt.config.max_redrive_rate)
    if max_per_second > rt.config.max_redrive_rate:
        raise CapReached(f"maxPerSecond {max_per_second} is over the redrive rate cap",
                         setting="DELAYQUEUE_MAX_REDRIVE_RATE", cap=rt.config.max_redrive_rate)
    now = await redis_millis(rt)
    async with one_use(rt.config.log_timeout_millis, rt.log_database) as conn:
        found = await conn.execute(sql.CREATE_REDRIVE, {
            **_scope(rt, topic, msg_ids), "msg_ids_json": None if msg_ids is None else Jsonb(msg_ids),
            "rate": max_per_second, "now": now})
        row = await found.fetchone()
    return None if row is None else row[0]


async def redrive_state(rt: Runtime, *, task_id: int) -> RedriveProgress | None:
    """How far a redrive task of this namespace has got; None if there is none."""
    async with one_use(rt.config.log_timeout_millis, rt.log_database) as conn:
        found = await conn.execute(sql.REDRIVE_STATE, {"id": task_id, "namespace": rt.ns.namespace})
        row = await found.fetchone()
        if row is None:
            return None
        task = Task(*row)
        left = 0 if task.done else await left_to_move(conn, namespace=rt.ns.namespace, task=task)
    return RedriveProgress(task.moved, left, task.done)
