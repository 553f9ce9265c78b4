"""What consumers and operators do to a message beyond ack: ack results and batch acks, nack with a
delay or as a dead letter, touch, reschedule and sends with a triggerTime. Each transition on a
single Redis and on the Redis Cluster, its history row and its log row; then over HTTP with good
and bad input; then FLUSHALL + restore."""
import asyncio
import time

import pytest

from delayqueue.core.constants import Status
from delayqueue.core.exceptions import Conflict, NotFound
from delayqueue.services.consume import ack_message, ack_messages, nack_message, pull_messages, touch_message
from delayqueue.services.messages import get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import topic_info
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, call, drain_log, history, logged, make_runtime, promote,
                           requeue)


async def send(rt, msg_id, delay=0, topic="t", **kw):
    return await send_message(rt, request=SendRequest(topic=topic, msg=f"body of {msg_id}", delay_millis=delay, msg_id=msg_id, **kw))


async def pull(rt, batch=10, ack_timeout_millis=60_000, topic="t"):
    return (await pull_messages(rt, topic=topic, batch=batch, ack_timeout_millis=ack_timeout_millis))[0]


async def get(rt, msg_id, topic="t"):
    return await get_message(rt, topic=topic, msg_id=msg_id)


async def redis_now(rt) -> int:
    seconds, micros = await rt.redis.time()
    return seconds * 1000 + micros // 1000


async def structures(rt, msg_id, topic="t") -> dict:
    """Where Redis holds the message: its waiting, in-flight and expiry scores and its ready-list membership."""
    k = rt.ns.topic(topic)
    return {"waiting": await rt.redis.zscore(k.waiting, msg_id), "inflight": await rt.redis.zscore(k.inflight, msg_id),
            "ready": msg_id in await rt.redis.lrange(k.ready, 0, -1), "expiry": await rt.redis.zscore(k.expiry, msg_id)}


# --- ack results and batch acks

async def test_ack_says_whether_it_acked_a_consuming_message(rt):
    await send(rt, "a")
    await send(rt, "w", delay=60_000)
    await pull(rt)
    assert await ack_message(rt, topic="t", msg_id="a") == (True, Status.ACKED)
    assert await ack_message(rt, topic="t", msg_id="a") == (False, Status.ACKED)  # already ended
    assert await ack_message(rt, topic="t", msg_id="ghost") == (False, 0)
    assert await ack_message(rt, topic="t", msg_id="w") == (False, Status.WAITING)
    assert await nack_message(rt, topic="t", msg_id="w") == (False, Status.WAITING)


async def test_an_ack_after_the_ack_timeout_gave_it_back_is_not_done(rt):
    await send(rt, "late")
    await pull(rt, ack_timeout_millis=1)
    await asyncio.sleep(0.01)
    assert (await requeue(rt)).count == 1
    assert await ack_message(rt, topic="t", msg_id="late") == (False, Status.READY)
    assert (await get(rt, "late")).status == Status.READY


async def test_a_late_settle_naming_its_delivery_leaves_the_next_delivery_alone(rt):
    await send(rt, "m")
    [first] = await pull(rt, ack_timeout_millis=1)
    await asyncio.sleep(0.01)
    assert (await requeue(rt)).count == 1
    [second] = await pull(rt)
    assert (first.retry, second.retry) == (1, 2)
    # The first consumer's calls, late: each names its delivery, which has ended.
    assert await ack_message(rt, topic="t", msg_id="m", retry=1) == (False, Status.CONSUMING)
    assert await nack_message(rt, topic="t", msg_id="m", retry=1, dead_letter=True) == (False, Status.CONSUMING)
    assert await ack_messages(rt, topic="t", msg_ids=["m"], retries=[1]) == [False]
    assert await ack_messages(rt, topic="t", msg_ids=["m"], ack=False, retries=[1]) == [False]
    with pytest.raises(Conflict, match=r"message m was delivered again \(retry 2\): the delivery of retry 1 has ended"):
        await touch_message(rt, topic="t", msg_id="m", ack_timeout_millis=60_000, retry=1)
    assert (await get(rt, "m")).status == Status.CONSUMING
    assert (await structures(rt, "m"))["inflight"] is not None  # still the second delivery's deadline
    # The second consumer's, naming its own.
    assert await touch_message(rt, topic="t", msg_id="m", ack_timeout_millis=60_000, retry=2) > 0
    # A msgId given twice is settled by its first mention only.
    assert await ack_messages(rt, topic="t", msg_ids=["m", "m"], retries=[1, 2]) == [False, False]
    assert await ack_message(rt, topic="t", msg_id="m", retry=2) == (True, Status.ACKED)


