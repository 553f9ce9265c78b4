"""Writes: every state transition of a message, each one Lua script run atomically in Redis."""
import asyncio
import dataclasses
import random
import time
import logging
from collections import Counter
from typing import NamedTuple

from asgiref.sync import sync_to_async
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.core.constants import Status
from delayqueue.core.clock import now_millis
from delayqueue.stores import limits
from delayqueue.stores import refreshed
from delayqueue.core.exceptions import (BadRequest, Conflict, LogUnavailable, MaybeSent, NotFound, QueueError, Throttled, redis_reason,
                                  redis_unavailable)
from delayqueue.live import scripts
from delayqueue.core.messages import Message
from delayqueue.core.random_bits import random_bits
from delayqueue.runtime import Runtime
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings, write_mirrors
from delayqueue.ops.topic_config import save_topic_config
from delayqueue.config.push_hosts import push_url_problem

log = logging.getLogger(__name__)


class SendRequest(NamedTuple):
    """A message as a producer sends it; values <= 0 (max_retry < 0) mean "use the default"."""

    topic: str
    msg: str
    delay_millis: int
    msg_id: str | None = None
    ttl_millis: int = -1
    max_retry: int = -1
    trigger_time: int | None = None  # epoch ms, in place of delay_millis; not after produceTime: due now
    priority: int = 0  # 0-9, higher pulled first


_LOW_62 = (1 << 62) - 1
# A long poll of a paused topic pulls again at least this often: as often as the settings are read.
PAUSED_RECHECK_SECONDS = refreshed.REFRESH_SECONDS


def _new_msg_id(produce_time: int) -> str:
    """A version 7 UUID (RFC 9562) in 32 hex digits, as camellia's dashless UUIDs: the
    millisecond first, then 74 random bits. Ids made in time order go in at the right-hand end
    of the message log's msgId indexes instead of at random pages, which costs PostgreSQL a
    quarter less per logged send and does not grow with the log (docs/benchmarks.md). The random
    bits come from the OS CSPRNG (random_bits.py), so one id tells nothing of the next: knowing
    an id is what lets a client ack, delete or read a message."""
    rand = random_bits(74)
    return f"{produce_time << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0b10 << 62 | rand & _LOW_62:032x}"


def _prepare(rt: Runtime, request: SendRequest, produce_time: int,
             settings: dict[str, TopicSettings] | None = None) -> Message:
    """The message with its defaults applied (its topic's in `settings`, else the service's) and
    its times fixed, as the log and Redis get it."""
    cfg = rt.config
    topic = settings.get(request.topic, DEFAULT_SETTINGS) if settings else DEFAULT_SETTINGS
    delay = max(request.delay_millis if request.trigger_time is None else request.trigger_time - produce_time, 0)
    trigger = produce_time + delay
    if request.ttl_millis > 0:
        ttl = request.ttl_millis
    else:
        ttl = topic.ttl_millis if topic.ttl_millis is not None else cfg.ttl_millis
    if request.max_retry >= 0:
        max_retry = request.max_retry
    else:
        max_retry = topic.max_retry if topic.max_retry is not None else cfg.max_retry
    return Message(
        topic=request.topic,
        msg_id=request.msg_id or _new_msg_id(produce_time),
        payload=request.msg,
        produce_time=produce_time,
        trigger_time=trigger,
        expire_time=trigger + ttl,
        max_retry=max_retry,
        retry=0,
        status=Status.READY if delay == 0 else Status.WAITING,
        priority=request.priority,
    )


def send_call(rt: Runtime, message: Message, max_live: int = 0, namespace_capped: bool = False) -> scripts.ScriptCall:
    """`max_live`: the topic's live-message cap, 0 for none; `namespace_capped`: the namespace has one."""
    return scripts.send(
        rt.ns.topic(message.topic), msg_id=message.msg_id, payload=message.payload,
        delay_millis=message.trigger_time - message.produce_time,
        ttl_millis=message.expire_time - message.trigger_time, max_retry=message.max_retry, topic=message.topic,
        ready_channel=rt.ns.ready_channel, schedule_channel=rt.ns.schedule_channel,
        stats_interval_millis=rt.config.monitor_interval_millis, produce_time=message.produce_time,
        max_live=max_live, namespace_capped=namespace_capped, priority=message.priority)


