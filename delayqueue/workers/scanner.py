"""The background worker behind `manage.py run_scanners`.

For every topic it holds the lock of, a TopicWorker runs those of promote-due,
requeue-timed-out, expire and purge-ended that have work, in one pipelined round trip, then
sleeps exactly until the earliest next thing any of them reported, or until the schedule
channel says the topic got earlier work (a send due sooner, a pull with a nearer ack deadline).
So a message is promoted within milliseconds of its triggerTime instead of on a fixed tick.

Any number of scanners cooperate: a topic is worked by whoever holds its lock
(SET NX PX, renewed at a third of its TTL, compare-and-delete on release). Each scanner also
keeps a heartbeat key of its own alive (`alive:<token>`, TTL 0.8 s, renewed every 0.2 s). A
standby, one that failed to get a lock, notes who holds it and looks at that holder's heartbeat
every 0.1 s: once it is gone (the holder was killed, or stopped and released its locks) the
standby takes the lock over with a compare-and-set (lock_take_over.lua: only while the lock
still names the gone holder, or nobody), so a killed holder's topics move on within about a
second, whatever the lock TTL. Otherwise a standby tries again when the lock's PTTL runs out,
and a scanner alone, restarted under a new token, waits at most that long as before. A holder
that was only paused past its heartbeat finds, at its next renewal, that it lost the lock, and
stops its worker. Correctness never rests on the lock: every transition is one atomic script,
so two scanners working a topic at once still promote each message once.

Each scanner also runs the namespace's dead-letter redrive tasks (workers/redriver.py),
one at a time, under a lease in PostgreSQL, and loads its topics' cold messages
(workers/loader.py). The history of the topics it holds is written, and the namespace's
schedules are planned, in a process of their own (workers/log_process.py), told which topics
the scanner holds through `held_changed`: on this event loop their Python work held
promotions up.

Started while Redis is down, a scanner waits for it; Redis or PostgreSQL failing later is
retried, each outage logged once as it starts and once as it ends (outage.py).
"""
import asyncio
import itertools
import logging
import os
import secrets
import socket
import uuid

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from redis.exceptions import RedisError

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import SHARDS_SETTLE_MILLIS
from delayqueue.core.exceptions import LogUnavailable
from delayqueue.core.outage import Outage, describe
from delayqueue.core.stopping import cancel_and_wait
from delayqueue.core.timer import PreciseTimer
from delayqueue.live import scripts, stats
from delayqueue.live.keys import Meta, Shard
from delayqueue.live.pubsub import subscribe_forever
from delayqueue.live.shards import deal_hours, topic_shards
from delayqueue.runtime import Runtime
from delayqueue.services.admission import give_back_room
from delayqueue.services.messages import given_up
from delayqueue.services.topic_control import mend_mirrors
from delayqueue.services.topics import redis_millis
from delayqueue.stores.rows import forget_drained_shards
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings
from delayqueue.workers.loader import Loader
from delayqueue.workers.redriver import Redriver
from delayqueue.workers.topic_worker import TopicWorker

log = logging.getLogger(__name__)

REGISTRY_REFRESH = 1.0
LAG_SAMPLE = 0.1  # the lag probe sleeps this long and measures how late it wakes
LAG_REPORT = 1.0  # and reports the worst overrun to Redis this often (for /metrics)
GONE_AFTER_MILLIS = 10_000  # a scanner whose lag report is this old has stopped
START_BACKOFF, MAX_START_BACKOFF = 0.1, 2.0  # seconds between tries to reach Redis at start
RETRY_AFTER_FAILURE = 0.5  # seconds before the main loop tries a failed step again
# What its promotions counted (promote_due.lua answers it) goes into each topic's stats hash this
# often, one fold_stats call a topic, not a dozen commands in every promotion call.
STATS_FOLD_EVERY = 1.0
# A running scanner keeps its heartbeat key alive (TTL HEARTBEAT_TTL_MILLIS, renewed every
# HEARTBEAT_EVERY s); standbys look at the heartbeats of the holders of the locks they want
# every WATCH_EVERY s. A holder killed is seen gone within TTL + WATCH_EVERY, about 0.9 s,
# whatever the lock TTL; its event loop may stall up to TTL - HEARTBEAT_EVERY before it is.
HEARTBEAT_TTL_MILLIS = 800
HEARTBEAT_EVERY = 0.2
WATCH_EVERY = 0.1
# Calls of a stats prune or fold (one per held topic) sent in one round trip on that connection: all at
# once, a namespace holding 1,000 topics put 0.2 s of prunes ahead of another namespace's due message.
STATS_CALLS_PER_TRIP = 50