async def test_batch_ack_answers_each_msg_id_in_order(rt):
    for msg_id in "abc":
        await send(rt, msg_id)
    await pull(rt)
    assert await ack_messages(rt, topic="t", msg_ids=["a", "ghost", "b", "a", "c"]) == [
        True, False, True, False, True]
    assert [(await get(rt, msg_id)).status for msg_id in "abc"] == [Status.ACKED] * 3
    assert (await topic_info(rt, topic="t")).consuming == 0



@pytest.fixture(params=["single", "cluster"])
async def big_batch_rt(request, clean_state):
    """A runtime whose pulls take 2,500 messages, and whose scanner calls handle 2,600: more than
    one chunk of a script's variadic commands (includes/chunked.lua)."""
    runtime = make_runtime(REDIS_URL if request.param == "single" else REDIS_CLUSTER_URL, max_pull_batch=2_500,
                           scanner_batch=2_600)
    yield runtime
    await runtime.close()


async def test_a_pull_and_an_ack_of_more_than_a_chunk_each_move_every_message_once(big_batch_rt):
    rt = big_batch_rt
    sent = await send_messages(rt, requests=[SendRequest(topic="t", msg=f"body {i}", msg_id=f"m{i}")
                                             for i in range(2_600)])
    assert all(not isinstance(m, Exception) for m in sent)
    pulled = await pull(rt, batch=2_500)
    assert sorted(m.msg_id for m in pulled) == sorted(f"m{i}" for i in range(2_500))
    assert {(m.status, m.retry) for m in pulled} == {(Status.CONSUMING, 1)}
    k = rt.ns.topic("t")
    assert await rt.redis.zcard(k.inflight) == 2_500
    ids = [m.msg_id for m in pulled]
    assert await ack_messages(rt, topic="t", msg_ids=ids) == [True] * 2_500
    assert await rt.redis.zcard(k.inflight) == 0
    assert await rt.redis.zcard(k.ended) == 2_500
    assert {(await get(rt, msg_id)).status for msg_id in ids[::250]} == {Status.ACKED}
    assert [m.msg_id for m in await pull(rt, batch=2_500)] == [f"m{i}" for i in range(2_500, 2_600)]
    await drain_log(rt, ["t"])
    assert await history("t", ids[-1]) == [("sent", 0, Status.READY, 0), ("pulled", Status.READY, Status.CONSUMING, 1),
                                           ("acked", Status.CONSUMING, Status.ACKED, 1)]


