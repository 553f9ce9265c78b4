"""The errors the queue reports, and the one mapping from an error to the API's (code, msg).

Services, selectors, the message log and the script wrappers raise these kinds; the API's
single and batch endpoints, the management commands and the admin all word them alike.

An answer says what failed, never where: a store's error text names its host, port or socket
path, so callers get a reason in fixed words (`redis_reason`, `connection_reason`) and the text
itself goes to the log, once per distinct failure and REPEAT_LOG_SECONDS (`log_failure`)."""
import errno
import logging
import re
import time

from redis.exceptions import (AuthenticationError, AuthorizationError, BusyLoadingError, ConnectionError, RedisError,
                              ResponseError, TimeoutError)

log = logging.getLogger(__name__)


# Every code an error answer carries, and what it means: the OpenAPI schema lists them from here,
# and tests/unit/test_api_docs.py holds the README's list and every error kind to it.
ANSWER_CODES = {400: "bad parameter", 401: "not authenticated", 403: "not allowed", 404: "not found",
                409: "conflict: not in a state the call applies to", 429: "too many requests", 500: "server error"}


def answer_codes_text() -> str:
    """The error codes as the API's descriptions list them: `400 bad parameter, ...`."""
    return ", ".join(f"{code} {meaning}" for code, meaning in ANSWER_CODES.items())


class QueueError(Exception):
    """Base of every error the queue reports to a caller; `code` is the API's answer code."""

    code = 500


class BadRequest(QueueError):
    """A parameter or body the API cannot accept; the text names the problem."""

    code = 400


class NotFound(QueueError):
    code = 404


class Conflict(QueueError):
    """The message is not in a status the operation applies to (e.g. touching one not consuming)."""

    code = 409


class Refused(QueueError):
    """The caller is not let in: not authenticated (401), not allowed (403) or throttled (429)."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


class Throttled(Refused):
    """Over a rate limit or a live-message cap (429). The answer says when trying again is worth
    it: `retryAfterMillis` beside code and msg. `limit` names the limit (produce_rate,
    consume_rate, max_live) and `topic` whose it is ('' for the namespace's own)."""

    def __init__(self, msg: str, retry_after_millis: int, *, limit: str, topic: str):
        super().__init__(f"{msg}, retry after {retry_after_millis} ms", 429)
        self.retry_after_millis = retry_after_millis
        self.limit = limit
        self.topic = topic


class CapReached(Refused):
    """Over a cap an operator sets per namespace or per token (code 429), which waiting does not
    lift: the answer names the cap's setting and its value."""

    def __init__(self, msg: str, *, setting: str, cap: int):
        super().__init__(f"{msg}: the cap is {cap} ({setting})", 429)


class Unavailable(QueueError):
    """A store the queue needs could not be reached or refused the work. The message says what
    failed; `detail` (the store's own error text, which may name hosts and ports) is for the log."""

    def __init__(self, msg: str, detail: str = ""):
        super().__init__(msg)
        self.detail = detail


class LogUnavailable(Unavailable):
    """PostgreSQL (the message log) could not be reached or refused the write: nothing was sent."""


class LogUnreachable(LogUnavailable):
    """PostgreSQL could not be reached: the connection was refused or lost, or the server is
    shutting down or starting (a restart). Worth trying again shortly, unlike a statement that
    PostgreSQL refused or timed out. A write whose connection was lost may have committed."""


class LogMaybeWritten(LogUnavailable):
    """PostgreSQL was sent a write and did not answer it (in time, or before the connection was
    lost): it may yet commit it. A send so answered may be delivered; sending it again under the
    same msgId is safe (a live msgId is never enqueued twice)."""


class RedisUnavailable(Unavailable):
    """Redis could not be reached or failed the command."""


class MaybeSent(RedisUnavailable):
    """Redis took the send but did not answer in time: it may have run it (or it ran it, and
    failed to register the message's new topic). Sending again under the same msgId is safe (a
    live msgId is never enqueued twice)."""


# Words in a connection error's text, and the reason answered for them (first match wins).
CONNECTION_REASONS = (
    ("refused", "connection refused"),
    ("timed out", "timed out"), ("timeout", "timed out"), ("no answer", "timed out"), ("did not answer", "timed out"),
    ("authentication", "authentication failed"), ("password", "authentication failed"),
    ("name or service not known", "host name not found"), ("nodename nor servname", "host name not found"),
    ("name resolution", "host name not found"), ("getaddrinfo", "host name not found"),
    ("no route to host", "host unreachable"), ("unreachable", "host unreachable"),
    ("too many", "too many connections"), ("max number of clients", "too many connections"),
    ("no such file", "socket not found"), ("permission denied", "permission denied"),
    ("reset", "connection lost"), ("closed", "connection lost"), ("lost", "connection lost"),
    ("broken pipe", "connection lost"), ("terminat", "connection lost"),
)

# Redis error replies by their first word; other replies answer only that word.
REDIS_REPLY_REASONS = {
    "LOADING": "Redis is loading its data", "OOM": "out of memory (maxmemory)", "READONLY": "read-only replica",
    "BUSY": "busy running a script", "MASTERDOWN": "replica lost its master", "CLUSTERDOWN": "cluster down",
    "NOAUTH": "authentication failed", "WRONGPASS": "authentication failed", "NOPERM": "not permitted",
    "TRYAGAIN": "cluster resharding",
}


# The OS error number in redis-py's and asyncio's texts ("Error 111 connecting to …", "[Errno 111] …").
_ERRNO = re.compile(r"(?:\[Errno |Error )(\d+)")
ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused", errno.ETIMEDOUT: "timed out", errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "host unreachable", errno.ECONNRESET: "connection lost", errno.EPIPE: "connection lost",
    errno.ECONNABORTED: "connection lost", errno.ENOENT: "socket not found", errno.EACCES: "permission denied",
}


