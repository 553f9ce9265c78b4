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
   the same life (a send that went hot after the raise, a delete's tombstone), is left alone.
4. once nothing is left beyond hot_until, drops the topic's count of cold messages (which the
   scripts moving them keep: getTopicInfo shows it) unless it moved since (clear_cold.lua): a
   topic with cold messages is not retired.

A cold message is loaded most of a window ahead of its time, so it fires as precisely as one
sent hot. Switched off (window 0), the loader loads what is left cold of topics that have a
hot_until, then removes it.

A sharded topic's messages are all hot, in their shards (live/shards.py): only a topic's own
keys have a window, and the loader works them while the topic's shard counts include 1. Its
waiting rows then include the sharded ones, which the loader leaves out when a shard holds
them; one whose shard does not (yet) is left for a later look while it is younger than
IN_FLIGHT_MILLIS, as its send may be on its way to the shard (the log is written first).
"""
import asyncio
import logging

import orjson

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import MAX_DELAY_MILLIS
from delayqueue.core.messages import stored_json
from delayqueue.core.outage import Outage
from delayqueue.core.stopping import repeat
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, parse_position, position
from delayqueue.live.shards import message_shards
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection

log = logging.getLogger(__name__)

PAGE = 1000  # rows per log read and per load_cold call
RAISE_EVERY = 0.1  # of the window: how far hot_until may fall behind now + window before it is raised
MAX_TICK = 1.0  # seconds between looks at the held topics, at most
ERROR_BACKOFF = 1.0
MIN_LEAD_MILLIS = 60_000  # how far ahead a topic's window reaches however little room it has in Redis
# A send's log row is committed a moment (a round trip or two) before its script runs; this
# long covers that and the web processes' clocks being apart.
IN_FLIGHT_MILLIS = 5_000


def loaded_messages(topic: str, rows: list[tuple]) -> list[tuple]:
    """COLD_PAGE's rows as load_cold.lua takes them: msgId, the stored message, triggerTime,
    expireTime, priority."""
    name = orjson.dumps(topic)
    return [(msg_id, stored_json(name, msg_id, payload, produced, trigger, expire, max_retry, retry, status, priority),
             trigger, expire, priority)
            for _id, msg_id, payload, produced, trigger, expire, max_retry, retry, status, priority in rows]


class Loader:
    def __init__(self, rt, topics):
        """`topics` returns the topics this loader works (its scanner's)."""
        self.rt = rt
        self.topics = topics
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

        await repeat(step, stopping, outage=Outage(log, "loader: cold messages wait in the message log"),
                     after_failure=self._db.close, retry_seconds=ERROR_BACKOFF)
        await self.close()

    async def load_once(self) -> int:
        """Raises and loads every held topic whose hot_until is due a raise; returns messages loaded."""
        held = set(self.topics())
        for gone in self._raised_at.keys() - held:
            del self._raised_at[gone]
        loaded = 0
        for topic in held:
            loaded += await self.load_topic(topic)
        return loaded

    async def load_topic(self, topic: str, *, force: bool = False) -> int:
        """Steps 1-4 for one topic (step 1 only once a tenth of the window has passed since the
        last raise, unless `force`); returns messages loaded."""
        now = now_millis()
        target = now + (self.window or MAX_DELAY_MILLIS)
        raised = self._raised_at.get(topic)
        if not force and self.window and raised is not None and raised - now > self.window * (1 - RAISE_EVERY):
            return 0
        if self.window:
            target = await self._within_room(topic, now, target)
        hot = await self.rt.scripts.call(scripts.raise_hot(self.rt.context, topic, hot_until=target,
                                                           loaded_to=position(target), start=self.window > 0))
        if hot is None:
            self._raised_at[topic] = target
            return 0
        loaded, complete = await self._load_pages(topic, hot)
        self.loaded += loaded
        self._raised_at[topic] = hot.hot_until
        if complete and (hot.cold is not None or not self.window):
            # The scripts that loaded counted down a count that was there; none was counted if not.
            await self._forget_cold(topic, hot.hot_until, 0 if hot.cold is None else hot.cold - loaded)
        return loaded

    async def _within_room(self, topic: str, now: int, target: int) -> int:
        """The hot_until to raise to: `target`, or, when loading up to it would bring the topic's
        waiting messages in Redis past DELAYQUEUE_HOT_MAX_MESSAGES, just before the first row that
        has no room; never less than MIN_LEAD_MILLIS (or the window, if shorter) ahead of now, so
        nothing fires late for want of room. A topic the loader never worked holds all its
        messages in Redis already: nothing to bring in, nothing to hold back."""
        k = self.rt.ns.topic(topic)
        held, loaded_to = await asyncio.gather(self.rt.redis.zcard(k.waiting), self.rt.redis.hget(k.meta, Meta.LOADED_TO))
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

    async def _load_pages(self, topic: str, hot: scripts.HotWindow) -> tuple[int, bool]:
        """Steps 2 and 3: pages from loaded_to up to hot_until; (messages loaded, whether it got
        there). The next page is read while Redis loads this one (the read needs only this page's
        last row)."""
        loaded, loaded_to, done = 0, hot.loaded_to, position(hot.hot_until)
        if loaded_to == done:
            return 0, True
        others = (await self.rt.topic_configs.settings(topic)).shard_counts
        others = tuple(count for count in others if count != 1)
        reading = asyncio.ensure_future(self._page(topic, *parse_position(loaded_to), hot.hot_until))
        try:
            while loaded_to != done:
                rows = await reading
                if len(rows) == PAGE:
                    last_id, _msg_id, _payload, _produced, last_trigger, *_ = rows[-1]
                    end = position(last_trigger, last_id)
                    reading = asyncio.ensure_future(self._page(topic, last_trigger, last_id, hot.hot_until))
                else:
                    end = done
                young = None
                if others:
                    rows, young = await self._own_rows(topic, rows, others)
                    if young is not None:  # loaded up to the row before it; looked at again next time
                        end = young or loaded_to
                reply = await self.rt.scripts.call(scripts.load_cold(self.rt.context, topic, loaded_from=loaded_to,
                                                                     loaded_to=end, messages=loaded_messages(topic, rows)))
                if reply.loaded < 0:
                    return loaded, False  # another loader moved on: it holds the topic now
                loaded += reply.loaded
                loaded_to = end
                if young is not None:
                    return loaded, False
        finally:
            if not reading.done():
                await asyncio.gather(reading, return_exceptions=True)  # the connection is free again
        return loaded, True

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

    async def _page(self, topic: str, after_time: int, after_id: int, hot_until: int) -> list:
        params = {"namespace": self.rt.ns.namespace, "topic": topic, "after_time": after_time, "after_id": after_id,
                  "hot_until": hot_until, "limit": PAGE}
        return await self._read(sql.COLD_PAGE, params)

    async def _read(self, statement: str, params: dict) -> list:
        async with self._db.use() as conn, conn.transaction():
            await conn.execute(sql.IN_INDEX_ORDER)
            return await (await conn.execute(statement, params)).fetchall()

    async def _forget_cold(self, topic: str, hot_until: int, cold: int) -> None:
        """Step 4: nothing of the topic left in the log beyond hot_until, no cold message counted
        (`cold`: the count as this loader left it)."""
        params = {"namespace": self.rt.ns.namespace, "topic": topic, "hot_until": hot_until}
        [(left,)] = await self._read(sql.COLD_LEFT, params)
        if not left:
            await self.rt.scripts.call(scripts.clear_cold(self.rt.context, topic, cold=cold,
                                                          forget_window=not self.window))

    async def close(self) -> None:
        await self._db.close()

