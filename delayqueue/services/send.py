"""Sending: a message's defaults and times fixed, its admission under the limits
(admission.py), its log row committed, then its send script run in Redis, and the log settled
with what Redis did. A send answered with a message is therefore in the log; a log failure
enqueues nothing.

A msgId is deduplicated: while its message is live, and for DELAYQUEUE_DEDUPE_WINDOW_MILLIS after
it ended (a dead letter's until it is redriven or pruned; purged, it is deleted), a send under it answers that
message and delivers nothing. The log decides for the ended messages it holds (its insert does not
replace them, and their sends never reach Redis); send.lua for the rest, as only Redis may know yet
that a message ended (the log lags it by milliseconds) and with the log off."""
import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import LIVE_STATUSES, Status
from delayqueue.core.exceptions import (LogMaybeWritten, LogUnavailable, MaybeSent, QueueError, redis_reason,
                                         redis_unavailable)
from delayqueue.core.messages import Message, new_msg_id
from delayqueue.live import scripts
from delayqueue.live.keys import Shard
from delayqueue.live.protocol import ConnectionLost
from delayqueue.live.shards import bound_share, message_shards, shard_of
from delayqueue.runtime import Runtime
from delayqueue.services import admission, caps
from delayqueue.services.messages import first_holding, given_up
from delayqueue.stores.limits import NAMESPACE
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings


class SendRequest(NamedTuple):
    """A message as a producer sends it; values <= 0 (max_retry < 0) mean "use the default"."""

    topic: str
    msg: str
    delay_millis: int = 0
    msg_id: str | None = None
    ttl_millis: int = -1
    max_retry: int = -1
    trigger_time: int | None = None  # epoch ms, in place of delay_millis; not after produceTime: due now
    priority: int = 0  # 0-9, higher pulled first


def prepared(rt: Runtime, request: SendRequest, produce_time: int, settings: dict[str, TopicSettings]) -> Message:
    """The message with its defaults applied (its topic's in `settings`, else the service's) and
    its times fixed, as the log and Redis get it."""
    cfg = rt.config
    topic = settings.get(request.topic, DEFAULT_SETTINGS)
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
        msg_id=request.msg_id or new_msg_id(produce_time),
        payload=request.msg,
        produce_time=produce_time,
        trigger_time=trigger,
        expire_time=trigger + ttl,
        max_retry=max_retry,
        retry=0,
        status=Status.READY if delay == 0 else Status.WAITING,
        priority=request.priority,
    )


# A call holds Redis for all its messages (about 25 µs each), and a scanner's promotion waits
# behind it: a batch goes a hundred at a time, a few ms, not 1,000 in one call.
MESSAGES_PER_CALL = 100


async def target_shards(rt: Runtime, messages: list[Message], logged_live: list[Message | None] | None = None, *,
                        settings: dict[str, TopicSettings] | None = None) -> list[Shard]:
    """Each message's shard, for a send or a restore: its msgId's in its topic's shard count
    (live/shards.py). While the topic drains other counts, a msgId whose live message the log
    holds (`logged_live`) goes to the shard of theirs holding it, if one does, so that it is
    answered as the duplicate it is, not made a second live message; with the log off, every
    msgId is looked for so, and so with a dedupe window no longer than the retention: a new life
    then goes where Redis may still keep its ended one, which send.lua replaces (packed or cold in
    another shard, the new life would be hidden from getMsg behind the ended one). `settings`: the
    namespace's topic settings (default: the runtime's, read again if a msgId the log holds live is
    placed in a count whose change has begun: for up to refreshed.REFRESH_SECONDS after a reshard,
    a process that has not read it would not look for it in the new count)."""
    if settings is None:
        asked = time.monotonic()
        settings = await rt.topic_configs.table()
        live = [message for message, logged in zip(messages, logged_live or []) if logged is not None]
        # Each shard asked once: a restore's page of 10,000 rows asked 10,000 times of a few shards.
        if live and await given_up(rt, list({shard_of(message.topic, message.msg_id,
                                                      settings.get(message.topic, DEFAULT_SETTINGS).shards)
                                             for message in live})):
            with contextlib.suppress(LogUnavailable):
                settings = await rt.topic_configs.fresh(asked)
    # Which msgIds are live; without the log, only Redis can tell, and it alone keeps a msgId ended
    # within the retention that the log's dedupe lets start anew.
    log_tells = rt.config.message_log and rt.config.dedupe_window_millis > rt.config.ended_retention_millis

    def places(message: Message, logged: Message | None) -> list[Shard]:
        mine = settings.get(message.topic, DEFAULT_SETTINGS)
        counts = (mine.shards,) if logged is None and log_tells else mine.shard_counts
        return message_shards(message.topic, message.msg_id, counts)

    return await first_holding(rt, msg_ids=[message.msg_id for message in messages],
                               places=[places(message, logged)
                                       for message, logged in zip(messages, logged_live or [None] * len(messages))])