async def send_message(rt: Runtime, *, topic: str, msg: str, delay_millis: int, msg_id: str | None = None,
                       ttl_millis: int = -1, max_retry: int = -1, trigger_time: int | None = None,
                       priority: int = 0) -> dict:
    """Enqueues one message and answers it as the API shows it; a live duplicate msgId answers
    the stored message unchanged. Raises LogUnavailable (nothing enqueued) when the message log
    cannot take it, RedisUnavailable when Redis cannot (MaybeSent if it may have)."""
    [outcome] = await send_messages(rt, requests=[SendRequest(topic, msg, delay_millis, msg_id, ttl_millis,
                                                                max_retry, trigger_time, priority)])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def send_messages(rt: Runtime, *, requests: list[SendRequest]) -> list[dict | QueueError]:
    """Enqueues messages; per message its wire dict (the stored message) or its error.

    Messages over a limit of the namespace or their topic are refused first (limits.py). With
    the message log on, the others are recorded in PostgreSQL (group commit); then the send
    scripts run in one pipelined Redis round trip, the log is settled with what Redis did, and
    the topics Redis saw first are registered. A send answered with a message is therefore in
    the log; a log failure enqueues nothing."""
    table = rt.limits.current
    if table is None:
        table = await rt.limits.table()
    if not table:
        return await _send_admitted(rt, requests, None)
    try:
        refusals = await limits.admit_sends(rt, table=table, topics=[request.topic for request in requests])
    except RedisError as exc:
        return [redis_unavailable(exc)] * len(requests)
    sent = iter(await _send_admitted(rt, [r for r, refusal in zip(requests, refusals) if refusal is None], table))
    outcomes = [next(sent) if refusal is None else refusal for refusal in refusals]
    await limits.count_refusals(rt, outcomes)
    return outcomes


async def _send_admitted(rt: Runtime, requests: list[SendRequest],
                         table: dict[str, limits.Limits] | None) -> list[dict | QueueError]:
    if not requests:
        return []
    settings = await _topic_settings(rt)
    produce_time = now_millis()
    rows = [_prepare(rt, request, produce_time, settings) for request in requests]
    if rt.config.message_log:
        try:
            written = await rt.log.record(rows)
        except LogUnavailable as exc:
            return [exc] * len(rows)
    caps = [table[row.topic].max_live if row.topic in table else 0 for row in rows] if table else [0] * len(rows)
    namespace_cap = table[limits.NAMESPACE].max_live if table and limits.NAMESPACE in table else 0
    calls = [send_call(rt, row, max_live, bool(namespace_cap)) for row, max_live in zip(rows, caps)]
    replies = await _run_sends(rt, rows, calls)
    if namespace_cap:
        replies = await _resend_over_share(rt, rows, calls, replies, namespace_cap)
    # A cap reached between admission and the send: refused like any send Redis refused.
    replies = [_cap_refusal(rt, reply, topic=row.topic, max_live=max_live, namespace_cap=namespace_cap)
               for row, max_live, reply in zip(rows, caps, replies)]
    replies = [_own_resend(row, reply) for row, reply in zip(rows, replies)]
    outcomes = [_sent_message(row, reply) for row, reply in zip(rows, replies)]
    if rt.config.message_log:
        await rt.log.settle(rows, written, replies, outcomes)
    new_topics = {row.topic for row, reply in zip(rows, replies) if not isinstance(reply, Exception) and reply.new_topic}
    if new_topics:
        await _register_topics(rt, new_topics)
    return [outcome if isinstance(outcome, Exception) else outcome.to_wire() for outcome in outcomes]


async def _run_sends(rt: Runtime, rows: list[Message], calls: list[scripts.ScriptCall]) -> list:
    try:
        # A single send shares its round trip with the loop's other calls.
        return [await rt.scripts.call(calls[0])] if len(calls) == 1 else await rt.scripts.run(calls)
    except RedisError as exc:
        return _send_failed(rows, exc)


async def _resend_over_share(rt: Runtime, rows: list[Message], calls: list[scripts.ScriptCall], replies: list,
                             namespace_cap: int) -> list:
    """Sends refused because their topic's share of the namespace's live cap was used up by
    concurrent sends since admission claim room again and go once more: the namespace's pool
    may well have room."""
    again = [i for i, reply in enumerate(replies) if not isinstance(reply, Exception) and reply.over_namespace_cap]
    if not again:
        return replies
    try:
        fits = await limits.claim_namespace_room(rt, max_live=namespace_cap, wanted=Counter(rows[i].topic for i in again))
    except RedisError:
        return replies  # refused, as the send script said
    going = []
    for i in again:
        if fits[rows[i].topic] > 0:
            fits[rows[i].topic] -= 1
            going.append(i)
    if going:
        for i, reply in zip(going, await _run_sends(rt, [rows[i] for i in going], [calls[i] for i in going])):
            replies[i] = reply
    return replies


