"""Sharded topics (live/shards.py): one topic's messages over many key sets, each in a slot of its
own, on the single Redis and on the 3-master Cluster."""
import asyncio
import contextlib
import dataclasses
import functools
import random
import signal
import time
from collections import Counter

import pytest
from asgiref.sync import sync_to_async
from redis.asyncio.cluster import RedisCluster

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import COLD_HOUR_MILLIS, Reason, Status
from delayqueue.core.exceptions import Conflict, Throttled
from delayqueue.live import keys, scripts, stats
from delayqueue.live.keys import Meta, Shard
from delayqueue.live.shards import shard_of, topic_shards
from delayqueue.messagelog import sql
from delayqueue.ops.figures import live_state, topic_overview
from delayqueue.services import consume as consume_module
from delayqueue.services.consume import (Pull, ack_message, ack_messages, long_poll_messages, nack_message, pull_many,
                                         pull_messages,
                                         touch_message)
from delayqueue.services.dead_letters import create_redrive, dead_letters, redrive_state
from delayqueue.services.messages import delete_message, get_message, redis_millis, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, prepared, send_message, send_messages
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import monitor_data, purge_topic, topic_config, topic_info
from delayqueue.stores.rows import forget_drained_shards
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.workers import loader as loader_module
from delayqueue.workers import scanner as scanner_module
from delayqueue.workers import topic_worker as topic_worker_module
from delayqueue.workers.loader import Loader
from tests.helpers import REDIS_CLUSTER_URL, REDIS_URL, call, logged, make_runtime, packed_ids, query, wait_until
from tests.integration.test_limits import set_limits_now


def msg_id_in(topic: str, count: int, index: int, prefix: str) -> str:
    """A msgId whose shard of `count` is `index`."""
    return next(f"{prefix}-{n}" for n in range(10_000) if shard_of(topic, f"{prefix}-{n}", count).index == index)


async def shard_topic(rt, topic: str, shards: int, **changes) -> None:
    await set_topic_config(rt, topic=topic, changes={"shards": shards, **changes}, limits={})


async def held_per_shard(rt, topic: str, counts: tuple[int, ...]) -> dict[Shard, int]:
    """Messages (live or ended) each shard's body hash holds."""
    return {shard: await rt.redis.hlen(rt.ns.topic(shard).msgs) for shard in topic_shards(topic, counts)}


async def pull_all(rt, topic: str, expected: int, batch: int = 10, timeout: float = 10) -> list:
    pulled = []
    deadline = time.monotonic() + timeout
    while len(pulled) < expected and time.monotonic() < deadline:
        messages, _ = await pull_messages(rt, topic=topic, batch=batch)
        pulled += messages
        if not messages:
            await asyncio.sleep(0.02)
    return pulled


async def test_a_sharded_topic_has_keys_on_every_master_of_the_cluster(clean_state):
    rt = make_runtime(REDIS_CLUSTER_URL)
    try:
        assert isinstance(rt.redis, RedisCluster)
        await shard_topic(rt, "spread", 3)
        await send_messages(rt, requests=[SendRequest("spread", f"m{i}", msg_id=f"m{i}") for i in range(90)])
        held = await held_per_shard(rt, "spread", (3,))
        assert all(n > 10 for n in held.values()) and sum(held.values()) == 90, held
        masters = {rt.redis.get_node_from_key(rt.ns.topic(shard).msgs).name for shard in held}
        assert len(masters) == 3 == len(rt.redis.get_primaries())
        assert await rt.redis.hlen(rt.ns.topic("spread").msgs) == 0  # nothing in the topic's own keys
    finally:
        await rt.close()


async def test_a_shard_count_is_placed_over_the_masters_as_they_own_the_slots(clean_state):
    """setTopicConfig on a cluster keeps, per shard, a slot range of one master, the masters
    taking the shards in turn; another process reads it with the settings and finds the same keys."""
    rt = make_runtime(REDIS_CLUSTER_URL)
    try:
        await shard_topic(rt, "placed", 4)
        [placement] = await query("SELECT shard_placement FROM delayqueue_topicconfig WHERE topic = 'placed'")
        ranges = placement[0]["4"]
        masters = [rt.redis.get_node_from_key(rt.ns.topic(Shard("placed", 4, i)).msgs).name for i in range(4)]
        for i, (low, high) in enumerate(ranges):
            assert low <= rt.redis.keyslot(rt.ns.topic(Shard("placed", 4, i)).msgs) < high
        assert sorted(Counter(masters).values()) == [1, 1, 2]
        sent = await send_messages(rt, requests=[SendRequest("placed", "x", msg_id=f"p{i}") for i in range(40)])
        before = {shard: rt.ns.topic(shard).msgs for shard in topic_shards("placed", (4,))}
        keys._PLACEMENTS.clear()  # a process that has not read the settings yet
        keys.shard_tag.cache_clear()
        keys.topic_keys.cache_clear()
        other = make_runtime(REDIS_CLUSTER_URL)
        try:
            await other.topic_configs.table()
            assert {shard: other.ns.topic(shard).msgs for shard in topic_shards("placed", (4,))} == before
            assert len(await pull_all(other, "placed", len(sent), batch=10)) == len(sent)
        finally:
            await other.close()
    finally:
        await rt.close()


async def test_sends_pulls_and_acks_over_shards_and_the_counters_add_up(rt):
    """The same requests on a sharded topic and an unsharded one: the same answers and counters."""
    await shard_topic(rt, "t", 4)
    # The counters compared below must fall in one monitor interval: start as one begins.
    interval = rt.config.monitor_interval_millis
    while await redis_millis(rt) % interval > interval // 10:
        await asyncio.sleep(0.005)
    for topic in ("t", "plain"):
        sent = await send_messages(rt, requests=[SendRequest(topic, f"body {i}") for i in range(40)])
        assert {m.status for m in sent} == {Status.READY}
        info = await topic_info(rt, topic=topic)
        assert (info.ready, info.waiting, info.consuming) == (40, 0, 0)
        pulled = await pull_all(rt, topic, 40, batch=7)
        assert sorted(m.msg_id for m in pulled) == sorted(m.msg_id for m in sent)  # each once
        assert (await topic_info(rt, topic=topic)).consuming == 40
        done = await ack_messages(rt, topic=topic, msg_ids=[m.msg_id for m in pulled[:20]] + ["nope"])
        assert done == [True] * 20 + [False]
        for m in pulled[20:]:
            assert (await ack_message(rt, topic=topic, msg_id=m.msg_id)).done
        info = await topic_info(rt, topic=topic)
        assert (info.ready, info.waiting, info.consuming) == (0, 0, 0)
    assert sum((await held_per_shard(rt, "t", (4,))).values()) == 40  # their ended bodies, all in the shards
    assert all((await held_per_shard(rt, "t", (4,))).values())

    async def counted():
        found = {c.topic: c for c in await monitor_data(rt)}
        return len(found) == 2 and found

    counters = await wait_until(counted, timeout=8, interval=0.2, what="an interval with both topics' counters")
    assert counters["t"].counters == counters["plain"].counters
    assert counters["t"].counters["sendMsg"] == 40 and counters["t"].counters["pullMsg"] == 40
    # The dashboard's and /metrics' figures (ops/figures.py) add the shards up alike.
    overview = {o["topic"]: o for o in await topic_overview(rt, topics=["t", "plain"])}
    for figure in ("totals", "waiting", "ready", "consuming", "paused"):  # (log_backlog: stream entries, one a call)
        assert overview["t"][figure] == overview["plain"][figure], figure
    assert overview["t"]["totals"]["sendMsg"] == 40


async def test_a_pull_loop_takes_from_every_shard_alike(rt):
    await shard_topic(rt, "turns", 4)  # its own keys (shard count 1) drain, empty, meanwhile
    # 100 messages in each shard.
    requests = [SendRequest("turns", "x", msg_id=msg_id_in("turns", 4, i % 4, f"m{i}")) for i in range(400)]
    await send_messages(rt, requests=requests)
    taken = Counter()
    for _ in range(200):
        [message], _left = await pull_messages(rt, topic="turns", batch=1)
        taken[shard_of("turns", message.msg_id, 4).index] += 1
    # No shard is passed over: each is as likely to be pulled first (50 expected; 5 standard deviations).
    assert sorted(taken) == [0, 1, 2, 3] and all(20 <= n <= 80 for n in taken.values()), taken
    # A batch combines shards, and one shard's backlog fills what the empty ones lack.
    await pull_all(rt, "turns", 200, batch=50)
    await send_messages(rt, requests=[SendRequest("turns", "y", msg_id=msg_id_in("turns", 4, i % 4, f"few{i}"))
                                      for i in range(9)])
    await send_messages(rt, requests=[SendRequest("turns", "y", msg_id=msg_id_in("turns", 4, 2, f"only{i}"))
                                      for i in range(33)])
    messages, left = await pull_messages(rt, topic="turns", batch=40)
    assert len(messages) == 40 and left == 2


async def test_a_pull_asks_the_shards_the_first_lacked_in_one_round(rt, monkeypatch):
    """What the first shard lacked is asked of the others in one pipelined round, the shards beyond
    the lack for none (which answers how many they hold ready): a pull of one message from an empty
    topic of 8 shards asked them one after another, a round trip each."""
    await shard_topic(rt, "rounds", 8)  # its own keys (count 1) drain, empty: 9 shards
    rounds = []
    real_run = rt.scripts.run

    async def recording_run(calls):
        rounds.append(sum(call.script is scripts.PULL for call in calls))
        return await real_run(calls)

    monkeypatch.setattr(rt.scripts, "run", recording_run)
    assert (await pull_messages(rt, topic="rounds", batch=1)).messages == []
    assert rounds == [1, 8]
    msg_id = msg_id_in("rounds", 8, 5, "lone")
    await send_message(rt, request=SendRequest("rounds", "x", msg_id=msg_id, max_retry=10))
    for _ in range(5):  # whichever shard is asked first
        rounds.clear()
        [pulled], _left = await pull_messages(rt, topic="rounds", batch=1)
        assert pulled.msg_id == msg_id and len(rounds) <= 3, rounds
        assert await nack_message(rt, topic="rounds", msg_id=msg_id)


