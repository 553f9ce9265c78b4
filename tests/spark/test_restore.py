"""spark/restore.py gives the same Redis as `manage.py restore` on the same log."""
import io
import time

import psycopg
import pytest
from django.core.management import CommandError, call_command

from delayqueue.config.redis_urls import is_cluster_url
from delayqueue.core.messages import Message
from delayqueue.live.keys import namespace_keys, topic_keys
from delayqueue.messagelog import sql
from delayqueue.models import TopicConfig
from delayqueue.stores.topic_settings import MIRROR_FIELDS
from delayqueue.workers.log_writer import Event
from spark import common, restore
from tests.helpers import REDIS_CLUSTER_URL, REDIS_URL, log_database_url

from .helpers import LogBuilder, job_args

# The jobs read and write the log over their own connections: real commits, emptied after each test.
pytestmark = pytest.mark.usefixtures("clean_state")

HOUR = 3_600_000
# A topic name with the characters the Redis key encoding handles: the jobs must reach its keys too.
B = "b {订单}/*?[x]\\%41"
HELD = Message("a", "a-held", "already here", 0, 0, 0, 0, 0, 2).to_stored()


def build_log() -> None:
    """Topic a: one message in each live state, one live in the log but past its TTL, one Redis
    already holds, and one per ended state. Topic B: 30 due and 10 waiting, ids interleaved.
    Another namespace's live message, which stays out. Settings of a (paused), of B and of the
    other namespace's a. Every waiting message falls due well inside the hot window (1 h): one
    due just past it would be restored or left cold by how fast the test runs."""
    now = int(time.time() * 1000)
    log = LogBuilder()
    log.message("a", "a-wait", now - 1000, delay=HOUR)
    log.message("a", "a-due", now - 60_000, delay=1000)
    log.message("a", "a-ready", now - 60_000, status=2)
    log.message("a", "a-consuming", now - 60_000, status=3, retry=2, max_retry=5)
    log.message("a", "a-expired", now - 2 * HOUR, ttl=HOUR)
    log.message("a", "a-held", now - 60_000, status=2)
    for status, name in ((4, "acked"), (5, "undelivered"), (6, "exhausted"), (7, "deleted")):
        log.message("a", f"a-{name}", now - 60_000, status=status)
    for i in range(40):
        waiting = i % 4 == 3
        log.message(B, f"b-{i:02}", now - HOUR + i, delay=HOUR + HOUR // 2 if waiting else 0, ttl=3 * HOUR,
                    status=1 if waiting else 2)
    log.message("a", "a-elsewhere", now - 60_000, status=2, namespace="other")
    log.save()
    TopicConfig.objects.create(namespace="default", topic="a", paused=True, retry_backoff_millis=250,
                               dead_letter=False)
    TopicConfig.objects.create(namespace="default", topic=B, retry_backoff_max_millis=9_000)
    TopicConfig.objects.create(namespace="other", topic="a", paused=True)


def reset(url: str) -> None:
    """Redis lost everything except one message, which it still holds."""
    client = common.sync_redis(url)
    if is_cluster_url(url):
        client.flushall(target_nodes=client.PRIMARIES)
    else:
        client.flushall()
    client.hset(topic_keys("default", "a").msgs, "a-held", HELD)
    client.close()


def snapshot(url: str) -> dict:
    """Every structure a restore writes, except times that are 'now' (topic registration)."""
    client = common.sync_redis(url)
    state = {"topics": sorted(client.zrange(namespace_keys("default").topics, 0, -1))}
    for topic in ("a", B):
        k = topic_keys("default", topic)
        state[topic] = {
            "msgs": {i: Message.from_stored(m, i) for i, m in client.hgetall(k.msgs).items()},
            "waiting": client.zrange(k.waiting, 0, -1, withscores=True),
            "ready": client.lrange(k.ready, 0, -1),
            "expiry": client.zrange(k.expiry, 0, -1, withscores=True),
            "restored_events": sorted(event.msg_id for entry_id, fields in client.xrange(k.events)
                                      for event in Event.parse(topic, entry_id, fields)),
            "settings": {field: value for field, value in client.hgetall(k.meta).items() if field in MIRROR_FIELDS},
        }
    other = topic_keys("other", "a")
    state["other"] = client.exists(other.msgs) + client.exists(other.meta)
    client.close()
    return state


