"""Caps that keep one tenant from using up a shared deployment (issue 29 item 4): topics per
namespace, topic-settings rows, push concurrency, held long polls per token, the redrive rate, one
restore per namespace at a time, and a purgeTopic that ends while a producer keeps sending. Over
HTTP with API tokens where the cap is an API answer; real Redis and PostgreSQL throughout."""
import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command

from delayqueue.config.settings import DEFAULT_DATABASE
from delayqueue.core.exceptions import CapReached
from delayqueue.live.keys import namespace_keys
from delayqueue.models import TopicConfig
from delayqueue.runtime import close_current
from delayqueue.services.caps import restore_turn
from delayqueue.services.send import SendRequest, send_messages
from delayqueue.services.topic_control import set_topic_config
from delayqueue.services.topics import purge_topic, topic_info
from delayqueue.stores.push_topics import PushTopicCache
from delayqueue.stores.rows import save_topic_config
from delayqueue.stores.tokens import token_hash
from tests.helpers import REDIS_URL, make_runtime, wait_until
from tests.integration.test_tokens import ask, new_token, tokens_on  # noqa: F401 - tokens_on is a fixture

pytestmark = pytest.mark.usefixtures("tokens_on")


@pytest.fixture
def caps(settings):
    async def set_caps(**values):
        """The caps given, in force from the next request on (the service's runtime is made anew)."""
        settings.DELAYQUEUE = {**settings.DELAYQUEUE, **values}
        await close_current()
    return set_caps


async def token(namespace="shop") -> str:
    return await sync_to_async(new_token)(namespace=namespace)


def refused_by(answer: dict, setting: str) -> bool:
    return answer["code"] == 429 and setting in answer["msg"]


async def test_a_send_to_a_new_topic_beyond_the_namespace_cap_is_refused(api, caps):
    await caps(MAX_TOPICS=2)
    shop, other = await token(), await token("other")
    for topic in ("cap-a", "cap-b"):
        assert (await ask(api, "delayQueue/sendMsg", "post", {"topic": topic, "msg": "m", "delayMillis": "0"}, shop))["code"] == 200
    refused = await ask(api, "delayQueue/sendMsg", "post", {"topic": "cap-c", "msg": "m", "delayMillis": "0"}, shop)
    assert refused_by(refused, "DELAYQUEUE_MAX_TOPICS") and "the cap is 2" in refused["msg"]
    # Its topics still take sends; a batch's new topic is refused on its own.
    batch = await ask(api, "delayQueue/sendMsgBatch", "json", [{"topic": "cap-a", "msg": "m", "delayMillis": 0},
                                                               {"topic": "cap-d", "msg": "m", "delayMillis": 0}], shop)
    assert [item["code"] for item in batch["results"]] == [200, 429], batch
    # Another namespace has its own.
    assert (await ask(api, "delayQueue/sendMsg", "post", {"topic": "cap-c", "msg": "m", "delayMillis": "0"}, other))["code"] == 200
    listed = await ask(api, "delayQueue/getTopicInfoList", "get", {}, shop)
    assert sorted(info["topic"] for info in listed["data"]) == ["cap-a", "cap-b"]


async def test_new_topic_settings_beyond_the_cap_are_refused_and_concurrent_ones_cannot_pass_it(api, caps):
    await caps(MAX_TOPIC_CONFIGS=2)
    shop = await token()
    for topic in ("cfg-a", "cfg-b"):
        answer = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": topic, "maxRetry": "3"}, shop)
        assert answer["code"] == 200, answer
    refused = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "cfg-c", "maxRetry": "3"}, shop)
    assert refused_by(refused, "DELAYQUEUE_MAX_TOPIC_CONFIGS") and "the cap is 2" in refused["msg"]
    assert (await ask(api, "delayQueue/pauseTopic", "post", {"topic": "cfg-c"}, shop))["code"] == 429
    # A topic that has its row changes it freely.
    assert (await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "cfg-a", "maxRetry": "5"}, shop))["code"] == 200

    # Many new topics at once in another namespace: exactly the cap's worth get a row.
    rt = make_runtime(REDIS_URL).for_namespace("race")
    try:
        outcomes = await asyncio.gather(*[set_topic_config(rt, topic=f"r{i}", changes={"max_retry": 1}, limits={})
                                          for i in range(6)], return_exceptions=True)
        assert sum(isinstance(o, CapReached) for o in outcomes) == 4, outcomes
        assert len(await rt.topic_configs.fresh()) == 2
    finally:
        await rt.close()


