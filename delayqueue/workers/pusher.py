"""The pusher: POSTs the due messages of a namespace's topics that have a push URL (docs/push.md).

It is a consumer like any other, inside `manage.py run_scanners`: it takes messages with the
same pull script (which makes due ones ready first), so they are in flight with an ack deadline
of the topic's pushTimeoutMillis plus a margin; a 2xx answer acks one, anything else gives it
back with the topic's backoff (nack.lua), so retries, maxRetry, TTL, dead letters and the
history come from the queue itself. A pusher killed mid-delivery leaves its messages in flight
until their deadline, and the scanner then makes them ready again: at least once, never lost.
Any number of pushers share a topic: each message is pulled by one of them, and the pull
counts the topic's in-flight messages against pushConcurrency across all of them (and takes
from the topic's consume bucket, at pushRatePerSecond or the topic's consume rate, the lower).

It learns which topics have work from the ready channel (the scanner publishes a topic as its
messages become ready) and the schedule channel (a send due earlier than the topic's other
messages), and pulls those; a pull that found nothing ready answers when the topic's next
message is due, and the topic is pulled again then; a delivery that ends frees a slot for its
topic's next pull; slots held elsewhere are looked at again shortly (HELD_RETRY_SECONDS); every
push topic is pulled now and then all the same (SWEEP_SECONDS). It holds nothing for a topic
with nothing due: state lives per delivery, per endpoint in use and per topic with a message
waiting (its next pull's time).
"""
import asyncio
import heapq
import logging
import time
from collections import Counter

import orjson
from redis.exceptions import RedisError

from delayqueue.core.clock import now_millis, wait_seconds
from delayqueue.core.constants import MAX_EVENT_DETAIL, PUSH_RETRY_BACKOFF_DEFAULT_MILLIS
from delayqueue.core.exceptions import Throttled
from delayqueue.core.messages import Message
from delayqueue.core.outage import Outage, describe
from delayqueue.core.stopping import cancel_and_wait
from delayqueue.live import push_counts, scripts
from delayqueue.live.pubsub import subscribe_forever
from delayqueue.runtime import Runtime
from delayqueue.services.consume import Pull, ack_message, nack_message, pull_many
from delayqueue.stores.push_topics import PushTopic, PushTopicCache
from delayqueue.stores.refreshed import REFRESH_SECONDS
from delayqueue.workers.push_http import PushClient, push_headers

log = logging.getLogger(__name__)

# A pushed message's ack deadline is its attempt's time limit plus this: room for the answer's
# ack to reach Redis before the scanner gives the message back.
ACK_MARGIN_MILLIS = 2_000
SWEEP_SECONDS = 5.0  # every push topic is pulled at least this often: a safety net for lost wakes
HELD_RETRY_SECONDS = 0.2  # a topic with messages ready but its slots held by other pushers is pulled again
ERROR_BACKOFF = 0.5
FIGURES_EVERY = 1.0  # counts go to Redis this often
STOP_GRACE_SECONDS = 5.0  # deliveries still running at a stop after this are cancelled (redelivered later)
# Deliveries begun in one turn of the event loop, which the scanners of every namespace in the process
# share: a pull's 200 messages begun at once (body, signature, request) held it 30-80 ms.
STARTS_PER_TURN = 16


class _Wakes:
    """Topic -> the loop time to pull it again, the earliest asked for; the due ones taken in
    time order (a heap: thousands of topics waiting cost nothing per turn)."""

    def __init__(self):
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def at(self, topic: str, when: float) -> None:
        if when < self._at.get(topic, float("inf")):
            self._at[topic] = when
            heapq.heappush(self._heap, (when, topic))

    def due(self, now: float) -> list[str]:
        topics = []
        while self._heap and self._heap[0][0] <= now:
            when, topic = heapq.heappop(self._heap)
            if self._at.get(topic) == when:  # else a stale entry: an earlier wake replaced it
                del self._at[topic]
                topics.append(topic)
        return topics

    def next(self) -> float:
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else float("inf")


