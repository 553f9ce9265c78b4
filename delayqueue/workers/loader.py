"""The cold tier's loader, run inside `manage.py run_scanners` for the topics its scanner holds.

With DELAYQUEUE_HOT_WINDOW_MILLIS set, Redis holds only the waiting messages due within the
window; a send due later is written to the message log only (send.lua compares its trigger
time with the topic's hot_until). For each held topic the loader, every tenth of the window:

1. raises hot_until to now + window (raise_hot.lua; never lowers it), or less far when loading
   that far would bring the topic's waiting messages in Redis past DELAYQUEUE_HOT_MAX_MESSAGES
   (though never less than a minute ahead: the window shrinks, nothing fires late). From then
   on a send due by then goes to Redis. Every send left in the log only was committed before
   its script ran, so before this raise, and the reads below see it.
2. reads the topic's waiting rows due after loaded_to and by hot_until from the log, a page at a
   time in (triggerTime, row id) order (sql.COLD_PAGE, on the message_waiting index).
3. loads each page with load_cold.lua, which moves loaded_to to the page's end in the same step
   and only if it still stands where the page was read from: a loader killed between any two
   steps resumes at loaded_to, so no page is skipped or loaded twice, and a second loader (a
   scanner taking the topic over) loads nothing the first did. A msgId Redis holds live, or in
   the same life (a send that went hot after the raise, a delete's tombstone), is left alone. A
   row younger than IN_FLIGHT_MILLIS is counted out of the cold ones only if its send counted it
   in (cold_sent): its script may run after the load, find it held and count nothing.
4. once nothing is left beyond hot_until, drops the topic's count of cold messages (which the
   scripts moving them keep: getTopicInfo shows it) unless it moved since (cold_part.lua), keeping
   only what moves after that look (forget_cold.lua): a topic with cold messages is not retired.

Its position in steps 2 and 3 is the topic's fetched_to where it has one: a message due more
than twice DELAYQUEUE_PACK_LEAD_MILLIS ahead is packed (lua/includes/packed.lua), and loaded_to
follows as the scanner moves the packed lists in (docs/architecture.md, "Packed lists").

A cold message is loaded most of a window ahead of its time, so it fires as precisely as one
sent hot. Switched off (window 0), the loader loads what is left cold of topics that have a
hot_until, then removes it.

A sharded topic (live/shards.py) is loaded as one: every shard of each of its shard counts has
its own hot_until, all raised together, and the rows are read once, up to the least of them, and
loaded each into its shard of the current count, whose loaded_to moves page by page (a shard
ahead of the others after a kill takes only the rows after its own). While the topic drains
other counts, a row one of their shards holds is left out, and one no shard holds is left for a
later look while it is younger than IN_FLIGHT_MILLIS, as its send may be on its way (the log is
written first). After a reshard, loading waits SHARDS_SETTLE_MILLIS, until every process sends
to the new count: else a message could go cold under one count and be loaded under another,
twice. A message may thus go cold in one shard and come in through another, so a sharded
topic's shards each keep a signed part of its count of cold messages (raise_hot.lua).
"""
import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Mapping

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import IN_FLIGHT_MILLIS, MAX_DELAY_MILLIS, SHARDS_SETTLE_MILLIS
from delayqueue.core.messages import stored
from delayqueue.core.outage import Outage
from delayqueue.core.stopping import repeat
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard, least_position, parse_position, position
from delayqueue.live.shards import message_shards, shard_of, topic_shards
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.stores.topic_settings import DEFAULT, TopicSettings

log = logging.getLogger(__name__)

PAGE = 1000  # rows per log read and per load_cold call
RAISE_EVERY = 0.1  # of the window: how far hot_until may fall behind now + window before it is raised
MAX_TICK = 1.0  # seconds between looks at the held topics, at most
ERROR_BACKOFF = 1.0
MIN_LEAD_MILLIS = 60_000  # how far ahead a topic's window reaches however little room it has in Redis


def loaded_messages(topic: str, rows: list[tuple]) -> list[tuple]:
    """COLD_PAGE's rows as load_cold.lua takes them: msgId, the stored message, triggerTime,
    expireTime, priority, produceTime."""
    return [(msg_id, stored(topic, msg_id, payload, produced, trigger, expire, max_retry, retry, status, priority),
             trigger, expire, priority, produced)
            for _id, msg_id, payload, produced, trigger, expire, max_retry, retry, status, priority in rows]


