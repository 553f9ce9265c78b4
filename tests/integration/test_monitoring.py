"""getMonitorData / getTopicInfo(List) figures against known traffic, the Prometheus /metrics
(fire-lateness histogram, counters, sizes, scanner lag, log backlog) and the health endpoints.
Figures come from Redis, so they add up whichever process did the work."""
import asyncio
import socket
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from delayqueue.api import health_state, wire
from delayqueue.core.clock import now_millis
from delayqueue.live import push_counts as push_figures
from delayqueue.live import scripts
from delayqueue.ops import figures
from delayqueue.ops.figures import live_state
from delayqueue.services.messages import redis_millis
from delayqueue.services.send import SendRequest, send_message
from delayqueue.services.topics import list_topics, monitor_data
from delayqueue.stores import rows
from delayqueue.workers import scanner as scanner_module
from tests.helpers import ROOT, call, promote, wait_until

INTERVAL = 4  # long enough for the traffic below to fit in one monitor interval on a slow machine


async def redis_seconds(rt) -> float:
    seconds, micros = await rt.redis.time()
    return int(seconds) + int(micros) / 1e6


async def sleep_to_next_interval(rt):
    now = await redis_seconds(rt)
    await asyncio.sleep(INTERVAL - now % INTERVAL + 0.05)


async def scrape(api) -> dict:
    """/metrics as {(name, frozenset(labels)): value}."""
    response = await api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def sample(samples, name, namespace="default", **labels):
    return samples.get((name, frozenset({"namespace": namespace, **labels}.items())))


@pytest.mark.process
async def test_monitor_data_counts_known_traffic_of_web_and_scanner_processes(api, single_rt, settings,
                                                                            scanner_process):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MONITOR_INTERVAL_SECONDS": INTERVAL}
    scanner = scanner_process("mon", DELAYQUEUE_MONITOR_INTERVAL_SECONDS=INTERVAL)
    scanner.wait_started()
    await sleep_to_next_interval(single_rt)
    started = await redis_seconds(single_rt)
    for i in range(5):
        await call(api, "sendMsg", topic="mon", msg=str(i), delayMillis="1000", msgId=f"m{i}")
    await call(api, "sendMsg", topic="mon", msg="short-lived", delayMillis="1000", ttlMillis="500", msgId="m5")
    await call(api, "sendMsg", topic="mon", msg="dup", delayMillis="1000", msgId="m0")  # deduplicated, counted
    await call(api, "sendMsg", topic="mon2", msg="x", delayMillis="0")

    async def promoted():  # by the scanner process
        return (await call(api, "getTopicInfo", method="get", topic="mon"))["data"]["readyQueueSize"] == 6
    await wait_until(promoted, what="the scanner to promote six messages")
    pulled = await call(api, "pullMsg", topic="mon", batch="2", ackTimeoutMillis="300")
    assert [m["msgId"] for m in pulled["delayMsgList"]] == ["m0", "m1"]
    await call(api, "ackMsg", topic="mon", msgId="m0")
    await call(api, "getMsg", topic="mon", msgId="m2")
    await call(api, "deleteMsg", topic="mon", msgId="m3")
    assert (await call(api, "deleteMsg", topic="mon", msgId="nope"))["code"] == 404  # not counted

    async def requeued_and_expired():
        m1 = await live_state(single_rt, namespace="default", topic="mon", msg_id="m1")
        m5 = await live_state(single_rt, namespace="default", topic="mon", msg_id="m5")
        return m1["message"]["status"] == 2 and m5["message"]["status"] == 5
    await wait_until(requeued_and_expired, what="the ack timeout of m1 and the TTL of m5")
    assert await redis_seconds(single_rt) < started - started % INTERVAL + INTERVAL, \
        "the traffic did not fit in one monitor interval"
    assert (await call(api, "getMonitorData", method="get"))["data"]["requestStatsList"] == []

    await sleep_to_next_interval(single_rt)
    data = (await call(api, "getMonitorData", method="get"))["data"]
    assert data["requestStatsList"] == [
        # triggerMsgReady counts the six messages the scanner moved (camellia counted topics)
        {"topic": "mon", "sendMsg": 7, "pullMsg": 2, "deleteMsg": 1, "ackMsg": 1, "getMsg": 1,
         "triggerMsgReady": 6, "triggerMsgEndLife": 1, "triggerMsgTimeout": 1},
        {"topic": "mon2", "sendMsg": 1, "pullMsg": 0, "deleteMsg": 0, "ackMsg": 0, "getMsg": 0,
         "triggerMsgReady": 0, "triggerMsgEndLife": 0, "triggerMsgTimeout": 0},
    ]
    [ready_gap] = data["readyQueueTimeGapStatsList"]
    assert ready_gap["topic"] == "mon" and ready_gap["count"] == 6
    assert 0 <= ready_gap["avg"] <= ready_gap["max"]
    [pull_gap] = data["pullMsgTimeGapStatsList"]
    assert pull_gap["topic"] == "mon" and pull_gap["count"] == 2 and pull_gap["max"] >= pull_gap["avg"] > 0

    # The same traffic as Prometheus counters, and the promotions in the lateness histogram.
    samples = await scrape(api)
    assert sample(samples, "delayqueue_requests_total", topic="mon", type="sendMsg") == 7
    assert sample(samples, "delayqueue_requests_total", topic="mon", type="triggerMsgReady") == 6
    assert sample(samples, "delayqueue_requests_total", topic="mon2", type="sendMsg") == 1
    assert sample(samples, "delayqueue_fire_lateness_seconds_count", topic="mon") == 6
    assert sample(samples, "delayqueue_fire_lateness_seconds_bucket", topic="mon", le="+Inf") == 6
    assert sample(samples, "delayqueue_fire_lateness_seconds_count", topic="mon2") == 0


