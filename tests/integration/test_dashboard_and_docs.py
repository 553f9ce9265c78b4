"""The topic dashboard (staff only), linked from the admin index with the API docs."""
import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from delayqueue.core.constants import LATENESS_BOUNDS_MS
from delayqueue.live import push_counts, scripts
from delayqueue.models import TopicHourStats
from delayqueue.ops import figures
from delayqueue.ops.dashboard import FIGURES_SECONDS
from delayqueue.runtime import run_with_runtime
from delayqueue.services.consume import pull_messages
from delayqueue.services.messages import redis_millis
from delayqueue.services.restore import restore
from delayqueue.stores.rows import create_token
from tests.helpers import promote, send

DASHBOARD = "/admin/dashboard/"

# The dashboard reads the live state and the log's hourly figures.
pytestmark = pytest.mark.usefixtures("clean_state")


def rows(page: str) -> dict[str, str]:
    """topic -> the HTML of its table row."""
    return dict(re.findall(r'<tr class="row-\w+" data-topic="([^"]+)">(.*?)</tr>', page, re.S))


def cells(row: str, name: str) -> list[str]:
    return re.findall(rf'<td class="{name}">(\d+)</td>', row)


def hour_stats(namespace: str, topic: str) -> None:
    """One hour of the Spark job's figures for the topic, this hour."""
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    TopicHourStats.objects.create(
        namespace=namespace, topic=topic, hour=hour, sent=1, delivered=0, acked=0, nacked=0, timed_out=0,
        expired=0, exhausted=0, deleted=0, computed_at=hour)