def loading_topics(held: Iterable[Shard], settings: Mapping[str, TopicSettings], now: int) -> list[str]:
    """The topics a scanner holding the shards `held` loads: those whose current count's first
    shard it holds, SHARDS_SETTLE_MILLIS after the topic's last reshard."""
    return [shard.topic for shard in held
            if shard.index == 0 and shard.count == (mine := settings.get(shard.topic, DEFAULT)).shards
            and now - mine.shards_changed_at > SHARDS_SETTLE_MILLIS]


class Loader:
    def __init__(self, rt, held):
        """`held` returns the shards this loader's scanner holds (loading_topics picks the topics)."""
        self.rt = rt
        self.held = held
        self.loaded = 0
        self._db = LogConnection(rt.config.log_timeout_millis, rt.log_database)
        self._raised_at: dict[str, int] = {}  # topic -> the hot_until this loader last raised it to

    @property
    def window(self) -> int:
        return self.rt.config.hot_window_millis

    def _tick(self) -> float:
        return min(MAX_TICK, self.window * RAISE_EVERY / 1000) if self.window else MAX_TICK

    async def run(self, stopping: asyncio.Event) -> None:
        async def step() -> float:
            await self.load_once()
            return self._tick()

        # Named by its namespace: a scanner loads every served namespace's, each from its own database.
        outage = Outage(log, f"loader of namespace {self.rt.ns.namespace}: cold messages wait in the message log")
        await repeat(step, stopping, outage=outage,
                     after_failure=self._db.close, retry_seconds=ERROR_BACKOFF)
        await self.close()

    async def load_once(self) -> int:
        """Raises and loads every topic it loads whose hot_until is due a raise; returns messages loaded."""
        loading = set(loading_topics(self.held(), await self.rt.topic_configs.table(), now_millis()))
        for gone in self._raised_at.keys() - loading:
            del self._raised_at[gone]
        loaded = 0
        for topic in loading:
            loaded += await self.load_topic(topic)
        return loaded

    async def load_topic(self, topic: str, *, force: bool = False) -> int:
        """Steps 1-4 for one topic (step 1 only once a tenth of the window has passed since the
        last raise, unless `force`); returns messages brought into Redis (packed ones too)."""
        now = now_millis()
        target = now + (self.window or MAX_DELAY_MILLIS)
        raised = self._raised_at.get(topic)
        if not force and self.window and raised is not None and raised - now > self.window * (1 - RAISE_EVERY):
            return 0
        settings = await self.rt.topic_configs.settings(topic)
        current, every = topic_shards(topic, (settings.shards,)), topic_shards(topic, settings.shard_counts)
        held, lists, positions = await self._look(current, every)
        # A shard without a window starts where its count's others stand, else where the topic's
        # other counts stood (what is after that may be cold), else loaded: every message so far
        # went to Redis.
        begin = least_position(positions[shard] for shard in current) or least_position(positions.values())
        if self.window:
            target = await self._within_room(topic, now, target, held, begin)
        # A topic that holds every message in Redis may pack the sends due after now and by target.
        pack_lead = self.rt.context.pack_lead_millis
        if begin or not pack_lead:
            fresh = {"loaded_to": begin or position(target)}
        else:
            fresh = {"loaded_to": position(now), "fetched_to": position(target)}
        windows = await self._run([
            scripts.raise_hot(self.rt.context, shard, hot_until=target, start=self.window > 0, signed=settings.sharded,
                              **fresh) for shard in every])
        hot = {shard: window for shard, window in zip(every, windows) if window is not None}
        if not hot:
            self._raised_at[topic] = target
            return 0
        hot_until = min(window.hot_until for window in hot.values())  # no shard sends cold what is read
        loaded, counted_out, packed, complete = await self._load_pages(topic, current, settings.draining_shards, hot,
                                                                       hot_until, pack_lead)
        self.loaded += loaded + packed
        self._raised_at[topic] = hot_until
        # Packed messages stay counted cold until the scanner moves them in, maybe in another shard
        # than the one that counted them: the count stays while any is packed.
        if complete and not (lists or packed) and (any(window.cold is not None for window in hot.values())
                                                   or not self.window):
            # The scripts that loaded counted down a count that was there; none was counted if not.
            await self._forget_cold(topic, {shard: 0 if window.cold is None else window.cold - counted_out[shard]
                                            for shard, window in hot.items()}, hot_until)
        return loaded + packed

    async def _look(self, current: list[Shard], every: list[Shard]) -> tuple[int, int, dict[Shard, str | None]]:
        """In one round trip: the waiting messages the current count's shards hold (in their
        waiting sets and packed lists), those of them packed, and every shard's position (its
        fetched_to, else its loaded_to; None for none)."""
        pipe = self.rt.redis.pipeline(transaction=False)
        for shard in current:
            pipe.zcard(self.rt.ns.topic(shard).waiting)
            pipe.hget(self.rt.ns.topic(shard).meta, Meta.PACKED)
        for shard in every:
            pipe.hmget(self.rt.ns.topic(shard).meta, [Meta.FETCHED_TO, Meta.LOADED_TO])
        replies = await pipe.execute()
        lists = sum(int(count or 0) for count in replies[1:2 * len(current):2])
        held = sum(int(count or 0) for count in replies[:2 * len(current):2]) + lists
        return held, lists, {shard: fetched or loaded
                             for shard, (fetched, loaded) in zip(every, replies[2 * len(current):])}

    async def _within_room(self, topic: str, now: int, target: int, held: int, loaded_to: str | None) -> int:
        """The hot_until to raise to: `target`, or, when loading up to it would bring the topic's
        waiting messages in Redis (`held` now) past DELAYQUEUE_HOT_MAX_MESSAGES, just before the
        first row that has no room; never less than MIN_LEAD_MILLIS (or the window, if shorter)
        ahead of now, so nothing fires late for want of room. A topic the loader never worked
        (no `loaded_to`) holds all its messages in Redis already: nothing to bring in, nothing to
        hold back."""
        if loaded_to is None:
            return target
        lead = now + min(MIN_LEAD_MILLIS, self.window)
        room = self.rt.config.hot_max_messages - held
        if room <= 0:
            return lead
        after_time, after_id = parse_position(loaded_to)
        params = {"namespace": self.rt.ns.namespace, "topic": topic, "after_time": after_time, "after_id": after_id,
                  "hot_until": target, "skip": room}
        first_without_room = await self._read(sql.COLD_BEYOND_ROOM, params)
        if not first_without_room:
            return target
        return max(first_without_room[0][0] - 1, lead)

    async def _load_pages(self, topic: str, current: list[Shard], others: tuple[int, ...],
                          hot: dict[Shard, scripts.HotWindow], hot_until: int,
                          pack_lead: int) -> tuple[int, Counter[Shard], int, bool]:
        """Steps 2 and 3: pages up to hot_until, from the least position of the current count's
        shards; (messages loaded into waiting sets, of them those counted out of each shard's cold
        count, messages packed, whether all got there). The next page is read while Redis loads
        this one (the read needs only this page's last row)."""
        loaded, counted_out, packed = 0, Counter(), 0
        at = {shard: hot[shard].loaded_to if shard in hot else None for shard in current}  # None: loads all
        done = position(hot_until)
        if all(loaded_to == done for loaded_to in at.values()):
            return loaded, counted_out, packed, True
        read_from = least_position(at.values()) or least_position(window.loaded_to for window in hot.values())
        reading = asyncio.ensure_future(self._page(topic, *parse_position(read_from), hot_until))
        try:
            while True:
                rows = await reading
                if len(rows) == PAGE:
                    last_id, _msg_id, _payload, _produced, last_trigger, *_ = rows[-1]
                    end = position(last_trigger, last_id)
                    reading = asyncio.ensure_future(self._page(topic, last_trigger, last_id, hot_until))
                else:
                    end = done
                young = None
                if others:
                    rows, young = await self._own_rows(topic, rows, others)
                    if young is not None:  # loaded up to the row before it; looked at again next time
                        end = young or read_from
                calls = self._loads(topic, current, at, rows, end, pack_lead)
                replies = await self._run([call for _shard, call in calls])
                if any(reply.loaded < 0 for reply in replies):
                    return loaded, counted_out, packed, False  # another loader moved on: it holds the topic now
                for (shard, _call), reply in zip(calls, replies):
                    loaded += reply.loaded
                    counted_out[shard] += reply.counted_out
                    packed += reply.packed
                    at[shard] = end
                if young is not None or end == done:
                    return loaded, counted_out, packed, young is None
                read_from = end
        finally:
            if not reading.done():
                await asyncio.gather(reading, return_exceptions=True)  # the connection is free again

    def _loads(self, topic: str, current: list[Shard], at: dict[Shard, str | None], rows: list,
               end: str, pack_lead: int) -> list[tuple[Shard, scripts.ScriptCall]]:
        """load_cold's calls for a page's rows, read up to `end`: one for each current shard not
        past `end` yet, with its rows after its own position."""
        ends, mine = parse_position(end), {}
        for row in rows:
            mine.setdefault(shard_of(topic, row[1], len(current)), []).append(row)
        calls = []
        for shard in current:
            after = None if at[shard] is None else parse_position(at[shard])
            if after is not None and after >= ends:
                continue
            page = [row for row in mine.get(shard, ()) if after is None or (row[4], row[0]) > after]
            calls.append((shard, scripts.load_cold(self.rt.context, shard, loaded_from=at[shard] or "", loaded_to=end,
                                                   pack_lead=pack_lead, messages=loaded_messages(topic, page),
                                                   in_flight_millis=IN_FLIGHT_MILLIS)))
        return calls

    async def _own_rows(self, topic: str, rows: list, others: tuple[int, ...]) -> tuple[list, str | None]:
        """The page's rows a shard of the topic's other shard counts does not hold, up to the first
        one younger than IN_FLIGHT_MILLIS that none holds; and when there is one, the position
        just before it ("" at the page's start), else None."""
        pipe = self.rt.redis.pipeline(transaction=False)
        for _id, msg_id, *_ in rows:
            for shard in message_shards(topic, msg_id, others):
                pipe.hexists(self.rt.ns.topic(shard).msgs, msg_id)
        held = iter(await pipe.execute())
        young_after = now_millis() - IN_FLIGHT_MILLIS
        own, before = [], ""
        for row in rows:
            row_id, _msg_id, _payload, produced, trigger, *_ = row
            if not any([next(held) for _ in others]):
                if produced > young_after:
                    return own, before
                own.append(row)
            before = position(trigger, row_id)
        return own, None

    async def _run(self, calls: list[scripts.ScriptCall]) -> list:
        """The calls' replies; raises the first error. One call alone (an unsharded topic's) shares
        its round trip with the process' other calls."""
        if len(calls) == 1:
            return [await self.rt.scripts.call(calls[0])]
        return await self.rt.scripts.run_all(calls)

    async def _page(self, topic: str, after_time: int, after_id: int, hot_until: int) -> list:
        params = {"namespace": self.rt.ns.namespace, "topic": topic, "after_time": after_time, "after_id": after_id,
                  "hot_until": hot_until, "limit": PAGE}
        return await self._read(sql.COLD_PAGE, params)

    async def _read(self, statement: str, params: dict) -> list:
        async with self._db.use() as conn, conn.transaction():
            await conn.execute(sql.IN_INDEX_ORDER)
            return await (await conn.execute(statement, params)).fetchall()

    async def holds_waiting(self, topic: str) -> bool:
        """Whether the log has a waiting row of the topic: cold, or one whose end the log writer
        has not yet written."""
        [(held,)] = await self._read(sql.HOLDS_WAITING, {"namespace": self.rt.ns.namespace, "topic": topic})
        return held

    async def holds_live_messages(self) -> bool:
        """Whether the log holds a waiting, ready or in-flight message of this namespace (the
        scanner's check for a Redis that lost its data asks it)."""
        async with self._db.use() as conn:
            cursor = await conn.execute(sql.HOLDS_LIVE, [self.rt.ns.namespace])
            return (await cursor.fetchone())[0]

    async def _forget_cold(self, topic: str, counts: dict[Shard, int], hot_until: int) -> None:
        """Step 4: nothing of the topic left in the log beyond hot_until, no cold message counted
        (`counts`: each shard's count as this loader left it). Every part is looked at before any is
        taken away, and only what the look found is: a sharded topic's parts add up only together,
        and one kept for a send gone cold meanwhile while the others went counted its whole part."""
        params = {"namespace": self.rt.ns.namespace, "topic": topic, "hot_until": hot_until}
        [(left,)] = await self._read(sql.COLD_LEFT, params)
        if left:
            return
        found = await self._run([scripts.cold_part(self.rt.context, shard, cold=cold)
                                 for shard, cold in counts.items()])
        if None in found:
            return  # moved since this loader left it, or packed: looked at again next time
        await self._run([scripts.forget_cold(self.rt.context, shard, cold=part.cold, hours=part.hours,
                                             forget_window=not self.window)
                         for shard, part in zip(counts, found)])

    async def close(self) -> None:
        await self._db.close()