async def test_lateness_histogram_buckets(api, single_rt, start_scanner):
    """Messages due while no scanner runs fire late by at least that outage; ones sent while it
    runs are counted too. Buckets are cumulative and agree with the count, sum and the chart."""
    # Due in a second, not at once: a send that reaches Redis after its trigger time is stored
    # ready and never promoted, so not counted, which the log's write before it made happen within
    # 50 ms on a loaded machine.
    for i in range(3):
        await call(api, "sendMsg", topic="late", msg=str(i), delayMillis="1000")
    await asyncio.sleep(2.6)  # no scanner: these are at least 1.5 s late when it starts
    await start_scanner(single_rt)
    await wait_until(lambda: _ready(api, "late", 3), what="the late messages to be promoted")
    for i in range(2):
        await call(api, "sendMsg", topic="late", msg=f"on time {i}", delayMillis="1000")
    await wait_until(lambda: _ready(api, "late", 5), what="the prompt messages to be promoted")

    async def counted():  # the scanner writes what its promotions counted once a second
        samples = await scrape(api)
        return samples if sample(samples, "delayqueue_fire_lateness_seconds_count", topic="late") == 5 else None

    samples = await wait_until(counted, what="the promotions to be counted")
    buckets = sorted(
        (float(dict(labels)["le"]), value) for (name, labels), value in samples.items()
        if name == "delayqueue_fire_lateness_seconds_bucket" and dict(labels)["topic"] == "late"
    )
    assert [le for le, _ in buckets][:3] == [0.001, 0.002, 0.005] and buckets[-1] == (float("inf"), 5)
    counts = [value for _, value in buckets]
    assert counts == sorted(counts)  # cumulative
    assert dict(buckets)[1.0] <= 2  # the three late ones are above a second
    assert sample(samples, "delayqueue_fire_lateness_seconds_count", topic="late") == 5
    assert sample(samples, "delayqueue_fire_lateness_seconds_sum", topic="late") >= 3 * 1.5
    overview = await _overview(single_rt, "late")
    assert sum(p["count"] for p in overview["lateness_series"]) == 5
    assert max(p["max"] or 0 for p in overview["lateness_series"]) >= 1500


async def _ready(api, topic, n):
    return (await call(api, "getTopicInfo", method="get", topic=topic))["data"]["readyQueueSize"] == n