def _cap_refusal(rt: Runtime, reply, *, topic: str, max_live: int, namespace_cap: int):
    """A send the script refused under a live cap becomes that cap's refusal; other replies stay."""
    if isinstance(reply, Exception) or not (reply.over_live_cap or reply.over_namespace_cap):
        return reply
    if reply.over_live_cap:
        return limits.cap_refusal(rt, topic=topic, max_live=max_live)
    return limits.cap_refusal(rt, topic=limits.NAMESPACE, max_live=namespace_cap)


def _send_failed(rows: list[Message], exc: RedisError) -> list[QueueError]:
    if isinstance(exc, RedisTimeoutError):
        # Written but not answered: Redis may yet run them. Each stays in the log, and its answer
        # names its msgId, under which sending it again is safe (a live msgId is not enqueued twice).
        return [MaybeSent(f"redis unavailable: {redis_reason(exc)}; the message may have been enqueued: send it "
                          f"again with msgId {row.msg_id} to be sure", detail=str(exc)) for row in rows]
    return [redis_unavailable(exc)] * len(rows)  # Redis unreachable: each message fails, and leaves the log


def _own_resend(row: Message, reply: scripts.SendReply | Exception) -> scripts.SendReply | Exception:
    """A send whose connection broke after it was written is sent again (live/runners.py); if
    the first try ran, Redis answers the second as a live duplicate of this very message: the
    same msgId, produceTime, body and times. That is the send taking effect, answered as created
    (its topic registered again, as the lost reply may have said it was new)."""
    if isinstance(reply, scripts.SendReply) and not reply.created:
        stored = Message.from_stored(reply.stored)
        if dataclasses.replace(stored, status=row.status, retry=row.retry) == row:
            return reply._replace(created=True, status=stored.status, stored=None, new_topic=True)
    return reply


def _sent_message(row: Message, reply: scripts.SendReply | Exception) -> Message | QueueError:
    """What a send answers: the row it was sent as, with the status Redis gave it (ready if it
    was due by the time Redis took it), the live message Redis already held, or the error (a
    pipeline answers each call's Redis error in its place)."""
    if isinstance(reply, Exception):
        return redis_unavailable(reply) if isinstance(reply, RedisError) else reply
    if reply.created:
        return row if reply.status == row.status else dataclasses.replace(row, status=reply.status)
    return Message.from_stored(reply.stored)


async def _register_topics(rt: Runtime, topics: set[str]) -> None:
    """Adds topics the send scripts saw for the first time (or after retirement) to the registry."""
    now = now_millis()
    await rt.redis.zadd(rt.ns.topics, {topic: now for topic in topics}, nx=True)


async def _topic_settings(rt: Runtime) -> dict[str, TopicSettings]:
    """The namespace's topic settings in force in this process (topic_config.py)."""
    table = rt.topic_configs.current
    return table if table is not None else await rt.topic_configs.table()


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
    settings = (await _topic_settings(rt)).get(topic, DEFAULT_SETTINGS)
    if settings.paused or settings.push_url:  # a push topic's messages go to its URL: consumers get none
        return [], scripts.PullReply(0, [], 0, paused=True)
    if ack_timeout_millis <= 0:
        ack_timeout_millis = settings.ack_timeout_millis or cfg.ack_timeout_millis
    batch = batch if batch > 0 else cfg.pull_batch
    table = rt.limits.current
    if table is None:
        table = await rt.limits.table()
    namespace = table.get(limits.NAMESPACE) if table else None
    topic_rate = table[topic].consume_rate if table and topic in table else 0
    reserved = 0
    if namespace and namespace.consume_rate:
        batch = reserved = await limits.reserve_consume(rt, namespace=namespace, wanted=batch)
    reply = await rt.scripts.call(scripts.pull(
        rt.ns.topic(topic), batch=batch,
        ack_timeout_millis=ack_timeout_millis,
        retention_millis=cfg.ended_retention_millis, stats_interval_millis=cfg.monitor_interval_millis,
        schedule_channel=rt.ns.schedule_channel, topic=topic, actor=rt.actor, consume_rate=topic_rate,
        promote_limit=cfg.scanner_batch, ready_channel=rt.ns.ready_channel))
    if reserved > len(reply.messages):
        await limits.give_back_consume(rt, namespace=namespace, unused=reserved - len(reply.messages))
    if reply.retry_after_millis:
        refusal = limits.rate_refusal(rt, kind="consume", topic=topic, rate=topic_rate,
                                      retry_after_millis=reply.retry_after_millis)
        await limits.count_refusals(rt, [refusal])
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


