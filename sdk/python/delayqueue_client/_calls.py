"""The API's calls, defined once for Client and AsyncClient: each method builds a Call (endpoint,
JSON body, how to read the answer, whether it may be retried) and hands it to the client's `_run`,
which sends it (Client) or returns the coroutine that sends it (AsyncClient)."""
import json
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple
from urllib.parse import urlsplit

from delayqueue_client._http import MaybeSent, NotSent, TransportError
from delayqueue_client.errors import DelayQueueError, ServerError, error_from_answer
from delayqueue_client.message import Message, new_msg_id

API_PATH = "/camellia/delayQueue/"
DEFAULT_URL = "http://127.0.0.1:8000"  # ./dev run's address
MAX_REASON = 200  # characters of a nack's reason the server keeps (its MAX_EVENT_DETAIL); more is code 400
_RAISE = object()

# setTopicConfig's settings by set_topic_config's keyword names.
TOPIC_SETTINGS = {
    "ttl_ms": "ttlMillis", "max_retry": "maxRetry", "ack_timeout_ms": "ackTimeoutMillis",
    "retry_backoff_ms": "retryBackoffMillis", "retry_backoff_max_ms": "retryBackoffMaxMillis",
    "dead_letter": "deadLetter", "produce_rate_per_second": "produceRatePerSecond",
    "consume_rate_per_second": "consumeRatePerSecond", "max_live_messages": "maxLiveMessages",
    "push_url": "pushUrl", "push_concurrency": "pushConcurrency", "push_timeout_ms": "pushTimeoutMillis",
    "push_rate_per_second": "pushRatePerSecond", "rotate_push_secret": "rotatePushSecret",
}
# A call that may make a push signing secret is not sent twice: the secret it answers is shown once.
_MAKES_SECRET = ("push_url", "rotate_push_secret")


class DeadLetterPage(NamedTuple):
    messages: list[Message]
    next_cursor: str | None  # None on the last page


@dataclass(frozen=True)
class Call:
    endpoint: str
    body: dict | list
    parse: Callable[[dict], Any]
    idempotent: bool
    not_found: Any = _RAISE  # what a 404 answers instead of raising NotFound
    extra_timeout: float = 0.0  # a long poll's wait, on top of the client's timeout


def answer_of(status: int, content: bytes) -> dict:
    """The envelope of a response; a non-JSON or non-200 HTTP answer (a proxy's 502, say) as ServerError."""
    try:
        answer = json.loads(content)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("code"), int):
        raise ServerError(f"unexpected HTTP {status} answer, not the API's envelope")
    return answer


def transient(code: int, msg: str) -> bool:
    """A 500 saying a store is unavailable (`redis unavailable: ...`): worth another try."""
    return code == 500 and "unavailable" in msg


def result_of(call: Call, answer: dict) -> Any:
    if answer["code"] == 200:
        return call.parse(answer)
    if answer["code"] == 404 and call.not_found is not _RAISE:
        return call.not_found
    raise error_from_answer(answer)


def send_body(topic: str, msg: str, *, delay_ms: int | None = None, trigger_time: int | None = None,
              msg_id: str | None = None, ttl_ms: int | None = None, max_retry: int | None = None,
              priority: int | None = None) -> dict:
    """sendMsg's JSON object; a msgId is made here when none is given, so every send can be retried.
    Neither delay_ms nor trigger_time: due now (the API needs one of them)."""
    if not isinstance(msg, str):
        raise TypeError(f"msg must be a str, got {type(msg).__name__} (encode it, e.g. json.dumps)")
    body = {"topic": topic, "msg": msg, "msgId": msg_id or new_msg_id()}
    if delay_ms is None and trigger_time is None:
        delay_ms = 0
    for key, value in (("delayMillis", delay_ms), ("triggerTime", trigger_time), ("ttlMillis", ttl_ms),
                       ("maxRetry", max_retry), ("priority", priority)):
        if value is not None:
            body[key] = value
    return body


def batch_results(answer: dict) -> list:
    """sendMsgBatch's results: per message its Message or its error (not raised)."""
    return [Message.from_api(r["delayMsg"]) if r["code"] == 200 else error_from_answer(r)
            for r in answer["results"]]