def send_calls(rt: Runtime, messages: list[Message], *, shards: list[Shard],
               logged_waiting: list[int | None] | None = None, max_live: Callable[[str], int] = lambda topic: 0,
               namespace_capped: bool = False, redrive: bool = False) -> list[tuple[scripts.ScriptCall, list[int]]]:
    """The send script's calls for prepared messages: per shard (target_shards: each message's, in
    the order of its first message), one per MESSAGES_PER_CALL of its messages, each with their
    positions in `messages`. `logged_waiting`: per message, in the cold tier, the triggerTime of
    the waiting message the message log holds under the msgId (Redis may not hold it: cold);
    `max_live`: a topic's live-message cap, 0 for none, split evenly over its shards (the shares adding up to
    it, each at least one);
    `namespace_capped`: the namespace has one (the topic's share of it is then a cap too);
    `redrive`: dead letters' new lives, which replace their ended messages whatever the dedupe
    window."""
    waiting = logged_waiting or [None] * len(messages)
    positions: dict[Shard, list[int]] = {}
    for i, shard in enumerate(shards):
        positions.setdefault(shard, []).append(i)
    dedupe_window = 0 if redrive else rt.config.dedupe_window_millis
    calls = []
    for shard, mine in positions.items():
        cap = bound_share(max_live(shard.topic), shard.count, shard.index)
        for first in range(0, len(mine), MESSAGES_PER_CALL):
            chunk = mine[first:first + MESSAGES_PER_CALL]
            values = [(messages[i].msg_id, messages[i].payload, messages[i].trigger_time, messages[i].expire_time,
                       messages[i].max_retry, messages[i].produce_time, messages[i].priority, waiting[i])
                      for i in chunk]
            calls.append((scripts.send(rt.context, shard, max_live=cap, namespace_capped=namespace_capped,
                                       dedupe_window_millis=dedupe_window,
                                       cold_tier=rt.config.cold_tier, messages=values), chunk))
    return calls


async def run_sends(rt: Runtime, calls: list[tuple[scripts.ScriptCall, list[int]]]) -> list:
    """The replies of send_calls' calls, a SendReply or the call's RedisError per message, in the
    messages' order (raises nothing)."""
    try:
        # One call shares its round trip with the loop's other calls.
        results = ([await rt.scripts.call(calls[0][0])] if len(calls) == 1
                   else await rt.scripts.run([call for call, _ in calls]))
    except RedisError as exc:
        results = [exc] * len(calls)
    replies: list = [None] * sum(len(mine) for _, mine in calls)
    for (_, mine), result in zip(calls, results):
        for n, i in enumerate(mine):
            replies[i] = result if isinstance(result, Exception) else result[n]
    return replies


async def send_message(rt: Runtime, *, request: SendRequest) -> Message:
    """Enqueues one message and answers it as stored; a duplicate msgId (live, or ended within the
    dedupe window) answers the stored message unchanged and enqueues nothing. Raises LogUnavailable (nothing enqueued) when the message log cannot take
    it (LogMaybeWritten if it may have), RedisUnavailable when Redis cannot (MaybeSent if it may have), Throttled over
    a limit."""
    [outcome] = await send_messages(rt, requests=[request])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def send_messages(rt: Runtime, *, requests: list[SendRequest],
                        redis_turn: asyncio.Lock | None = None) -> list[Message | QueueError]:
    """Enqueues messages; per message the message as stored, or its error.

    Sends to a new topic beyond DELAYQUEUE_MAX_TOPICS are refused first, then messages over a
    limit of the namespace or their topic. With the message log on, the others are recorded in
    PostgreSQL (group commit); then the send scripts run in one pipelined Redis round trip, the log
    is settled with what Redis did, and the topics Redis saw first are registered.

    `redis_turn` is held while the send scripts run: concurrent calls sharing it write the log
    together but reach Redis one at a time."""
    refusals = await caps.new_topic_refusals(rt, topics=[request.topic for request in requests])
    going = [request for request, refusal in zip(requests, refusals) if refusal is None]
    outcomes = _merged(refusals, await _send_under_limits(rt, going, redis_turn) if going else [])
    # A live message's topic is registered; an ended one answered from the log may have been retired.
    caps.remember_topics(rt, topics=[outcome.topic for outcome in outcomes
                                     if isinstance(outcome, Message) and outcome.status < Status.ACKED])
    return outcomes