async def test_a_promotion_of_more_than_a_chunk_makes_each_message_ready_once_in_trigger_order(big_batch_rt):
    rt = big_batch_rt
    due = await redis_now(rt) + 3_000  # the sends must all land before it, on a loaded machine too
    # Every seventh at priority 3, which has its own ready structure; the rest on the ready list.
    sent = await send_messages(rt, requests=[
        SendRequest(topic="t", msg=f"body {i}", msg_id=f"m{i}", trigger_time=due + i // 100,
                    priority=3 if i % 7 == 0 else 0) for i in range(2_600)])
    assert all(not isinstance(m, Exception) for m in sent)
    assert {m.status for m in sent} == {Status.WAITING}  # else the promotion below has less to move
    while await redis_now(rt) < due + 30:
        await asyncio.sleep(0.05)
    assert (await promote(rt)).count == 2_600
    k = rt.ns.topic("t")
    assert await rt.redis.zcard(k.waiting) == 0 and await rt.redis.zcard(k.expiry) == 2_600
    info = await topic_info(rt, topic="t")
    assert (info.waiting, info.ready) == (0, 2_600)
    prioritised = [f"m{i}" for i in range(2_600) if i % 7 == 0]
    plain = [f"m{i}" for i in range(2_600) if i % 7]
    pulled = [m.msg_id for m in await pull(rt, batch=2_500)] + [m.msg_id for m in await pull(rt, batch=2_500)]
    # The higher priority first; within a priority in triggerTime order (ties by msgId, as the
    # waiting set orders them).
    by_trigger = lambda ids: sorted(ids, key=lambda msg_id: (int(msg_id[1:]) // 100, msg_id))
    assert pulled == by_trigger(prioritised) + by_trigger(plain)
    await drain_log(rt, ["t"])
    assert await history("t", "m2599") == [("sent", 0, Status.WAITING, 0), ("due", Status.WAITING, Status.READY, 0),
                                           ("pulled", Status.READY, Status.CONSUMING, 1)]


async def test_an_id_twice_on_the_ready_list_is_handed_out_once(rt):
    for msg_id in "ab":
        await send(rt, msg_id)
    await rt.redis.lpush(rt.ns.topic("t").ready, "a")  # a stale second entry
    pulled = await pull(rt)
    assert sorted(m.msg_id for m in pulled) == ["a", "b"]
    assert await pull(rt) == []
    assert (await topic_info(rt, topic="t")).consuming == 2

async def test_batch_nack_with_a_delay_or_as_dead_letters(rt):
    for msg_id in "abcd":
        await send(rt, msg_id)
    await pull(rt)
    assert await ack_messages(rt, topic="t", msg_ids=["a", "b"], ack=False, delay_millis=60_000) == [True, True]
    assert await ack_messages(rt, topic="t", msg_ids=["c", "ghost"], ack=False, dead_letter=True) == [True, False]
    assert await ack_messages(rt, topic="t", msg_ids=["d"], ack=False) == [True]
    assert [(await get(rt, msg_id)).status for msg_id in "abcd"] == [
        Status.WAITING, Status.WAITING, Status.EXHAUSTED, Status.READY]


# --- nack with a delay, and dead-lettering

async def test_nack_with_a_delay_waits_then_falls_due_with_its_retry_count_kept(rt):
    sent = await send(rt, "n")
    await pull(rt)
    before = await redis_now(rt)
    assert await nack_message(rt, topic="t", msg_id="n", delay_millis=300) == (True, Status.WAITING)
    after = await redis_now(rt)
    m = await get(rt, "n")
    assert m.status == Status.WAITING and m.retry == 1
    assert before + 300 <= m.trigger_time <= after + 300
    assert m.expire_time == sent.expire_time  # the TTL is not extended by a nack
    where = await structures(rt, "n")
    assert where["waiting"] == m.trigger_time and where["inflight"] is None and not where["ready"]
    assert (await promote(rt)).count == 0  # not yet due
    await asyncio.sleep(0.35)
    assert (await promote(rt)).count == 1
    [again] = await pull(rt)
    assert again.msg_id == "n" and again.retry == 2
    await drain_log(rt, ["t"])
    assert (await history("t", "n"))[2] == ("nacked", Status.CONSUMING, Status.WAITING, 1)
    assert (await logged("t", "n"))["triggerTime"] == m.trigger_time


async def test_a_waiting_message_enters_the_expiry_index_as_it_becomes_ready(rt):
    """It cannot expire before it is due, so it costs the index nothing until then; promote_due
    tells the scanner when the earliest of those it moved expires."""
    await send(rt, "w", delay=200, ttl_millis=5_000)
    assert (await structures(rt, "w"))["expiry"] is None
    await asyncio.sleep(0.25)
    moved = await promote(rt)
    assert moved.count == 1 and 0 < moved.expires_in_us <= 5_000_000
    assert (await structures(rt, "w"))["expiry"] == (await get(rt, "w")).expire_time
    await send(rt, "later", delay=100, ttl_millis=60_000)
    await asyncio.sleep(0.15)
    moved = await promote(rt)
    assert moved.count == 1 and 5_000_000 < moved.expires_in_us <= 60_000_000
    assert (await promote(rt)).expires_in_us == -1  # nothing moved


async def test_a_nack_delay_past_the_ttl_keeps_the_message_in_the_expiry_index(rt):
    short = await send(rt, "short", ttl_millis=1_000)
    await send(rt, "long")
    assert len(await pull(rt)) == 2
    await nack_message(rt, topic="t", msg_id="short", delay_millis=60_000)  # it expires before it is due
    await nack_message(rt, topic="t", msg_id="long", delay_millis=1_000)
    assert (await structures(rt, "short"))["expiry"] == short.expire_time
    assert (await structures(rt, "long"))["expiry"] is None


async def test_nack_without_a_delay_is_ready_at_once_as_before(rt):
    await send(rt, "n")
    await pull(rt)
    assert await nack_message(rt, topic="t", msg_id="n") == (True, Status.READY)
    assert await nack_message(rt, topic="t", msg_id="n", delay_millis=0) == (False, Status.READY)
    assert (await structures(rt, "n"))["ready"]


async def test_dead_letter_ends_a_consuming_message_now_with_its_reason(rt):
    await send(rt, "poison", max_retry=5)
    await pull(rt)
    assert await nack_message(rt, topic="t", msg_id="poison", dead_letter=True) == (True, Status.EXHAUSTED)
    where = await structures(rt, "poison")
    assert where == {"waiting": None, "inflight": None, "ready": False, "expiry": None}
    assert await pull(rt) == []
    await drain_log(rt, ["t"])
    assert (await history("t", "poison"))[-1] == ("dead_lettered", Status.CONSUMING, Status.EXHAUSTED, 1)
    assert (await logged("t", "poison"))["status"] == Status.EXHAUSTED
    # Not consuming (any more): nothing to dead-letter.
    assert await nack_message(rt, topic="t", msg_id="poison", dead_letter=True) == (False, Status.EXHAUSTED)


# --- touch

async def test_touch_moves_the_ack_deadline_of_a_consuming_message(rt):
    await send(rt, "slow")
    await pull(rt, ack_timeout_millis=50)
    before = await redis_now(rt)
    deadline = await touch_message(rt, topic="t", msg_id="slow", ack_timeout_millis=60_000)
    after = await redis_now(rt)
    assert before + 60_000 <= deadline <= after + 60_000
    assert (await structures(rt, "slow"))["inflight"] == deadline
    await asyncio.sleep(0.1)  # past the first deadline: the touched one holds
    assert (await requeue(rt)).count == 0
    assert (await get(rt, "slow")).status == Status.CONSUMING
    await drain_log(rt, ["t"])
    assert (await history("t", "slow"))[-1] == ("touched", Status.CONSUMING, Status.CONSUMING, 1)


async def test_touch_of_a_message_not_consuming_is_a_conflict_and_of_an_unknown_one_not_found(rt):
    await send(rt, "ready")
    with pytest.raises(Conflict, match="not being consumed"):
        await touch_message(rt, topic="t", msg_id="ready", ack_timeout_millis=1000)
    with pytest.raises(NotFound):
        await touch_message(rt, topic="t", msg_id="ghost", ack_timeout_millis=1000)
    assert await structures(rt, "ready") == {"waiting": None, "inflight": None, "ready": True,
                                             "expiry": (await get(rt, "ready")).expire_time}


# --- reschedule

async def test_reschedule_a_waiting_message_later_keeps_its_ttl_from_the_new_trigger_time(rt):
    sent = await send(rt, "w", delay=60_000, ttl_millis=5_000)
    before = await redis_now(rt)
    m = await reschedule_message(rt, topic="t", msg_id="w", delay_millis=120_000)
    after = await redis_now(rt)
    assert m.status == Status.WAITING and before + 120_000 <= m.trigger_time <= after + 120_000
    assert m.expire_time - m.trigger_time == 5_000 and m.produce_time == sent.produce_time
    assert m == await get(rt, "w")
    where = await structures(rt, "w")
    assert where["waiting"] == m.trigger_time and where["expiry"] is None  # it cannot expire before it is due
    exact = await reschedule_message(rt, topic="t", msg_id="w", trigger_time=m.trigger_time + 1)
    assert exact.trigger_time == m.trigger_time + 1
    await drain_log(rt, ["t"])
    assert (await history("t", "w"))[-1] == ("rescheduled", Status.WAITING, Status.WAITING, 0)
    row = await logged("t", "w")
    assert (row["triggerTime"], row["expireTime"], row["status"]) == (
        exact.trigger_time, exact.expire_time, Status.WAITING)


async def test_reschedule_to_now_or_the_past_runs_it_now(rt):
    await send(rt, "w", delay=60_000)
    before = await redis_now(rt)
    m = await reschedule_message(rt, topic="t", msg_id="w", trigger_time=0)
    assert m.status == Status.READY and before <= m.trigger_time <= await redis_now(rt)
    where = await structures(rt, "w")
    assert where["ready"] and where["waiting"] is None
    [pulled] = await pull(rt)
    assert pulled.msg_id == "w"
    await drain_log(rt, ["t"])
    assert (await history("t", "w"))[1] == ("rescheduled", Status.WAITING, Status.READY, 0)
    assert (await logged("t", "w"))["triggerTime"] == m.trigger_time


async def test_run_now_of_a_message_whose_nack_delay_passes_its_ttl_delivers_it_within_its_ttl(rt):
    """Its TTL ends during the wait: moved back with its triggerTime, its expireTime was put in the
    past, and the message answered ready was ended (6) by the next pull, never delivered."""
    sent = await send(rt, "n", ttl_millis=60_000)
    await pull(rt)
    await nack_message(rt, topic="t", msg_id="n", delay_millis=600_000)  # it would expire while it waits
    later = await reschedule_message(rt, topic="t", msg_id="n", delay_millis=900_000)
    assert later.expire_time == sent.expire_time  # still ends when its TTL does
    assert (await structures(rt, "n"))["expiry"] == sent.expire_time
    now = await reschedule_message(rt, topic="t", msg_id="n", delay_millis=0)
    assert now.status == Status.READY and now.expire_time == sent.expire_time
    [again] = await pull(rt)
    assert (again.msg_id, again.retry, again.expire_time) == ("n", 2, sent.expire_time)
    await drain_log(rt, ["t"])
    assert (await logged("t", "n"))["expireTime"] == sent.expire_time

async def test_reschedule_a_ready_message_into_the_future_makes_it_wait(rt):
    await send(rt, "r")
    m = await reschedule_message(rt, topic="t", msg_id="r", delay_millis=60_000)
    assert m.status == Status.WAITING
    where = await structures(rt, "r")
    assert not where["ready"] and where["waiting"] == m.trigger_time
    assert await pull(rt) == []


async def test_reschedule_refuses_consuming_ended_and_unknown_messages(rt):
    await send(rt, "c")
    await send(rt, "acked")
    await pull(rt)
    await ack_message(rt, topic="t", msg_id="acked")
    with pytest.raises(Conflict, match="being consumed"):
        await reschedule_message(rt, topic="t", msg_id="c", delay_millis=0)
    with pytest.raises(NotFound, match="ended"):
        await reschedule_message(rt, topic="t", msg_id="acked", delay_millis=0)
    with pytest.raises(NotFound, match="not found"):
        await reschedule_message(rt, topic="t", msg_id="ghost", delay_millis=0)
    assert (await get(rt, "c")).status == Status.CONSUMING


async def test_a_resend_after_a_reschedule_answers_the_stored_rescheduled_message(rt):
    await send(rt, "once", delay=60_000)
    moved = await reschedule_message(rt, topic="t", msg_id="once", delay_millis=600_000)
    again = await send(rt, "once", delay=0)
    assert again == moved
    assert (await topic_info(rt, topic="t")).waiting == 1
    await drain_log(rt, ["t"])
    assert (await logged("t", "once"))["triggerTime"] == moved.trigger_time


# --- sends with a triggerTime

async def test_send_with_a_trigger_time_in_the_future_or_the_past(rt):
    now = await redis_now(rt)
    later = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0, trigger_time=now + 60_000))
    assert later.status == Status.WAITING and later.trigger_time == now + 60_000
    assert later.expire_time == now + 60_000 + rt.config.ttl_millis
    [past, zero] = await send_messages(rt, requests=[
        SendRequest("t", "y", 0, trigger_time=now - 5_000), SendRequest("t", "z", 0, trigger_time=0)])
    for m in (past, zero):
        assert m.status == Status.READY and m.trigger_time == m.produce_time


