"""Moves ended messages and their history older than N days from PostgreSQL to Parquet.

A message is archived when it ended (status 4-7) more than --older-than-days days ago (its
updated_at), a dead letter (5 or 6 of a topic that keeps them) only once also older than
DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS (prune_log keeps it that long and its own age again, so
--older-than-days below that age reaches it first); its history goes with it. Both are written
under --to, partitioned by the UTC date the message ended and its topic:

    messages/date=YYYY-MM-DD/topic=<topic>/<batch>-part-*.parquet
    events/date=YYYY-MM-DD/topic=<topic>/<batch>-part-*.parquet
    _staging/<batch>/                Spark's output, before the batch is committed
    _batches/<batch>.moving          the batch's files are being moved into place
    _batches/<batch>.json            manifest: the batch is committed (its files and row counts)
    _batches/<batch>.done            its rows are deleted from PostgreSQL

Rows are deleted from PostgreSQL only after their batch's manifest is written, and only if
unchanged since they were read. Each run first finishes what a crashed run left: a batch
caught moving is rolled back (its files removed; its rows are still in PostgreSQL and are
archived again), a committed batch whose rows are not yet deleted gets them deleted. So a
re-run after a crash at any point neither loses nor duplicates rows. Files of a batch without
a manifest are not part of the archive.
"""
import argparse
import json
import os
import secrets
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import psycopg
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from delayqueue.config.arguments import age_in_days
from delayqueue.config.settings import SETTINGS
from delayqueue.core.constants import Status
from delayqueue.messagelog import sql, tables
from delayqueue.messagelog.connection import first_line
from spark import common, pgread
from spark.common import JobError

KEY = ["namespace", "topic", "msg_id"]
KINDS = ("messages", "events")
CRASH_ENV = "DELAYQUEUE_ARCHIVE_CRASH_AT"  # tests: staged | moving | committed
DELETE_CHUNK = 5000


class SimulatedCrash(BaseException):
    """Raised where CRASH_ENV says, to stand for the process dying there (nothing catches it)."""


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        raise SimulatedCrash(name)


def archived_messages(messages: DataFrame) -> DataFrame:
    """Log rows (times in epoch ms) -> archive rows: timestamps, plus the partition `date`."""
    times = ("produce_time", "trigger_time", "expire_time", "updated_at")
    return (messages.select(*(F.timestamp_millis(c).alias(c) if c in times else c for c in messages.columns))
            .withColumn("date", F.date_format("updated_at", "yyyy-MM-dd")))


def history_of(events: DataFrame, archived: DataFrame) -> DataFrame:
    """The events of the archived messages' lifecycles (up to the time they ended, or their 'sent',
    at produceTime by the web host's clock, which may be ahead of Redis' that timed the end), each
    with its message's `date`, so a message and its history land in the same partition."""
    ends = archived.select(*KEY, "date", F.greatest("updated_at", "produce_time").alias("ended_at"))
    return (events.withColumn("at", F.timestamp_millis("at")).join(ends, KEY)
            .where(F.col("at") <= F.col("ended_at")).drop("ended_at"))


class Archive:
    """The --to directory: where batches are staged, committed and recorded."""

    def __init__(self, root: Path):
        self.root = root
        self.staging = root / "_staging"
        self.batches = root / "_batches"

    def marker(self, batch: str, suffix: str) -> Path:
        return self.batches / f"{batch}.{suffix}"

    def write_marker(self, batch: str, suffix: str, content: str) -> None:
        """Atomically: a reader sees the whole marker or none."""
        path = self.marker(batch, suffix)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(content)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def batch_ids(self, suffix: str) -> list[str]:
        return sorted(p.name[: -len(suffix) - 1] for p in self.batches.glob(f"*.{suffix}"))

    def manifest(self, batch: str) -> dict:
        return json.loads(self.marker(batch, "json").read_text())

    def committed_files(self, manifest: dict) -> dict[str, list[str]]:
        """A committed batch's files per kind, as absolute paths."""
        return {kind: [str(self.root / f) for f in manifest["files"][kind]] for kind in KINDS}

    def move_into_place(self, batch: str) -> dict[str, list[str]]:
        """Moves the staged Parquet files to their partitions, named after the batch."""
        moved = {kind: [] for kind in KINDS}
        for kind in KINDS:
            for staged in sorted((self.staging / batch / kind).glob("date=*/topic=*/*.parquet")):
                target = self.root / kind / staged.parent.parent.name / staged.parent.name / f"{batch}-{staged.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)
                moved[kind].append(str(target.relative_to(self.root)))
                crash_point("moving")
        return moved

    def roll_back(self, batch: str) -> None:
        """Removes every file of an uncommitted batch."""
        for kind in KINDS:
            for path in (self.root / kind).glob(f"date=*/topic=*/{batch}-*"):
                path.unlink()
        shutil.rmtree(self.staging / batch, ignore_errors=True)
        self.marker(batch, "moving").unlink(missing_ok=True)


def directory_path(text: str) -> Path:
    """--to: a directory, not a URL (Path would quietly make 's3a://b/x' the local 's3a:/b/x')."""
    if "://" in text:
        raise argparse.ArgumentTypeError(f"must be a directory path (local or a shared mount), not a URL: {text!r}")
    return Path(text)


def add_arguments(p) -> None:
    p.add_argument("--to", required=True, type=directory_path, metavar="DIR",
                   help="archive directory, on a filesystem the driver and every executor share")
    p.add_argument("--older-than-days", required=True, type=age_in_days, metavar="N",
                   help="archive messages that ended more than N days ago")
    common.add_partitions(p)
    # Read with the options, as --redis-url's default: a bad value stops the job before Spark starts.
    p.set_defaults(dead_letter_retention_days=SETTINGS["dead_letter_retention_days"].read())


