"""Priorities: pulls take higher priorities first and each priority oldest first, on a single Redis
and on the Redis Cluster; every move of a ready message keeps its priority; a topic that never
uses priority touches only the ready list; sendMsg over HTTP; and FLUSHALL + restore with messages
in every state the consumer-control and topic-settings work added."""
import asyncio

import pytest

from delayqueue.core.constants import Status
from delayqueue.live.keys import TopicKeys
from delayqueue.runtime import Runtime
from delayqueue.services.consume import ack_message, long_poll_messages, nack_message, pull_messages
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import purge_topic, topic_info
from tests.helpers import call, dead_letter_page, drain_log, promote, requeue


async def send(rt, msg_id, priority=0, delay=0, topic="t", **kw):
    return await send_message(rt, request=SendRequest(topic=topic, msg=f"body of {msg_id}", delay_millis=delay, msg_id=msg_id, priority=priority, **kw))


async def pulled_ids(rt, batch=100, topic="t", ack_timeout_millis=60_000):
    got, _ = await pull_messages(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis)
    return [m.msg_id for m in got]


async def get(rt, msg_id, topic="t"):
    return await get_message(rt, topic=topic, msg_id=msg_id)


async def topic_key_names(rt, topic="t") -> set[str]:
    """The TopicKeys fields of every key Redis holds for the topic (on every node of a cluster);
    a key of no field fails."""
    k = rt.ns.topic(topic)
    fields = {getattr(k, name): name for name in TopicKeys.__dataclass_fields__ if name != "topic"}
    tag = k.ready[:-len("ready")]
    return {fields[key] async for key in rt.redis.scan_iter(match=tag + "*")}


async def test_pulls_take_higher_priorities_first_and_each_oldest_first(rt):
    for msg_id, priority in [("a0", 0), ("b3", 3), ("c9", 9), ("d3", 3), ("e0", 0), ("f9", 9), ("g1", 1)]:
        sent = await send(rt, msg_id, priority)
        assert sent.priority == priority
    assert (await topic_info(rt, topic="t")).ready == 7
    assert await pulled_ids(rt, batch=3) == ["c9", "f9", "b3"]
    assert (await topic_info(rt, topic="t")).ready == 4
    # Later arrivals of a priority go behind the earlier ones still there.
    await send(rt, "h3", 3)
    await send(rt, "i9", 9)
    assert await pulled_ids(rt, batch=1) == ["i9"]
    assert await pulled_ids(rt) == ["d3", "h3", "g1", "a0", "e0"]
    assert not await rt.redis.exists(rt.ns.topic("t").prioritised)  # gone with its last member


async def test_messages_falling_due_go_to_their_priority(rt):
    await send(rt, "now0")
    for msg_id, priority in [("late0", 0), ("late5", 5), ("late2", 2)]:
        await send(rt, msg_id, priority, delay=100)
    await asyncio.sleep(0.12)
    await promote(rt)
    assert [(await get(rt, m)).status for m in ("late0", "late5", "late2")] == [Status.READY] * 3
    assert await pulled_ids(rt) == ["late5", "late2", "now0", "late0"]


async def test_a_topic_without_priority_uses_only_the_ready_list(rt):
    await send(rt, "a")
    await send(rt, "b", delay=20)
    assert (await get(rt, "a")).priority == 0
    await asyncio.sleep(0.03)
    await promote(rt)
    assert await pulled_ids(rt, batch=1, ack_timeout_millis=1) == ["a"]
    await asyncio.sleep(0.01)
    await requeue(rt)
    await pulled_ids(rt)
    await nack_message(rt, topic="t", msg_id="b")
    await reschedule_message(rt, topic="t", msg_id="b", delay_millis=0)
    await purge_topic(rt, topic="t")
    assert "prioritised" not in await topic_key_names(rt)
    assert (await topic_info(rt, topic="t")).ready == 0


