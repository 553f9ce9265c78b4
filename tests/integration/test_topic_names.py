"""Topic names as camellia accepts them (any non-empty UTF-8 text without control characters, up
to 255 bytes) through every endpoint, the scanner, the log writer, restore and the operator's
pages, on the single Redis and the Redis Cluster. Each name below has a character the Redis key
encoding handles (a brace would cut the cluster hash tag short, a glob metacharacter would act
in a pattern, "%" is the encoding's own escape) or that the old rule refused."""
import asyncio
import html
import io
import re
import subprocess
import sys
from urllib.parse import parse_qs

import pytest
import redis
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command
from prometheus_client.parser import text_string_to_metric_families

from delayqueue.api import edge
from delayqueue.config.redis_urls import url_credentials, url_nodes
from delayqueue.core.constants import MAX_TOPIC_BYTES, Status
from delayqueue.core.names import TOPIC_RULE
from delayqueue.live.keys import key_text, namespace_keys
from delayqueue.services.consume import pull_messages
from delayqueue.services.send import SendRequest, send_message
from delayqueue.workers import log_writer
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, ROOT, call, drain_log, history, logged, make_runtime,
                           scanner_env, send, wait_until)

LONGEST = "订" * (MAX_TOPIC_BYTES // 3)  # 85 characters, 255 bytes
TOPICS = ["my topic", "a/b", "{}", "{a}b}", "*", "?", "[x]", "%41", "\\", "订单-cancel", " padded ", "a+b&c=d#e",
          LONGEST]
TOO_LONG = ["x" * (MAX_TOPIC_BYTES + 1), "订" * 86, "é" * 128]
CONTROL = ["a\nb", "tab\t", "nul\x00", "del\x7f", "nel\x85", "\x9f"]
# Every endpoint that takes a topic, with the other parameters it needs.
TOPIC_ENDPOINTS = {
    "sendMsg": {"msg": "x", "delayMillis": "0"},
    "pullMsg": {},
    "longPollingMsg": {"longPollingTimeoutMillis": "100"},
    "ackMsg": {"msgId": "m"},
    "getMsg": {"msgId": "m"},
    "deleteMsg": {"msgId": "m"},
    "getTopicInfo": {},
    "restore": {},
    "restoreMsg": {"msgId": "m"},
}


def redis_client(url: str):
    if url == REDIS_CLUSTER_URL:
        return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in url_nodes(url)],
                                  decode_responses=True, **url_credentials(url))
    return redis.Redis.from_url(url, decode_responses=True)


def flushall(client) -> None:
    if isinstance(client, redis.RedisCluster):
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.flushall()


@pytest.fixture(params=["single", "cluster"])
def redis_url(request, settings, clean_state):
    """The API's Redis: the single one, then the cluster, where a topic's keys scattered over
    slots would fail every script with CROSSSLOT."""
    url = REDIS_CLUSTER_URL if request.param == "cluster" else REDIS_URL
    if not url:
        pytest.fail("REDIS_CLUSTER_URL is not set: ./dev test starts a local cluster")
    settings.REDIS_URL = url
    return url


