"""spark/stats.py on a generated log whose counts and percentiles are known."""
import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from delayqueue.core.clock import to_millis
from delayqueue.core.constants import Status
from delayqueue.messagelog.retention import prune_log
from delayqueue.models import TopicHourStats
from delayqueue.services.consume import ack_message, nack_message, pull_messages
from delayqueue.services.dead_letters import purge_dead_letters
from delayqueue.services.messages import delete_message, get_message
from delayqueue.services.send import SendRequest, send_message, send_messages
from spark import stats
from tests.helpers import EVERY_LOG_DATABASE, drain_log, log_database_url

from .helpers import H0, HOUR, LogBuilder, dt, job_args, stats_log

# The jobs read and write the log over their own connections: real commits, emptied after each test.
pytestmark = pytest.mark.usefixtures("clean_state")

ZERO = dict(sent=0, delivered=0, acked=0, nacked=0, timed_out=0, expired=0, exhausted=0, deleted=0)
NO_LATENCY = {f"{name}_p{p}": None for name in ("fire_lateness", "latency") for p in (50, 90, 99)}
EXPECTED = {
    ("orders", H0): dict(sent=100, delivered=95, acked=80, nacked=5, timed_out=10, expired=5, exhausted=10, deleted=5,
                         fire_lateness_p50=50.5, fire_lateness_p90=90.1, fire_lateness_p99=99.01,
                         latency_p50=70_405.0, latency_p90=70_721.0, latency_p99=70_792.1),
    ("orders", H0 - HOUR): {**ZERO, **NO_LATENCY, "sent": 1, "delivered": 1, "acked": 1},
    ("mail", H0 + HOUR): {**ZERO, **NO_LATENCY, "sent": 3,
                          "fire_lateness_p50": 0.0, "fire_lateness_p90": 0.0, "fire_lateness_p99": 0.0},
}


def stored_stats() -> dict:
    fields = [*ZERO, *NO_LATENCY]
    return {(row.topic, to_millis(row.hour)): {f: getattr(row, f) for f in fields}
            for row in TopicHourStats.objects.filter(namespace="default")}


