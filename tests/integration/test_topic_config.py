"""Topic settings and control (issue 17 items 6 and 8): getTopicConfig / setTopicConfig, per-topic
defaults, retry backoff after an ack timeout, pauseTopic / resumeTopic, purgeTopic; on a single
Redis and the Cluster, over HTTP, and across FLUSHALL + restore."""
import asyncio

from asgiref.sync import sync_to_async

from delayqueue.api import wire
from delayqueue.core.constants import (PUSH_CONCURRENCY_DEFAULT, PUSH_TIMEOUT_DEFAULT_MILLIS, RETRY_BACKOFF_MAX_MILLIS,
                                       Status)
from delayqueue.models import Limit
from delayqueue.ops import figures
from delayqueue.services.consume import Pull, ack_message, long_poll_messages, nack_message, pull_many, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import monitor_data, purge_topic, topic_config, topic_info
from tests.helpers import REDIS_URL, call, drain_log, history, logged, make_runtime, promote, requeue


async def send(rt, topic="t", delay=0, **kw):
    return await send_message(rt, request=SendRequest(topic=topic, msg="m", delay_millis=delay, **kw))


async def redis_now(rt) -> float:
    """Redis' clock in ms (the scripts' clock)."""
    seconds, micros = await rt.redis.time()
    return seconds * 1000 + micros / 1000


async def test_a_topic_without_settings_answers_the_service_defaults(rt):
    cfg = rt.config
    assert wire.topic_config(await topic_config(rt, topic="t")) == {
        "topic": "t", "ttlMillis": cfg.ttl_millis, "maxRetry": cfg.max_retry, "ackTimeoutMillis": cfg.ack_timeout_millis,
        "retryBackoffMillis": 0, "retryBackoffMaxMillis": RETRY_BACKOFF_MAX_MILLIS, "deadLetter": True,
        "paused": False, "produceRatePerSecond": 0, "consumeRatePerSecond": 0, "maxLiveMessages": 0,
        "pushUrl": "", "pushConcurrency": PUSH_CONCURRENCY_DEFAULT, "pushTimeoutMillis": PUSH_TIMEOUT_DEFAULT_MILLIS,
        "pushRatePerSecond": 0, "pushSecretRotating": False, "shards": 1, "drainingShards": []}


async def test_topic_defaults_apply_to_sends_and_pulls_that_give_none(rt):
    await set_topic_config(rt, topic="t", changes={"ttl_millis": 5_000, "max_retry": 2,
                                                            "ack_timeout_millis": 7_000}, limits={})
    own = await send(rt)
    assert own.expire_time - own.trigger_time == 5_000 and own.max_retry == 2
    given = await send(rt, ttl_millis=9_000, max_retry=4)
    assert given.expire_time - given.trigger_time == 9_000 and given.max_retry == 4
    other = await send(rt, topic="other")
    assert other.expire_time - other.trigger_time == rt.config.ttl_millis
    before = await redis_now(rt)
    [pulled], _ = await pull_messages(rt, topic="t")
    deadline = await rt.redis.zscore(rt.ns.topic("t").inflight, pulled.msg_id)
    assert 7_000 <= deadline - int(before) <= 7_000 + 50
    # Back to the service defaults: None.
    await set_topic_config(rt, topic="t", changes={"ttl_millis": None, "max_retry": None}, limits={})
    again = await send(rt)
    assert again.expire_time - again.trigger_time == rt.config.ttl_millis
    assert again.max_retry == rt.config.max_retry


async def test_another_process_sees_a_change_within_a_second(rt):
    other = make_runtime(rt.config.redis_url)
    try:
        assert (await send(other)).max_retry == rt.config.max_retry  # its cache is read now
        await set_topic_config(rt, topic="t", changes={"max_retry": 1}, limits={})
        await asyncio.sleep(1.0)
        assert (await send(other)).max_retry == 1
    finally:
        await other.close()


