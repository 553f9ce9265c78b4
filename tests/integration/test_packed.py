"""The cold tier's packed lists (lua/includes/packed.lua): a waiting message due more than twice the
pack lead ahead, between the loader's loaded_to and fetched_to, waits in a list of its second of
due time instead of the waiting set; the scanner moves each list in a lead before its second, and
the message fires on time, never early. Until then the API treats it as cold (the message log
answers for it): getMsg, deleteMsg, rescheduleMsg, a resend of its msgId, purgeTopic, a
restore after Redis lost everything, and one of a single message (out of its list). A sharded
topic packs in its current shard count's shards; a count it gives up moves its lists into its
waiting set before the change is saved, and is not retired while it holds one; a msgId that
ended there and is sent again is found in its new life.
On a single Redis and on the Redis Cluster."""
import asyncio

import pytest

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import COLD_HOUR_MILLIS, Status
from delayqueue.core.exceptions import CapReached
from delayqueue.live import scripts
from delayqueue.live.keys import Meta, Shard
from delayqueue.live.shards import shard_of, topic_shards
from delayqueue.ops import figures
from delayqueue.services.consume import ack_messages, pull_messages
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, prepared, send_message
from delayqueue.services.topic_control import set_topic_config
from delayqueue.services.topics import purge_topic, topic_config, topic_info
from delayqueue.workers import loader as loader_module
from delayqueue.workers import scanner as scanner_module
from delayqueue.workers.loader import Loader, loaded_messages
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, drain_log, load_killed, logged, make_runtime, packed_ids,
                           unsharded_calls, wait_until)
from tests.integration.test_cold_tier import redis_answers_for_what_it_ended

LEAD = 300  # ms: a send due more than 600 ms ahead is packed
WINDOW = 60_000


@pytest.fixture(params=["single", "cluster"])
async def packed_rt(request, clean_state):
    url = REDIS_URL if request.param == "single" else REDIS_CLUSTER_URL
    runtime = make_runtime(url, hot_window_millis=WINDOW, pack_lead_millis=LEAD)
    yield runtime
    await runtime.close()


async def send(rt, delay, msg="body", **kw):
    return await send_message(rt, request=SendRequest(topic="t", msg=msg, delay_millis=delay, **kw))


async def packed_count(rt, topic="t") -> int:
    k = rt.ns.topic(topic)
    return sum([await rt.redis.llen(f"{k.packed}:{second}") for second in await rt.redis.zrange(k.packed, 0, -1)])


async def held(rt, msg_id, topic="t") -> bool:
    return await rt.redis.hexists(rt.ns.topic(topic).msgs, msg_id)


async def windowed(rt) -> Loader:
    """A loader that has raised the topic's window once: sends due within it may be packed."""
    loader = Loader(rt, lambda: [Shard("t")])
    await loader.load_topic("t", force=True)
    assert await rt.redis.hget(rt.ns.topic("t").meta, Meta.FETCHED_TO)
    return loader


async def scanned_with_window(rt, start_scanner) -> None:
    """Topic "t" registered (its first message sent and pulled), a scanner running, and the topic
    given a window by its loader: sends due ahead may be packed."""
    await send(rt, 0, msg="registers the topic")
    await start_scanner(rt)
    await wait_until(lambda: rt.redis.hexists(rt.ns.topic("t").meta, Meta.FETCHED_TO), timeout=10,
                     what="the scanner's loader to raise the window")
    await pull_messages(rt, topic="t")


async def test_a_send_due_ahead_is_packed_and_fires_on_time_not_early(packed_rt, start_scanner):
    rt = packed_rt
    await scanned_with_window(rt, start_scanner)
    near = await send(rt, 2 * LEAD - 100, msg="near")  # too near to pack
    m = await send(rt, 1500, msg="packed ✓\nbody", priority=3, max_retry=7)
    assert await held(rt, near.msg_id) and not await held(rt, m.msg_id)
    assert await packed_count(rt) == 1
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (2, 1)
    assert await get_message(rt, topic="t", msg_id=m.msg_id) == m  # from the message log

    pulled = []

    async def fired():
        pulled.extend((await pull_messages(rt, topic="t", batch=10))[0])
        return m.msg_id in [p.msg_id for p in pulled]

    await wait_until(fired, timeout=10, interval=0.005, what="the packed message to fire")
    assert now_millis() >= m.trigger_time
    got = next(p for p in pulled if p.msg_id == m.msg_id)
    assert (got.payload, got.priority, got.max_retry, got.retry, got.trigger_time, got.expire_time) == (
        "packed ✓\nbody", 3, 7, 1, m.trigger_time, m.expire_time)
    assert await packed_count(rt) == 0 and (await topic_info(rt, topic="t")).waiting_cold == 0