async def test_every_endpoint_takes_such_topics(api, redis_url):
    client = redis_client(redis_url)
    try:
        for topic in TOPICS:
            sent = await call(api, "sendMsg", topic=topic, msg="first", delayMillis="0", msgId="m1")
            assert sent["code"] == 200 and sent["delayMsg"]["topic"] == topic, sent
            batch = await call(api, "sendMsgBatch", json=[
                {"topic": topic, "msg": "second", "delayMillis": 0, "msgId": "m2"},
                {"topic": topic, "msg": "later", "delayMillis": 600_000, "msgId": "m3"}])
            assert [r["code"] for r in batch["results"]] == [200, 200], batch
            assert {r["delayMsg"]["topic"] for r in batch["results"]} == {topic}
            # The topic's keys are where the encoding puts them, and nowhere else.
            assert client.hlen(f"dq:{{default:{key_text(topic)}}}:msgs") == 3
            info = await call(api, "getTopicInfo", method="get", topic=topic)
            assert (info["data"]["topic"], info["data"]["readyQueueSize"], info["data"]["waitingQueueSize"]) == (
                topic, 2, 1), info

            [first] = (await call(api, "pullMsg", topic=topic, batch="1"))["delayMsgList"]
            assert (first["topic"], first["msgId"]) == (topic, "m1")
            assert (await call(api, "ackMsg", topic=topic, msgId="m1"))["code"] == 200
            assert (await call(api, "getMsg", topic=topic, msgId="m1"))["delayMsg"]["status"] == Status.ACKED
            [second] = (await call(api, "longPollingMsg", topic=topic, longPollingTimeoutMillis="5000"))["delayMsgList"]
            assert second["msgId"] == "m2"
            assert (await call(api, "ackMsg", topic=topic, msgId="m2", ack="false"))["code"] == 200  # nack
            [again] = (await call(api, "pullMsg", topic=topic))["delayMsgList"]
            assert (again["msgId"], again["retry"]) == ("m2", 2)
            assert (await call(api, "ackMsg", topic=topic, msgId="m2"))["code"] == 200
            assert (await call(api, "deleteMsg", topic=topic, msgId="m3"))["code"] == 200
            assert (await call(api, "getMsg", topic=topic, msgId="m3"))["delayMsg"]["status"] == Status.DELETED

            # A held long poll is woken by a send to its topic (the ready channel carries the topic).
            poll = asyncio.ensure_future(call(api, "longPollingMsg", topic=topic, longPollingTimeoutMillis="20000"))
            await asyncio.sleep(0.2)
            assert not poll.done()
            await call(api, "sendMsg", topic=topic, msg="woken", delayMillis="0", msgId="m4")
            [woken] = (await asyncio.wait_for(poll, 10))["delayMsgList"]
            assert (woken["topic"], woken["msg"]) == (topic, "woken")

        listed = (await call(api, "getTopicInfoList", method="get"))["data"]
        assert [t["topic"] for t in listed] == TOPICS  # registration order
        assert sorted(client.zrange(namespace_keys("default").topics, 0, -1)) == sorted(TOPICS)

        # Restore from the message log after Redis lost everything: per topic, and per message.
        for topic in TOPICS:
            await call(api, "sendMsg", topic=topic, msg="kept", delayMillis="600000", msgId="m5")
        # Those sends show in getMonitorData once their interval is complete (two, if they straddled a boundary).
        monitored = set()

        async def every_topic_monitored():
            data = (await call(api, "getMonitorData", method="get"))["data"]
            monitored.update(s["topic"] for s in data["requestStatsList"] if s["sendMsg"])
            return monitored == set(TOPICS)

        await wait_until(every_topic_monitored, timeout=10, interval=0.2, what="every topic's sends in getMonitorData")
        rt = make_runtime(redis_url)
        try:
            await drain_log(rt, TOPICS)  # the log learns the acks and deletes (a scanner's log writer's work)
        finally:
            await rt.close()
        flushall(client)
        for topic in TOPICS:
            restored = await call(api, "restore", topic=topic)
            assert (restored["code"], restored["restored"]) == (200, 2), (topic, restored)  # m4 (pulled) and m5
            assert (await call(api, "getMsg", topic=topic, msgId="m5"))["delayMsg"]["msg"] == "kept"
        flushall(client)
        for topic in TOPICS:
            one = await call(api, "restoreMsg", topic=topic, msgId="m5")
            assert (one["code"], one["restored"]) == (200, 1), (topic, one)
            info = await call(api, "getTopicInfo", topic=topic)
            assert info["data"]["waitingQueueSize"] == 1 and info["data"]["readyQueueSize"] == 0
    finally:
        client.close()


@pytest.mark.parametrize("endpoint", TOPIC_ENDPOINTS)
async def test_a_topic_over_255_bytes_or_with_a_control_character_is_refused_naming_the_rule(
        api, endpoint, monkeypatch):
    monkeypatch.setattr(edge, "LONG_POLL_ERROR_PAUSE_SECONDS", 0)  # each refused long poll would wait 1 s
    for topic in TOO_LONG + CONTROL:
        for method in ("post", "get"):
            answer = await call(api, endpoint, method=method, topic=topic, **TOPIC_ENDPOINTS[endpoint])
            assert set(answer) == {"code", "msg"} and answer["code"] == 400, (topic, answer)
            assert answer["msg"].startswith(f"topic: {TOPIC_RULE}; it "), answer
    if endpoint != "restore":  # where the topic is optional, empty means absent (every topic)
        empty = await call(api, endpoint, topic="", **TOPIC_ENDPOINTS[endpoint])
        assert empty == {"code": 400, "msg": f"topic: {TOPIC_RULE}; it is empty"}
    bad = TOO_LONG + CONTROL
    batch = await call(api, "sendMsgBatch", json=[{"topic": t, "msg": "x", "delayMillis": 0} for t in bad])
    why = [f"it is {len(t.encode())} bytes" for t in TOO_LONG] + [
        f"it has U+{c:04X}" for c in (0x0A, 0x09, 0x00, 0x7F, 0x85, 0x9F)]
    assert [r["msg"] for r in batch["results"]] == [f"message {i}: topic: {TOPIC_RULE}; {w}" for i, w in enumerate(why)]
    assert (await call(api, "getTopicInfoList", method="get"))["data"] == []  # nothing registered