async def test_nack_ack_timeout_and_reschedule_keep_a_messages_priority(rt):
    await send(rt, "hi", 5)
    await send(rt, "lo")
    assert await pulled_ids(rt, batch=1, ack_timeout_millis=1) == ["hi"]
    await asyncio.sleep(0.01)
    assert (await requeue(rt)).count == 1
    assert (await get(rt, "hi")).priority == 5
    assert await pulled_ids(rt, batch=1) == ["hi"]  # ahead of the older "lo" again
    assert (await nack_message(rt, topic="t", msg_id="hi")).done
    assert await pulled_ids(rt, batch=1) == ["hi"]
    await nack_message(rt, topic="t", msg_id="hi", delay_millis=20)
    await asyncio.sleep(0.03)
    assert (await promote(rt)).count == 1
    # Ready -> waiting -> due now by reschedule, then ready -> ready: still ahead of "lo".
    await reschedule_message(rt, topic="t", msg_id="hi", delay_millis=60_000)
    assert (await get(rt, "hi")).status == Status.WAITING
    moved = await reschedule_message(rt, topic="t", msg_id="hi", delay_millis=0)
    assert (moved.status, moved.priority) == (Status.READY, 5)
    await reschedule_message(rt, topic="t", msg_id="hi", delay_millis=0)
    assert await pulled_ids(rt) == ["hi", "lo"]


async def test_delete_expiry_purge_and_a_resend_take_a_prioritised_message_out(rt):
    await send(rt, "del", 4)
    await send(rt, "resent", 4)
    await send(rt, "short", 4, ttl_millis=20)
    await send(rt, "p", 7)
    await send(rt, "z")
    assert await delete_message(rt, topic="t", msg_id="del")
    await asyncio.sleep(0.03)
    assert (await get(rt, "short")).status == Status.EXPIRED  # a reader ends it, out of the set
    await pull_messages(rt, topic="t", batch=1)  # "p"
    await ack_message(rt, topic="t", msg_id="p")
    # The same msgId sent again once the first life ended (no dedupe window): the old one's place
    # goes with it.
    no_window = Runtime(rt.config.with_overrides(dedupe_window_millis=0))
    try:
        await send(no_window, "p", 2)
    finally:
        await no_window.close()
    k = rt.ns.topic("t")
    assert set(await rt.redis.zrange(k.prioritised, 0, -1)) == {"resent", "p"}
    assert await purge_topic(rt, topic="t") == 3
    assert not await rt.redis.exists(k.prioritised) and not await rt.redis.exists(k.ready)


async def test_long_polls_take_priorities_in_order_and_wake_for_a_prioritised_send(rt):
    held = asyncio.create_task(long_poll_messages(rt, topic="t", batch=5, timeout_millis=5_000))
    await asyncio.sleep(0.1)
    assert not held.done()
    await send(rt, "first", 6)
    got = await asyncio.wait_for(held, 3)
    assert [m.msg_id for m in got] == ["first"] and got[0].priority == 6
    await send(rt, "z0")
    await send(rt, "y4", 4)
    await send(rt, "x8", 8)
    got = await long_poll_messages(rt, topic="t", batch=2, timeout_millis=1_000)
    assert [m.msg_id for m in got] == ["x8", "y4"]
    got = await long_poll_messages(rt, topic="t", batch=2, timeout_millis=1_000)
    assert [m.msg_id for m in got] == ["z0"]
    # A held poll is woken by a prioritised message falling due.
    held = asyncio.create_task(long_poll_messages(rt, topic="t", batch=5, timeout_millis=5_000))
    await asyncio.sleep(0.1)
    await send(rt, "w3", 3, delay=50)
    await asyncio.sleep(0.08)
    await promote(rt)
    assert [m.msg_id for m in await asyncio.wait_for(held, 3)] == ["w3"]


# --- over HTTP

async def test_http_send_with_a_priority(api):
    plain = (await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId="plain"))["delayMsg"]
    assert "priority" not in plain  # answered exactly as before priorities
    high = (await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId="high", priority="9"))["delayMsg"]
    assert high["priority"] == 9
    batch = await call(api, "sendMsgBatch", json=[{"topic": "h", "msg": "x", "delayMillis": 0, "msgId": "mid",
                                                   "priority": 4}])
    assert batch["results"][0]["delayMsg"]["priority"] == 4
    pulled = (await call(api, "pullMsg", topic="h", batch="3"))["delayMsgList"]
    assert [(m["msgId"], m.get("priority")) for m in pulled] == [("high", 9), ("mid", 4), ("plain", None)]