async def packed_counted(rt, topic="t") -> int:
    """The meta's count of packed entries, and what the loader counts against DELAYQUEUE_HOT_MAX_MESSAGES."""
    held_in_redis, _, _ = await Loader(rt, lambda: [Shard(topic)])._look([Shard(topic)], [Shard(topic)])
    assert held_in_redis == await rt.redis.zcard(rt.ns.topic(topic).waiting) + await packed_count(rt, topic)
    return int(await rt.redis.hget(rt.ns.topic(topic).meta, Meta.PACKED) or 0)


async def test_delete_reschedule_and_resend_of_a_packed_message_act_on_it_once(packed_rt):
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    deleted, moved, kept = [await send(rt, 30_000, msg=f"m{i}", msg_id=f"id-{i}") for i in range(3)]
    assert await packed_count(rt) == 3 and not any([await held(rt, m.msg_id) for m in (deleted, moved, kept)])
    assert await packed_counted(rt) == 3

    assert await delete_message(rt, topic="t", msg_id=deleted.msg_id)
    assert (await get_message(rt, topic="t", msg_id=deleted.msg_id)).status == Status.DELETED
    later = await reschedule_message(rt, topic="t", msg_id=moved.msg_id, delay_millis=40_000)
    assert later.trigger_time > moved.trigger_time and await held(rt, moved.msg_id)  # in the waiting set now
    assert await rt.redis.zscore(rt.ns.topic("t").waiting, moved.msg_id) == later.trigger_time
    assert await packed_count(rt) == 1 == await packed_counted(rt)  # only `kept` is left packed

    again = await send(rt, 5_000, msg="a resend", msg_id=kept.msg_id)
    assert again == kept and await packed_count(rt) == 1  # the packed message answered, nothing sent
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (2, 1)  # moved (in the waiting set) and kept (packed)


async def test_the_loader_packs_what_comes_in_early_and_nothing_is_lost_or_doubled(packed_rt, start_scanner,
                                                                                   monkeypatch):
    """Messages sent cold (beyond a 2 s window) are packed by the loader as the window reaches them,
    moved in by the scanner and fire once each, in due order, none early."""
    monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)  # their sends are done: packed however young
    rt = make_runtime(packed_rt.config.redis_url, hot_window_millis=2_000, pack_lead_millis=LEAD)
    try:
        await send(rt, 0)
        await windowed(rt)
        await pull_messages(rt, topic="t")
        sent = [await send(rt, 2_500 + 40 * i, msg=f"m{i}") for i in range(20)]
        assert not any([await held(rt, m.msg_id) for m in sent]) and await packed_count(rt) == 0  # cold
        await start_scanner(rt)
        await wait_until(lambda: packed_count(rt), timeout=10, what="the loader to pack the cold messages")
        pulled = []

        async def all_fired():
            for p in (await pull_messages(rt, topic="t", batch=100))[0]:
                assert now_millis() >= p.trigger_time
                pulled.append(p.msg_id)
            return len(pulled) >= len(sent)

        await wait_until(all_fired, timeout=15, interval=0.005, what="every message to fire")
        await asyncio.sleep(0.2)
        pulled += [p.msg_id for p in (await pull_messages(rt, topic="t", batch=100))[0]]
        assert pulled == [m.msg_id for m in sent]
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (0, 0)
    finally:
        await rt.close()


async def test_purge_drops_the_packed_messages(packed_rt):
    rt = packed_rt
    await send(rt, 0)
    loader = await windowed(rt)
    packed = [await send(rt, 30_000 + i) for i in range(3)]
    assert await packed_count(rt) == 3
    assert await purge_topic(rt, topic="t") == 4
    assert await packed_count(rt) == 0 and not await rt.redis.exists(rt.ns.topic("t").packed)
    await drain_log(rt, ["t"])
    for m in packed:  # deleted in the log, as a cold message is; getMsg answers it from there
        assert (await logged("t", m.msg_id))["status"] == Status.DELETED
        assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (0, 0)
    assert await loader.load_topic("t", force=True) == 0 and await packed_count(rt) == 0  # nothing comes back