async def _overview(rt, topic):
    from delayqueue.ops.figures import topic_overview

    return (await topic_overview(rt, topics=[topic]))[0]


@pytest.mark.process
async def test_metrics_sizes_buckets_backlog_and_scanner_lag(api, single_rt, scanner_process):
    await call(api, "sendMsg", topic="sizes", msg="a", delayMillis="0")
    await call(api, "sendMsg", topic="sizes", msg="b", delayMillis="0")
    await call(api, "sendMsg", topic="sizes", msg="c", delayMillis=str(2 * 3_600_000))
    await call(api, "pullMsg", topic="sizes")
    await asyncio.sleep(0.3)
    samples = await scrape(api)
    assert sample(samples, "delayqueue_queue_size", topic="sizes", queue="waiting") == 1
    assert sample(samples, "delayqueue_queue_size", topic="sizes", queue="ready") == 1
    assert sample(samples, "delayqueue_queue_size", topic="sizes", queue="inflight") == 1
    assert sample(samples, "delayqueue_waiting_messages", topic="sizes", due_in="1hourTo6hour") == 1
    assert sample(samples, "delayqueue_waiting_messages", topic="sizes", due_in="0To1min") == 0
    # The pull's lifecycle event waits in Redis (no scanner, so no log writer); sends write
    # their 'sent' rows themselves.
    assert sample(samples, "delayqueue_log_writer_backlog", topic="sizes") == 1
    assert sample(samples, "delayqueue_topics") == 1
    assert sample(samples, "delayqueue_oldest_ready_age_seconds", topic="sizes") >= 0.3  # "b", ready since the sends
    assert not [key for key in samples if key[0] == "delayqueue_scanner_loop_lag_seconds"]

    scanner = scanner_process("lag")
    scanner.wait_started()

    async def scanned():
        s = await scrape(api)
        lag = sample(s, "delayqueue_scanner_loop_lag_seconds", scanner="lag")
        return lag is not None and sample(s, "delayqueue_log_writer_backlog", topic="sizes") == 0 and s
    samples = await wait_until(scanned, what="the scanner to report its lag and drain the events")
    assert 0 <= sample(samples, "delayqueue_scanner_loop_lag_seconds", scanner="lag") < 60
    assert scanner.stop() == 0
    samples = await scrape(api)  # a stopped scanner withdraws its report
    assert sample(samples, "delayqueue_scanner_loop_lag_seconds", scanner="lag") is None


async def test_metrics_cover_every_served_namespace(api, single_rt):
    await sync_to_async(rows.create_token)(namespace="other", scopes=["produce"])  # "other" is now served
    await send_message(single_rt, request=SendRequest(topic="t", msg="x", delay_millis=0))
    other = single_rt.for_namespace("other")
    for msg in ("a", "b"):
        await send_message(other, request=SendRequest(topic="t", msg=msg, delay_millis=60_000))
    await send_message(other, request=SendRequest(topic="u", msg="c", delay_millis=0))
    await other.redis.set(other.ns.data_lost, 1_795_000_000_000)
    await other.redis.hset(other.ns.scanners, "their-scanner", f"12:{await redis_millis(other)}")
    samples = await scrape(api)
    assert sample(samples, "delayqueue_queue_size", topic="t", queue="ready") == 1
    assert sample(samples, "delayqueue_queue_size", topic="t", queue="waiting") == 0
    assert sample(samples, "delayqueue_queue_size", "other", topic="t", queue="waiting") == 2
    assert sample(samples, "delayqueue_queue_size", "other", topic="u", queue="ready") == 1
    assert sample(samples, "delayqueue_requests_total", "other", topic="t", type="sendMsg") == 2
    assert sample(samples, "delayqueue_topics") == 1 and sample(samples, "delayqueue_topics", "other") == 2
    assert sample(samples, "delayqueue_redis_data_lost_timestamp_seconds") == 0
    assert sample(samples, "delayqueue_redis_data_lost_timestamp_seconds", "other") == 1_795_000_000
    assert sample(samples, "delayqueue_scanner_loop_lag_seconds", "other", scanner="their-scanner") == 0.012
    assert sample(samples, "delayqueue_scanner_loop_lag_seconds", scanner="their-scanner") is None
    # Every series carries its namespace.
    assert all(dict(labels).get("namespace") in ("default", "other") for _name, labels in samples)


