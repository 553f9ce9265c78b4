"""Writes: every state transition of a message, each one Lua script run atomically in Redis."""
import asyncio
import time
import uuid
from dataclasses import dataclass

from .messages import decode_message
from .runtime import Runtime
from .store import run_scripts


@dataclass(frozen=True)
class NewMessage:
    """A message as a producer sends it; ≤ 0 / < 0 values mean 'use the default' (SPEC §2)."""

    topic: str
    msg: str
    delay_millis: int
    msg_id: str | None = None
    ttl_millis: int = -1
    max_retry: int = -1


def _send_call(rt: Runtime, message: NewMessage):
    cfg = rt.config
    k = rt.ns.topic(message.topic)
    return (
        "send",
        [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.meta, k.stats],
        [
            message.msg_id or uuid.uuid4().hex,
            message.msg,
            message.delay_millis,
            message.ttl_millis if message.ttl_millis > 0 else cfg.ttl_millis,
            message.max_retry if message.max_retry >= 0 else cfg.max_retry,
            message.topic,
            rt.ns.ready_channel,
            rt.ns.schedule_channel,
            cfg.monitor_interval_millis,
        ],
    )


async def _register_topics(rt: Runtime, topics: set[str]) -> None:
    """Adds topics the send scripts saw for the first time (or after retirement) to the registry."""
    if topics:
        now = int(time.time() * 1000)
        await rt.redis.zadd(rt.ns.topics, {topic: now for topic in topics}, nx=True)


async def send_message(rt: Runtime, message: NewMessage) -> dict:
    """Enqueues one message; a live duplicate msgId returns the stored message unchanged."""
    name, keys, args = _send_call(rt, message)
    _created, raw, new_topic = await rt.call(name, keys, args)
    if new_topic:
        await _register_topics(rt, {message.topic})
    return decode_message(raw)


async def send_messages(rt: Runtime, messages: list[NewMessage]) -> list[dict | Exception]:
    """Enqueues many messages in one pipelined round trip; one result (or error) per message."""
    results = await run_scripts(rt.redis, [_send_call(rt, m) for m in messages])
    await _register_topics(
        rt, {m.topic for m, r in zip(messages, results) if not isinstance(r, Exception) and r[2]}
    )
    return [r if isinstance(r, Exception) else decode_message(r[1]) for r in results]


async def pull_messages(rt: Runtime, topic: str, batch: int = -1, ack_timeout_millis: int = -1) -> tuple[list[dict], int]:
    """Delivers up to `batch` ready messages, oldest first. Returns them and how many stay ready."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    result = await rt.call(
        "pull",
        [k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta],
        [
            batch if batch > 0 else cfg.pull_batch,
            ack_timeout_millis if ack_timeout_millis > 0 else cfg.ack_timeout_millis,
            cfg.ended_retention_millis,
            cfg.monitor_interval_millis,
            rt.ns.schedule_channel,
            topic,
        ],
    )
    return [decode_message(raw) for raw in result[1:]], int(result[0])


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
            await asyncio.wait({waiter}, timeout=time_left)
            if waiter.done():
                waiter = None  # the wake is used by the pull at the top of the loop
            else:
                notifier.discard(topic, waiter)
                waiter = None
    finally:
        if waiter is not None:
            notifier.discard(topic, waiter)


async def ack_message(rt: Runtime, topic: str, msg_id: str) -> int:
    """ack=true: a consuming message (3) becomes acked (4). Returns the resulting status, 0 if unknown."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    return await rt.call(
        "ack",
        [k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta],
        [msg_id, cfg.ended_retention_millis, cfg.monitor_interval_millis],
    )


async def nack_message(rt: Runtime, topic: str, msg_id: str) -> int:
    """ack=false: a consuming message is ready again at once (or ended if out of tries)."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    return await rt.call(
        "nack",
        [k.inflight, k.ready, k.msgs, k.expiry, k.ended, k.stats, k.meta],
        [msg_id, cfg.ended_retention_millis, cfg.monitor_interval_millis, rt.ns.ready_channel, topic],
    )


async def delete_message(rt: Runtime, topic: str, msg_id: str, release: bool = False) -> bool:
    """Deletes a live message (status 7); False if it is missing or already ended."""
    cfg = rt.config
    k = rt.ns.topic(topic)
    deleted = await rt.call(
        "delete",
        [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats],
        [msg_id, 1 if release else 0, cfg.ended_retention_millis, cfg.monitor_interval_millis],
    )
    return bool(deleted)
