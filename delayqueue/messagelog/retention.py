"""Retention of the message log: ended messages and their history go after a configurable age.

Deletes in small batches, each its own short transaction (SKIP LOCKED), so the tables stay
writable while it runs and an interrupted run loses nothing but time.
"""
from datetime import datetime, timedelta, timezone

from django.db import connection, transaction

from delayqueue.messagelog import sql


def prune_log(older_than: timedelta, batch: int = 5000, on_batch=None) -> tuple[int, int]:
    """Deletes ended messages last changed before now - older_than, and their history.
    Returns (messages, history rows) deleted."""
    cutoff = datetime.now(timezone.utc) - older_than
    messages = events = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.DELETE_ENDED_MESSAGES, [cutoff, batch])
            keys = cursor.fetchall()
            if keys:
                cursor.execute(sql.DELETE_HISTORY, [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                                                cutoff])
                events += cursor.rowcount
        messages += len(keys)
        if on_batch:
            on_batch(messages, events)
        if len(keys) < batch:
            return messages, events
