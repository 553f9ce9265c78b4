"""Every state transition of the Lua layer, on a single Redis and on a 3-master Redis Cluster."""
import asyncio
import uuid

import pytest

from delayqueue.api import wire
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Status
from delayqueue.live import scripts, stats
from delayqueue.runtime import Runtime
from delayqueue.services.consume import ack_message, nack_message, pull_messages
from delayqueue.services.messages import delete_message, get_message
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import list_topics, topic_info, topic_infos
from tests.helpers import make_runtime, wait_until


async def send(rt, topic="t", msg="m", delay=0, **kw):
    return await send_message(rt, request=SendRequest(topic=topic, msg=msg, delay_millis=delay, **kw))


async def sizes(rt, topic="t"):
    info = wire.topic_info(await topic_info(rt, topic=topic))
    return info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]


async def test_send_due_now_is_ready_with_defaults(rt):
    m = await send(rt, msg="hello", delay=0)
    assert m.status == Status.READY and m.retry == 0 and len(m.msg_id) == 32
    assert m.trigger_time == m.produce_time
    assert m.expire_time == m.trigger_time + rt.config.ttl_millis
    assert m.max_retry == rt.config.max_retry
    assert await sizes(rt) == (0, 1, 0)
    assert await list_topics(rt) == ["t"]


async def test_generated_msg_ids_are_uuid7_in_time_order(rt):
    """A UUID without its dashes, as camellia's, and version 7: its first 48 bits are the
    produceTime, so ids sort by the millisecond they were made in."""
    sent = []
    for _ in range(3):
        sent += await send_messages(rt, requests=[SendRequest(topic="t", msg=str(i), delay_millis=0) for i in range(50)])
        await asyncio.sleep(0.002)
    ids = [m.msg_id for m in sent]
    assert len(set(ids)) == 150
    for m in sent:
        parsed = uuid.UUID(m.msg_id)
        assert parsed.hex == m.msg_id and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert int(m.msg_id[:12], 16) == m.produce_time
    assert [m.produce_time for m in sorted(sent, key=lambda m: m.msg_id)] == sorted(m.produce_time for m in sent)


async def test_send_delayed_is_waiting_and_defaults_follow_the_le_zero_rules(rt):
    m = await send(rt, delay=60_000, ttl_millis=0, max_retry=-1)
    assert m.status == Status.WAITING
    assert m.trigger_time == m.produce_time + 60_000
    assert m.expire_time == m.trigger_time + rt.config.ttl_millis
    m2 = await send(rt, delay=-5, ttl_millis=1234, max_retry=0)
    assert m2.status == Status.READY and m2.trigger_time == m2.produce_time
    assert m2.expire_time == m2.trigger_time + 1234 and m2.max_retry == 0
    assert await sizes(rt) == (1, 1, 0)


async def test_duplicate_live_msg_id_is_deduplicated(rt):
    first = await send(rt, msg="first", delay=60_000, msg_id="order-1")
    again = await send(rt, msg="second", delay=0, msg_id="order-1")
    assert again == first  # the stored message, not the new request
    assert await sizes(rt) == (1, 0, 0)


async def test_concurrent_sends_of_one_msg_id_store_it_once(rt):
    """Five clients (own connections) race 20 sends each of one msgId: one message is stored
    and enqueued once, and every sender gets that stored message back."""
    clients = [make_runtime(rt.config.redis_url) for _ in range(5)]
    try:
        results = await asyncio.gather(*[
            send(client, msg=f"copy {c}-{i}", delay=60_000, msg_id="same")
            for i in range(20) for c, client in enumerate(clients)
        ])
    finally:
        for client in clients:
            await client.close()
    assert len({(r.payload, r.produce_time) for r in results}) == 1
    assert await sizes(rt) == (1, 0, 0)
    stored = await get_message(rt, topic="t", msg_id="same")
    assert stored.payload == results[0].payload