async def test_a_restore_after_redis_lost_everything_brings_packed_messages_back_once(packed_rt):
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    packed = [await send(rt, 30_000 + i) for i in range(3)]
    assert await packed_count(rt) == 3
    await rt.redis.flushall()
    counts = await restore(rt)
    assert (counts.restored, counts.left_cold) == (4, 0) and all([await held(rt, m.msg_id) for m in packed])
    assert (await restore(rt)).restored == 0  # a rerun: nothing twice
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.ready, info.waiting_cold) == (3, 1, 0)


async def test_a_restore_on_a_redis_that_holds_packed_lists_brings_their_messages_back_once(packed_rt,
                                                                                             start_scanner):
    """The restore brings back every row up to the loader's fetched_to, so the packed ones too; the
    scanner then finds each held and leaves its entry: each fires once."""
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    await pull_messages(rt, topic="t")
    packed = [await send(rt, 1_500 + i) for i in range(3)]
    counts = await restore(rt)
    assert (counts.restored, counts.left_cold) == (3, 0) and all([await held(rt, m.msg_id) for m in packed])
    assert await packed_count(rt) == 3  # left for the scanner, which finds them held
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (3, 0)
    await start_scanner(rt)
    pulled = []

    async def all_fired():
        pulled.extend(p.msg_id for p in (await pull_messages(rt, topic="t", batch=10))[0])
        return len(pulled) >= 3

    await wait_until(all_fired, timeout=10, interval=0.005, what="the restored messages to fire")
    await asyncio.sleep(0.3)
    pulled += [p.msg_id for p in (await pull_messages(rt, topic="t", batch=10))[0]]
    assert pulled == [m.msg_id for m in packed] and await packed_count(rt) == 0
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (0, 0)


async def test_a_restore_of_one_packed_message_takes_it_out_of_its_list_and_the_cold_count(packed_rt,
                                                                                          start_scanner):
    """`restore --msg-id` of a packed message (its row is before the loader's fetched_to) brings it
    into the waiting set, out of its list and of the cold count: the topic counts it once, and one
    then deleted with its body released does not come back when its second's list moves in."""
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    await pull_messages(rt, topic="t")
    restored, deleted, kept = [await send(rt, 1_500 + i) for i in range(3)]
    for m in (restored, deleted):
        assert (await restore(rt, msg_id=m.msg_id)).restored == 1 and await held(rt, m.msg_id)
    assert await packed_count(rt) == 1 == await packed_counted(rt)  # only `kept` is left packed
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (3, 1)
    assert await delete_message(rt, topic="t", msg_id=deleted.msg_id, release=True)
    assert (await topic_info(rt, topic="t")).waiting == 2
    await start_scanner(rt)
    assert sorted(await pull_until(rt, "t", 2, timeout=10)) == sorted([restored.msg_id, kept.msg_id])
    assert await packed_count(rt) == 0
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (0, 0)


async def test_a_message_deleted_with_release_after_a_restore_left_its_entry_packed_stays_deleted(packed_rt,
                                                                                                  start_scanner):
    """A restore of the topic brings packed messages back and leaves their entries to the scanner,
    which finds each msgId held: one deleted meanwhile with its body released (Redis holds only its
    tombstone in `released`) is not brought back by its entry."""
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    await pull_messages(rt, topic="t")
    deleted, kept = [await send(rt, 1_500 + i) for i in range(2)]
    assert (await restore(rt, topic="t")).restored == 2 and await packed_count(rt) == 2
    assert await delete_message(rt, topic="t", msg_id=deleted.msg_id, release=True)
    assert not await held(rt, deleted.msg_id)
    await start_scanner(rt)
    assert await pull_until(rt, "t", 1, timeout=10) == [kept.msg_id]
    assert await packed_count(rt) == 0
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.waiting_cold) == (0, 0)


