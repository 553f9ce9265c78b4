"""Consuming: pulls and long polls hand out ready messages (highest priority first, oldest first
within a priority) with an ack deadline; acks, nacks and touches settle them. The HTTP API and
the pushers (workers/pusher.py) alike take and settle messages here."""
import asyncio
import contextlib
import random
import time
from typing import NamedTuple

from redis.exceptions import RedisError

from delayqueue.core.clock import wait_seconds
from delayqueue.core.constants import Status
from delayqueue.core.exceptions import Conflict, LogUnavailable, NotFound, Throttled, redis_unavailable
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.live.keys import Bucket, Shard
from delayqueue.live.shards import counts_shares
from delayqueue.runtime import Runtime
from delayqueue.services import admission
from delayqueue.services.messages import cold_after, cold_message, holding_shards, newer_counts, on_its_shard
from delayqueue.stores import refreshed
from delayqueue.stores.limits import NAMESPACE
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS

# A long poll of a paused topic pulls again at least this often: as often as the settings are read.
PAUSED_RECHECK_SECONDS = refreshed.REFRESH_SECONDS


class Pull(NamedTuple):
    """One topic's pull as the pull script takes it."""

    topic: str
    batch: int
    ack_timeout_millis: int
    consume_rate: int = 0  # the topic's bucket, tokens a second; 0 for none
    max_inflight: int = 0  # hand out only what keeps the topic's in-flight messages at most this; 0 for no bound
    first_shard: Shard | None = None  # a sharded topic's shard to ask first (a message there is ready or due)
    push_url: str = ""  # a pusher's pull: the URL it POSTs to (pull.lua hands out nothing where it is not the topic's)
    push_secret_id: str = ""  # and which secret it signs with (likewise)


class Pulled(NamedTuple):
    messages: list[Message]  # handed out, now consuming: highest priority first, oldest first within one
    remaining: int  # messages left ready (every priority)