def preflight(args) -> None:
    common.check_writable("--to", args.to)
    common.check_postgres(args.database_url, (tables.MESSAGE, tables.EVENT, tables.HISTORY_PRUNED))


def delete_rows(dsn: str, kind: str, rows) -> None:
    """Deletes archived rows, a chunk per transaction. A message row is deleted only if it is
    still the ended lifecycle that was archived (a reused msgId updates the row)."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        for chunk in common.chunks(rows, DELETE_CHUNK):
            _delete_chunk(conn, kind, chunk)


def _delete_chunk(conn, kind: str, chunk: list) -> None:
    with conn.transaction():
        if kind == "messages":
            conn.execute(sql.ARCHIVE_DELETE_MESSAGES, {"ids": [r.id for r in chunk], "ended": [r.ended for r in chunk],
                                                       "first_ended": Status.ACKED})
        else:
            conn.execute(sql.ARCHIVE_DELETE_EVENTS, {"ids": [r.id for r in chunk]})


def delete_committed(spark, archive: Archive, batch: str, dsn: str) -> None:
    """Deletes a committed batch's rows from PostgreSQL, in parallel, reading their ids back
    from the batch's own files; then records the batch done."""
    manifest = archive.manifest(batch)
    # Before any delete, so that no stats run recomputes an hour this batch's deletes reach.
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            conn.execute(sql.RECORD_PRUNED, {"namespaces": [manifest["namespace"]], "before": manifest["ended_before"]})
    except psycopg.Error as exc:
        raise JobError(f"cannot use PostgreSQL: {first_line(exc)}") from None
    for kind, files in archive.committed_files(manifest).items():
        if not files:
            continue
        ids = spark.read.parquet(*files).select(
            "id", (F.unix_millis("updated_at") if kind == "messages" else F.lit(None)).alias("ended"))
        ids.foreachPartition(lambda rows, kind=kind: delete_rows(dsn, kind, rows))
    archive.write_marker(batch, "done", datetime.now(timezone.utc).isoformat())


def recover(spark, archive: Archive, dsn: str) -> None:
    """Finishes what an earlier run left behind."""
    committed = set(archive.batch_ids("json"))
    for batch in archive.batch_ids("moving"):
        if batch in committed:  # crashed after the commit, before tidying up
            shutil.rmtree(archive.staging / batch, ignore_errors=True)
            archive.marker(batch, "moving").unlink()
        else:
            print(f"archive: rolling back uncommitted batch {batch}")
            archive.roll_back(batch)
    if archive.staging.exists():
        for leftover in archive.staging.iterdir():  # crashed while Spark was writing
            if leftover.name not in committed:
                shutil.rmtree(leftover)
    for batch in sorted(committed - set(archive.batch_ids("done"))):
        print(f"archive: deleting the archived rows of committed batch {batch} from PostgreSQL")
        delete_committed(spark, archive, batch, dsn)


def cutoff(dsn: str, days: int) -> datetime:
    """now − days, by PostgreSQL's clock (the one updated_at was written with)."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            return conn.execute(sql.CUTOFF, (days,)).fetchone()[0]
    except psycopg.Error as exc:
        raise JobError(f"cannot use PostgreSQL: {first_line(exc)}") from None


def run(spark, args) -> dict:
    archive = Archive(args.to.resolve())
    archive.batches.mkdir(parents=True, exist_ok=True)
    recover(spark, archive, args.database_url)

    # Partition values stay strings when read back (a topic named "2024" is not a number).
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    partitions = common.default_partitions(spark, args.partitions)
    before = cutoff(args.database_url, args.older_than_days)
    dead_before = cutoff(args.database_url, args.dead_letter_retention_days)
    messages = pgread.read_messages(
        spark, args.database_url, list(pgread.MESSAGE_COLUMNS), partitions=partitions,
        where=sql.ARCHIVABLE_MESSAGES, params={"namespace": args.namespace, "before": before,
                                               "dead_before": dead_before})
    batch = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
    staged = archive.staging / batch
    archived_messages(messages).write.partitionBy("date", "topic").parquet(str(staged / "messages"))
    if not any((staged / "messages").glob("date=*")):
        shutil.rmtree(staged)
        print("archive: nothing to archive")
        return {"batch": None, "messages": 0, "events": 0}
    # The events join the staged messages, not a second read of the log, so both agree.
    archived = spark.read.parquet(str(staged / "messages"))
    counts = {"messages": archived.count()}
    events = pgread.read_events(spark, args.database_url, list(pgread.EVENT_COLUMNS), partitions=partitions,
                                where=sql.ARCHIVABLE_EVENTS, params={"namespace": args.namespace, "before": before})
    history_of(events, archived).write.partitionBy("date", "topic").parquet(str(staged / "events"))
    counts["events"] = spark.read.parquet(str(staged / "events")).count()
    crash_point("staged")

    archive.write_marker(batch, "moving", batch)
    files = archive.move_into_place(batch)
    archive.write_marker(batch, "json", json.dumps({"batch": batch, "ended_before": before.isoformat(), "namespace": args.namespace,
                                                    "rows": counts, "files": files}, indent=1))
    shutil.rmtree(staged)
    archive.marker(batch, "moving").unlink()
    crash_point("committed")

    delete_committed(spark, archive, batch, args.database_url)
    print(f"archive: batch {batch} archived {counts['messages']} messages and {counts['events']} events "
          f"to {archive.root} and deleted them from PostgreSQL")
    return {"batch": batch, **counts}


if __name__ == "__main__":
    sys.exit(common.main("spark.archive"))