async def test_a_page_read_before_a_release_ended_its_row_does_not_bring_the_message_back(packed_rt):
    """A loader reads a page while a message Redis holds after loaded_to (due too near to pack) is
    live in the log; deleteMsg with release then ends its row and frees its body: the page's load,
    refused by nothing else, leaves the life Redis released (its tombstone in `released`)."""
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    m = await send(rt, LEAD)  # due too near to pack: in the waiting set, after loaded_to
    assert await held(rt, m.msg_id)
    page = loaded_messages("t", [(1, m.msg_id, m.payload, m.produce_time, m.trigger_time, m.expire_time, m.max_retry,
                                  m.retry, Status.WAITING, m.priority)])
    assert await delete_message(rt, topic="t", msg_id=m.msg_id, release=True)
    fetched = await rt.redis.hget(rt.ns.topic("t").meta, Meta.FETCHED_TO)
    reply = await rt.scripts.call(scripts.load_cold(rt.context, "t", loaded_from=fetched, loaded_to=fetched,
                                                    pack_lead=LEAD, in_flight_millis=0, messages=page))
    assert (reply.loaded, reply.held) == (0, 1) and not await held(rt, m.msg_id)
    assert (await topic_info(rt, topic="t")).waiting == 0



async def test_a_send_the_loader_reads_before_its_script_runs_is_held_once(packed_rt):
    """The send's log row is committed, the loader raises the window, reads the row and loads it
    before the send's script runs (which then finds it due within the window): it is held once,
    and fires once even if its list moves in late."""
    rt = packed_rt
    await send(rt, 0)
    loader = await windowed(rt)
    await pull_messages(rt, topic="t")
    try:
        row = prepared(rt, SendRequest(topic="t", msg="x", delay_millis=WINDOW + 1_000), now_millis(), {})
        await rt.log.record([row])
        await rt.scripts.call(scripts.raise_hot(rt.context, "t", hot_until=now_millis() + 2 * WINDOW, loaded_to="",
                                                start=True))
        assert await loader.load_topic("t", force=True) == 1
        [(call, _)] = unsharded_calls(rt, [row])
        [reply] = await rt.scripts.call(call)
        assert reply.created or reply.stored == row
        assert await packed_count(rt) + await rt.redis.zcard(rt.ns.topic("t").waiting) == 1
        assert (await topic_info(rt, topic="t")).waiting == 1
    finally:
        await loader.close()

@pytest.mark.parametrize("killed_after", ["raise", "first page"])
async def test_a_loader_killed_between_its_steps_packs_each_message_once(packed_rt, monkeypatch, killed_after):
    rt = packed_rt
    monkeypatch.setattr(loader_module, "PAGE", 2)
    monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)  # their sends are done: packed however young
    await send(rt, 0)
    first = await windowed(rt)
    sent = [await send(rt, WINDOW + 20_000 + i, msg_id=f"{i:032x}" if i % 2 else f"client-id-{i}") for i in range(5)]
    assert await packed_count(rt) == 0  # beyond the window: cold
    await rt.scripts.call(scripts.raise_hot(rt.context, "t", hot_until=now_millis() + 2 * WINDOW, loaded_to="",
                                            start=True))
    await load_killed(rt, first, killed_after)
    held = await packed_count(rt)
    assert held == (0 if killed_after == "raise" else 2)
    second = Loader(rt, lambda: [Shard("t")])
    try:
        assert await second.load_topic("t", force=True) == 5 - held
        assert await packed_ids(rt) == [m.msg_id for m in sent]
        assert await packed_counted(rt) == 5 and (await topic_info(rt, topic="t")).waiting_cold == 5
    finally:
        await first.close()
        await second.close()


async def test_get_topic_info_buckets_a_packed_message_near_its_due_time(packed_rt):
    """Packed messages count as cold, by the hour they fall due in, placed no earlier than the
    loader's loaded_to (not after the window, 7 h here, beyond which no packed message is due)."""
    rt = make_runtime(packed_rt.config.redis_url, hot_window_millis=7 * 3_600_000, pack_lead_millis=LEAD)
    try:
        await send(rt, 0)
        await windowed(rt)
        await send(rt, 30_000)
        assert await packed_count(rt) == 1
        info = await topic_info(rt, topic="t")
        assert (info.waiting, info.waiting_cold) == (1, 1) and sum(info.waiting_within[:4]) == 1  # within the hour
    finally:
        await rt.close()


async def in_shard(rt, topic: str, msg_id: str, count: int) -> tuple[bool, bool]:
    """Whether the msgId's shard of `count` holds it in its body hash, and in its packed lists."""
    shard = shard_of(topic, msg_id, count)
    return await rt.redis.hexists(rt.ns.topic(shard).msgs, msg_id), msg_id in await packed_ids(rt, shard)