async def test_a_long_poll_is_woken_by_a_message_in_any_shard(rt):
    await shard_topic(rt, "poll", 3)
    for index in range(3):
        poll = asyncio.ensure_future(long_poll_messages(rt, topic="poll", batch=5, timeout_millis=10_000))
        await asyncio.sleep(0.2)
        assert not poll.done()
        msg_id = msg_id_in("poll", 3, index, f"wake{index}")
        started = time.monotonic()
        await send_message(rt, request=SendRequest("poll", "wake", msg_id=msg_id))
        messages = await asyncio.wait_for(poll, 5)
        assert [m.msg_id for m in messages] == [msg_id], f"shard {index}"
        assert time.monotonic() - started < 5
    # No scanner runs here: a message falling due is taken by the poll's own pull at its due
    # time, of whichever shard it is in.
    for index in range(3):
        msg_id = msg_id_in("poll", 3, index, f"due{index}")
        sent = await send_message(rt, request=SendRequest("poll", "due", msg_id=msg_id, delay_millis=300))
        messages = await asyncio.wait_for(long_poll_messages(rt, topic="poll", batch=5, timeout_millis=10_000), 5)
        assert [m.msg_id for m in messages] == [msg_id], f"shard {index}"
        assert messages[0].trigger_time == sent.trigger_time


@contextlib.asynccontextmanager
async def stale_runtime(rt, **overrides):
    """A second process on `rt`'s Redis (`overrides`: its config's) that has read the topic settings
    and reads them no more on its own (its refresher stopped): a reshard from now on is one it has
    not read yet."""
    other = make_runtime(rt.config.redis_url, **overrides)
    try:
        await other.topic_configs.table()
        await other.topic_configs.close()
        yield other
    finally:
        await other.close()


async def test_a_poll_woken_for_a_shard_count_its_process_has_not_read_yet_reads_it(rt):
    """Within the half second a process takes to read a reshard, a message sent to a shard of the
    new count wakes its polls: a poll there reads the settings then, and pulls that shard. Pulling
    only the counts it knew, it found nothing and waited out its hold, the message left ready."""
    async with stale_runtime(rt) as other:
        poll = asyncio.ensure_future(long_poll_messages(other, topic="ahead", timeout_millis=30_000))
        await asyncio.sleep(0.2)
        await shard_topic(rt, "ahead", 3)
        msg_id = msg_id_in("ahead", 3, 2, "new")
        await send_message(rt, request=SendRequest("ahead", "x", msg_id=msg_id))
        assert [m.msg_id for m in await asyncio.wait_for(poll, 10)] == [msg_id]


@pytest.mark.parametrize("operation", ["ack", "nack", "touch", "ackMsgBatch", "getMsg", "rescheduleMsg", "deleteMsg"])
async def test_a_message_of_a_shard_count_its_process_has_not_read_yet_is_found_by_its_msg_id(rt, operation):
    """Within the half second a process takes to read a reshard, a request by msgId for a message
    of the new count finds it: missing in the counts the process knew, it reads the settings then.
    It answered not found (an ack: not done, so the message came back at its ack timeout)."""
    async with stale_runtime(rt) as other:
        await shard_topic(rt, "ahead", 3)
        msg_id = msg_id_in("ahead", 3, 2, "new")
        consumed = operation in ("ack", "nack", "touch", "ackMsgBatch")
        await send_message(rt, request=SendRequest("ahead", "x", msg_id=msg_id, delay_millis=0 if consumed else 60_000))
        if consumed:
            assert [m.msg_id for m in await pull_all(rt, "ahead", 1)] == [msg_id]
        if operation == "ack":
            assert (await ack_message(other, topic="ahead", msg_id=msg_id)).done
        elif operation == "nack":
            assert (await nack_message(other, topic="ahead", msg_id=msg_id)).done
        elif operation == "touch":
            assert await touch_message(other, topic="ahead", msg_id=msg_id, ack_timeout_millis=60_000) > 0
        elif operation == "ackMsgBatch":
            assert await ack_messages(other, topic="ahead", msg_ids=["unknown", msg_id]) == [False, True]
        elif operation == "getMsg":
            assert (await get_message(other, topic="ahead", msg_id=msg_id)).status == Status.WAITING
        elif operation == "rescheduleMsg":
            assert (await reschedule_message(other, topic="ahead", msg_id=msg_id, delay_millis=1)).msg_id == msg_id
        else:
            assert await delete_message(other, topic="ahead", msg_id=msg_id)


async def test_a_poll_woken_by_a_shards_ready_list_pulls_that_shard_alone(rt, monkeypatch):
    """The ready channel names the list that got a message: the woken poll asks that shard, and
    answers with what it held without asking the others for the rest of its batch."""
    await shard_topic(rt, "hint", 3)
    hinted = Shard("hint", 3, 2)
    asked = []
    real_run = rt.scripts.run

    async def recording_run(calls):
        asked.append([call.keys for call in calls if call.script is scripts.PULL])
        return await real_run(calls)

    monkeypatch.setattr(rt.scripts, "run", recording_run)
    poll = asyncio.ensure_future(long_poll_messages(rt, topic="hint", batch=5, timeout_millis=10_000))
    await asyncio.sleep(0.2)
    assert not poll.done()
    asked.clear()  # the poll's first pull, over every shard, found nothing
    msg_id = msg_id_in("hint", 3, hinted.index, "hinted")
    await send_message(rt, request=SendRequest("hint", "x", msg_id=msg_id))
    assert [m.msg_id for m in await asyncio.wait_for(poll, 5)] == [msg_id]
    expected = scripts.pull(rt.context, hinted, batch=5, consume_rate=0, ack_timeout_millis=0, max_inflight=0).keys
    assert [run for run in asked if run] == [[expected]]


async def test_one_message_by_its_msg_id_on_a_sharded_topic(rt):
    await shard_topic(rt, "one", 5, retry_backoff_millis=60_000)
    sent = await send_messages(rt, requests=[SendRequest("one", f"b{i}", msg_id=f"id-{i}", delay_millis=60_000)
                                             for i in range(10)])
    assert {shard_of("one", m.msg_id, 5).index for m in sent} != {0}
    for m in sent:
        assert (await get_message(rt, topic="one", msg_id=m.msg_id)).payload == m.payload
    moved = await reschedule_message(rt, topic="one", msg_id="id-3", delay_millis=0)
    assert moved.status == Status.READY
    [pulled], _ = await pull_messages(rt, topic="one", batch=5)
    assert pulled.msg_id == "id-3"
    deadline = await touch_message(rt, topic="one", msg_id="id-3", ack_timeout_millis=90_000)
    assert deadline > pulled.trigger_time + 60_000
    with pytest.raises(Conflict):
        await reschedule_message(rt, topic="one", msg_id="id-3", delay_millis=0)
    # A nack under the topic's retry backoff waits it out, in the same shard.
    assert (await nack_message(rt, topic="one", msg_id="id-3")).done
    again = await get_message(rt, topic="one", msg_id="id-3")
    assert again.status == Status.WAITING and again.trigger_time > pulled.trigger_time + 30_000  # less its jitter
    assert await rt.redis.hexists(rt.ns.topic(shard_of("one", "id-3", 5)).msgs, "id-3")
    live = await live_state(rt, namespace="default", topic="one", msg_id="id-3")  # the admin's message page
    assert live["message"]["status"] == Status.WAITING and live["waiting_until"] == again.trigger_time
    assert await delete_message(rt, topic="one", msg_id="id-5")
    assert (await get_message(rt, topic="one", msg_id="id-5")).status == Status.DELETED
    assert not await delete_message(rt, topic="one", msg_id="nope")
    assert (await topic_info(rt, topic="one")).waiting == 9


async def test_priorities_hold_within_each_shard(rt):
    await shard_topic(rt, "prio", 2)
    requests = [SendRequest("prio", "low", msg_id=msg_id_in("prio", 2, i % 2, f"low{i}"), priority=0) for i in range(4)]
    requests += [SendRequest("prio", "high", msg_id=msg_id_in("prio", 2, i % 2, f"high{i}"), priority=7)
                 for i in range(4)]
    await send_messages(rt, requests=requests)
    messages = await pull_all(rt, "prio", 8, batch=3)
    for index in range(2):  # each shard hands out its high ones first
        in_shard = [m.payload for m in messages if shard_of("prio", m.msg_id, 2).index == index]
        assert in_shard == ["high"] * 2 + ["low"] * 2


async def test_pause_resume_and_purge_cover_every_shard(rt):
    await shard_topic(rt, "p", 3)
    await send_messages(rt, requests=[SendRequest("p", "x") for _ in range(12)])
    await send_messages(rt, requests=[SendRequest("p", "later", delay_millis=60_000) for _ in range(6)])
    await pause_topic(rt, topic="p")
    for shard in topic_shards("p", (3,)):
        assert await rt.redis.hget(rt.ns.topic(shard).meta, "paused") == "1"
    assert (await pull_messages(rt, topic="p", batch=10)).messages == []
    await resume_topic(rt, topic="p")
    assert len((await pull_messages(rt, topic="p", batch=2)).messages) == 2
    assert await purge_topic(rt, topic="p") == 18  # the two consuming ones too
    info = await topic_info(rt, topic="p")
    assert (info.waiting, info.ready, info.consuming) == (0, 0, 0)


async def test_a_purge_by_a_process_that_has_not_read_a_reshard_ends_the_new_counts_messages(rt):
    """A purge reads the topic's shard counts afresh: one asked of a process that has not read a
    reshard yet purges the new count's shards too. It purged only the counts it knew, and the new
    count's messages stayed live."""
    async with stale_runtime(rt) as other:
        await send_message(rt, request=SendRequest("gone", "x", msg_id="before", delay_millis=60_000))
        await shard_topic(rt, "gone", 3)
        await send_messages(rt, requests=[SendRequest("gone", "x", msg_id=msg_id_in("gone", 3, index, "after"),
                                                      delay_millis=60_000) for index in range(3)])
        assert await purge_topic(other, topic="gone") == 4
        assert await live_over(rt, "gone", (3, 1)) == 0