class Scanner:
    def __init__(self, rt: Runtime, name: str | None = None):
        self.rt = rt
        self.token = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        rt.set_process(f"scanner {self.token}")
        # The cold messages of the topics whose loading falls to it go into Redis through it (the
        # cold tier keeps them in the log).
        self.loader = Loader(rt, lambda: list(self.workers)) if rt.config.message_log else None
        # A topic is worked shard by shard (its own keys, unsharded): each has its lock and worker.
        self.workers: dict[Shard, TopicWorker] = {}
        self.passes = rt.scanner_passes.party(rt.ns.namespace)  # taken by each TopicWorker pass
        # Set when `workers` changed: the held topics' history writer (workers/log_process.py) is told.
        self.held_changed = asyncio.Event()
        self.held_changed.set()
        self.known: set[str] = set()  # the registered topics, and those heard of since the registry was read
        self._listed: set[str] = set()  # the topics the registry listed when last read
        self.shards: dict[str, list[Shard]] = {}  # a known topic -> its shards, those of every count it may use
        self.next_try: dict[Shard, float] = {}  # shard -> monotonic time to try its lock again
        self.holders: dict[Shard, str] = {}  # shard -> the lock token of the scanner seen holding it
        self.counts = {"unpacked": 0, "promoted": 0, "requeued": 0, "expired": 0, "purged": 0}
        self._stats_to_fold: dict[Shard, dict[str, int]] = {}
        self._stop = asyncio.Event()
        self._poke = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._marker_seen = False
        self._drain_outage = Outage(log, f"scanner {self.token} cannot retire drained shard counts")
        # A held topic -> the settings its Redis mirror was last found to hold (_mend_mirrors).
        self._mirrored: dict[str, TopicSettings] = {}
        self._mend_outage = Outage(log, f"scanner {self.token} cannot check the topic settings' Redis mirrors")

    @property
    def lock_ttl(self) -> int:
        return self.rt.config.scanner_lock_ttl_millis

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()

    async def _wait_for_redis(self) -> bool:
        """Loads the scripts, waiting while Redis cannot take them (down, still loading its data,
        refusing the password): a scanner started before its Redis, or during a restart, must not
        exit. False if stopped while waiting."""
        outage = Outage(log, f"scanner {self.token} cannot start yet")
        backoff = START_BACKOFF
        while not self._stop.is_set():
            try:
                await scripts.load_scripts(self.rt.redis)
                outage.ok()
                return True
            except RedisError as exc:
                outage.failed(describe(exc))
            try:
                await asyncio.wait_for(self._stop.wait(), backoff)
            except asyncio.TimeoutError:
                pass
            backoff = min(backoff * 2, MAX_START_BACKOFF)
        return False

    async def run(self) -> None:
        if not await self._wait_for_redis():
            return
        loop = asyncio.get_running_loop()
        self.timer = PreciseTimer(loop)
        try:
            await self._beat()  # alive before it holds a lock, or standbys would take it at once
        except RedisError:
            pass  # the heartbeat task tries again
        listener = loop.create_task(self._listen(), name="schedule-listener")
        lag_probe = loop.create_task(self._report_lag(), name="lag-probe")
        heartbeat = loop.create_task(self._heartbeat(), name="heartbeat")
        watcher = loop.create_task(self._watch_holders(), name="holder-watcher")
        loader = loop.create_task(self.loader.run(self._stop), name="loader") if self.loader else None
        # Dead letters live in the message log: without it there is nothing to redrive.
        redriver = (loop.create_task(Redriver(self.rt, self.token).run(self._stop), name="redriver")
                    if self.rt.config.message_log else None)
        await self._subscribed.wait()
        next_refresh = next_renew = next_retire = next_prune = next_fold = loop.time()
        outage = Outage(log, f"scanner {self.token}")
        # Its own: the loss check may need the message log, which the topics' work does not.
        loss_check_outage = Outage(log, f"scanner {self.token} cannot check for lost Redis data")
        try:
            while not self._stop.is_set():
                now = loop.time()
                failed = False
                try:
                    if now >= next_refresh:
                        try:
                            await self._check_marker()
                            loss_check_outage.ok()
                        except LogUnavailable as exc:
                            loss_check_outage.failed(describe(exc))
                        await self._read_registry()
                        await self._refresh_shards()
                        # Until it is retired, a drained shard count costs every pull a call per shard.
                        await self._retire_drained_shards()
                        await self._mend_mirrors()
                        next_refresh = now + REGISTRY_REFRESH
                    if now >= next_renew:
                        await self._renew()
                        next_renew = now + self.lock_ttl / 3000
                    await self._acquire(now)
                    if now >= next_retire:
                        await self._retire_idle_topics()
                        next_retire = now + self.rt.config.topic_check_seconds
                    if now >= next_prune:
                        await self._prune_stats()
                        next_prune = now + self.rt.config.monitor_interval_seconds
                    if now >= next_fold:
                        next_fold = now + STATS_FOLD_EVERY
                        await self._fold_stats()
                    outage.ok()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    outage.failed(describe(exc))
                    failed = True
                wake_at = min([next_refresh, next_renew, next_fold, *self.next_try.values()])
                if failed:  # the failed step is due again at once: not in a busy loop
                    wake_at = max(wake_at, loop.time() + RETRY_AFTER_FAILURE)
                self._poke.clear()
                try:
                    await asyncio.wait_for(self._poke.wait(), max(0.0, wake_at - loop.time()))
                except asyncio.TimeoutError:
                    pass
        finally:
            await cancel_and_wait(listener, lag_probe, heartbeat, watcher)
            self._stop.set()
            await asyncio.gather(*(task for task in (redriver, loader) if task is not None), return_exceptions=True)
            await self._shutdown()

    async def _check_marker(self) -> None:
        """Redis keeps the marker key for as long as it keeps its data. Finding it gone, or Redis
        empty (no marker, no topic) while the message log holds live messages, means Redis lost
        its data (FLUSHALL, a restart without persistence, a failover to an empty replica), and
        only a restore from the log brings the messages back: said loudly, and recorded for
        /metrics. Of several scanners, the one that sets the marker again reports."""
        if not await self.rt.redis.set(self.rt.ns.marker, now_millis(), nx=True):
            self._marker_seen = True
            return
        if self._marker_seen:
            why = "its marker key vanished while this scanner ran"
        elif (self.loader is not None and not await self.rt.redis.exists(self.rt.ns.topics)
              and await self._log_holds_live_messages()):
            why = "it held no topic and no marker key while the message log holds live messages"
        else:
            self._marker_seen = True  # the first scanner on this Redis, which holds what it should
            return
        self._marker_seen = True
        # Said before it is recorded: whoever sees the record (/metrics, a test) finds it said.
        log.error("Redis lost its data (%s): run `manage.py restore` to bring back the messages the log holds", why)
        await self.rt.redis.set(self.rt.ns.data_lost, now_millis())

    async def _log_holds_live_messages(self) -> bool:
        try:
            return await self.loader.holds_live_messages()
        except LogUnavailable:
            await self.rt.redis.delete(self.rt.ns.marker)  # undecided: the next check asks again
            raise

    async def _read_registry(self) -> None:
        """The registered topics join the known ones, and those it listed before and no longer
        does leave them (a sharded topic retired by the holder of its first shard: the holders of
        its other shards then let them go)."""
        listed = set(await self.rt.redis.zrange(self.rt.ns.topics, 0, -1))
        self.known = (self.known - (self._listed - listed)) | listed
        self._listed = listed

    async def _refresh_shards(self) -> None:
        """The shards of every known topic, as the topic settings in force give them; the workers
        of shards no longer among them (a drained shard count) stop."""
        settings = await self.rt.topic_configs.table()
        self.shards = {topic: topic_shards(topic, settings.get(topic, DEFAULT_SETTINGS).shard_counts)
                       for topic in self.known}
        current = {shard for shards in self.shards.values() for shard in shards}
        for gone in [shard for shard in self.workers if shard not in current]:
            await self._stop_worker(gone)
            await self.rt.scripts.call(scripts.lock_release(self.rt.context, gone, token=self.token))

    async def _acquire(self, now: float) -> None:
        if len(self.shards) < len(self.known):  # topics just heard of
            await self._refresh_shards()
        candidates = [t for shards in self.shards.values() for t in shards
                      if t not in self.workers and self.next_try.get(t, 0) <= now]
        if not candidates:
            return
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic in candidates:
            lock = self.rt.ns.topic(topic).lock
            pipe.set(lock, self.token, nx=True, px=self.lock_ttl)
            pipe.pttl(lock)
            pipe.get(lock)
        replies = await pipe.execute()
        for i, topic in enumerate(candidates):
            got, pttl, holder = replies[3 * i:3 * i + 3]
            if topic in self.workers:  # taken over (_watch_holders) while this ran
                continue
            # Its own: a renewal that failed (Redis answering an error) stopped the worker, not the lock.
            if got or holder == self.token:
                self._start_worker(topic)
                log.info("scanner %s took topic %s", self.token, topic)
            else:
                # Someone else holds it: look again the moment their lock would run out, or
                # sooner if _watch_holders sees the holder gone.
                self.next_try[topic] = now + (max(pttl, 0) + 1) / 1000
                if holder is not None:
                    self.holders[topic] = holder

    def _start_worker(self, topic: Shard) -> None:
        self.next_try.pop(topic, None)
        self.holders.pop(topic, None)
        self.workers[topic] = TopicWorker(self, topic)
        self.held_changed.set()

    async def _stop_worker(self, topic: Shard) -> None:
        await self.workers.pop(topic).stop()
        self.held_changed.set()

    async def _beat(self) -> None:
        await self.rt.redis.set(self.rt.ns.scanner_alive(self.token), now_millis(), px=HEARTBEAT_TTL_MILLIS)

    async def _heartbeat(self) -> None:
        """Keeps this scanner's heartbeat key alive; standbys take its topics when it is gone.
        Failures are the main loop's to report (Redis is down for it too)."""
        while True:
            try:
                await self._beat()
            except RedisError:
                pass
            await asyncio.sleep(HEARTBEAT_EVERY)

    async def _watch_holders(self) -> None:
        """Standby: takes over, at once, the topics whose lock holder's heartbeat is gone (killed,
        or stopped and released), instead of waiting for the lock's TTL. The take-over is a
        compare-and-set on the lock, so of several standbys one gets each topic."""
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                await self._take_over_from_gone_holders()
            except RedisError:
                pass  # the main loop reports Redis' failures

    async def _take_over_from_gone_holders(self) -> None:
        holders = sorted({h for t, h in self.holders.items() if t not in self.workers and h != self.token})
        if not holders:
            return
        pipe = self.rt.redis.pipeline(transaction=False)
        for holder in holders:
            pipe.exists(self.rt.ns.scanner_alive(holder))
        gone = {holder for holder, alive in zip(holders, await pipe.execute()) if not alive}
        topics = [t for t, h in self.holders.items() if h in gone and t not in self.workers]
        if not topics:
            return
        taken = await self.rt.scripts.run(
            [scripts.lock_take_over(self.rt.context, t, gone_token=self.holders[t], token=self.token,
                                    ttl_millis=self.lock_ttl) for t in topics])
        for topic, got in zip(topics, taken):
            if topic in self.workers:
                continue
            if got is True:
                log.info("scanner %s took over topic %s from %s, which is gone", self.token, topic,
                         self.holders[topic])
                self._start_worker(topic)
            else:  # another standby was quicker: the main loop looks at who holds it now
                self.holders.pop(topic, None)
                self.next_try[topic] = 0.0
                self._poke.set()

    async def _renew(self) -> None:
        topics = list(self.workers)
        if not topics:
            return
        results = await self.rt.scripts.run(
            [scripts.lock_renew(self.rt.context, t, token=self.token, ttl_millis=self.lock_ttl) for t in topics],
        )
        for topic, renewed in zip(topics, results):
            if renewed is not True:
                log.warning("scanner %s lost the lock of topic %s", self.token, topic)
                await self._stop_worker(topic)

    async def _retire_idle_topics(self) -> None:
        """Takes idle topics out of the registry: an unsharded one by its holder; a sharded one
        whose messages are all in one shard count, by the holder of its first shard, all its
        shards or none (_retire_shards)."""
        idle_ms = self.rt.config.topic_idle_seconds * 1000
        settings = await self.rt.topic_configs.table()
        for shard in list(self.workers):
            topic = shard.topic
            mine = settings.get(topic, DEFAULT_SETTINGS)
            shards = topic_shards(topic, (mine.shards,))
            if mine.draining_shards or shard != shards[0] or self.shards.get(topic) != shards:
                continue
            # A count being given up (a reshard this scanner has not read yet): the new one holds the messages.
            if await given_up(self.rt, [shard]) or not await self._retire_shards(topic, shards, idle_ms):
                continue
            await self.rt.redis.zrem(self.rt.ns.topics, topic)
            pipe = self.rt.redis.pipeline(transaction=False)
            for each in shards:
                pipe.hexists(self.rt.ns.topic(each).meta, Meta.REGISTERED)
            if any(await pipe.execute()):
                # A send re-registered the topic between the two steps: keep it listed.
                await self.rt.scripts.call(scripts.register_topics(self.rt.context, at=now_millis(), topics=[topic]))
                continue
            log.info("scanner %s retired idle topic %s", self.token, topic)
            self.known.discard(topic)
            self.shards.pop(topic, None)
            for each in shards:  # the other holders drop theirs once the registry no longer lists it
                if each in self.workers:
                    await self._stop_worker(each)
                    await self.rt.scripts.call(scripts.lock_release(self.rt.context, each, token=self.token))

    async def _retire_shards(self, topic: str, shards: list[Shard], idle_ms: int) -> bool:
        """Retires the topic's shards (retire_topic.lua) if every one of them is idle and empty;
        whether it did. A sharded topic's parts of its cold count cannot tell whether the log
        holds cold messages (a message may go cold in one shard and be counted out in another), so
        the log is asked, between a dry run that reads the parts and the retirement, which holds
        a shard whose part moved meanwhile (a send went cold). A shard that a send reaches after
        it was retired registers the topic again, as an unsharded topic's does."""
        if shards == [Shard(topic)]:
            replies = [await self.rt.scripts.call(scripts.retire_topic(self.rt.context, topic, idle_millis=idle_ms))]
        else:
            looks = await self.rt.scripts.run_all([scripts.retire_topic(self.rt.context, shard, idle_millis=idle_ms,
                                                                        dry_run=True, cold="*") for shard in shards])
            if not all(look.retired for look in looks):
                return False
            if self.loader is not None and await self.loader.holds_waiting(topic):
                return False
            replies = await self.rt.scripts.run_all([
                scripts.retire_topic(self.rt.context, shard, idle_millis=idle_ms, cold=f"={look.cold}")
                for shard, look in zip(shards, looks)])
        await give_back_room(self.rt, amount=sum(reply.live_share for reply in replies))
        # Some but not all: a send reached one meanwhile; the others register it again at their next.
        return all(reply.retired for reply in replies)

    async def _retire_drained_shards(self) -> None:
        """A shard count a topic gave up is forgotten once its shards hold nothing (no live
        message, packed ones included, no ended one kept for the retention, no history the log
        writer has not read) SHARDS_SETTLE_MILLIS after the change, by the scanner holding the
        topic's first shard. Its cold messages are the current count's to load: its shards' parts
        of the topic's count of them go to the current count's shards before the log forgets the
        count, so the topic reads sharded until they are there (a loader's raise that read it unsharded
        dropped the signed mark of a lone shard's count still below 0), and their monitor counters (to
        that count's first shard) and live-cap shares after. Its packed lists are its
        own, not the current count's to load (its loader starts after them): a draining shard moves
        them into its waiting set (unpack_due.lua), and the count waits for that too."""
        settings = await self.rt.topic_configs.table()
        now = now_millis()
        drained = []
        for topic in self.known:
            mine = settings.get(topic, DEFAULT_SETTINGS)
            if (mine.draining_shards and now - mine.shards_changed_at > SHARDS_SETTLE_MILLIS
                    and Shard(topic, mine.shards, 0) in self.workers):
                drained += [(topic, count, mine.shards_changed_at) for count in mine.draining_shards]
        if not drained:
            return
        pipe = self.rt.redis.pipeline(transaction=False)
        for topic, count, _ in drained:
            for shard in topic_shards(topic, (count,)):
                k = self.rt.ns.topic(shard)
                pipe.exists(k.waiting, k.ready, k.prioritised, k.inflight, k.ended, k.packed)
                pipe.xlen(k.events)  # a stream read empty stays, empty
        replies = await pipe.execute()
        held = [any(pair) for pair in zip(replies[::2], replies[1::2])]
        empty = [(topic, count, changed_at) for (topic, count, changed_at), position
                 in zip(drained, itertools.accumulate([0, *(count for _, count, _ in drained)]))
                 if not any(held[position:position + count])]
        if not empty:
            return
        try:  # PostgreSQL down: the shards are looked at again next time, and the other work goes on
            for topic, count, changed_at in empty:
                gone, current = topic_shards(topic, (count,)), topic_shards(topic, (settings[topic].shards,))
                await self._hand_over_cold(gone, current)
                if await sync_to_async(forget_drained_shards, thread_sensitive=False)(
                        namespace=self.rt.ns.namespace, topic=topic, count=count, changed_at=changed_at):
                    await self._fold_away(gone, current[0])
                    log.info("scanner %s retired the %d shards of topic %s: empty", self.token, count, topic)
            await self.rt.topic_configs.fresh()
            self._drain_outage.ok()
        except (DatabaseError, LogUnavailable) as exc:
            self._drain_outage.failed(describe(exc))
            return
        await self._refresh_shards()

    async def _mend_mirrors(self) -> None:
        """Writes again the Redis mirror of the held topics' settings where it is not theirs: a
        setTopicConfig that saved a change and could not write its mirror (answered 500) left the
        old settings in force for the scripts (pull.lua's push URL and pause). Looked at when a
        topic is taken and when its settings change; a failed look is tried again at the next turn."""
        settings = await self.rt.topic_configs.table()
        held = {shard.topic for shard in self.workers}
        self._mirrored = {topic: mine for topic, mine in self._mirrored.items() if topic in held}
        changed = {topic: mine for topic in held
                   if (mine := settings.get(topic, DEFAULT_SETTINGS)) != self._mirrored.get(topic)}
        if not changed:
            return
        try:
            for topic in await mend_mirrors(self.rt, changed):
                log.warning("scanner %s wrote the settings' mirror of topic %s again: Redis held others", self.token,
                            topic)
            self._mend_outage.ok()
        except (RedisError, LogUnavailable) as exc:
            self._mend_outage.failed(describe(exc))
            return
        self._mirrored.update(changed)

    async def _hand_over_cold(self, shards: list[Shard], to: list[Shard]) -> None:
        """Moves the shards' parts of their topic's count of cold messages (and of its hours) to the
        shards `to` (the current count's), each part dealt over them (deal_hours) from a shard of its
        own. Each part is taken into its shard's meta (hand_cold.lua), received by `to` once under its
        id (receive_cold.lua), then dropped (handed_cold.lua), and `to` forgets the id: a scanner killed
        between any two steps leaves the part for the next turn to finish, as the count still drains
        (a part taken and not yet added is in no reader's sum). A part that moved in a shard since its
        take (a send went cold in it) is taken next, until none is left."""
        ctx = self.rt.context
        while True:
            taken = await self.rt.scripts.run_all([scripts.hand_cold(ctx, shard, part_id=secrets.token_hex(8))
                                                   for shard in shards])
            handing = [(shard, part) for shard, part in zip(shards, taken) if part is not None]
            if not handing:
                return
            shares = []
            for shard, part in handing:
                # An unsigned part's count and hours, each kept at 0 or more, may differ: both are kept.
                unhoured, first = part.cold - sum(n for _hour, n in part.hours), shard.index % len(to)
                for index, (receiver, dealt) in enumerate(zip(to, deal_hours(dict(part.hours), len(to), first))):
                    cold = sum(dealt.values()) + (unhoured if index == first else 0)
                    if cold or dealt:  # nothing to add: no count made (a topic with one is not retired)
                        shares.append((receiver, part.id, cold, dealt))
            await self.rt.scripts.run_all([scripts.receive_cold(ctx, receiver, part_id=part_id, cold=cold,
                                                                hours=list(dealt.items()))
                                           for receiver, part_id, cold, dealt in shares])
            await self.rt.scripts.run_all([scripts.handed_cold(ctx, shard, part_id=part.id) for shard, part in handing])
            pipe = self.rt.redis.pipeline(transaction=False)
            for receiver, part_id, _cold, _dealt in shares:
                pipe.hdel(self.rt.ns.topic(receiver).meta, f"{Meta.HANDED}:{part_id}")
            await pipe.execute()

    async def _fold_away(self, shards: list[Shard], to: Shard) -> None:
        """A retired count's shards give up their monitor counters, which are added into `to`'s,
        so the topic's figures keep them (a scanner killed in between loses those counters), and
        their shares of a namespace live cap, which go back to its pool."""
        for shard in shards:  # what their last promotions counted, not yet written
            if pending := self._stats_to_fold.pop(shard, None):
                self.gather_stats(to, pending)
        taken = await self.rt.scripts.run_all([scripts.take_stats(self.rt.context, shard) for shard in shards])
        if fields := stats.added(taken):
            await self.rt.scripts.call(scripts.fold_stats(self.rt.context, to, fields=list(fields.items())))
        released = await self.rt.scripts.run_all([scripts.release_live_share(self.rt.context, shard)
                                                  for shard in shards])
        await give_back_room(self.rt, amount=sum(released))

    async def _report_lag(self) -> None:
        """How late this process' event loop wakes timers, which is how late it can promote a
        due message: the worst sleep overrun of each report period, into the scanners hash."""
        loop = asyncio.get_running_loop()
        worst, report_at = 0.0, loop.time() + LAG_REPORT
        while True:
            started = loop.time()
            await asyncio.sleep(LAG_SAMPLE)
            worst = max(worst, loop.time() - started - LAG_SAMPLE)
            if loop.time() >= report_at:
                try:
                    # Stamped on Redis' clock, by which /metrics judges the report's age: not this host's.
                    await self.rt.redis.hset(self.rt.ns.scanners, self.token,
                                             f"{worst * 1000:.3f}:{await redis_millis(self.rt)}")
                except Exception as exc:
                    log.warning("scanner %s could not report its loop lag: %s", self.token, exc)
                worst, report_at = 0.0, loop.time() + LAG_REPORT

    async def _forget_gone_scanners(self) -> None:
        now = await redis_millis(self.rt)
        reports = await self.rt.redis.hgetall(self.rt.ns.scanners)
        gone = [token for token, value in reports.items()
                if now - int(value.partition(":")[2] or 0) > GONE_AFTER_MILLIS]
        if gone:
            await self.rt.redis.hdel(self.rt.ns.scanners, *gone)

    async def _prune_stats(self) -> None:
        await self._forget_gone_scanners()
        await self.rt.scripts.run_in_trips([scripts.prune_stats(self.rt.context, t) for t in self.workers],
                                           STATS_CALLS_PER_TRIP)

    def gather_stats(self, topic: Shard, fields: dict[str, int]) -> None:
        """What a promotion call counted, for the next _fold_stats."""
        stats.add_into(self._stats_to_fold.setdefault(topic, {}), fields)

    async def _fold_stats(self) -> None:
        """Adds what the promotions counted into the stats hashes; kept for the next try if Redis
        fails (a call that failed after it ran counts twice: figures, not messages)."""
        gathered, self._stats_to_fold = self._stats_to_fold, {}
        calls = [scripts.fold_stats(self.rt.context, topic, fields=list(fields.items()))
                 for topic, fields in gathered.items()]
        results = await self.rt.scripts.run_in_trips(calls, STATS_CALLS_PER_TRIP)
        failed = [(topic, result) for topic, result in zip(gathered, results) if isinstance(result, Exception)]
        for topic, _ in failed:
            self.gather_stats(topic, gathered[topic])
        if failed:
            raise failed[0][1]

    async def _listen(self) -> None:
        def subscribed(rescan: bool) -> None:
            if rescan:
                for worker in self.workers.values():  # wakes may have been missed
                    worker.wake()
            self._subscribed.set()

        await subscribe_forever(
            self.rt.config.redis_url, self.rt.config.redis_timeout, what=f"scanner {self.token}",
            channels=(self.rt.ns.schedule_channel,), patterns=(self.rt.ns.schedule_shards,),
            on_message=self._received, on_subscribed=subscribed, on_lost=self._subscribed.set)

    def _received(self, message: dict) -> None:
        topic = message["data"]
        if topic not in self.known:
            self.known.add(topic)  # _acquire finds its shards
            self._poke.set()
        # A shard's scripts name it in their channel: a wake of one shard runs that shard's scripts alone.
        woken = self.rt.ns.shard_of_wake(message["channel"], topic)
        for shard in self.shards.get(topic, ()) if woken is None else (woken,):
            if (worker := self.workers.get(shard)) is not None:
                worker.wake()

    async def _shutdown(self) -> None:
        try:
            await self.rt.redis.hdel(self.rt.ns.scanners, self.token)
        except Exception as exc:
            log.warning("scanner %s could not withdraw its lag report: %s", self.token, exc)
        try:  # gone at once, so standbys take the topics released below without waiting
            await self.rt.redis.delete(self.rt.ns.scanner_alive(self.token))
        except Exception as exc:
            log.warning("scanner %s could not withdraw its heartbeat: %s", self.token, exc)
        topics = list(self.workers)
        for worker in self.workers.values():
            await worker.stop()
        self.workers.clear()
        self.timer.close()
        try:
            await self._fold_stats()
        except Exception as exc:
            log.warning("scanner %s could not write what its last promotions counted: %s", self.token, exc)
        if topics:
            try:
                await self.rt.scripts.run(
                    [scripts.lock_release(self.rt.context, t, token=self.token) for t in topics]
                )
            except Exception as exc:
                log.warning("scanner %s could not release its locks: %s", self.token, exc)