def manage_restore(*options: str) -> str:
    out = io.StringIO()
    call_command("restore", *options, stdout=out)
    return out.getvalue().strip()


def spark_restore(spark, url: str, *options: str, capsys) -> str:
    capsys.readouterr()
    restore.run(spark, job_args("spark.restore", "--database-url", log_database_url(), "--redis-url", url,
                                "--partitions", "3", *options))
    return capsys.readouterr().out.strip()


@pytest.mark.parametrize("url", [REDIS_URL, REDIS_CLUSTER_URL], ids=["single", "cluster"])
def test_spark_restore_gives_the_same_redis_as_manage_py_restore(spark, settings, capsys, url):
    settings.REDIS_URL = url
    build_log()
    reset(url)
    by_command = manage_restore()
    expected = snapshot(url)
    reset(url)
    client, lost = common.sync_redis(url), namespace_keys("default").data_lost
    client.set(lost, 1)  # a scanner's report that Redis lost its data
    by_spark = spark_restore(spark, url, capsys=capsys)
    assert by_spark == by_command == "restored 44, already live 1, skipped (ended or expired) 5"
    assert snapshot(url) == expected
    assert not client.exists(lost)  # answered by the full restore, as manage.py restore does
    client.close()
    a = expected["a"]
    assert a["msgs"]["a-held"].payload == "already here" and a["msgs"]["a-consuming"].retry == 2
    assert [i for i, _ in a["waiting"]] == ["a-wait"] and sorted(a["ready"]) == ["a-consuming", "a-due", "a-ready"]
    assert expected[B]["ready"] == [f"b-{i:02}" for i in reversed(range(40)) if i % 4 != 3]  # LPUSH in id order
    assert expected["other"] == 0
    # The topics' settings are back in their Redis mirrors, the pause the pull script reads included.
    assert a["settings"] == {"retry_backoff": "250", "retry_backoff_max": "3600000", "dead_letter": "0", "paused": "1",
                              "push": "0", "push_url": "", "push_secret_id": ""}
    assert expected[B]["settings"] == {"retry_backoff": "0", "retry_backoff_max": "9000", "dead_letter": "1",
                                       "paused": "0", "push": "0", "push_url": "", "push_secret_id": ""}

    again = spark_restore(spark, url, capsys=capsys)  # idempotent
    assert again == "restored 0, already live 45, skipped (ended or expired) 5"
    assert snapshot(url)[B] == expected[B]


@pytest.mark.parametrize("options", [("--topic", B, "--dry-run"), ("--include-expired",),
                                     ("--topic", "a", "--msg-id", "a-wait")])
def test_spark_restore_options_count_as_manage_py_restore(spark, capsys, options):
    build_log()
    reset(REDIS_URL)
    by_command = manage_restore(*options)
    command_state = snapshot(REDIS_URL)
    reset(REDIS_URL)
    assert spark_restore(spark, REDIS_URL, *options, capsys=capsys) == by_command
    spark_state = snapshot(REDIS_URL)
    if "--include-expired" in options:  # a fresh TTL counts from 'now', which differs
        for state in (command_state, spark_state):
            for msg_id in ("a-expired", "a-undelivered"):
                state["a"]["msgs"][msg_id].expire_time = None
            state["a"]["expiry"] = [i for i, _ in state["a"]["expiry"]]
    assert spark_state == command_state