async def test_limits_are_written_through_the_limit_table_and_enforced(rt):
    await set_topic_config(rt, topic="t", changes={}, limits={"produce_rate": 2, "max_live": 10})
    row = await sync_to_async(Limit.objects.get)(namespace=rt.ns.namespace, topic="t")
    assert (row.produce_rate, row.consume_rate, row.max_live) == (2, None, 10)
    config = wire.topic_config(await topic_config(rt, topic="t"))
    assert (config["produceRatePerSecond"], config["consumeRatePerSecond"], config["maxLiveMessages"]) == (2, 0, 10)
    outcomes = await send_messages(rt, requests=[SendRequest("t", "m", 0)] * 3)
    assert sum(isinstance(o, Exception) for o in outcomes) == 1  # a burst of one second's worth, then refused
    await set_topic_config(rt, topic="t", changes={}, limits={"produce_rate": 0, "max_live": 0})
    assert not await sync_to_async(Limit.objects.filter(namespace=rt.ns.namespace, topic="t").exists)()


async def test_ack_timeout_under_a_backoff_waits_the_computed_time_by_redis_clock(rt):
    """min(max, base * 2^(retry-1)), less up to 20% jitter: checked against Redis' own clock
    around the scanner script, then the message falls due and the log row keeps its new triggerTime."""
    base, cap = 200, 1_000
    await set_topic_config(rt, topic="t", changes={"retry_backoff_millis": base,
                                                            "retry_backoff_max_millis": cap}, limits={})
    sent = await send_messages(rt, requests=[SendRequest("t", "m", 0, max_retry=10)] * 20)
    waits = []
    for retry in range(1, 5):
        pulled, _ = await pull_messages(rt, topic="t", batch=20, ack_timeout_millis=1)
        assert len(pulled) == 20 and {m.retry for m in pulled} == {retry}
        await asyncio.sleep(0.005)
        before = await redis_now(rt)
        assert (await requeue(rt)).count == 20
        after = await redis_now(rt)
        wanted = min(cap, base * 2 ** (retry - 1))
        for m in sent:
            now = await get_message(rt, topic="t", msg_id=m.msg_id)
            assert now.status == Status.WAITING
            score = await rt.redis.zscore(rt.ns.topic("t").waiting, m.msg_id)
            assert score == now.trigger_time
            # The script read Redis' clock between `before` and `after` (ms, truncated).
            assert now.trigger_time - after <= wanted + 1
            assert now.trigger_time - before >= wanted * 0.8 - 1
            waits.append(now.trigger_time - before)
        assert (await promote(rt)).count == 0  # not due yet
        await asyncio.sleep(wanted / 1000 + 0.01)
        assert (await promote(rt)).count == 20
    assert len(set(waits)) > 10  # jittered, not one wait for all
    await drain_log(rt, ["t"])
    row = await logged("t", sent[0].msg_id)
    current = await get_message(rt, topic="t", msg_id=sent[0].msg_id)
    assert row["status"] == Status.READY and row["triggerTime"] == current.trigger_time != sent[0].trigger_time
    assert ("ack_timeout", Status.CONSUMING, Status.WAITING, 1) in await history("t", sent[0].msg_id)


async def test_a_nack_without_a_delay_waits_the_topics_backoff_and_one_with_a_delay_its_own(rt):
    base = 400
    await set_topic_config(rt, topic="t", changes={"retry_backoff_millis": base}, limits={})
    first, second = await send(rt, max_retry=5), await send(rt, max_retry=5)
    for retry in (1, 2):
        pulled, _ = await pull_messages(rt, topic="t", batch=2)
        assert {m.msg_id for m in pulled} == {first.msg_id, second.msg_id}
        before = await redis_now(rt)
        assert (await nack_message(rt, topic="t", msg_id=first.msg_id)).done
        assert (await nack_message(rt, topic="t", msg_id=second.msg_id, delay_millis=50)).done
        after = await redis_now(rt)
        backed_off = await get_message(rt, topic="t", msg_id=first.msg_id)
        wanted = base * 2 ** (retry - 1)
        assert backed_off.status == Status.WAITING and backed_off.retry == retry
        assert before + wanted * 0.8 - 1 <= backed_off.trigger_time <= after + wanted + 1
        delayed = await get_message(rt, topic="t", msg_id=second.msg_id)
        assert before + 50 - 1 <= delayed.trigger_time <= after + 50 + 1  # its own delay, no backoff
        await asyncio.sleep(wanted / 1000 + 0.01)
        assert (await promote(rt)).count == 2
    await drain_log(rt, ["t"])
    assert ("nacked", Status.CONSUMING, Status.WAITING, 1) in await history("t", first.msg_id)


async def test_without_a_backoff_an_ack_timeout_is_ready_at_once(rt):
    m = await send(rt)
    await pull_messages(rt, topic="t", ack_timeout_millis=1)
    await asyncio.sleep(0.005)
    assert (await requeue(rt)).count == 1
    assert (await get_message(rt, topic="t", msg_id=m.msg_id)).status == Status.READY


