"""Writes: every state transition of a message, each one Lua script run atomically in Redis."""
import asyncio
import logging
import random
import time
from dataclasses import dataclass

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.exceptions import LogUnavailable
from delayqueue.messagelog.group_commit import LoggedMessage
from delayqueue.constants import Status
from delayqueue.messages import decode_message
from delayqueue.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 6x as much to build, per message
class NewMessage:
    """A message as a producer sends it; ≤ 0 / < 0 values mean 'use the default' (SPEC §2)."""

    topic: str
    msg: str
    delay_millis: int
    msg_id: str | None = None
    ttl_millis: int = -1
    max_retry: int = -1


_LOW_62 = (1 << 62) - 1


def _new_msg_id(produce_time: int) -> str:
    """A version 7 UUID (RFC 9562) in 32 hex digits, as camellia's dashless UUIDs: the
    millisecond first, then 74 random bits. Ids made in time order go in at the right-hand end
    of the message log's msgId indexes instead of at random pages, which costs PostgreSQL a
    quarter less per logged send and does not grow with the log (docs/benchmarks.md). Ids must be
    unique, not secret (the API that acks by id is open to every client): the Mersenne Twister
    is enough, and unlike os.urandom makes no system call per id. Python reseeds it in a forked
    child, so worker processes do not repeat ids."""
    rand = random.getrandbits(74)
    return f"{produce_time << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0b10 << 62 | rand & _LOW_62:032x}"


def _now_millis() -> int:
    return time.time_ns() // 1_000_000


def _prepare(rt: Runtime, message: NewMessage, produce_time: int) -> LoggedMessage:
    """The message with its defaults applied and its times fixed, as the log and Redis get it."""
    cfg = rt.config
    delay = max(message.delay_millis, 0)
    trigger = produce_time + delay
    return LoggedMessage(
        namespace=cfg.namespace,
        topic=message.topic,
        msg_id=message.msg_id or _new_msg_id(produce_time),
        payload=message.msg,
        produce_time=produce_time,
        trigger_time=trigger,
        expire_time=trigger + (message.ttl_millis if message.ttl_millis > 0 else cfg.ttl_millis),
        max_retry=message.max_retry if message.max_retry >= 0 else cfg.max_retry,
        retry=0,
        status=Status.READY if delay == 0 else Status.WAITING,
    )


def _send_call(rt: Runtime, row: LoggedMessage):
    k = rt.ns.topic(row.topic)
    return (
        "send",
        [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.meta, k.stats],
        [
            row.msg_id,
            row.payload,
            row.trigger_time - row.produce_time,
            row.expire_time - row.trigger_time,
            row.max_retry,
            row.topic,
            rt.ns.ready_channel,
            rt.ns.schedule_channel,
            rt.config.monitor_interval_millis,
            row.produce_time,
        ],
    )


def _as_message(row: LoggedMessage, status: int) -> dict:
    """A message the send script created, as clients see it: the row it was sent as, with the
    status Redis gave it (ready if it was already due when Redis took it)."""
    return {"topic": row.topic, "msgId": row.msg_id, "msg": row.payload, "produceTime": row.produce_time,
            "triggerTime": row.trigger_time, "expireTime": row.expire_time, "maxRetry": row.max_retry,
            "retry": row.retry, "status": status}


def _logged(namespace: str, message: dict) -> LoggedMessage:
    return LoggedMessage(
        namespace=namespace, topic=message["topic"], msg_id=message["msgId"], payload=message["msg"],
        produce_time=message["produceTime"], trigger_time=message["triggerTime"],
        expire_time=message["expireTime"], max_retry=message["maxRetry"], retry=message["retry"],
        status=message["status"],
    )


async def _register_topics(rt: Runtime, topics: set[str]) -> None:
    """Adds topics the send scripts saw for the first time (or after retirement) to the registry."""
    now = int(time.time() * 1000)
    await rt.redis.zadd(rt.ns.topics, {topic: now for topic in topics}, nx=True)


