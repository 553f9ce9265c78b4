"""The back-off schedule of calls retried while a store is briefly unreachable (Redis or
PostgreSQL restarting, a connection lost): live/runners.py's script calls and the message
log's writes (messagelog/group_commit.py) wait alike."""
import time

# Back-off between tries of a call that failed transiently (doubling up to the second figure).
FIRST_RETRY_BACKOFF, MAX_RETRY_BACKOFF = 0.01, 0.2


def retry_pauses(deadline: float):
    """The pauses before each retry that fit before `deadline` (time.monotonic()): the first
    FIRST_RETRY_BACKOFF, each next twice the last, at most MAX_RETRY_BACKOFF."""
    pause = FIRST_RETRY_BACKOFF
    while time.monotonic() + pause < deadline:
        yield pause
        pause = min(pause * 2, MAX_RETRY_BACKOFF)
