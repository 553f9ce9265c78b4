"""Consuming: pulls and long polls hand out ready messages (highest priority first, oldest first
within a priority), and acks, nacks and touches settle them; the HTTP API and the pushers alike."""
import asyncio
import random
import time

from redis.exceptions import RedisError

from delayqueue.core.exceptions import Conflict, NotFound, Throttled, redis_unavailable
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.runtime import Runtime
from delayqueue.services import admission
from delayqueue.stores import refreshed
from delayqueue.stores.limits import NAMESPACE

# A long poll of a paused topic pulls again at least this often: as often as the settings are read.
PAUSED_RECHECK_SECONDS = refreshed.REFRESH_SECONDS


async def pull_messages(rt: Runtime, *, topic: str, batch: int = -1,
                        ack_timeout_millis: int = -1) -> tuple[list[dict], int]:
    """Delivers up to `batch` ready messages, the highest priority first and the oldest first within
    a priority. Returns them and how many stay ready.
    Under a consume rate it hands out at most as many as there are tokens, and raises Throttled
    when there is none (of the namespace's bucket or the topic's). A paused topic, or one with a
    push URL (its pushers take its messages), hands out none."""
    messages, reply = await _pull(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis)
    return messages, reply.remaining


async def _pull(rt: Runtime, *, topic: str, batch: int,
                ack_timeout_millis: int) -> tuple[list[dict], scripts.PullReply]:
    """pull_messages' messages in the API's form, and the script's reply."""
    cfg = rt.config
    settings = await rt.topic_configs.settings(topic)
    if settings.paused or settings.push_url:  # a push topic's messages go to its URL: consumers get none
        return [], scripts.PullReply(0, [], 0, paused=True)
    if ack_timeout_millis <= 0:
        ack_timeout_millis = settings.ack_timeout_millis or cfg.ack_timeout_millis
    batch = batch if batch > 0 else cfg.pull_batch
    table = await rt.limits.table()
    namespace = table.get(NAMESPACE) if table else None
    topic_rate = table[topic].consume_rate if table and topic in table else 0
    reserved = 0
    if namespace and namespace.consume_rate:
        batch = reserved = await admission.reserve_consume(rt, namespace=namespace, wanted=batch)
    reply = await rt.scripts.call(scripts.pull(
        rt.ns.topic(topic), batch=batch,
        ack_timeout_millis=ack_timeout_millis,
        retention_millis=cfg.ended_retention_millis, stats_interval_millis=cfg.monitor_interval_millis,
        schedule_channel=rt.ns.schedule_channel, topic=topic, actor=rt.actor, consume_rate=topic_rate,
        promote_limit=cfg.scanner_batch, ready_channel=rt.ns.ready_channel))
    if reserved > len(reply.messages):
        await admission.give_back_consume(rt, namespace=namespace, unused=reserved - len(reply.messages))
    if reply.retry_after_millis:
        refusal = admission.rate_refusal(rt, kind="consume", topic=topic, rate=topic_rate,
                                      retry_after_millis=reply.retry_after_millis)
        await admission.count_refusals(rt, [refusal])
        raise refusal
    return [Message.from_stored(raw).to_wire() for raw in reply.messages], reply


