"""Per topic and hour statistics of the message log, written to delayqueue_topichourstats.

Counts of history events by the hour they happened: sent, delivered (pulls, redeliveries
included), acked (pushes answered 2xx included), nacked (failed push attempts included), timed
out (ack timeouts), expired (ended 5), retries exhausted
(ended 6), deleted. Fire lateness (the first time a message became ready − its triggerTime; not
of a life a retry's wait or a reschedule while ready moved the triggerTime of) and end-to-end
latency (its ack − its produceTime) as exact p50/p90/p99 in milliseconds, in the hour of that
ready or ack. A msgId reused after it ended has one log row, its latest lifecycle: events older
than that row's produceTime belong to an earlier lifecycle and are left out of the two latencies
(they still count).
"""
import argparse
import sys
from datetime import datetime, timezone

import psycopg
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from delayqueue.core.constants import Reason, Status
from delayqueue.messagelog import sql, tables
from delayqueue.messagelog.connection import first_line
from spark import common, pgread
from spark.common import JobError

HOUR_MS = 3_600_000
NO_STATUS = 0  # from_status of a message's first event (sent)
KEY = ["namespace", "topic", "msg_id"]
GROUP = ["namespace", "topic", "hour"]
QUANTILES = (0.5, 0.9, 0.99)
COUNTS = ("sent", "delivered", "acked", "nacked", "timed_out", "expired", "exhausted", "deleted")
LATENCIES = ("fire_lateness", "latency")
STATS_COLUMNS = (*GROUP, *COUNTS, *(f"{name}_p{round(q * 100)}" for name in LATENCIES for q in QUANTILES))


def hour_of(ms: Column) -> Column:
    """The hour an epoch-millisecond time falls in, as epoch milliseconds."""
    return F.floor(ms / HOUR_MS) * HOUR_MS


def event_counts(events: DataFrame) -> DataFrame:
    """events(namespace, topic, at, to_status, reason) -> (namespace, topic, hour, <COUNTS>)"""
    def count(condition: Column, name: str) -> Column:
        return F.count(F.when(condition, True)).alias(name)

    reason, to_status = F.col("reason"), F.col("to_status")
    return events.withColumn("hour", hour_of(F.col("at"))).groupBy(*GROUP).agg(
        count(reason == "sent", "sent"),
        count(reason == "pulled", "delivered"),
        count(to_status == Status.ACKED, "acked"),
        count(reason.isin(Reason.NACKED.value, Reason.PUSH_FAILED.value), "nacked"),
        count(reason == "ack_timeout", "timed_out"),
        count(to_status == Status.EXPIRED, "expired"),
        count(to_status == Status.EXHAUSTED, "exhausted"),
        count(to_status == Status.DELETED, "deleted"),
    )


def current_lifecycle(events: DataFrame, messages: DataFrame) -> DataFrame:
    """The events of each message's logged lifecycle, with its produce and trigger times."""
    return (events.join(messages.select(*KEY, "produce_time", "trigger_time"), KEY)
            .where(F.col("at") >= F.col("produce_time")))


def fire_lateness(events: DataFrame, messages: DataFrame) -> DataFrame:
    """-> (namespace, topic, hour, value): per message, first ready time − triggerTime. Ready
    means a move to ready from none or waiting (not a nack or ack timeout putting it back). A life
    given back to wait (a nack's delay, a retry backoff: consuming -> waiting) or rescheduled while
    ready (to later, or "run now") is left out: that moved the row's triggerTime past its first
    ready, and the one it first fell due at is not kept."""
    readies = (events.where((F.col("to_status") == Status.READY) & F.col("from_status").isin(NO_STATUS, Status.WAITING))
               .select(*KEY, "at"))
    moves = events.where(((F.col("from_status") == Status.CONSUMING) & (F.col("to_status") == Status.WAITING))
                         | ((F.col("from_status") == Status.READY) & (F.col("reason") == Reason.RESCHEDULED.value)))
    moved = current_lifecycle(moves.select(*KEY, "at"), messages).select(*KEY).distinct()
    first_ready = (current_lifecycle(readies, messages).join(moved, KEY, "left_anti")
                   .groupBy(*KEY).agg(F.min("at").alias("at"), F.first("trigger_time").alias("trigger_time")))
    return first_ready.select("namespace", "topic", hour_of(F.col("at")).alias("hour"),
                              (F.col("at") - F.col("trigger_time")).alias("value"))


def end_to_end_latency(events: DataFrame, messages: DataFrame) -> DataFrame:
    """-> (namespace, topic, hour, value): per ack, ack time − produceTime."""
    acks = events.where(F.col("to_status") == Status.ACKED).select(*KEY, "at")
    return (current_lifecycle(acks, messages)
            .select("namespace", "topic", hour_of(F.col("at")).alias("hour"),
                    (F.col("at") - F.col("produce_time")).alias("value")))