async def test_duplicate_of_ended_message_answers_it_within_the_dedupe_window_and_starts_afresh_after(rt):
    await send(rt, msg="first", msg_id="order-2")
    [pulled], _ = await pull_messages(rt, topic="t")
    assert (await ack_message(rt, topic="t", msg_id="order-2")).status == Status.ACKED
    again = await send(rt, msg="second", msg_id="order-2")
    assert again.payload == "first" and again.status == Status.ACKED and again.retry == 1
    assert await sizes(rt) == (0, 0, 0)
    no_window = Runtime(rt.config.with_overrides(dedupe_window_millis=0))
    try:
        fresh = await send(no_window, msg="second", msg_id="order-2")
    finally:
        await no_window.close()
    assert fresh.payload == "second" and fresh.status == Status.READY and fresh.retry == 0
    assert await sizes(rt) == (0, 1, 0)


async def test_pull_moves_to_consuming_and_counts_retry(rt):
    sent = await send(rt)
    messages, remaining = await pull_messages(rt, topic="t", batch=5, ack_timeout_millis=10_000)
    assert remaining == 0
    assert [m.msg_id for m in messages] == [sent.msg_id]
    assert messages[0].status == Status.CONSUMING and messages[0].retry == 1
    assert await sizes(rt) == (0, 0, 1)
    assert (await get_message(rt, topic="t", msg_id=sent.msg_id)).status == Status.CONSUMING
    assert await pull_messages(rt, topic="t") == ([], 0)


async def test_batch_pull_is_fifo(rt):
    ids = [(await send(rt, msg=str(i))).msg_id for i in range(20)]
    first, remaining = await pull_messages(rt, topic="t", batch=7)
    assert [m.msg_id for m in first] == ids[:7] and remaining == 13
    rest, remaining = await pull_messages(rt, topic="t", batch=100)
    assert [m.msg_id for m in rest] == ids[7:] and remaining == 0


