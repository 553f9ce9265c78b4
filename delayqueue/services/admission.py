"""Rate limits and live-message caps, per namespace and per topic, as web processes enforce them.

The operator sets them in PostgreSQL (the Limit model: the admin, `manage.py set_limits`); each
Runtime holds its namespace's in force (stores/limits.py). What they count lives in Redis, shared
by every web process:

- Rates: token buckets of `rate` tokens a second holding at most one second's worth
  (lua/includes/token_bucket.lua). A namespace's live on its own key (take_tokens.lua); a
  topic's in its slot, taken by admit_send.lua for sends and by pull.lua itself for pulls, so
  a pull takes tokens only for the messages it hands out.
- A topic's live cap: exact. send.lua checks it against the live messages the topic's queues hold as each
  message goes in; admit_send.lua checks it before the message log is written, so a refused
  send costs the log nothing. A sharded topic's shards each hold a share (send.send_calls),
  which a shard count being drained does not shrink: until it is empty, the topic may hold up
  to twice its cap.
- A namespace's live cap: never passed, though its topics live in different Cluster slots. The
  cap is split into shares: each topic holds one (in its meta hash; each shard of a sharded
  topic one of its own, claimed for the messages whose msgIds go there), which send.lua checks
  as each message goes in, and the room no topic holds waits in the namespace's pool
  (lua/borrow_live.lua). A topic short of room borrows from the pool, with some slack; when the
  pool has too little, every topic's unused room goes back to it first. Shares and pool never
  hold more than the cap in all, so the cap is never passed. Room on its way between a share
  and the pool is out of sight of a concurrent send short of room, so sends racing each other
  for the last room of the cap may be refused a little before it is full; sent again (after
  the refusal's retryAfterMillis), they fill it, as no room is lost. A web process killed
  between taking room from the pool and adding it to a share (one round trip) does leave that
  room unused, for as long as Redis keeps the pool (a changed cap changes the pool by the
  difference; a pool Redis lost is counted afresh from the shares).
"""
from collections import Counter
from dataclasses import dataclass

from redis.exceptions import RedisError

from delayqueue.core.exceptions import Throttled
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.live.keys import Bucket, Shard
from delayqueue.live.shards import topic_shards
from delayqueue.runtime import Runtime
from delayqueue.stores.limits import NAMESPACE, Limits
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS

# What a refusal under a live-message cap suggests: messages leave as they are acked, deleted
# or expire, which nothing here can foresee.
LIVE_CAP_RETRY_AFTER_MILLIS = 1_000
# Room a topic borrows from its namespace's pool beyond what it lacks, so that a steady stream
# of sends borrows now and then rather than on every call: a 64th of the cap, at most 100.
SHARE_SLACK_DIVISOR = 64
SHARE_SLACK_MAX = 100


def _whose(rt: Runtime, topic: str) -> str:
    return f"topic {topic}" if topic != NAMESPACE else f"namespace {rt.ns.namespace}"


def rate_refusal(rt: Runtime, *, kind: str, topic: str, rate: int, retry_after_millis: int) -> Throttled:
    return Throttled(f"too many requests: the {kind} rate limit of {_whose(rt, topic)} ({rate} messages/s) is "
                     "reached", retry_after_millis, limit=f"{kind}_rate", topic=topic)


def cap_refusal(rt: Runtime, *, topic: str, max_live: int) -> Throttled:
    return Throttled(f"too many live messages: the live-message cap of {_whose(rt, topic)} ({max_live} messages) "
                     "is reached", LIVE_CAP_RETRY_AFTER_MILLIS, limit="max_live", topic=topic)


def throttled_field(limit: str, topic: str) -> str:
    """A field of the namespace's throttled counters (a topic has no control character)."""
    return f"{limit}\t{topic}"


def throttled_counts(fields: dict[str, str]) -> dict[tuple[str, str], int]:
    """The namespace's throttled counters: (limit, topic) -> messages refused or held."""
    return {tuple(name.split("\t", 1)): int(n) for name, n in fields.items()}


async def count_refusals(rt: Runtime, refusals: list) -> None:
    """Counts the Throttled among `refusals` in the namespace's counters that /metrics shows, per
    limit and whose it is. A count Redis fails is lost: the request answers as it would anyway."""
    counts = Counter(throttled_field(r.limit, r.topic) for r in refusals if isinstance(r, Throttled))
    if not counts:
        return
    pipe = rt.redis.pipeline(transaction=False)
    for name, n in counts.items():
        pipe.hincrby(rt.ns.throttled, name, n)
    try:
        await pipe.execute()
    except RedisError:
        pass


# --- Sends