def connection_reason(text: str, otherwise: str = "cannot connect") -> str:
    """Why a connection failed, from its error text, in words naming no host, port or path."""
    number = _ERRNO.search(text)
    if number and int(number.group(1)) in ERRNO_REASONS:
        return ERRNO_REASONS[int(number.group(1))]
    text = text.lower()
    return next((reason for words, reason in CONNECTION_REASONS if words in text), otherwise)


def redis_reason(exc: BaseException) -> str:
    """Why a Redis call failed, in words naming no host, port or path."""
    if isinstance(exc, BusyLoadingError):
        return REDIS_REPLY_REASONS["LOADING"]
    if isinstance(exc, (AuthenticationError, AuthorizationError)):
        return "authentication failed"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionError):
        return connection_reason(str(exc))
    if isinstance(exc, ResponseError):  # MOVED and ASK replies name a node: only the first word is answered
        word = (str(exc).split() or ["ERR"])[0]
        return REDIS_REPLY_REASONS.get(word, f"error reply {word}" if word.isupper() else "error reply")
    return type(exc).__name__


def redis_unavailable(exc: RedisError) -> RedisUnavailable:
    return RedisUnavailable(f"redis unavailable: {redis_reason(exc)}", detail=str(exc))


REPEAT_LOG_SECONDS = 10.0
_logged: dict[str, list] = {}  # failure text -> [when last logged (monotonic), times seen since]


def log_failure(where: str, failure: str) -> None:
    """Logs an ERROR for a failure, once per REPEAT_LOG_SECONDS for the same text: with Redis
    down, every request fails alike and the log should say so once, with the count of the rest."""
    now = time.monotonic()
    seen = _logged.get(failure)
    if seen is not None and now - seen[0] < REPEAT_LOG_SECONDS:
        seen[1] += 1
        return
    repeats = f" (and {seen[1]} more like it in the last {now - seen[0]:.0f} s)" if seen and seen[1] else ""
    if len(_logged) > 1000:  # distinct texts (ids, times) must not grow it without end
        _logged.clear()
    _logged[failure] = [now, 0]
    log.error("%s failed: %s%s", where, failure, repeats)


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
            detail = getattr(exc, "detail", "")
            log_failure(where or "request", f"{exc} ({detail})" if detail else str(exc))
        return exc.code, str(exc)
    if isinstance(exc, RedisError):
        answer = redis_unavailable(exc)
        log_failure(where or "request", f"{answer} ({answer.detail})")
        return 500, str(answer)
    log.error("unexpected error in %s", where or "request", exc_info=exc)
    return 500, f"internal error: {type(exc).__name__}"
