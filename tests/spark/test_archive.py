"""spark/archive.py: old ended messages and their history move to Parquet, exactly once."""
import json
import time
from datetime import timedelta

import pytest

from delayqueue.messagelog.retention import prune_log
from delayqueue.models import HistoryPruned, Message, MessageEvent, TopicConfig
from spark import archive
from tests.helpers import EVERY_LOG_DATABASE, log_database_url

from .helpers import LogBuilder, job_args, ms

# The jobs read and write the log over their own connections: real commits, emptied after each test.
pytestmark = pytest.mark.usefixtures("clean_state")

DAY = 86_400_000


def archive_args(root, *, older_than_days: int):
    """The archive's options over the test log, writing under `root`."""
    return job_args("spark.archive", "--database-url", log_database_url(), "--to", str(root),
                    "--older-than-days", str(older_than_days))


def build_log() -> tuple[set, set]:
    """12 messages that ended on 2026-09-01 or -02 in two topics, two events each (archived);
    an old live message, a recently ended one, an old one in another namespace, and an event
    newer than its message's end (a later lifecycle being logged): all stay."""
    log = LogBuilder()
    archived_messages, archived_events = set(), set()
    for day, date in enumerate(("2026-09-01", "2026-09-02")):
        for topic in ("orders", "mail"):
            for k in range(3):
                msg_id, produce = f"{topic}-{day}-{k}", ms(f"{date}T08:00:00") + k * 1000
                status = 4 + (day * 3 + k) % 4
                log.message(topic, msg_id, produce, status=status, updated=produce + 5000)
                archived_messages.add((topic, msg_id))
                for at, frm, to, reason in ((produce, 0, 2, "sent"), (produce + 5000, 2, status, "ended")):
                    archived_events.add(log.event(topic, msg_id, at, frm, to, reason).event_id)
    log.event("orders", "orders-0-0", ms("2026-09-05T00:00:00"), 0, 1, "sent")
    log.message("orders", "old-live", ms("2026-09-01T09:00:00"), status=1)
    log.event("orders", "old-live", ms("2026-09-01T09:00:00"), 0, 1, "sent")
    recent = int(time.time() * 1000) - DAY
    log.message("orders", "recent", recent - 5000, status=4, updated=recent)
    log.event("orders", "recent", recent, 3, 4, "acked")
    log.message("orders", "elsewhere", ms("2026-09-01T08:00:00"), status=4, namespace="other")
    log.event("orders", "elsewhere", ms("2026-09-01T08:00:00"), 0, 2, "sent", namespace="other")
    log.save()
    return archived_messages, archived_events


def assert_archived_once(spark, root, messages: set, events: set) -> None:
    stored = spark.read.parquet(str(root / "messages")).select("topic", "msg_id", "date").collect()
    assert sorted((r.topic, r.msg_id) for r in stored) == sorted(messages)  # each exactly once
    assert {(r.msg_id.split("-")[1], r.date) for r in stored} == {("0", "2026-09-01"), ("1", "2026-09-02")}
    stored_events = [r.event_id for r in spark.read.parquet(str(root / "events")).select("event_id").collect()]
    assert sorted(stored_events) == sorted(events)
    assert not list((root / "_staging").glob("*"))


def assert_log_keeps_only_the_rest(events: set) -> None:
    assert sorted(Message.objects.values_list("namespace", "msg_id")) == [
        ("default", "old-live"), ("default", "recent"), ("other", "elsewhere")]
    left = set(MessageEvent.objects.values_list("event_id", flat=True))
    assert not left & events
    assert len(left) == 4


def test_archive_moves_ended_messages_and_history_to_parquet_by_date_and_topic(spark, tmp_path):
    messages, events = build_log()
    args = archive_args(tmp_path, older_than_days=30)
    result = archive.run(spark, args)
    assert (result["messages"], result["events"]) == (12, 24)
    assert_archived_once(spark, tmp_path, messages, events)
    assert_log_keeps_only_the_rest(events)
    assert sorted(p.name for p in (tmp_path / "messages" / "date=2026-09-01").iterdir()) == ["topic=mail", "topic=orders"]
    # The history it deleted is recorded, for the stats job (spark/stats.py) to leave those hours alone.
    [manifest] = (tmp_path / "_batches").glob("*.json")
    [pruned] = HistoryPruned.objects.all()
    assert pruned.namespace == "default"
    assert pruned.before.isoformat() == json.loads(manifest.read_text())["ended_before"]

    assert archive.run(spark, args)["messages"] == 0  # nothing left: the archive is unchanged
    assert_archived_once(spark, tmp_path, messages, events)


@pytest.mark.parametrize("crash_at", ["staged", "moving", "committed"])
def test_archive_rerun_after_a_crash_neither_loses_nor_duplicates(spark, tmp_path, monkeypatch, crash_at):
    messages, events = build_log()
    args = archive_args(tmp_path, older_than_days=30)
    monkeypatch.setenv(archive.CRASH_ENV, crash_at)
    with pytest.raises(archive.SimulatedCrash):
        archive.run(spark, args)
    assert Message.objects.count() == 15  # nothing deleted before the crash
    assert MessageEvent.objects.count() == 24 + 4

    monkeypatch.delenv(archive.CRASH_ENV)
    archive.run(spark, args)
    assert_archived_once(spark, tmp_path, messages, events)
    assert_log_keeps_only_the_rest(events)
    assert len(list((tmp_path / "_batches").glob("*.json"))) == 1


