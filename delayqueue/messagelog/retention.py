"""Retention of the message log: ended messages and their history go after a configurable age.

Deletes in small batches, each its own short transaction (SKIP LOCKED), so the tables stay
writable while it runs and an interrupted run loses nothing but time.
"""
from datetime import datetime, timedelta, timezone

from django.db import connection, transaction

from delayqueue.messagelog.connection import EVENT_TABLE, MESSAGE_TABLE

_DELETE_MESSAGES = f"""
WITH doomed AS (
    SELECT id FROM {MESSAGE_TABLE}
    WHERE status >= 4 AND updated_at < %s
    ORDER BY updated_at LIMIT %s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {MESSAGE_TABLE} m USING doomed WHERE m.id = doomed.id
RETURNING m.namespace, m.topic, m.msg_id
"""
# History of a deleted message (its earlier lives too): the row is gone, and a later life of
# the same msgId would have kept the row alive.
_DELETE_EVENTS = f"""
DELETE FROM {EVENT_TABLE} e USING unnest(%s::text[], %s::text[], %s::text[]) AS d(ns, t, i)
WHERE e.namespace = d.ns AND e.topic = d.t AND e.msg_id = d.i AND e.at < %s
"""


def prune_log(older_than: timedelta, batch: int = 5000, on_batch=None) -> tuple[int, int]:
    """Deletes ended messages last changed before now - older_than, and their history.
    Returns (messages, history rows) deleted."""
    cutoff = datetime.now(timezone.utc) - older_than
    messages = events = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_DELETE_MESSAGES, [cutoff, batch])
            keys = cursor.fetchall()
            if keys:
                cursor.execute(_DELETE_EVENTS, [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                                                cutoff])
                events += cursor.rowcount
        messages += len(keys)
        if on_batch:
            on_batch(messages, events)
        if len(keys) < batch:
            return messages, events