async def test_a_resume_wakes_the_long_polls_of_every_shards_ready_messages(rt, monkeypatch):
    """A resume names every shard's ready list: a poll woken by one name fills its batch from that
    shard alone, and leaves the others' ready messages to polls the other names wake. Named once
    (the topic's own list), the first poll took its shard's message and woke no other: the rest
    waited for their recheck of the pause, or their timeout."""
    monkeypatch.setattr(consume_module, "PAUSED_RECHECK_SECONDS", 60)  # past every hold here
    await shard_topic(rt, "resumed", 3)
    changed_at = (await rt.topic_configs.fresh())["resumed"].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic="resumed", count=1,
                                                      changed_at=changed_at)  # count 1 never held any
    await pause_topic(rt, topic="resumed")
    msg_ids = {msg_id_in("resumed", 3, index, f"r{index}") for index in range(3)}
    await send_messages(rt, requests=[SendRequest("resumed", "x", msg_id=msg_id) for msg_id in msg_ids])
    polls = [asyncio.ensure_future(long_poll_messages(rt, topic="resumed", batch=1, timeout_millis=30_000))
             for _ in range(3)]
    await asyncio.sleep(0.2)
    assert not any(poll.done() for poll in polls)
    await resume_topic(rt, topic="resumed")
    answered = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert {m.msg_id for messages in answered for m in messages} == msg_ids


async def test_a_pull_that_meets_a_shard_paused_before_the_others_answers_what_it_took(rt):
    """A pause or a resume reaches the shards' meta hashes one after another: a pull that took
    messages from a shard not yet paused and then met one that is answers them (they are consuming
    now), not an empty paused list that left them to their ack timeout."""
    await shard_topic(rt, "half", 3)
    msg_ids = sorted(msg_id_in("half", 3, index, f"m{index}") for index in (0, 1))
    await send_messages(rt, requests=[SendRequest("half", "x", msg_id=msg_id) for msg_id in msg_ids])
    await rt.redis.hset(rt.ns.topic(Shard("half", 3, 2)).meta, Meta.PAUSED, 1)
    pulled = []
    for _ in range(50):  # the shard asked first is drawn at random: the paused one answers nothing
        pulled += (await pull_messages(rt, topic="half", batch=10)).messages
        assert (await topic_info(rt, topic="half")).consuming == len(pulled)
        if len(pulled) == 2:
            break
    assert sorted(m.msg_id for m in pulled) == msg_ids


async def test_a_pause_holds_a_sharded_topics_pushers_pulls_while_redis_has_lost_its_mirror(rt):
    """The settings' pause reaches pull.lua for every shard, as it does for an unsharded topic: with
    the shards' mirrors gone (a Redis that lost its data, before the restore), a pusher's pull
    (pull_many, which the settings alone do not hold) hands out nothing."""
    await shard_topic(rt, "held", 3)
    await send_messages(rt, requests=[SendRequest("held", "x", msg_id=msg_id_in("held", 3, index, f"h{index}"))
                                      for index in range(3)])
    await pause_topic(rt, topic="held")
    for shard in topic_shards("held", (3, 1)):
        await rt.redis.hdel(rt.ns.topic(shard).meta, Meta.PAUSED)
    for _ in range(5):  # whichever shard is asked first
        [reply] = await pull_many(rt, pulls=[Pull("held", 10, 30_000)])
        assert reply.paused and reply.messages == []
    assert (await topic_info(rt, topic="held")).ready == 3


async def test_dead_letters_of_every_shard_are_listed_and_redriven(single_rt, start_scanner):
    rt = single_rt
    await shard_topic(rt, "dead", 3)
    sent = await send_messages(rt, requests=[SendRequest("dead", f"d{i}", msg_id=f"d{i}") for i in range(9)])
    pulled = await pull_all(rt, "dead", 9)
    for m in pulled:
        assert (await nack_message(rt, topic="dead", msg_id=m.msg_id, dead_letter=True, reason="bad")).done
    await start_scanner(rt)  # its log writer reads every shard's history

    async def all_dead():
        page, _ = await dead_letters(rt, topic="dead", limit=100, cursor=None)
        return len(page) == 9 and page

    page = await wait_until(all_dead, timeout=10, interval=0.1, what="9 dead letters in the log")
    assert {d.message.msg_id for d in page} == {m.msg_id for m in sent}
    assert {d.reason for d in page} == {Reason.DEAD_LETTERED}
    task_id = await create_redrive(rt, topic="dead", msg_ids=None, max_per_second=1000)

    async def redriven():
        return (await redrive_state(rt, task_id=task_id)).done

    await wait_until(redriven, timeout=15, interval=0.1, what="the redrive")
    again = await pull_all(rt, "dead", 9)
    assert sorted(m.msg_id for m in again) == sorted(m.msg_id for m in sent)
    for m in again:
        assert await rt.redis.hexists(rt.ns.topic(shard_of("dead", m.msg_id, 3)).msgs, m.msg_id)


async def test_a_dead_letter_redriven_while_its_count_drains_is_reached_in_its_new_life(single_rt, start_scanner):
    """Its ended body is kept in the count given up (DELAYQUEUE_ENDED_RETENTION_MILLIS): the new
    life goes there too, so getMsg and ackMsg reach the life that is live, not the dead one."""
    rt = single_rt
    sent = await send_messages(rt, requests=[SendRequest("redo", f"r{i}", msg_id=f"r{i}") for i in range(6)])
    for m in await pull_all(rt, "redo", 6):
        assert (await nack_message(rt, topic="redo", msg_id=m.msg_id, dead_letter=True, reason="bad")).done
    await start_scanner(rt)

    async def all_dead():
        page, _ = await dead_letters(rt, topic="redo", limit=100, cursor=None)
        return len(page) == 6

    await wait_until(all_dead, timeout=10, interval=0.1, what="6 dead letters in the log")
    await shard_topic(rt, "redo", 3)
    task_id = await create_redrive(rt, topic="redo", msg_ids=None, max_per_second=1000)

    async def redriven():
        return (await redrive_state(rt, task_id=task_id)).done

    await wait_until(redriven, timeout=15, interval=0.1, what="the redrive")
    for m in sent:
        assert (await get_message(rt, topic="redo", msg_id=m.msg_id)).status == Status.READY
    again = await pull_all(rt, "redo", 6)
    assert sorted(m.msg_id for m in again) == sorted(m.msg_id for m in sent)
    assert await ack_messages(rt, topic="redo", msg_ids=[m.msg_id for m in again]) == [True] * 6


async def test_a_change_whose_mirror_would_land_after_a_later_changes_leaves_redis_with_both(rt, monkeypatch):
    """A pause by one process read its settings back before another process's count change was
    saved, and wrote its mirror after that change's: the pause rereads and writes again, so Redis
    ends with the given-up count marked draining and the topic paused."""
    other = make_runtime(rt.config.redis_url)
    try:
        before = (await other.topic_configs.fresh()).get("race", DEFAULT_SETTINGS)
        stale_reads = iter([{"race": dataclasses.replace(before, paused=True)}])
        fresh = other.topic_configs.fresh

        async def read_before_the_count_change():
            return next(stale_reads, None) or await fresh()

        await shard_topic(rt, "race", 3)
        monkeypatch.setattr(other.topic_configs, "fresh", read_before_the_count_change)
        await pause_topic(other, topic="race")
        metas = [await rt.redis.hgetall(rt.ns.topic(shard).meta) for shard in topic_shards("race", (3, 1))]
        assert [(meta[Meta.DRAINING], meta[Meta.PAUSED]) for meta in metas] == [("0", "1")] * 3 + [("1", "1")]
    finally:
        await other.close()


async def test_a_push_topic_with_shards_delivers_from_every_shard(single_rt, start_scanner, start_pusher,
                                                                  push_receiver):
    rt = single_rt
    receiver = await push_receiver()
    await shard_topic(rt, "hooks", 4, push_url=receiver.url)
    await start_scanner(rt)
    await start_pusher()
    sent = await send_messages(rt, requests=[SendRequest("hooks", f"h{i}", msg_id=f"h{i}", delay_millis=200)
                                             for i in range(16)])

    async def all_acked():
        return all([(await get_message(rt, topic="hooks", msg_id=m.msg_id)).status == Status.ACKED for m in sent])

    await wait_until(all_acked, timeout=15, interval=0.1, what="every push acked")
    assert sorted(request["message"]["msgId"] for request in receiver.requests) == sorted(m.msg_id for m in sent)


async def sharded_alone(rt, topic: str, count: int) -> None:
    """The topic takes `count` shards, and the count of 1 it leaves, which never held any, is
    retired at once."""
    await shard_topic(rt, topic, count)
    changed_at = (await rt.topic_configs.fresh())[topic].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic=topic, count=1,
                                                      changed_at=changed_at)
    await rt.topic_configs.fresh()


async def taken(rt, topic: str, slots: int, pushers: int) -> list[int]:
    """What each of `pushers` pushers, one after another, takes with `slots` free slots under a
    concurrency of `slots`."""
    return [len((await pull_many(rt, pulls=[Pull(topic, slots, 60_000, max_inflight=slots)]))[0].messages)
            for _pusher in range(pushers)]


async def test_a_push_topics_concurrency_holds_over_its_shards_whichever_pusher_takes_them(single_rt):
    """Each shard holds a share of pushConcurrency, the shares adding up to it: pushers pulling
    apart (each with its own free slots) never have more in flight together."""
    rt = single_rt
    await sharded_alone(rt, "hooks", 3)
    await send_messages(rt, requests=[SendRequest("hooks", "x", msg_id=f"h{i}") for i in range(30)])
    assert sum(await taken(rt, "hooks", 4, 3)) == 4  # shares of 2, 1 and 1 (rounded up, 2 each took 6)
    # With fewer slots than shards, each shard still has one: none of its messages is stuck.
    await sharded_alone(rt, "few", 3)
    await send_messages(rt, requests=[SendRequest("few", "x", msg_id=msg_id_in("few", 3, index, "f"))
                                      for index in range(3)])
    assert await taken(rt, "few", 1, 4) == [1, 1, 1, 0]


async def test_a_push_topics_concurrency_holds_over_the_shards_of_both_counts_while_one_drains(single_rt):
    """While a count given up drains, the shares of pushConcurrency over the shards of both counts
    add up to it, the given-up count's first, each of them kept one so that it empties. Each shard
    of both kept one: 7 shards under a concurrency of 6 had 7 in flight."""
    rt = single_rt
    await sharded_alone(rt, "hooks", 3)
    await send_messages(rt, requests=[SendRequest("hooks", "x", msg_id=msg_id_in("hooks", 3, index, f"old{n}"))
                                      for index in range(3) for n in range(2)])
    await shard_topic(rt, "hooks", 4)
    await send_messages(rt, requests=[SendRequest("hooks", "x", msg_id=msg_id_in("hooks", 4, index, f"new{n}"))
                                      for index in range(4) for n in range(2)])
    assert sum(await taken(rt, "hooks", 6, 3)) == 6
    assert [await rt.redis.zcard(rt.ns.topic(Shard("hooks", 3, index)).inflight) for index in range(3)] == [1, 1, 1]