@pytest.mark.fault
async def test_metrics_answer_for_delayqueue_namespace_while_postgres_is_down(api, single_rt, postgres, caplog):
    await sync_to_async(rows.create_token)(namespace="other", scopes=["produce"])
    await send_message(single_rt, request=SendRequest(topic="t", msg="x", delay_millis=0))
    await send_message(single_rt.for_namespace("other"), request=SendRequest(topic="t", msg="y", delay_millis=0))
    assert sample(await scrape(api), "delayqueue_topics", "other") == 1
    postgres.stop()
    try:
        samples = await scrape(api)  # the served namespaces are not known: DELAYQUEUE_NAMESPACE's figures alone
        assert sample(samples, "delayqueue_queue_size", topic="t", queue="ready") == 1
        assert sample(samples, "delayqueue_topics", "other") is None
        assert "could not read the token namespaces" in caplog.text
    finally:
        await asyncio.to_thread(postgres.start)
    assert sample(await scrape(api), "delayqueue_topics", "other") == 1


@pytest.mark.fault
async def test_metrics_answer_for_delayqueue_namespace_while_postgres_hangs(api, single_rt, caplog):
    """A PostgreSQL that takes connections and never answers (a hung server, a lost network) holds
    no scrape: the served namespaces and the dead letters are given up after their timeouts."""
    await send_message(single_rt, request=SendRequest(topic="t", msg="x", delay_millis=0))
    database = connections["default"].settings_dict  # every thread's connections are made from it
    served = database["HOST"], database["PORT"]
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()  # the kernel takes each connection; nothing ever answers on it
        database["HOST"], database["PORT"] = hung.getsockname()
        try:
            samples = await asyncio.wait_for(scrape(api), 60)
        finally:
            database["HOST"], database["PORT"] = served
    assert sample(samples, "delayqueue_queue_size", topic="t", queue="ready") == 1
    assert sample(samples, "delayqueue_dead_letters", topic="t") is None  # left out
    assert "could not read the token namespaces" in caplog.text


async def test_unknown_topics_give_zeros(api):
    info = (await call(api, "getTopicInfo", method="get", topic="never-seen"))["data"]
    assert info["waitingQueueSize"] == info["readyQueueSize"] == info["ackQueueSize"] == 0
    assert set(info["waitingQueueInfo"].values()) == {0} and len(info["waitingQueueInfo"]) == 9
    assert (await call(api, "getMonitorData", method="get"))["data"] == {
        "requestStatsList": [], "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": []}
    samples = await scrape(api)
    assert sample(samples, "delayqueue_topics") == 0


async def test_topic_info_list_has_each_topic_once(api, single_rt):
    for topic in ("b", "a", "b", "c", "a"):
        await call(api, "sendMsg", topic=topic, msg="x", delayMillis="60000")
    # a topic re-registered by a racing send is still listed once
    await single_rt.redis.zadd(single_rt.ns.topics, {"a": 1}, nx=True)
    listed = (await call(api, "getTopicInfoList", method="get"))["data"]
    assert [t["topic"] for t in listed] == ["b", "a", "c"]
    assert [t["waitingQueueSize"] for t in listed] == [2, 2, 1]


