"""Sending: a message's defaults and times fixed, its admission under the limits, its log row
committed, then its send script run in Redis; the log settled with what Redis did."""
import dataclasses
from collections import Counter
from typing import NamedTuple

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Status
from delayqueue.core.exceptions import LogUnavailable, MaybeSent, QueueError, redis_reason, redis_unavailable
from delayqueue.core.messages import Message
from delayqueue.core.random_bits import random_bits
from delayqueue.live import scripts
from delayqueue.runtime import Runtime
from delayqueue.services import admission
from delayqueue.stores.limits import NAMESPACE, Limits
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings


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

    Messages over a limit of the namespace or their topic are refused first (admission.py). With
    the message log on, the others are recorded in PostgreSQL (group commit); then the send
    scripts run in one pipelined Redis round trip, the log is settled with what Redis did, and
    the topics Redis saw first are registered. A send answered with a message is therefore in
    the log; a log failure enqueues nothing."""
    table = await rt.limits.table()
    if not table:
        return await _send_admitted(rt, requests, None)
    try:
        refusals = await admission.admit_sends(rt, table=table, topics=[request.topic for request in requests])
    except RedisError as exc:
        return [redis_unavailable(exc)] * len(requests)
    sent = iter(await _send_admitted(rt, [r for r, refusal in zip(requests, refusals) if refusal is None], table))
    outcomes = [next(sent) if refusal is None else refusal for refusal in refusals]
    await admission.count_refusals(rt, outcomes)
    return outcomes


async def _send_admitted(rt: Runtime, requests: list[SendRequest],
                         table: dict[str, Limits] | None) -> list[dict | QueueError]:
    if not requests:
        return []
    settings = await rt.topic_configs.table()
    produce_time = now_millis()
    rows = [_prepare(rt, request, produce_time, settings) for request in requests]
    if rt.config.message_log:
        try:
            written = await rt.log.record(rows)
        except LogUnavailable as exc:
            return [exc] * len(rows)
    caps = [table[row.topic].max_live if row.topic in table else 0 for row in rows] if table else [0] * len(rows)
    namespace_cap = table[NAMESPACE].max_live if table and NAMESPACE in table else 0
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
        fits = await admission.claim_namespace_room(rt, max_live=namespace_cap, wanted=Counter(rows[i].topic for i in again))
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
        return admission.cap_refusal(rt, topic=topic, max_live=max_live)
    return admission.cap_refusal(rt, topic=NAMESPACE, max_live=namespace_cap)


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