def assert_stats(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, figures in expected.items():
        for name, value in figures.items():
            assert actual[key][name] == (pytest.approx(value) if isinstance(value, float) else value), (key, name)


def test_stats_counts_and_percentiles_per_topic_and_hour(spark):
    stats_log()
    TopicHourStats.objects.create(namespace="default", topic="orders", hour=dt(H0), computed_at=dt(H0),
                                  **{**ZERO, "sent": 999})  # a stale row the job replaces
    written = stats.run(spark, job_args("spark.stats", "--database-url", log_database_url(), "--partitions", "3"))
    assert written == 3
    assert_stats(stored_stats(), EXPECTED)


def test_stats_since_an_hour_reads_and_writes_only_later_hours_and_leaves_the_others_alone(spark):
    stats_log()
    untouched = {**ZERO, **NO_LATENCY, "sent": 999}
    # An hour before --since that the log has, and one the log no longer has.
    kept = [TopicHourStats.objects.create(namespace="default", topic=topic, hour=dt(hour), computed_at=dt(H0), **untouched)
            for topic, hour in (("orders", H0), ("archived", H0 - 24 * HOUR))]
    args = job_args("spark.stats", "--database-url", log_database_url(), "--since", "2026-11-20T11")
    events, messages = stats.read_inputs(spark, args, args.database_url)
    assert sorted(r.msg_id for r in messages.collect()) == ["m1", "m2", "m3"]
    assert sorted(r.msg_id for r in events.collect()) == ["m1", "m2", "m3"]

    stats.run(spark, args)
    assert_stats(stored_stats(), {("mail", H0 + HOUR): EXPECTED[("mail", H0 + HOUR)],
                                  ("orders", H0): untouched, ("archived", H0 - 24 * HOUR): untouched})
    assert [TopicHourStats.objects.get(pk=row.pk).computed_at for row in kept] == [dt(H0), dt(H0)]


@EVERY_LOG_DATABASE
def test_stats_leave_alone_the_hours_whose_history_prune_log_deleted(spark):
    """The log's retention deletes history by age: recomputing an hour it reached would replace the
    figures computed while the history was whole with those of what is left."""
    stats_log()
    args = job_args("spark.stats", "--database-url", log_database_url(), "--all-namespaces")
    stats.run(spark, args)
    # Ended 11 days before the test's clock: the acked and deleted ones go, dead letters stay (14 days).
    assert prune_log(timedelta(days=7))[0] == 85
    later = H0 + 10 * 24 * HOUR
    recent = LogBuilder()
    recent.message("mail", "new", later, status=2)
    recent.event("mail", "new", later, 0, 2, "sent")
    recent.save()

    # The hour after the retention's cutoff, and namespace other's hour (none of its history went).
    assert stats.run(spark, args) == 2
    assert_stats(stored_stats(), {**EXPECTED, ("mail", later): {**ZERO, **NO_LATENCY, "sent": 1,
                                                                  "fire_lateness_p50": 0.0, "fire_lateness_p90": 0.0,
                                                                  "fire_lateness_p99": 0.0}})
    assert TopicHourStats.objects.get(namespace="other").sent == 1


def test_stats_of_every_namespace(spark):
    stats_log()
    stats.run(spark, job_args("spark.stats", "--database-url", log_database_url(), "--all-namespaces"))
    other = TopicHourStats.objects.get(namespace="other")
    assert (other.topic, other.hour, other.sent, other.delivered) == ("orders", dt(H0), 1, 0)
    assert TopicHourStats.objects.filter(namespace="default").count() == 3


@EVERY_LOG_DATABASE
def test_stats_of_every_namespace_reads_and_writes_every_database_of_the_log(spark, monkeypatch):
    """Without --database-url the job finds the log's databases as the service does: a namespace
    routed to the second PostgreSQL (tests/integration/test_log_routing.py) is counted from it, and
    its figures are written there."""
    stats_log()
    routed = LogBuilder("routed")
    for i in range(3):
        routed.message("orders", f"r{i}", H0 + i, status=Status.ACKED)
        routed.event("orders", f"r{i}", H0 + i, 0, 1, "sent")
    routed.save("second")
    monkeypatch.setenv("DATABASE_URL", log_database_url())
    monkeypatch.setenv("DELAYQUEUE_LOG_DATABASES", f"second={log_database_url('second')}")
    monkeypatch.setenv("DELAYQUEUE_NAMESPACE_DATABASES", "routed=second")
    assert stats.run(spark, job_args("spark.stats", "--all-namespaces")) == 5  # 3 + other's 1 + routed's 1
    assert TopicHourStats.objects.filter(namespace="default").count() == 3
    [row] = TopicHourStats.objects.using("second").all()
    assert (row.namespace, row.topic, row.hour, row.sent) == ("routed", "orders", dt(H0), 3)
    assert not TopicHourStats.objects.filter(namespace="routed").exists()  # not in the default database

    # One namespace: its own database.
    TopicHourStats.objects.using("second").all().delete()
    stats.run(spark, job_args("spark.stats", "--namespace", "routed"))
    assert TopicHourStats.objects.using("second").get().sent == 3


def test_fire_lateness_leaves_out_a_message_whose_retry_wait_moved_its_trigger_time(spark):
    """A nack's delay or a retry backoff (consuming -> waiting) moves the log row's triggerTime past
    the message's first ready: first ready - that triggerTime is no lateness (minus the wait). Such a
    life is left out; one that waited out its delay and was promoted late still counts."""
    log = LogBuilder()
    for i, late in enumerate((10, 30), 1):  # sent with a 60 s delay, ready `late` ms after it
        log.message("retried", f"ok{i}", H0, delay=60_000, status=Status.ACKED)
        log.event("retried", f"ok{i}", H0, 0, 1, "sent")
        log.event("retried", f"ok{i}", H0 + 60_000 + late, 1, 2, "due")
    moved = log.message("retried", "backed", H0, status=Status.WAITING, retry=1)
    moved.trigger_time = dt(H0 + 600_000)  # where the nack's delay moved it
    log.event("retried", "backed", H0, 0, 2, "sent")
    log.event("retried", "backed", H0 + 100, 2, 3, "pulled", 1)
    log.event("retried", "backed", H0 + 200, 3, 1, "nacked", 1)
    log.save()
    stats.run(spark, job_args("spark.stats", "--database-url", log_database_url()))
    row = TopicHourStats.objects.get(topic="retried")
    assert (row.fire_lateness_p50, row.fire_lateness_p99) == (pytest.approx(20.0), pytest.approx(29.8))


def test_fire_lateness_leaves_out_a_ready_message_rescheduled(spark):
    """rescheduleMsg of a ready message (to later: ready -> waiting; or "run now": ready -> ready)
    moves the log row's triggerTime past the message's first ready, as a retry wait does: first
    ready - that triggerTime is no lateness (it would be negative). Such a life is left out."""
    log = LogBuilder()
    for i, late in enumerate((10, 30), 1):  # sent with a 60 s delay, ready `late` ms after it
        log.message("moved", f"ok{i}", H0, delay=60_000, status=Status.ACKED)
        log.event("moved", f"ok{i}", H0, 0, 1, "sent")
        log.event("moved", f"ok{i}", H0 + 60_000 + late, 1, 2, "due")
    for msg_id, to_status, trigger in (("later", Status.WAITING, H0 + 600_000), ("now", Status.READY, H0 + 5_000)):
        moved = log.message("moved", msg_id, H0, status=to_status)
        moved.trigger_time = dt(trigger)  # where the reschedule moved it
        log.event("moved", msg_id, H0, 0, Status.READY, "sent")  # sent due at once
        log.event("moved", msg_id, H0 + 5_000, Status.READY, to_status, "rescheduled")
    log.save()
    stats.run(spark, job_args("spark.stats", "--database-url", log_database_url()))
    row = TopicHourStats.objects.get(topic="moved")
    assert (row.fire_lateness_p50, row.fire_lateness_p99) == (pytest.approx(20.0), pytest.approx(29.8))


def test_the_admin_lists_the_stats_the_job_wrote(admin_client):
    TopicHourStats.objects.create(namespace="default", topic="orders", hour=dt(H0), computed_at=dt(H0),
                                  **{**ZERO, "sent": 100, "acked": 80}, fire_lateness_p99=99.01)
    page = admin_client.get("/admin/delayqueue/topichourstats/", {"q": "orders"}).content.decode()
    assert "orders" in page and "99.01" in page and ">100<" in page
    assert admin_client.get("/admin/delayqueue/topichourstats/", {"q": "mail"}).content.decode().count("99.01") == 0
    assert admin_client.get("/admin/delayqueue/topichourstats/add/").status_code == 403


async def test_stats_of_history_the_service_itself_logged(spark, single_rt):
    """The history the Lua scripts and the log writer produce, counted as the job promises."""
    rt = single_rt
    sent = await send_messages(rt, requests=[SendRequest(topic="svc", msg=f"m{i}", delay_millis=0) for i in range(6)])
    await send_message(rt, request=SendRequest(topic="svc", msg="once", delay_millis=0, max_retry=0))
    await send_message(rt, request=SendRequest(topic="svc", msg="pushed", delay_millis=0))
    expiring = await send_message(rt, request=SendRequest(topic="svc", msg="late", delay_millis=10, ttl_millis=30))
    pulled, _ = await pull_messages(rt, topic="svc", batch=8)
    assert len(pulled) == 8
    for m in sent[:4]:
        await ack_message(rt, topic="svc", msg_id=m.msg_id)
    await nack_message(rt, topic="svc", msg_id=sent[4].msg_id)
    await nack_message(rt, topic="svc", msg_id=pulled[6].msg_id)  # no tries left: ended 6
    # A failed push attempt (workers/pusher.py) counts as a nack.
    await nack_message(rt, topic="svc", msg_id=pulled[7].msg_id, delay_millis=60_000, push_failure="HTTP 500")
    assert await delete_message(rt, topic="svc", msg_id=sent[5].msg_id)
    await asyncio.sleep(0.1)
    assert (await get_message(rt, topic="svc", msg_id=expiring.msg_id)).status == Status.EXPIRED
    await drain_log(rt, ["svc"])

    stats.run(spark, job_args("spark.stats", "--database-url", log_database_url()))
    # One hour, or two if the test straddled one.
    rows = await sync_to_async(lambda: list(TopicHourStats.objects.filter(topic="svc")))()
    totals = {name: sum(getattr(r, name) for r in rows) for name in ZERO}
    assert totals == dict(sent=9, delivered=8, acked=4, nacked=2, timed_out=0, expired=1, exhausted=1, deleted=1)
    assert all(r.fire_lateness_p50 is not None and r.fire_lateness_p50 >= 0 for r in rows)
    assert any(r.latency_p99 is not None and r.latency_p99 >= r.latency_p50 >= 0 for r in rows)


async def test_a_purge_of_dead_letters_leaves_the_figures_of_what_they_went_through(spark, single_rt):
    """purgeDeadMsg takes dead letters out of the lists, not out of what happened: the hours computed
    again after it keep their sends, deliveries and deaths (and count the purge as their deletion)."""
    rt = single_rt
    await send_messages(rt, requests=[SendRequest(topic="svc", msg=f"m{i}", delay_millis=0, max_retry=0)
                                      for i in range(3)])
    await send_message(rt, request=SendRequest(topic="svc", msg="kept", delay_millis=0, msg_id="kept"))
    pulled, _ = await pull_messages(rt, topic="svc", batch=4)
    for m in pulled:
        if m.msg_id == "kept":
            await ack_message(rt, topic="svc", msg_id=m.msg_id)
        else:
            await nack_message(rt, topic="svc", msg_id=m.msg_id)  # no tries left: a dead letter
    await drain_log(rt, ["svc"])
    args = job_args("spark.stats", "--database-url", log_database_url())

    async def totals() -> dict:
        stats.run(spark, args)
        rows = await sync_to_async(lambda: list(TopicHourStats.objects.filter(topic="svc")))()
        return {name: sum(getattr(r, name) for r in rows) for name in ZERO}

    before = await totals()
    assert before == {**ZERO, "sent": 4, "delivered": 4, "acked": 1, "exhausted": 3}
    assert await purge_dead_letters(rt, topic="svc") == 3
    assert await totals() == {**before, "deleted": 3}
