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


def wait_seconds(*, due_in_us: int, server_now_us: int, sent_at: float, received_at: float) -> float:
    """Seconds from `received_at` until a time Redis said was `due_in_us` away when its clock read
    `server_now_us` (epoch µs), for a call sent at `sent_at` and answered at `received_at` (this
    process' time.time()). Waiting `due_in_us` from the answer wakes late by however long the
    answer took to come back, a few ms on a busy machine; Redis' clock read as ours (one host, one
    clock) does not. Kept within what the round trip allows, so a clock that differs costs at
    most the round trip either way, as before."""
    latest = due_in_us / 1_000_000  # as if the answer came back at once
    earliest = latest - (received_at - sent_at)  # as if the script ran as the call left
    by_clock = (server_now_us + due_in_us) / 1_000_000 - received_at
    return min(latest, max(earliest, by_clock))