# --- FLUSHALL + restore

@pytest.mark.fault
async def test_restore_brings_back_rescheduled_and_delayed_nacked_messages_as_they_were(single_rt):
    rt = single_rt
    await send(rt, "later", delay=60_000)
    await send(rt, "now", delay=60_000)
    await send(rt, "nacked", max_retry=5)
    await send(rt, "dead")
    await pull(rt)
    await reschedule_message(rt, topic="t", msg_id="later", delay_millis=3_600_000)
    await reschedule_message(rt, topic="t", msg_id="now", trigger_time=0)
    await nack_message(rt, topic="t", msg_id="nacked", delay_millis=1_800_000)
    await nack_message(rt, topic="t", msg_id="dead", dead_letter=True)
    before = {msg_id: await get(rt, msg_id) for msg_id in ("later", "now", "nacked")}
    await drain_log(rt, ["t"])

    await rt.redis.flushall()
    counts = await restore(rt)
    assert (counts.restored, counts.skipped) == (3, 1)  # the dead letter stays ended
    assert await get(rt, "dead") is None
    for msg_id, old in before.items():
        new = await get(rt, msg_id)
        for field in ("status", "trigger_time", "expire_time", "retry", "max_retry", "produce_time"):
            assert getattr(new, field) == getattr(old, field), (msg_id, field)
    assert (before["later"].status, before["now"].status, before["nacked"].status) == (
        Status.WAITING, Status.READY, Status.WAITING)
    assert before["nacked"].retry == 1
    assert (await structures(rt, "nacked"))["waiting"] == before["nacked"].trigger_time
    assert [m.msg_id for m in await pull(rt)] == ["now"]