@pytest.mark.parametrize("value, problem", [
    ("10", "priority: Ensure this value is less than or equal to 9."),
    ("-1", "priority: Ensure this value is greater than or equal to 0."),
    ("high", "priority: A valid integer is required."),
])
async def test_http_send_refuses_a_bad_priority(api, value, problem):
    body = await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", priority=value)
    assert body == {"code": 400, "msg": problem}
    batch = await call(api, "sendMsgBatch", json=[{"topic": "h", "msg": "x", "delayMillis": 0, "priority": value},
                                                  {"topic": "h", "msg": "ok", "delayMillis": 0}])
    assert batch["results"][0] == {"code": 400, "msg": f"message 0: {problem}"}
    assert batch["results"][1]["code"] == 200
    assert (await call(api, "getTopicInfo", topic="h"))["data"]["readyQueueSize"] == 1


# --- FLUSHALL + restore with messages in every new state

@pytest.mark.fault
async def test_restore_gives_back_every_new_state_exactly(rt):
    # Backed off: an ack timeout under the topic's retry backoff left it waiting, its triggerTime moved.
    await set_topic_config(rt, topic="bo", changes={"retry_backoff_millis": 600_000}, limits={})
    await send(rt, "backed", 3, topic="bo")
    await pulled_ids(rt, topic="bo", ack_timeout_millis=1)
    await asyncio.sleep(0.01)
    await requeue(rt, topic="bo")
    # Nacked with a delay, and dead-lettered by its consumer.
    await send(rt, "nacked", 2, max_retry=5)
    await send(rt, "dead")
    await pulled_ids(rt)
    await nack_message(rt, topic="t", msg_id="nacked", delay_millis=1_800_000)
    await nack_message(rt, topic="t", msg_id="dead", dead_letter=True)
    # Rescheduled, and ready at several priorities.
    await send(rt, "later", 7, delay=60_000)
    await reschedule_message(rt, topic="t", msg_id="later", delay_millis=3_600_000)
    for msg_id, priority in [("r0a", 0), ("r5", 5), ("r9a", 9), ("r0b", 0), ("r9b", 9), ("r1", 1)]:
        await send(rt, msg_id, priority)
    # In a paused topic.
    await send(rt, "still", 8, topic="paused")
    await pause_topic(rt, topic="paused")

    live = {("bo", "backed"), ("t", "nacked"), ("t", "later"), ("paused", "still"),
            *(("t", m) for m in ("r0a", "r5", "r9a", "r0b", "r9b", "r1"))}
    before = {key: await get(rt, key[1], topic=key[0]) for key in live}
    assert before[("bo", "backed")].status == Status.WAITING and before[("bo", "backed")].retry == 1
    assert before[("t", "nacked")].status == Status.WAITING
    await drain_log(rt, ["t", "bo", "paused"])

    await rt.redis.flushall()
    counts = await restore(rt)
    assert (counts.restored, counts.skipped) == (len(live), 1)  # the dead letter stays ended
    for (topic, msg_id), old in before.items():
        assert await get(rt, msg_id, topic=topic) == old, msg_id  # status, times, retry, priority
    assert await get(rt, "dead") is None
    dead, _ = await dead_letter_page(rt, topic="t", limit=10, cursor=None)
    assert [m["msgId"] for m in dead] == ["dead"]
    assert await pulled_ids(rt) == ["r9a", "r9b", "r5", "r1", "r0a", "r0b"]
    assert await pulled_ids(rt, topic="paused") == []
    assert (await rt.redis.hget(rt.ns.topic("paused").meta, "paused")) == "1"
    await resume_topic(rt, topic="paused")
    assert await pulled_ids(rt, topic="paused") == ["still"]
    assert await rt.redis.zscore(rt.ns.topic("bo").waiting, "backed") == before[("bo", "backed")].trigger_time