async def pull_many(rt: Runtime, *, pulls: list[Pull]) -> list[scripts.PullReply | Exception]:
    """Runs the pulls, in one pipelined round trip: per pull its script's reply (a reply with
    retry_after_millis: the topic's bucket had no token), or its error.

    Under a namespace consume rate the pulls first share what the namespace's bucket holds, in
    order, and what they do not hand out goes back; a pull left without a token is not run, and
    answers the namespace's refusal (Throttled, counted). A topic the settings say is paused is
    held as one Redis' mirror says is (pull.lua), so the pause holds while Redis has lost the mirror."""
    table = await rt.limits.table()
    namespace = table.get(NAMESPACE) if table else None
    batches = [pull.batch for pull in pulls]
    refusal = None
    if namespace and namespace.consume_rate:
        granted, refusal = await admission.reserve_consume(rt, namespace=namespace, wanted=sum(batches))
        for i, wanted in enumerate(batches):
            batches[i] = min(wanted, granted)
            granted -= batches[i]
    settings = await rt.topic_configs.table()
    counts = [settings.get(pull.topic, DEFAULT_SETTINGS).shard_counts for pull in pulls]
    paused = [settings.get(pull.topic, DEFAULT_SETTINGS).paused for pull in pulls]
    going = [i for i, batch in enumerate(batches) if batch > 0]
    sharded = [i for i in going if counts[i] != (1,)]
    unsharded = [i for i in going if counts[i] == (1,)]
    calls = [scripts.pull(rt.context, pulls[i].topic, batch=batches[i], ack_timeout_millis=pulls[i].ack_timeout_millis,
                          consume_rate=pulls[i].consume_rate, max_inflight=pulls[i].max_inflight, paused=paused[i],
                          push_url=pulls[i].push_url, push_secret_id=pulls[i].push_secret_id)
             for i in unsharded]
    try:
        # A single pull shares its round trip with the loop's other calls.
        replies = ([await rt.scripts.call(calls[0])] if len(calls) == 1 else await rt.scripts.run(calls)) if calls else []
    except RedisError as exc:
        replies = [exc] * len(calls)
    replies += [await _pull_shards(rt, pulls[i]._replace(batch=batches[i]), counts[i], paused[i]) for i in sharded]
    if refusal is None and len(going) < len(pulls):  # the pulls before it took every token there was
        refusal = admission.rate_refusal(rt, kind=Bucket.CONSUME, topic=NAMESPACE, rate=namespace.consume_rate,
                                         retry_after_millis=max(1, -(-1000 // namespace.consume_rate)))
    results: list[scripts.PullReply | Exception] = [refusal] * len(pulls)
    for i, reply in zip(unsharded + sharded, replies):
        results[i] = reply
    if namespace and namespace.consume_rate:
        unused = sum(batches) - sum(len(r.messages) for r in replies if not isinstance(r, Exception))
        if unused:
            await admission.give_back_consume(rt, namespace=namespace, unused=unused)
    return results


async def _pull_shards(rt: Runtime, pull: Pull, counts: tuple[int, ...],
                       paused: bool) -> scripts.PullReply | Exception:
    """A pull of a sharded topic, from its shards (those of every count it may hold messages in):
    first one shard for the whole batch, drawn at random (so each is as likely to be first as any
    other, and none starves) unless the pull names one (`first_shard`: a long poll woken by a
    message made ready there, or falling due); then, for what it lacked, the batch shared over
    the others in pipelined rounds, a shard that handed out all it was asked for and has more
    asked again. A backlog is taken a shard a pull: one script call, and one ack call for the
    batch. A pull that names its shard and gets messages there answers with them at once: the
    other shards' ready messages woke polls of their own.
    The topic's consume rate is its own shard's bucket's, taken up front and given back unused.
    Highest priority first and oldest first hold within each shard, not across them. `paused`: the
    settings say so (pull_many)."""
    batch = pull.batch
    if pull.consume_rate:
        try:
            grant = await rt.scripts.call(scripts.take_tokens(rt.context, pull.topic, kind=Bucket.CONSUME,
                                                              wanted=batch, rate=pull.consume_rate))
        except RedisError as exc:
            return exc
        if not grant.granted:
            return scripts.PullReply(0, [], grant.retry_after_millis)
        batch = grant.granted
    # Each shard keeps its share of the topic's bound on messages in flight (a push topic's concurrency):
    # pushers taking from different shards hold to it together. One with none is not asked (to
    # pull.lua 0 is no bound): a current count's, while one given up drains under a low bound.
    max_inflight = counts_shares(pull.max_inflight, pull.topic, counts)
    open_shards = [shard for shard, share in max_inflight.items() if share or not pull.max_inflight]
    messages: list[Message] = []
    remaining: dict[Shard, int] = {}
    due_in: list[tuple[int, int, Shard | None]] = [(-1, 0, None)]  # (next_due_us, server_now_us, shard)
    failure: Exception | None = None
    paused_reply: scripts.PullReply | None = None
    first = pull.first_shard if pull.first_shard in open_shards else random.choice(open_shards)
    open_shards.remove(first)
    asks = [(first, batch)]
    while len(messages) < batch and (asks or open_shards):
        if not asks:
            start = random.randrange(len(open_shards))
            open_shards = open_shards[start:] + open_shards[:start]
            wanted = batch - len(messages)
            # Those beyond the lack are asked for none, which answers what they hold ready: asked
            # one after another instead, an empty topic's shards took a round trip each.
            asks = [(shard, wanted // len(open_shards) + (n < wanted % len(open_shards)))
                    for n, shard in enumerate(open_shards)]
            open_shards = []
        try:
            replies = await rt.scripts.run([scripts.pull(rt.context, shard, batch=n, consume_rate=0,
                                                         ack_timeout_millis=pull.ack_timeout_millis,
                                                         max_inflight=max_inflight[shard], paused=paused,
                                                         push_url=pull.push_url,
                                                         push_secret_id=pull.push_secret_id)
                                            for shard, n in asks])
        except RedisError as exc:
            replies = [exc] * len(asks)
        for (shard, n), reply in zip(asks, replies):
            if isinstance(reply, Exception):
                failure = reply
                continue
            if reply.paused:  # a pause or resume not yet in every shard's meta: what others handed out is answered
                paused_reply = reply
                continue
            messages += reply.messages
            remaining[shard] = reply.remaining
            due_in.append((reply.next_due_us, reply.server_now_us, shard))
            if len(reply.messages) == n and reply.remaining > 0:
                open_shards.append(shard)
        asks = []
        if failure is not None or paused_reply is not None or (first == pull.first_shard and messages):
            break
    if pull.consume_rate and len(messages) < batch:
        try:
            await rt.scripts.call(scripts.take_tokens(rt.context, pull.topic, kind=Bucket.CONSUME,
                                                      wanted=len(messages) - batch, rate=pull.consume_rate))
        except RedisError:
            pass  # the tokens not given back are the rate's loss, not a message's
    if paused_reply is not None and not messages:
        return paused_reply
    if failure is not None and not messages:
        return failure
    due_us, server_now_us, due_shard = min((due for due in due_in if due[0] > 0), key=lambda due: due[0],
                                           default=max(due_in, key=lambda due: due[0]))
    return scripts.PullReply(sum(remaining.values()), messages, 0, next_due_us=due_us, server_now_us=server_now_us,
                             due_shard=due_shard)


async def pull_messages(rt: Runtime, *, topic: str, batch: int = -1, ack_timeout_millis: int = -1) -> Pulled:
    """Delivers up to `batch` ready messages (0 or less: the default batch) with an ack deadline
    of `ack_timeout_millis` (0 or less: the topic's, else the service's default). Under a consume
    rate it hands out at most as many as there are tokens, and raises Throttled when there is
    none (of the namespace's bucket or the topic's). A paused topic, or one with a push URL (its
    pushers take its messages), hands out none."""
    return Pulled((reply := await _pull(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis)).messages,
                  reply.remaining)


async def _pull(rt: Runtime, *, topic: str, batch: int, ack_timeout_millis: int,
                first_shard: Shard | None = None) -> scripts.PullReply:
    cfg = rt.config
    settings = await rt.topic_configs.settings(topic)
    if first_shard is not None and first_shard.count not in settings.shard_counts:
        # Woken for a shard of a count this process has not read yet: pulling only those it knows,
        # the poll would find nothing, and its wake would be spent.
        with contextlib.suppress(LogUnavailable):
            await rt.topic_configs.fresh()
            settings = await rt.topic_configs.settings(topic)
    if settings.paused or settings.push_url:  # a push topic's messages go to its URL: consumers get none
        return scripts.PullReply(0, [], 0, paused=True)
    if ack_timeout_millis <= 0:
        ack_timeout_millis = settings.ack_timeout_millis or cfg.ack_timeout_millis
    table = await rt.limits.table()
    topic_rate = table[topic].consume_rate if table and topic in table else 0
    [reply] = await pull_many(rt, pulls=[Pull(topic, batch if batch > 0 else cfg.pull_batch, ack_timeout_millis,
                                              topic_rate, first_shard=first_shard)])
    if isinstance(reply, Exception):
        raise redis_unavailable(reply) if isinstance(reply, RedisError) else reply
    if reply.retry_after_millis:
        refusal = admission.rate_refusal(rt, kind=Bucket.CONSUME, topic=topic, rate=topic_rate,
                                         retry_after_millis=reply.retry_after_millis)
        await admission.count_refusals(rt, [refusal])
        raise refusal
    return reply


def _time_up(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


async def long_poll_messages(rt: Runtime, *, topic: str, batch: int = -1, ack_timeout_millis: int = -1,
                             timeout_millis: int = -1) -> list[Message]:
    """Pulls at once; if nothing is ready, holds until a message is or the timeout passes (0 or
    less: the default, at most the longest), then answers with one last pull. Holding costs a
    future, not a thread. Over a consume rate it holds too, until the bucket has a token
    (answering an empty list if the time is up first)."""
    cfg = rt.config
    if timeout_millis <= 0:
        timeout_millis = cfg.long_polling_timeout_millis
    timeout_millis = min(timeout_millis, cfg.max_long_polling_timeout_millis)
    notifier = await rt.notifier()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_millis / 1000
    waiter = None
    due_shard = None  # the shard whose message fell due when the poll was woken
    try:
        while True:
            # Register before pulling, so a wake published between the pull and the wait is kept.
            waiter = notifier.register(topic)
            sent_at = time.time()
            try:
                reply = await _pull(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis,
                                    first_shard=due_shard)
            except Throttled as exc:
                notifier.discard(topic, waiter)
                waiter = None
                pause = min(exc.retry_after_millis / 1000, deadline - loop.time())
                if pause <= 0:
                    return []
                await asyncio.sleep(pause)
                continue
            time_left = deadline - loop.time()
            if reply.messages or time_left <= 0:
                if reply.messages and reply.remaining > 0:
                    await notifier.pass_on(topic, reply.remaining)
                return reply.messages
            if reply.next_due_us > 0 and reply.next_due_us / 1_000_000 < time_left:
                due_in = wait_seconds(due_in_us=reply.next_due_us, server_now_us=reply.server_now_us,
                                      sent_at=sent_at, received_at=time.time())
                notifier.wake_at(topic, time.monotonic() + due_in, reply.due_shard)
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
            due_shard = woken if isinstance(woken, Shard) else None
            if not woken:
                notifier.discard(topic, waiter)
            waiter = None  # a wake is used by the pull at the top of the loop
    finally:
        if waiter is not None:
            notifier.discard(topic, waiter)


async def ack_message(rt: Runtime, *, topic: str, msg_id: str, push_status: str = "",
                      retry: int | None = None) -> scripts.AckReply:
    """ack=true: a consuming message becomes acked. Answers whether it did (done) and the
    message's status after the call (0: unknown). `push_status`: a push's HTTP status, when the
    ack is its 2xx answer (the history's detail). `retry`: the delivery acked, as pulled; one
    delivered again since (its ack timeout passed) is left alone (None: whichever it is in)."""
    _shard, [reply] = await on_its_shard(rt, topic=topic, msg_id=msg_id, missing=lambda replies: not replies[0].status,
                                         call=lambda shard: scripts.ack(rt.context, shard, push_status=push_status,
                                                                        acks=scripts.acks_of([msg_id], [retry])))
    return reply


async def nack_message(rt: Runtime, *, topic: str, msg_id: str, delay_millis: int = -1, dead_letter: bool = False,
                       push_failure: str = "", default_backoff_millis: int = 0, reason: str = "",
                       retry: int | None = None) -> scripts.AckReply:
    """ack=false: a consuming message is ready again at once (or waiting out its topic's retry
    backoff, or one starting at `default_backoff_millis` when the topic sets none), or waiting for
    `delay_millis` (-1: none given), or ended if out of tries; with `dead_letter` it ends now as a
    dead letter (status 6, reason dead_lettered). `push_failure`: a failed push attempt's status or
    error (the history's detail); `reason`: the consumer's why (the history's detail, the dead
    letter's deadDetail). `retry` and the answer as ack_message's."""
    _shard, reply = await on_its_shard(rt, topic=topic, msg_id=msg_id, missing=lambda reply: not reply.status,
                                       call=lambda shard: scripts.nack(rt.context, shard, msg_id=msg_id,
                                                                       delay_millis=delay_millis,
                                                                       dead_letter=dead_letter,
                                                                       push_failure=push_failure, reason=reason,
                                                                       default_backoff_millis=default_backoff_millis,
                                                                       retry=retry))
    return reply


async def ack_messages(rt: Runtime, *, topic: str, msg_ids: list[str], ack: bool = True, delay_millis: int = -1,
                       dead_letter: bool = False, reason: str = "",
                       retries: list[int | None] | None = None) -> list[bool]:
    """ackMsgBatch: ack_message of every msgId in one script call (one history entry), or
    nack_message of each in one pipelined round trip; per msgId, in order, whether it was done.
    `retries`: per msgId, ack_message's `retry`. Raises the first Redis error."""
    asked = time.monotonic()
    known = (await rt.topic_configs.settings(topic)).shard_counts
    replies = await _settle(rt, topic, msg_ids, known, ack=ack, delay_millis=delay_millis, dead_letter=dead_letter,
                            reason=reason, retries=retries)
    missing = [i for i, reply in enumerate(replies) if not reply.status]
    # Unknown in the counts this process knew: where the settings read since place them (newer_counts).
    if missing and (counts := await newer_counts(rt, topic, msg_id=msg_ids[missing[0]], after=asked,
                                                 known=known)) is not None:
        again = await _settle(rt, topic, [msg_ids[i] for i in missing], counts, ack=ack, delay_millis=delay_millis,
                              dead_letter=dead_letter, reason=reason,
                              retries=None if retries is None else [retries[i] for i in missing])
        for i, reply in zip(missing, again):
            replies[i] = reply
    return [reply.done for reply in replies]


async def _settle(rt: Runtime, topic: str, msg_ids: list[str], counts: tuple[int, ...], *, ack: bool,
                  delay_millis: int, dead_letter: bool, reason: str,
                  retries: list[int | None] | None) -> list[scripts.AckReply]:
    """ack_messages' calls, the msgIds placed over the topic's shard `counts`: per msgId, in order, its reply."""
    # Acks: one call per shard (one history entry); nacks: one call per msgId.
    shards: dict[Shard, list[int]] = {}
    for i, shard in enumerate(await holding_shards(rt, topic=topic, msg_ids=msg_ids, counts=counts)):
        shards.setdefault(shard, []).append(i)
    if ack:
        acks = scripts.acks_of(msg_ids, retries)
        calls = [scripts.ack(rt.context, shard, acks=[acks[i] for i in mine])
                 for shard, mine in shards.items()]
    else:
        calls = [scripts.nack(rt.context, shard, msg_id=msg_ids[i], delay_millis=delay_millis, dead_letter=dead_letter,
                              reason=reason, retry=None if retries is None else retries[i])
                 for shard, mine in shards.items() for i in mine]
    results = [await rt.scripts.call(calls[0])] if len(calls) == 1 else await rt.scripts.run(calls)
    for result in results:
        if isinstance(result, Exception):
            raise redis_unavailable(result) if isinstance(result, RedisError) else result
    replies: list[scripts.AckReply] = [scripts.AckReply(False, 0)] * len(msg_ids)
    answered = [reply for result in results for reply in result] if ack else results
    for i, reply in zip([i for mine in shards.values() for i in mine], answered):
        replies[i] = reply
    return replies


async def touch_message(rt: Runtime, *, topic: str, msg_id: str, ack_timeout_millis: int,
                        retry: int | None = None) -> int:
    """A consuming message's ack deadline becomes Redis' now + ack_timeout_millis; answers it
    (epoch ms). `retry`: the delivery extended, as pulled (None: whichever it is in). Raises
    NotFound when unknown, Conflict when it is not consuming (a cold one too) or is consuming under
    another delivery."""
    shard, reply = await on_its_shard(rt, topic=topic, msg_id=msg_id,
                                      call=lambda shard: scripts.touch(rt.context, shard, msg_id=msg_id,
                                                                       ack_timeout_millis=ack_timeout_millis,
                                                                       retry=retry),
                                      missing=lambda reply: not reply.touched and not reply.status)
    if reply.touched:
        return reply.ack_deadline
    status = reply.status
    if status == Status.CONSUMING:
        raise Conflict(f"message {msg_id} was delivered again (retry {reply.retry}): the delivery of retry {retry} "
                       "has ended, its ack timeout passed")
    # Not in Redis, it may be cold: waiting in the message log only, which getMsg answers.
    if status == 0 and rt.config.finds_cold and (after := await cold_after(rt, shard)) is not None \
            and await cold_message(rt, shard, msg_id, after) is not None:
        status = Status.WAITING
    if status == 0:
        raise NotFound(f"message {msg_id} not found in topic {topic}")
    raise Conflict(f"message {msg_id} is not being consumed (status {status}): only a consuming message "
                   f"can be touched")