async def test_a_topic_whose_settings_are_all_back_to_the_defaults_counts_no_more(api, caps):
    """Nothing deletes a topic's settings row (the admin cannot either): a topic paused and resumed,
    or given its defaults back, has no settings of its own, and frees its place under the cap."""
    await caps(MAX_TOPIC_CONFIGS=2)
    shop = await token()
    for topic in ("cfg-a", "cfg-b"):
        assert (await ask(api, "delayQueue/pauseTopic", "post", {"topic": topic}, shop))["code"] == 200
    assert (await ask(api, "delayQueue/resumeTopic", "post", {"topic": "cfg-a"}, shop))["code"] == 200
    assert (await ask(api, "delayQueue/resumeTopic", "post", {"topic": "never-paused"}, shop))["code"] == 200
    for max_retry in ("3", "-1"):  # its own, then the default again
        change = {"topic": "cfg-c", "maxRetry": max_retry}
        assert (await ask(api, "delayQueue/setTopicConfig", "post", change, shop))["code"] == 200
    answer = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "cfg-d", "ttlMillis": "5000"}, shop)
    assert answer["code"] == 200 and answer["data"]["ttlMillis"] == 5000, answer
    assert await sync_to_async(lambda: sorted(TopicConfig.objects.values_list("topic", flat=True)))() == [
        "cfg-b", "cfg-d"]


async def test_push_concurrency_beyond_the_namespace_cap_is_refused(api, caps):
    await caps(MAX_PUSH_CONCURRENCY=10)
    shop = await token()
    url = "http://127.0.0.1:9/hook"
    first = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "p1", "pushUrl": url,
                                                                 "pushConcurrency": "6"}, shop)
    assert first["code"] == 200, first
    over = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "p2", "pushUrl": url,
                                                                "pushConcurrency": "5"}, shop)
    assert refused_by(over, "DELAYQUEUE_MAX_PUSH_CONCURRENCY") and "the cap is 10" in over["msg"]
    fits = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "p2", "pushUrl": url,
                                                                "pushConcurrency": "4"}, shop)
    assert fits["code"] == 200, fits
    raised = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "p1", "pushConcurrency": "7"}, shop)
    assert refused_by(raised, "DELAYQUEUE_MAX_PUSH_CONCURRENCY")
    # Under a lowered cap, changes that add no push concurrency still go through.
    await caps(MAX_PUSH_CONCURRENCY=5)
    assert (await ask(api, "delayQueue/pauseTopic", "post", {"topic": "p1"}, shop))["code"] == 200
    lowered = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "p1", "pushConcurrency": "1"}, shop)
    assert lowered["code"] == 200 and lowered["data"]["pushConcurrency"] == 1


async def test_a_redrive_faster_than_the_cap_is_refused_naming_it(api, caps):
    shop = await token()
    answer = await ask(api, "delayQueue/redriveDeadMsg", "json", {"topic": "orders", "maxPerSecond": 5000}, shop)
    assert answer["code"] == 429 and "DELAYQUEUE_MAX_REDRIVE_RATE" in answer["msg"] and "1000" in answer["msg"]
    await caps(MAX_REDRIVE_RATE=10_000)
    answer = await ask(api, "delayQueue/redriveDeadMsg", "json", {"topic": "orders", "maxPerSecond": 5000}, shop)
    assert answer["code"] == 404  # allowed: there is just no dead letter