def test_archive_keeps_a_row_that_changed_after_it_was_archived(spark, tmp_path, monkeypatch):
    """A msgId sent again after its batch was committed (the row is live again) keeps its row;
    the archive holds the ended life that was archived."""
    messages, events = build_log()
    args = archive_args(tmp_path, older_than_days=30)
    monkeypatch.setenv(archive.CRASH_ENV, "committed")
    with pytest.raises(archive.SimulatedCrash):
        archive.run(spark, args)
    monkeypatch.delenv(archive.CRASH_ENV)
    Message.objects.filter(msg_id="orders-0-0").update(status=1, updated_at=Message.objects.get(msg_id="recent").updated_at)

    archive.run(spark, args)
    assert_archived_once(spark, tmp_path, messages, events)
    assert Message.objects.get(msg_id="orders-0-0").status == 1
    assert Message.objects.count() == 4


def test_archive_keeps_every_column_of_the_rows_it_deletes(spark, tmp_path):
    """The rows leave PostgreSQL: the archive holds all their columns, a nack's reason (detail) included."""
    log = LogBuilder()
    produce = ms("2026-09-01T08:00:00")
    log.message("orders", "nacked", produce, status=6, retry=1, updated=produce + 5000)
    log.event("orders", "nacked", produce, 0, 2, "sent")
    log.event("orders", "nacked", produce + 5000, 3, 6, "nacked", retry=1).detail = "bad invoice"
    log.save()
    args = archive_args(tmp_path, older_than_days=30)
    assert archive.run(spark, args)["events"] == 2
    for kind, model in (("messages", Message), ("events", MessageEvent)):
        stored = spark.read.parquet(str(tmp_path / kind)).columns
        assert {f.column for f in model._meta.concrete_fields} <= set(stored), kind
    details = spark.read.parquet(str(tmp_path / "events")).select("reason", "detail").collect()
    assert sorted((r.reason, r.detail) for r in details) == [("nacked", "bad invoice"), ("sent", "")]


def test_archive_leaves_dead_letters_to_their_own_retention(spark, tmp_path):
    """Ended 10 days ago, archived at 5 days: the acked message goes, a dead letter stays in the
    log (listed, redrivable) until DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS (14), as prune_log keeps it;
    one of a topic that no longer keeps dead letters goes as any ended message."""
    log = LogBuilder()
    ended = int(time.time() * 1000) - 10 * DAY
    for topic, msg_id, status in (("orders", "acked", 4), ("orders", "dead", 6), ("orders", "expired", 5),
                                  ("mail", "not-kept", 6)):
        log.message(topic, msg_id, ended - 5000, status=status, updated=ended)
        log.event(topic, msg_id, ended - 5000, 0, 2, "sent")
    log.save()
    TopicConfig.objects.create(namespace="default", topic="mail", dead_letter=False)
    args = archive_args(tmp_path, older_than_days=5)
    assert (archive.run(spark, args)["messages"], MessageEvent.objects.count()) == (2, 2)
    assert sorted(Message.objects.values_list("msg_id", flat=True)) == ["dead", "expired"]
    stored = spark.read.parquet(str(tmp_path / "messages")).select("msg_id").collect()
    assert sorted(r.msg_id for r in stored) == ["acked", "not-kept"]


def test_archive_takes_the_whole_history_of_a_message_that_ended_before_its_sending_hosts_clock(spark, tmp_path):
    """The send writes the row and its 'sent' event at produceTime, by the web host's clock; Redis'
    clock, which times the end, may be behind it (UPDATE_MESSAGES lets a row its send wrote take
    any event). Such a message's 'sent' event was left out of the archive, and, its row gone, in
    PostgreSQL for good."""
    log = LogBuilder()
    produce = ms("2026-09-01T08:00:00")
    log.message("orders", "quick", produce, status=7, updated=produce - 40)
    log.event("orders", "quick", produce, 0, 2, "sent")
    log.event("orders", "quick", produce - 40, 2, 7, "deleted")
    log.save()
    args = archive_args(tmp_path, older_than_days=30)
    assert archive.run(spark, args)["events"] == 2
    assert not MessageEvent.objects.exists()


@EVERY_LOG_DATABASE
@pytest.mark.parametrize("dead_letter_days, archived", [(14, ["acked", "dead"]), (3, ["acked", "expired"])])
def test_prune_log_leaves_every_dead_letter_for_the_archive_to_reach_first(spark, tmp_path, monkeypatch,
                                                                          dead_letter_days, archived):
    """Archived at 5 days, pruned at 7 (the log's retention). A dead letter past its own retention
    waits for the archive as an ended message between 5 and 7 days does: prune_log used to delete it
    at that retention, in a race with the archive's next run, and before the archive could take it
    when that retention was below --older-than-days."""
    monkeypatch.setenv("DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS", str(dead_letter_days))  # the archive's
    log = LogBuilder()
    now = int(time.time() * 1000)
    for msg_id, status, days in (("acked", 4, 6), ("dead", 6, dead_letter_days + 0.5), ("expired", 5, 6)):
        ended = now - int(days * DAY)
        log.message("orders", msg_id, ended - 5000, status=status, updated=ended)
        log.event("orders", msg_id, ended - 5000, 0, 2, "sent")
    log.save()
    assert prune_log(timedelta(days=7), dead_older_than=timedelta(days=dead_letter_days)) == (0, 0)

    args = archive_args(tmp_path, older_than_days=5)
    assert archive.run(spark, args)["messages"] == 2
    stored = spark.read.parquet(str(tmp_path / "messages")).select("msg_id").collect()
    assert sorted(r.msg_id for r in stored) == archived