def percentiles(values: DataFrame, name: str) -> DataFrame:
    """(namespace, topic, hour, value) -> (namespace, topic, hour, <name>_p50, _p90, _p99), exact
    (linear interpolation between the closest ranks)."""
    quantiles = F.percentile(F.col("value").cast("double"), F.array(*(F.lit(q) for q in QUANTILES)))
    return values.groupBy(*GROUP).agg(quantiles.alias("q")).select(
        *GROUP, *(F.col("q")[i].alias(f"{name}_p{round(q * 100)}") for i, q in enumerate(QUANTILES)))


def topic_hour_stats(events: DataFrame, messages: DataFrame) -> DataFrame:
    """events(namespace, topic, msg_id, at, from_status, to_status, reason) and
    messages(namespace, topic, msg_id, produce_time, trigger_time) -> one row per
    (namespace, topic, hour) with STATS_COLUMNS; hour in epoch milliseconds."""
    return (event_counts(events)
            .join(percentiles(fire_lateness(events, messages), "fire_lateness"), GROUP, "left")
            .join(percentiles(end_to_end_latency(events, messages), "latency"), GROUP, "left")
            .select(*STATS_COLUMNS))


def add_arguments(p) -> None:
    common.add_partitions(p)
    p.add_argument("--since", type=since_hour, metavar="YYYY-MM-DD[THH]",
                   help="only hours from this one on (UTC); default: every hour in the log")
    p.add_argument("--all-namespaces", action="store_true",
                   help="every namespace, not only --namespace (without --database-url: in every database of the log)")


def since_hour(text: str) -> datetime:
    for layout in ("%Y-%m-%dT%H", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, layout).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(f"not a date or date and hour (YYYY-MM-DD or YYYY-MM-DDTHH): {text!r}")


def databases(args) -> list[str]:
    """The databases the job reads and writes: every one of the log for all namespaces, else --namespace's."""
    return args.database_urls if args.all_namespaces else [args.database_url]


def preflight(args) -> None:
    for dsn in databases(args):
        common.check_postgres(dsn, (tables.MESSAGE, tables.EVENT, tables.STATS, tables.HISTORY_PRUNED))


def read_inputs(spark, args, dsn: str) -> tuple[DataFrame, DataFrame]:
    partitions = common.default_partitions(spark, args.partitions)
    where = sql.ALL if args.all_namespaces else sql.IN_NAMESPACE
    params = {"namespace": args.namespace, "since": args.since}
    event_where = message_where = where
    if args.since:
        event_where = sql.both(where, sql.EVENTS_SINCE)
        # The messages are only joined to these events: read those that have one.
        message_where = sql.both(where, sql.MESSAGES_WITH_EVENTS_SINCE)
    events = pgread.read_events(spark, dsn,
                                ["namespace", "topic", "msg_id", "at", "from_status", "to_status", "reason"],
                                where=event_where, params=params, partitions=partitions)
    messages = pgread.read_messages(spark, dsn,
                                    ["namespace", "topic", "msg_id", "produce_time", "trigger_time"],
                                    where=message_where, params=params, partitions=partitions)
    return events, messages


UPSERT = sql.stats_upsert(STATS_COLUMNS)


def write_stats(dsn: str, rows: list) -> None:
    """Replaces the figures of every (namespace, topic, hour) computed, in one transaction. One
    row per topic and hour is small enough to send from the driver."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.executemany(UPSERT, [tuple(row[c] for c in STATS_COLUMNS) for row in rows])
    except psycopg.Error as exc:
        raise JobError(f"cannot write {tables.STATS}: {first_line(exc)}") from None


def run(spark, args) -> int:
    """Each database's figures are computed from its rows and written back to it (a namespace's
    log and figures are in one database)."""
    written = left = 0
    for dsn in databases(args):
        # Each input feeds several branches of the plan: read PostgreSQL once, not once per branch.
        events, messages = (df.persist(StorageLevel.MEMORY_AND_DISK) for df in read_inputs(spark, args, dsn))
        rows = topic_hour_stats(events, messages).collect()
        events.unpersist()
        messages.unpersist()
        # Asked after the read: a deletion the read may have missed part of was recorded before it committed.
        pruned = dict(common.query(dsn, sql.PRUNED_BEFORE, {}))
        whole = [row for row in rows if row.hour >= pruned.get(row.namespace, row.hour)]
        write_stats(dsn, whole)
        written += len(whole)
        left += len(rows) - len(whole)
    print(f"stats: wrote {written} topic-hours to {tables.STATS}"
          + (f"; left {left} alone whose history the log's retention has deleted" if left else ""))
    return written


if __name__ == "__main__":
    sys.exit(common.main("spark.stats"))
