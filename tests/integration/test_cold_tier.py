"""The cold tier: messages due beyond DELAYQUEUE_HOT_WINDOW_MILLIS wait in the message log only,
and the loader (workers/loader.py) brings them into Redis ahead of their time. On a single Redis
and on the Redis Cluster."""
import asyncio
import json
import time
from collections import Counter

import pytest

from delayqueue.api import wire
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import COLD_HOUR_MILLIS, IN_FLIGHT_MILLIS, MAX_DELAY_MILLIS, Status
from delayqueue.core.exceptions import Conflict, NotFound, Throttled
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard, position
from delayqueue.messagelog.sql import to_millis
from delayqueue.ops import figures
from delayqueue.core.messages import Message
from delayqueue.services.consume import ack_messages, nack_message, pull_messages, touch_message
from delayqueue.services import messages as messages_module
from delayqueue.services.messages import delete_message, get_message, redis_millis, reschedule_message
from delayqueue.services.restore import restore, restore_rows
from delayqueue.services.send import SendRequest, prepared, send_message, send_messages
from delayqueue.services import topics as topics_module
from delayqueue.services.topics import purge_topic, topic_info
from delayqueue.workers import loader as loader_module
from delayqueue.workers.loader import Loader
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, call, drain_log, history, load_killed, logged,
                           make_runtime, query, redis_readings, stamps, unsharded_calls, wait_until)
from tests.integration.test_limits import refused, set_limits_now
from tests.integration.test_limits import send as limits_send
from tests.integration.test_monitoring import sample as metric
from tests.integration.test_monitoring import scrape

WINDOW = 1000


@pytest.fixture(params=["single", "cluster"])
async def cold_rt(request, clean_state):
    """A runtime with a 1 s hot window, which packs nothing (test_packed.py packs)."""
    url = REDIS_URL if request.param == "single" else REDIS_CLUSTER_URL
    runtime = make_runtime(url, hot_window_millis=WINDOW, pack_lead_millis=0)
    yield runtime
    await runtime.close()


async def send(rt, topic="t", msg="m", delay=0, **kw):
    return await send_message(rt, request=SendRequest(topic=topic, msg=msg, delay_millis=delay, **kw))


async def in_redis(rt, msg_id, topic="t") -> dict:
    k = rt.ns.topic(topic)
    return {"body": await rt.redis.hexists(k.msgs, msg_id), "waiting": await rt.redis.zscore(k.waiting, msg_id),
            "expiry": await rt.redis.zscore(k.expiry, msg_id)}


async def cold_hours(rt, topic="t") -> Counter:
    """The topic's cold messages per hour they fall due in, as Redis counts them."""
    return Counter({int(hour): int(n) for hour, n in (await rt.redis.hgetall(rt.ns.topic(topic).cold_hours)).items()})