@dataclass
class SendAdmission:
    """What a batch of sends is admitted under: the refusals decided before the message log was
    written (one per send, None for those that go), the live caps each send script checks as the
    message goes in, and the refusals those checks add."""

    rt: Runtime
    table: dict[str, Limits]
    refusals: list[Throttled | None]

    @property
    def namespace_cap(self) -> int:
        namespace = self.table.get(NAMESPACE)
        return namespace.max_live if namespace else 0

    def topic_cap(self, topic: str) -> int:
        limits = self.table.get(topic)
        return limits.max_live if limits else 0

    async def after_send(self, rows: list[Message], shards: list[Shard], replies: list, send_again) -> list:
        """The send scripts' replies (of the messages `rows`, sent to `shards`), with every send a
        live cap refused turned into that cap's refusal. Those refused because their shard's
        share of the namespace's cap was used up by concurrent sends since admission first claim
        room again and go once more through `send_again(indexes) -> replies` (the namespace's
        pool may well have room)."""
        namespace_cap = self.namespace_cap
        again = [i for i, reply in enumerate(replies) if not isinstance(reply, Exception) and reply.over_namespace_cap]
        if again:
            try:
                fits = await claim_namespace_room(self.rt, max_live=namespace_cap,
                                                  wanted=Counter(shards[i] for i in again))
            except RedisError:
                fits = Counter()  # refused, as the send script said
            going = []
            for i in again:
                if fits[shards[i]] > 0:
                    fits[shards[i]] -= 1
                    going.append(i)
            if going:
                for i, reply in zip(going, await send_again(going)):
                    replies[i] = reply
        return [self._cap_refusal(row, reply, namespace_cap) for row, reply in zip(rows, replies)]

    def _cap_refusal(self, row: Message, reply, namespace_cap: int):
        if isinstance(reply, Exception) or not (reply.over_live_cap or reply.over_namespace_cap):
            return reply
        if reply.over_live_cap:
            return cap_refusal(self.rt, topic=row.topic, max_live=self.topic_cap(row.topic))
        return cap_refusal(self.rt, topic=NAMESPACE, max_live=namespace_cap)


async def admit_sends(rt: Runtime, *, table: dict[str, Limits], topics: list[str],
                      shards: list[Shard] | None) -> SendAdmission:
    """The admission of messages to send (given by their topics, in request order; under a
    namespace live cap, by the shards their msgIds go to too) under the limits in `table`.
    Raises RedisError.

    The namespace's bucket and each limited topic's admission are asked at once, in one
    pipelined round trip (their keys are in different slots, so no one script can hold both);
    each grants the first messages of its own, in request order. A message goes if both let it;
    the tokens taken for a message one of them refused are given back to the other. (A topic
    counts against its live cap the messages the namespace refused in the same call too, which
    errs towards refusing.) Under a namespace live cap each shard first claims room for its
    messages in its share (claim_namespace_room); the messages beyond it are refused."""
    ctx = rt.context
    refusals: list[Throttled | None] = [None] * len(topics)
    going = list(range(len(topics)))
    namespace = table.get(NAMESPACE)
    if namespace and namespace.max_live:
        fits = await claim_namespace_room(rt, max_live=namespace.max_live, wanted=Counter(shards))
        for i in going:
            fits[shards[i]] -= 1
            if fits[shards[i]] < 0:
                refusals[i] = cap_refusal(rt, topic=NAMESPACE, max_live=namespace.max_live)
        going = [i for i in going if refusals[i] is None]
    namespace_rate = namespace.produce_rate if namespace and going else 0
    by_topic: dict[str, list[int]] = {}
    for i in going:
        limits = table.get(topics[i])
        if limits and (limits.produce_rate or limits.max_live):
            by_topic.setdefault(topics[i], []).append(i)
    calls = [scripts.admit_send(ctx, topic, wanted=len(positions), produce_rate=table[topic].produce_rate,
                                max_live=table[topic].max_live) for topic, positions in by_topic.items()]
    if namespace_rate:
        calls.append(scripts.take_tokens(ctx, None, kind=Bucket.PRODUCE, wanted=len(going), rate=namespace_rate))
    if calls:
        # One call (a single send's) shares its round trip with the loop's other calls.
        grants = [await rt.scripts.call(calls[0])] if len(calls) == 1 else await rt.scripts.run_all(calls)
        namespace_granted = going[:grants[-1].granted] if namespace_rate else going
        if namespace_rate:
            for i in going[grants[-1].granted:]:
                refusals[i] = rate_refusal(rt, kind=Bucket.PRODUCE, topic=NAMESPACE, rate=namespace_rate,
                                           retry_after_millis=grants[-1].retry_after_millis)
        give_back, topic_refused = [], 0
        for (topic, positions), grant in zip(by_topic.items(), grants):
            limits = table[topic]
            for j, i in enumerate(positions[grant.granted:], grant.granted):
                if refusals[i] is None:
                    topic_refused += 1
                    refusals[i] = (cap_refusal(rt, topic=topic, max_live=limits.max_live) if j >= grant.within_cap
                                   else rate_refusal(rt, kind=Bucket.PRODUCE, topic=topic, rate=limits.produce_rate,
                                                     retry_after_millis=grant.retry_after_millis))
            unused = sum(i not in namespace_granted for i in positions[:grant.granted])
            if unused and limits.produce_rate:
                give_back.append(scripts.take_tokens(ctx, topic, kind=Bucket.PRODUCE, wanted=-unused,
                                                     rate=limits.produce_rate))
        if topic_refused and namespace_rate:
            give_back.append(scripts.take_tokens(ctx, None, kind=Bucket.PRODUCE, wanted=-topic_refused,
                                                 rate=namespace_rate))
        if give_back:
            await rt.scripts.run(give_back)
    return SendAdmission(rt, table, refusals)