def test_dashboard_shows_sizes_buckets_and_flags_stuck_topics(admin_client, monkeypatch, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MONITOR_INTERVAL_SECONDS": 1}
    monkeypatch.setattr(figures, "OVERDUE_MILLIS", 0)  # anything due and still waiting is overdue
    send("calm", "c1", 3_600_000 * 2)
    send("stuck-ready", "s1", 0)  # ready, and nobody pulls it for a whole interval
    send("overdue", "o1", 200)  # no scanner runs, so once due it stays waiting
    run_with_runtime(pull_messages, topic="calm")
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


def test_dashboard_shows_pushes_later_than_the_last_bucket_as_late_not_as_none(admin_client):
    """Every 2xx answer of a topic over a minute after its triggerTime: its lateness quantiles are
    past the last bucket's bound, which the page says, not "-" (no pushes)."""
    send("late-pushes", "m1", 600_000)

    async def pushed_late(rt):
        fields = push_counts.pushed_fields("late-pushes", 120_000)
        await rt.scripts.call(scripts.add_counts(rt.context, fields=[(name, 1) for name in fields]))

    run_with_runtime(pushed_late)
    table = admin_client.get(DASHBOARD).content.decode().split('id="pushes"', 1)[1].split("</table>", 1)[0]
    assert 'class="pushed">1<' in table
    [lateness] = re.findall(r'<td class="push-lateness">(.*?)</td>', table)
    assert lateness == f"&gt; {LATENESS_BOUNDS_MS[-1]} / &gt; {LATENESS_BOUNDS_MS[-1]} ms"


def test_dashboard_figures_are_shared_for_a_moment_then_read_again(admin_client):
    send("shared", "s1", 0)
    first = admin_client.get(DASHBOARD).content.decode()
    assert cells(rows(first)["shared"], "ready") == ["1"]
    send("shared", "s2", 0)
    send("later", "l1", 0)
    # Within the window, the same figures: Redis was not read again.
    again = rows(admin_client.get(DASHBOARD).content.decode())
    assert list(again) == ["shared"] and cells(again["shared"], "ready") == ["1"]
    # One topic's page has figures of its own.
    assert cells(rows(admin_client.get(DASHBOARD, {"topic": "later"}).content.decode())["later"], "ready") == ["1"]
    time.sleep(FIGURES_SECONDS + 0.2)
    fresh = rows(admin_client.get(DASHBOARD).content.decode())
    assert sorted(fresh) == ["later", "shared"] and cells(fresh["shared"], "ready") == ["2"]


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
    return await redis_millis(rt) // rt.config.monitor_interval_millis - 1


def test_dashboard_chart_draws_promotions(admin_client):
    send("drawn", "d1", 200)
    time.sleep(0.3)

    run_with_runtime(lambda rt: promote(rt, "drawn"))
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
    response = admin_client.get(DASHBOARD, {"topic": "x" * 256})
    assert response.status_code == 200
    page = response.content.decode()
    assert "topic: must be 1-255 bytes of UTF-8 text without control characters; it is 256 bytes" in page
    assert list(rows(page)) == ["fine"]  # shows every topic instead


def test_dashboard_shows_the_chosen_namespace(admin_client):
    create_token(namespace="other", scopes=["produce"])  # "other" is now served
    send("here", "h1", 0)
    send("there", "t1", 60_000, namespace="other")
    run_with_runtime(lambda rt: rt.redis.set(rt.for_namespace("other").ns.data_lost, 1_795_000_000_000))
    hour_stats("other", "there")
    ours = admin_client.get(DASHBOARD).content.decode()
    assert list(rows(ours)) == ["here"] and "<title>Topic dashboard: namespace default" in ours
    assert '<option value="default" selected>' in ours and '<option value="other">' in ours
    assert 'id="data-lost"' not in ours and 'id="hourly"' not in ours
    page = admin_client.get(DASHBOARD, {"namespace": "other"}).content.decode()
    assert list(rows(page)) == ["there"] and cells(rows(page)["there"], "waiting") == ["1"]
    assert "<title>Topic dashboard: namespace other" in page and '<option value="other" selected>' in page
    assert 'href="?namespace=other&amp;topic=there"' in page  # a topic's link stays in its namespace
    assert 'id="data-lost"' in page and "2026-11-18 11:06:40" in page
    assert re.findall(r'<tr data-topic="([^"]+)">', page[page.index('id="hourly"'):]) == ["there"]
    one = admin_client.get(DASHBOARD, {"namespace": "other", "topic": "there"}).content.decode()
    assert list(rows(one)) == ["there"]


@pytest.mark.parametrize("namespace", ["a:b", "", "x" * 65])
def test_dashboard_bad_namespace_is_refused_with_a_readable_error(admin_client, namespace):
    send("fine", "f1", 0)
    response = admin_client.get(DASHBOARD, {"namespace": namespace})
    assert response.status_code == 200
    page = response.content.decode()
    assert "namespace: must be 1-64 of A-Z a-z 0-9 . _ - (it goes into Redis keys)" in page
    assert list(rows(page)) == ["fine"]  # shows DELAYQUEUE_NAMESPACE's instead


def test_dashboard_shows_a_staff_user_only_what_their_permissions_let_them_see(client):
    """Staff may log in to the admin; what they see there is their model permissions': the topics'
    figures (and dead letters, redrives) with the view permission on topic settings, as the topic
    pages, the Spark job's hourly figures with the one on them."""
    create_token(namespace="other", scopes=["produce"])  # "other" is served
    send("here", "h1", 0)
    send("there", "t1", 60_000, namespace="other")
    hour_stats("default", "here")
    clerk = User.objects.create_user("clerk", password="pw", is_staff=True)
    client.login(username="clerk", password="pw")
    for params in ({}, {"namespace": "other"}, {"topic": "here"}, {"namespace": "other", "topic": "there"}):
        response = client.get(DASHBOARD, params)
        assert response.status_code == 403, params
        assert "data-topic" not in response.content.decode() and "other" not in response.content.decode()
    assert 'href="/admin/dashboard/"' not in client.get("/admin/").content.decode()
    clerk.user_permissions.add(Permission.objects.get(codename="view_topicconfig"))
    page = client.get(DASHBOARD).content.decode()
    assert list(rows(page)) == ["here"] and 'id="hourly"' not in page
    assert list(rows(client.get(DASHBOARD, {"namespace": "other"}).content.decode())) == ["there"]
    assert 'href="/admin/dashboard/"' in client.get("/admin/").content.decode()
    clerk.user_permissions.add(Permission.objects.get(codename="view_topichourstats"))
    page = client.get(DASHBOARD).content.decode()
    assert re.findall(r'<tr data-topic="([^"]+)">', page[page.index('id="hourly"'):]) == ["here"]


def test_admin_index_links_the_dashboard_and_docs(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/dashboard/"' in page and 'href="/api/docs/"' in page and 'href="/metrics"' in page


def test_dashboard_says_when_redis_lost_its_data_until_a_full_restore(admin_client):
    assert 'id="data-lost"' not in admin_client.get(DASHBOARD).content.decode()
    lost_at = 1_795_000_000_000  # 2026-11-18 11:06:40 UTC, in ms as a scanner records it
    run_with_runtime(lambda rt: rt.redis.set(rt.ns.data_lost, lost_at))
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'id="data-lost"' in page and "2026-11-18 11:06:40" in page and "manage.py restore" in page
    run_with_runtime(restore)
    assert 'id="data-lost"' not in admin_client.get(DASHBOARD).content.decode()