async def test_metrics_when_redis_is_down(api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    from delayqueue import runtime

    runtime._runtimes.clear()
    try:
        response = await api.get("/metrics")
        # What failed, not where: the scraper does not learn the address of Redis.
        assert response.status_code == 503 and response.text == "# Redis unavailable: connection refused\n"
    finally:
        runtime._runtimes.clear()


async def test_health_endpoints_answer_like_camellia(api, monkeypatch):
    for path in ("status", "check"):
        response = await api.get(f"/camellia/health/{path}")
        assert (response.status_code, response.json()) == (200, {"code": 200})
    await call(api, "sendMsg", topic="h", msg="x", delayMillis="0")  # a queue request just now
    try:
        offline = await api.post("/camellia/health/offline")
        assert (offline.status_code, offline.text) == (500, '{"code":500}')  # still draining, as camellia writes it
        status = await api.get("/camellia/health/status")
        assert (status.status_code, status.json()) == (500, {"code": 500})
        assert (await api.get("/camellia/health/check")).status_code == 200
        await api.get("/camellia/delayQueue/getTopicInfoList")  # monitor reads are not "use"
        monkeypatch.setattr(health_state, "IDLE_SECONDS_BEFORE_OFFLINE", 0.2)
        await asyncio.sleep(0.3)
        assert (await api.post("/camellia/health/offline")).status_code == 200  # drained
        assert (await call(api, "sendMsg", topic="h", msg="still served", delayMillis="0"))["code"] == 200
    finally:
        online = await api.post("/camellia/health/online")
    assert (online.status_code, online.json()) == (200, {"code": 200})
    assert (await api.get("/camellia/health/status")).status_code == 200


async def test_health_status_and_check_answer_every_method_a_load_balancer_checks_with(api):
    """camellia maps them for every method; a load balancer checking with HEAD (or HAProxy's default,
    OPTIONS) got HTTP 400 and took every host out of rotation."""
    for method in ("HEAD", "OPTIONS", "PUT", "DELETE"):
        for path in ("status", "check"):
            assert (await api.request(method, f"/camellia/health/{path}")).status_code == 200, (method, path)
    await api.post("/camellia/health/offline")
    try:
        for method in ("HEAD", "OPTIONS"):
            assert (await api.request(method, "/camellia/health/status")).status_code == 500, method
            assert (await api.request(method, "/camellia/health/check")).status_code == 200, method
    finally:
        await api.post("/camellia/health/online")


async def test_health_state_is_shared_by_the_hosts_workers(api, single_rt, monkeypatch):
    """Another uvicorn worker of the host (here: this one forgetting its own state) answers alike."""
    await api.post("/camellia/health/offline")
    monkeypatch.setattr(health_state, "_online", True)
    assert (await api.get("/camellia/health/status")).status_code == 500
    await api.post("/camellia/health/online")
    monkeypatch.setattr(health_state, "_online", False)
    assert (await api.get("/camellia/health/status")).status_code == 200
    # A request another worker served a moment ago keeps the host draining.
    monkeypatch.setattr(health_state, "_last_use", 0.0)
    await single_rt.redis.hset(single_rt.ns.health, f"{health_state.HOST}:last_use", int(time.time() * 1000))
    assert (await api.post("/camellia/health/offline")).status_code == 500
    await single_rt.redis.hset(single_rt.ns.health, f"{health_state.HOST}:last_use", int(time.time() * 1000) - 60_000)
    assert (await api.post("/camellia/health/offline")).status_code == 200
    await api.post("/camellia/health/online")


async def test_offline_and_online_are_not_done_while_redis_cannot_keep_them(api, settings, monkeypatch):
    """The host's state is kept in Redis for every worker of the host: a change this worker alone
    would know of is not done (500, as "call it again"), however idle the worker is. An offline
    answered 200 would have the operator stop a host whose other workers still serve."""
    monkeypatch.setattr(health_state, "_online", True)  # this worker's own state, restored after the test
    monkeypatch.setattr(health_state, "_last_use", 0.0)  # idle: only the change itself can fail
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    from delayqueue import runtime

    runtime._runtimes.clear()
    try:
        for change in ("offline", "online"):
            answer = await api.post(f"/camellia/health/{change}")
            assert (answer.status_code, answer.json()) == (500, {"code": 500}), change
    finally:
        runtime._runtimes.clear()


async def test_grafana_dashboard_queries_only_exported_metrics(api, single_rt, start_scanner):
    import json
    import re

    await start_scanner(single_rt)
    await call(api, "sendMsg", topic="g", msg="x", delayMillis="10")
    await wait_until(lambda: _ready(api, "g", 1), what="a promotion")
    await wait_until(lambda: _lag_reported(api), what="the scanner's lag report")
    # A push topic with a pushed and a failed attempt counted, as a pusher counts them.
    await call(api, "setTopicConfig", topic="p", pushUrl="http://127.0.0.1:9/hook")
    await call(api, "sendMsg", topic="p", msg="x", delayMillis="600000")
    await single_rt.scripts.call(scripts.add_counts(single_rt.context, fields=[
        (push_figures.failed_field("p", "500"), 1), *((name, 1) for name in push_figures.pushed_fields("p", 3))]))
    exported = {name.removesuffix("_bucket").removesuffix("_total").removesuffix("_sum").removesuffix("_count")
                for name, _ in await scrape(api)}
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    queried = {re.sub(r"_(bucket|total|sum|count)$", "", name)
               for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"delayqueue_\w+", target["expr"])}
    assert queried and queried <= exported, queried - exported