async def claim_namespace_room(rt: Runtime, *, max_live: int, wanted: Counter[Shard]) -> Counter[Shard]:
    """Shard (a topic's own keys, or a shard of a sharded topic) -> how many of the `wanted` new
    messages fit in its share of the namespace's live cap `max_live`, once it has borrowed what
    it lacks from the namespace's pool. When the pool has too little, every share's unused room
    goes back to it and the shards ask again, without slack. Raises RedisError."""
    short = await _shortfalls(rt, wanted)
    if not short:
        return Counter(wanted)
    slack = min(max(max_live // SHARE_SLACK_DIVISOR, 1), SHARE_SLACK_MAX)
    granted = await _borrow(rt, max_live=max_live, wanted=sum(short.values()) + slack * len(short))
    if granted < sum(short.values()):
        await give_back_room(rt, amount=granted)
        await _reclaim_unused_room(rt, also=list(wanted))
        short = await _shortfalls(rt, wanted)
        slack = 0
        granted = await _borrow(rt, max_live=max_live, wanted=sum(short.values())) if short else 0
    grants = Counter()
    for shard, lacking in short.items():  # what each lacks first, in request order; then the slack
        grants[shard] = min(lacking, granted - grants.total())
    for shard in short:
        grants[shard] += min(slack, granted - grants.total())
    await rt.scripts.run_all([scripts.grant_live_share(rt.context, shard, amount=n)
                              for shard, n in grants.items() if n])
    return Counter({shard: n - max(short.get(shard, 0) - grants[shard], 0) for shard, n in wanted.items()})


async def _shortfalls(rt: Runtime, wanted: Counter[Shard]) -> dict[Shard, int]:
    """Shard -> the room it lacks in its share for its wanted messages, for those lacking any."""
    lacking = await rt.scripts.run_all([scripts.live_share_shortfall(rt.context, shard, wanted=n)
                                        for shard, n in wanted.items()])
    return {shard: n for shard, n in zip(wanted, lacking) if n}


async def _holders(rt: Runtime) -> set[Shard]:
    """Every key set that may hold a share: each registered topic's shards, of every count."""
    settings = await rt.topic_configs.table()
    return {shard for topic in await rt.redis.zrange(rt.ns.topics, 0, -1)
            for shard in topic_shards(topic, settings.get(topic, DEFAULT_SETTINGS).shard_counts)}


async def _borrow(rt: Runtime, *, max_live: int, wanted: int) -> int:
    """Takes up to `wanted` room from the namespace's pool, making the pool first when there
    is none: the cap less the shares its topics' shards hold, each share first raised to cover
    the shard's live messages."""
    granted = await rt.scripts.call(scripts.borrow_live(rt.context, wanted=wanted, max_live=max_live, held=-1))
    if granted < 0:
        shares = await rt.scripts.run_all([scripts.cover_live_share(rt.context, shard) for shard in await _holders(rt)])
        granted = await rt.scripts.call(scripts.borrow_live(rt.context, wanted=wanted, max_live=max_live,
                                                            held=sum(shares)))
    return granted


async def _reclaim_unused_room(rt: Runtime, *, also: list[Shard]) -> None:
    """Shrinks every share (the registered topics' shards', and `also`'s) to its live messages
    and gives the rest back to the namespace's pool."""
    holders = await _holders(rt) | set(also)
    released = sum(await rt.scripts.run_all([scripts.release_live_share(rt.context, shard) for shard in holders]))
    if released:
        await give_back_room(rt, amount=released)


async def give_back_room(rt: Runtime, *, amount: int) -> None:
    """Returns room a topic no longer holds to the namespace's pool."""
    if amount:
        await rt.scripts.call(scripts.borrow_live(rt.context, wanted=-amount, max_live=0, held=-1))


# --- Pulls

async def reserve_consume(rt: Runtime, *, namespace: Limits, wanted: int) -> tuple[int, Throttled | None]:
    """Takes up to `wanted` tokens of the namespace's consume bucket for pulls: how many, and when
    there is none the refusal (counted). The pulls give back what they did not hand out
    (give_back_consume)."""
    grant = await rt.scripts.call(scripts.take_tokens(rt.context, None, kind=Bucket.CONSUME, wanted=wanted,
                                                      rate=namespace.consume_rate))
    if grant.granted:
        return grant.granted, None
    refusal = rate_refusal(rt, kind=Bucket.CONSUME, topic=NAMESPACE, rate=namespace.consume_rate,
                           retry_after_millis=grant.retry_after_millis)
    await count_refusals(rt, [refusal])
    return 0, refusal


async def give_back_consume(rt: Runtime, *, namespace: Limits, unused: int) -> None:
    await rt.scripts.call(scripts.take_tokens(rt.context, None, kind=Bucket.CONSUME, wanted=-unused,
                                              rate=namespace.consume_rate))
