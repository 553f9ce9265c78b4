"""A background loop's view of a store it keeps retrying: one log line when it starts failing
(or fails another way), one when it works again, none per retry. A scanner waiting minutes for
Redis or PostgreSQL must say so without writing a line every second."""
import logging
import time

from redis.exceptions import RedisError

from delayqueue.core.exceptions import redis_reason


class Outage:
    def __init__(self, log: logging.Logger, what: str):
        self.log = log
        self.what = what
        self.failure: str | None = None  # the current failure's text; None while it works
        self.since = 0.0

    def failed(self, failure: str) -> None:
        if failure == self.failure:
            return
        if self.failure is None:
            self.since = time.monotonic()
        self.failure = failure
        self.log.warning("%s, retrying: %s", self.what, failure)

    def ok(self) -> None:
        if self.failure is not None:
            self.log.info("%s: working again after %.1f s", self.what, time.monotonic() - self.since)
            self.failure = None


def describe(exc: BaseException) -> str:
    """An error's text for the log: what failed, then the store's own words (where)."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, RedisError):
        return f"redis unavailable: {redis_reason(exc)} ({text})"
    detail = getattr(exc, "detail", "")
    return f"{text} ({detail})" if detail else text