async def test_ack_only_from_consuming(rt):
    waiting = await send(rt, delay=60_000)
    assert (await ack_message(rt, topic="t", msg_id=waiting.msg_id)).status == Status.WAITING  # left alone
    assert (await get_message(rt, topic="t", msg_id=waiting.msg_id)).status == Status.WAITING
    ready = await send(rt)
    [m], _ = await pull_messages(rt, topic="t")
    assert m.msg_id == ready.msg_id
    assert (await ack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.ACKED
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.ACKED
    assert await sizes(rt) == (1, 0, 0)
    assert (await ack_message(rt, topic="t", msg_id="no-such-id")).status == 0


async def test_deleted_message_cannot_be_acked_back_to_life(rt):
    m = await send(rt)
    await pull_messages(rt, topic="t")
    assert await delete_message(rt, topic="t", msg_id=m.msg_id)
    assert (await ack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED


async def test_nack_requeues_at_once_behind_ready_messages(rt):
    a = await send(rt, msg="a")
    [pulled], _ = await pull_messages(rt, topic="t")
    b = await send(rt, msg="b")
    assert (await nack_message(rt, topic="t", msg_id=a.msg_id)).status == Status.READY
    assert (await get_message(rt, topic="t", msg_id=a.msg_id)).status == Status.READY
    batch, _ = await pull_messages(rt, topic="t", batch=2)
    assert [m.msg_id for m in batch] == [b.msg_id, a.msg_id]
    assert batch[1].retry == 2


async def test_nack_of_last_delivery_ends_with_6(rt):
    m = await send(rt, max_retry=0)
    await pull_messages(rt, topic="t")
    assert (await nack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.EXHAUSTED
    assert await sizes(rt) == (0, 0, 0)
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.EXHAUSTED


async def test_nack_of_unknown_or_not_consuming_changes_nothing(rt):
    m = await send(rt)
    assert (await nack_message(rt, topic="t", msg_id="ghost")).status == 0
    assert (await nack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.READY
    assert await sizes(rt) == (0, 1, 0)  # not pushed a second time


@pytest.mark.parametrize("stage", ["waiting", "ready", "consuming"])
async def test_delete_removes_from_every_structure_at_once(rt, stage):
    m = await send(rt, delay=60_000 if stage == "waiting" else 0)
    if stage == "consuming":
        await pull_messages(rt, topic="t")
    assert await delete_message(rt, topic="t", msg_id=m.msg_id)
    assert await sizes(rt) == (0, 0, 0)
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.DELETED
    assert not await delete_message(rt, topic="t", msg_id=m.msg_id)  # already ended: 404


async def test_delete_with_release_frees_the_body(rt):
    m = await send(rt)
    assert await delete_message(rt, topic="t", msg_id=m.msg_id, release=True)
    assert await get_message(rt, topic="t", msg_id=m.msg_id) is None
    assert not await delete_message(rt, topic="t", msg_id="ghost")


async def test_promote_due_moves_waiting_to_ready_in_trigger_order(rt):
    # Trigger times, not delays: on a busy machine the second send may come over 100 ms after the
    # first. Far enough ahead that "early" is not due before the first look.
    now = now_millis()
    late = await send_message(rt, request=SendRequest(topic="t", msg="late", trigger_time=now + 1400))
    early = await send_message(rt, request=SendRequest(topic="t", msg="early", trigger_time=now + 1300))
    calls = [scripts.promote_due(rt.context, "t")]
    [(moved, next_us, server_now_us, _, counted)] = await rt.scripts.run(calls)
    assert moved == 0 and counted == {} and 0 < next_us <= 1_300_000  # µs until "early" is due
    assert server_now_us + next_us == (now + 1300) * 1000  # its due time by Redis' clock
    # A pull that finds nothing due answers the same for its long poll's wake.
    pulled = await rt.scripts.call(scripts.pull(rt.context, "t", batch=2, consume_rate=0, ack_timeout_millis=0,
                                                max_inflight=0))
    assert pulled.messages == [] and pulled.server_now_us + pulled.next_due_us == (now + 1300) * 1000
    await asyncio.sleep(max(0, now + 1500 - now_millis()) / 1000)
    [(moved, next_us, _, expires_in_us, counted)] = await rt.scripts.run(calls)
    assert moved == 2 and next_us == -1
    # What it counted is answered for the scanner to write (a second of calls at once), not written.
    ready_total, lateness_count = stats.field("total", name=stats.Counter.READY), stats.field("lateness", part="count")
    assert counted[ready_total] == 2 and counted[lateness_count] == 2
    assert await rt.redis.hget(rt.ns.topic("t").stats, ready_total) is None
    assert 0 < expires_in_us <= rt.config.ttl_millis * 1000  # when the first of them expires
    assert (await get_message(rt, topic="t", msg_id=early.msg_id)).status == Status.READY
    batch, _ = await pull_messages(rt, topic="t", batch=2)
    assert [m.msg_id for m in batch] == [early.msg_id, late.msg_id]


async def test_scanner_requeues_ack_timeout_then_exhausts_retries(rt, start_scanner):
    m = await send(rt, max_retry=1)
    await start_scanner(rt)
    [first], _ = await pull_messages(rt, topic="t", ack_timeout_millis=100)
    assert first.retry == 1

    async def pulled_again():
        got, _ = await pull_messages(rt, topic="t", ack_timeout_millis=100)
        return got

    [second] = await wait_until(pulled_again, what="the timed-out message to come back")
    assert second.msg_id == m.msg_id and second.retry == 2

    async def ended():
        stored = await get_message(rt, topic="t", msg_id=m.msg_id)
        return stored.status == Status.EXHAUSTED and stored

    final = await wait_until(ended, what="retries to run out")
    assert final.retry == 2
    assert await sizes(rt) == (0, 0, 0)


async def test_ttl_expiry_gives_5_when_never_delivered_and_6_when_delivered(rt, start_scanner):
    never = await send(rt, msg="never", ttl_millis=150)
    waiting = await send(rt, msg="waiting", delay=50, ttl_millis=100, topic="w")
    delivered = await send(rt, msg="delivered", ttl_millis=150, topic="d")
    [got], _ = await pull_messages(rt, topic="d", ack_timeout_millis=60_000)
    await start_scanner(rt)

    async def status(topic, msg_id):
        return (await get_message(rt, topic=topic, msg_id=msg_id)).status

    async def all_ended():
        return (await status("t", never.msg_id), await status("w", waiting.msg_id),
                await status("d", delivered.msg_id)) == (Status.EXPIRED, Status.EXPIRED, Status.EXHAUSTED)

    await wait_until(all_ended, what="messages to expire")
    for topic in ("t", "w", "d"):
        assert await sizes(rt, topic) == (0, 0, 0)


async def test_a_promoted_message_expires_at_its_ttl_though_it_entered_the_expiry_index_late(rt, start_scanner):
    """A waiting message enters the expiry index as it becomes ready; the scanner's TTL timer,
    asleep towards nothing (an empty index: its idle bound, seconds), is told of it by the promotion."""
    m = await send(rt, delay=300, ttl_millis=700)
    await start_scanner(rt)
    k = rt.ns.topic("t")

    async def ended():  # the ended index, not getMsg, which would end the message itself
        return await rt.redis.zscore(k.ended, m.msg_id)

    purge_at = await wait_until(ended, what="the message to expire")
    assert m.expire_time <= purge_at - rt.config.ended_retention_millis < m.expire_time + 1_000
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.EXPIRED


async def test_pull_never_returns_an_expired_message(rt):
    m = await send(rt, ttl_millis=50)
    await asyncio.sleep(0.1)  # no scanner: pull itself must notice
    assert await pull_messages(rt, topic="t") == ([], 0)
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.EXPIRED


async def test_ended_messages_are_purged_after_retention(rt, start_scanner):
    m = await send(rt)
    await pull_messages(rt, topic="t")
    await ack_message(rt, topic="t", msg_id=m.msg_id)
    await start_scanner(rt)
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.ACKED

    async def gone():
        return await get_message(rt, topic="t", msg_id=m.msg_id) is None

    await wait_until(gone, timeout=10, what="the retention window to pass")


async def test_retire_topic_only_when_idle_and_empty(rt):
    await send(rt, topic="busy", delay=60_000)
    await send(rt, topic="idle")
    [m], _ = await pull_messages(rt, topic="idle")
    await ack_message(rt, topic="idle", msg_id=m.msg_id)

    async def retire(topic):
        return (await rt.scripts.call(scripts.retire_topic(rt.context, topic, idle_millis=0))).retired

    assert not await retire("busy")
    assert not await retire("idle")  # the acked body is still retained
    k = rt.ns.topic("idle")
    await rt.redis.delete(k.msgs, k.ended)
    assert not await retire("idle")  # its history has not reached the message log yet
    await rt.redis.xtrim(k.events, maxlen=0)  # as the log writer leaves a drained stream
    await rt.redis.hset(k.meta, "live_share", 3)  # room it held of a namespace live cap
    assert await rt.scripts.call(scripts.retire_topic(rt.context, "idle", idle_millis=0)) == (True, 3, "")
    assert not await rt.redis.hget(k.meta, "live_share")  # for the scanner to give back
    assert not await rt.redis.exists(k.events)
    # The next send registers the topic again.
    assert not await rt.redis.hget(k.meta, "registered")
    await rt.redis.zrem(rt.ns.topics, "idle")
    await send(rt, topic="idle")
    assert "idle" in await list_topics(rt)


async def test_batch_send_one_round_trip_many_topics(rt):
    messages = [SendRequest(topic=f"b{i % 5}", msg=str(i), delay_millis=0 if i % 2 else 60_000) for i in range(50)]
    results = await send_messages(rt, requests=messages)
    assert [r.payload for r in results] == [str(i) for i in range(50)]
    assert sorted(await list_topics(rt)) == [f"b{i}" for i in range(5)]
    infos = [wire.topic_info(info) for info in await topic_infos(rt, topics=[f"b{i}" for i in range(5)])]
    assert sum(i["readyQueueSize"] for i in infos) == 25 and sum(i["waitingQueueSize"] for i in infos) == 25


@pytest.mark.fault
async def test_script_calls_survive_their_connection_being_killed(single_rt):
    """Redis closing the scripts' connection (restart, failover, CLIENT KILL) costs no call."""
    rt = single_rt
    await send(rt)
    for _ in range(3):
        killed = await rt.redis.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
        assert killed >= 1
        assert (await send(rt)).status == Status.READY
        results = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=0)] * 3)
        assert all(r.status == Status.READY for r in results)


@pytest.mark.fault
async def test_scripts_reload_after_the_script_cache_is_flushed(rt):
    await send(rt)
    await rt.redis.script_flush()
    m = await send(rt)  # NOSCRIPT -> load -> retry
    assert m.status == Status.READY
    await rt.redis.script_flush()
    results = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=0)] * 3)
    assert all(r.status == Status.READY for r in results)
