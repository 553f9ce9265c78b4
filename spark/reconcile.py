"""Lists every message whose state in Redis and in the message log disagree; --fix restores
the ones the log has live and Redis has lost.

Kinds of disagreement, one line per message and kind:
  missing_in_redis  live (1-3) in the log, not in Redis
  missing_in_log    in Redis, not in the log
  ended_in_log      live in Redis, ended (4-7) in the log
  status            in both, different status (otherwise)
  retry             in both, different retry count
  trigger_time      in both, different triggerTime
An ended message that Redis no longer holds agrees (Redis purges ended messages after the
retention window), and so does a waiting one after its topic's loader position (the least
loaded_to of its shards) that Redis does not hold: in the cold tier the loader brings it in
(it is in the message log only, or read ahead into a packed list, which this does not read).
A message Redis holds from a send made after the job read the log (by its produceTime: the
sending host's clock against the driver's) is left out, whichever side.
The log's status and retry follow Redis through the log writer, a fraction of a second behind:
on a busy queue, messages in motion can show up as status or retry disagreements that a second
run no longer lists.
"""
import sys
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from delayqueue.config import arguments
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import LIVE_STATUSES, Status
from delayqueue.core.messages import Message
from delayqueue.live.keys import Meta, least_position, namespace_keys, parse_position, topic_keys
from delayqueue.live.shards import topic_shards
from delayqueue.messagelog import sql, tables
from delayqueue.stores.topic_settings import DEFAULT as DEFAULT_SETTINGS
from delayqueue.stores.topic_settings import TopicSettings, placed, settings_table
from spark import common, pgread, restore

KEY = ["topic", "msg_id"]
COMPARED = ["status", "retry", "trigger_time"]
KINDS = ("missing_in_redis", "missing_in_log", "ended_in_log", "status", "retry", "trigger_time")
REDIS_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType(), False),
    T.StructField("msg_id", T.StringType(), False),
    *(T.StructField(name, T.LongType() if name == "trigger_time" else T.IntegerType(), True) for name in COMPARED),
    T.StructField("produce_time", T.LongType(), True),
])
POSITIONS_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType(), False),
    T.StructField("after_time", T.LongType(), False),
    T.StructField("after_id", T.LongType(), False),
])
SHOWN = 20


def scan_topics(redis_url: str, namespace: str, settings: dict[str, TopicSettings], shards):
    """Runs on an executor: every message Redis holds in these topics' shards (live/shards.py, placed
    as `settings`, the driver's read, say), as REDIS_SCHEMA rows."""
    placed(namespace, settings)
    client = common.sync_redis(redis_url)
    try:
        for topic, count, index in shards:
            for msg_id, raw in client.hscan_iter(topic_keys(namespace, topic, count, index).msgs, count=1000):
                m = Message.from_stored(raw, msg_id)
                yield topic, msg_id, int(m.status), m.retry, m.trigger_time, m.produce_time
    finally:
        client.close()


def loader_positions(args, topics: list[str]) -> list[tuple[str, int, int]]:
    """Runs on the driver: (topic, triggerTime ms, row id) of each topic's loader position, the
    least loaded_to of its shards; none for a topic outside the cold tier."""
    settings = settings_table(common.query(args.database_url, sql.TOPIC_CONFIGS, [args.namespace]), args.namespace)
    places = {topic: topic_shards(topic, settings.get(topic, DEFAULT_SETTINGS).shard_counts) for topic in topics}
    client = common.sync_redis(args.redis_url)
    try:
        pipe = client.pipeline(transaction=False)
        for shards in places.values():
            for shard in shards:
                pipe.hget(topic_keys(args.namespace, *shard).meta, Meta.LOADED_TO)
        read = iter(pipe.execute() if topics else [])
    finally:
        client.close()
    positions = []
    for topic, shards in places.items():
        at = least_position([next(read) for _ in shards])
        if at is not None:
            positions.append((topic, *parse_position(at)))
    return positions


def marked_cold(log: DataFrame, positions: DataFrame) -> DataFrame:
    """log(id, topic, trigger_time, status, ...) and positions(topic, after_time, after_id) -> the
    log with `cold`: a waiting row after its topic's position, the loader's to bring in."""
    after = ((F.col("trigger_time") > F.col("after_time"))
             | ((F.col("trigger_time") == F.col("after_time")) & (F.col("id") > F.col("after_id"))))
    cold = (F.col("status") == int(Status.WAITING)) & F.col("after_time").isNotNull() & after
    return (log.join(F.broadcast(positions), "topic", "left")
            .withColumn("cold", F.coalesce(cold, F.lit(False))).drop("after_time", "after_id"))


