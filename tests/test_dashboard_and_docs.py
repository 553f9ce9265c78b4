"""The topic dashboard (staff only) and the OpenAPI schema with its offline UI."""
import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from delayqueue.api.validation import MAX_DELAY_MILLIS, MIN_COUNT
from delayqueue.messagelog import recovery
from delayqueue import selectors
from delayqueue import services
from delayqueue.models import TopicHourStats
from delayqueue.sync import run_with_runtime
from tests.test_admin import send

DASHBOARD = "/admin/dashboard/"


def rows(page: str) -> dict[str, str]:
    """topic -> the HTML of its table row."""
    return dict(re.findall(r'<tr class="row-\w+" data-topic="([^"]+)">(.*?)</tr>', page, re.S))


def cells(row: str, name: str) -> list[str]:
    return re.findall(rf'<td class="{name}">(\d+)</td>', row)


def test_dashboard_shows_sizes_buckets_and_flags_stuck_topics(admin_client, monkeypatch, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MONITOR_INTERVAL_SECONDS": 1}
    monkeypatch.setattr(selectors, "OVERDUE_MILLIS", 0)  # anything due and still waiting is overdue
    send("calm", "c1", 3_600_000 * 2)
    send("stuck-ready", "s1", 0)  # ready, and nobody pulls it for a whole interval
    send("overdue", "o1", 200)  # no scanner runs, so once due it stays waiting
    run_with_runtime(services.pull_messages, "calm")
    time.sleep(1.1)
    send("fresh", "f1", 0)  # ready just now: consumers are behind, not absent
    page = admin_client.get(DASHBOARD).content.decode()
    table = rows(page)
    assert list(table) == ["overdue", "stuck-ready", "fresh", "calm"]  # stuck first, then busy
    assert "dq-state dq-stuck" in table["overdue"] and "is a scanner running?" in table["overdue"]
    assert "dq-state dq-stuck" in table["stuck-ready"] and "no consumers?" in table["stuck-ready"]
    assert "dq-state dq-busy" in table["fresh"]
    assert "dq-state dq-ok" in table["calm"]
    assert cells(table["calm"], "waiting") == ["1"] and cells(table["calm"], "ready") == ["0"]
    assert cells(table["calm"], "bucket") == ["0", "0", "0", "0", "1", "0", "0", "0", "0"]
    assert cells(table["stuck-ready"], "ready") == ["1"]
    assert cells(table["stuck-ready"], "backlog") == ["0"]  # the send wrote its own 'sent' row
    assert '<span class="dq-stuck" id="stuck-count">2 stuck</span>' in page
    assert '<span class="dq-busy" id="busy-count">1 busy</span>' in page
    assert 'id="lateness-chart"' in page


def test_dashboard_busy_topic(admin_client, settings):
    # An hour-long interval: with the suite's 2 s one, the interval could end between writing
    # the previous interval's figure and reading the page, which then looks one further back.
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MONITOR_INTERVAL_SECONDS": 3600}
    for i in range(3):
        send("busy", f"b{i}", 0)
    # One message pulled in the last complete interval, three ready: the backlog outgrows it.
    stats_key = run_with_runtime(lambda rt: _stats_key(rt, "busy"))
    previous = run_with_runtime(_previous_interval)
    run_with_runtime(lambda rt: rt.redis.hset(stats_key, f"{previous}:pullMsg", 1))
    page = admin_client.get(DASHBOARD).content.decode()
    assert "dq-state dq-busy" in rows(page)["busy"] and "ready backlog 3 &gt; 1 pulled" in page


async def _stats_key(rt, topic):
    return rt.ns.topic(topic).stats


async def _previous_interval(rt):
    return await selectors.redis_millis(rt) // rt.config.monitor_interval_millis - 1


def test_dashboard_chart_draws_promotions(admin_client):
    send("drawn", "d1", 200)
    time.sleep(0.3)

    async def promote(rt):
        k = rt.ns.topic("drawn")
        await rt.call("promote_due", [k.waiting, k.ready, k.msgs, k.expiry, k.ended, k.stats, k.events],
                      [100, 1000, rt.config.monitor_interval_millis, rt.ns.ready_channel, "drawn", rt.actor])

    run_with_runtime(promote)
    page = admin_client.get(DASHBOARD, {"topic": "drawn"}).content.decode()
    chart = page[page.index('id="lateness-chart"'):page.index("</svg>", page.index('id="lateness-chart"'))]
    assert "1 promoted" in page
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="3"', chart)  # one minute with data: a dot


def test_dashboard_shows_the_spark_hourly_figures_when_present(admin_client):
    assert 'id="hourly"' not in admin_client.get(DASHBOARD).content.decode()  # the job has not run
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for topic, hour, sent in (("h1", now, 7), ("h1", now - timedelta(hours=30), 99), ("h2", now, 3)):
        TopicHourStats.objects.create(
            namespace="default", topic=topic, hour=hour, sent=sent, delivered=5, acked=4, nacked=1, timed_out=0,
            expired=0, exhausted=0, deleted=0, fire_lateness_p50=1.4, fire_lateness_p90=2, fire_lateness_p99=9.6,
            latency_p50=120, latency_p90=300, latency_p99=None, computed_at=now)
    page = admin_client.get(DASHBOARD).content.decode()
    table = page[page.index('id="hourly"'):page.index("</table>", page.index('id="hourly"'))]
    hourly = re.findall(r'<tr data-topic="([^"]+)">(.*?)</tr>', table, re.S)
    assert [topic for topic, _ in hourly] == ["h1", "h2"]  # the 30-hour-old row is outside the last day
    assert "<td>7</td>" in hourly[0][1] and "1 / 2 / 10" in hourly[0][1] and "120 / 300 / –" in hourly[0][1]
    one = admin_client.get(DASHBOARD, {"topic": "h2"}).content.decode()
    assert re.findall(r'<tr data-topic="([^"]+)">', one[one.index('id="hourly"'):]) == ["h2"]


@pytest.mark.parametrize("topic", ["never-used", "a.b:c-d_e"])
def test_dashboard_unknown_topic_gives_zeros(admin_client, topic):
    page = admin_client.get(DASHBOARD, {"topic": topic}).content.decode()
    row = rows(page)[topic]
    assert cells(row, "waiting") == ["0"] and cells(row, "ready") == ["0"] and cells(row, "inflight") == ["0"]
    assert cells(row, "bucket") == ["0"] * 9 and "nothing promoted" in row


def test_dashboard_bad_topic_is_refused_with_the_api_message(admin_client):
    send("fine", "f1", 0)
    response = admin_client.get(DASHBOARD, {"topic": "no spaces allowed"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "topic: must be 1-128 characters of A-Z a-z 0-9 . _ : -" in page
    assert list(rows(page)) == ["fine"]  # shows every topic instead


def test_admin_index_links_the_dashboard_and_docs(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/dashboard/"' in page and 'href="/api/docs/"' in page and 'href="/metrics"' in page


API_ENDPOINTS = ["sendMsg", "sendMsgBatch", "pullMsg", "longPollingMsg", "ackMsg", "getMsg", "deleteMsg",
                 "getMonitorData", "getTopicInfo", "getTopicInfoList", "restore", "restoreMsg"]


def test_openapi_schema_lists_every_endpoint_and_parameter(client):
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    expected = {f"/camellia/delayQueue/{name}" for name in API_ENDPOINTS}
    expected |= {f"/camellia/health/{name}" for name in ("status", "check", "online", "offline")}
    assert expected <= set(paths)
    # One operation per endpoint (GET and POST both work; the description says so).
    assert {path: len(operations) for path, operations in paths.items()} == {path: 1 for path in paths}
    assert set(paths["/camellia/delayQueue/sendMsg"]) == {"post"}
    assert set(paths["/camellia/delayQueue/getTopicInfo"]) == {"get"}
    for path, operations in paths.items():
        [operation] = operations.values()
        assert operation["summary"] and len(operation["description"]) > 40, path
    assert "query string" in paths["/camellia/delayQueue/sendMsg"]["post"]["description"]

    components = schema["components"]["schemas"]

    def resolve(ref):
        return components[ref.rsplit("/", 1)[1]]

    def form_fields(path):
        return resolve(paths[path]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]["$ref"])

    send_form = form_fields("/camellia/delayQueue/sendMsg")
    assert {"topic", "msgId", "msg", "delayMillis", "ttlMillis", "maxRetry"} == set(send_form["properties"])
    assert {"topic", "msg", "delayMillis"} == set(send_form["required"])
    assert {"topic", "batch", "ackTimeoutMillis", "longPollingTimeoutMillis"} == set(
        form_fields("/camellia/delayQueue/longPollingMsg")["properties"])
    query = {p["name"] for p in paths["/camellia/delayQueue/getTopicInfo"]["get"]["parameters"]}
    assert query == {"topic"}
    assert set(form_fields("/camellia/delayQueue/ackMsg")["properties"]) == {"topic", "msgId", "ack"}
    answer = paths["/camellia/delayQueue/getTopicInfo"]["get"]["responses"]["200"]["content"]["application/json"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in resolve(answer["schema"]["$ref"])["oneOf"]] == [
        "TopicInfoResult", "Error"]
    assert set(paths["/camellia/health/status"]["get"]["responses"]) == {"200", "500"}


def test_openapi_schema_states_the_limits_validation_enforces(client, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_BATCH_SEND": 7, "MAX_PULL_BATCH": 9, "MAX_MSG_BYTES": 99}
    schema = client.get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    # An error answer is code 4xx/5xx and msg, nothing else.
    assert components["Error"]["required"] == ["code", "msg"] and set(components["Error"]["properties"]) == {
        "code", "msg"}
    assert components["Error"]["additionalProperties"] is False
    assert components["SendMsgBatchItemAnswer"]["oneOf"][1]["$ref"].endswith("/Error")
    batch = schema["paths"]["/camellia/delayQueue/sendMsgBatch"]["post"]["requestBody"]["content"]
    assert set(batch) == {"application/json"}
    assert (batch["application/json"]["schema"]["minItems"], batch["application/json"]["schema"]["maxItems"]) == (1, 7)
    send = components["SendMsgRequest"]["properties"]
    assert send["msg"]["minLength"] == 1 and send["msg"]["maxLength"] == 99
    assert "minLength" not in send["msgId"] and send["msgId"]["maxLength"] == 256  # empty: generate one
    msg_id = components["MessageRefRequest"]["properties"]["msgId"]
    assert msg_id["minLength"] == 1 and not re.search(msg_id["pattern"], " \t\u3000")  # blank once trimmed: 400
    assert send["msg"]["not"] == {"pattern": "\\x00"}  # DRF refuses NUL characters
    assert send["topic"]["maxLength"] == 128 and send["topic"]["pattern"]
    assert (send["delayMillis"]["minimum"], send["delayMillis"]["maximum"]) == (-MAX_DELAY_MILLIS, MAX_DELAY_MILLIS)
    assert "ms" in send["delayMillis"]["description"] and "bytes" in send["msg"]["description"]
    pull = components["PullMsgRequest"]["properties"]["batch"]
    assert pull["maximum"] == 9 and pull["minimum"] == MIN_COUNT


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_api_docs_work_offline(client, page):
    html = client.get(page).content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert assets and not [a for a in assets if not a.startswith("/static/")], assets
    assert "cdn" not in html.lower()
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert b"".join(response.streaming_content if response.streaming else [response.content])


def test_dashboard_says_when_redis_lost_its_data_until_a_full_restore(admin_client):
    assert 'id="data-lost"' not in admin_client.get(DASHBOARD).content.decode()
    lost_at = 1_795_000_000_000  # 2026-11-18 11:06:40 UTC, in ms as a scanner records it
    run_with_runtime(lambda rt: rt.redis.set(rt.ns.data_lost, lost_at))
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'id="data-lost"' in page and "2026-11-18 11:06:40" in page and "manage.py restore" in page
    run_with_runtime(recovery.restore)
    assert 'id="data-lost"' not in admin_client.get(DASHBOARD).content.decode()
