"""spark/reconcile.py finds each kind of planted disagreement; --fix restores the missing."""
import dataclasses
import json
import time

import pytest
from django.core.management import call_command

from delayqueue.core import messages
from delayqueue.core.constants import Status
from delayqueue.live.keys import Meta, position, topic_keys
from delayqueue.messagelog import sql
from delayqueue.models import Message
from spark import common, pgread, reconcile
from tests.helpers import REDIS_CLUSTER_URL, REDIS_URL, log_database_url

from .helpers import LogBuilder, job_args

# The jobs read and write the log over their own connections: real commits, emptied after each test.
pytestmark = pytest.mark.usefixtures("clean_state")

HOUR = 3_600_000
# A topic name with the characters the Redis key encoding handles: the jobs must reach its keys too.
T3 = "t3 {订单}/*?[x]\\%41"


def build(url: str) -> set:
    """A log that manage.py restore copies into Redis, then one planted disagreement of each kind
    (two on one message). Returns the expected (topic, msg_id, kind) set."""
    now = int(time.time() * 1000)
    log = LogBuilder()
    for topic in ("t1", "t2"):
        for i in range(5):
            log.message(topic, f"{topic}-wait-{i}", now, delay=HOUR)
            log.message(topic, f"{topic}-ready-{i}", now - 1000, status=2)
    log.message("t1", "acked-long-ago", now - HOUR, status=4)  # ended, purged from Redis: agrees
    log.message("t1", "ended-but-live", now - 1000, status=4)
    log.message(T3, "lost", now - 1000, status=2)  # a topic Redis lost entirely
    log.save()
    call_command("restore", stdout=open("/dev/null", "w"))

    client = common.sync_redis(url)
    t1, t2 = topic_keys("default", "t1"), topic_keys("default", "t2")

    def edit(keys, msg_id, **changes):
        m = messages.Message.from_stored(client.hget(keys.msgs, msg_id), msg_id)
        client.hset(keys.msgs, msg_id, dataclasses.replace(m, **changes).to_stored())

    def stored(topic, msg_id, status, trigger_time):
        return messages.Message(topic, msg_id, "", trigger_time, trigger_time, trigger_time + HOUR, 3, 0, status).to_stored()

    client.hdel(t1.msgs, "t1-wait-0")
    client.zrem(t1.waiting, "t1-wait-0")
    client.hset(t2.msgs, "stray", stored("t2", "stray", 1, now))
    client.hset(t1.msgs, "ended-but-live", stored("t1", "ended-but-live", 2, now - 1000))
    edit(t1, "t1-ready-1", status=3)
    edit(t2, "t2-ready-2", retry=4)
    edit(t2, "t2-wait-3", trigger_time=now + HOUR + 5000, retry=1)
    client.delete(*(k for k in vars(topic_keys("default", T3)).values() if k != T3))
    client.close()
    return {("t1", "t1-wait-0", "missing_in_redis"), ("t2", "stray", "missing_in_log"),
            ("t1", "ended-but-live", "ended_in_log"), ("t1", "t1-ready-1", "status"), ("t2", "t2-ready-2", "retry"),
            ("t2", "t2-wait-3", "trigger_time"), ("t2", "t2-wait-3", "retry"), (T3, "lost", "missing_in_redis")}


@pytest.mark.parametrize("url", [REDIS_URL, REDIS_CLUSTER_URL], ids=["single", "cluster"])
def test_reconcile_lists_every_planted_disagreement_and_fix_restores_the_missing(spark, settings, tmp_path, capsys, url):
    settings.REDIS_URL = url
    expected = build(url)
    argv = ("spark.reconcile", "--database-url", log_database_url(), "--redis-url", url, "--partitions", "2")

    counts = reconcile.run(spark, job_args(*argv, "--output", str(tmp_path / "found")))
    listed = {(r["topic"], r["msg_id"], r["kind"]) for f in (tmp_path / "found").glob("part-*.json")
              for r in map(json.loads, f.read_text().splitlines())}
    assert listed == expected
    assert counts == {"missing_in_redis": 2, "missing_in_log": 1, "ended_in_log": 1, "status": 1, "retry": 2,
                      "trigger_time": 1}
    assert "t1/t1-ready-1 status=2/3" in capsys.readouterr().out

    assert reconcile.run(spark, job_args(*argv, "--fix"))["fixed"] == 2
    after = reconcile.run(spark, job_args(*argv))
    assert after == {**counts, "missing_in_redis": 0}
    client = common.sync_redis(url)
    assert client.zscore(topic_keys("default", "t1").waiting, "t1-wait-0") is not None
    assert messages.Message.from_stored(client.hget(topic_keys("default", T3).msgs, "lost"), "lost").status == 2
    client.close()


def test_reconcile_fix_skips_expired_messages_and_lists_the_first_20_then_how_many_more(spark, settings, capsys):
    settings.REDIS_URL = REDIS_URL
    now = int(time.time() * 1000)
    log = LogBuilder()  # Redis has none of them
    for i in range(23):
        log.message("lost", f"lost-{i:02}", now - 1000, status=2)
    for i in range(2):
        log.message("lost", f"expired-{i}", now - 2 * HOUR, ttl=HOUR, status=2)
    log.save()
    capsys.readouterr()

    reconcile.run(spark, job_args("spark.reconcile", "--database-url", log_database_url(), "--redis-url", REDIS_URL,
                                  "--partitions", "3", "--fix"))
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("  missing_in_redis: lost/")]) == 20
    assert "  ... 5 more (--output DIR lists them all)" in out
    assert "reconcile --fix: restored 23, already live 0, skipped (expired) 2" in out
    client = common.sync_redis(REDIS_URL)
    lost = topic_keys("default", "lost")
    assert client.lrange(lost.ready, 0, -1) == [f"lost-{i:02}" for i in reversed(range(23))]  # LPUSH in id order
    assert messages.Message.from_stored(client.hget(lost.msgs, "lost-07"), "lost-07").payload == "body of lost-07"
    client.close()


