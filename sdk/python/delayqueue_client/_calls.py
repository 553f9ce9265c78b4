"""The API's calls, defined once for Client and AsyncClient: each method builds a Call (endpoint,
JSON body, how to read the answer, whether it may be retried); the `api` descriptor hands it to the
client's `_run`, which sends it (Client) or returns the coroutine that sends it (AsyncClient), and
types each method accordingly (a Client's answers T, an AsyncClient's an awaitable of T)."""
from __future__ import annotations

import inspect
import json
import math
import os
import random
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar, cast, overload
from urllib.parse import urlsplit

from delayqueue_client._http import (MaybeSent, NotSent, Settings, TransportError, lifted_token, proxy_for,
                                    shown_url, ssl_context, utf8)
from delayqueue_client.errors import (DelayQueueError, MaybeApplied, NotTheAPI, RateLimited, ServerError,
                                      Unavailable, error_from_answer)
from delayqueue_client.message import Message, new_msg_id
from delayqueue_client.middleware import Chain, Middleware, SendContext
from delayqueue_client.schedule import Duration, Instant, Schedule, SchedulePage, given_text, schedule_fields

if TYPE_CHECKING:
    from delayqueue_client.client import AsyncClient, Client

API_PATH = "/camellia/delayQueue/"
DEFAULT_URL = "http://127.0.0.1:8000"  # ./dev run's address
# What a proxy or load balancer answers when the server is down or slow: for an idempotent call,
# worth another try; for another, the request may have been passed on and applied.
PROXY_FAILURES = (502, 503, 504)
# Answers that are not the API's but may pass (a timeout, a proxy's rate limit): treated as a 5xx's.
PASSING_FAILURES = (408, 429)
MAX_REASON = 200  # characters of a nack's reason the server keeps (its MAX_EVENT_DETAIL); more is code 400
_RAISE: Any = object()
T = TypeVar("T")
P = ParamSpec("P")
Body = dict[str, Any]
SendResult = Message | DelayQueueError

# setTopicConfig's settings by set_topic_config's keyword names.
TOPIC_SETTINGS = {
    "ttl_ms": "ttlMillis", "max_retry": "maxRetry", "ack_timeout_ms": "ackTimeoutMillis",
    "retry_backoff_ms": "retryBackoffMillis", "retry_backoff_max_ms": "retryBackoffMaxMillis",
    "dead_letter": "deadLetter", "produce_rate_per_second": "produceRatePerSecond",
    "consume_rate_per_second": "consumeRatePerSecond", "max_live_messages": "maxLiveMessages",
    "push_url": "pushUrl", "push_concurrency": "pushConcurrency", "push_timeout_ms": "pushTimeoutMillis",
    "push_rate_per_second": "pushRatePerSecond", "rotate_push_secret": "rotatePushSecret", "shards": "shards",
}
# A call that may make a push signing secret is not sent twice: the secret it answers is shown once.
_MAKES_SECRET = ("push_url", "rotate_push_secret")
# The task id of a redrive of no msgIds, which is not sent (the API refuses it); the server's start at 1.
_NO_REDRIVE = 0


class DeadLetterPage(NamedTuple):
    messages: list[Message]
    next_cursor: str | None  # None on the last page


@dataclass(frozen=True)
class Call(Generic[T]):
    endpoint: str
    body: Body | list[Body]
    parse: Callable[[Body], T]
    idempotent: bool
    not_found: Any = _RAISE  # what a 404 answers instead of raising NotFound
    extra_timeout: float = 0.0  # a long poll's wait, on top of the client's timeout
    sends: tuple[SendContext, ...] = ()  # a send's, for the middleware's hooks around it
    # The answer known without asking (an empty batch, which the API refuses): nothing is sent.
    known: Body | None = None


class Again(NamedTuple):
    """An attempt worth another after `seconds`."""
    seconds: float


