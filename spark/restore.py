"""Restores the live messages of the log into Redis in parallel: `manage.py restore` for logs
too big for one process.

The driver counts the live rows per topic and deals the topics into partitions of about equal
size; each Spark task streams its topics' rows from PostgreSQL in id order and puts them back
with `delayqueue.services.restore.restore_rows`, the same function and Lua script `manage.py restore`
uses. The result is the same as the command's: the same messages, states and times, and each
topic's ready list in the same (id) order. Nothing is shuffled: rows go from PostgreSQL to
Redis inside one Python task. First, on the driver, the topics' settings go back into their
Redis mirrors (pause, backoff) with `restore_topic_settings`, and in the cold tier the rows after
each topic's loader position are left to it (`count_and_leave_cold`), as `manage.py restore`
does before its messages. Idempotent: a msgId Redis already holds is counted already live
and left alone, so a re-run after a failed task finishes the job. Parallelism is across topics.
"""
import asyncio
import json
import os
import sys
from collections.abc import Iterable
from contextlib import contextmanager, suppress

import psycopg

from delayqueue.config import arguments
from delayqueue.core.clock import now_millis
from delayqueue.live.keys import namespace_keys
from delayqueue.messagelog import sql, tables
from delayqueue.messagelog.connection import first_line
from delayqueue.runtime import Runtime
from delayqueue.services.caps import restore_running
from delayqueue.services.restore import (RestoreCounts, answers_loss_report, count_and_leave_cold, nothing_matches,
                                         restore_rows, restore_topic_settings, sets_cold_counts)
from delayqueue.stores.topic_settings import TopicSettings, placed, settings_table
from spark import common, pgread
from spark.common import JobError

RESTORE_COLUMNS = [*sql.RESTORE_COLUMNS, "ttl"]
_RESTORE_SQL_COLUMNS = [*(pgread.MESSAGE_COLUMNS[n] for n in sql.RESTORE_COLUMNS),
                        pgread.Column("ttl", sql.RESTORE_TTL, *pgread.PG_TYPES["int8"])]
CHUNK_ROWS = 10_000  # rows per restore_rows call, as manage.py restore pages the log


def balance(rows_per_topic: dict[str, int], parts: int) -> list[list[str]]:
    """Topics dealt into at most `parts` groups of about equal rows: the largest topic first,
    each to the group with the fewest rows so far."""
    groups: list[list[str]] = [[] for _ in range(min(parts, len(rows_per_topic)))]
    loads = [0] * len(groups)
    for topic, rows in sorted(rows_per_topic.items(), key=lambda item: (-item[1], item[0])):
        lightest = loads.index(min(loads))
        groups[lightest].append(topic)
        loads[lightest] += rows
    return groups