def test_reconcile_fix_leaves_out_a_missing_message_that_ended_meanwhile(spark, settings):
    """--fix re-reads the rows it restores: one acked between the comparison and the fix stays out."""
    settings.REDIS_URL = REDIS_URL
    now = int(time.time() * 1000)
    log = LogBuilder()  # Redis has none of them
    for i in range(3):
        log.message("gone", f"gone-{i}", now - 1000, status=2)
    log.save()
    args = job_args("spark.reconcile", "--database-url", log_database_url(), "--redis-url", REDIS_URL,
                    "--partitions", "2", "--fix")
    # The comparison's snapshot, as run() takes it (persisted: later steps do not read again).
    logged = pgread.read_messages(spark, args.database_url, ["id", *reconcile.KEY, *reconcile.COMPARED],
                                  where=sql.IN_NAMESPACE, params={"namespace": "default"}, partitions=2).persist()
    found = reconcile.disagreements(logged, reconcile.read_redis(spark, args, ["gone"], 2)).persist()
    assert sorted(r.msg_id for r in found.collect()) == ["gone-0", "gone-1", "gone-2"]

    Message.objects.filter(msg_id="gone-1").update(status=Status.ACKED)  # acked while reconcile ran
    assert reconcile.restore_missing(spark, args, logged, found, 2) == (2, 0, 0)
    client = common.sync_redis(REDIS_URL)
    assert client.lrange(topic_keys("default", "gone").ready, 0, -1) == ["gone-2", "gone-0"]
    client.close()


def test_reconcile_fix_restores_each_topic_in_id_order_across_chunks(spark, settings):
    """Two topics whose ids interleave, in one task, read back 4 ids per query: each topic's
    ready list still comes back in id order."""
    settings.REDIS_URL = REDIS_URL
    now = int(time.time() * 1000)
    log = LogBuilder()  # Redis has none of them
    for i in range(9):
        for topic in ("left", "right"):
            log.message(topic, f"{topic}-{i}", now - 1000, status=2)
    log.save()
    args = job_args("spark.reconcile", "--database-url", log_database_url(), "--redis-url", REDIS_URL,
                    "--partitions", "1", "--fix")
    logged = pgread.read_messages(spark, args.database_url, ["id", *reconcile.KEY, *reconcile.COMPARED],
                                  where=sql.IN_NAMESPACE, params={"namespace": "default"}, partitions=3).persist()
    found = reconcile.disagreements(logged, reconcile.read_redis(spark, args, ["left", "right"], 1)).persist()
    assert reconcile.restore_missing(spark, args, logged, found, 1, chunk_rows=4) == (18, 0, 0)
    client = common.sync_redis(REDIS_URL)
    for topic in ("left", "right"):
        assert client.lrange(topic_keys("default", topic).ready, 0, -1) == [f"{topic}-{i}" for i in reversed(range(9))]
    client.close()


def test_reconcile_leaves_a_waiting_message_after_the_loaders_position_to_the_loader(spark, settings):
    """In the cold tier Redis does not hold a waiting message due after its topic's loaded_to (in
    the message log only, or packed): not missing. One due before it, or in flight, is."""
    settings.REDIS_URL = REDIS_URL
    now = int(time.time() * 1000)
    log = LogBuilder()  # Redis has none of them
    log.message("tier", "before", now, delay=HOUR // 2)
    log.message("tier", "after", now, delay=2 * HOUR)
    log.message("tier", "in-flight", now - 1000, status=3)
    log.message("plain", "waiting", now, delay=2 * HOUR)  # a topic outside the cold tier
    log.save()
    client = common.sync_redis(REDIS_URL)
    client.hset(topic_keys("default", "tier").meta, Meta.LOADED_TO, position(now + HOUR))
    client.close()
    counts = reconcile.run(spark, job_args("spark.reconcile", "--database-url", log_database_url(),
                                           "--redis-url", REDIS_URL, "--partitions", "2"))
    assert counts["missing_in_redis"] == 3  # before, in-flight, and the other topic's


def test_reconcile_leaves_out_the_messages_sent_after_it_read_the_log(spark, settings):
    """A send writes the log, then Redis: one made while the job runs is in Redis but not in the
    log as the job read it, and a msgId sent again after it ended is a live new life in Redis
    against the ended row read. Neither is a disagreement (every busy run listed them)."""
    settings.REDIS_URL = REDIS_URL
    now = int(time.time() * 1000)
    log = LogBuilder()
    log.message("t", "resent", now - HOUR, status=4)
    log.save()
    later = now + 60_000  # produced after the job's read of the log
    client = common.sync_redis(REDIS_URL)
    for msg_id in ("new", "resent"):
        client.hset(topic_keys("default", "t").msgs, msg_id,
                    messages.Message("t", msg_id, "", later, later, later + HOUR, 3, 0, 2).to_stored())
    client.close()
    argv = ("spark.reconcile", "--database-url", log_database_url(), "--redis-url", REDIS_URL, "--partitions", "2")
    assert set(reconcile.run(spark, job_args(*argv)).values()) == {0}