async def test_a_backed_off_message_wakes_the_scanner_at_its_ready_time(rt, start_scanner):
    await set_topic_config(rt, topic="t", changes={"retry_backoff_millis": 300}, limits={})
    m = await send(rt)
    await start_scanner(rt)
    # Timed from before the pull: its ack deadline counts from when Redis ran it, not from its answer.
    start = asyncio.get_running_loop().time()
    await pull_messages(rt, topic="t", ack_timeout_millis=50)
    got = await long_poll_messages(rt, topic="t", timeout_millis=5_000)
    elapsed = asyncio.get_running_loop().time() - start
    assert [g.msg_id for g in got] == [m.msg_id] and got[0].retry == 2
    assert 0.05 + 0.24 <= elapsed < 1.5  # ack timeout, then the backoff (less its jitter)


async def test_pause_holds_pulls_and_long_polls_while_messages_fall_due_and_resume_wakes_them(rt):
    ready = await send(rt)
    # Due in a second: a send that reaches Redis after its trigger time is stored ready, which the
    # log's write before it made happen within 100 ms on a loaded machine; this one must fall due.
    later = await send(rt, delay=1000)
    await pause_topic(rt, topic="t")
    assert await pull_messages(rt, topic="t", batch=10) == ([], 0)
    poll = asyncio.ensure_future(long_poll_messages(rt, topic="t", batch=10, timeout_millis=10_000))
    await asyncio.sleep(1.05)
    assert (await promote(rt)).count == 1  # messages keep falling due
    assert (await get_message(rt, topic="t", msg_id=later.msg_id)).status == Status.READY
    await asyncio.sleep(0.6)  # past a recheck of the paused topic
    assert not poll.done()
    assert wire.topic_config(await topic_config(rt, topic="t"))["paused"] is True
    await resume_topic(rt, topic="t")
    got = await asyncio.wait_for(poll, 5)  # woken by the resume, long before its hold ends
    assert {g.msg_id for g in got} == {ready.msg_id, later.msg_id}


async def test_a_pause_is_exact_for_another_process_at_once_through_the_mirror(rt):
    await send(rt)
    other = make_runtime(rt.config.redis_url)
    try:
        await other.topic_configs.table()  # read before the pause: not paused in its cache
        await pause_topic(rt, topic="t")
        assert (await pull_messages(other, topic="t"))[0] == []
    finally:
        await other.close()


async def test_a_long_poll_held_in_another_process_is_woken_within_a_second_of_a_resume(rt):
    m = await send(rt)
    await pause_topic(rt, topic="t")
    other = make_runtime(rt.config.redis_url)
    try:
        poll = asyncio.ensure_future(long_poll_messages(other, topic="t", timeout_millis=10_000))
        await asyncio.sleep(0.3)
        assert not poll.done()
        await resume_topic(rt, topic="t")
        got = await asyncio.wait_for(poll, 1.5)
        assert [g.msg_id for g in got] == [m.msg_id]
    finally:
        await other.close()