async def test_bad_shard_counts_are_refused(api, single_rt):
    for bad in (0, 257, "two"):
        answer = await call(api, "setTopicConfig", topic="t", shards=bad)
        assert answer["code"] == 400 and "shards" in answer["msg"], answer
    answer = await call(api, "setTopicConfig", topic="t", shards=8)
    assert answer["code"] == 200 and answer["data"]["shards"] == 8 and answer["data"]["drainingShards"] == [1]


async def live_over(rt, topic: str, counts: tuple[int, ...]) -> int:
    """The live messages the topic's shards of these counts hold in Redis."""
    total = 0
    for shard in topic_shards(topic, counts):
        k = rt.ns.topic(shard)
        total += (await rt.redis.zcard(k.waiting) + await rt.redis.llen(k.ready) + await rt.redis.zcard(k.prioritised)
                  + await rt.redis.zcard(k.inflight))
    return total


async def test_a_namespace_live_cap_holds_over_sharded_topics(rt):
    """Each shard holds a share of the cap, claimed for the messages whose msgIds go to it:
    concurrent sends to sharded and unsharded topics never pass it, and sent one by one they
    fill it exactly; a message ended frees room for any shard."""
    await set_limits_now(namespace=rt.ns.namespace, max_live=25)
    await shard_topic(rt, "s3", 3)
    await shard_topic(rt, "s4", 4)
    counts = {"s3": (3, 1), "s4": (4, 1), "plain": (1,)}

    async def live() -> int:
        return sum([await live_over(rt, topic, mine) for topic, mine in counts.items()])

    async def send(topic: str, n: int = 1) -> list:
        return await send_messages(rt, requests=[SendRequest(topic, "x", delay_millis=60_000) for _ in range(n)])

    topics = list(counts)
    calls = [send(topics[i % 3]) for i in range(30)] + [send(topic, 6) for topic in topics]
    outcomes = [o for call in await asyncio.gather(*calls) for o in call]
    accepted = [o for o in outcomes if not isinstance(o, Throttled)]
    assert 0 < len(accepted) <= 25 and await live() == len(accepted)
    for topic in topics * 25:  # no room was lost: one by one, they fill the cap, and no more
        if await live() == 25:
            break
        [outcome] = await send(topic)
        if not isinstance(outcome, Throttled):
            accepted.append(outcome)
    assert len(accepted) == await live() == 25
    [refusal] = await send("s4")
    assert isinstance(refusal, Throttled) and "live-message cap of namespace" in str(refusal)
    # The concurrent sends may have left any topic without a message: the room one topic frees
    # goes to a shard of another.
    gone = accepted[0]
    assert await delete_message(rt, topic=gone.topic, msg_id=gone.msg_id)
    [taken] = await send("s3" if gone.topic != "s3" else "s4")
    assert not isinstance(taken, Throttled) and await live() == 25


async def test_a_topic_live_cap_holds_over_its_shards(rt):
    """Each shard holds a share of the topic's cap, the shares adding up to it: sends to every
    shard never pass it together."""
    await shard_topic(rt, "c", 3)
    await set_limits_now(namespace=rt.ns.namespace, topic="c", max_live=4)
    await rt.limits.fresh()
    outcomes = []
    for i in range(12):  # one by one: a batch's admission counts it whole
        outcomes += await send_messages(rt, requests=[SendRequest("c", "x", delay_millis=60_000,
                                                                  msg_id=msg_id_in("c", 3, i % 3, f"c{i}"))])
    assert sum(not isinstance(o, Throttled) for o in outcomes) == 4  # shares of 2, 1 and 1 (rounded up, 2 each took 6)
    assert await live_over(rt, "c", (3, 1)) == 4


async def test_a_retired_counts_share_of_the_namespace_cap_goes_back_to_the_pool(single_rt, start_scanner,
                                                                                  monkeypatch):
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 200)
    rt = single_rt
    await set_limits_now(namespace=rt.ns.namespace, max_live=10)
    sent = await send_messages(rt, requests=[SendRequest("d", "x", delay_millis=60_000) for _ in range(4)])
    for m in sent:
        assert await delete_message(rt, topic="d", msg_id=m.msg_id, release=True)
    assert int(await rt.redis.hget(rt.ns.topic("d").meta, "live_share")) >= 4  # room count 1 no longer uses
    await shard_topic(rt, "d", 2)
    await start_scanner(rt)

    async def retired():
        return (await topic_config(rt, topic="d")).draining_shards == ()

    await wait_until(retired, timeout=15, interval=0.1, what="count 1 retired")
    outcomes = await send_messages(rt, requests=[SendRequest("d", "x", delay_millis=60_000) for _ in range(12)])
    assert sum(not isinstance(o, Throttled) for o in outcomes) == 10  # the whole cap, none of it lost
    assert await live_over(rt, "d", (2,)) == 10


@pytest.mark.parametrize("cluster,window", [(False, 0), (True, 0), (False, 1000), (True, 1000)],
                         ids=["single", "cluster", "single-cold", "cluster-cold"])
async def test_resharding_under_load_loses_and_doubles_nothing(clean_state, start_scanner, monkeypatch, cluster,
                                                              window):
    """1 -> 4 -> 2 shards while a producer sends and a consumer pulls and acks; then the counts
    given up are retired once empty. With a 1 s hot window, a third of the messages are sent
    cold, under one count, and come in under another."""
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 1_000)
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 1_000)
    delays = (0, 0, 50, 300, *((1500, 2500) if window else ()))
    rt = make_runtime(REDIS_CLUSTER_URL if cluster else REDIS_URL, **({"hot_window_millis": window} if window else {}))
    try:
        await start_scanner(rt)
        sent: list[str] = []
        delivered: Counter = Counter()
        stop = asyncio.Event()

        async def produce():
            n = 0
            while not stop.is_set():
                batch = [SendRequest("r", "x", msg_id=f"r{n + i}", delay_millis=random.choice(delays))
                         for i in range(10)]
                n += 10
                answered = await send_messages(rt, requests=batch)
                assert all(m.status in (Status.READY, Status.WAITING) for m in answered), answered
                sent.extend(m.msg_id for m in answered)
                await asyncio.sleep(0.01)

        async def consume():
            while not stop.is_set() or len(delivered) < len(sent):
                messages, _ = await pull_messages(rt, topic="r", batch=16, ack_timeout_millis=30_000)
                for m in messages:
                    delivered[m.msg_id] += 1
                if messages:
                    assert all(await ack_messages(rt, topic="r", msg_ids=[m.msg_id for m in messages]))
                else:
                    await asyncio.sleep(0.01)

        tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
        await asyncio.sleep(1.0)
        for count in (4, 2):
            await shard_topic(rt, "r", count)
            await asyncio.sleep(1.5)
            # New messages went to the new count's shards (their ended bodies stay for the retention).
            assert all((await held_per_shard(rt, "r", (count,))).values())
        stop.set()
        await asyncio.wait_for(tasks[0], 10)
        await asyncio.wait_for(tasks[1], 20)
        assert len(sent) > 300
        assert set(delivered) == set(sent)
        assert [msg_id for msg_id, n in delivered.items() if n > 1] == []

        async def retired():
            config = await topic_config(rt, topic="r")
            return config.draining_shards == ()

        await wait_until(retired, timeout=20, interval=0.2, what="the drained shard counts to be retired")
        assert (await topic_config(rt, topic="r")).shards == 2
        info = await topic_info(rt, topic="r")
        assert (info.waiting, info.waiting_cold, info.ready, info.consuming) == (0, 0, 0, 0)
        # The retired counts' monitor counters were added into the current count's first shard.
        for name in (stats.Counter.SEND, stats.Counter.ACK):
            total = stats.field("total", name=name)
            assert sum([int(await rt.redis.hget(rt.ns.topic(shard).stats, total) or 0)
                        for shard in topic_shards("r", (2,))]) == len(sent)
        for shard in topic_shards("r", (1, 4)):  # and keep none
            assert not await rt.redis.exists(rt.ns.topic(shard).stats)
    finally:
        await rt.close()


async def lose_redis(rt) -> None:
    if isinstance(rt.redis, RedisCluster):
        await rt.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await rt.redis.flushall()


@pytest.mark.parametrize("message_log", [True, False], ids=["log", "no log"])
async def test_a_message_sent_again_during_a_reshard_is_answered_from_the_shard_holding_it(clean_state, message_log):
    """With the log, its live row sends it to the shard of the count that holds it; without,
    every count is looked in while the topic drains one."""
    rt = make_runtime(REDIS_URL, message_log=message_log)
    try:
        first = await send_message(rt, request=SendRequest("dup", "x", msg_id="twice", delay_millis=60_000))
        await shard_topic(rt, "dup", 3)
        again = await send_message(rt, request=SendRequest("dup", "y", msg_id="twice", delay_millis=60_000))
        assert (again.payload, again.produce_time) == ("x", first.produce_time)  # the duplicate's answer
        assert await where_held(rt, "dup", (3, 1), "twice") == [Shard("dup")]
    finally:
        await rt.close()


async def test_a_message_sent_again_by_a_process_that_has_not_read_the_reshard_is_answered_as_sent(rt):
    """Within the half second a process takes to read a reshard, a send of a msgId live in a shard
    of the new count (the log holds it live) finds it there: it is answered as the duplicate it is.
    Placed by the counts the process knew, it was made a second live message in the old count."""
    async with stale_runtime(rt) as other:
        await shard_topic(rt, "again", 3)
        msg_id = msg_id_in("again", 3, 2, "twice")
        first = await send_message(rt, request=SendRequest("again", "x", msg_id=msg_id, delay_millis=60_000))
        again = await send_message(other, request=SendRequest("again", "y", msg_id=msg_id, delay_millis=60_000))
        assert (again.payload, again.produce_time) == ("x", first.produce_time)
        assert await where_held(rt, "again", (3, 1), msg_id) == [Shard("again", 3, 2)]


