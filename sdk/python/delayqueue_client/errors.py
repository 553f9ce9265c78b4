"""One exception class per answer code of the camellia envelope (HTTP 200, `code`, `msg`), and
the errors of a call that got no answer of the API (Unavailable, MaybeApplied, NotTheAPI), and the
exceptions a worker's handler raises to steer its message (Retry, DeadLetter)."""
import math
from datetime import timedelta
from typing import Any


class DelayQueueError(Exception):
    """An error answer of the server, or a server that could not be reached (code None)."""

    code: int | None = None

    def __init__(self, msg: str, *, code: int | None = None):
        super().__init__(msg)
        self.msg = msg
        if code is not None:
            self.code = code


class BadRequest(DelayQueueError):
    code = 400


class Unauthorized(DelayQueueError):
    code = 401


class Forbidden(DelayQueueError):
    code = 403


class NotFound(DelayQueueError):
    code = 404


class Conflict(DelayQueueError):
    code = 409


class RateLimited(DelayQueueError):
    """Over a rate limit or live cap: `retry_after` is in seconds (a float, as HTTP's Retry-After),
    `retry_after_ms` the server's `retryAfterMillis` as it sent it."""

    code = 429

    def __init__(self, msg: str, *, code: int | None = None, retry_after_ms: int | None = None):
        super().__init__(msg, code=code)
        self.retry_after_ms = retry_after_ms
        self.retry_after = retry_after_ms / 1000 if retry_after_ms is not None else None


class ServerError(DelayQueueError):
    """Code 500 (e.g. `redis unavailable: ...`), or no answer of the API (see its two subclasses)."""

    code: int | None = 500


class Unavailable(ServerError):
    """The call did not go through, after the retries: the server could not be reached (nothing
    was sent), or, for an idempotent call, the answer was lost or a proxy answered 502, 503 or 504.
    Nothing of a non-idempotent call was applied, and an idempotent one is safe to make again.
    `code` is None."""

    code = None


class MaybeApplied(ServerError):
    """The answer to a call that is not idempotent (pull, ack, nack, delete, ...) was lost after the
    request may have reached the server (a connection cut, a timeout while waiting, a proxy's 502,
    503 or 504, a failing server's answer that is not the API's): it may or may not have been
    applied, so it was not sent again. Read the state (get) before acting on it. `code` is None."""

    code = None


# Statuses below 500 a proxy in front of the server answers with its own page, the base URL right
# (the queue API answers its own refusals, a body over its cap too, in the envelope).
PROXY_REFUSALS = {
    401: "a proxy in front of the server asks for its own login",
    403: "a proxy in front of the server refused the request",
    407: "the HTTP proxy asks for its own login",
    413: "a proxy in front of the server refused the body size",
}


class NotTheAPI(DelayQueueError):
    """An answer that is not the API's envelope, with an HTTP status below 500 (but 408 and 429):
    the base URL does not lead to the delay queue's API (a wrong path prefix, http where the site
    redirects to https, another site's page), or a proxy in front of it refused the request (401,
    403, 407: its own login; 413: its body cap), as the message says. Nothing was applied; no retry
    changes it, so none is made. `status` is the HTTP status; `code` is None."""

    def __init__(self, status: int):
        cause = PROXY_REFUSALS.get(status, "check the base URL")
        super().__init__(f"HTTP {status} answer, not the delay queue API's: {cause}")
        self.status = status


class DeadLetter(Exception):
    """Raised by a worker's handler: the message ends now as a dead letter instead of being retried;
    `reason` is kept as the dead letter's detail (Message.dead_detail)."""

    def __init__(self, reason: str = ""):
        # As text: `raise DeadLetter(exc)` is common, and the worker cuts and sends the reason as a str.
        self.reason = str(reason)
        super().__init__(self.reason)


class Retry(Exception):
    """Raised by a worker's handler: give the message back to be delivered again after `delay`
    (seconds or a timedelta; None: the topic's retry backoff, or the worker's retry_backoff). It
    counts as a delivery: a message out of retries ends as a dead letter all the same."""

    def __init__(self, delay: float | timedelta | None = None):
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and not 0 <= seconds < math.inf:  # NaN fails it too
            raise ValueError(f"Retry's delay must be a finite number of seconds, not negative, got {delay!r}")
        super().__init__("retry" if seconds is None else f"retry in {seconds:g} s")
        self.delay: float | None = seconds


ERRORS_BY_CODE: dict[int, type[DelayQueueError]] = {
    cls.code: cls for cls in (BadRequest, Unauthorized, Forbidden, NotFound, Conflict, RateLimited, ServerError)
    if cls.code is not None}


def error_from_answer(answer: dict[str, Any]) -> DelayQueueError:
    """The exception of an error answer (or of a sendMsgBatch item): its code's class, or
    DelayQueueError for a code this client does not know."""
    code = answer.get("code")
    msg = str(answer.get("msg") or f"code {code}")
    cls = ERRORS_BY_CODE.get(code, DelayQueueError) if isinstance(code, int) else DelayQueueError
    if cls is RateLimited:
        retry_after = answer.get("retryAfterMillis")
        return RateLimited(msg, retry_after_ms=retry_after if isinstance(retry_after, int) else None)
    return cls(msg, code=code if isinstance(code, int) else None)