async def send_message(rt: Runtime, message: NewMessage) -> dict:
    """Enqueues one message; a live duplicate msgId returns the stored message unchanged.
    Raises LogUnavailable (nothing enqueued) when the message log cannot take it."""
    outcome = (await send_messages(rt, [message]))[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def send_messages(rt: Runtime, messages: list[NewMessage]) -> list[dict | Exception]:
    """Enqueues messages; one result (the stored message) or error per message.

    With the message log on, the order is: commit the rows in Postgres (group commit), then
    run the send scripts in one pipelined Redis round trip. A send answered with a message is
    therefore in the log; a log failure enqueues nothing. Where the log and Redis disagree
    about a msgId that was already live, Redis decides and the log is set to its answer.
    """
    produce_time = _now_millis()
    rows = [_prepare(rt, m, produce_time) for m in messages]
    if rt.config.message_log:
        try:
            written = await rt.log.record(rows)
        except LogUnavailable as exc:
            return [exc] * len(rows)
    calls = [_send_call(rt, row) for row in rows]
    try:
        # A single send shares its round trip with the loop's other calls.
        results = [await rt.call(*calls[0])] if len(calls) == 1 else await rt.scripts.run(calls)
    except RedisTimeoutError as exc:
        # Written but not answered: Redis may yet run them. Each stays in the log, and its answer
        # names its msgId, under which sending it again is safe (a live msgId is not enqueued twice).
        results = [RedisTimeoutError(f"{exc}; the message may have been enqueued: send it again with "
                                     f"msgId {row.msg_id} to be sure") for row in rows]
    except RedisError as exc:  # Redis unreachable: each message fails, and leaves the log
        results = [exc] * len(calls)
    outcomes: list[dict | Exception] = [
        r if isinstance(r, Exception) else _as_message(row, r[1]) if r[0] else decode_message(r[1])
        for row, r in zip(rows, results)
    ]
    if rt.config.message_log:
        await _settle_log(rt, rows, written, results, outcomes)
    new_topics = {row.topic for row, r in zip(rows, results) if not isinstance(r, Exception) and r[2]}
    if new_topics:
        await _register_topics(rt, new_topics)
    return outcomes


async def _settle_log(rt: Runtime, rows, written, results, outcomes) -> None:
    """Makes the log agree with what Redis did: rows for sends Redis refused are removed (not
    those it did not answer in time: it may have taken them); a msgId whose live state only
    Redis knew (the log lags a few ms behind it) gets Redis' message; so does a message that was
    due by the time Redis took it (ready, where the row said waiting). The 'sent' history
    follows: it names exactly the sends Redis took, with their status."""
    refused, corrections, unsent, sent = [], [], [], []
    for i, (row, was_written, result) in enumerate(zip(rows, written, results)):
        if isinstance(result, RedisTimeoutError):
            continue  # Redis may have taken it: the row stays
        if isinstance(result, Exception):
            if was_written:
                refused.append(row)
        elif result[0] and (not was_written or result[1] != row.status):
            corrections.append(i)  # only Redis knew the last life had ended, or it was due by then
            sent.append(_logged(rt.config.namespace, outcomes[i]))
        elif not result[0] and was_written:
            corrections.append(i)  # a live duplicate only Redis knew
            unsent.append(row)
    if refused:
        try:
            await rt.log.forget(refused)
        except LogUnavailable as exc:
            log.error("could not remove %d logged sends that Redis refused: %s", len(refused), exc)
    if corrections:
        try:
            await rt.log.overwrite([_logged(rt.config.namespace, outcomes[i]) for i in corrections])
            await rt.log.correct_sent(unsent, sent)
        except LogUnavailable as exc:
            for i in corrections:
                outcomes[i] = exc


async def pull_messages(rt: Runtime, topic: str, batch: int = -1, ack_timeout_millis: int = -1) -> tuple[list[dict], int]:
    """Delivers up to `batch` ready messages, oldest first. Returns them and how many stay ready."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    result = await rt.call(
        "pull",
        [k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events],
        [
            batch if batch > 0 else cfg.pull_batch,
            ack_timeout_millis if ack_timeout_millis > 0 else cfg.ack_timeout_millis,
            cfg.ended_retention_millis,
            cfg.monitor_interval_millis,
            rt.ns.schedule_channel,
            topic,
            rt.actor,
        ],
    )
    return [decode_message(raw) for raw in result[1:]], int(result[0])


def _time_up(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


async def long_poll_messages(
    rt: Runtime, topic: str, batch: int = -1, ack_timeout_millis: int = -1, timeout_millis: int = -1
) -> list[dict]:
    """Pulls at once; if nothing is ready, holds until a message is or the timeout passes, then
    answers with one last pull. Holding costs a future, not a thread."""
    cfg = rt.config
    if timeout_millis <= 0:
        timeout_millis = cfg.long_polling_timeout_millis
    timeout_millis = min(timeout_millis, cfg.max_long_polling_timeout_millis)
    notifier = await rt.notifier()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_millis / 1000
    waiter = None
    try:
        while True:
            # Register before pulling, so a wake published between the pull and the wait is kept.
            waiter = notifier.register(topic)
            messages, remaining = await pull_messages(rt, topic, batch, ack_timeout_millis)
            time_left = deadline - loop.time()
            if messages or time_left <= 0:
                if messages and remaining > 0:
                    await notifier.pass_on(topic, remaining)
                return messages
            # A timer that resolves the waiter itself (False: time is up) holds fewer objects per
            # held poll than asyncio.wait, which matters with thousands held (docs/benchmarks.md).
            timer = loop.call_at(deadline, _time_up, waiter)
            try:
                woken = await waiter
            finally:
                timer.cancel()
            if not woken:
                notifier.discard(topic, waiter)
            waiter = None  # a wake is used by the pull at the top of the loop
    finally:
        if waiter is not None:
            notifier.discard(topic, waiter)


async def ack_message(rt: Runtime, topic: str, msg_id: str) -> int:
    """ack=true: a consuming message (3) becomes acked (4). Returns the resulting status, 0 if unknown."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    return await rt.call(
        "ack",
        [k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events],
        [msg_id, cfg.ended_retention_millis, cfg.monitor_interval_millis, rt.actor],
    )


async def nack_message(rt: Runtime, topic: str, msg_id: str) -> int:
    """ack=false: a consuming message is ready again at once (or ended if out of tries)."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    return await rt.call(
        "nack",
        [k.inflight, k.ready, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events],
        [msg_id, cfg.ended_retention_millis, cfg.monitor_interval_millis, rt.ns.ready_channel, topic, rt.actor],
    )


async def delete_message(rt: Runtime, topic: str, msg_id: str, release: bool = False) -> bool:
    """Deletes a live message (status 7); False if it is missing or already ended."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    deleted = await rt.call(
        "delete",
        [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.events],
        [msg_id, 1 if release else 0, cfg.ended_retention_millis, cfg.monitor_interval_millis, rt.actor],
    )
    return bool(deleted)