async def test_restore_rebuilds_every_shard(rt):
    await shard_topic(rt, "back", 3)
    sent = await send_messages(rt, requests=[SendRequest("back", f"b{i}", msg_id=f"b{i}", delay_millis=60_000)
                                             for i in range(30)])
    await lose_redis(rt)
    counts = await restore(rt)
    assert counts.restored == 30
    held = await held_per_shard(rt, "back", (3,))
    assert sum(held.values()) == 30 and all(held.values())
    for m in sent:
        assert (await get_message(rt, topic="back", msg_id=m.msg_id)).trigger_time == m.trigger_time
    for shard in topic_shards("back", (3,)):  # the settings' mirror came back with them
        assert await rt.redis.hget(rt.ns.topic(shard).meta, "paused") == "0"


async def test_a_restore_leaves_a_sharded_topics_messages_beyond_the_window_to_its_loader(rt, monkeypatch):
    """After a loss, every shard gets a window (now + DELAYQUEUE_HOT_WINDOW_MILLIS): what is due
    within it comes back into its shard, the rest stays in the log, counted (dealt over the shards'
    parts), for the loader. The parts go below or above 0 as it brings each shard's in (4, 2 and 3
    of 3 each); once none is left it drops the parts, and a send going cold meanwhile in the second
    shard is counted as one: the parts were dropped shard by shard, the second's kept for the send,
    and the topic counted that whole part (2) cold until nothing was left beyond the window again."""
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)
    windowed = make_runtime(rt.config.redis_url, hot_window_millis=30_000)
    ahead = make_runtime(rt.config.redis_url, hot_window_millis=300_000, pack_lead_millis=0)
    try:
        await shard_topic(windowed, "back", 3)
        near = await send_messages(windowed, requests=[SendRequest("back", "n", msg_id=f"n{i}", delay_millis=10_000)
                                                       for i in range(9)])
        far = await send_messages(windowed, requests=[SendRequest("back", "f", msg_id=f"f{i}", delay_millis=120_000)
                                                      for i in range(9)])
        await lose_redis(rt)
        counts = await restore(windowed)
        assert (counts.restored, counts.left_cold) == (9, 9)
        for m in near:
            assert await where_held(windowed, "back", (3, 1), m.msg_id) == [shard_of("back", m.msg_id, 3)]
        assert [m.msg_id for m in far if await where_held(windowed, "back", (3, 1), m.msg_id)] == []
        info = await topic_info(windowed, topic="back")
        assert (info.waiting, info.waiting_cold) == (18, 9)
        loader = await cold_loader(ahead, "back", 3)
        late, real_read = msg_id_in("back", 3, 1, "late"), loader._read

        async def read_then_send(statement, params):
            rows = await real_read(statement, params)
            if statement is sql.COLD_LEFT:  # nothing left beyond the window: a send goes cold now
                await send_message(windowed, request=SendRequest("back", "l", msg_id=late, delay_millis=600_000))
            return rows

        monkeypatch.setattr(loader, "_read", read_then_send)
        try:
            assert await loader.load_topic("back", force=True) == 9
        finally:
            await loader.close()
        for m in far:
            assert await where_held(windowed, "back", (3, 1), m.msg_id) == [shard_of("back", m.msg_id, 3)]
        assert await where_held(windowed, "back", (3, 1), late) == []
        info = await topic_info(windowed, topic="back")
        assert (info.waiting, info.waiting_cold) == (19, 1)
    finally:
        await windowed.close()
        await ahead.close()


async def test_a_restore_spreads_a_sharded_topics_cold_count_over_its_shards(rt):
    """Each shard holds its share of the live cap against its part of the cold count: a restore
    that set the whole count left cold in the first shard's part refused sends to that shard while
    the topic was under its cap (3 shards, cap 30, 9 messages left cold: 1 of 5 sends went)."""
    windowed = make_runtime(rt.config.redis_url, hot_window_millis=30_000)
    try:
        await shard_topic(windowed, "cap", 3)
        await set_limits_now(namespace=windowed.ns.namespace, topic="cap", max_live=30)
        await windowed.limits.fresh()
        await send_messages(windowed, requests=[SendRequest("cap", "f", msg_id=f"f{i}", delay_millis=120_000)
                                                for i in range(9)])
        await lose_redis(rt)
        assert (await restore(windowed)).left_cold == 9
        sent = await send_messages(windowed, requests=[SendRequest("cap", "n", msg_id=msg_id_in("cap", 3, 0, f"n{i}"))
                                                       for i in range(5)])
        assert [outcome for outcome in sent if isinstance(outcome, Throttled)] == []
        info = await topic_info(windowed, topic="cap")
        assert (info.waiting, info.waiting_cold, sum(info.waiting_within)) == (9, 9, 9)
    finally:
        await windowed.close()


@pytest.mark.process
async def test_a_wake_for_one_shard_runs_that_shards_scripts_alone(single_rt, start_scanner, monkeypatch):
    """A script of one shard wakes the scanner's worker of that shard only: a send due earlier in
    shard 0 left the other shards' due messages, which no wake announced, to their own timers.
    Each woke every shard's worker, and a hot topic's wakes ran every shard's scripts. A wake that
    names only the topic (the channel's older form) still wakes them all."""
    rt = single_rt
    monkeypatch.setattr(topic_worker_module, "MAX_IDLE_SLEEP", 60)  # no safety-net pass within the test
    await shard_topic(rt, "wake", 3)
    late = [msg_id_in("wake", 3, index, f"late{index}") for index in (1, 2)]
    await send_messages(rt, requests=[SendRequest("wake", "x", msg_id=msg_id, delay_millis=60_000) for msg_id in late])
    running = await start_scanner(rt)

    async def held() -> bool:
        return len([shard for shard in running.scanner.workers if shard.count == 3]) == 3

    await wait_until(held, what="every shard held")
    await asyncio.sleep(0.3)  # their first passes done, the workers sleep towards the messages' due time
    for index, msg_id in zip((1, 2), late):  # due now, as a lost wake would leave them
        assert await rt.redis.zadd(rt.ns.topic(Shard("wake", 3, index)).waiting, {msg_id: now_millis()}, xx=True,
                                   ch=True)
    soon = msg_id_in("wake", 3, 0, "soon")
    await send_message(rt, request=SendRequest("wake", "x", msg_id=soon, delay_millis=100))

    async def promoted(msg_id: str) -> bool:
        return await rt.redis.zscore(rt.ns.topic(shard_of("wake", msg_id, 3)).waiting, msg_id) is None

    await wait_until(functools.partial(promoted, soon), timeout=5, what="shard 0's message promoted")
    await asyncio.sleep(0.3)
    assert [await promoted(msg_id) for msg_id in late] == [False, False]
    await rt.redis.publish(rt.ns.schedule_channel, "wake")
    for msg_id in late:
        await wait_until(functools.partial(promoted, msg_id), timeout=5, what="woken with the topic")


async def test_a_killed_scanners_shards_are_taken_over(single_rt, scanner_process):
    rt = single_rt
    await shard_topic(rt, "k", 4)
    await send_message(rt, request=SendRequest("k", "registers the topic"))
    a = scanner_process("a")
    a.wait_started()

    async def a_holds_all():
        return all([await rt.redis.get(rt.ns.topic(shard).lock) == "a" for shard in topic_shards("k", (4,))])

    await wait_until(a_holds_all, timeout=10, interval=0.05, what="scanner a to hold every shard")
    b = scanner_process("b")
    b.wait_started()
    await asyncio.sleep(1.5)  # b has tried the locks and knows who holds them
    a.kill(signal.SIGKILL)
    sent = await send_messages(rt, requests=[SendRequest("k", "after", msg_id=msg_id_in("k", 4, i, f"k{i}"),
                                                         delay_millis=300) for i in range(4)])

    async def promoted():
        return all([(await get_message(rt, topic="k", msg_id=m.msg_id)).status == Status.READY for m in sent])

    await wait_until(promoted, timeout=10, interval=0.02, what="every shard's message promoted by b")
    assert all([await rt.redis.get(rt.ns.topic(shard).lock) == "b" for shard in topic_shards("k", (4,))])


@pytest.mark.fault
async def test_a_drained_count_waits_out_a_postgres_outage_while_the_scanner_goes_on(single_rt, start_scanner,
                                                                                    postgres, monkeypatch):
    """Retiring a drained shard count writes the settings: with PostgreSQL down that waits, and
    the scanner still renews its locks and promotes; the count goes once PostgreSQL is back."""
    rt = single_rt
    await send_message(rt, request=SendRequest("o", "registers the topic"))
    await shard_topic(rt, "o", 3)
    [registered], _ = await pull_messages(rt, topic="o")
    assert (await ack_message(rt, topic="o", msg_id=registered.msg_id)).done
    await asyncio.sleep(2.5)  # the ended body's retention (2 s): the topic's own keys are empty
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 60_000)  # not retired before the outage
    scanner = await start_scanner(rt)

    async def holds_all():
        return all([shard in scanner.scanner.workers for shard in topic_shards("o", (3, 1))])

    await wait_until(holds_all, timeout=10, interval=0.05, what="the scanner to hold every shard")
    own = rt.ns.topic("o")

    async def own_keys_empty():  # the ended body purged, its history written
        return not await rt.redis.exists(own.ended) and not await rt.redis.xlen(own.events)

    await wait_until(own_keys_empty, timeout=10, interval=0.05, what="the topic's own keys to empty")
    # Due in each shard once PostgreSQL is down (a send needs it: the message log takes it first).
    sent = await send_messages(rt, requests=[SendRequest("o", "during", msg_id=msg_id_in("o", 3, i, f"o{i}"),
                                                         delay_millis=3000) for i in range(3)])
    await asyncio.to_thread(postgres.stop)
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 500)
    try:

        async def promoted():
            return all([(await get_message(rt, topic="o", msg_id=m.msg_id)).status == Status.READY for m in sent])

        await wait_until(promoted, timeout=10, interval=0.05, what="the messages promoted with PostgreSQL down")
        await asyncio.sleep(2)  # several looks at the drained count, each failing to write
        assert all([await rt.redis.get(rt.ns.topic(shard).lock) == scanner.scanner.token
                    for shard in topic_shards("o", (3,))])
        assert Shard("o") in scanner.scanner.workers  # not retired: the write did not happen
    finally:
        await asyncio.to_thread(postgres.start)

    async def retired():
        return (await topic_config(rt, topic="o")).draining_shards == ()

    await wait_until(retired, timeout=15, interval=0.2, what="the drained count retired once PostgreSQL is back")

    async def worker_gone():
        return Shard("o") not in scanner.scanner.workers

    await wait_until(worker_gone, timeout=5, interval=0.1, what="the topic's own keys no longer scanned")