async def test_a_sharded_topics_sends_are_packed_in_their_shards_and_reached_by_msg_id(packed_rt, monkeypatch):
    rt = packed_rt
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    await set_topic_config(rt, topic="s", changes={"shards": 3}, limits={})
    loader = Loader(rt, lambda: [Shard("s", 3, 0)])
    try:
        await loader.load_topic("s", force=True)  # every shard gets a window, and sends may be packed
    finally:
        await loader.close()
    sent = [await send_message(rt, request=SendRequest("s", f"m{i}", msg_id=f"s-{i}", delay_millis=30_000))
            for i in range(9)]
    for m in sent:
        assert await in_shard(rt, "s", m.msg_id, 3) == (False, True)
    assert len({shard_of("s", m.msg_id, 3) for m in sent}) == 3
    info = await topic_info(rt, topic="s")
    assert (info.waiting, info.waiting_cold) == (9, 9)
    deleted, moved, resent = sent[:3]

    assert await get_message(rt, topic="s", msg_id=resent.msg_id) == resent  # from the message log
    assert await delete_message(rt, topic="s", msg_id=deleted.msg_id)
    assert (await get_message(rt, topic="s", msg_id=deleted.msg_id)).status == Status.DELETED
    assert (await in_shard(rt, "s", deleted.msg_id, 3))[1] is False
    later = await reschedule_message(rt, topic="s", msg_id=moved.msg_id, delay_millis=40_000)
    assert await in_shard(rt, "s", moved.msg_id, 3) == (True, False)  # in its shard's waiting set now
    assert await rt.redis.zscore(rt.ns.topic(shard_of("s", moved.msg_id, 3)).waiting,
                                 moved.msg_id) == later.trigger_time
    again = await send_message(rt, request=SendRequest("s", "a resend", msg_id=resent.msg_id, delay_millis=5_000))
    assert again == resent and (await packed_ids(rt, shard_of("s", resent.msg_id, 3))).count(resent.msg_id) == 1
    info = await topic_info(rt, topic="s")
    assert (info.waiting, info.waiting_cold) == (8, 7)


async def pull_until(rt, topic: str, expected: int, timeout: float = 15) -> list:
    """Pulls until `expected` messages came (each checked not early), then a little longer: any
    doubled would come too."""
    pulled = []

    async def all_fired():
        for p in (await pull_messages(rt, topic=topic, batch=100))[0]:
            assert now_millis() >= p.trigger_time
            pulled.append(p.msg_id)
        return len(pulled) >= expected

    await wait_until(all_fired, timeout=timeout, interval=0.005, what=f"{expected} messages to fire")
    await asyncio.sleep(0.3)
    return pulled + [p.msg_id for p in (await pull_messages(rt, topic=topic, batch=100))[0]]


async def test_a_sharded_topics_packed_messages_fire_once_and_on_time(packed_rt, start_scanner, monkeypatch):
    rt = packed_rt
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    await set_topic_config(rt, topic="s", changes={"shards": 3}, limits={})
    await send_message(rt, request=SendRequest("s", "registers the topic"))
    await start_scanner(rt)

    async def windowed_shards():
        return all([await rt.redis.hexists(rt.ns.topic(shard).meta, Meta.FETCHED_TO)
                    for shard in topic_shards("s", (3,))])

    await wait_until(windowed_shards, timeout=10, what="the loader to give every shard a window")
    await pull_messages(rt, topic="s", batch=10)
    sent, where = [], []
    for i in range(12):  # each looked at as sent: a loaded machine may be near its unpacking 2.7 s later
        sent.append(await send_message(rt, request=SendRequest("s", f"m{i}", delay_millis=3_000 + 20 * i)))
        where.append(await in_shard(rt, "s", sent[-1].msg_id, 3))
    assert where == [(False, True)] * 12
    pulled = await pull_until(rt, "s", 12)
    assert sorted(pulled) == sorted(m.msg_id for m in sent)
    info = await topic_info(rt, topic="s")
    assert (info.waiting, info.waiting_cold) == (0, 0)