class api(Generic[P, T]):
    """A method of both clients, defined once by the function that builds its Call: on a Client it
    answers the call's result, on an AsyncClient an awaitable of it (and mypy knows which)."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]):
        self._build = build
        self.__doc__, self.__name__ = build.__doc__, build.__name__
        # What help() and inspect show for a client's method: build's parameters after self.
        built = inspect.signature(build)
        self.__signature__ = built.replace(parameters=list(built.parameters.values())[1:],
                                           return_annotation=inspect.Signature.empty)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> api[P, T]: ...

    @overload
    def __get__(self, client: Client, owner: type[Any] | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(self, client: AsyncClient, owner: type[Any] | None = None) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, client: Any, owner: Any = None) -> Any:
        if client is None:
            return self
        build, run = self._build, client._run

        def method(*args: Any, **kwargs: Any) -> Any:
            return run(build(client, *args, **kwargs))
        method.__doc__, method.__name__ = self.__doc__, self.__name__
        method.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return method


def envelope_of(content: bytes) -> Body | None:
    """The API's envelope in a response, or None when it is not one (a proxy's 502 page, say)."""
    try:
        answer = json.loads(content)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and isinstance(answer.get("code"), int) else None


def transient(code: int | None, msg: str) -> bool:
    """A 500 saying a store is unavailable (`redis unavailable: ...`): worth another try."""
    return code == 500 and "unavailable" in msg


def failed(call: Call[Any], failure: TransportError | int) -> ServerError:
    """The error of a call that got no answer of the API: `failure` is why there was none, or the
    HTTP status of an answer that was not the API's envelope. Unavailable when nothing was applied
    or the call is idempotent; MaybeApplied when a call that is not may have been."""
    what = f"HTTP {failure} answer, not the API's envelope" if isinstance(failure, int) else str(failure)
    if isinstance(failure, NotSent) or (call.idempotent and (isinstance(failure, MaybeSent) or failure in PROXY_FAILURES)):
        return Unavailable(f"delayqueue server unreachable: {what}")
    if call.idempotent:
        return ServerError(f"unexpected {what}")
    return MaybeApplied(f"{call.endpoint}: the answer was lost, the call may have been applied: {what}")


def result_of(call: Call[T], answer: Body) -> T:
    if answer["code"] == 200:
        return call.parse(answer)
    if answer["code"] == 404 and call.not_found is not _RAISE:
        return cast(T, call.not_found)
    raise error_from_answer(answer)


def send_body(topic: str, msg: str, *, delay_ms: int | None = None, trigger_time: int | None = None,
              msg_id: str | None = None, ttl_ms: int | None = None, max_retry: int | None = None,
              priority: int | None = None) -> Body:
    """sendMsg's JSON object; a msgId is made here when none is given, so every send can be retried.
    Neither delay_ms nor trigger_time: due now (the API needs one of them). Text UTF-8 cannot
    carry, and options no JSON number holds, are refused here: in a producer's batch they would
    fail the other sends with them."""
    if not isinstance(msg, str):
        raise TypeError(f"msg must be a str, got {type(msg).__name__} (encode it, e.g. json.dumps)")
    body: Body = {"topic": topic, "msg": msg, "msgId": msg_id or new_msg_id()}
    for text in body.values():  # a topic of another type is the server's to refuse
        if isinstance(text, str) and not text.isascii():
            utf8(text)
    if delay_ms is None and trigger_time is None:
        delay_ms = 0
    for key, name, value in (("delayMillis", "delay_ms", delay_ms), ("triggerTime", "trigger_time", trigger_time),
                             ("ttlMillis", "ttl_ms", ttl_ms), ("maxRetry", "max_retry", max_retry),
                             ("priority", "priority", priority)):
        if value is None:
            continue
        if not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a whole number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        body[key] = value
    return body


def batch_results(answer: Body) -> list[SendResult]:
    """sendMsgBatch's results: per message its Message or its error (not raised)."""
    return [Message.from_api(r["delayMsg"]) if r["code"] == 200 else error_from_answer(r)
            for r in answer["results"]]