async def test_purge_ends_every_live_message_as_deleted_in_batches_and_logs_it(rt):
    rt.config = rt.config.with_overrides(scanner_batch=2)  # several script calls
    waiting = [await send(rt, delay=60_000) for _ in range(3)]
    ready = [await send(rt) for _ in range(5)]
    consuming, _ = await pull_messages(rt, topic="t", batch=2, ack_timeout_millis=60_000)
    [to_ack], _ = await pull_messages(rt, topic="t", batch=1)
    await ack_message(rt, topic="t", msg_id=to_ack.msg_id)
    ready = ready[3:]
    other = await send(rt, topic="other")
    assert await purge_topic(rt, topic="t") == 7
    info = wire.topic_info(await topic_info(rt, topic="t"))
    assert (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == (0, 0, 0)
    assert not await rt.redis.zcard(rt.ns.topic("t").expiry)
    await drain_log(rt, ["t"])
    live_before = {m.msg_id: m.status for m in waiting + ready}
    live_before.update({m.msg_id: Status.CONSUMING for m in consuming})
    for msg_id, was in live_before.items():
        assert (await get_message(rt, topic="t", msg_id=msg_id)).status == Status.DELETED
        assert (await logged("t", msg_id))["status"] == Status.DELETED
        assert (await history("t", msg_id))[-1][:3] == ("purged", was, Status.DELETED)
    assert (await get_message(rt, topic="t", msg_id=to_ack.msg_id)).status == Status.ACKED
    assert (await get_message(rt, topic="other", msg_id=other.msg_id)).status == Status.READY
    assert await purge_topic(rt, topic="t") == 0


async def test_a_purge_counts_its_messages_as_deletes_in_every_monitor_figure(rt):
    """getMonitorData's interval, the dashboard's and /metrics' totals: purged messages are deletes."""
    rt.config = rt.config.with_overrides(monitor_interval_seconds=2, scanner_batch=2)  # several script calls
    for delay in (60_000, 60_000, 0, 0, 0):
        await send(rt, delay=delay)
    await pull_messages(rt, topic="t", batch=1, ack_timeout_millis=60_000)

    async def next_interval():
        await asyncio.sleep((2_000 - await redis_now(rt) % 2_000 + 20) / 1000)

    await next_interval()  # the purge alone in its interval
    assert await purge_topic(rt, topic="t") == 5
    [overview] = await figures.topic_overview(rt, topics=["t"])
    assert overview["totals"]["deleteMsg"] == 5  # /metrics' delayqueue_requests_total{type="deleteMsg"}
    await next_interval()
    assert wire.monitor_data(await monitor_data(rt))["requestStatsList"] == [
        {"topic": "t", "sendMsg": 0, "pullMsg": 0, "deleteMsg": 5, "ackMsg": 0, "getMsg": 0, "triggerMsgReady": 0,
         "triggerMsgEndLife": 0, "triggerMsgTimeout": 0}]
    [overview] = await figures.topic_overview(rt, topics=["t"])
    assert overview["last_interval"]["deleteMsg"] == 5
    info = wire.topic_info(await topic_info(rt, topic="t"))
    assert (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == (0, 0, 0)


async def test_settings_and_pause_survive_flushall_and_restore(single_rt):
    rt = single_rt
    await set_topic_config(rt, topic="t", changes={"retry_backoff_millis": 100, "ttl_millis": 8_000,
                                                            "dead_letter": False}, limits={})
    await pause_topic(rt, topic="t")
    m = await send(rt)
    mirror = await rt.redis.hgetall(rt.ns.topic("t").meta)
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    # Before the restore: a new process reads the settings from PostgreSQL, not the lost mirror.
    fresh = make_runtime(REDIS_URL)
    try:
        fresh_send = await send(fresh, topic="t")
        assert fresh_send.expire_time - fresh_send.trigger_time == 8_000
        assert await pull_messages(fresh, topic="t") == ([], 0)
    finally:
        await fresh.close()
    await restore(rt)
    restored = await rt.redis.hgetall(rt.ns.topic("t").meta)
    for field in ("retry_backoff", "retry_backoff_max", "dead_letter", "paused"):
        assert restored[field] == mirror[field]
    assert restored["paused"] == "1" and restored["dead_letter"] == "0"
    config = wire.topic_config(await topic_config(rt, topic="t"))
    assert (config["paused"], config["retryBackoffMillis"], config["deadLetter"]) == (True, 100, False)
    # Paused in Redis itself: a process whose cache says otherwise hands out nothing either.
    rt.topic_configs.current = {}
    assert (await pull_messages(rt, topic="t"))[0] == []
    await resume_topic(rt, topic="t")
    got, _ = await pull_messages(rt, topic="t", batch=10)
    assert m.msg_id in {g.msg_id for g in got}


async def test_a_pause_holds_the_pushers_pulls_too_while_redis_has_lost_its_mirror(single_rt):
    """The pushers take messages through pull_many, which read no other copy of the pause than
    Redis' mirror: after a loss, before the restore, a paused push topic's new messages were pushed.
    The mirror, where it is, still decides: a resume holds no pusher whose settings are a read behind."""
    rt = single_rt
    await pause_topic(rt, topic="t")
    await rt.redis.flushall()
    fresh = make_runtime(REDIS_URL)
    try:
        m = await send(fresh, topic="t")
        [reply] = await pull_many(fresh, pulls=[Pull("t", 10, 30_000)])
        assert reply.paused and reply.messages == []
        assert (await get_message(fresh, topic="t", msg_id=m.msg_id)).status == Status.READY
        behind = await fresh.topic_configs.table()
        await resume_topic(rt, topic="t")
        fresh.topic_configs.current = behind  # (no await before the pull reads it: the refresher cannot run)
        [reply] = await pull_many(fresh, pulls=[Pull("t", 10, 30_000)])
        assert [p.msg_id for p in reply.messages] == [m.msg_id]
    finally:
        await fresh.close()


async def test_a_backed_off_message_comes_back_waiting_until_its_new_trigger_time(single_rt):
    rt = single_rt
    await set_topic_config(rt, topic="t", changes={"retry_backoff_millis": 60_000}, limits={})
    m = await send(rt)
    await pull_messages(rt, topic="t", ack_timeout_millis=1)
    await asyncio.sleep(0.005)
    await requeue(rt)
    backed_off = await get_message(rt, topic="t", msg_id=m.msg_id)
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    assert (await restore(rt)).restored == 1
    again = await get_message(rt, topic="t", msg_id=m.msg_id)
    assert again.status == Status.WAITING and again.trigger_time == backed_off.trigger_time
    assert await rt.redis.zscore(rt.ns.topic("t").waiting, m.msg_id) == backed_off.trigger_time


# --- Over HTTP


async def test_http_get_and_set_topic_config(api):
    got = await call(api, "getTopicConfig", method="get", topic="orders")
    assert got["code"] == 200 and got["data"]["retryBackoffMillis"] == 0 and got["data"]["paused"] is False
    changed = await call(api, "setTopicConfig", topic="orders", maxRetry="3", retryBackoffMillis="500",
                         retryBackoffMaxMillis="4000", deadLetter="false", consumeRatePerSecond="9")
    assert changed["code"] == 200, changed
    data = changed["data"]
    assert (data["maxRetry"], data["retryBackoffMillis"], data["retryBackoffMaxMillis"], data["deadLetter"],
            data["consumeRatePerSecond"]) == (3, 500, 4000, False, 9)
    assert (await call(api, "getTopicConfig", method="get", topic="orders"))["data"] == data
    json_body = await call(api, "setTopicConfig", json={"topic": "orders", "maxRetry": -1})
    assert json_body["data"]["maxRetry"] == 10 and json_body["data"]["retryBackoffMillis"] == 500


async def test_http_bad_topic_settings_answer_400_naming_the_parameter(api):
    for params, named in [
        ({"topic": "orders", "ttlMillis": "soon"}, "ttlMillis"),
        ({"topic": "orders", "retryBackoffMillis": "-1"}, "retryBackoffMillis"),
        ({"topic": "orders", "retryBackoffMaxMillis": "1e3"}, "retryBackoffMaxMillis"),
        ({"topic": "orders", "maxRetry": "100001"}, "maxRetry"),
        ({"topic": "orders", "deadLetter": "maybe"}, "deadLetter"),
        ({"topic": "orders", "produceRatePerSecond": "-5"}, "produceRatePerSecond"),
        ({"topic": "orders", "maxLiveMessages": "10000000000"}, "maxLiveMessages"),
        ({"maxRetry": "1"}, "topic"),
        ({"topic": "orders"}, "at least one setting"),
    ]:
        body = await call(api, "setTopicConfig", **params)
        assert body["code"] == 400 and named in body["msg"], (params, body)
    for endpoint in ("getTopicConfig", "pauseTopic", "resumeTopic", "purgeTopic"):
        body = await call(api, endpoint)
        assert body["code"] == 400 and "topic" in body["msg"], (endpoint, body)
        body = await call(api, endpoint, topic="a\x01b")
        assert body["code"] == 400 and "topic" in body["msg"], (endpoint, body)


async def test_http_pause_resume_and_purge(api):
    sent = await call(api, "sendMsg", topic="orders", msg="m", delayMillis="0")
    assert (await call(api, "pauseTopic", topic="orders")) == {"code": 200, "msg": "success"}
    assert (await call(api, "pullMsg", topic="orders"))["delayMsgList"] == []
    assert (await call(api, "resumeTopic", topic="orders")) == {"code": 200, "msg": "success"}
    await call(api, "sendMsg", topic="orders", msg="m2", delayMillis="60000")
    assert (await call(api, "purgeTopic", topic="orders")) == {"code": 200, "msg": "success", "count": 2}
    got = await call(api, "getMsg", topic="orders", msgId=sent["delayMsg"]["msgId"])
    assert got["delayMsg"]["status"] == Status.DELETED