class Pusher:
    def __init__(self, rt: Runtime):
        self.rt = rt
        self.counts = Counter()  # pushed, failed: for the stop's log line
        self._wanted: set[str] = set()  # topics to pull at the next turn
        self._held: set[str] = set()  # topics whose slots were full: a delivery that ends wants them
        self._wakes = _Wakes()  # topics to pull again later (a due time, a rate's refill, slots held elsewhere)
        self._running = Counter()  # topic -> this process' deliveries in flight
        self._deliveries: set[asyncio.Task] = set()
        self._client = PushClient(rt.config.push_hosts)
        self._figures = Counter()  # pushes hash field -> what to add
        self._kick = asyncio.Event()
        self._sweep_now = False
        self._topics = PushTopicCache(rt.ns, rt.log_database)  # its own: the runtime's topic settings carry no secrets

    def want(self, topic: str) -> None:
        self._wanted.add(topic)
        self._kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        listener = loop.create_task(self._listen(), name="push-listener")
        outage = Outage(log, f"pusher of namespace {self.rt.ns.namespace}")
        # A stop wakes the loop as any other news does.
        stopper = loop.create_task(stop.wait())
        stopper.add_done_callback(lambda _: self._kick.set())
        next_sweep = next_figures = loop.time()
        known: dict[str, PushTopic] = {}  # the table of push topics last looked at
        try:
            while not stop.is_set():
                table = await self._topics.table()
                if table is not known:  # read again (each read is a new table)
                    # A topic given a push URL (or another one) since is pulled now: messages sent before this
                    # process read it were not its to take when their wakes came (pull.lua matches the URL).
                    self._wanted.update(topic for topic, settings in table.items() if known.get(topic) != settings)
                    known = table
                now = loop.time()
                if now >= next_sweep or self._sweep_now:
                    self._sweep_now = False
                    self._wanted.update(table)
                    next_sweep = now + SWEEP_SECONDS
                if now >= next_figures:
                    await self._write_figures()
                    await self._client.close_idle()
                    next_figures = now + FIGURES_EVERY
                self._wanted.update(self._wakes.due(now))
                if self._wanted:
                    try:
                        await self._pull(table)
                        outage.ok()
                    except RedisError as exc:
                        outage.failed(describe(exc))
                    except Exception:  # one bad pull must not end run_scanners with every namespace's scanner
                        log.exception("pusher of namespace %s: a pull failed", self.rt.ns.namespace)
                self._kick.clear()
                if self._wanted or stop.is_set():
                    continue
                wake_at = min(next_sweep, next_figures, now + REFRESH_SECONDS, self._wakes.next())
                timer = loop.call_at(wake_at, self._kick.set)
                try:
                    await self._kick.wait()
                finally:
                    timer.cancel()
        finally:
            await cancel_and_wait(listener, stopper)
            if self._deliveries:
                await asyncio.wait(set(self._deliveries), timeout=STOP_GRACE_SECONDS)
                await cancel_and_wait(*self._deliveries)
            await self._write_figures()
            await self._client.close()
            await self._topics.close()

    async def _pull(self, table: dict[str, PushTopic]) -> None:
        """Pulls every wanted push topic with a free slot, in one pipelined round trip, and
        starts a delivery per message."""
        wanted, self._wanted = self._wanted, set()
        limits = await self.rt.limits.table()
        pulls = []
        for topic in wanted:
            settings = table.get(topic)
            if settings is None:
                continue
            room = settings.push_concurrency - self._running[topic]
            if room <= 0:
                self._held.add(topic)
                continue
            # A push is a take: the topic's consume rate (perhaps the operator's) holds it as it holds
            # pulls, pushRatePerSecond too; one bucket at the lower rate holds both.
            rates = [settings.push_rate, limits[topic].consume_rate if topic in limits else 0]
            pulls.append((settings, room, Pull(topic, room, settings.push_timeout_millis + ACK_MARGIN_MILLIS,
                                               consume_rate=min((rate for rate in rates if rate), default=0),
                                               max_inflight=settings.push_concurrency, push_url=settings.push_url,
                                               push_secret_id=settings.push_secret_id)))
        if not pulls:
            return
        sent_at = time.time()
        try:
            replies = await pull_many(self.rt, pulls=[pull for *_, pull in pulls])
        except RedisError:  # the namespace's consume rate could not be asked
            retry_at = asyncio.get_running_loop().time() + ERROR_BACKOFF
            for *_, pull in pulls:
                self._wakes.at(pull.topic, retry_at)
            raise
        received_at, now = time.time(), asyncio.get_running_loop().time()
        failure = None
        started = 0
        for (settings, room, pull), reply in zip(pulls, replies):
            topic = pull.topic
            if isinstance(reply, Throttled):  # by the namespace's consume rate
                self._wakes.at(topic, now + reply.retry_after_millis / 1000)
                continue
            if isinstance(reply, Exception):
                self._wakes.at(topic, now + ERROR_BACKOFF)
                failure = reply
                continue
            for message in reply.messages:
                try:
                    self._start(topic, settings, message)
                except Exception:  # left in flight: it comes back at its ack deadline
                    log.exception("pusher could not start a push of topic %s", topic)
                started += 1
                if started % STARTS_PER_TURN == 0:
                    await asyncio.sleep(0)  # lets the ones started begin, a few at a turn of the loop
            if reply.paused:  # resumeTopic publishes it on the ready channel; a new URL is pulled once read
                continue
            if reply.retry_after_millis:
                self._wakes.at(topic, now + reply.retry_after_millis / 1000)
                continue
            if reply.remaining > 0:
                if len(reply.messages) >= room:
                    self._held.add(topic)  # its next delivery to end pulls it again
                else:
                    # Its slots are held elsewhere (other pushers, consumers' pulls from before it
                    # had a push URL): whoever holds them sends no wake when they end.
                    self._wakes.at(topic, now + HELD_RETRY_SECONDS)
            if reply.next_due_us > 0:
                # Pulled again at the next message's due time (the pull makes it ready), not only
                # when the scanner has promoted it and said so: one hop less.
                self._wakes.at(topic, now + wait_seconds(due_in_us=reply.next_due_us, server_now_us=reply.server_now_us,
                                                         sent_at=sent_at, received_at=received_at))
        if isinstance(failure, RedisError):
            raise failure

    def _start(self, topic: str, settings: PushTopic, message: Message) -> None:
        self._running[topic] += 1
        task = asyncio.get_running_loop().create_task(self._deliver(topic, settings, message))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, topic: str, settings: PushTopic, message: Message) -> None:
        rt = self.rt
        try:
            body = orjson.dumps(message.to_wire())
            signed_at = now_millis()
            headers = push_headers(message, settings.signing_secrets(signed_at), signed_at, body)
            status, detail = await self._client.post(settings.push_url, body, headers, settings.push_timeout_millis)
            if status is not None and 200 <= status < 300:
                self.counts["pushed"] += 1
                lateness = now_millis() - message.trigger_time
                for name in push_counts.pushed_fields(topic, lateness):
                    self._figures[name] += 1
                self._figures[push_counts.lateness_field(topic)] += max(lateness, 0)
                settle = ack_message(rt, topic=topic, msg_id=message.msg_id, push_status=str(status),
                                     retry=message.retry)
            else:
                self.counts["failed"] += 1
                self._figures[push_counts.failed_field(topic, str(status) if status is not None else detail[0])] += 1
                settle = nack_message(
                    rt, topic=topic, msg_id=message.msg_id, default_backoff_millis=PUSH_RETRY_BACKOFF_DEFAULT_MILLIS,
                    push_failure=(f"HTTP {status}" if status is not None else ": ".join(detail))[:MAX_EVENT_DETAIL],
                    retry=message.retry)
            try:  # this delivery's alone: one past its ack deadline, delivered again since, is left to the next
                await settle
            except RedisError as exc:  # the message comes back at its ack deadline: pushed again
                log.warning("pusher could not settle message %s of topic %s: %s", message.msg_id, topic, exc)
        except Exception:  # left in flight: it comes back at its ack deadline
            log.exception("pushing message %s of topic %s failed", message.msg_id, topic)
        finally:
            self._running[topic] -= 1
            if not self._running[topic]:
                del self._running[topic]
            if topic in self._held:
                self._held.discard(topic)
                self.want(topic)

    async def _write_figures(self) -> None:
        if not self._figures:
            return
        counts, self._figures = self._figures, Counter()
        try:
            await self.rt.scripts.call(scripts.add_counts(self.rt.context, fields=list(counts.items())))
        except RedisError:
            self._figures.update(counts)  # added at the next write

    async def _listen(self) -> None:
        def received(message: dict) -> None:
            # Only push topics wake the loop: the channels carry every topic of the namespace,
            # pulled ones too. One given a push URL since is pulled as the settings show it.
            if message["type"] not in ("message", "pmessage"):
                return
            topic = message["data"]
            if message["channel"] == self.rt.ns.ready_channel:  # it names a ready list
                shard = self.rt.ns.shard_of_ready(topic)
                topic = None if shard is None else shard.topic
            table = self._topics.current
            if topic is not None and (table is None or topic in table):
                self.want(topic)

        def subscribed(rescan: bool) -> None:
            if rescan:  # wakes may have been missed: look at every push topic
                self._sweep_now = True
                self._kick.set()

        cfg = self.rt.config
        # Ready: a topic has messages to take. Schedule: it has an earlier due time than before (a
        # send), which a pull answers, so the topic is pulled again at that time; a shard's on a channel
        # of its own (keys.wake_channel).
        channels = (self.rt.ns.ready_channel, self.rt.ns.schedule_channel)
        await subscribe_forever(cfg.redis_url, cfg.redis_timeout, what="pusher", channels=channels,
                                patterns=(self.rt.ns.schedule_shards,), on_message=received,
                                on_subscribed=subscribed, on_lost=lambda: None)