async def test_the_scanner_promotes_requeues_and_logs_such_topics(rt, start_scanner, monkeypatch):
    """Promotion and ack timeouts (the scanner's scripts on each topic's keys), and the log
    writer, which learns which topic has new history from the channel named after the topic's
    events key: only that notice, as the periodic read of every stream is pushed out of reach."""
    monkeypatch.setattr(log_writer, "SWEEP_SECONDS", 3600)
    for topic in TOPICS:
        await send_message(rt, request=SendRequest(topic=topic, msg="slow", delay_millis=0, msg_id="slow"))
    running = await start_scanner(rt)

    async def all_held():
        return len(running.scanner.workers) == len(TOPICS)

    await wait_until(all_held, what="the scanner to hold every topic")
    await asyncio.sleep(0.5)  # its first reads of the newly held streams are done
    for topic in TOPICS:
        await send_message(rt, request=SendRequest(topic=topic, msg="late", delay_millis=300, msg_id="late"))
        [pulled], _ = await pull_messages(rt, topic=topic, ack_timeout_millis=300)
        assert pulled.msg_id == "slow"

    delivered = []

    async def promoted_and_requeued():
        for topic in TOPICS:
            got, _ = await pull_messages(rt, topic=topic, batch=2)
            delivered.extend((m.topic, m.msg_id, m.retry) for m in got)
        return len(delivered) >= 2 * len(TOPICS)

    await wait_until(promoted_and_requeued, timeout=10, what="the late messages promoted, the slow ones requeued")
    assert sorted(delivered) == sorted([(t, "late", 1) for t in TOPICS] + [(t, "slow", 2) for t in TOPICS])

    async def history_logged():
        return all([("ack_timeout", Status.CONSUMING, Status.READY, 1) in await history(t, "slow") for t in TOPICS])

    await wait_until(history_logged, timeout=10, what="every topic's history in the message log")
    assert {(await logged(t, "late"))["status"] for t in TOPICS} == {Status.CONSUMING}


@pytest.mark.process
@pytest.mark.fault
async def test_manage_py_restore_after_flushall(single_rt):
    for topic in TOPICS:
        await send_message(single_rt, request=SendRequest(topic=topic, msg=f"in {topic}", delay_millis=600_000, msg_id="w"))
        await send_message(single_rt, request=SendRequest(topic=topic, msg="due", delay_millis=0, msg_id="r"))
    await single_rt.redis.flushall()

    # A topic with braces on a real command line; the rest through the same command in this process.
    one = subprocess.run([sys.executable, "manage.py", "restore", "--topic", "{a}b}"], cwd=ROOT, env=scanner_env(),
                         capture_output=True, text=True, timeout=60)
    assert one.returncode == 0 and "restored 2, already live 0" in one.stdout, one.stderr

    @sync_to_async
    def restore(*options) -> str:
        out = io.StringIO()
        call_command("restore", *options, stdout=out)
        return out.getvalue()

    assert f"restored {2 * len(TOPICS) - 2}, already live 2" in await restore()
    for topic in TOPICS:
        info = await pull_messages(single_rt, topic=topic, batch=5)
        assert [(m.topic, m.msg_id) for m in info.messages] == [(topic, "r")]
        waiting = await single_rt.redis.zrange(single_rt.ns.topic(topic).waiting, 0, -1)
        assert waiting == ["w"]
    with pytest.raises(CommandError, match=re.escape("no message in the message log matches --topic 'my  topic'")):
        await restore("--topic", "my  topic")


async def test_metrics_label_such_topics(api):
    for topic in TOPICS:
        await call(api, "sendMsg", topic=topic, msg="x", delayMillis="0")
    response = await api.get("/metrics")
    ready = {s.labels["topic"]: s.value for family in text_string_to_metric_families(response.text)
             for s in family.samples if s.name == "delayqueue_queue_size" and s.labels["queue"] == "ready"}
    assert ready == {topic: 1 for topic in TOPICS}


DASHBOARD = "/admin/dashboard/"
ADMIN_LIST = "/admin/delayqueue/message/"
HTML_TOPIC = "<b>&\"'"  # must be shown as text, never as markup


def test_dashboard_and_admin_show_and_filter_such_topics(admin_client, clean_state):
    topics = [*TOPICS, HTML_TOPIC]
    for topic in topics:
        send(topic, f"id of {topic}")
    page = admin_client.get(DASHBOARD).content.decode()
    assert "<b>&" not in page
    shown = {html.unescape(t) for t in re.findall(r'<tr class="row-\w+" data-topic="([^"]+)">', page)}
    assert shown == set(topics)
    links = [parse_qs(html.unescape(q)) for q in re.findall(r'<a href="\?(namespace=[^"]*&amp;topic=[^"]*)">', page)]
    assert sorted(link["topic"][0] for link in links) == sorted(topics)
    assert {link["namespace"][0] for link in links} == {"default"}
    for topic in topics:
        one = admin_client.get(DASHBOARD, {"topic": topic}).content.decode()
        assert [html.unescape(t) for t in re.findall(r'<tr class="row-\w+" data-topic="([^"]+)">', one)] == [topic]
        listed = admin_client.get(ADMIN_LIST, {"topic": topic}).content.decode()
        ids = re.findall(r'<th class="field-msg_id"><a href="[^"]+">([^<]+)</a>', listed)
        assert [html.unescape(i) for i in ids] == [f"id of {topic}"]