def sent_before(log: DataFrame, redis: DataFrame, started: int) -> tuple[DataFrame, DataFrame]:
    """Both sides without the messages Redis holds from a send made at or after `started` (ms, when
    the log was read): a send writes the log before Redis, so the log as read has not that life."""
    fresh = redis.where(F.col("produce_time") >= started).select(*KEY)
    return log.join(fresh, KEY, "left_anti"), redis.join(fresh, KEY, "left_anti")


def disagreements(log: DataFrame, redis: DataFrame) -> DataFrame:
    """log(topic, msg_id, status, retry, trigger_time[, cold]) and redis(the same but cold) -> one
    row per message and kind of disagreement: (topic, msg_id, kind, log_<field>, redis_<field> for
    each compared field). A cold log row (marked_cold) Redis does not hold is not missing."""
    def side(df: DataFrame, name: str) -> DataFrame:
        return df.select(*KEY, F.lit(True).alias(f"in_{name}"), *(F.col(c).alias(f"{name}_{c}") for c in COMPARED))

    cold = log.select(*KEY, F.col("cold") if "cold" in log.columns else F.lit(False).alias("cold"))
    both = side(log, "log").join(cold, KEY, "left").join(side(redis, "redis"), KEY, "full_outer")
    in_log, in_redis = F.col("in_log").isNotNull(), F.col("in_redis").isNotNull()
    log_live, redis_live = F.col("log_status").isin(*LIVE_STATUSES), F.col("redis_status").isin(*LIVE_STATUSES)
    ended_in_log = in_log & in_redis & ~log_live & redis_live

    def differs(c: str) -> F.Column:
        return in_log & in_redis & ~F.col(f"log_{c}").eqNullSafe(F.col(f"redis_{c}"))

    conditions = {
        "missing_in_redis": in_log & ~in_redis & log_live & ~F.col("cold"),
        "missing_in_log": in_redis & ~in_log,
        "ended_in_log": ended_in_log,
        "status": differs("status") & ~ended_in_log,
        "retry": differs("retry"),
        "trigger_time": differs("trigger_time"),
    }
    kinds = F.array(*(F.when(condition, F.lit(kind)) for kind, condition in conditions.items()))
    return (both.withColumn("kind", F.explode(F.filter(kinds, lambda k: k.isNotNull())))
            .select(*KEY, "kind", *(f"{s}_{c}" for c in COMPARED for s in ("log", "redis"))))


def by_topic_in_id_order(rows: DataFrame, partitions: int) -> DataFrame:
    """Each topic in one partition, its rows in id order: restored as manage.py restore would."""
    return rows.repartition(partitions, "topic").sortWithinPartitions("topic", "id")


def rows_by_id(dsn: str, query: str, params: dict, ids, chunk_rows: int):
    """Runs on an executor: the log rows of these ids (`chunk_rows` ids per query), as dicts of
    restore.RESTORE_COLUMNS (`params`: the restore's, sql.restore_scope's). Each chunk comes in id
    order, so ids given in each topic's id order keep it."""
    for chunk in common.chunks(ids, chunk_rows):
        yield from restore.logged_rows(dsn, query, {**params, "ids": chunk})


def add_arguments(p) -> None:
    common.add_redis_url(p)
    common.add_partitions(p)
    p.add_argument("--topic", type=arguments.topic_name, help="only this topic")
    p.add_argument("--output", type=Path, metavar="DIR",
                   help="also write every disagreement there as JSON lines (a new directory)")
    p.add_argument("--fix", action="store_true", help="restore the messages missing in Redis (as manage.py restore)")


def preflight(args) -> None:
    if args.output is not None and args.output.exists():
        raise common.JobError(f"--output {args.output} already exists")
    if args.output is not None:
        common.check_writable("--output", args.output)
    common.check_postgres(args.database_url, (tables.MESSAGE, tables.EVENT, tables.TOPIC_CONFIG))
    common.check_redis(args.redis_url)