async def test_under_a_lowered_redrive_cap_a_redrive_that_names_no_rate_runs_at_the_cap(api, caps):
    """The default rate (500) is no rate the caller asked for: under a cap below it, the redrive
    runs at the cap instead of being refused; the command too, which answers a rate over the cap
    with its message, not a traceback."""
    await caps(MAX_REDRIVE_RATE=100)
    shop = await token()
    answer = await ask(api, "delayQueue/redriveDeadMsg", "json", {"topic": "orders"}, shop)
    assert answer["code"] == 404, answer  # taken: there is just no dead letter
    with pytest.raises(CommandError, match="topic orders has no dead letters"):
        await sync_to_async(call_command)("redrive", "--topic", "orders")
    with pytest.raises(CommandError, match="DELAYQUEUE_MAX_REDRIVE_RATE"):
        await sync_to_async(call_command)("redrive", "--topic", "orders", "--rate", "5000")


async def test_a_token_holding_its_cap_of_long_polls_is_refused_another_one_is_not(api, caps, single_rt):
    await caps(MAX_LONG_POLLS_PER_TOKEN=2)
    first, second = await token(), await token()
    poll = {"topic": "lp", "longPollingTimeoutMillis": "30000"}
    held = [asyncio.ensure_future(ask(api, "delayQueue/longPollingMsg", "post", poll, first)) for _ in range(2)]
    key = single_rt.for_namespace("shop").ns.long_polls(token_hash(first))
    await wait_until(lambda: _count_is(single_rt.redis.zcard(key), 2), what="both polls held")
    refused = await ask(api, "delayQueue/longPollingMsg", "post", poll, first)
    assert refused_by(refused, "DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN") and refused["retryAfterMillis"] > 0
    other = asyncio.ensure_future(ask(api, "delayQueue/longPollingMsg", "post", poll, second))
    other_key = single_rt.for_namespace("shop").ns.long_polls(token_hash(second))
    await wait_until(lambda: _count_is(single_rt.redis.zcard(other_key), 1), what="the other token's poll held")
    # The held polls end (messages for all three), and give their places back.
    for i in range(3):
        sent = await ask(api, "delayQueue/sendMsg", "post", {"topic": "lp", "msg": f"m{i}", "delayMillis": "0"}, first)
        assert sent["code"] == 200
    answers = await asyncio.gather(*held, other)
    assert [len(a["delayMsgList"]) for a in answers] == [1, 1, 1], answers
    assert await single_rt.redis.zcard(key) == 0
    again = await ask(api, "delayQueue/longPollingMsg", "post", {"topic": "lp", "longPollingTimeoutMillis": "1"},
                      first)
    assert again["code"] == 200


async def test_a_second_authorization_header_does_not_make_a_long_poll_another_holders(api, caps, single_rt):
    """The poll is counted under the token it was let in with: Django joins repeated headers into one
    value, which read as a token would differ with whatever the second header says. A refused poll
    answers after a pause: camellia's SDK polls again at once on any error, and spun on one more
    pull thread than the cap."""
    await caps(MAX_LONG_POLLS_PER_TOKEN=1)
    shop = await token()
    poll = {"topic": "lp", "longPollingTimeoutMillis": "30000"}
    held = asyncio.ensure_future(ask(api, "delayQueue/longPollingMsg", "post", poll, shop))
    key = single_rt.for_namespace("shop").ns.long_polls(token_hash(shop))
    await wait_until(lambda: _count_is(single_rt.redis.zcard(key), 1), what="the poll held")
    for second in ("Bearer x", "Basic eDp5"):
        started = time.monotonic()
        response = await api.post("/camellia/delayQueue/longPollingMsg", data=poll,
                                  headers=[("Authorization", f"Bearer {shop}"), ("Authorization", second)])
        assert refused_by(response.json(), "DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN"), response.json()
        assert time.monotonic() - started >= 0.9  # the behaviour itself: a blind retry loop cannot spin
    sent = await ask(api, "delayQueue/sendMsg", "post", {"topic": "lp", "msg": "m", "delayMillis": "0"}, shop)
    assert sent["code"] == 200 and len((await held)["delayMsgList"]) == 1
    assert await single_rt.redis.keys(single_rt.for_namespace("shop").ns.long_polls("*")) == []


