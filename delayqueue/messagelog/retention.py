"""Retention of the message log: ended messages and their history go after a configurable age;
dead letters (status 5 or 6 of a topic that keeps them: sql.KEEPS_DEAD) once their own,
DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS, has run out and that age again has passed since. The
archive (spark/archive.py) takes both at an age below that one (its --older-than-days), a dead
letter once its own retention has run out: so it reaches every row before prune_log does.

Deletes in small batches, each its own short transaction (SKIP LOCKED), so the tables stay
writable while it runs and an interrupted run loses nothing but time.
"""
from datetime import datetime, timedelta, timezone

from django.db import DatabaseError, connections, transaction

from delayqueue.config.settings import load_config
from delayqueue.messagelog import sql
from delayqueue.messagelog.routing import log_databases


def prune_log(older_than: timedelta, batch: int = 5000, on_batch=None,
              dead_older_than: timedelta | None = None) -> tuple[int, int]:
    """Deletes ended messages last changed before now - older_than, dead letters last changed
    before now - dead_older_than (default DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS) - older_than,
    and their history, in every database of the log, now by that database's clock (sql.NOW).
    Returns (messages, history rows) deleted; raises the first DatabaseError once every database
    that answers is pruned (one database down holds up no other's retention)."""
    if dead_older_than is None:
        dead_older_than = timedelta(days=load_config().dead_letter_retention_days)
    totals, failed = [0, 0], None
    for database in log_databases():
        try:
            with connections[database].cursor() as cursor:
                cursor.execute(sql.NOW)
                [now] = cursor.fetchone()
            for dead_letters, cutoff in ((False, now - older_than), (True, now - dead_older_than - older_than)):
                _prune(database, cutoff, dead_letters, batch, totals, on_batch)
        except DatabaseError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return totals[0], totals[1]


def _prune(database: str, cutoff: datetime, dead_letters: bool, batch: int, totals: list[int], on_batch) -> None:
    since = datetime.min.replace(tzinfo=timezone.utc)
    while True:
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            cursor.execute(sql.DELETE_ENDED_MESSAGES, {"before": cutoff, "since": since,
                                                       "dead_letters": dead_letters, "batch": batch})
            keys = cursor.fetchall()
            if keys:
                namespaces = [k[0] for k in keys]
                cursor.execute(sql.DELETE_HISTORY, {"namespaces": namespaces, "topics": [k[1] for k in keys],
                                                    "msg_ids": [k[2] for k in keys], "before": cutoff})
                totals[1] += cursor.rowcount
                cursor.execute(sql.RECORD_PRUNED, {"namespaces": namespaces, "before": cutoff})
                since = max(k[3] for k in keys)
        totals[0] += len(keys)
        if on_batch:
            on_batch(*totals)
        if len(keys) < batch:
            return
