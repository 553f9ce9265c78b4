"""The errors the queue reports, and the one mapping from an error to the API's (code, msg).

Services, selectors, the message log and the script wrappers raise these kinds; the API's
single and batch endpoints, the management commands and the admin all word them alike."""
import logging

from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class QueueError(Exception):
    """Base of every error the queue reports to a caller; `code` is the API's answer code."""

    code = 500


class BadRequest(QueueError):
    """A parameter or body the API cannot accept; the text names the problem."""

    code = 400


class NotFound(QueueError):
    code = 404


class Refused(QueueError):
    """The caller is not let in: not authenticated (401), not allowed (403) or throttled (429)."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


class Throttled(Refused):
    """Over a rate limit or a live-message cap (429). The answer says when trying again is worth
    it: `retryAfterMillis` beside code and msg."""

    def __init__(self, msg: str, retry_after_millis: int):
        super().__init__(f"{msg}, retry after {retry_after_millis} ms", 429)
        self.retry_after_millis = retry_after_millis


class Unavailable(QueueError):
    """A store the queue needs could not be reached or refused the work."""


class LogUnavailable(Unavailable):
    """PostgreSQL (the message log) could not be reached or refused the write: nothing was sent."""


class RedisUnavailable(Unavailable):
    """Redis could not be reached or failed the command."""


class MaybeSent(RedisUnavailable):
    """Redis took the send but did not answer in time: it may have run it. Sending again under
    the same msgId is safe (a live msgId is never enqueued twice)."""


def redis_unavailable(exc: RedisError) -> RedisUnavailable:
    return RedisUnavailable(f"redis unavailable: {exc}")


def error_body(exc: BaseException, where: str = "") -> dict:
    """The API's whole error answer: code and msg (error_answer's), and for a throttled call
    retryAfterMillis."""
    code, msg = error_answer(exc, where)
    if isinstance(exc, Throttled):
        return {"code": code, "msg": msg, "retryAfterMillis": exc.retry_after_millis}
    return {"code": code, "msg": msg}


def error_answer(exc: BaseException, where: str = "") -> tuple[int, str]:
    """The API's (code, msg) for an error: the queue's own kinds say theirs; anything else is an
    internal error whose details go to the log, not to the caller."""
    if isinstance(exc, QueueError):
        if exc.code >= 500:
            log.error("%s failed: %s", where or "request", exc)
        return exc.code, str(exc)
    if isinstance(exc, RedisError):
        log.error("%s failed: redis unavailable: %s", where or "request", exc)
        return 500, f"redis unavailable: {exc}"
    log.error("unexpected error in %s", where or "request", exc_info=exc)
    return 500, f"internal error: {type(exc).__name__}"