async def test_a_second_restore_of_a_namespace_is_refused_while_one_runs(api):
    shop = await token()
    running = make_runtime(REDIS_URL).for_namespace("shop")
    try:
        async with restore_turn(running):
            refused = await ask(api, "delayQueue/restore", "post", {}, shop)
            assert refused["code"] == 429 and "one restore per namespace" in refused["msg"], refused
            # Another namespace restores meanwhile.
            assert (await ask(api, "delayQueue/restore", "post", {}, await token("other")))["code"] == 200
        assert (await ask(api, "delayQueue/restore", "post", {}, shop))["code"] == 200
    finally:
        await running.close()


async def test_purge_topic_ends_while_a_producer_keeps_sending(clean_state):
    # A batch of one message per call, and sends of twenty per round trip: the producer outruns
    # the purge, which before the bound never ended.
    rt = make_runtime(REDIS_URL, scanner_batch=1, message_log=False)
    stop = asyncio.Event()

    async def produce():
        while not stop.is_set():
            await send_messages(rt, requests=[SendRequest("busy", "m", 0)] * 20)

    try:
        await send_messages(rt, requests=[SendRequest("busy", "m", 60_000)] * 5)
        producer = asyncio.ensure_future(produce())
        await wait_until(lambda: _count_is(_live(rt), 40, at_least=True), what="the producer sending")
        try:
            purged = await asyncio.wait_for(purge_topic(rt, topic="busy"), 60)
        finally:
            stop.set()
            await producer
        assert purged >= 1
        left = await _live(rt)
        assert left > 0  # the producer's, among others
        assert await purge_topic(rt, topic="busy") == left  # with the producer gone, a purge takes the rest
        assert await _live(rt) == 0
    finally:
        await rt.close()


async def _live(rt) -> int:
    info = await topic_info(rt, topic="busy")
    return info.waiting + info.ready + info.consuming


async def _count_is(count, expected: int, at_least: bool = False) -> bool:
    value = await count
    return value >= expected if at_least else value == expected


async def test_a_topic_push_concurrency_and_timeout_are_bounded_and_older_settings_pushed_at_the_bounds(api):
    shop = await token()
    url = "http://127.0.0.1:9/hook"
    for name, value in (("pushConcurrency", "1000"), ("pushTimeoutMillis", "300000")):
        answer = await ask(api, "delayQueue/setTopicConfig", "post", {"topic": "big", "pushUrl": url, name: value},
                           shop)
        assert answer["code"] == 400 and name in answer["msg"], answer
    # A row set under the earlier bounds (1000 pushes, 300 s) is pushed at the new ones.
    await sync_to_async(save_topic_config)(namespace="shop", topic="old", changes={"push_url": url}, limits={}, by_operator=True)
    await sync_to_async(TopicConfig.objects.filter(topic="old").update)(push_concurrency=1000,
                                                                         push_timeout_millis=300_000)
    pushed = PushTopicCache(namespace_keys("shop"), DEFAULT_DATABASE)
    try:
        old = (await pushed.fresh())["old"]
        assert (old.push_concurrency, old.push_timeout_millis) == (200, 60_000)
    finally:
        await pushed.close()


async def test_concurrent_long_polls_of_one_token_never_pass_the_cap_and_a_dead_process_holds_expire(
        api, caps, single_rt):
    await caps(MAX_LONG_POLLS_PER_TOKEN=3)
    shop = await token()
    key = single_rt.for_namespace("shop").ns.long_polls(token_hash(shop))
    # Holds a web process left behind when it died: past their end, they no longer count.
    ended = int(time.time() * 1000) - 1
    await single_rt.redis.zadd(key, {f"dead{i}": ended for i in range(3)})
    poll = {"topic": "many", "longPollingTimeoutMillis": "3000"}
    answers = await asyncio.gather(*[ask(api, "delayQueue/longPollingMsg", "post", poll, shop) for _ in range(10)])
    held = [a for a in answers if a["code"] == 200]
    assert 1 <= len(held) <= 3, answers
    assert all(refused_by(a, "DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN") for a in answers if a["code"] != 200)
    assert await single_rt.redis.zcard(key) == 0  # every place given back, the dead ones dropped