def merge_batch(results: list, todo: list[int], answered: list | DelayQueueError, retry: bool) -> list[int]:
    """Puts a sendMsgBatch answer for the positions `todo` into `results`; answers the positions a
    store was unavailable for (an item's own 500 in a 200 answer), to send again when `retry`.
    A resend that failed as a whole (`answered` is its error) is each of its positions' error:
    the positions an earlier answer stored keep their messages."""
    if isinstance(answered, DelayQueueError):
        for position in todo:
            results[position] = answered
        return []
    again = []
    for position, result in zip(todo, answered):
        results[position] = result
        if retry and isinstance(result, DelayQueueError) and transient(result.code, result.msg):
            again.append(position)
    return again


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential with full jitter, so clients that failed together do not retry together."""
    return random.uniform(0, min(cap, base * 2 ** attempt))


def _without_none(**fields) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


class Calls:
    """The methods of Client and AsyncClient (AsyncClient's answer awaitables of the same values)."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_retries: int = 4, backoff_base: float = 0.1, backoff_max: float = 2.0):
        self.base_url = (base_url or os.environ.get("DELAYQUEUE_URL") or DEFAULT_URL).rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the server URL must be http(s)://host[:port][/prefix], got {self.base_url!r}")
        token = token if token is not None else os.environ.get("DELAYQUEUE_TOKEN")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base, self.backoff_max = backoff_base, backoff_max

    def __repr__(self):  # never the token
        return f"{type(self).__name__}({self.base_url!r})"

    def _retry_after(self, call: Call, attempt: int, exc: BaseException | None, answer: dict | None) -> float | None:
        """Seconds to wait before attempt+1, or None when this outcome is final."""
        if attempt >= self.max_retries:
            return None
        if exc is not None:  # a request that may have reached the server is sent again only when idempotent
            retry = isinstance(exc, NotSent) or (call.idempotent and isinstance(exc, MaybeSent))
        else:
            retry = call.idempotent and transient(answer["code"], str(answer.get("msg", "")))
        return backoff(attempt, self.backoff_base, self.backoff_max) if retry else None

    def _after_attempt(self, call: Call, attempt: int,
                       posted: tuple[int, bytes] | TransportError) -> tuple[Any, float | None]:
        """What one attempt of `call` came to, for Client._run and AsyncClient._run: (its result,
        None) when final, (None, seconds to wait) when worth another; raises the call's error
        when final. `posted`: the HTTP status and content, or why there was none."""
        if isinstance(posted, TransportError):
            wait = self._retry_after(call, attempt, posted, None)
            if wait is None:
                raise ServerError(f"delayqueue server unreachable: {posted}") from posted
            return None, wait
        answer = answer_of(*posted)
        wait = self._retry_after(call, attempt, None, answer)
        return (result_of(call, answer), None) if wait is None else (None, wait)

    def _run(self, call: Call):
        raise NotImplementedError

    # --- messages

    def send(self, topic: str, msg: str, *, delay_ms: int | None = None, trigger_time: int | None = None,
             msg_id: str | None = None, ttl_ms: int | None = None, max_retry: int | None = None,
             priority: int | None = None) -> Message:
        body = send_body(topic, msg, delay_ms=delay_ms, trigger_time=trigger_time, msg_id=msg_id, ttl_ms=ttl_ms,
                         max_retry=max_retry, priority=priority)
        return self._run(Call("sendMsg", body, lambda a: Message.from_api(a["delayMsg"]), idempotent=True))

    def send_many(self, items: list[dict]) -> list[Message | DelayQueueError]:
        """One sendMsgBatch of dicts with send()'s keyword names; per item its Message or its error
        (an item a store was unavailable for is retried as a call is)."""
        return self._send_batch([send_body(**item) for item in items])

    def _send_batch(self, bodies: list[dict]):
        """sendMsgBatch of these bodies; items a store was unavailable for are sent again (same msgIds)."""
        raise NotImplementedError

    @staticmethod
    def _batch_call(bodies: list[dict], todo: list[int]) -> Call:
        return Call("sendMsgBatch", [bodies[i] for i in todo], batch_results, idempotent=True)

    def get(self, topic: str, msg_id: str) -> Message | None:
        return self._run(Call("getMsg", {"topic": topic, "msgId": msg_id}, lambda a: Message.from_api(a["delayMsg"]),
                              idempotent=True, not_found=None))

    def delete(self, topic: str, msg_id: str, *, release: bool = False) -> bool:
        """True when deleted; False when missing or already ended."""
        return self._run(Call("deleteMsg", {"topic": topic, "msgId": msg_id, "release": release}, lambda a: True,
                              idempotent=False, not_found=False))

    def pull(self, topic: str, *, batch: int = 1, ack_timeout_ms: int | None = None,
             wait_ms: int = 0) -> list[Message]:
        """Up to `batch` ready messages; wait_ms > 0 long-polls that long for the first one."""
        body = _without_none(topic=topic, batch=batch, ackTimeoutMillis=ack_timeout_ms)
        endpoint = "pullMsg"
        if wait_ms > 0:
            endpoint, body["longPollingTimeoutMillis"] = "longPollingMsg", wait_ms
        return self._run(Call(endpoint, body, lambda a: [Message.from_api(m) for m in a["delayMsgList"]],
                              idempotent=False, extra_timeout=wait_ms / 1000))

    def ack(self, topic: str, msg_id: str) -> bool:
        return self._run(Call("ackMsg", {"topic": topic, "msgId": msg_id, "ack": True}, lambda a: a["done"],
                              idempotent=False))

    def nack(self, topic: str, msg_id: str, *, delay_ms: int | None = None, dead_letter: bool = False,
             reason: str | None = None) -> bool:
        """Gives the message back (after delay_ms), or ends it as a dead letter. `reason` (at most
        MAX_REASON characters) is kept on the nack's history row: a dead letter's `dead_detail`."""
        body = _without_none(topic=topic, msgId=msg_id, ack=False, delayMillis=delay_ms,
                             deadLetter=True if dead_letter else None, reason=reason or None)
        return self._run(Call("ackMsg", body, lambda a: a["done"], idempotent=False))

    def ack_many(self, topic: str, msg_ids: list[str], *, ack: bool = True, delay_ms: int | None = None,
                 dead_letter: bool = False, reason: str | None = None) -> list[bool]:
        """One ackMsgBatch; `done` per msgId, in order. `reason`: as nack's, for all of them (ack=False)."""
        body = _without_none(topic=topic, msgIds=list(msg_ids), ack=ack, delayMillis=delay_ms,
                             deadLetter=True if dead_letter else None, reason=reason or None)
        return self._run(Call("ackMsgBatch", body, lambda a: [r["done"] for r in a["results"]], idempotent=False))

    def touch(self, topic: str, msg_id: str, *, ack_timeout_ms: int) -> int:
        """Moves a consuming message's ack deadline; answers the new deadline (epoch ms)."""
        body = {"topic": topic, "msgId": msg_id, "ackTimeoutMillis": ack_timeout_ms}
        return self._run(Call("touchMsg", body, lambda a: a["ackDeadline"], idempotent=True))

    def reschedule(self, topic: str, msg_id: str, *, delay_ms: int | None = None,
                   trigger_time: int | None = None) -> Message:
        body = _without_none(topic=topic, msgId=msg_id, delayMillis=delay_ms, triggerTime=trigger_time)
        return self._run(Call("rescheduleMsg", body, lambda a: Message.from_api(a["delayMsg"]), idempotent=False))

    # --- topics

    def topic_info(self, topic: str) -> dict:
        return self._run(Call("getTopicInfo", {"topic": topic}, lambda a: a["data"], idempotent=True))

    def topic_infos(self) -> list[dict]:
        """topic_info of every topic in use, in the order topics were first used."""
        return self._run(Call("getTopicInfoList", {}, lambda a: a["data"], idempotent=True))

    def topic_config(self, topic: str) -> dict:
        return self._run(Call("getTopicConfig", {"topic": topic}, lambda a: a["data"], idempotent=True))

    def set_topic_config(self, topic: str, **settings) -> dict:
        """Changes the settings given (keywords: TOPIC_SETTINGS' keys); answers all of them in force,
        with "pushSecret" when the call made a push signing secret (docs/push.md)."""
        unknown = sorted(set(settings) - set(TOPIC_SETTINGS))
        if unknown:
            raise TypeError(f"unknown topic setting {', '.join(unknown)}; known: {', '.join(TOPIC_SETTINGS)}")
        body = {"topic": topic, **{TOPIC_SETTINGS[k]: v for k, v in settings.items()}}
        return self._run(Call("setTopicConfig", body, lambda a: a["data"],
                              idempotent=not any(k in settings for k in _MAKES_SECRET)))

    def pause(self, topic: str) -> None:
        return self._run(Call("pauseTopic", {"topic": topic}, lambda a: None, idempotent=True))

    def resume(self, topic: str) -> None:
        return self._run(Call("resumeTopic", {"topic": topic}, lambda a: None, idempotent=True))

    def purge(self, topic: str) -> int:
        """Ends every live message of the topic as deleted; answers how many."""
        return self._run(Call("purgeTopic", {"topic": topic}, lambda a: a["count"], idempotent=False))

    # --- dead letters

    def dead_letters(self, topic: str, *, limit: int = 100, cursor: str | None = None) -> DeadLetterPage:
        body = _without_none(topic=topic, limit=limit, cursor=cursor)
        return self._run(Call("getDeadMsgList", body, lambda a: DeadLetterPage(
            [Message.from_api(m) for m in a["delayMsgList"]], a.get("nextCursor")), idempotent=True))

    def redrive(self, topic: str, msg_ids: list[str] | None = None, *, max_per_second: int | None = None) -> int:
        """Starts sending dead letters back (all of the topic's, or msg_ids'); answers the task id."""
        body = _without_none(topic=topic, msgIds=list(msg_ids) if msg_ids is not None else None,
                             maxPerSecond=max_per_second)
        return self._run(Call("redriveDeadMsg", body, lambda a: a["taskId"], idempotent=False))

    def redrive_task(self, task_id: int) -> dict:
        """{"moved", "left", "state"} of a redrive."""
        return self._run(Call("getRedriveTask", {"taskId": task_id},
                              lambda a: {k: a[k] for k in ("moved", "left", "state")}, idempotent=True))

    def purge_dead(self, topic: str, msg_ids: list[str] | None = None) -> int:
        body = _without_none(topic=topic, msgIds=list(msg_ids) if msg_ids is not None else None)
        return self._run(Call("purgeDeadMsg", body, lambda a: a["count"], idempotent=False))