def queue_config(args):
    """The deployment's queue settings (Django's, from the environment), pointed at --redis-url
    and --namespace. The driver reads them once; the executors get this object."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from delayqueue.config.settings import load_config

    return load_config().with_overrides(redis_url=args.redis_url, namespace=args.namespace)


def restore_partition(config, settings: dict[str, TopicSettings], include_expired: bool, dry_run: bool,
                      rows: Iterable[dict], cold_counted: bool = False):
    """Runs on an executor: restores rows (dicts of RESTORE_COLUMNS) in the order given, each
    into its shard by `settings` (the namespace's topic settings, as the driver read them); yields
    this partition's (restored, already live, skipped). `cold_counted`: as restore_rows'."""
    placed(config.namespace, settings)

    async def restore_all() -> RestoreCounts:
        counts, rt = RestoreCounts(), None
        try:
            for chunk in common.chunks(rows, CHUNK_ROWS):
                # Connected on the first rows: a partition that has none (a topic hashed
                # elsewhere) costs no Redis connection.
                rt = rt or Runtime(config, process="spark restore")
                counts += await restore_rows(rt, rows=chunk, include_expired=include_expired, dry_run=dry_run,
                                             settings=settings, cold_counted=cold_counted)
        finally:
            if rt is not None:
                await rt.close()
        return counts

    counts = asyncio.run(restore_all())
    yield counts.restored, counts.already_live, counts.skipped


def prepare(config, args, table: dict[str, TopicSettings], scope, candidates, params: dict) -> tuple[dict, list]:
    """On the driver, what manage.py restore does before its messages: the namespace's topic
    settings (only --topic's when given) written into their Redis mirrors, then the rows counted
    and, in the cold tier, those after their topic's loader position left to it
    (services.restore.count_and_leave_cold). -> the rows' params (with the positions) and counts."""

    async def steps() -> tuple[dict, list]:
        rt = Runtime(config, process="spark restore")
        try:
            if not args.dry_run:
                await restore_topic_settings(rt, topic=args.topic, table=table)
            async with await psycopg.AsyncConnection.connect(args.database_url, connect_timeout=10,
                                                             autocommit=True) as conn:
                return await count_and_leave_cold(rt, conn, scope=scope, candidates=candidates, params=params,
                                                  topic=args.topic, msg_id=args.msg_id, dry_run=args.dry_run,
                                                  settings=table)
        finally:
            await rt.close()

    try:
        return asyncio.run(steps())
    except psycopg.Error as exc:
        raise JobError(f"cannot query PostgreSQL: {first_line(exc)}") from None


def rows_query(where) -> str:
    """The statement streaming the RESTORE_COLUMNS of the log rows matching `where` (a
    condition of messagelog.sql), in id order."""
    return sql.copy_in_id_order(tables.MESSAGE, [c.expression for c in _RESTORE_SQL_COLUMNS], where).as_string(None)


def logged_rows(dsn: str, query: str, params: dict):
    """Runs on an executor: the rows of a rows_query, as dicts of RESTORE_COLUMNS."""
    for values in pgread.stream(dsn, query, _RESTORE_SQL_COLUMNS, params):
        yield dict(zip(RESTORE_COLUMNS, values))


def topic_rows(dsn: str, query: str, params: dict, positions: dict[str, tuple[int, int]], topics: Iterable[str]):
    """Runs on an executor: the rows of each topic, in id order, as dicts; in the cold tier only
    those up to its loader position (`positions`: (triggerTime ms, row id) per topic)."""
    for topic in topics:
        after_time, after_id = positions.get(topic, (None, None))
        yield from logged_rows(dsn, query, {**params, "topic": topic, "after_time": after_time, "after_id": after_id})


def add_arguments(p) -> None:
    common.add_redis_url(p)
    common.add_partitions(p)
    p.add_argument("--topic", type=arguments.topic_name, help="only this topic")
    p.add_argument("--msg-id", type=arguments.msg_id, help="only this message id")
    p.add_argument("--include-expired", action="store_true",
                   help="also bring back messages whose TTL ran out before delivery, with their TTL anew")
    p.add_argument("--dry-run", action="store_true", help="count what would be restored, change nothing")


def preflight(args) -> None:
    common.check_postgres(args.database_url, (tables.MESSAGE, tables.EVENT, tables.TOPIC_CONFIG))
    common.check_redis(args.redis_url)


@contextmanager
def restore_turn(dsn: str, namespace: str):
    """The namespace's restore lock, held on the driver for the job, as every other restore takes
    it (services/caps.restore_turn): JobError while another restore of the namespace runs."""
    try:
        conn = psycopg.connect(dsn, connect_timeout=10, autocommit=True)
    except psycopg.Error as exc:
        raise JobError(f"cannot query PostgreSQL: {first_line(exc)}") from None
    with conn:
        if not conn.execute(sql.RESTORE_LOCK, [namespace]).fetchone()[0]:
            raise JobError(restore_running(namespace))
        try:
            yield
        finally:
            with suppress(psycopg.Error):  # a broken connection's session ends, and the lock with it
                conn.execute(sql.RESTORE_UNLOCK, [namespace])


def run(spark, args) -> tuple[int, int, int]:
    with restore_turn(args.database_url, args.namespace):
        return restore_in_turn(spark, args)


def restore_in_turn(spark, args) -> tuple[int, int, int]:
    config = queue_config(args)
    # The rows manage.py restore would consider (namespace, --topic, --msg-id), counted per topic
    # in one scan: candidates, and the rest (skipped as ended or expired).
    scope, candidates, params = sql.restore_scope(args.namespace, args.topic, args.msg_id, args.include_expired)
    settings = settings_table(common.query(args.database_url, sql.TOPIC_CONFIGS, [args.namespace]), args.namespace)
    params, counts = prepare(config, args, settings, scope, candidates, params)
    if not counts and (problem := nothing_matches(args.topic, args.msg_id)):
        raise JobError(problem)
    rows_per_topic = {topic: n for topic, _hour, n, _rest, _left in counts if n}
    ended = sum(rest for _topic, _hour, _n, rest, _left in counts)
    left_cold = sum(left for _topic, _hour, _n, _rest, left in counts)
    positions = {p["cold_topic"]: (p["after_time"], p["after_id"]) for p in json.loads(params.get("cold_after", "[]"))}
    query = rows_query(sql.both(sql.both(sql.both(scope, candidates), sql.IN_TOPIC), sql.NOT_COLD_IN_TOPIC))
    groups = balance(rows_per_topic, common.default_partitions(spark, args.partitions))
    include_expired, dry_run, dsn = args.include_expired, args.dry_run, args.database_url
    cold_counted = sets_cold_counts(config, args.msg_id)
    per_partition = (spark.sparkContext.parallelize(groups, len(groups)).mapPartitions(
        lambda topics: restore_partition(config, settings, include_expired, dry_run, topic_rows(
            dsn, query, params, positions, (t for group in topics for t in group)), cold_counted))
                     .collect()) if groups else []
    restored, already_live, skipped = (sum(column) for column in zip(*per_partition)) if per_partition else (0, 0, 0)
    skipped += ended
    if answers_loss_report(args.topic, args.msg_id, dry_run):
        client = common.sync_redis(args.redis_url)
        keys = namespace_keys(args.namespace)
        try:  # the marker too, as manage.py restore (services/restore.restore) sets it
            client.set(keys.marker, now_millis(), nx=True)
            client.delete(keys.data_lost)
        finally:
            client.close()
    verb = "would restore" if dry_run else "restored"
    print(f"{verb} {restored}, already live {already_live}, skipped (ended or expired) {skipped}"
          + (f", left cold (in the message log, for the loader) {left_cold}" if left_cold else ""))
    return restored, already_live, skipped


if __name__ == "__main__":
    sys.exit(common.main("spark.restore"))
