"""Sharded topics (live/shards.py): one topic's messages over many key sets, each in a slot of its
own, on the single Redis and on the 3-master Cluster."""
import asyncio
import random
import signal
import time
from collections import Counter

import pytest
from redis.asyncio.cluster import RedisCluster

from delayqueue.core.constants import Reason, Status
from delayqueue.core.exceptions import Conflict
from delayqueue.live.keys import Shard
from delayqueue.live.shards import shard_of, topic_shards
from delayqueue.ops.figures import live_state, topic_overview
from delayqueue.services.consume import (ack_message, ack_messages, long_poll_messages, nack_message, pull_messages,
                                         touch_message)
from delayqueue.services.dead_letters import create_redrive, dead_letters, redrive_state
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import monitor_data, purge_topic, topic_config, topic_info
from delayqueue.workers import loader as loader_module
from delayqueue.workers import scanner as scanner_module
from delayqueue.workers.loader import Loader
from tests.helpers import REDIS_CLUSTER_URL, REDIS_URL, call, make_runtime, wait_until
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


async def test_sends_pulls_and_acks_over_shards_and_the_counters_add_up(rt):
    """The same requests on a sharded topic and an unsharded one: the same answers and counters."""
    await shard_topic(rt, "t", 4)
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


async def test_bad_shard_counts_and_unshardable_topics_are_refused(api, single_rt):
    for bad in (0, 257, "two"):
        answer = await call(api, "setTopicConfig", topic="t", shards=bad)
        assert answer["code"] == 400 and "shards" in answer["msg"], answer
    answer = await call(api, "setTopicConfig", topic="t", shards=8)
    assert answer["code"] == 200 and answer["data"]["shards"] == 8 and answer["data"]["drainingShards"] == [1]
    # A namespace's live cap is shared out in the topics' own keys: no topic of it is sharded.
    await set_limits_now(namespace="default", max_live=1000)
    await single_rt.limits.fresh()
    answer = await call(api, "setTopicConfig", topic="u", shards=2)
    assert answer["code"] == 400 and "live-message cap" in answer["msg"], answer


@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
async def test_resharding_under_load_loses_and_doubles_nothing(clean_state, start_scanner, monkeypatch, cluster):
    """1 -> 4 -> 2 shards while a producer sends and a consumer pulls and acks; then the counts
    given up are retired once empty."""
    monkeypatch.setattr(scanner_module, "SHARDS_SETTLE_MILLIS", 1_000)
    rt = make_runtime(REDIS_CLUSTER_URL if cluster else REDIS_URL)
    try:
        await start_scanner(rt)
        sent: list[str] = []
        delivered: Counter = Counter()
        stop = asyncio.Event()

        async def produce():
            n = 0
            while not stop.is_set():
                batch = [SendRequest("r", "x", msg_id=f"r{n + i}", delay_millis=random.choice((0, 0, 50, 300)))
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
    finally:
        await rt.close()


async def test_restore_rebuilds_every_shard(rt):
    await shard_topic(rt, "back", 3)
    sent = await send_messages(rt, requests=[SendRequest("back", f"b{i}", msg_id=f"b{i}", delay_millis=60_000)
                                             for i in range(30)])
    if isinstance(rt.redis, RedisCluster):
        await rt.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await rt.redis.flushall()
    counts = await restore(rt)
    assert counts.restored == 30
    held = await held_per_shard(rt, "back", (3,))
    assert sum(held.values()) == 30 and all(held.values())
    for m in sent:
        assert (await get_message(rt, topic="back", msg_id=m.msg_id)).trigger_time == m.trigger_time
    for shard in topic_shards("back", (3,)):  # the settings' mirror came back with them
        assert await rt.redis.hget(rt.ns.topic(shard).meta, "paused") == "0"


@pytest.mark.process
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


async def test_the_cold_tier_loads_a_topics_own_cold_messages_and_leaves_its_sharded_ones(clean_state, monkeypatch):
    """A topic with cold messages is sharded: the loader still brings them into the topic's own
    keys, and leaves out the sharded sends' rows, which their shards hold already. A row no
    shard holds waits while it is young: its send may be on its way to a shard."""
    rt = make_runtime(REDIS_URL, hot_window_millis=1000)
    ahead = make_runtime(REDIS_URL, hot_window_millis=300_000)  # a loader whose window covers them
    try:
        loader = Loader(rt, lambda: ["c"])
        await loader.load_topic("c", force=True)  # the topic has a window: a send beyond it goes cold
        await loader.close()
        cold = await send_message(rt, request=SendRequest("c", "cold", msg_id="cold-1", delay_millis=60_000))
        assert not await rt.redis.hexists(rt.ns.topic("c").msgs, cold.msg_id)  # in the log only
        await shard_topic(rt, "c", 2)
        sharded = await send_messages(rt, requests=[SendRequest("c", "hot", msg_id=f"hot-{i}", delay_millis=60_000)
                                                    for i in range(6)])
        for m in sharded:  # a sharded topic's sends are hot, in their shards
            assert await rt.redis.hexists(rt.ns.topic(shard_of("c", m.msg_id, 2)).msgs, m.msg_id)
        loader = Loader(ahead, lambda: ["c"])
        try:
            assert await loader.load_topic("c", force=True) == 0  # the cold row is young
            monkeypatch.setattr(loader_module, "IN_FLIGHT_MILLIS", 0)  # as if it were old
            assert await loader.load_topic("c", force=True) == 1
        finally:
            await loader.close()
        own = rt.ns.topic("c")
        assert await rt.redis.zscore(own.waiting, cold.msg_id) == cold.trigger_time
        assert [m.msg_id for m in sharded if await rt.redis.hexists(own.msgs, m.msg_id)] == []
        assert (await topic_info(rt, topic="c")).waiting == 7
    finally:
        await rt.close()
        await ahead.close()