def read_redis(spark, args, log_topics: list[str], partitions: int) -> DataFrame:
    """What Redis holds for the registered topics and every topic the log knows, read in parallel."""
    if args.topic:
        topics = [args.topic]
    else:
        client = common.sync_redis(args.redis_url)
        try:
            registered = client.zrange(namespace_keys(args.namespace).topics, 0, -1)
        finally:
            client.close()
        topics = sorted(set(registered) | set(log_topics))
    if not topics:
        return spark.createDataFrame([], REDIS_SCHEMA)
    settings = settings_table(common.query(args.database_url, sql.TOPIC_CONFIGS, [args.namespace]), args.namespace)
    shards = [tuple(shard) for topic in topics
              for shard in topic_shards(topic, settings.get(topic, DEFAULT_SETTINGS).shard_counts)]
    url, namespace = args.redis_url, args.namespace
    rows = spark.sparkContext.parallelize(shards, min(len(shards), partitions))
    return spark.createDataFrame(rows.mapPartitions(lambda part: scan_topics(url, namespace, settings, part)),
                                 REDIS_SCHEMA)


def restore_missing(spark, args, log: DataFrame, found: DataFrame, partitions: int,
                    chunk_rows: int = restore.CHUNK_ROWS) -> tuple[int, int, int]:
    """Puts the missing_in_redis messages back with restore_rows, each topic in one task in id
    order; -> (restored, already live, skipped as expired). Their payloads are read only now and
    only for them, by id, `chunk_rows` per query; a row no longer live in the log (it ended
    meanwhile) is left out."""
    missing = found.where(F.col("kind") == "missing_in_redis").select(*KEY)
    ids = by_topic_in_id_order(log.join(missing, KEY, "left_semi").select("topic", "id"), partitions)
    query = restore.rows_query(sql.LIVE_BY_ID)
    config, dsn = restore.queue_config(args), args.database_url
    settings = settings_table(common.query(dsn, sql.TOPIC_CONFIGS, [args.namespace]), args.namespace)
    _, _, params = sql.restore_scope(args.namespace, None, None, include_expired=False)
    per_partition = ids.rdd.mapPartitions(
        lambda part: restore.restore_partition(config, settings, False, False,
                                               rows_by_id(dsn, query, params, (r.id for r in part), chunk_rows)))
    return tuple(sum(column) for column in zip(*per_partition.collect()))


def run(spark, args) -> dict:
    where, _, params = sql.restore_scope(args.namespace, args.topic, None, include_expired=False)
    partitions = common.default_partitions(spark, args.partitions)
    started = now_millis()
    # One read of each side: every later step works on the same snapshot (--fix reads the
    # payloads of the messages it restores, and only those, when it restores them).
    log = pgread.read_messages(spark, args.database_url, ["id", *KEY, *COMPARED], where=where, params=params,
                               partitions=partitions).persist(StorageLevel.MEMORY_AND_DISK)
    log_topics = [r.topic for r in log.select("topic").distinct().collect()]
    redis = read_redis(spark, args, log_topics, partitions).persist(StorageLevel.MEMORY_AND_DISK)
    positions = spark.createDataFrame(loader_positions(args, log_topics), POSITIONS_SCHEMA)
    found = disagreements(*sent_before(marked_cold(log, positions), redis, started)).persist(
        StorageLevel.MEMORY_AND_DISK)
    counts = {kind: 0 for kind in KINDS}
    counts.update({r.kind: r["count"] for r in found.groupBy("kind").count().collect()})
    total = sum(counts.values())
    print(f"reconcile: {total} disagreements: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
    for r in found.orderBy("kind", *KEY).limit(SHOWN).collect():
        print(f"  {r.kind}: {r.topic}/{r.msg_id} " + " ".join(
            f"{c}={r[f'log_{c}']}/{r[f'redis_{c}']}" for c in COMPARED) + "  (log/redis)")
    if total > SHOWN:
        print(f"  ... {total - SHOWN} more" + ("" if args.output else " (--output DIR lists them all)"))
    if args.output:
        found.write.json(str(args.output))
    if args.fix and counts["missing_in_redis"]:
        restored, already_live, skipped = restore_missing(spark, args, log, found, partitions)
        print(f"reconcile --fix: restored {restored}, already live {already_live}, skipped (expired) {skipped}")
        counts["fixed"] = restored
    for df in (found, redis, log):
        df.unpersist()
    return counts


if __name__ == "__main__":
    sys.exit(common.main("spark.reconcile"))