def hours_of(*messages) -> Counter:
    return Counter(m.trigger_time // COLD_HOUR_MILLIS for m in messages)


async def started(rt, topic="t") -> Loader:
    """A loader that has raised the topic's window once: from now on sends compare with it."""
    loader = Loader(rt, lambda: [Shard(topic)])
    await loader.load_topic(topic, force=True)
    return loader


async def test_a_send_due_beyond_the_window_waits_in_the_log_only(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    await raise_window_to(rt, "t", now_millis() + 30_000)  # a window a slow step cannot pass
    try:
        far = await send(rt, msg="far", delay=60_000)
        near = await send(rt, msg="near", delay=10_000)
        now = await send(rt, msg="now", delay=0)
        assert far.status == Status.WAITING and far.trigger_time == far.produce_time + 60_000
        assert await in_redis(rt, far.msg_id) == {"body": False, "waiting": None, "expiry": None}
        assert (await logged("t", far.msg_id))["status"] == Status.WAITING
        assert await history("t", far.msg_id) == [("sent", 0, Status.WAITING, 0)]
        assert await get_message(rt, topic="t", msg_id=far.msg_id) == far  # answered from the log
        assert (await in_redis(rt, near.msg_id))["waiting"] == near.trigger_time
        assert (await in_redis(rt, now.msg_id))["body"]
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (2, 1)  # far (cold) and near (hot)
        assert wire.topic_info(info)["hotWaitingSize"] == 1 and wire.topic_info(info)["coldWaitingSize"] == 1
    finally:
        await loader.close()


async def test_a_resend_of_a_cold_msg_id_answers_the_cold_message_and_changes_nothing(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    try:
        first = await send(rt, msg="first", delay=60_000, msg_id="order-1")
        again = await send(rt, msg="second", delay=0, msg_id="order-1")
        assert again == first
        assert await in_redis(rt, "order-1") == {"body": False, "waiting": None, "expiry": None}
        assert (await logged("t", "order-1"))["msg"] == "first"
    finally:
        await loader.close()


async def test_a_batch_naming_a_cold_msg_id_twice_sends_it_once_and_answers_the_first(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    try:
        first, again = await send_messages(rt, requests=[SendRequest("t", "first", 60_000, "twice"),
                                                         SendRequest("t", "second", 60_000, "twice")])
        assert again == first and first.payload == "first"
        assert (await logged("t", "twice"))["msg"] == "first"
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (1, 1)
    finally:
        await loader.close()


async def test_the_loader_brings_a_cold_message_in_ahead_of_its_time_and_it_fires_not_early(cold_rt, start_scanner):
    rt = cold_rt
    await start_scanner(rt)
    await send(rt, msg="registers the topic", delay=0)
    await wait_until(lambda: _has_window(rt), timeout=10, what="the scanner's loader to raise the window")
    m = await send(rt, msg="cold", delay=4000)  # loaded some 3 s later: a slow step cannot pass it
    assert not (await in_redis(rt, m.msg_id))["body"]

    async def loaded():
        return (await in_redis(rt, m.msg_id))["waiting"] is not None

    await wait_until(loaded, timeout=10, interval=0.01, what="the loader to bring the message in")
    assert now_millis() < m.trigger_time  # ahead of its time
    await pull_messages(rt, topic="t")  # the registering message
    pulled = []

    async def fired():
        pulled.extend((await pull_messages(rt, topic="t"))[0])
        return pulled

    await wait_until(fired, timeout=10, interval=0.005, what="the cold message to fire")
    assert [p.msg_id for p in pulled] == [m.msg_id] and pulled[0].payload == "cold"
    assert now_millis() >= m.trigger_time


async def _has_window(rt) -> bool:
    return await rt.redis.hexists(rt.ns.topic("t").meta, Meta.HOT_UNTIL)


def after_first_page(monkeypatch, loader, action) -> list:
    """Runs `action()` once, between the loader's read of a page and its load of it (the race the
    loader's protocol must survive); returns the list its answer goes into."""
    answers, real_page = [], loader._page

    async def page_then_act(*args):
        rows = await real_page(*args)
        if rows and not answers:
            answers.append(await action())
        return rows

    monkeypatch.setattr(loader, "_page", page_then_act)
    return answers


async def raise_window_to(rt, topic, hot_until):
    """What the loader's step 1 does when the time comes: hot_until moves past these messages."""
    await rt.scripts.call(scripts.raise_hot(rt.context, topic, hot_until=hot_until, loaded_to=position(hot_until),
                                            start=True))


async def test_each_cold_message_is_loaded_once_in_due_order_and_a_rerun_loads_nothing(cold_rt, monkeypatch):
    rt = cold_rt
    monkeypatch.setattr(loader_module, "PAGE", 3)
    loader = await started(rt)
    try:
        bodies = ["plain", 'quoted "x" \\ back', "line\nbreak\ttab", "订单 ✓ 🚀", "\u0001 control", "", "7", "8"]
        sent = [await send(rt, msg=body, delay=60_000 + (7 - i) * 10, priority=i % 3, max_retry=i)
                for i, body in enumerate(bodies)]
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 8
        waiting = await rt.redis.zrange(rt.ns.topic("t").waiting, 0, -1, withscores=True)
        assert waiting == sorted(((m.msg_id, float(m.trigger_time)) for m in sent), key=lambda w: w[1])
        for m in sent:  # stored as a hot send stores it, byte for byte (the loader builds it: messages.stored)
            assert await rt.redis.hget(rt.ns.topic("t").msgs, m.msg_id) == m.to_stored()
        assert await loader.load_topic("t", force=True) == 0
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 8
    finally:
        await loader.close()


@pytest.mark.fault
@pytest.mark.parametrize("killed_after", ["raise", "first page"])
async def test_a_loader_killed_between_its_steps_is_resumed_with_nothing_lost_or_doubled(cold_rt, monkeypatch,
                                                                                          killed_after):
    rt = cold_rt
    monkeypatch.setattr(loader_module, "PAGE", 2)
    first = await started(rt)
    sent = [await send(rt, msg=str(i), delay=60_000 + i) for i in range(5)]
    await raise_window_to(rt, "t", now_millis() + 120_000)
    await load_killed(rt, first, killed_after)
    held = await rt.redis.zcard(rt.ns.topic("t").waiting)
    assert held == (0 if killed_after == "raise" else 2)
    second = Loader(rt, lambda: [Shard("t")])
    try:
        assert await second.load_topic("t", force=True) == 5 - held
        assert sorted(await rt.redis.zrange(rt.ns.topic("t").waiting, 0, -1)) == sorted(m.msg_id for m in sent)
    finally:
        await first.close()
        await second.close()


async def test_a_page_read_before_another_loader_moved_on_loads_nothing(cold_rt):
    """Two scanners may briefly both work a topic as it changes hands: a page is loaded only if
    loaded_to still stands where it was read from."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        hot = await rt.scripts.call(scripts.raise_hot(rt.context, "t", hot_until=now_millis() + 120_000,
                                                      loaded_to="", start=True))
        rows = await loader._page("t", *map(int, hot.loaded_to.split(":")), hot.hot_until)
        assert [row[1] for row in rows] == [m.msg_id]
        assert await loader.load_topic("t", force=True) == 1  # the other loader
        stale = await rt.scripts.call(scripts.load_cold(rt.context, "t", loaded_from=hot.loaded_to,
                                                        loaded_to=position(hot.hot_until), pack_lead=0,
                                                        in_flight_millis=0, messages=[row[1:] for row in rows]))
        assert stale.loaded == -1
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 1
    finally:
        await loader.close()


async def test_a_send_whose_script_runs_after_the_raise_goes_hot_and_the_loader_leaves_it(cold_rt):
    """The send's log row is committed before the window rises, its script runs after: it is
    hot, and the loader, which reads the row too, does not load it again."""
    rt = cold_rt
    loader = await started(rt)
    try:
        row = prepared(rt, SendRequest(topic="t", msg="x", delay_millis=60_000), now_millis(), {})
        await rt.log.record([row])
        await raise_window_to(rt, "t", now_millis() + 120_000)
        [(call, _)] = unsharded_calls(rt, [row])
        [reply] = await rt.scripts.call(call)
        assert reply.created and not reply.cold
        assert await loader.load_topic("t", force=True) == 0
        assert await rt.redis.zrange(rt.ns.topic("t").waiting, 0, -1) == [row.msg_id]
    finally:
        await loader.close()


@pytest.mark.parametrize("script_first", [False, True])
async def test_a_send_the_loader_brings_in_before_its_script_runs_is_counted_once(cold_rt, script_first):
    """The send's log row is committed before the window rises. Its script runs after the load: it
    finds the message held and counts nothing, so the load must not count it out of the cold ones
    (the count fell one short). Its script ran before the raise: it counted the message cold, and
    the load counts it out."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        far = await send(rt, msg="far", delay=600_000)  # cold: the topic counts it
        row = prepared(rt, SendRequest(topic="t", msg="x", delay_millis=60_000), now_millis(), {})
        await rt.log.record([row])
        [(call, _)] = unsharded_calls(rt, [row])
        if script_first:
            [reply] = await rt.scripts.call(call)
            assert reply.cold
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 1
        if not script_first:
            [reply] = await rt.scripts.call(call)
            assert not reply.created  # a duplicate of the message the loader brought in
        assert (await in_redis(rt, row.msg_id))["waiting"] == row.trigger_time
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (2, 1)  # far, still cold; the other in Redis
        assert await cold_hours(rt) == hours_of(far)
    finally:
        await loader.close()


async def test_a_send_that_died_before_its_script_is_not_counted_out_of_the_cold_count(cold_rt):
    """Its log row was committed, its script never ran (the process was killed in between), so
    nothing counted it cold; the loader brings it in all the same, and must not count it out: the
    count fell to one short of the messages still cold (to -1 with none). Due in another hour than
    those, it is known to be none of them."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        far = await send(rt, msg="far", delay=2 * COLD_HOUR_MILLIS)
        now = now_millis()
        died = prepared(rt, SendRequest(topic="t", msg="x", trigger_time=now + 60_000), now - 2 * IN_FLIGHT_MILLIS, {})
        await rt.log.record([died])  # its script never runs
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 1
        assert (await in_redis(rt, died.msg_id))["waiting"] == died.trigger_time
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        assert await cold_hours(rt) == hours_of(far)
        assert await delete_message(rt, topic="t", msg_id=far.msg_id)
        assert int(await rt.redis.hget(rt.ns.topic("t").meta, Meta.COLD)) == 0
        assert await cold_hours(rt) == Counter()
    finally:
        await loader.close()


async def test_a_cold_message_deleted_is_never_loaded(cold_rt, monkeypatch):
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        readings = redis_readings(monkeypatch, messages_module)
        assert await delete_message(rt, topic="t", msg_id=m.msg_id)
        assert (await logged("t", m.msg_id))["status"] == Status.DELETED
        assert [h[0] for h in await history("t", m.msg_id)] == ["sent", "deleted"]
        assert await stamps("t", m.msg_id) == readings[-1:] * 2  # Redis' later events are never older
        # Redis keeps the delete's tombstone without the body, which getMsg answers from the log.
        assert Message.from_stored(await rt.redis.hget(rt.ns.topic("t").msgs, m.msg_id), m.msg_id).payload == ""
        answer = await get_message(rt, topic="t", msg_id=m.msg_id)
        assert answer.to_wire() == {**m.to_wire(), "status": Status.DELETED}
        assert not await delete_message(rt, topic="t", msg_id=m.msg_id)  # once
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 0
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
    finally:
        await loader.close()


async def test_a_cold_message_deleted_with_release_leaves_no_body_in_redis_and_is_never_loaded(cold_rt):
    """`release` frees the body at once: a cold message's body, never in Redis, was written there
    as the delete's tombstone and kept readable for the retention."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        assert await delete_message(rt, topic="t", msg_id=m.msg_id, release=True)
        assert (await logged("t", m.msg_id))["status"] == Status.DELETED
        assert not (await in_redis(rt, m.msg_id))["body"]
        assert await get_message(rt, topic="t", msg_id=m.msg_id) is None  # as after a hot message's release
        assert not await delete_message(rt, topic="t", msg_id=m.msg_id, release=True)
        assert (await topic_info(rt, topic="t")).waiting_cold == 0
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 0
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
    finally:
        await loader.close()


@pytest.mark.parametrize("deleted", ["after the loader read it", "after the loader loaded it"])
async def test_a_delete_racing_the_loader_deletes_the_message(cold_rt, monkeypatch, deleted):
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        await raise_window_to(rt, "t", now_millis() + 120_000)
        real_call = rt.scripts.call

        def delete():
            return delete_message(rt, topic="t", msg_id=m.msg_id)

        if deleted == "after the loader read it":
            answers = after_first_page(monkeypatch, loader, delete)
        else:
            answers = []

            async def load_then_delete(call):
                reply = await real_call(call)
                if call.script is scripts.LOAD_COLD and not answers:
                    answers.append(await delete())
                return reply

            monkeypatch.setattr(rt.scripts, "call", load_then_delete)
        await loader.load_topic("t", force=True)
        monkeypatch.setattr(rt.scripts, "call", real_call)
        await drain_log(rt, ["t"])  # a delete of a loaded message is logged as any other
        assert answers == [True]
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
        assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
        assert (await logged("t", m.msg_id))["status"] == Status.DELETED
        assert (await pull_messages(rt, topic="t"))[0] == []
    finally:
        await loader.close()


@pytest.fixture(params=["single", "cluster"])
async def capped_rt(request, clean_state):
    """A two-minute window, and room in Redis for three waiting messages of a topic (this packs
    nothing: test_packed.py counts packed ones in the room)."""
    runtime = make_runtime(REDIS_URL if request.param == "single" else REDIS_CLUSTER_URL, hot_window_millis=120_000,
                           hot_max_messages=3, pack_lead_millis=0)
    yield runtime
    await runtime.close()


async def cold_sends(rt, delays: list[int]) -> list[Message]:
    """Messages sent while the topic's window reaches a second ahead: cold, each of them."""
    await raise_window_to(rt, "t", now_millis() + 1000)
    return [await send(rt, msg=str(delay), delay=delay) for delay in delays]


async def test_the_window_shrinks_to_what_redis_has_room_for_and_grows_as_room_is_made(capped_rt):
    rt = capped_rt
    cold = await cold_sends(rt, [70_000 + 5_000 * i for i in range(6)])
    loader = Loader(rt, lambda: [Shard("t")])
    try:
        assert await loader.load_topic("t", force=True) == 3
        hot_until = int(await rt.redis.hget(rt.ns.topic("t").meta, Meta.HOT_UNTIL))
        assert cold[2].trigger_time <= hot_until < cold[3].trigger_time  # just before the first without room
        later = await send(rt, msg="within the window, beyond the room", delay=100_000)
        assert not (await in_redis(rt, later.msg_id))["body"]
        assert (await topic_info(rt, topic="t")).waiting_cold == 4
        assert await loader.load_topic("t", force=True) == 0  # still no room
        for m in cold[:2]:
            assert await delete_message(rt, topic="t", msg_id=m.msg_id)
        assert await loader.load_topic("t", force=True) == 2
        assert [(await in_redis(rt, m.msg_id))["waiting"] for m in cold[3:5]] == [m.trigger_time for m in cold[3:5]]
        assert not (await in_redis(rt, cold[5].msg_id))["body"]
    finally:
        await loader.close()


async def test_without_room_the_window_still_reaches_a_minute_ahead(capped_rt):
    """Messages due within a minute come in whatever the room: a full Redis never makes one late."""
    rt = capped_rt
    cold = await cold_sends(rt, [20_000 + 1_000 * i for i in range(5)] + [90_000])
    loader = Loader(rt, lambda: [Shard("t")])
    try:
        assert await loader.load_topic("t", force=True) == 5
        hot_until = int(await rt.redis.hget(rt.ns.topic("t").meta, Meta.HOT_UNTIL))
        assert now_millis() + 55_000 < hot_until < cold[5].trigger_time
    finally:
        await loader.close()


@pytest.mark.fault
async def test_with_postgresql_down_hot_messages_fire_and_the_loader_catches_up_after(start_scanner, postgres):
    rt = make_runtime(REDIS_URL, hot_window_millis=2000)  # raised every 0.2 s
    try:
        await start_scanner(rt)
        await send(rt, msg="registers the topic")
        await wait_until(lambda: _has_window(rt), timeout=10, what="the scanner's loader to raise the window")
        await pull_messages(rt, topic="t")
        hot = await send(rt, msg="hot", delay=1000)
        cold = await send(rt, msg="cold", delay=6000)
        assert not (await in_redis(rt, cold.msg_id))["body"]
        postgres.stop()
        pulled = []

        async def fired():
            pulled.extend((await pull_messages(rt, topic="t"))[0])
            return pulled

        await wait_until(fired, timeout=10, interval=0.01, what="the hot message to fire while the log is down")
        assert [m.msg_id for m in pulled] == [hot.msg_id]
        # Past when the loader would have brought it in (most of the 2 s window ahead): it cannot.
        await asyncio.sleep(max(cold.trigger_time - 1000 - now_millis(), 0) / 1000)
        assert not (await in_redis(rt, cold.msg_id))["body"]
        postgres.start()
        await wait_until(lambda: _in_redis_waiting(rt, cold.msg_id), timeout=15, what="the loader to catch up")
        pulled.clear()
        await wait_until(fired, timeout=15, interval=0.005, what="the cold message to fire")
        assert [m.msg_id for m in pulled] == [cold.msg_id] and now_millis() >= cold.trigger_time
    finally:
        await rt.close()


async def _in_redis_waiting(rt, msg_id) -> bool:
    return (await in_redis(rt, msg_id))["waiting"] is not None


async def test_a_topic_with_cold_messages_is_not_retired_until_the_loader_finds_none_left(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        retire = scripts.retire_topic(rt.context, "t", idle_millis=0)
        assert not (await rt.scripts.call(retire)).retired
        assert await delete_message(rt, topic="t", msg_id=m.msg_id, release=True)
        await rt.redis.hdel(rt.ns.topic("t").msgs, m.msg_id)  # the tombstone's retention passed
        await loader.load_topic("t", force=True)
        assert not await rt.redis.hexists(rt.ns.topic("t").meta, Meta.COLD)
        assert (await rt.scripts.call(retire)).retired
    finally:
        await loader.close()


async def test_switched_off_the_loader_brings_in_every_cold_message_and_forgets_the_window(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    m = await send(rt, msg="x", delay=86_400_000)
    await loader.close()
    off = make_runtime(rt.config.redis_url, hot_window_millis=0)
    loader = Loader(off, lambda: [Shard("t")])
    try:
        assert await loader.load_topic("t") == 1
        assert (await in_redis(rt, m.msg_id))["waiting"] == m.trigger_time
        meta = await rt.redis.hgetall(rt.ns.topic("t").meta)
        assert not {Meta.HOT_UNTIL, Meta.LOADED_TO, Meta.COLD} & set(meta)
        assert await loader.load_topic("t") == 0
    finally:
        await loader.close()
        await off.close()


async def test_switched_off_the_api_finds_what_is_left_cold_until_the_loader_brought_it_in(cold_rt):
    """Processes restarted with the window off serve before the loader has brought in what was
    left cold: getMsg, deleteMsg and a resend of its msgId still find it in the log (it was taken
    for unknown: a delete answered not found and the message fired all the same, a resend replaced it)."""
    rt = cold_rt
    loader = await started(rt)
    kept, deleted = [await send(rt, msg=f"x{i}", delay=86_400_000) for i in range(2)]
    await loader.close()
    off = make_runtime(rt.config.redis_url, hot_window_millis=0)
    loader = Loader(off, lambda: [Shard("t")])
    try:
        assert await get_message(off, topic="t", msg_id=kept.msg_id) == kept
        assert await delete_message(off, topic="t", msg_id=deleted.msg_id)
        assert await send(off, msg="again", delay=0, msg_id=kept.msg_id) == kept
        assert await loader.load_topic("t") == 1
        assert (await in_redis(rt, kept.msg_id))["waiting"] == kept.trigger_time
        assert (await get_message(off, topic="t", msg_id=deleted.msg_id)).status == Status.DELETED
        assert (await in_redis(rt, deleted.msg_id))["waiting"] is None
    finally:
        await loader.close()
        await off.close()


async def test_with_the_window_off_nothing_is_cold(clean_state):
    rt = make_runtime(REDIS_URL, hot_window_millis=0)
    loader = Loader(rt, lambda: [Shard("t")])
    try:
        m = await send(rt, msg="x", delay=86_400_000)
        assert await loader.load_topic("t") == 0
        assert (await in_redis(rt, m.msg_id))["waiting"] == m.trigger_time
        assert not await rt.redis.hexists(rt.ns.topic("t").meta, Meta.HOT_UNTIL)
    finally:
        await loader.close()
        await rt.close()


async def test_the_scanners_loader_loads_while_it_holds_the_topic(cold_rt, start_scanner):
    rt = cold_rt
    scanner = await start_scanner(rt)
    await send(rt, msg="registers the topic", delay=0)
    await wait_until(lambda: _has_window(rt), timeout=10, what="the window")
    m = await send(rt, msg="cold", delay=60_000)
    assert not (await in_redis(rt, m.msg_id))["body"]
    await raise_window_to(rt, "t", now_millis() + 120_000)
    scanner.scanner.loader._raised_at.clear()  # its next tick loads

    async def loaded():
        return (await in_redis(rt, m.msg_id))["waiting"] == m.trigger_time

    await wait_until(loaded, timeout=10, what="the scanner's loader to load the message")


async def test_a_cold_message_loaded_after_its_time_is_ready_at_once_and_logged_as_due(cold_rt):
    """A loader that fell behind (its scanner was down): the message is late, never lost."""
    rt = cold_rt
    loader = await started(rt)
    try:
        plain = await send(rt, msg="plain", delay=WINDOW + 500)
        urgent = await send(rt, msg="urgent", delay=WINDOW + 500, priority=3)
        assert not (await in_redis(rt, plain.msg_id))["body"]
        await wait_until(lambda: _past(urgent.trigger_time), timeout=10, what="both to fall due")
        assert await loader.load_topic("t", force=True) == 2
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert [m.msg_id for m in pulled] == [urgent.msg_id, plain.msg_id]  # the higher priority first
        await drain_log(rt, ["t"])
        assert [h[0] for h in await history("t", plain.msg_id)] == ["sent", "due", "pulled"]
    finally:
        await loader.close()


async def test_cold_messages_loaded_after_their_time_count_as_promoted_and_late(cold_rt):
    """What a loader that fell behind makes ready is counted as the scanner's promotions are: in
    triggerMsgReady and the fire-lateness histogram, where its lateness shows."""
    rt = cold_rt
    loader = await started(rt)
    try:
        sent = [await send(rt, msg=str(i), delay=WINDOW + 500) for i in range(2)]
        await wait_until(lambda: _past(max(m.trigger_time for m in sent) + 600), timeout=10,
                         what="both to be over half a second late")
        assert await loader.load_topic("t", force=True) == 2
        [overview] = await figures.topic_overview(rt, topics=["t"])
        assert overview["totals"]["triggerMsgReady"] == 2 and overview["lateness_count"] == 2
        assert overview["lateness_sum_ms"] >= 2 * 600
        assert dict(overview["lateness_buckets"])[500] == 0  # each counted above half a second
        assert sum(p["count"] for p in overview["lateness_series"]) == 2
    finally:
        await loader.close()


async def _past(millis: int) -> bool:
    return now_millis() > millis


async def test_a_cold_message_rescheduled_further_stays_cold_with_its_new_times(cold_rt, monkeypatch):
    """Its new time counts from Redis' clock, as a hot message's does, whatever this host's clock says;
    its log row and history row are stamped with that same reading."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000, ttl_millis=5000)
        before = await redis_millis(rt)
        real_time_ns = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - 3_600_000_000_000)  # this host an hour behind
        moved = await reschedule_message(rt, topic="t", msg_id=m.msg_id, delay_millis=120_000)
        monkeypatch.undo()
        assert before + 120_000 <= moved.trigger_time <= await redis_millis(rt) + 120_000
        assert moved.expire_time == moved.trigger_time + 5000  # the TTL counts from the new time
        assert not (await in_redis(rt, m.msg_id))["body"]
        assert await get_message(rt, topic="t", msg_id=m.msg_id) == moved
        assert [h[0] for h in await history("t", m.msg_id)] == ["sent", "rescheduled"]
        # A later event of Redis' (its clock) is not taken for one before the reschedule.
        assert await query(f"SELECT {to_millis('updated_at')} FROM delayqueue_message WHERE msg_id = %s",
                           m.msg_id) == [(moved.trigger_time - 120_000,)]
    finally:
        await loader.close()


@pytest.mark.parametrize("delay", [10_000, 0])
async def test_a_cold_message_rescheduled_into_the_window_is_hot_at_once(cold_rt, delay):
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        await raise_window_to(rt, "t", now_millis() + 30_000)  # a window a slow step cannot pass
        moved = await reschedule_message(rt, topic="t", msg_id=m.msg_id, delay_millis=delay)
        # Waiting, it enters the expiry index only when it becomes ready.
        assert (await in_redis(rt, m.msg_id))["expiry"] == (None if delay else moved.expire_time)
        if delay:
            assert moved.status == Status.WAITING
            assert (await in_redis(rt, m.msg_id))["waiting"] == moved.trigger_time
        else:
            assert moved.status == Status.READY
            assert [p.msg_id for p in (await pull_messages(rt, topic="t"))[0]] == [m.msg_id]
    finally:
        await loader.close()


async def test_a_cold_message_rescheduled_after_the_loader_read_it_fires_at_its_new_time(cold_rt, monkeypatch):
    """The loader read the row with its old time; the reschedule moves it far out: Redis takes it
    with its new time, and the loader's page, applied after, leaves it."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        await raise_window_to(rt, "t", now_millis() + 90_000)
        moved = after_first_page(monkeypatch, loader, lambda: reschedule_message(
            rt, topic="t", msg_id=m.msg_id, delay_millis=3_600_000))
        await loader.load_topic("t", force=True)
        assert (await in_redis(rt, m.msg_id))["waiting"] == moved[0].trigger_time
        assert await get_message(rt, topic="t", msg_id=m.msg_id) == moved[0]
    finally:
        await loader.close()



@pytest.mark.parametrize("api", ["getMsg", "deleteMsg", "rescheduleMsg"])
async def test_a_cold_message_the_loader_brings_in_just_after_redis_was_asked_is_still_found(cold_rt, monkeypatch,
                                                                                           api):
    """Redis answers it does not hold the msgId, then a load moves loaded_to past its row before
    the log is asked: the row was cold when Redis answered, and must not be taken for Redis'."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="x", delay=60_000)
        await raise_window_to(rt, "t", now_millis() + 120_000)
        real_call, loaded = rt.scripts.call, []

        async def miss_then_load(call):
            reply = await real_call(call)
            if call.script in (scripts.GET, scripts.DELETE, scripts.RESCHEDULE) and not loaded:
                loaded.append(await loader.load_topic("t", force=True))
            return reply

        monkeypatch.setattr(rt.scripts, "call", miss_then_load)
        if api == "getMsg":
            assert await get_message(rt, topic="t", msg_id=m.msg_id) == m
        elif api == "deleteMsg":
            assert await delete_message(rt, topic="t", msg_id=m.msg_id)
        else:
            moved = await reschedule_message(rt, topic="t", msg_id=m.msg_id, delay_millis=90_000)
            assert moved.trigger_time > m.trigger_time
        monkeypatch.setattr(rt.scripts, "call", real_call)
        assert loaded == [1]
        if api == "deleteMsg":
            assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
            assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
        elif api == "rescheduleMsg":
            assert (await in_redis(rt, m.msg_id))["waiting"] == moved.trigger_time
    finally:
        await loader.close()

async def redis_answers_for_what_it_ended(rt, msg_id: str, status: int) -> None:
    """Topic t's message, deleted with its body released, its log row reading `status` (the log
    writer not caught up): Redis answers for it, getMsg finds nothing, deleteMsg and rescheduleMsg
    nothing to act on."""
    assert (await logged("t", msg_id))["status"] == status
    assert await get_message(rt, topic="t", msg_id=msg_id) is None
    assert not await delete_message(rt, topic="t", msg_id=msg_id)
    with pytest.raises(NotFound):
        await reschedule_message(rt, topic="t", msg_id=msg_id, delay_millis=60_000)


@pytest.mark.parametrize("delay", [0, 500])
async def test_a_log_row_before_the_loaders_position_is_redis_to_answer_for(cold_rt, delay):
    """The log writer may not have caught up with what Redis did to a message: a row due before
    the loader's position is never taken for a cold one, by getMsg, deleteMsg, rescheduleMsg or a
    resend of its msgId."""
    rt = cold_rt
    loader = await started(rt)
    try:
        first = await send(rt, msg="first", delay=delay, msg_id="k")  # hot: ready, or waiting in the window
        assert await delete_message(rt, topic="t", msg_id="k", release=True)
        await redis_answers_for_what_it_ended(rt, "k", first.status)  # not caught up: still live in the log
        again = await send(rt, msg="second", delay=delay, msg_id="k")
        assert (again.payload, again.produce_time > first.produce_time) == ("second", True)
        assert (await get_message(rt, topic="t", msg_id="k")).payload == "second"
    finally:
        await loader.close()


async def test_a_message_redis_holds_beyond_the_window_deleted_with_its_body_is_not_taken_for_a_cold_one(cold_rt,
                                                                                                     monkeypatch):
    """A hot message rescheduled beyond the window stays in Redis, its log row after the loader's
    position. Deleted with its body released, the row read waiting until the log writer caught up,
    as a cold message's does: getMsg answered it waiting, a reschedule or the loader brought the
    deleted message back. The delete now ends the row at once."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        first = await send(rt, msg="first", delay=10_000, msg_id="k")
        await reschedule_message(rt, topic="t", msg_id="k", delay_millis=120_000)  # stays in Redis
        await drain_log(rt, ["t"])
        readings = redis_readings(monkeypatch, messages_module)
        assert await delete_message(rt, topic="t", msg_id="k", release=True)
        assert (await stamps("t", "k"))[:1] == readings[-1:]
        await redis_answers_for_what_it_ended(rt, "k", Status.DELETED)
        await raise_window_to(rt, "t", now_millis() + 300_000)
        assert await loader.load_topic("t", force=True) == 0
        again = await send(rt, msg="second", delay=1_000, msg_id="k")  # the log remembers the msgId, as a
        assert (again.payload, again.status) == ("first", Status.DELETED)  # caught-up writer would have it
        assert await drain_log(rt, ["t"]) and [reason for reason, *_ in await history("t", "k")].count("deleted") == 1
    finally:
        await loader.close()


async def held_beyond_the_loader(rt):
    """Message "k": held in Redis (rescheduled from inside the window), due after the loader's
    position, its log row written."""
    await raise_window_to(rt, "t", now_millis() + 30_000)
    await send(rt, msg="first", delay=10_000, msg_id="k")
    await reschedule_message(rt, topic="t", msg_id="k", delay_millis=120_000)  # stays in Redis
    await drain_log(rt, ["t"])


@pytest.mark.fault
async def test_a_message_deleted_with_its_body_while_postgresql_was_down_is_neither_purged_nor_loaded_again(
        clean_state, postgres):
    """The delete cannot end the row in the log, which reads waiting after the loader's position
    until the log writer catches up: a purge then counted it as a cold message it ended (its
    answer one too many, the cold count one too few), and the loader brought it back."""
    rt = make_runtime(REDIS_URL, hot_window_millis=WINDOW, pack_lead_millis=0, log_retry_millis=200)
    loader = await started(rt)
    try:
        await held_beyond_the_loader(rt)
        postgres.stop()
        assert await delete_message(rt, topic="t", msg_id="k", release=True)
        postgres.start()
        assert (await logged("t", "k"))["status"] == Status.WAITING  # the log writer has not caught up
        await raise_window_to(rt, "t", now_millis() + 300_000)
        assert await loader.load_topic("t", force=True) == 0
        assert (await get_message(rt, topic="t", msg_id="k")).status == Status.DELETED  # kept until the row ends
        assert await purge_topic(rt, topic="t") == 0
        await send(rt, msg="cold", delay=600_000)
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (1, 1)
    finally:
        await loader.close()
        await rt.close()


async def test_a_life_sent_while_a_release_delete_ends_the_log_row_is_not_freed_with_it(clean_state, monkeypatch):
    """The delete keeps the ended body until it has ended the log row, then frees it: a resend of
    the msgId in between (no dedupe window) starts a new life, which stays."""
    rt = make_runtime(REDIS_URL, hot_window_millis=WINDOW, pack_lead_millis=0, dedupe_window_millis=0)
    loader = await started(rt)
    try:
        await held_beyond_the_loader(rt)
        real_end = rt.log.end_released

        async def resent_between(*args, **kwargs):
            await real_end(*args, **kwargs)
            assert (await send(rt, msg="second", delay=5_000, msg_id="k")).payload == "second"

        monkeypatch.setattr(rt.log, "end_released", resent_between)
        assert await delete_message(rt, topic="t", msg_id="k", release=True)
        again = await get_message(rt, topic="t", msg_id="k")
        assert (again.payload, again.status) == ("second", Status.WAITING)
    finally:
        await loader.close()
        await rt.close()


async def test_a_message_unknown_to_both_tiers_is_not_found_for_reschedule(cold_rt):
    rt = cold_rt
    with pytest.raises(NotFound, match="not found"):
        await reschedule_message(rt, topic="t", msg_id="nobody", delay_millis=10)


async def test_a_touch_of_a_cold_message_is_a_conflict_as_of_a_hot_waiting_one(cold_rt):
    """touchMsg answers 409 for a message not consuming and 404 for an unknown one: a cold message,
    which getMsg answers, was answered unknown (Redis does not hold it)."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        far = await send(rt, msg="far", delay=60_000)
        with pytest.raises(Conflict, match="status 1"):
            await touch_message(rt, topic="t", msg_id=far.msg_id, ack_timeout_millis=1000)
        with pytest.raises(NotFound, match="not found"):
            await touch_message(rt, topic="t", msg_id="nobody", ack_timeout_millis=1000)
    finally:
        await loader.close()


async def test_the_topic_counts_follow_cold_messages_through_every_move(cold_rt):
    rt = cold_rt
    loader = await started(rt)

    async def counts():
        info = await topic_info(rt, topic="t")
        return info.waiting - info.waiting_cold, info.waiting_cold

    try:
        cold = [await send(rt, msg=str(i), delay=60_000 + i) for i in range(5)]
        await send(rt, msg="dup", delay=60_000, msg_id=cold[0].msg_id)  # a duplicate counts once
        assert await counts() == (0, 5)
        await delete_message(rt, topic="t", msg_id=cold[0].msg_id)
        await raise_window_to(rt, "t", now_millis() + 30_000)
        await reschedule_message(rt, topic="t", msg_id=cold[1].msg_id, delay_millis=10_000)
        await reschedule_message(rt, topic="t", msg_id=cold[2].msg_id, delay_millis=120_000)
        assert await counts() == (1, 3)
        await raise_window_to(rt, "t", now_millis() + 90_000)
        assert await loader.load_topic("t", force=True) == 2
        assert await counts() == (3, 1)
        await raise_window_to(rt, "t", now_millis() + 180_000)
        assert await loader.load_topic("t", force=True) == 1
        assert await counts() == (4, 0)
        assert not await rt.redis.hexists(rt.ns.topic("t").meta, Meta.COLD)  # nothing left: dropped
    finally:
        await loader.close()


async def test_the_waiting_buckets_count_cold_messages_by_the_hour_they_fall_due_in(cold_rt, monkeypatch):
    """getTopicInfo's waitingQueueInfo reads the cold messages' hours from Redis, never the log:
    each move (send, delete, reschedule within the log or into the window, load) keeps them. Its
    buckets count from Redis' clock, the one the messages fire by, whatever the reader's host says."""
    rt = cold_rt
    loader = await started(rt)
    hour, day = 3_600_000, 86_400_000

    async def buckets():
        info = await topic_info(rt, topic="t")
        assert sum(info.waiting_within) == info.waiting
        return dict(zip(wire.WAITING_BUCKET_NAMES, info.waiting_within))

    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        await send(rt, msg="soon", delay=10_000)
        two_hours = [await send(rt, msg=f"2h {i}", delay=2 * hour + i) for i in range(3)]
        three_days = await send(rt, msg="3d", delay=3 * day)
        far = await send(rt, msg="40d", delay=40 * day)
        assert await cold_hours(rt) == hours_of(*two_hours, three_days, far)
        sent = {"sizeOf0To1min": 1, "sizeOf1minTo10min": 0, "sizeOf10minTo30min": 0, "sizeOf30minTo1hour": 0,
                "sizeOf1hourTo6hour": 3, "sizeOf6hourTo1day": 0, "sizeOf1dayTo7day": 1, "sizeOf7dayTo30day": 0,
                "sizeOf30dayToInfinite": 1}
        assert await buckets() == sent
        real_time_ns = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - 3_600_000_000_000)  # this host an hour behind
        assert await buckets() == sent
        monkeypatch.undo()
        await delete_message(rt, topic="t", msg_id=two_hours[0].msg_id)
        moved = await reschedule_message(rt, topic="t", msg_id=three_days.msg_id, delay_millis=12 * hour)
        await reschedule_message(rt, topic="t", msg_id=far.msg_id, delay_millis=20_000)  # into the window
        assert await cold_hours(rt) == hours_of(*two_hours[1:], moved)
        assert (await buckets())["sizeOf1hourTo6hour"] == 2 and (await buckets())["sizeOf6hourTo1day"] == 1
        assert (await buckets())["sizeOf0To1min"] == 2 and (await buckets())["sizeOf30dayToInfinite"] == 0
        await raise_window_to(rt, "t", now_millis() + 3 * hour)
        assert await loader.load_topic("t", force=True) == 2
        assert await cold_hours(rt) == hours_of(moved)
        assert (await buckets())["sizeOf1hourTo6hour"] == 2  # now in Redis: its own score counts
        assert (await topic_info(rt, topic="t")).waiting_cold == 1 and (await buckets())["sizeOf0To1min"] == 2
    finally:
        await loader.close()


async def test_a_purge_ends_cold_and_hot_messages_alike_each_with_one_history_row(cold_rt, monkeypatch):
    rt = cold_rt
    monkeypatch.setattr(topics_module, "COLD_PURGE_PAGE", 2)  # several pages
    readings = redis_readings(monkeypatch, topics_module)
    loader = await started(rt)
    await raise_window_to(rt, "t", now_millis() + 30_000)
    try:
        cold = [await send(rt, msg=f"cold {i}", delay=60_000 + i) for i in range(5)]
        hot = [await send(rt, msg="now"), await send(rt, msg="soon", delay=10_000)]
        moved = await reschedule_message(rt, topic="t", msg_id=cold[0].msg_id, delay_millis=10_000)  # hot now
        assert (await in_redis(rt, moved.msg_id))["waiting"] == moved.trigger_time
        assert await purge_topic(rt, topic="t") == 7
        await drain_log(rt, ["t"])
        for m in cold + hot:
            assert (await logged("t", m.msg_id))["status"] == Status.DELETED
            assert [h[0] for h in await history("t", m.msg_id) if h[0] != "rescheduled"] == ["sent", "purged"]
        # Redis keeps a hot one's body for the retention; getMsg answers a cold one's as deleted from the log.
        assert (await get_message(rt, topic="t", msg_id=moved.msg_id)).status == Status.DELETED
        for m in hot + cold[1:]:
            assert (await get_message(rt, topic="t", msg_id=m.msg_id)).to_wire() == {**m.to_wire(),
                                                                                     "status": Status.DELETED}
        for m in cold[1:]:
            [updated, purged] = await stamps("t", m.msg_id)
            assert updated == purged and updated in readings  # a page's reading of Redis' clock
        briefly = make_runtime(rt.config.redis_url, hot_window_millis=WINDOW, ended_retention_millis=1)
        try:  # past the retention, it is not found, as a hot one is not once Redis let its body go
            assert await get_message(briefly, topic="t", msg_id=cold[1].msg_id) is None
        finally:
            await briefly.close()
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold, info.ready) == (0, 0, 0) and set(info.waiting_within) == {0}
        assert not await rt.redis.exists(rt.ns.topic("t").cold_hours)
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 0
        assert (await pull_messages(rt, topic="t"))[0] == []
        assert await purge_topic(rt, topic="t") == 0
    finally:
        await loader.close()


async def test_a_page_the_loader_read_before_a_purge_loads_nothing(cold_rt, monkeypatch):
    """The purge ends the rows in the log, then fences loaded_to: the page read before holds
    rows that are no longer waiting, and its load is refused; read again, it is empty."""
    rt = cold_rt
    loader = await started(rt)
    try:
        cold = [await send(rt, msg=str(i), delay=60_000 + i) for i in range(3)]
        await raise_window_to(rt, "t", now_millis() + 120_000)
        answers = after_first_page(monkeypatch, loader, lambda: purge_topic(rt, topic="t"))
        assert await loader.load_topic("t", force=True) == 0
        assert answers == [3]
        assert (await rt.redis.hget(rt.ns.topic("t").meta, Meta.LOADED_TO)).endswith(":1")  # the fence
        assert await loader.load_topic("t", force=True) == 0  # read again: nothing waits
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
        assert [(await logged("t", m.msg_id))["status"] for m in cold] == [Status.DELETED] * 3
    finally:
        await loader.close()


async def test_a_page_the_loader_loads_while_a_purge_ends_its_rows_is_purged_from_redis(cold_rt, monkeypatch):
    """The loader loads a page after the purge read which msgIds Redis holds and before it ended
    them in the log: Redis' part of the purge, after the fence, ends them there."""
    rt = cold_rt
    loader = await started(rt)
    try:
        cold = [await send(rt, msg=str(i), delay=60_000 + i) for i in range(3)]
        await raise_window_to(rt, "t", now_millis() + 120_000)
        real_purge = rt.log.purge_cold
        loaded = []

        async def loader_first(row_ids, **kwargs):
            loaded.append(await loader.load_topic("t", force=True))
            return await real_purge(row_ids, **kwargs)

        monkeypatch.setattr(rt.log, "purge_cold", loader_first)
        assert await purge_topic(rt, topic="t") >= 3
        assert loaded == [3]
        await drain_log(rt, ["t"])
        assert await rt.redis.zcard(rt.ns.topic("t").waiting) == 0
        for m in cold:
            assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
            assert (await logged("t", m.msg_id))["status"] == Status.DELETED
        assert (await topic_info(rt, topic="t")).waiting == 0
        assert (await pull_messages(rt, topic="t"))[0] == []
    finally:
        await loader.close()


@pytest.mark.parametrize("cap", ["topic", "namespace"])
async def test_the_live_message_caps_count_cold_messages(cold_rt, cap):
    rt = cold_rt
    loader = await started(rt)
    try:
        if cap == "topic":
            await set_limits_now(namespace=rt.ns.namespace, topic="t", max_live=3)
        else:
            await set_limits_now(namespace=rt.ns.namespace, max_live=3)
        sent = await limits_send(rt, "t", 2, delay_millis=60_000) + await limits_send(rt, "t", 1)
        assert not refused(sent) and (await topic_info(rt, topic="t")).waiting_cold == 2
        [refusal] = await limits_send(rt, "t", 1, delay_millis=60_000)
        assert isinstance(refusal, Throttled) and "(3 messages)" in str(refusal)
        assert await delete_message(rt, topic="t", msg_id=sent[0].msg_id)  # a cold one: room again
        assert not refused(await limits_send(rt, "t", 1, delay_millis=60_000))
    finally:
        await loader.close()


async def test_a_restore_without_a_loss_leaves_cold_messages_to_the_loader(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    try:
        cold = [await send(rt, msg=str(i), delay=60_000) for i in range(3)]
        counts = await restore(rt)
        assert (counts.restored, counts.already_live, counts.left_cold) == (0, 0, 3)
        assert [(await in_redis(rt, m.msg_id))["body"] for m in cold] == [False] * 3
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (3, 3)
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 3
        assert [(await in_redis(rt, m.msg_id))["waiting"] for m in cold] == [m.trigger_time for m in cold]
        assert not await rt.redis.hexists(rt.ns.topic("t").meta, Meta.COLD)
    finally:
        await loader.close()


async def test_a_restore_that_leaves_messages_cold_reports_its_progress_up_to_its_total(cold_rt):
    """The messages left to the loader are counted as done, from the first report on: so the total
    must count them too, in every report, or the bar runs past 100%."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await send(rt, msg="now")
        for i in range(2):
            await send(rt, msg=f"cold {i}", delay=60_000)
        reports = []
        counts = await restore(rt, progress=lambda done, total: reports.append((done.seen, total)))
        assert (counts.already_live, counts.left_cold) == (1, 2)
        assert all(seen <= total for seen, total in reports) and reports[-1] == (3, 3)
    finally:
        await loader.close()


@pytest.mark.fault
async def test_a_restore_after_redis_lost_everything_rebuilds_the_hot_window_only(cold_rt):
    """Redis flushed with messages in both tiers: the restore brings back those up to where the
    loader stands (the topic gets a window first, as the loader would give it: 1 s here) and
    leaves the rest, counted, to the loader, even one that was hot before; each comes back once."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        hot = [await send(rt, msg="now"), await send(rt, msg="soon", delay=10_000)]
        cold = [await send(rt, msg=f"cold {i}", delay=60_000 + i) for i in range(4)]
        [pulled], _ = await pull_messages(rt, topic="t")  # in flight when Redis goes
        await drain_log(rt, ["t"])
        await rt.redis.flushall()
        counts = await restore(rt)
        assert (counts.restored, counts.left_cold) == (1, 5)
        assert (await get_message(rt, topic="t", msg_id=pulled.msg_id)).status == Status.READY
        assert [(await in_redis(rt, m.msg_id))["body"] for m in [hot[1], *cold]] == [False] * 5
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold, info.ready) == (5, 5, 1) and sum(info.waiting_within) == 5
        assert await cold_hours(rt) == hours_of(hot[1], *cold)
        hot_until = int(await rt.redis.hget(rt.ns.topic("t").meta, Meta.HOT_UNTIL))
        assert hot_until < hot[1].trigger_time
        assert (await restore(rt)).left_cold == 5  # a rerun: the same, nothing twice
        assert (await topic_info(rt, topic="t")).waiting_cold == 5
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 5
        waiting = await rt.redis.zrange(rt.ns.topic("t").waiting, 0, -1, withscores=True)
        assert waiting == [(m.msg_id, float(m.trigger_time)) for m in [hot[1], *cold]]
        assert (await topic_info(rt, topic="t")).waiting_cold == 0 and await cold_hours(rt) == Counter()
    finally:
        await loader.close()


@pytest.mark.fault
@pytest.mark.parametrize("lost", [True, False])
async def test_a_restore_and_the_loader_agree_on_the_cold_count_of_messages_sent_just_before(cold_rt, lost):
    """Sent less than IN_FLIGHT_MILLIS before the restore, which counts them cold: the loader
    brings one in while it is that young, and must count it out, the other staying cold. `lost`:
    Redis lost its data (and the sends' notes that they counted them) before the restore."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        near, far = await send(rt, msg="near", delay=60_000), await send(rt, msg="far", delay=600_000)
        if lost:
            await rt.redis.flushall()
        assert (await restore(rt)).left_cold == 2
        await raise_window_to(rt, "t", now_millis() + 120_000)
        assert await loader.load_topic("t", force=True) == 1
        assert (await in_redis(rt, near.msg_id))["waiting"] == near.trigger_time
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        assert await cold_hours(rt) == hours_of(far)
    finally:
        await loader.close()


async def test_a_send_whose_script_runs_after_a_restore_counted_it_cold_is_counted_once(cold_rt):
    """The send's log row was committed before the restore, its script runs after it: the restore
    counted the message cold, and the script, which finds it cold too, must not count it again."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        row = prepared(rt, SendRequest(topic="t", msg="x", delay_millis=600_000), now_millis(), {})
        await rt.log.record([row])
        assert (await restore(rt)).left_cold == 1
        [(call_, _)] = unsharded_calls(rt, [row])
        [reply] = await rt.scripts.call(call_)
        assert reply.cold
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        assert await cold_hours(rt) == hours_of(row)
    finally:
        await loader.close()


async def test_a_cold_message_whose_ttl_ends_during_its_wait_is_run_now_within_its_ttl(cold_rt):
    """A nack's delay past its TTL, left cold by a restore: the log's row, rescheduled first, kept its
    expireTime (RESCHEDULE_COLD moved it back with the triggerTime, into the past: ended at once)."""
    rt = cold_rt
    sent = await send(rt, msg="n", ttl_millis=60_000)
    await pull_messages(rt, topic="t")
    await nack_message(rt, topic="t", msg_id=sent.msg_id, delay_millis=600_000)
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    assert (await restore(rt)).left_cold == 1
    now = await reschedule_message(rt, topic="t", msg_id=sent.msg_id, delay_millis=0)
    assert now.status == Status.READY and now.expire_time == sent.expire_time
    [again], _ = await pull_messages(rt, topic="t")
    assert (again.msg_id, again.retry) == (sent.msg_id, 2)
    assert (await logged("t", sent.msg_id))["expireTime"] == sent.expire_time

@pytest.mark.fault
async def test_a_topic_whose_messages_a_restore_all_leaves_cold_is_registered_and_they_fire(cold_rt, start_scanner):
    """The restore brings back none of the topic's messages (all beyond the 1 s window), so no
    restored message registers it: the restore must, as a scanner's loader works registered
    topics only, and nothing else would ever bring them in."""
    rt = cold_rt
    cold = [await send(rt, msg=f"cold {i}", delay=5000 + i) for i in range(3)]
    await rt.redis.flushall()
    counts = await restore(rt)
    assert (counts.restored, counts.left_cold) == (0, 3)
    assert await topics_module.list_topics(rt) == ["t"]
    await start_scanner(rt)
    pulled = []

    async def fired():
        pulled.extend((await pull_messages(rt, topic="t", batch=3))[0])
        return len(pulled) == 3

    await wait_until(fired, timeout=15, interval=0.01, what="the messages left cold to fire")
    assert sorted(p.msg_id for p in pulled) == sorted(m.msg_id for m in cold)
    assert now_millis() >= max(m.trigger_time for m in cold)


async def test_metrics_show_cold_messages_and_how_far_ahead_the_window_is(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "HOT_WINDOW_MILLIS": 30_000}
    rt = make_runtime(REDIS_URL, hot_window_millis=30_000)
    loader = await started(rt)
    try:
        await call(api, "sendMsg", topic="t", msg="cold", delayMillis="600000")
        await call(api, "sendMsg", topic="t", msg="hot", delayMillis="10000")
        samples = await scrape(api)
        assert metric(samples, "delayqueue_queue_size", topic="t", queue="waiting") == 2
        assert metric(samples, "delayqueue_queue_size", topic="t", queue="cold") == 1
        assert 0 < metric(samples, "delayqueue_hot_window_ahead_seconds", topic="t") <= 30
        info = (await call(api, "getTopicInfo", method="get", topic="t"))["data"]
        assert (info["waitingQueueSize"], info["hotWaitingSize"], info["coldWaitingSize"]) == (2, 1, 1)
    finally:
        await loader.close()
        await rt.close()


@pytest.mark.process
@pytest.mark.fault
def test_a_scanner_killed_while_its_loader_works_leaves_nothing_lost_doubled_or_early(scanner_process):
    """SIGKILL of a real run_scanners process while its loader brings 3,000 cold messages in (due
    over 3 s, the window 1 s): the scanner that takes the topic over loads the rest, and every
    message is delivered once, none before its time."""
    window = {"DELAYQUEUE_HOT_WINDOW_MILLIS": "1000"}
    first = scanner_process("loader-a", **window)
    first.wait_started()

    async def run():
        rt = make_runtime(REDIS_URL, hot_window_millis=1000)
        k = rt.ns.topic("k")
        try:
            await send(rt, topic="k", msg="registers the topic", delay=0, msg_id="register")

            async def window_raised():
                return await rt.redis.hexists(k.meta, Meta.HOT_UNTIL)

            await wait_until(window_raised, timeout=20, what="the first scanner's loader to raise the window")
            base = now_millis() + 3000
            sent = await send_messages(rt, requests=[
                SendRequest(topic="k", msg=str(i), trigger_time=base + i) for i in range(3000)])
            assert all(isinstance(m, Message) for m in sent) and (await topic_info(rt, topic="k")).waiting_cold > 2500

            async def loading():
                return await rt.redis.zcard(k.waiting) >= 300

            await wait_until(loading, timeout=20, interval=0.005, what="the loader to be loading")
            first.kill()
            first.proc.wait()
            assert await rt.redis.zcard(k.waiting) < 3000  # killed with some still to load
            second = scanner_process("loader-b", **window)
            await asyncio.to_thread(second.wait_started)
            due = {m.msg_id: m.trigger_time for m in sent}
            delivered, early = [], []

            async def all_delivered():
                pulled, _ = await pull_messages(rt, topic="k", batch=500)
                now = now_millis()
                for m in pulled:
                    delivered.append(m.msg_id)
                    if m.msg_id in due and now < due[m.msg_id]:
                        early.append(m.msg_id)
                if pulled:
                    await ack_messages(rt, topic="k", msg_ids=[m.msg_id for m in pulled])
                return len(set(delivered)) == len(due) + 1

            await wait_until(all_delivered, timeout=40, interval=0.005, what="every message to be delivered")
            assert len(delivered) == len(set(delivered)) == 3001  # once each
            assert early == []
            info = await topic_info(rt, topic="k")
            assert (info.waiting, info.waiting_cold, info.ready, info.consuming) == (0, 0, 0, 0)
        finally:
            await rt.close()

    asyncio.run(run())


async def test_a_message_ten_years_ahead_is_one_log_row_and_nothing_in_redis(cold_rt):
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, msg="far", delay=MAX_DELAY_MILLIS)
        assert m.trigger_time == m.produce_time + MAX_DELAY_MILLIS
        assert await in_redis(rt, m.msg_id) == {"body": False, "waiting": None, "expiry": None}
        assert (await logged("t", m.msg_id))["status"] == Status.WAITING
        assert await get_message(rt, topic="t", msg_id=m.msg_id) == m
    finally:
        await loader.close()


async def test_with_the_message_log_off_a_window_keeps_every_message_in_redis(clean_state):
    """Cold messages live in the log: without it, nothing may be left out of Redis."""
    rt = make_runtime(REDIS_URL, hot_window_millis=1000, message_log=False)
    try:
        assert not rt.config.cold_tier
        await raise_window_to(rt, "t", now_millis() + 1000)
        m = await send(rt, msg="far", delay=60_000)
        assert (await in_redis(rt, m.msg_id))["waiting"] == m.trigger_time
    finally:
        await rt.close()


async def test_a_restore_while_redis_holds_its_data_counts_no_message_redis_holds_as_cold(cold_rt):
    """A restore is safe while the service runs: a message Redis holds due after the loader's
    position (rescheduled beyond the window, so it stayed in Redis) is not counted cold besides."""
    rt = cold_rt
    loader = await started(rt)
    try:
        await raise_window_to(rt, "t", now_millis() + 30_000)
        await send(rt, msg="first", delay=10_000, msg_id="k")
        await reschedule_message(rt, topic="t", msg_id="k", delay_millis=120_000)  # stays in Redis
        far = await send(rt, msg="far", delay=600_000)
        await drain_log(rt, ["t"])
        before = await topic_info(rt, topic="t")
        assert (before.waiting, before.waiting_cold) == (2, 1)
        await restore(rt)
        after = await topic_info(rt, topic="t")
        assert (after.waiting, after.waiting_cold) == (2, 1)
        assert await cold_hours(rt) == hours_of(far)
    finally:
        await loader.close()


async def test_a_restore_of_one_cold_message_the_window_rose_past_counts_it_out_once(cold_rt):
    """The loader has raised the window past a cold message and not yet read it: the admin's
    "Restore selected" of its row brings it into Redis and out of the cold count, and the loader
    then finds it held, so the topic counts it once."""
    rt = cold_rt
    loader = await started(rt)
    try:
        m = await send(rt, delay=60_000)
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        await rt.scripts.call(scripts.raise_hot(rt.context, "t", hot_until=now_millis() + 120_000, loaded_to="",
                                                start=True))
        assert (await restore_rows(rt, rows=[await log_row(rt, m)])).restored == 1
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (1, 0)
        await loader.load_topic("t", force=True)
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (1, 0) and await cold_hours(rt) == {}
    finally:
        await loader.close()


async def log_row(rt, m: Message, topic="t") -> dict:
    """The message's log row as restore_rows takes it (the admin's "Restore selected")."""
    [(row_id,)] = await query("SELECT id FROM delayqueue_message WHERE topic = %s AND msg_id = %s", topic, m.msg_id)
    return {**(await get_message(rt, topic=topic, msg_id=m.msg_id)).to_row(), "id": row_id}


async def test_a_restore_of_one_cold_message_due_in_the_millisecond_the_loader_stopped_in_counts_it_out(cold_rt):
    """The loader's position ends after a row (its id) in the millisecond another, cold, is due in:
    "Restore selected" of that one counts it out of the cold count, as one due a millisecond later."""
    rt = cold_rt
    loader = await started(rt)
    try:
        due = now_millis() + 60_000
        first, second = [await send(rt, trigger_time=due) for _ in range(2)]
        await rt.scripts.call(scripts.raise_hot(rt.context, "t", hot_until=due + 60_000, loaded_to="", start=True))
        first_row = await log_row(rt, first)
        assert (await restore_rows(rt, rows=[first_row])).restored == 1  # as a load of a page ending with it
        await rt.redis.hset(rt.ns.topic("t").meta, Meta.LOADED_TO, position(due, first_row["id"]))
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        assert (await restore_rows(rt, rows=[await log_row(rt, second)])).restored == 1
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (2, 0)
    finally:
        await loader.close()