async def _send_under_limits(rt: Runtime, requests: list[SendRequest],
                             redis_turn: asyncio.Lock | None) -> list[Message | QueueError]:
    table = await rt.limits.table()
    if not table:
        return await _send_admitted(rt, requests, None, redis_turn)
    shards = None
    if (namespace := table.get(NAMESPACE)) is not None and namespace.max_live:
        requests, shards = _claiming(requests, await rt.topic_configs.table())
    try:
        admitted = await admission.admit_sends(rt, table=table, topics=[request.topic for request in requests],
                                               shards=shards)
    except RedisError as exc:
        return [redis_unavailable(exc)] * len(requests)
    going = [request for request, refusal in zip(requests, admitted.refusals) if refusal is None]
    outcomes = _merged(admitted.refusals, await _send_admitted(rt, going, admitted, redis_turn))
    await admission.count_refusals(rt, outcomes)
    return outcomes


def _claiming(requests: list[SendRequest], settings: dict[str, TopicSettings]) -> tuple[list[SendRequest],
                                                                                      list[Shard]]:
    """The requests, and the shard each claims room of a namespace live cap in: its msgId's. A
    sharded topic's message gets its msgId now for that, as its shard follows from it."""
    produce_time = now_millis()
    claiming, shards = [], []
    for request in requests:
        count = settings.get(request.topic, DEFAULT_SETTINGS).shards
        if count > 1 and not request.msg_id:
            request = request._replace(msg_id=new_msg_id(produce_time))
        claiming.append(request)
        shards.append(shard_of(request.topic, request.msg_id or "", count))
    return claiming, shards


def _merged(refusals: list[QueueError | None], sent: list[Message | QueueError]) -> list[Message | QueueError]:
    """Per request, its refusal, else the next outcome of the requests that went on."""
    outcomes = iter(sent)
    return [next(outcomes) if refusal is None else refusal for refusal in refusals]


async def _send_admitted(rt: Runtime, requests: list[SendRequest], admitted: admission.SendAdmission | None,
                         redis_turn: asyncio.Lock | None) -> list[Message | QueueError]:
    if not requests:
        return []
    settings = await rt.topic_configs.table()
    produce_time = now_millis()
    rows = [prepared(rt, request, produce_time, settings) for request in requests]
    first: dict[tuple[str, str], int] = {}
    for i, row in enumerate(rows):
        first.setdefault(row.key, i)
    if len(first) < len(rows):
        # A batch naming one msgId twice sends it once, and each repeat answers as the first does: sent on,
        # a repeat of a cold message (which Redis does not hold) was taken for a new one, its body logged.
        outcomes = dict(zip(first, await _send_rows(rt, [rows[i] for i in first.values()], admitted, redis_turn)))
        return [outcomes[row.key] for row in rows]
    return await _send_rows(rt, rows, admitted, redis_turn)


async def _send_rows(rt: Runtime, rows: list[Message], admitted: admission.SendAdmission | None,
                     redis_turn: asyncio.Lock | None) -> list[Message | QueueError]:
    """Sends prepared messages of distinct msgIds: their log rows, their send scripts, the log settled."""
    kept: list[Message | None] = [None] * len(rows)
    if rt.config.message_log:
        try:
            recorded = await rt.log.record(rows)
            kept = recorded.kept
        except LogMaybeWritten as exc:
            # The rows may be in the log, where a restore or the loader would find them: each answer names its msgId.
            return [LogMaybeWritten(f"{exc}; {_resend_to_be_sure(row)}", exc.detail) for row in rows]
        except LogUnavailable as exc:
            return [exc] * len(rows)
    # A live message the log keeps under the msgId is answered by Redis, or, when it is cold (a
    # waiting one out of Redis, which send.lua tells from the loader's position), from here; an
    # ended one is the answer, as a duplicate: nothing is sent.
    logged_live = [message if message is not None and message.status in LIVE_STATUSES else None for message in kept]
    kept = [None if live is not None else message for message, live in zip(kept, logged_live)]
    waiting = [live.trigger_time if rt.config.finds_cold and live is not None and live.status == Status.WAITING
               else None for live in logged_live]
    replies = [None if message is None else scripts.SendReply(False, 0, message, False) for message in kept]
    going = [i for i, message in enumerate(kept) if message is None]
    cap_of = admitted.topic_cap if admitted is not None else (lambda topic: 0)
    capped = admitted is not None and admitted.namespace_cap > 0
    try:
        shards = await target_shards(rt, rows, logged_live)
    except RedisError as exc:
        shards, going = [], []
        replies = [exc if reply is None else reply for reply in replies]  # as if each send had failed

    async def send(positions: list[int]) -> list:
        calls = send_calls(rt, [rows[i] for i in positions], shards=[shards[i] for i in positions],
                           logged_waiting=[waiting[i] for i in positions], max_live=cap_of, namespace_capped=capped)
        async with redis_turn or contextlib.nullcontext():
            replies = await run_sends(rt, calls)
        return send_errors([rows[i] for i in positions], replies)

    if going:
        for i, reply in zip(going, await send(going)):
            replies[i] = reply
    if admitted is not None:
        # A cap reached between admission and the send: refused like any send Redis refused.
        replies = await admitted.after_send(rows, shards, replies, send)
    replies = [reply._replace(stored=live) if isinstance(reply, scripts.SendReply) and reply.logged_live else reply
               for reply, live in zip(replies, logged_live)]
    replies = [_own_resend(row, reply) for row, reply in zip(rows, replies)]
    outcomes = [_sent_message(row, reply) for row, reply in zip(rows, replies)]
    if rt.config.message_log:
        await rt.log.settle(rows, recorded, replies, outcomes)
    new_shards = {shard: None for shard, reply in zip(shards, replies)
                  if not isinstance(reply, Exception) and reply.new_topic}
    if new_shards:
        outcomes = await _register(rt, list(new_shards), rows[0].produce_time, rows, outcomes)
    return outcomes