async def cold_loader(rt, topic: str, count: int) -> Loader:
    """The loader of a scanner holding the first shard of the topic's `count`."""
    return Loader(rt, lambda: [Shard(topic, count, 0)])


async def loaded_by_one_pass(rt, topic: str, count: int) -> int:
    """What one forced pass of the loader of the topic's `count` brings in."""
    loader = await cold_loader(rt, topic, count)
    try:
        return await loader.load_topic(topic, force=True)
    finally:
        await loader.close()


@pytest.fixture
async def windowed(rt, monkeypatch):
    """Two runtimes on `rt`'s Redis: one with a 5 s hot window (a test's steps on a busy machine
    take most of a second), and one whose 300 s window covers the messages sent cold (a loader
    there brings them in). Loading waits neither for a reshard
    to settle nor for young rows (a topic sharded at once still drains the count of 1)."""
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)
    short = make_runtime(rt.config.redis_url, hot_window_millis=5000)
    ahead = make_runtime(rt.config.redis_url, hot_window_millis=300_000)
    yield short, ahead
    await short.close()
    await ahead.close()


async def sharded_with_windows(rt, topic: str, count: int) -> None:
    """The topic takes `count` shards, and its loader gives each a window."""
    await shard_topic(rt, topic, count)
    loader = await cold_loader(rt, topic, count)
    try:
        await loader.load_once()
    finally:
        await loader.close()


async def where_held(rt, topic: str, counts: tuple[int, ...], msg_id: str) -> list[Shard]:
    """The shards holding the msgId: in their body hash, or packed (a message the loader brought in
    more than twice DELAYQUEUE_PACK_LEAD_MILLIS ahead of its time waits in a packed list)."""
    return [shard for shard in topic_shards(topic, counts)
            if await rt.redis.hexists(rt.ns.topic(shard).msgs, msg_id) or msg_id in await packed_ids(rt, shard)]


async def test_a_sharded_topics_cold_messages_wait_in_the_log_and_come_into_their_shards(windowed):
    """Each shard has its own window: a send beyond it goes to the log only, counted in the
    shard's part of the topic's count. The loader brings each in, ahead of its time, into its
    shard; getMsg, deleteMsg and rescheduleMsg reach a cold message by its msgId."""
    cold_rt, ahead = windowed
    await sharded_with_windows(cold_rt, "c", 3)
    for shard in topic_shards("c", (3,)):
        assert await cold_rt.redis.hexists(cold_rt.ns.topic(shard).meta, "hot_until")
    sent = await send_messages(cold_rt, requests=[SendRequest("c", f"m{i}", msg_id=f"c{i}", delay_millis=60_000)
                                                  for i in range(12)])
    assert [m.msg_id for m in sent if await where_held(cold_rt, "c", (3,), m.msg_id)] == []
    info = await topic_info(cold_rt, topic="c")
    assert (info.waiting, info.waiting_cold) == (12, 12)
    assert {shard_of("c", m.msg_id, 3).index for m in sent} == {0, 1, 2}
    assert (await get_message(cold_rt, topic="c", msg_id="c0")).payload == "m0"  # from the log
    assert await delete_message(cold_rt, topic="c", msg_id="c1")
    moved = await reschedule_message(cold_rt, topic="c", msg_id="c2", delay_millis=500)  # into its window
    assert await where_held(cold_rt, "c", (3,), "c2") == [shard_of("c", "c2", 3)]
    assert moved.trigger_time <= now_millis() + 500
    assert (await topic_info(cold_rt, topic="c")).waiting_cold == 10

    loader = await cold_loader(ahead, "c", 3)
    try:
        assert await loader.load_topic("c", force=True) == 10
        assert await loader.load_topic("c", force=True) == 0
    finally:
        await loader.close()
    for m in sent:
        if m.msg_id != "c1":
            assert await where_held(cold_rt, "c", (3,), m.msg_id) == [shard_of("c", m.msg_id, 3)]
    deleted = shard_of("c", "c1", 3)  # kept as deleted, as a tombstone, in the shard it would come into
    assert (await get_message(cold_rt, topic="c", msg_id="c1")).status == Status.DELETED
    assert await cold_rt.redis.zscore(cold_rt.ns.topic(deleted).waiting, "c1") is None
    assert "c1" not in await packed_ids(cold_rt, deleted)
    info = await topic_info(cold_rt, topic="c")
    assert (info.waiting, info.waiting_cold) == (11, 10)  # packed, due a minute ahead: counted cold till moved in


async def time_calls(rt) -> dict[str, int]:
    """The TIME commands each primary of the cluster ran so far (its scripts' among them)."""
    infos = await rt.redis.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
    return {name: info.get("cmdstat_time", {}).get("calls", 0) for name, info in infos.items()}


async def test_a_cold_messages_times_are_read_on_the_clock_of_its_shards_node(clean_state, monkeypatch):
    """Each node of a cluster has a clock of its own, and a shard's scripts stamp its messages by its
    node's. A cold message's reschedule counted its delay from, and a cold delete stamped its end by,
    a plain TIME, which redis-py sends to one node for all (the clocks cannot be set apart here: what
    is shown is which node answers, its shard's alone)."""
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
    rt = make_runtime(REDIS_CLUSTER_URL, hot_window_millis=5000)
    try:
        await sharded_with_windows(rt, "n", 3)
        ids = [msg_id_in("n", 3, index, "n") for index in range(3)]
        await send_messages(rt, requests=[SendRequest("n", "x", msg_id=msg_id, delay_millis=60_000) for msg_id in ids])
        assert (await topic_info(rt, topic="n")).waiting_cold == 3
        for index, msg_id in enumerate(ids):
            node = rt.redis.get_node_from_key(rt.ns.topic(Shard("n", 3, index)).meta).name
            for operation in (functools.partial(reschedule_message, delay_millis=30_000), delete_message):
                before = await time_calls(rt)
                assert await operation(rt, topic="n", msg_id=msg_id)
                after = await time_calls(rt)
                assert {name for name in after if after[name] > before[name]} == {node}, (operation, index)
    finally:
        await rt.close()


async def test_a_send_that_died_before_its_script_is_not_counted_out_of_a_sharded_topics_cold_messages(windowed):
    """Its log row was committed, its script never ran, so no shard counted it cold; the loader brings
    it in and counts it out of its shard's signed part: the parts added up fell one short of the
    messages still cold, and of the waiting buckets. Due in an hour no part counts a message in, it is
    known to be none of them, as for an unsharded topic (includes/cold_count.lua)."""
    cold_rt, ahead = windowed
    await sharded_with_windows(cold_rt, "d", 3)
    await send_message(cold_rt, request=SendRequest("d", "far", delay_millis=2 * COLD_HOUR_MILLIS))
    now = now_millis()
    # Due after the 5 s window the shards were given, too soon to be packed.
    died = prepared(cold_rt, SendRequest("d", "x", trigger_time=now + 8000), now, {})
    await cold_rt.log.record([died])  # its script never runs
    assert await loaded_by_one_pass(ahead, "d", 3) == 1
    info = await topic_info(cold_rt, topic="d")
    assert (info.waiting, info.waiting_cold, sum(info.waiting_within)) == (2, 1, 2)


@pytest.mark.fault
async def test_a_loader_killed_with_some_shards_loaded_is_resumed_with_nothing_lost_or_doubled(windowed, monkeypatch):
    """A page's shards are loaded by calls of their own: killed after one of them, the next
    loader reads from the shards' least position, and each shard takes only what is after its own."""
    monkeypatch.setattr(loader_module, "PAGE", 4)
    cold_rt, ahead = windowed
    await sharded_with_windows(cold_rt, "k", 3)
    sent = await send_messages(cold_rt, requests=[SendRequest("k", "x", msg_id=f"k{i}", delay_millis=60_000 + i)
                                                  for i in range(12)])
    real_run_all = ahead.scripts.run_all

    async def dying_run_all(calls):
        if calls and calls[0].script is scripts.LOAD_COLD:
            await real_run_all(calls[:1])
            raise SystemExit("killed")
        return await real_run_all(calls)

    first = await cold_loader(ahead, "k", 3)
    monkeypatch.setattr(ahead.scripts, "run_all", dying_run_all)
    with pytest.raises(SystemExit):
        await first.load_topic("k", force=True)
    monkeypatch.setattr(ahead.scripts, "run_all", real_run_all)
    await first.close()
    positions = {await ahead.redis.hget(ahead.ns.topic(shard).meta, "fetched_to")
                 for shard in topic_shards("k", (3,))}
    assert len(positions) == 2  # one shard ahead of the others
    held = sum([len(await packed_ids(ahead, shard)) for shard in topic_shards("k", (3,))])
    second = await cold_loader(ahead, "k", 3)
    try:
        assert await second.load_topic("k", force=True) == 12 - held
    finally:
        await second.close()
    for m in sent:
        assert await where_held(ahead, "k", (3, 1), m.msg_id) == [shard_of("k", m.msg_id, 3)]
    assert sum([len(await packed_ids(ahead, shard)) for shard in topic_shards("k", (3,))]) == 12  # none twice
    assert (await topic_info(ahead, topic="k")).waiting_cold == 12  # packed, a minute ahead: counted cold till moved in


