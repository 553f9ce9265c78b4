"""Reads from the PostgreSQL message log for the admin: history, row counts that never
COUNT(*) a big table, and a schedule's tick messages and missed ticks."""
import json
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections

from delayqueue.core.constants import Status
from delayqueue.messagelog import sql
from delayqueue.messagelog.routing import database_of
from delayqueue.models import Message, MessageEvent, ScheduleGap, TopicHourStats

# Filtered lists are counted exactly up to this many rows; beyond it the planner's estimate
# is shown, so a broad filter over millions of rows costs no more than a selective one.
EXACT_COUNT_LIMIT = 1000


def message_history(message: Message):
    """Every logged status change of one message, oldest first (uses the event_once index), from
    the database the message was read from."""
    return MessageEvent.objects.using(message._state.db or database_of(message.namespace)).filter(
        namespace=message.namespace, topic=message.topic, msg_id=message.msg_id
    ).order_by("at", "id")


def recent_topic_hours(namespace: str, topic: str | None = None, hours: int = 24) -> list[TopicHourStats]:
    """The Spark stats job's rows of the `hours` hours up to the newest hour it computed (for any
    topic in scope), newest first; empty when the job has not run. A topic with no rows in that
    window is not shown."""
    rows = (TopicHourStats.objects.using(database_of(namespace)).filter(namespace=namespace)
            .order_by("-hour", "topic"))
    if topic is not None:
        rows = rows.filter(topic=topic)
    latest = rows.values_list("hour", flat=True).first()
    if latest is None:
        return []
    return list(rows.filter(hour__gt=latest - timedelta(hours=hours)))


def table_estimate(model, database: str) -> int:
    """The row count PostgreSQL keeps in pg_class (updated by ANALYZE / autovacuum)."""
    with connections[database].cursor() as cursor:
        cursor.execute(sql.TABLE_ESTIMATE, [model._meta.db_table])
        row = cursor.fetchone()
    return max(row[0], 0) if row else 0


def planner_estimate(queryset) -> int:
    """How many rows PostgreSQL's planner expects the query to return (EXPLAIN, not run)."""
    query, params = queryset.order_by().values("pk").query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql.EXPLAIN_JSON + query, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def estimated_count(queryset) -> int:
    """Exact for small results, estimated for large ones; never a full-table COUNT(*)."""
    if not queryset.query.where:
        estimate = table_estimate(queryset.model, queryset.db)
        if estimate > EXACT_COUNT_LIMIT:
            return estimate
    exact = queryset.order_by().values("pk")[:EXACT_COUNT_LIMIT + 1].count()
    if exact <= EXACT_COUNT_LIMIT:
        return exact
    return max(planner_estimate(queryset), exact)


@dataclass(frozen=True)
class LoggedTick:
    """A schedule tick's message as the log holds it (times in epoch ms)."""

    id: int  # the log row's, for its admin page
    msg_id: str
    status: int
    retry: int
    max_retry: int
    produce_time: int
    updated_at: int
    ready_at: int | None  # when it first became ready; None: never (yet)


def tick_messages(namespace: str, topic: str, msg_ids: list[str]) -> dict[str, LoggedTick]:
    """The log rows of these msgIds of the topic (those it holds), by msgId, each with when it
    first became ready: one statement, probing by msgId."""
    if not msg_ids:
        return {}
    with connections[database_of(namespace)].cursor() as cursor:
        cursor.execute(sql.SCHEDULE_TICK_MESSAGES, {"namespace": namespace, "topic": topic, "msg_ids": list(msg_ids),
                                                    "ready": int(Status.READY)})
        return {row[1]: LoggedTick(*row) for row in cursor.fetchall()}


def schedule_gaps(*, namespace: str, schedule_pk: int, limit: int) -> list[ScheduleGap]:
    """A schedule's latest catch-ups of missed ticks, newest first (on schedule_gap_recent)."""
    gaps = ScheduleGap.objects.using(database_of(namespace)).filter(schedule_id=schedule_pk)
    return list(gaps.order_by("-at")[:limit])