def merge_batch(results: list[SendResult | None], todo: list[int],
                answered: list[SendResult] | DelayQueueError) -> list[int]:
    """Puts a sendMsgBatch answer for the positions `todo` into `results`; answers the positions
    whose item failed as worth another try (a store unavailable: its own 500; over a rate limit:
    its 429). A resend that failed as a whole (`answered` is its error) is each of its positions'
    error: the positions an earlier answer stored keep their messages."""
    if isinstance(answered, DelayQueueError):
        for position in todo:
            results[position] = answered
        return []
    again = []
    for position, result in zip(todo, answered):
        results[position] = result
        if isinstance(result, RateLimited) or (isinstance(result, DelayQueueError) and transient(result.code, result.msg)):
            again.append(position)
    return again


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential with full jitter, so clients that failed together do not retry together."""
    return random.uniform(0, min(cap, base * 2 ** attempt))


def _without_none(**fields: Any) -> Body:
    return {k: v for k, v in fields.items() if v is not None}


def _message(answer: Body) -> Message:
    return Message.from_api(answer["delayMsg"])


def send_call(body: Body, sends: tuple[SendContext, ...] = ()) -> Call[Message]:
    """sendMsg of one body; `sends`: its middleware context, before_send run."""
    return Call("sendMsg", body, _message, idempotent=True, sends=sends)


def _messages(answer: Body) -> list[Message]:
    return [Message.from_api(m) for m in answer["delayMsgList"]]


def _data(answer: Body) -> Any:
    return answer["data"]


def _schedule(answer: Body) -> Schedule:
    return Schedule.from_api(answer["schedule"])


def _schedule_page(answer: Body) -> SchedulePage:
    return SchedulePage([Schedule.from_api(s) for s in answer["schedules"]], answer.get("nextCursor"))


def _restore_counts(answer: Body) -> dict[str, int]:
    # leftCold: a server before the cold tier's restore does not send it, and left nothing cold.
    return {**{k: answer[k] for k in ("restored", "alreadyLive", "skipped")}, "leftCold": answer.get("leftCold", 0)}


class Calls:
    """The methods of Client and AsyncClient (AsyncClient's answer awaitables of the same values).

    `timeout` (seconds) bounds each attempt, waiting for a free connection included; `verify`,
    `cert`: TLS (see _http.ssl_context); `proxy` an http:// proxy, else with `trust_env` the
    proxy variables (see _http.proxy_for); `max_connections` open at once."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_retries: int = 4, backoff_base: float = 0.1, backoff_max: float = 2.0,
                 max_retry_after: float = 5.0, verify: bool | str = True, cert: str | tuple[str, str] | None = None,
                 proxy: str | None = None, trust_env: bool = True, max_connections: int = 100,
                 middleware: Sequence[Middleware] = ()):
        # Whitespace around it (a config file's newline) is no URL's; inside, urlsplit drops line
        # breaks while httpx refuses them: refused, so both clients take the same URLs.
        self.base_url = (base_url or os.environ.get("DELAYQUEUE_URL") or DEFAULT_URL).strip().rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.username is not None:  # the token authenticates; a password would show in every error's URL
            raise ValueError("the server URL must hold no user or password: http(s)://host[:port][/prefix] "
                             "(the token, token= or DELAYQUEUE_TOKEN, authenticates)")
        if (parts.scheme not in ("http", "https") or not parts.hostname or not self.base_url.isprintable()
                or " " in self.base_url):
            raise ValueError(f"the server URL must be http(s)://host[:port][/prefix], got {shown_url(self.base_url)!r}")
        if not 0 < timeout < math.inf or max_connections < 1 or max_retries < 0:  # NaN fails the first
            raise ValueError(f"timeout must be above 0 and finite, max_connections at least 1 and max_retries at "
                             f"least 0, got {timeout}, {max_connections} and {max_retries}")
        # The ends' whitespace is no token's: a token read from a secret file often ends with its newline.
        token = (token if token is not None else os.environ.get("DELAYQUEUE_TOKEN") or "").strip()
        if not (token.isascii() and token.isprintable()):  # it could be no header's value; never shown
            raise ValueError("the token must be printable ASCII (DELAYQUEUE_TOKEN or token=): it holds a line break, "
                             "another control character or a non-ASCII one")
        served_url, path_token = lifted_token(self.base_url)
        token = path_token or token  # as the server, which takes the path's token before the header's
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.max_retry_after = max_retry_after
        self._settings = Settings(url=served_url + API_PATH, headers=self._headers, timeout=timeout,
                                  ssl_context=ssl_context(verify, cert),
                                  proxy=proxy_for(self.base_url, proxy, trust_env), max_connections=max_connections)
        self._http = self._new_transport(self._settings)
        self.middleware = Chain(middleware)
        # An AsyncClient's producers, which its aclose() closes first (its closed pool sends nothing more).
        self._producers: weakref.WeakSet[Any] = weakref.WeakSet()

    def _new_transport(self, settings: Settings) -> Any:
        raise NotImplementedError

    def _send_contexts(self, bodies: Sequence[Body],
                       given: Sequence[SendContext | None] | None = None) -> tuple[SendContext, ...]:
        """The middleware's contexts of these sendMsg bodies (none without middleware): those
        `given` (their before_send run by the task layer, which writes their headers into the
        envelope), the others made here and their before_send run."""
        if not self.middleware:
            return ()
        contexts = []
        for body, context in zip(bodies, given or [None] * len(bodies)):
            if context is None:
                context = SendContext(topic=body["topic"], msg_id=body["msgId"])
                self.middleware.before_send(context)
            contexts.append(context)
        return tuple(contexts)

    def _end_sends(self, contexts: Sequence[SendContext], outcome: Sequence[SendResult] | BaseException) -> None:
        """The after_send hooks: each send's Message or error, or one error for them all."""
        for i, context in enumerate(contexts):
            result = outcome if isinstance(outcome, BaseException) else outcome[i]
            if isinstance(result, BaseException):
                self.middleware.after_send(context, None, result)
            else:
                self.middleware.after_send(context, result, None)

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({shown_url(self.base_url)!r})"

    def _after_attempt(self, call: Call[T], attempt: int, posted: tuple[int, bytes] | TransportError) -> T | Again:
        """What one attempt of `call` came to, for Client._run and AsyncClient._run: its result when
        final, Again when worth another; raises the call's error when final. `posted`: the HTTP
        status and content, or why there was none."""
        if isinstance(posted, TransportError):
            failure: TransportError | int = posted
        else:
            answer = envelope_of(posted[1])
            if answer is not None:
                wait = self._answer_wait(call, attempt, answer)
                return result_of(call, answer) if wait is None else Again(wait)
            failure = posted[0]
            if failure < 500 and failure not in PASSING_FAILURES:  # another site's page: the base URL is wrong
                raise NotTheAPI(failure)
        # A request that may have reached the server is sent again only when idempotent.
        if attempt < self.max_retries and (isinstance(failure, NotSent) or call.idempotent):
            return Again(backoff(attempt, self.backoff_base, self.backoff_max))
        raise failed(call, failure) from (failure if isinstance(failure, TransportError) else None)

    def _answer_wait(self, call: Call[Any], attempt: int, answer: Body) -> float | None:
        """Seconds to wait before sending `call` again after this envelope, or None when it is final."""
        if attempt >= self.max_retries:
            return None
        if answer["code"] == 429:  # refused, nothing applied: any call goes again once the limit lets it
            return self._throttle_wait(answer.get("retryAfterMillis"))
        if call.idempotent and transient(answer["code"], str(answer.get("msg", ""))):
            return backoff(attempt, self.backoff_base, self.backoff_max)
        return None

    def _throttle_wait(self, retry_after_ms: object) -> float | None:
        """A 429's retryAfterMillis in seconds when it is worth waiting for. A 429 without it is a cap
        that waiting does not lift; one asking for more than max_retry_after is raised at once. A
        negative one (not ours: a proxy's) is no wait, as time.sleep refuses it."""
        if type(retry_after_ms) is not int or retry_after_ms > self.max_retry_after * 1000:
            return None
        return max(0, retry_after_ms) / 1000

    def _batch_again(self, results: list[SendResult | None], todo: list[int],
                     answered: list[SendResult] | DelayQueueError, attempt: int) -> tuple[list[int], float]:
        """Merges a sendMsgBatch answer (merge_batch); answers the positions to send again and how
        long to wait first (the longest retry-after among them, at least a backoff)."""
        candidates = merge_batch(results, todo, answered)
        if attempt >= self.max_retries:
            return [], 0.0
        again, wait = [], backoff(attempt, self.backoff_base, self.backoff_max)
        for position in candidates:
            result = results[position]
            throttled = self._throttle_wait(result.retry_after_ms) if isinstance(result, RateLimited) else wait
            if throttled is not None:
                again.append(position)
                wait = max(wait, throttled)
        return again, wait

    @staticmethod
    def _batch_call(bodies: list[Body], todo: list[int]) -> Call[list[SendResult]]:
        return Call("sendMsgBatch", [bodies[i] for i in todo], batch_results, idempotent=True)

    # --- messages

    @api
    def send(self, topic: str, msg: str, *, delay_ms: int | None = None, trigger_time: int | None = None,
             msg_id: str | None = None, ttl_ms: int | None = None, max_retry: int | None = None,
             priority: int | None = None) -> Call[Message]:
        body = send_body(topic, msg, delay_ms=delay_ms, trigger_time=trigger_time, msg_id=msg_id, ttl_ms=ttl_ms,
                         max_retry=max_retry, priority=priority)
        return send_call(body, self._send_contexts([body]))

    @api
    def get(self, topic: str, msg_id: str) -> Call[Message | None]:
        return Call("getMsg", {"topic": topic, "msgId": msg_id}, _message, idempotent=True, not_found=None)

    @api
    def delete(self, topic: str, msg_id: str, *, release: bool = False) -> Call[bool]:
        """True when deleted; False when missing or already ended."""
        return Call("deleteMsg", {"topic": topic, "msgId": msg_id, "release": release}, lambda a: True,
                    idempotent=False, not_found=False)

    @api
    def pull(self, topic: str, *, batch: int = 1, ack_timeout_ms: int | None = None,
             wait_ms: int = 0) -> Call[list[Message]]:
        """Up to `batch` ready messages; wait_ms > 0 long-polls that long for the first one."""
        body = _without_none(topic=topic, batch=batch, ackTimeoutMillis=ack_timeout_ms)
        endpoint = "pullMsg"
        if wait_ms > 0:
            endpoint, body["longPollingTimeoutMillis"] = "longPollingMsg", wait_ms
        return Call(endpoint, body, _messages, idempotent=False, extra_timeout=wait_ms / 1000)

    @api
    def ack(self, topic: str, msg_id: str, *, retry: int | None = None) -> Call[bool]:
        """Acks a pulled message; whether it was consuming. `retry`: the pulled message's retry, so
        that a late ack (the message delivered again since) leaves that later delivery alone."""
        body = _without_none(topic=topic, msgId=msg_id, ack=True, retry=retry)
        return Call("ackMsg", body, lambda a: bool(a["done"]), idempotent=False)

    @api
    def nack(self, topic: str, msg_id: str, *, delay_ms: int | None = None, dead_letter: bool = False,
             reason: str | None = None, retry: int | None = None) -> Call[bool]:
        """Gives the message back (after delay_ms), or ends it as a dead letter. `reason` (at most
        MAX_REASON characters) is kept on the nack's history row: a dead letter's `dead_detail`.
        `retry`: as ack's."""
        body = _without_none(topic=topic, msgId=msg_id, ack=False, delayMillis=delay_ms,
                             deadLetter=True if dead_letter else None, reason=reason or None, retry=retry)
        return Call("ackMsg", body, lambda a: bool(a["done"]), idempotent=False)

    @api
    def ack_many(self, topic: str, msg_ids: list[str], *, ack: bool = True, delay_ms: int | None = None,
                 dead_letter: bool = False, reason: str | None = None,
                 retries: list[int | None] | None = None) -> Call[list[bool]]:
        """One ackMsgBatch; `done` per msgId, in order. `reason`: as nack's, for all of them (ack=False);
        `retries`: per msgId, as ack's `retry` (None: any delivery). No msgIds, no call (as send_many)."""
        body = _without_none(topic=topic, msgIds=list(msg_ids), ack=ack, delayMillis=delay_ms,
                             deadLetter=True if dead_letter else None, reason=reason or None,
                             retries=None if retries is None else list(retries))
        return Call("ackMsgBatch", body, lambda a: [bool(r["done"]) for r in a["results"]], idempotent=False,
                    known=None if body["msgIds"] else {"results": []})

    @api
    def touch(self, topic: str, msg_id: str, *, ack_timeout_ms: int, retry: int | None = None) -> Call[int]:
        """Moves a consuming message's ack deadline; answers the new deadline (epoch ms). `retry`: the
        pulled message's retry (Conflict once it was delivered again)."""
        body = _without_none(topic=topic, msgId=msg_id, ackTimeoutMillis=ack_timeout_ms, retry=retry)
        return Call("touchMsg", body, lambda a: int(a["ackDeadline"]), idempotent=True)

    @api
    def reschedule(self, topic: str, msg_id: str, *, delay_ms: int | None = None,
                   trigger_time: int | None = None) -> Call[Message]:
        body = _without_none(topic=topic, msgId=msg_id, delayMillis=delay_ms, triggerTime=trigger_time)
        return Call("rescheduleMsg", body, _message, idempotent=False)

    # --- topics

    @api
    def topic_info(self, topic: str) -> Call[dict[str, Any]]:
        return Call("getTopicInfo", {"topic": topic}, _data, idempotent=True)

    @api
    def topic_infos(self) -> Call[list[dict[str, Any]]]:
        """topic_info of every topic in use, in the order topics were first used."""
        return Call("getTopicInfoList", {}, _data, idempotent=True)

    @api
    def monitor_data(self) -> Call[dict[str, Any]]:
        """getMonitorData's `data`: the last monitor interval's request counters and delays per topic."""
        return Call("getMonitorData", {}, _data, idempotent=True)

    @api
    def topic_config(self, topic: str) -> Call[dict[str, Any]]:
        return Call("getTopicConfig", {"topic": topic}, _data, idempotent=True)

    @api
    def set_topic_config(self, /, topic: str, **settings: Any) -> Call[dict[str, Any]]:
        """Changes the settings given (keywords: TOPIC_SETTINGS' keys); answers all of them in force,
        with "pushSecret" when the call made a push signing secret (docs/push.md)."""
        unknown = sorted(set(settings) - set(TOPIC_SETTINGS))
        if unknown:
            raise TypeError(f"unknown topic setting {', '.join(unknown)}; known: {', '.join(TOPIC_SETTINGS)}")
        body = {"topic": topic, **{TOPIC_SETTINGS[k]: v for k, v in settings.items()}}
        return Call("setTopicConfig", body, _data, idempotent=not any(k in settings for k in _MAKES_SECRET))

    @api
    def pause(self, topic: str) -> Call[None]:
        return Call("pauseTopic", {"topic": topic}, lambda a: None, idempotent=True)

    @api
    def resume(self, topic: str) -> Call[None]:
        return Call("resumeTopic", {"topic": topic}, lambda a: None, idempotent=True)

    @api
    def purge(self, topic: str) -> Call[int]:
        """Ends every live message of the topic as deleted; answers how many."""
        return Call("purgeTopic", {"topic": topic}, lambda a: int(a["count"]), idempotent=False)

    # --- recovery from the message log

    @api
    def restore(self, topic: str | None = None, *, expire: bool = False) -> Call[dict[str, int]]:
        """Puts back into Redis the messages the message log says are live (every topic, or `topic`;
        expire=True also those whose TTL ran out before delivery): {"restored", "alreadyLive",
        "skipped", "leftCold"} (leftCold: waiting beyond the hot window, left in the message log for
        the scanner's loader). Safe to repeat."""
        return Call("restore", _without_none(topic=topic, expire=expire), _restore_counts, idempotent=True)

    @api
    def restore_msg(self, topic: str, msg_id: str, *, expire: bool = False) -> Call[dict[str, int]]:
        """restore() of one message; NotFound when the message log does not have it."""
        return Call("restoreMsg", {"topic": topic, "msgId": msg_id, "expire": expire}, _restore_counts,
                    idempotent=True)

    # --- dead letters

    @api
    def dead_letters(self, topic: str, *, limit: int = 100, cursor: str | None = None) -> Call[DeadLetterPage]:
        body = _without_none(topic=topic, limit=limit, cursor=given_text(cursor, "cursor"))
        return Call("getDeadMsgList", body, lambda a: DeadLetterPage(_messages(a), a.get("nextCursor")),
                    idempotent=True)

    @api
    def redrive(self, topic: str, msg_ids: list[str] | None = None, *,
                max_per_second: int | None = None) -> Call[int]:
        """Starts sending dead letters back (all of the topic's, or msg_ids'); answers the task id
        (msg_ids=[]: none, and no call: task 0, which redrive_task answers done)."""
        body = _without_none(topic=topic, msgIds=list(msg_ids) if msg_ids is not None else None,
                             maxPerSecond=max_per_second)
        return Call("redriveDeadMsg", body, lambda a: int(a["taskId"]), idempotent=False,
                    known={"taskId": _NO_REDRIVE} if body.get("msgIds") == [] else None)

    @api
    def redrive_task(self, task_id: int) -> Call[dict[str, Any]]:
        """{"moved", "left", "state"} of a redrive (task 0, redrive's of no msgIds: done, no call)."""
        return Call("getRedriveTask", {"taskId": task_id}, lambda a: {k: a[k] for k in ("moved", "left", "state")},
                    idempotent=True,
                    known={"moved": 0, "left": 0, "state": "done"} if task_id == _NO_REDRIVE else None)

    @api
    def purge_dead(self, topic: str, msg_ids: list[str] | None = None) -> Call[int]:
        """Removes the topic's dead letters (msg_ids': an empty list is none, and no call); answers how many."""
        body = _without_none(topic=topic, msgIds=list(msg_ids) if msg_ids is not None else None)
        return Call("purgeDeadMsg", body, lambda a: int(a["count"]), idempotent=False,
                    known={"count": 0} if body.get("msgIds") == [] else None)

    # --- schedules

    @api
    def create_schedule(self, schedule_id: str, topic: str, msg: str, *, cron: str | None = None,
                        timezone: str | None = None, every: Duration | None = None, start: Instant | None = None,
                        end: Instant | None = None, catch_up: str | None = None, priority: int | None = None,
                        ttl: Duration | None = None, max_retry: int | None = None,
                        paused: bool | None = None) -> Call[Schedule]:
        """A recurring message of `topic`: one per tick of `cron` (5 fields, in `timezone`, default
        UTC) or every `every` (seconds or a timedelta); exactly one of the two. `start`, `end`: an
        aware datetime or epoch ms. Conflict when schedule_id exists, RateLimited over the
        namespace's cap of schedules, BadRequest naming what the server refused."""
        body = {"scheduleId": schedule_id, **schedule_fields(
            topic=topic, msg=msg, cron=cron, timezone=timezone, every=every, start=start, end=end, catch_up=catch_up,
            priority=priority, ttl=ttl, max_retry=max_retry, paused=paused)}
        return Call("createSchedule", body, _schedule, idempotent=False)

    @api
    def get_schedule(self, schedule_id: str) -> Call[Schedule | None]:
        """The schedule, or None when there is none of that id."""
        return Call("getSchedule", {"scheduleId": schedule_id}, _schedule, idempotent=True, not_found=None)

    @api
    def list_schedules(self, topic: str | None = None, *, limit: int = 100,
                       cursor: str | None = None) -> Call[SchedulePage]:
        """A page of the namespace's schedules (of `topic` if given) in scheduleId order; pass its
        next_cursor as `cursor` for the next page."""
        body = _without_none(topic=topic, limit=limit, cursor=given_text(cursor, "cursor"))
        return Call("listSchedules", body, _schedule_page, idempotent=True)

    @api
    def update_schedule(self, schedule_id: str, *, topic: str | None = None, msg: str | None = None,
                        cron: str | None = None, timezone: str | None = None, every: Duration | None = None,
                        start: Instant | None = None, end: Instant | None = None, catch_up: str | None = None,
                        priority: int | None = None, ttl: Duration | None = None, max_retry: int | None = None,
                        paused: bool | None = None) -> Call[Schedule]:
        """Changes the fields given (create_schedule's; `cron` makes it a cron schedule, `every` an
        interval one; `start=0` or `end=0` removes it). The ticks sent ahead and not yet due are
        withdrawn and the schedule is planned anew. NotFound when there is none of that id."""
        body = {"scheduleId": schedule_id, **schedule_fields(
            topic=topic, msg=msg, cron=cron, timezone=timezone, every=every, start=start, end=end, catch_up=catch_up,
            priority=priority, ttl=ttl, max_retry=max_retry, paused=paused)}
        return Call("updateSchedule", body, _schedule, idempotent=True)

    @api
    def pause_schedule(self, schedule_id: str) -> Call[Schedule]:
        """No tick fires until resume_schedule (the ticks sent ahead are withdrawn); NotFound when none."""
        return Call("pauseSchedule", {"scheduleId": schedule_id}, _schedule, idempotent=True)

    @api
    def resume_schedule(self, schedule_id: str) -> Call[Schedule]:
        """Ticks fire again from now (those that fell while paused do not); NotFound when none."""
        return Call("resumeSchedule", {"scheduleId": schedule_id}, _schedule, idempotent=True)

    @api
    def delete_schedule(self, schedule_id: str) -> Call[bool]:
        """Deletes the schedule and its ticks sent ahead and not yet due: True; False when there was none."""
        return Call("deleteSchedule", {"scheduleId": schedule_id}, lambda a: True, idempotent=False, not_found=False)