def test_spark_restore_and_reconcile_find_a_sharded_topics_messages_in_their_shards(spark, settings, capsys):
    """Each message back into its shard of the topic's count, and reconcile reads every shard."""
    from delayqueue.live.shards import shard_of
    from spark import reconcile

    url = settings.REDIS_URL = REDIS_CLUSTER_URL
    now = int(time.time() * 1000)
    log = LogBuilder()
    for i in range(30):
        log.message("s", f"s-{i:02}", now - 60_000, status=2 if i % 2 else 1, delay=0 if i % 2 else HOUR)
    log.save()
    TopicConfig.objects.create(namespace="default", topic="s", shards=3)
    reset(url)
    assert spark_restore(spark, url, capsys=capsys) == "restored 30, already live 0, skipped (ended or expired) 0"
    client = common.sync_redis(url)
    shards = {index: client.hkeys(topic_keys("default", "s", 3, index).msgs) for index in range(3)}
    assert all(shards.values()) and sum(len(ids) for ids in shards.values()) == 30
    assert all(shard_of("s", msg_id, 3).index == index for index, ids in shards.items() for msg_id in ids)
    assert not client.exists(topic_keys("default", "s").msgs)
    client.close()
    argv = ("spark.reconcile", "--database-url", log_database_url(), "--redis-url", url, "--partitions", "2")
    assert set(reconcile.run(spark, job_args(*argv)).values()) == {0}  # every message found where it is


def test_spark_restore_leaves_the_messages_beyond_the_hot_window_to_the_loader_as_manage_py_restore(spark, capsys):
    """The cold tier: a waiting message due after the hot window (1 h) stays in the log only, counted
    cold, its topic registered for the loader; the Spark restore brought every one into Redis."""
    now = int(time.time() * 1000)
    log = LogBuilder()
    log.message("c", "c-soon", now - 1000, delay=HOUR // 2)
    log.message("c", "c-later", now - 1000, delay=3 * HOUR)
    log.message("d", "d-later", now - 1000, delay=5 * HOUR)  # a topic whose every message stays cold
    log.save()

    def cold_state() -> dict:
        client = common.sync_redis(REDIS_URL)
        state = {"topics": sorted(client.zrange(namespace_keys("default").topics, 0, -1))}
        for topic in ("c", "d"):
            k = topic_keys("default", topic)
            state[topic] = (sorted(client.hkeys(k.msgs)), client.hget(k.meta, "cold"), client.hgetall(k.cold_hours))
        client.close()
        return state

    reset(REDIS_URL)
    by_command = manage_restore()
    expected = cold_state()
    reset(REDIS_URL)
    by_spark = spark_restore(spark, REDIS_URL, capsys=capsys)
    assert by_spark == by_command == ("restored 1, already live 0, skipped (ended or expired) 0, "
                                      "left cold (in the message log, for the loader) 2")
    assert cold_state() == expected
    assert expected["c"][:2] == (["c-soon"], "1") and expected["d"][:2] == ([], "1") and "d" in expected["topics"]


@pytest.mark.parametrize("options", [("--topic", "no such"), ("--topic", "a", "--msg-id", "b-00")])
def test_spark_restore_of_what_the_log_lacks_fails_as_manage_py_restore(spark, capsys, options):
    """A mistyped topic or msgId must not read as success ("restored 0")."""
    build_log()
    with pytest.raises(CommandError) as by_command:
        manage_restore(*options)
    with pytest.raises(common.JobError) as by_spark:
        spark_restore(spark, REDIS_URL, *options, capsys=capsys)
    assert str(by_spark.value) == str(by_command.value)
    assert str(by_spark.value).startswith("no message in the message log matches --topic ")


def test_spark_restore_waits_its_turn_as_manage_py_restore(spark, capsys):
    """One restore of a namespace at a time, whichever runs it: two at once would each restore what
    the other's pages had not reached, and clear the loss report while the other still writes."""
    build_log()
    with psycopg.connect(log_database_url(), autocommit=True) as other:
        assert other.execute(sql.RESTORE_LOCK, ["default"]).fetchone()[0]  # a restore of the namespace runs
        with pytest.raises(CommandError) as by_command:
            manage_restore()
        with pytest.raises(common.JobError) as by_spark:
            spark_restore(spark, REDIS_URL, capsys=capsys)
    assert str(by_spark.value) == "a restore of namespace default is running: one restore per namespace at a time"
    assert str(by_command.value).startswith(str(by_spark.value))  # and when to try again
    reset(REDIS_URL)
    assert spark_restore(spark, REDIS_URL, capsys=capsys).startswith("restored ")  # its turn came