async def test_a_resharded_topics_cold_messages_come_in_through_the_new_counts_shards(clean_state, monkeypatch):
    """A topic with cold messages is sharded. Loading waits SHARDS_SETTLE_MILLIS, then falls to
    the new count's first shard: the cold row comes into its shard of the new count, and the
    count of cold messages adds up over both counts. The new count's sends, hot until its first
    window, are left where they are; a row no shard holds waits while it is young."""
    rt = make_runtime(REDIS_URL, hot_window_millis=1000)
    ahead = make_runtime(REDIS_URL, hot_window_millis=300_000)
    try:
        loader = Loader(rt, lambda: [Shard("c")])
        await loader.load_topic("c", force=True)  # the topic has a window: a send beyond it goes cold
        await loader.close()
        cold = await send_message(rt, request=SendRequest("c", "cold", msg_id="cold-1", delay_millis=60_000))
        assert await where_held(rt, "c", (1,), cold.msg_id) == []  # in the log only
        await shard_topic(rt, "c", 2)
        sharded = await send_messages(rt, requests=[SendRequest("c", "hot", msg_id=f"hot-{i}", delay_millis=60_000)
                                                    for i in range(6)])
        for m in sharded:  # the new count has no window yet: its sends are hot, in their shards
            assert await where_held(rt, "c", (2, 1), m.msg_id) == [shard_of("c", m.msg_id, 2)]
        old, new = Loader(ahead, lambda: [Shard("c")]), await cold_loader(ahead, "c", 2)
        try:
            assert await old.load_once() == 0 and await new.load_once() == 0  # neither loads yet
            assert not await rt.redis.hexists(rt.ns.topic(Shard("c", 2, 0)).meta, "hot_until")
            monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 0)
            assert await old.load_once() == 0  # no longer the topic's loader
            assert await new.load_once() == 0  # the cold row is young
            monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)  # as if it were old
            assert await new.load_topic("c", force=True) == 1
        finally:
            await old.close()
            await new.close()
        assert await where_held(rt, "c", (2, 1), cold.msg_id) == [shard_of("c", cold.msg_id, 2)]
        assert await packed_ids(rt, shard_of("c", cold.msg_id, 2)) == [cold.msg_id]  # due a minute ahead
        for m in sharded:  # none loaded twice
            assert await where_held(rt, "c", (2, 1), m.msg_id) == [shard_of("c", m.msg_id, 2)]
        info = await topic_info(rt, topic="c")
        assert (info.waiting, info.waiting_cold) == (7, 1)
    finally:
        await rt.close()
        await ahead.close()


async def test_a_cold_message_rescheduled_before_the_new_counts_first_window_is_counted_once(clean_state):
    """Before its loader first works it, a new count's shard has no window and no part of the cold
    count: a cold message sent under the old count, rescheduled (it comes in hot), deleted or purged
    there, is counted out of a part the shard starts, as the old count's part counted it in."""
    rt = make_runtime(REDIS_URL, hot_window_millis=1000)
    try:
        loader = Loader(rt, lambda: [Shard("c")])
        await loader.load_topic("c", force=True)  # the topic has a window: a send beyond it goes cold
        await loader.close()
        await send_messages(rt, requests=[SendRequest("c", "cold", msg_id=f"cold-{i}", delay_millis=2 * 3_600_000)
                                          for i in range(3)])
        await shard_topic(rt, "c", 3)
        await reschedule_message(rt, topic="c", msg_id="cold-0", delay_millis=30 * 3_600_000)
        assert await where_held(rt, "c", (3, 1), "cold-0") == [shard_of("c", "cold-0", 3)]
        assert await delete_message(rt, topic="c", msg_id="cold-1")
        info = await topic_info(rt, topic="c")
        assert (info.waiting, info.waiting_cold, sum(info.waiting_within)) == (2, 1, 2)
        assert await purge_topic(rt, topic="c") == 2
        info = await topic_info(rt, topic="c")
        assert (info.waiting, info.waiting_cold, sum(info.waiting_within)) == (0, 0, 0)
    finally:
        await rt.close()


async def test_a_retired_counts_part_of_the_cold_count_goes_to_the_current_count(clean_state, start_scanner,
                                                                                 monkeypatch):
    """Cold messages sent under one count are the next count's to load: the count given up
    retires without waiting for them, and hands its part of the topic's count on."""
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 500)
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 500)
    rt = make_runtime(REDIS_URL, hot_window_millis=1000)
    try:
        await start_scanner(rt)
        # The first send registers the topic, and its loader gives it a window.
        first = await send_message(rt, request=SendRequest("k", "first", delay_millis=60_000))

        async def windowed():
            return await rt.redis.hexists(rt.ns.topic("k").meta, "hot_until")

        await wait_until(windowed, timeout=5, interval=0.05, what="the topic's window")
        await send_messages(rt, requests=[SendRequest("k", "x", msg_id=f"k{i}", delay_millis=60_000) for i in range(5)])
        assert (await topic_info(rt, topic="k")).waiting_cold == 5
        assert await delete_message(rt, topic="k", msg_id=first.msg_id, release=True)  # count 1 holds nothing
        await shard_topic(rt, "k", 2)

        async def retired():
            return (await topic_config(rt, topic="k")).draining_shards == ()

        await wait_until(retired, timeout=15, interval=0.1, what="count 1 retired")

        assert (await topic_info(rt, topic="k")).waiting_cold == 5  # handed on before the count retired
        parts = [await rt.redis.hget(rt.ns.topic(shard).meta, "cold") for shard in topic_shards("k", (2,))]
        assert sorted(parts) == ["2", "3"]  # dealt over the current count's shards
    finally:
        await rt.close()


async def test_a_retired_counts_parts_of_the_cold_count_are_handed_on_whole(rt, monkeypatch):
    """A retired count's shards hand their parts of the topic's cold count, and their hours, to the
    current count's whatever moves in them meanwhile (after a part was taken, before it was added):
    a send gone cold in one, or a cold delete and a send in another hour (the count unchanged), is
    handed on too, not left in a shard no reader adds up once the count is retired."""
    await shard_topic(rt, "h", 2)
    await shard_topic(rt, "h", 3)
    hour, old = now_millis() // COLD_HOUR_MILLIS + 2, topic_shards("h", (2,))
    for shard, hours in zip(old, ({hour: 2, hour + 1: 1}, {hour: 1})):  # as sends gone cold left them
        await rt.redis.hset(rt.ns.topic(shard).meta, mapping={Meta.COLD: sum(hours.values()), Meta.SIGNED: 1})
        await rt.redis.hset(rt.ns.topic(shard).cold_hours, mapping=hours)
    scanner, real_run_all = scanner_module.Scanner(rt), rt.scripts.run_all

    async def moved_before_the_take(calls, **kwargs):
        if calls and calls[0].script is not scripts.HAND_COLD and not moved:
            moved.append(True)
            first, second = (rt.ns.topic(shard) for shard in old)
            await rt.redis.hincrby(first.cold_hours, hour, -1)  # a cold delete and a cold send: the count stays
            await rt.redis.hincrby(first.cold_hours, hour + 2, 1)
            await rt.redis.hincrby(second.meta, Meta.COLD, 1)  # a cold send
            await rt.redis.hincrby(second.cold_hours, hour + 2, 1)
        return await real_run_all(calls, **kwargs)

    moved = []
    monkeypatch.setattr(rt.scripts, "run_all", moved_before_the_take)
    try:
        await scanner._hand_over_cold(old, topic_shards("h", (3,)))
    finally:
        await scanner.loader.close()
    assert moved
    changed_at = (await rt.topic_configs.fresh())["h"].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic="h", count=2,
                                                      changed_at=changed_at)
    await rt.topic_configs.fresh()
    assert (await topic_info(rt, topic="h")).waiting_cold == 5
    handed = Counter()
    for shard in topic_shards("h", (3,)):
        handed.update({int(at): int(n) for at, n in (await rt.redis.hgetall(rt.ns.topic(shard).cold_hours)).items()})
    assert handed == {hour: 2, hour + 1: 1, hour + 2: 2}
    # Each shard holds its share of the live cap (3 of 9) against its part: the whole 5 in the
    # first shard's refused every send to it.
    await set_limits_now(namespace=rt.ns.namespace, topic="h", max_live=9)
    await rt.limits.fresh()
    await send_message(rt, request=SendRequest("h", "x", msg_id=msg_id_in("h", 3, 0, "x")))


def drained_scanner(rt, topic: str, count: int) -> scanner_module.Scanner:
    """A scanner that holds the first shard of the topic's current `count`, as _retire_drained_shards wants."""
    scanner = scanner_module.Scanner(rt)
    scanner.known = {topic}
    scanner.workers[Shard(topic, count, 0)] = None
    return scanner


async def test_a_shrink_to_one_shard_reads_unsharded_only_once_its_count_is_whole(single_rt, monkeypatch):
    """The scanner retired a drained count in the log, then handed its parts of the cold count on: in
    between, the topic read unsharded, and a loader's raise dropped the signed mark of its one shard's
    count, still below 0 (a message gone cold in the old count and loaded into the new)."""
    rt, loop = single_rt, asyncio.get_running_loop()
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", -1)
    await shard_topic(rt, "s", 2)
    await shard_topic(rt, "s", 1)
    hour = now_millis() // COLD_HOUR_MILLIS + 2
    for shard, cold in ((Shard("s", 2, 0), 2), (Shard("s", 2, 1), 1), (Shard("s"), -3)):
        await rt.redis.hset(rt.ns.topic(shard).meta, mapping={Meta.COLD: cold, Meta.SIGNED: 1})
        await rt.redis.hset(rt.ns.topic(shard).cold_hours, mapping={hour: cold})
    real_forget, seen = scanner_module.forget_drained_shards, []

    def forget(**kwargs):  # the one shard's count as the log forgets the count (a thread of its own)
        forgotten = real_forget(**kwargs)
        seen.append(asyncio.run_coroutine_threadsafe(rt.redis.hget(rt.ns.topic("s").meta, Meta.COLD), loop).result())
        return forgotten

    monkeypatch.setattr(scanner_module, "forget_drained_shards", forget)
    scanner = drained_scanner(rt, "s", 1)
    try:
        await scanner._retire_drained_shards()
    finally:
        await scanner.loader.close()
    assert not (await rt.topic_configs.fresh())["s"].draining_shards
    assert seen == ["0"]


class Killed(Exception):
    """The scanner's process dies here (SIGKILL): nothing after this step runs."""


