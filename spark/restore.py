"""Restores the live messages of the log into Redis in parallel: `manage.py restore` for logs
too big for one process.

The log is read in parallel id ranges, regrouped so that each topic is restored by one task in
id order, and every task puts its rows back with `delayqueue.recovery.restore_rows`, the same
function and Lua script `manage.py restore` uses. The result is the same as the command's: the
same messages, states and times, and each topic's ready list in the same (id) order. Idempotent:
a msgId Redis already holds is counted already live and left alone, so a re-run after a failed
task finishes the job. Parallelism is across topics.
"""
import asyncio
import os
import sys

from pyspark.sql import DataFrame

from delayqueue.messages import EXPIRED
from delayqueue.recovery import LIVE, RestoreCounts, restore_rows
from delayqueue.runtime import Runtime

from spark import common, pgread
from spark.common import EVENT_TABLE, MESSAGE_TABLE

RESTORE_COLUMNS = ["id", "namespace", "topic", "msg_id", "payload", "produce_time", "trigger_time", "expire_time",
                   "max_retry", "retry", "status"]
CHUNK_ROWS = 10_000  # rows per restore_rows call, as manage.py restore pages the log


def by_topic_in_id_order(rows: DataFrame, partitions: int) -> DataFrame:
    """Each topic in one partition, its rows in id order (the order manage.py restore sends)."""
    return rows.repartition(partitions, "topic").sortWithinPartitions("topic", "id")


def queue_config(args):
    """The deployment's queue settings (Django's, from the environment), pointed at --redis-url
    and --namespace. The driver reads them once; the executors get this object."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from delayqueue.conf import load_config

    return load_config().with_overrides(redis_url=args.redis_url, namespace=args.namespace)


def restore_partition(config, include_expired: bool, dry_run: bool, rows):
    """Runs on an executor: restores one partition's rows; yields its (restored, already live, skipped)."""
    async def restore_all() -> RestoreCounts:
        rt = Runtime(config, process="spark restore")
        counts = RestoreCounts()
        try:
            chunk = []
            for row in rows:
                chunk.append(row.asDict())
                if len(chunk) == CHUNK_ROWS:
                    counts += await restore_rows(rt, chunk, include_expired=include_expired, dry_run=dry_run)
                    chunk = []
            if chunk:
                counts += await restore_rows(rt, chunk, include_expired=include_expired, dry_run=dry_run)
        finally:
            await rt.close()
        return counts

    counts = asyncio.run(restore_all())
    yield counts.restored, counts.already_live, counts.skipped


def add_arguments(p) -> None:
    common.add_redis_url(p)
    common.add_partitions(p)
    p.add_argument("--topic", type=common.topic_name, help="only this topic")
    p.add_argument("--msg-id", type=common.non_empty, help="only this message id")
    p.add_argument("--include-expired", action="store_true",
                   help="also bring back messages whose TTL ran out before delivery, with their TTL anew")
    p.add_argument("--dry-run", action="store_true", help="count what would be restored, change nothing")


def preflight(args) -> None:
    common.check_postgres(args.database_url, (MESSAGE_TABLE, EVENT_TABLE))
    common.check_redis(args.redis_url)


def scope(args) -> tuple[str, tuple]:
    """The rows manage.py restore would consider, as SQL: namespace, --topic, --msg-id."""
    where, params = ["namespace = %s"], [args.namespace]
    for column, value in (("topic", args.topic), ("msg_id", args.msg_id)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    return " AND ".join(where), tuple(params)


def run(spark, args) -> tuple[int, int, int]:
    config = queue_config(args)
    where, params = scope(args)
    statuses = ", ".join(str(s) for s in ([*LIVE, EXPIRED] if args.include_expired else LIVE))
    partitions = common.default_partitions(spark, args.partitions)
    rows = pgread.read_messages(spark, args.database_url, RESTORE_COLUMNS, where=f"{where} AND status IN ({statuses})",
                                params=params, partitions=partitions)
    ended = common.count_rows(args.database_url, MESSAGE_TABLE, f"{where} AND status NOT IN ({statuses})", params)
    include_expired, dry_run = args.include_expired, args.dry_run
    per_partition = by_topic_in_id_order(rows, partitions).rdd.mapPartitions(
        lambda part: restore_partition(config, include_expired, dry_run, part)).collect()
    restored, already_live, skipped = (sum(column) for column in zip(*per_partition)) if per_partition else (0, 0, 0)
    skipped += ended
    verb = "would restore" if dry_run else "restored"
    print(f"{verb} {restored}, already live {already_live}, skipped (ended or expired) {skipped}")
    return restored, already_live, skipped


if __name__ == "__main__":
    sys.exit(common.main("spark.restore"))