async def _register(rt: Runtime, shards: list[Shard], at: int, rows: list[Message],
                    outcomes: list[Message | QueueError]) -> list[Message | QueueError]:
    """Registers the topics these sends found new, for the scanners to find them. If Redis
    fails to, the messages sent to them are enqueued but not yet delivered: each answers so, and
    sending it again (a live duplicate) registers its topic, as send.lua answers newTopic until
    the registration is confirmed (in the meta hash of the shard it went to)."""
    try:
        await register_shards(rt, shards=shards, at=at)
    except RedisError as exc:
        unregistered = {shard.topic for shard in shards}
        return [MaybeSent(f"redis unavailable: {redis_reason(exc)}; the message is enqueued but its topic could not "
                          f"be registered, so it would not fall due: send it again with msgId {row.msg_id}",
                          detail=str(exc))
                if row.topic in unregistered and isinstance(outcome, Message) else outcome
                for row, outcome in zip(rows, outcomes)]
    return outcomes


async def register_shards(rt: Runtime, *, shards: list[Shard], at: int) -> None:
    """Puts the topics of shards that send.lua found new (newTopic) in the registry and marks the
    shards registered; raises RedisError if the registry could not be written."""
    await rt.scripts.call(scripts.register_topics(rt.context, at=at, topics=sorted({shard.topic for shard in shards})))
    try:
        await rt.scripts.run_all([scripts.confirm_registered(rt.context, shard) for shard in shards])
    except RedisError:
        pass  # unconfirmed: the topic's next send registers it again, which changes nothing


def send_errors(rows: list[Message], replies: list) -> list:
    """Each reply, with a Redis error turned into the send's own error."""
    return [_send_failed(row, reply) if isinstance(reply, RedisError) else reply for row, reply in zip(rows, replies)]


def _send_failed(row: Message, exc: RedisError) -> QueueError:
    if isinstance(exc, (RedisTimeoutError, ConnectionLost)):
        # Written but not answered: Redis may yet run it, or have run it before the connection broke. It stays
        # in the log, and its answer names its msgId, under which sending it again is safe (a live msgId is not
        # enqueued twice).
        return MaybeSent(f"redis unavailable: {redis_reason(exc)}; {_resend_to_be_sure(row)}", detail=str(exc))
    return redis_unavailable(exc)  # Redis unreachable: the message fails, and leaves the log


def _resend_to_be_sure(row: Message) -> str:
    """The end of a send's answer when a store may have taken it: how the sender makes sure."""
    return f"the message may have been enqueued: send it again with msgId {row.msg_id} to be sure"


def _own_resend(row: Message, reply: scripts.SendReply | Exception) -> scripts.SendReply | Exception:
    """A send whose connection broke after it was written is sent again (live/runners.py); if
    the first try ran, Redis answers the second as a live duplicate of this very message: the
    same msgId, produceTime, body and times. That is the send taking effect, answered as created
    (and as new to its topic while the topic's registration is unconfirmed, as send.lua says)."""
    if isinstance(reply, scripts.SendReply) and not reply.created:
        if dataclasses.replace(reply.stored, status=row.status, retry=row.retry) == row:
            return reply._replace(created=True, status=reply.stored.status, stored=None)
    return reply


def _sent_message(row: Message, reply: scripts.SendReply | Exception) -> Message | QueueError:
    """What a send answers: the row it was sent as, with the status Redis gave it (ready if it
    was due by the time Redis took it), the live message Redis already held, or the error (a
    pipeline answers each call's Redis error in its place)."""
    if isinstance(reply, Exception):
        return redis_unavailable(reply) if isinstance(reply, RedisError) else reply
    if reply.created:
        return row if reply.status == row.status else dataclasses.replace(row, status=reply.status)
    return reply.stored