async def test_a_scanner_whose_clock_is_behind_is_not_taken_for_a_stopped_one(api, single_rt, start_scanner,
                                                                              monkeypatch):
    """/metrics judges a lag report's age by Redis' clock, so the report is stamped on it: a scanner
    host whose own clock is a minute behind still shows its lag (an absent one pages "no scanner")."""
    monkeypatch.setattr(scanner_module, "now_millis", lambda: now_millis() - 60_000)
    await start_scanner(single_rt, "behind")

    async def reported():
        return sample(await scrape(api), "delayqueue_scanner_loop_lag_seconds", scanner="behind") is not None
    await wait_until(reported, what="the scanner's lag report")


async def _lag_reported(api):
    return any(name == "delayqueue_scanner_loop_lag_seconds" for name, _ in await scrape(api))


async def test_overview_and_monitor_reads_work_on_a_cluster_too(rt):

    for topic in ("c1", "c2", "c3"):  # on a cluster these land in different slots
        # Due in a second: one reaching Redis after its trigger time would be stored ready, not promoted.
        await send_message(rt, request=SendRequest(topic=topic, msg="x", delay_millis=1000, msg_id="m"))
    await asyncio.sleep(1.05)
    for topic in ("c1", "c2", "c3"):
        await promote(rt, topic)
    overviews = await figures.topic_overview(rt, topics=await list_topics(rt))
    assert [(o["topic"], o["ready"], o["lateness_count"], o["totals"]["triggerMsgReady"])
            for o in overviews] == [("c1", 1, 1, 1), ("c2", 1, 1, 1), ("c3", 1, 1, 1)]
    assert all(o["log_backlog"] == 1 for o in overviews)  # due ('sent' is written by the send)
    assert sum(p["count"] for p in overviews[0]["lateness_series"]) == 1
    data = wire.monitor_data(await monitor_data(rt))
    assert set(data) == {"requestStatsList", "pullMsgTimeGapStatsList", "readyQueueTimeGapStatsList"}
    assert await figures.scanner_lags(rt) == {}


async def test_prune_keeps_totals_histogram_and_the_last_hour_of_the_chart(single_rt):
    rt = single_rt
    now = await redis_millis(rt)
    # The script reads the clock again: keep an interval or minute boundary from falling in between.
    to_boundary = min(-now % rt.config.monitor_interval_millis, -now % 60_000)
    if to_boundary < 2000:
        await asyncio.sleep(to_boundary / 1000 + 0.05)
        now = await redis_millis(rt)
    interval, minute = now // rt.config.monitor_interval_millis, now // 60_000
    stats = rt.ns.topic("p").stats
    keep = {f"{interval}:sendMsg": 1, f"{interval - 1}:sendMsg": 2, "total:sendMsg": 9, "lateness:le:5": 3,
            "lateness:count": 3, f"m{minute - 59}:lateness:count": 4, f"m{minute}:lateness:max": 7}
    drop = {f"{interval - 2}:sendMsg": 5, f"m{minute - 61}:lateness:count": 6}
    await rt.redis.hset(stats, mapping={**keep, **drop})
    assert await rt.scripts.call(scripts.prune_stats(rt.context, "p")) == 2
    assert {k: int(v) for k, v in (await rt.redis.hgetall(stats)).items()} == keep