async def load_one(rt, msg_id: str, due: int) -> scripts.LoadReply:
    """load_cold.lua bringing one message of topic "t", due at `due`, in after its fetched_to, as a
    loader that read it from the log would (whatever the settings it last read say)."""
    fetched = await rt.redis.hget(rt.ns.topic("t").meta, Meta.FETCHED_TO)
    rows = loaded_messages("t", [(1, msg_id, "x", due - 1, due, due + 60_000, 3, 0, Status.WAITING, 0)])
    return await rt.scripts.call(scripts.load_cold(rt.context, "t", loaded_from=fetched, loaded_to=f"{due}:1",
                                                   pack_lead=LEAD, in_flight_millis=0, messages=rows))


async def test_a_packed_message_moved_in_after_its_time_counts_as_promoted_and_late(packed_rt):
    """A list the scanner moves in late (it was down) makes its messages ready at once: counted as
    promotions, in triggerMsgReady and the fire-lateness histogram."""
    rt = packed_rt
    await send(rt, 0, msg="registers the topic")
    loader = await windowed(rt)
    try:
        due = now_millis() + 10 * LEAD  # well past twice the lead when it is loaded: packed
        assert (await load_one(rt, "late-1", due)).packed == 1
        await asyncio.sleep((due + 600 - now_millis()) / 1000)  # over half a second late: no scanner runs
        assert (await rt.scripts.call(scripts.unpack_due(rt.context, "t"))).count == 1
        [overview] = await figures.topic_overview(rt, topics=["t"])
        assert overview["ready"] == 2 and overview["totals"]["triggerMsgReady"] == 1
        assert overview["lateness_count"] == 1 and dict(overview["lateness_buckets"])[500] == 0
    finally:
        await loader.close()


async def test_a_packed_message_whose_send_died_before_its_script_is_not_counted_out(packed_rt):
    """A message whose send died between its log row and its script, which nothing counted cold, is
    loaded and packed, then counted out as its list moves in: the count must not fall below the
    messages still cold (it fell one short of them; to -1 with none)."""
    rt = packed_rt
    await send(rt, 0, msg="registers the topic")
    loader = await windowed(rt)
    try:
        far = await send(rt, 2 * COLD_HOUR_MILLIS, msg="far")  # cold, counted, due in another hour
        due = now_millis() + 10 * LEAD
        assert (await load_one(rt, "died", due)).packed == 1
        await asyncio.sleep(max(due - LEAD - now_millis(), 0) / 1000)
        assert (await rt.scripts.call(scripts.unpack_due(rt.context, "t"))).count == 1
        assert (await topic_info(rt, topic="t")).waiting_cold == 1
        hours = await rt.redis.hgetall(rt.ns.topic("t").cold_hours)
        assert {int(hour): int(n) for hour, n in hours.items()} == {far.trigger_time // COLD_HOUR_MILLIS: 1}
    finally:
        await loader.close()


async def test_a_count_given_up_moves_its_packed_messages_in_at_once(packed_rt, start_scanner):
    """A topic sharded while messages wait packed in its own keys (its count of 1): setTopicConfig
    moves every list of that count into its waiting set, where a lookup by msgId finds them; they
    fire there, once and on time. A loader that has not yet read the change packs nothing there.
    A scanner batch of 2 makes the move take more than one call."""
    rt = make_runtime(packed_rt.config.redis_url, hot_window_millis=WINDOW, pack_lead_millis=LEAD, scanner_batch=2)
    try:
        await scanned_with_window(rt, start_scanner)
        deleted, moved, kept = [await send(rt, 3_000, msg=f"m{i}") for i in range(3)]
        assert await packed_count(rt) == 3
        await set_topic_config(rt, topic="t", changes={"shards": 2}, limits={})
        assert await packed_count(rt) == 0  # moved in before the change was saved
        assert [await held(rt, m.msg_id) for m in (deleted, moved, kept)] == [True] * 3
        assert await get_message(rt, topic="t", msg_id=kept.msg_id) == kept
        assert await delete_message(rt, topic="t", msg_id=deleted.msg_id)
        later = await reschedule_message(rt, topic="t", msg_id=moved.msg_id, delay_millis=3_500)

        k = rt.ns.topic("t")
        assert await rt.redis.hget(k.meta, Meta.LOADED_TO) == await rt.redis.hget(k.meta, Meta.FETCHED_TO)
        reply = await load_one(rt, "stale-1", now_millis() + 30_000)
        assert (reply.loaded, reply.packed) == (1, 0) and await held(rt, "stale-1") and await packed_count(rt) == 0

        pulled = await pull_until(rt, "t", 2)
        assert pulled == [kept.msg_id, moved.msg_id] and later.trigger_time > kept.trigger_time
    finally:
        await rt.close()


async def test_a_drained_count_is_not_retired_while_it_holds_packed_lists(packed_rt, start_scanner, monkeypatch):
    """A count given up whose shard holds a packed list (packed there by a loader of a version
    before the draining mark) is retired only once the list is out: its message fires first."""
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 300)
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 300)
    rt = packed_rt
    first = await send(rt, 0, msg="registers the topic")
    await windowed(rt)
    assert await delete_message(rt, topic="t", msg_id=first.msg_id, release=True)  # count 1 holds nothing else
    await set_topic_config(rt, topic="t", changes={"shards": 2}, limits={})
    await rt.redis.hdel(rt.ns.topic("t").meta, Meta.DRAINING)
    # Due well after the checks below (its list moves in a lead before it), however slow the scanner's start.
    assert (await load_one(rt, "late-1", now_millis() + 5_000)).packed == 1
    await start_scanner(rt)
    await asyncio.sleep(1.5)  # well past the settling: an empty count would have retired
    assert (await topic_config(rt, topic="t")).draining_shards == (1,) and await packed_count(rt) == 1
    assert await pull_until(rt, "t", 1) == ["late-1"]