def _time_up(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


async def long_poll_messages(rt: Runtime, *, topic: str, batch: int = -1, ack_timeout_millis: int = -1,
                             timeout_millis: int = -1) -> list[dict]:
    """Pulls at once; if nothing is ready, holds until a message is or the timeout passes, then
    answers with one last pull. Holding costs a future, not a thread. Over a consume rate it
    holds too, until the bucket has a token (answering an empty list if the time is up first)."""
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
            try:
                messages, reply = await _pull(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis)
            except Throttled as exc:
                notifier.discard(topic, waiter)
                waiter = None
                pause = min(exc.retry_after_millis / 1000, deadline - loop.time())
                if pause <= 0:
                    return []
                await asyncio.sleep(pause)
                continue
            time_left = deadline - loop.time()
            if messages or time_left <= 0:
                if messages and reply.remaining > 0:
                    await notifier.pass_on(topic, reply.remaining)
                return messages
            if reply.next_due_us > 0 and reply.next_due_us / 1_000_000 < time_left:
                notifier.wake_at(topic, time.monotonic() + reply.next_due_us / 1_000_000)
            # A timer that resolves the waiter itself (False: time is up) holds fewer objects per
            # held poll than asyncio.wait, which matters with thousands held (docs/benchmarks.md).
            # A paused topic is looked at again now and then: a resume answered by another
            # process is seen here once this one's settings are read again.
            wake_at = min(deadline, loop.time() + PAUSED_RECHECK_SECONDS) if reply.paused else deadline
            timer = loop.call_at(wake_at, _time_up, waiter)
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


async def ack_message(rt: Runtime, *, topic: str, msg_id: str) -> scripts.AckReply:
    """ack=true: a consuming message becomes acked. Answers whether it did (done) and the
    message's status after the call (0: unknown)."""
    return await rt.scripts.call(ack_call(rt, topic=topic, msg_id=msg_id))


async def nack_message(rt: Runtime, *, topic: str, msg_id: str, delay_millis: int = -1,
                       dead_letter: bool = False) -> scripts.AckReply:
    """ack=false: a consuming message is ready again at once (or waiting out its topic's retry
    backoff), or waiting for `delay_millis` (-1: none given), or ended if out of tries; with `dead_letter` it ends now as a dead letter
    (status 6, reason dead_lettered). Answered as ack_message."""
    return await rt.scripts.call(nack_call(rt, topic=topic, msg_id=msg_id, delay_millis=delay_millis,
                                           dead_letter=dead_letter))


def ack_call(rt: Runtime, *, topic: str, msg_id: str) -> scripts.ScriptCall:
    cfg = rt.config
    return scripts.ack(rt.ns.topic(topic), msg_id=msg_id, retention_millis=cfg.ended_retention_millis,
                       stats_interval_millis=cfg.monitor_interval_millis, actor=rt.actor)


def nack_call(rt: Runtime, *, topic: str, msg_id: str, delay_millis: int, dead_letter: bool) -> scripts.ScriptCall:
    cfg = rt.config
    return scripts.nack(
        rt.ns.topic(topic), msg_id=msg_id, retention_millis=cfg.ended_retention_millis,
        stats_interval_millis=cfg.monitor_interval_millis, ready_channel=rt.ns.ready_channel, topic=topic,
        actor=rt.actor, delay_millis=delay_millis, dead_letter=dead_letter, schedule_channel=rt.ns.schedule_channel,
        seed=random.getrandbits(31))


async def ack_messages(rt: Runtime, *, topic: str, msg_ids: list[str], ack: bool = True, delay_millis: int = -1,
                       dead_letter: bool = False) -> list[bool]:
    """ackMsgBatch: ack_message (or nack_message) of each msgId, in one pipelined round trip;
    per msgId, in order, whether it was done. Raises the first Redis error."""
    if ack:
        calls = [ack_call(rt, topic=topic, msg_id=msg_id) for msg_id in msg_ids]
    else:
        calls = [nack_call(rt, topic=topic, msg_id=msg_id, delay_millis=delay_millis, dead_letter=dead_letter)
                 for msg_id in msg_ids]
    replies = await rt.scripts.run(calls)
    for reply in replies:
        if isinstance(reply, Exception):
            raise redis_unavailable(reply) if isinstance(reply, RedisError) else reply
    return [reply.done for reply in replies]


async def touch_message(rt: Runtime, *, topic: str, msg_id: str, ack_timeout_millis: int) -> int:
    """A consuming message's ack deadline becomes Redis' now + ack_timeout_millis; answers it
    (epoch ms). Raises NotFound when unknown, Conflict when it is not consuming."""
    reply = await rt.scripts.call(scripts.touch(
        rt.ns.topic(topic), msg_id=msg_id, ack_timeout_millis=ack_timeout_millis,
        schedule_channel=rt.ns.schedule_channel, topic=topic, actor=rt.actor))
    if reply.touched:
        return reply.ack_deadline
    if reply.status == 0:
        raise NotFound(f"message {msg_id} not found in topic {topic}")
    raise Conflict(f"message {msg_id} is not being consumed (status {reply.status}): only a consuming message "
                   f"can be touched")
