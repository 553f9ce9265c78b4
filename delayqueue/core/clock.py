"""Epoch milliseconds (the unit of Redis, the HTTP API and the Spark jobs) <-> aware datetimes
(Django's and PostgreSQL's timestamptz). Their SQL pair is messagelog.sql.from_millis / to_millis."""
import time
from datetime import datetime, timedelta, timezone

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MILLISECOND = timedelta(milliseconds=1)


def now_millis() -> int:
    """This process' clock in epoch ms (Redis' clock: services.topics.redis_millis)."""
    return time.time_ns() // 1_000_000


def to_millis(moment: datetime) -> int:
    """Integer arithmetic, exact, where timestamp() * 1000 goes through a float and may land a
    hair below the integer. The log's times are whole milliseconds, so this floor and the SQL's
    rounding agree on them."""
    return (moment - EPOCH) // _MILLISECOND


def from_millis(millis: int | None) -> datetime | None:
    """In UTC; None (a time not set) stays None."""
    return None if millis is None else EPOCH + millis * _MILLISECOND