# --- over HTTP

async def test_http_ack_answers_done(api):
    await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId="m1")
    await call(api, "pullMsg", topic="h")
    assert await call(api, "ackMsg", topic="h", msgId="m1") == {"code": 200, "msg": "success", "done": True}
    assert await call(api, "ackMsg", topic="h", msgId="m1") == {"code": 200, "msg": "success", "done": False}
    assert await call(api, "ackMsg", topic="h", msgId="ghost", ack="false") == {
        "code": 200, "msg": "success", "done": False}


async def test_http_nack_with_a_delay_and_as_a_dead_letter(api):
    for msg_id in ("m1", "m2"):
        await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId=msg_id)
    await call(api, "pullMsg", topic="h", batch="2")
    assert (await call(api, "ackMsg", topic="h", msgId="m1", ack="false", delayMillis="60000"))["done"] is True
    assert (await call(api, "getMsg", topic="h", msgId="m1"))["delayMsg"]["status"] == Status.WAITING
    assert (await call(api, "ackMsg", json={"topic": "h", "msgId": "m2", "ack": False, "deadLetter": True}))["done"]
    assert (await call(api, "getMsg", topic="h", msgId="m2"))["delayMsg"]["status"] == Status.EXHAUSTED


@pytest.mark.parametrize("params, problem", [
    ({"deadLetter": "true"}, "deadLetter: only with ack=false"),
    ({"ack": "true", "delayMillis": "10"}, "delayMillis: only with ack=false"),
    ({"ack": "false", "delayMillis": "10", "deadLetter": "true"}, "deadLetter: cannot be given with delayMillis"),
    ({"ack": "false", "delayMillis": "-1"}, "delayMillis: "),
    ({"ack": "false", "delayMillis": "soon"}, "delayMillis: "),
    ({"ack": "false", "deadLetter": "maybe"}, "deadLetter: "),
])
async def test_http_ack_refuses_bad_new_parameters(api, params, problem):
    body = await call(api, "ackMsg", topic="h", msgId="m1", **params)
    assert body["code"] == 400 and body["msg"].startswith(problem), body