async def reschedule_message(rt: Runtime, *, topic: str, msg_id: str, trigger_time: int = -1,
                             delay_millis: int = 0) -> dict:
    """A waiting or ready message gets a new trigger time: `trigger_time` (epoch ms), or with -1
    Redis' now + `delay_millis`; one not in the future makes it ready now. Its expireTime moves
    with it (the TTL counts from the new trigger time). Answers the message as the API shows it.
    Raises Conflict when it is consuming, NotFound when it is unknown or ended."""
    cfg = rt.config
    reply = await rt.scripts.call(scripts.reschedule(
        rt.ns.topic(topic), msg_id=msg_id, trigger_time=trigger_time, delay_millis=delay_millis,
        retention_millis=cfg.ended_retention_millis, stats_interval_millis=cfg.monitor_interval_millis,
        ready_channel=rt.ns.ready_channel, schedule_channel=rt.ns.schedule_channel, topic=topic, actor=rt.actor))
    if reply.stored is not None:
        return Message.from_stored(reply.stored).to_wire()
    if reply.status == Status.CONSUMING:
        raise Conflict(f"message {msg_id} is being consumed: only a waiting or ready message can be rescheduled")
    if reply.status == 0:
        raise NotFound(f"message {msg_id} not found in topic {topic}")
    raise NotFound(f"message {msg_id} has already ended (status {reply.status}) in topic {topic}")


async def delete_message(rt: Runtime, *, topic: str, msg_id: str, release: bool = False) -> bool:
    """Deletes a live message (status deleted); False if it is missing or already ended."""
    cfg = rt.config
    return await rt.scripts.call(scripts.delete(
        rt.ns.topic(topic), msg_id=msg_id, release=release, retention_millis=cfg.ended_retention_millis,
        stats_interval_millis=cfg.monitor_interval_millis, actor=rt.actor))


async def set_topic_config(rt: Runtime, *, topic: str, changes: dict, limits: dict,
                           rotate_push_secret: bool = False) -> str | None:
    """Changes a topic's settings (TopicConfig fields; None: back to the default) and its limits
    (ops.limits.set_limits' keywords) in PostgreSQL, then its Redis mirror; in force in this
    process at once, in every other within a second. A new push URL must be one
    DELAYQUEUE_PUSH_ALLOWED_HOSTS allows (BadRequest). Answers a new push signing secret
    (save_topic_config), or None. Raises RedisError when the mirror could not be written
    (PostgreSQL has the change: calling again is safe)."""
    url = changes.get("push_url")
    # A URL the topic has already is not judged again: the pushers judge every connection, and
    # its other settings stay changeable after the operator narrowed the allowed hosts.
    if url and url != (await _topic_settings(rt)).get(topic, DEFAULT_SETTINGS).push_url:
        problem = await push_url_problem(rt.config.push_hosts, url)
        if problem:
            raise BadRequest(f"pushUrl {problem}")
    secret = await sync_to_async(save_topic_config, thread_sensitive=False)(
        namespace=rt.ns.namespace, topic=topic, changes=changes, limits=limits,
        rotate_push_secret=rotate_push_secret, secret_grace_millis=rt.config.push_secret_grace_seconds * 1000)
    table = await rt.topic_configs.fresh()
    if limits:
        await rt.limits.fresh()
    await write_mirrors(rt, {topic: table.get(topic, DEFAULT_SETTINGS)})
    return secret


async def pause_topic(rt: Runtime, *, topic: str) -> None:
    """Pulls of the topic hand out nothing (long polls are held) until resume_topic; its messages
    still fall due."""
    await set_topic_config(rt, topic=topic, changes={"paused": True}, limits={})


async def resume_topic(rt: Runtime, *, topic: str) -> None:
    """Undoes pause_topic and wakes the topic's held long polls."""
    await set_topic_config(rt, topic=topic, changes={"paused": False}, limits={})
    await rt.redis.publish(rt.ns.ready_channel, topic)


async def purge_topic(rt: Runtime, *, topic: str) -> int:
    """Ends every live message of the topic as deleted (history reason 'purged', counted as
    deleteMsg in the monitor counters), a bounded batch per script call, and returns how many. Messages sent while it runs may be purged too."""
    cfg = rt.config
    call = scripts.purge_topic(rt.ns.topic(topic), limit=cfg.scanner_batch,
                               retention_millis=cfg.ended_retention_millis, actor=rt.actor,
                               stats_interval_millis=cfg.monitor_interval_millis)
    purged = 0
    while True:
        reply = await rt.scripts.call(call)
        purged += reply.purged
        if not reply.more:
            break
    log.info("purged topic %s of namespace %s: %d messages", topic, rt.ns.namespace, purged)
    return purged