@pytest.mark.parametrize("killed_after", ["the take", "the adding"])
async def test_a_hand_over_cut_short_by_a_kill_is_finished_by_the_next_turn(single_rt, monkeypatch, killed_after):
    """A retired count's parts of the cold count are handed on whole, whichever step a scanner was
    killed after: taken away and not yet added, they were lost (the count short until the loader found
    nothing cold); added and not yet dropped where they were, a second hand-over would add them twice."""
    rt = single_rt
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", -1)
    await shard_topic(rt, "h", 2)
    await shard_topic(rt, "h", 3)
    hour, old, current = now_millis() // COLD_HOUR_MILLIS + 2, topic_shards("h", (2,)), topic_shards("h", (3,))
    for shard, hours in zip(old, ({hour: 2, hour + 1: 1}, {hour: 1})):
        await rt.redis.hset(rt.ns.topic(shard).meta, mapping={Meta.COLD: sum(hours.values()), Meta.SIGNED: 1})
        await rt.redis.hset(rt.ns.topic(shard).cold_hours, mapping=hours)
    watched = old if killed_after == "the take" else current
    real_run_all = rt.scripts.run_all

    async def cold_counts():
        return [await rt.redis.hget(rt.ns.topic(shard).meta, Meta.COLD) for shard in watched]

    before = await cold_counts()

    async def killed_once_moved(calls, **kwargs):
        replies = await real_run_all(calls, **kwargs)
        if await cold_counts() != before:
            raise Killed
        return replies

    monkeypatch.setattr(rt.scripts, "run_all", killed_once_moved)
    first, restarted = drained_scanner(rt, "h", 3), drained_scanner(rt, "h", 3)
    try:
        with pytest.raises(Killed):
            await first._retire_drained_shards()
        monkeypatch.setattr(rt.scripts, "run_all", real_run_all)
        await restarted._retire_drained_shards()
    finally:
        await first.loader.close()
        await restarted.loader.close()
    assert not (await rt.topic_configs.fresh())["h"].draining_shards
    handed = Counter()
    for shard in current:
        handed.update({int(at): int(n) for at, n in (await rt.redis.hgetall(rt.ns.topic(shard).cold_hours)).items()})
    assert handed == {hour: 3, hour + 1: 1}
    assert (await topic_info(rt, topic="h")).waiting_cold == 4


async def test_a_count_left_below_0_by_its_signed_parts_hides_no_cold_send_once_unsharded(single_rt):
    """A sharded topic's signed parts may add up below 0 in an hour (a send that died before its script,
    loaded and counted out); shrunk to one shard, its count turned the topic's own with that hour still
    below 0 when a raise dropped the signed mark, and the next cold send into that hour was hidden (its
    hour back at 0, the count one short), as an unsharded topic's count never hides one."""
    rt = single_rt
    await shard_topic(rt, "u", 2)
    await shard_topic(rt, "u", 1)
    changed_at = (await rt.topic_configs.fresh())["u"].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic="u", count=2,
                                                      changed_at=changed_at)
    await rt.topic_configs.fresh()
    loader = Loader(rt, lambda: [Shard("u")])
    try:
        await loader.load_topic("u", force=True)
        await send_message(rt, request=SendRequest("u", "x", delay_millis=3 * COLD_HOUR_MILLIS))
        k, hour = rt.ns.topic("u"), now_millis() // COLD_HOUR_MILLIS + 5
        # As a hand-over of count 2's parts left it: one message counted out that no part counted in.
        await rt.redis.hset(k.meta, mapping={Meta.COLD: 0, Meta.SIGNED: 1})
        await rt.redis.hset(k.cold_hours, hour, -1)
        assert (await topic_info(rt, topic="u")).waiting_cold == 1
        await loader.load_topic("u", force=True)  # reads the topic unsharded: the count is its own
    finally:
        await loader.close()
    await send_message(rt, request=SendRequest("u", "x", trigger_time=hour * COLD_HOUR_MILLIS))
    assert (await topic_info(rt, topic="u")).waiting_cold == 2
    assert await rt.redis.hget(k.meta, Meta.COLD) == "2"


async def test_a_count_taken_up_again_after_it_retired_starts_without_its_old_window(single_rt):
    rt = single_rt
    loader = Loader(rt, lambda: [Shard("w")])
    await loader.load_topic("w", force=True)
    await loader.close()
    assert await rt.redis.hexists(rt.ns.topic("w").meta, "hot_until")
    await shard_topic(rt, "w", 2)
    assert await rt.redis.hexists(rt.ns.topic("w").meta, "hot_until")  # count 1 drains: its window stays
    changed_at = (await rt.topic_configs.fresh())["w"].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic="w", count=1,
                                                      changed_at=changed_at)
    await rt.topic_configs.fresh()
    await shard_topic(rt, "w", 1)
    assert await rt.redis.hmget(rt.ns.topic("w").meta, ["hot_until", "loaded_to"]) == [None, None]
    m = await send_message(rt, request=SendRequest("w", "x", delay_millis=7_200_000))  # beyond the default window
    assert await rt.redis.hexists(rt.ns.topic("w").msgs, m.msg_id)  # no window: every send goes to Redis


async def test_a_count_taken_up_again_after_it_retired_registers_the_topic_at_its_first_send(rt):
    """A retired count's shards keep their meta, `registered` too: taken up again after the topic
    was retired as idle (out of the registry), its first send answered it registered, so the topic
    stayed out of the registry, unseen by the loader, the monitors, and a scanner started later."""
    sent = await send_message(rt, request=SendRequest("back", "x"))
    assert await delete_message(rt, topic="back", msg_id=sent.msg_id, release=True)
    await shard_topic(rt, "back", 3)
    changed_at = (await rt.topic_configs.fresh())["back"].shards_changed_at
    assert await sync_to_async(forget_drained_shards)(namespace=rt.ns.namespace, topic="back", count=1,
                                                      changed_at=changed_at)
    await rt.topic_configs.fresh()
    await rt.redis.zrem(rt.ns.topics, "back")  # retired as idle, as the scanner does
    await shard_topic(rt, "back", 1)
    await send_message(rt, request=SendRequest("back", "y", delay_millis=60_000))
    assert await rt.redis.zscore(rt.ns.topics, "back") is not None


async def test_an_idle_sharded_topic_is_retired_whole_and_a_send_brings_it_back(clean_state, start_scanner,
                                                                                monkeypatch):
    """Its shards are retired all at once by the holder of its first shard, once all are idle and
    empty and the log holds no cold message of it; the other holders let theirs go."""
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 200)
    monkeypatch.setattr(loader_module, "SHARDS_SETTLE_MILLIS", 200)
    rt = make_runtime(REDIS_URL, topic_idle_seconds=1, topic_check_seconds=1, hot_window_millis=1000)
    try:
        await shard_topic(rt, "idle", 3)
        scanners = [(await start_scanner(rt, f"s{i}")).scanner for i in range(2)]
        sent = await send_messages(rt, requests=[SendRequest("idle", "x", msg_id=f"i{i}") for i in range(6)])
        pulled = await pull_all(rt, "idle", len(sent))
        assert await ack_messages(rt, topic="idle", msg_ids=[m.msg_id for m in pulled])
        first = rt.ns.topic(Shard("idle", 3, 0))

        async def windowed():
            return await rt.redis.hexists(first.meta, "hot_until")

        await wait_until(windowed, timeout=10, interval=0.05, what="the shards' windows")

        async def emptied():  # the acked bodies purged after the retention, their history written
            return not any([await rt.redis.exists(rt.ns.topic(shard).msgs, rt.ns.topic(shard).events)
                            for shard in topic_shards("idle", (3, 1))])

        await wait_until(emptied, timeout=10, interval=0.1, what="the shards emptied")
        cold = await send_message(rt, request=SendRequest("idle", "later", delay_millis=60_000))
        assert await where_held(rt, "idle", (3,), cold.msg_id) == []
        await asyncio.sleep(3)  # idle past the bound, and looked at twice since
        assert await rt.redis.zscore(rt.ns.topics, "idle") is not None  # its cold message keeps it
        assert await delete_message(rt, topic="idle", msg_id=cold.msg_id)

        async def retired():
            return await rt.redis.zscore(rt.ns.topics, "idle") is None

        await wait_until(retired, timeout=15, interval=0.1, what="the idle topic retired")
        for shard in topic_shards("idle", (3,)):
            assert not await rt.redis.hexists(rt.ns.topic(shard).meta, "registered")

        async def let_go():
            return not any(shard.topic == "idle" for scanner in scanners for shard in scanner.workers)

        await wait_until(let_go, timeout=5, interval=0.1, what="every holder letting the shards go")
        again = await send_message(rt, request=SendRequest("idle", "again"))
        assert await rt.redis.zscore(rt.ns.topics, "idle") is not None
        assert [m.msg_id for m in await pull_all(rt, "idle", 1)] == [again.msg_id]
    finally:
        await rt.close()


async def test_a_scanner_that_has_not_read_a_reshard_leaves_the_topic_registered(clean_state, start_scanner):
    """A scanner that takes a count being given up for the topic's current one (it has not read the
    reshard yet) does not retire the topic when that count's shards are idle and empty: the new
    count holds its messages. It retired the topic, taking it out of the registry."""
    # Without the log, the ended message's body is all a shard keeps of it after the retention.
    config = {"topic_idle_seconds": 1, "topic_check_seconds": 1, "message_log": False}
    rt = make_runtime(REDIS_URL, **config)
    try:
        async with stale_runtime(rt, **config) as stale:
            await send_message(rt, request=SendRequest("idle", "x", msg_id="first"))
            await start_scanner(stale)
            await shard_topic(rt, "idle", 3)
            await send_message(rt, request=SendRequest("idle", "x", msg_id="later", delay_millis=60_000))
            assert await ack_messages(rt, topic="idle", msg_ids=[m.msg_id for m in await pull_all(rt, "idle", 1)])

            async def emptied():  # the acked body purged after the retention
                return not await rt.redis.exists(rt.ns.topic("idle").msgs)

            await wait_until(emptied, timeout=20, interval=0.1, what="the count given up emptied")
            await asyncio.sleep(3)  # idle past the bound, and looked at twice since
            assert await rt.redis.zscore(rt.ns.topics, "idle") is not None
    finally:
        await rt.close()


async def test_purging_a_sharded_topic_ends_its_cold_messages(windowed):
    cold_rt, ahead = windowed
    await sharded_with_windows(cold_rt, "p", 3)
    await send_messages(cold_rt, requests=[SendRequest("p", "x", msg_id=f"p{i}", delay_millis=60_000)
                                           for i in range(9)])
    await send_messages(cold_rt, requests=[SendRequest("p", "x", msg_id=f"h{i}") for i in range(3)])
    assert (await topic_info(cold_rt, topic="p")).waiting_cold == 9
    assert await purge_topic(cold_rt, topic="p") == 12
    assert await loaded_by_one_pass(ahead, "p", 3) == 0
    info = await topic_info(cold_rt, topic="p")
    assert (info.waiting, info.waiting_cold, info.ready) == (0, 0, 0)
    for i in range(9):
        assert (await logged("p", f"p{i}"))["status"] == Status.DELETED