async def test_http_ack_batch(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_BATCH_SEND": 3}
    for msg_id in ("a", "b"):
        await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId=msg_id)
    await call(api, "pullMsg", topic="h", batch="2")
    body = await call(api, "ackMsgBatch", json={"topic": "h", "msgIds": ["a", "ghost", "b"]})
    assert body == {"code": 200, "msg": "success", "results": [
        {"msgId": "a", "done": True}, {"msgId": "ghost", "done": False}, {"msgId": "b", "done": True}]}
    for bad, problem in [
        ({"topic": "h", "msgIds": ["a", "b", "c", "d"]}, "msgIds: has 4 msgIds, over the limit of 3"),
        ({"topic": "h", "msgIds": []}, "msgIds: "),
        ({"topic": "h", "msgIds": "a"}, "msgIds: "),
        ({"topic": "h", "msgIds": ["a", "bad\n"]}, "msgIds: "),
        ({"msgIds": ["a"]}, "topic: "),
        ({"topic": "h", "msgIds": ["a"], "deadLetter": True}, "deadLetter: only with ack=false"),
    ]:
        body = await call(api, "ackMsgBatch", json=bad)
        assert body["code"] == 400 and body["msg"].startswith(problem), (bad, body)


async def test_http_settles_name_their_delivery_by_its_retry(api):
    await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId="m1")
    [pulled] = (await call(api, "pullMsg", topic="h"))["delayMsgList"]
    late = pulled["retry"] + 1
    assert (await call(api, "ackMsg", topic="h", msgId="m1", retry=str(late)))["done"] is False
    assert (await call(api, "ackMsg", topic="h", msgId="m1", ack="false", retry=str(late)))["done"] is False
    body = await call(api, "ackMsgBatch", json={"topic": "h", "msgIds": ["m1"], "retries": [late]})
    assert body["results"] == [{"msgId": "m1", "done": False}]
    touched = await call(api, "touchMsg", topic="h", msgId="m1", ackTimeoutMillis="1000", retry=str(late))
    assert touched["code"] == 409 and "delivered again" in touched["msg"], touched
    assert (await call(api, "touchMsg", topic="h", msgId="m1", ackTimeoutMillis="1000",
                       retry=str(pulled["retry"])))["code"] == 200
    body = await call(api, "ackMsgBatch", json={"topic": "h", "msgIds": ["m1"], "retries": [pulled["retry"]]})
    assert body["results"] == [{"msgId": "m1", "done": True}]
    for endpoint, bad, problem in [
        ("ackMsg", {"retry": "-1"}, "retry: "), ("ackMsg", {"retry": "first"}, "retry: "),
        ("ackMsg", {"retry": "100002"}, "retry: "),
        ("touchMsg", {"ackTimeoutMillis": "1000", "retry": "x"}, "retry: "),
    ]:
        body = await call(api, endpoint, topic="h", msgId="m1", **bad)
        assert body["code"] == 400 and body["msg"].startswith(problem), (bad, body)
    for bad, problem in [
        ({"retries": [1, 2]}, "retries: has 2 values for 1 msgIds: give one per msgId"),
        ({"retries": 1}, "retries: "), ({"retries": [-1]}, "retries: "), ({"retries": ["x"]}, "retries: "),
    ]:
        body = await call(api, "ackMsgBatch", json={"topic": "h", "msgIds": ["m1"], **bad})
        assert body["code"] == 400 and body["msg"].startswith(problem), (bad, body)
    body = await call(api, "ackMsgBatch", json={"topic": "h", "msgIds": ["m1"], "retries": [None]})
    assert body["results"] == [{"msgId": "m1", "done": False}]  # null: any delivery; this one has ended