async def test_a_count_change_the_log_refuses_leaves_the_count_packing(packed_rt):
    """setTopicConfig moves the lists in before it saves the change; refused (here over
    DELAYQUEUE_MAX_TOPIC_CONFIGS), it marks the count current again: its loader packs again."""
    rt = make_runtime(packed_rt.config.redis_url, hot_window_millis=WINDOW, pack_lead_millis=LEAD,
                      max_topic_configs=1)
    try:
        await set_topic_config(rt, topic="other", changes={"max_retry": 3}, limits={})  # the one config allowed
        await send(rt, 0)
        await windowed(rt)
        m = await send(rt, 30_000)
        assert await packed_count(rt) == 1
        with pytest.raises(CapReached):
            await set_topic_config(rt, topic="t", changes={"shards": 2}, limits={})
        assert (await topic_config(rt, topic="t")).shards == 1
        assert await held(rt, m.msg_id) and await packed_count(rt) == 0  # moved in all the same
        assert await rt.redis.hget(rt.ns.topic("t").meta, Meta.DRAINING) == "0"
        assert (await load_one(rt, "next-1", now_millis() + 30_000)).packed == 1
        assert await packed_ids(rt) == ["next-1"]
    finally:
        await rt.close()


async def test_a_msg_id_sent_again_after_it_ended_in_a_count_given_up_is_found_in_its_new_life(
        packed_rt, start_scanner, monkeypatch):
    """With a dedupe window shorter than the retention, a msgId whose message ended in a count the
    topic gave up, which keeps its ended body, starts a new life: getMsg, deleteMsg and rescheduleMsg
    reach that life (not the ended one) wherever it waits, packed or cold; the loader brings the cold
    one in (it did not leave it out as held), and each fires once."""
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    rt, ahead = [make_runtime(packed_rt.config.redis_url, hot_window_millis=window, pack_lead_millis=LEAD,
                              dedupe_window_millis=0, ended_retention_millis=600_000) for window in (WINDOW, 300_000)]
    try:
        first = [await send(rt, 0, msg=f"first {i}", msg_id=f"again-{i}") for i in range(4)]
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert await ack_messages(rt, topic="t", msg_ids=[m.msg_id for m in pulled]) and len(pulled) == 4
        await drain_log(rt, ["t"])  # the log has them acked: a send under their msgIds starts a new life
        await set_topic_config(rt, topic="t", changes={"shards": 3}, limits={})
        loader = Loader(rt, lambda: [Shard("t", 3, 0)])
        try:
            await loader.load_topic("t", force=True)  # count 3's shards get a window: sends may be packed
        finally:
            await loader.close()
        got, deleted, moved = [await send(rt, 1_500, msg=f"second {m.msg_id}", msg_id=m.msg_id) for m in first[:3]]
        cold = await send(rt, WINDOW + 30_000, msg="second, beyond the window", msg_id=first[3].msg_id)
        for m in (got, deleted, moved, cold):
            assert await get_message(rt, topic="t", msg_id=m.msg_id) == m
        assert await delete_message(rt, topic="t", msg_id=deleted.msg_id)
        assert (await get_message(rt, topic="t", msg_id=deleted.msg_id)).status == Status.DELETED
        later = await reschedule_message(rt, topic="t", msg_id=moved.msg_id, delay_millis=2_000)
        assert later.payload == moved.payload and later.trigger_time > got.trigger_time
        monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)
        loader = Loader(ahead, lambda: [Shard("t", 3, 0)])
        try:  # the cold one comes in, not left out as one the old count holds
            assert await loader.load_topic("t", force=True) == 1
        finally:
            await loader.close()
        assert cold.msg_id in await packed_ids(rt, shard_of("t", cold.msg_id, 3))
        await start_scanner(rt)
        assert await pull_until(rt, "t", 2) == [got.msg_id, moved.msg_id]
    finally:
        await rt.close()
        await ahead.close()


async def test_a_count_taken_up_again_while_it_drains_packs_nothing_until_every_process_reads_it(
        packed_rt, start_scanner, monkeypatch):
    """1 -> 3 -> 1 shards: count 1, taken up again while it drains, keeps its window. Were its sends
    packed at once, a process that has not yet read the change (count 3 current, 1 draining) would
    find no shard holding the msgId and go to count 3, missing the entry in count 1's list. Its
    loaded_to met its fetched_to as it drained: it packs nothing until its loader reads ahead again,
    after the reshard settles, and its sends wait in its waiting set, where every process finds them."""
    rt = packed_rt
    await scanned_with_window(rt, start_scanner)
    stale = make_runtime(rt.config.redis_url, hot_window_millis=WINDOW, pack_lead_millis=LEAD)
    try:
        await set_topic_config(rt, topic="t", changes={"shards": 3}, limits={})
        before = dict(await stale.topic_configs.fresh())  # count 3 current, count 1 draining
        await set_topic_config(rt, topic="t", changes={"shards": 1}, limits={})

        async def stale_table():
            return before

        monkeypatch.setattr(stale.topic_configs, "table", stale_table)
        deleted, moved, kept = [await send(rt, 1_500, msg=f"m{i}", msg_id=f"back-{i}") for i in range(3)]
        assert await packed_count(rt) == 0 and all([await held(rt, m.msg_id) for m in (deleted, moved, kept)])
        assert await delete_message(stale, topic="t", msg_id=deleted.msg_id)
        later = await reschedule_message(stale, topic="t", msg_id=moved.msg_id, delay_millis=2_000)
        assert await send_message(stale, request=SendRequest("t", "a resend", msg_id=kept.msg_id)) == kept
        pulled = await pull_until(rt, "t", 2)
        assert pulled == [kept.msg_id, moved.msg_id] and later.trigger_time > kept.trigger_time
    finally:
        await stale.close()


async def test_a_near_message_redis_ended_before_the_log_caught_up_is_not_taken_for_a_packed_one(packed_rt):
    """A send due within twice the lead goes into the waiting set, though it is after loaded_to,
    where packed messages wait too. Deleted with its body released, and the log not yet told, its
    waiting row is Redis' to answer for: not found, and a resend starts a new life (taken for a
    packed one, the resend was swallowed as its duplicate and lost, and a reschedule brought the
    deleted message back)."""
    rt = packed_rt
    await send(rt, 0)
    await windowed(rt)
    first = await send(rt, 2 * LEAD - 100, msg="first", msg_id="k")  # too near to pack
    assert await held(rt, "k") and first.trigger_time > int((await rt.redis.hget(
        rt.ns.topic("t").meta, Meta.LOADED_TO)).split(":")[0])
    # Deleted in Redis with its body released, and no word of it in the log yet (as when PostgreSQL
    # was down at the delete, which then leaves the end to the log writer, and the body's retention
    # passed before the writer caught up).
    assert await rt.scripts.call(scripts.delete(rt.context, "t", msg_id="k", release=True)) == 3
    assert await rt.scripts.call(scripts.delete(rt.context, "t", msg_id="k", release=True)) == 0
    await redis_answers_for_what_it_ended(rt, "k", Status.WAITING)
    assert not await held(rt, "k")  # not brought back by the reschedule
    again = await send(rt, 2 * LEAD - 100, msg="second", msg_id="k")
    assert (again.payload, again.produce_time > first.produce_time) == ("second", True)
    assert (await get_message(rt, topic="t", msg_id="k")).payload == "second"
    assert (await topic_info(rt, topic="t")).waiting_cold == 0