async def test_http_touch(api):
    await call(api, "sendMsg", topic="h", msg="x", delayMillis="0", msgId="m1")
    await call(api, "sendMsg", topic="h", msg="x", delayMillis="60000", msgId="w")
    [pulled] = (await call(api, "pullMsg", topic="h", ackTimeoutMillis="1000"))["delayMsgList"]
    body = await call(api, "touchMsg", topic="h", msgId="m1", ackTimeoutMillis="60000")
    assert body["code"] == 200 and body["ackDeadline"] >= pulled["produceTime"] + 60_000
    assert (await call(api, "touchMsg", topic="h", msgId="w", ackTimeoutMillis="1000"))["code"] == 409
    assert (await call(api, "touchMsg", topic="h", msgId="ghost", ackTimeoutMillis="1000"))["code"] == 404
    for params in ({}, {"ackTimeoutMillis": "0"}, {"ackTimeoutMillis": "x"}):
        body = await call(api, "touchMsg", topic="h", msgId="m1", **params)
        assert body["code"] == 400 and body["msg"].startswith("ackTimeoutMillis: "), body


async def test_http_reschedule(api):
    sent = (await call(api, "sendMsg", topic="h", msg="x", delayMillis="60000", msgId="w"))["delayMsg"]
    body = await call(api, "rescheduleMsg", topic="h", msgId="w", triggerTime=str(sent["triggerTime"] + 1000))
    assert body["code"] == 200 and body["delayMsg"]["triggerTime"] == sent["triggerTime"] + 1000
    assert body["delayMsg"]["expireTime"] == sent["expireTime"] + 1000
    assert (await call(api, "getMsg", topic="h", msgId="w"))["delayMsg"] == body["delayMsg"]
    ran = await call(api, "rescheduleMsg", topic="h", msgId="w", delayMillis="0")
    assert ran["delayMsg"]["status"] == Status.READY
    await call(api, "pullMsg", topic="h")
    assert (await call(api, "rescheduleMsg", topic="h", msgId="w", delayMillis="0"))["code"] == 409
    await call(api, "ackMsg", topic="h", msgId="w")
    assert (await call(api, "rescheduleMsg", topic="h", msgId="w", delayMillis="0"))["code"] == 404
    assert (await call(api, "rescheduleMsg", topic="h", msgId="ghost", delayMillis="0"))["code"] == 404
    for params, problem in [({}, "delayMillis: give exactly one"), ({"delayMillis": "1", "triggerTime": "1"},
                                                                  "delayMillis: give exactly one"),
                            ({"triggerTime": "-1"}, "triggerTime: "),
                            ({"triggerTime": "4102444800001"}, "triggerTime: ")]:
        body = await call(api, "rescheduleMsg", topic="h", msgId="ghost", **params)
        assert body["code"] == 400 and body["msg"].startswith(problem), body


async def test_http_send_with_a_trigger_time(api):
    tomorrow = int(time.time() * 1000) + 86_400_000
    sent = await call(api, "sendMsg", topic="h", msg="x", triggerTime=str(tomorrow), msgId="far")
    assert sent["delayMsg"]["triggerTime"] == tomorrow and sent["delayMsg"]["status"] == Status.WAITING
    both = await call(api, "sendMsg", topic="h", msg="x", triggerTime="1", delayMillis="1")
    assert both["code"] == 400 and both["msg"] == "triggerTime: give triggerTime or delayMillis, not both"
    neither = await call(api, "sendMsg", topic="h", msg="x")
    assert neither == {"code": 400, "msg": "delayMillis: This field is required."}  # as before triggerTime
    batch = await call(api, "sendMsgBatch", json=[{"topic": "h", "msg": "x", "triggerTime": 0},
                                                  {"topic": "h", "msg": "y", "triggerTime": 1, "delayMillis": 1}])
    first, second = batch["results"]
    assert first["code"] == 200 and first["delayMsg"]["status"] == Status.READY
    assert second["code"] == 400 and second["msg"].startswith("message 1: triggerTime: ")
