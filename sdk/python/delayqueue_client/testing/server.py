"""FakeServer: the server's message rules in memory, answering the API's calls (endpoint name and
JSON body) with the envelopes the real server answers. See the package docstring for what it
covers and where it differs."""
import heapq
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from delayqueue_client.client import AsyncClient, Client

from delayqueue_client.testing import rules
from delayqueue_client.testing.clock import FakeClock
from delayqueue_client.testing.transport import AsyncFakeTransport, FakeTransport

WAITING, READY, CONSUMING, ACKED, EXPIRED, EXHAUSTED, DELETED = 1, 2, 3, 4, 5, 6, 7
LIVE = (WAITING, READY, CONSUMING)
DEAD = (EXPIRED, EXHAUSTED)
RETRY_BACKOFF_JITTER = 0.2
# getTopicInfo's waiting-delay buckets: (name, upper bound in ms from now; None: no bound).
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
WAITING_BUCKETS = (("sizeOf0To1min", MINUTE), ("sizeOf1minTo10min", 10 * MINUTE), ("sizeOf10minTo30min", 30 * MINUTE),
                   ("sizeOf30minTo1hour", HOUR), ("sizeOf1hourTo6hour", 6 * HOUR), ("sizeOf6hourTo1day", DAY),
                   ("sizeOf1dayTo7day", 7 * DAY), ("sizeOf7dayTo30day", 30 * DAY), ("sizeOf30dayToInfinite", None))
# What Django answers for a path it has no view for (the API's envelope is only for its endpoints).
NOT_FOUND_PAGE = (b'<!doctype html>\n<html lang="en">\n<head>\n  <title>Not Found</title>\n</head>\n<body>\n'
                  b'  <h1>Not Found</h1><p>The requested resource was not found on this server.</p>\n'
                  b'</body>\n</html>\n')
URL = "http://delayqueue.fake"  # the clients' base URL: no request leaves the process
AnyClient = TypeVar("AnyClient", Client, AsyncClient)
# Timeline events: a waiting message falls due, a consuming one's ack deadline passes, a live one's TTL ends.
DUE, TIMEOUT, EXPIRY = 0, 1, 2
# Schedules: a tick's message is sent this far ahead of the tick (the server's SCHEDULE_LEAD_MILLIS);
# a change withdraws at most this many of the ticks sent ahead (its SCHEDULE_MAX_TICKS_PER_ROUND).
SCHEDULE_LEAD_MILLIS = 10_000
SCHEDULE_MAX_TICKS_PER_ROUND = 1_000
NAMESPACE = "default"  # the server's DELAYQUEUE_NAMESPACE, in its texts
# The fields of a schedule its callers set (the server's services/schedules.SETTABLE).
SCHEDULE_SETTABLE = ("topic", "payload", "cron", "timezone", "every_millis", "start_time", "end_time", "catch_up",
                     "priority", "ttl_millis", "max_retry", "paused")
# A schedule's wire names -> its fields.
SCHEDULE_NAMES = {"topic": "topic", "msg": "payload", "cron": "cron", "timezone": "timezone",
                  "everyMillis": "every_millis", "startTime": "start_time", "endTime": "end_time",
                  "catchUp": "catch_up", "priority": "priority", "ttlMillis": "ttl_millis", "maxRetry": "max_retry",
                  "paused": "paused"}


class Answer(Exception):
    """An error answer: the envelope's code and msg."""

    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code, self.msg = code, msg


@dataclass(frozen=True)
class Settings:
    """The service's defaults and bounds (the server's DELAYQUEUE_* settings of the same names)."""

    ttl_millis: int = 3_600_000
    max_retry: int = 10
    ack_timeout_millis: int = 30_000
    pull_batch: int = 1
    max_pull_batch: int = 1000
    long_polling_timeout_millis: int = 10_000
    max_long_polling_timeout_millis: int = 60_000
    ended_retention_millis: int = 300_000
    max_msg_bytes: int = 1_048_576
    max_batch_send: int = 1000
    dedupe_window_millis: int = 86_400_000
    max_schedules: int = 10_000
    schedule_min_interval_millis: int = 1_000


@dataclass(slots=True)
class Stored:
    """A message as the server keeps it, with the fake's bookkeeping."""

    topic: str
    msg_id: str
    payload: str
    produce_time: int
    trigger_time: int
    expire_time: int
    max_retry: int
    retry: int
    status: int
    priority: int
    version: int = 0  # moves with every change of status or time: older timeline events are stale
    ready_seq: int = 0  # its place among the ready messages of its priority
    deadline: int = 0  # the ack deadline while consuming
    ended_at: int = 0
    end_reason: str = ""
    end_detail: str = ""
    end_seq: int = 0  # orders dead letters that died in the same ms
    released: bool = False  # deleteMsg's release: its body is gone, getMsg no longer finds it
    ttl: int = 0  # as sent: a retry's wait moves triggerTime, not expireTime, and a redrive gives this back

    def wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"topic": self.topic, "msgId": self.msg_id, "msg": self.payload,
                                "produceTime": self.produce_time, "triggerTime": self.trigger_time,
                                "expireTime": self.expire_time, "maxRetry": self.max_retry, "retry": self.retry,
                                "status": self.status}
        if self.priority:
            wire["priority"] = self.priority
        return wire


@dataclass
class FakeSchedule:
    """A schedule as the server keeps it (its Schedule row); `planned_from`: when its current plan
    began, the earliest produceTime of its ticks."""

    schedule_id: str
    topic: str
    payload: str
    cron: str  # "": an interval schedule
    timezone: str
    every_millis: int | None
    start_time: int | None
    end_time: int | None
    catch_up: str
    priority: int
    ttl_millis: int
    max_retry: int
    paused: bool
    generation: int
    planned_until: int
    created_at: int
    updated_at: int
    planned_from: int

    def ticks(self, after: int, until: int, limit: int | None = None) -> list[int]:
        """An interval schedule's ticks in (after, until] within its start and end (a cron
        schedule's: none, the fake has no cron engine)."""
        if self.every_millis is None or self.start_time is None:
            return []
        after = max(after, self.start_time - 1)
        if self.end_time is not None:
            until = min(until, self.end_time)
        return _every_ticks(self.every_millis, self.start_time, after, until, limit)

    def next_fire_times(self, now: int) -> list[int]:
        if self.paused or self.every_millis is None or self.start_time is None:
            return []
        after = max(now, self.start_time - 1)
        ticks = _every_ticks(self.every_millis, self.start_time, after, after + 5 * self.every_millis, 5)
        return [t for t in ticks if self.end_time is None or t <= self.end_time]

    def msg_id(self, tick: int) -> str:
        return f"{self.schedule_id}@{tick}" if self.generation == 0 else f"{self.schedule_id}@{tick}#{self.generation}"

    def settable(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SCHEDULE_SETTABLE}

    def wire(self, now: int) -> dict[str, Any]:
        wire: dict[str, Any] = {"scheduleId": self.schedule_id,
                                **{name: getattr(self, field) for name, field in SCHEDULE_NAMES.items()}}
        if self.cron:
            wire["everyMillis"] = None
        else:
            wire["cron"] = wire["timezone"] = None
        wire.update(nextFireTimes=self.next_fire_times(now), createTime=self.created_at, updateTime=self.updated_at)
        return wire


def _every_ticks(every: int, anchor: int, after: int, until: int, limit: int | None) -> list[int]:
    """anchor + k * every in (after, until], ascending, at most `limit`."""
    first = anchor + ((after - anchor) // every + 1) * every
    if first > until or limit == 0:
        return []
    last = until if limit is None else min(until, first + (limit - 1) * every)
    return list(range(first, last + 1, every))


@dataclass
class Topic:
    name: str
    messages: dict[str, Stored] = field(default_factory=dict)
    ready: list[tuple[int, int, str]] = field(default_factory=list)  # heap of (-priority, ready_seq, msgId)
    settings: dict[str, Any] = field(default_factory=dict)  # setTopicConfig's names, only those set
    paused: bool = False
    registered: bool = False


class FakeServer:
    """The server's rules for messages, topics and dead letters, in memory and on a FakeClock.
    `client()` / `async_client()` answer real clients whose transport is this server."""

    def __init__(self, clock: FakeClock | None = None, *, real_time: bool = False, seed: int | None = None,
                 jitter: bool = True, settings: Settings = Settings(), max_real_wait: float = 0.05):
        self.clock = clock if clock is not None else FakeClock(real_time=real_time)
        self.settings = settings
        # A long poll on a clock that stands still waits at most this many real seconds for a send
        # or an advance (so a Worker notices stop() soon), then answers what it has.
        self.max_real_wait = max_real_wait
        self.jitter = jitter
        self._defaults = {"ttlMillis": settings.ttl_millis, "maxRetry": settings.max_retry,
                          "ackTimeoutMillis": settings.ack_timeout_millis, "retryBackoffMillis": 0,
                          "retryBackoffMaxMillis": rules.RETRY_BACKOFF_MAX_MILLIS}
        self._random = random.Random(seed)
        self._topics: dict[str, Topic] = {}
        self._timeline: list[tuple[int, int, int, str, str, int]] = []  # (at, seq, kind, topic, msgId, version)
        self._seq = itertools.count(1)
        self._redrives: dict[int, int] = {}  # taskId -> messages moved
        self._schedules: dict[str, FakeSchedule] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._faults: list[Fault] = []
        self.calls: list[str] = []  # every endpoint called, in order (the requests a test made)
        self._endpoints: dict[str, Callable[[Any], dict[str, Any]]] = {
            "sendMsg": self._send_msg, "sendMsgBatch": self._send_msg_batch, "pullMsg": self._pull_msg,
            "ackMsg": self._ack_msg, "ackMsgBatch": self._ack_msg_batch, "touchMsg": self._touch_msg,
            "getMsg": self._get_msg, "deleteMsg": self._delete_msg, "rescheduleMsg": self._reschedule_msg,
            "getTopicInfo": self._get_topic_info, "getTopicInfoList": self._get_topic_info_list,
            "getTopicConfig": self._get_topic_config, "setTopicConfig": self._set_topic_config,
            "pauseTopic": self._pause_topic, "resumeTopic": self._resume_topic, "purgeTopic": self._purge_topic,
            "getDeadMsgList": self._get_dead_msg_list, "redriveDeadMsg": self._redrive_dead_msg,
            "getRedriveTask": self._get_redrive_task, "purgeDeadMsg": self._purge_dead_msg,
            "longPollingMsg": self._long_polling_msg, "getMonitorData": self._get_monitor_data,
            "restore": self._restore, "restoreMsg": self._restore_msg,
            "createSchedule": self._create_schedule, "getSchedule": self._get_schedule,
            "listSchedules": self._list_schedules, "updateSchedule": self._update_schedule,
            "pauseSchedule": self._pause_schedule, "resumeSchedule": self._resume_schedule,
            "deleteSchedule": self._delete_schedule,
        }
        self.clock.on_advance(self._advanced)

    # --- clients on it

    def client(self, **options: Any) -> Client:
        """A real Client (options: Client's keywords but the URL) whose calls this server answers."""
        return self.install(Client(URL, **options))

    def async_client(self, **options: Any) -> AsyncClient:
        """A real AsyncClient whose calls this server answers."""
        return self.install(AsyncClient(URL, **options))

    def install(self, client: AnyClient) -> AnyClient:
        """Makes this server answer a client made elsewhere (a subclass of Client or AsyncClient,
        say) from now on; answers the client. Its own connection pool is dropped unused."""
        if isinstance(client, AsyncClient):
            transport: FakeTransport | AsyncFakeTransport = AsyncFakeTransport(self)
        else:
            client._http.close()
            transport = FakeTransport(self)
        # setattr: the attribute's declared type is the HTTP pool, whose post() the transport has.
        setattr(client, "_http", transport)
        return client

    def fail_next(self, endpoint: str | None = None, *, times: int = 1, status: int = 503,
                  content: bytes = b"Service Unavailable", error: type[Exception] | None = None,
                  after_applying: bool = False) -> None:
        """The next `times` calls (of `endpoint`, or any) fail: with an HTTP `status` and `content`
        as a proxy answers, or by raising `error` (delayqueue_client._http.NotSent or MaybeSent) as
        the transport does; `after_applying`: the call is carried out first, then its answer lost. A
        long poll is one call, at its start: one held since before takes none of these."""
        with self._lock:
            self._faults.append(Fault(endpoint, times, status, content, error, after_applying))

    # --- the transport's entry

    def post(self, endpoint: str, body: bytes, *, record: bool = True) -> tuple[int, bytes]:
        """One call as the HTTP layer hands it over: the HTTP status and content of its answer.
        A long poll is answered at once with what is ready: the transports hold it (long_poll).
        `record`: a call, which goes into `calls` and meets fail_next's faults; a long poll's later
        attempts are not calls (a fault for the next call is not taken by one held since before)."""
        with self._lock:
            if not record:
                return self._answer(endpoint, body)
            self.calls.append(endpoint)
            fault = self._fault_for(endpoint)
            if fault is not None and not fault.after_applying:
                return fault.strike()
            answer = self._answer(endpoint, body)
            if fault is not None:
                return fault.strike()
            return answer

    def _answer(self, endpoint: str, body: bytes) -> tuple[int, bytes]:
        handler = self._endpoints.get(endpoint)
        if handler is None:
            return 404, NOT_FOUND_PAGE
        try:
            try:
                params = json.loads(body, object_pairs_hook=_without_repeats) if body else {}
            except ValueError:
                raise Answer(400, "request body is not valid JSON") from None
            self._settle()
            answer = {"code": 200, "msg": "success", **handler(params)}
        except rules.Invalid as exc:
            answer = {"code": 400, "msg": str(exc)}
        except Answer as exc:
            answer = {"code": exc.code, "msg": exc.msg}
        self._changed.notify_all()
        return 200, json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()

    def long_poll(self, body: bytes) -> "LongPoll":
        """A long poll, its parameters read: its attempts (LongPoll.attempt) run until it has
        messages or its time is up."""
        return LongPoll(self, body)

    def _fault_for(self, endpoint: str) -> "Fault | None":
        for fault in self._faults:
            if fault.endpoint in (None, endpoint):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    # --- time

    def _advanced(self) -> None:
        with self._lock:
            self._settle()
            self._changed.notify_all()

    def _schedule(self, m: Stored) -> None:
        """A change of `m`: its earlier timeline events go stale; the ones of its new state are added."""
        m.version = version = next(self._seq)
        # The TTL's own event only when it comes first: else the due or timeout event ends the message.
        if m.status == WAITING:
            at, kind = (m.trigger_time, DUE) if m.trigger_time < m.expire_time else (m.expire_time, EXPIRY)
        elif m.status == CONSUMING:
            at, kind = (m.deadline, TIMEOUT) if m.deadline < m.expire_time else (m.expire_time, EXPIRY)
        elif m.status == READY:
            at, kind = m.expire_time, EXPIRY
        else:
            return
        heapq.heappush(self._timeline, (at, version, kind, m.topic, m.msg_id, version))

    def _settle(self) -> None:
        """Runs what the scanners do, in the order of its times, up to the clock's now: schedules
        send their ticks ahead, due messages become ready, passed ack deadlines give messages
        back, TTLs end them."""
        now = self.clock.now_ms()
        self._plan_schedules(now)
        timeline = self._timeline
        while timeline and timeline[0][0] <= now:
            at, _, kind, topic, msg_id, version = heapq.heappop(timeline)
            m = self._topics[topic].messages.get(msg_id)
            if m is None or m.version != version:
                continue
            if m.expire_time <= at or kind == EXPIRY:
                self._end(m, at, "expired")
            elif kind == DUE:
                self._make_ready(m)
            elif m.retry > m.max_retry:
                self._end(m, at, "retries_exhausted")
            else:
                self._give_back(m, at, self._backoff(m))

    def _backoff(self, m: Stored) -> int:
        base = self._topic_setting(m.topic, "retryBackoffMillis")
        if base <= 0:
            return 0
        wait = min(self._topic_setting(m.topic, "retryBackoffMaxMillis"), base * 2 ** min(max(m.retry - 1, 0), 40))
        return int(wait - wait * RETRY_BACKOFF_JITTER * self._random.random()) if self.jitter else int(wait)

    # --- state changes

    def _make_ready(self, m: Stored, *, keep_place: bool = False) -> None:
        m.status = READY
        if not keep_place:
            m.ready_seq = next(self._seq)
            heapq.heappush(self._topics[m.topic].ready, (-m.priority, m.ready_seq, m.msg_id))
        self._schedule(m)

    def _give_back(self, m: Stored, now: int, delay: int) -> None:
        if delay > 0:
            m.status, m.trigger_time = WAITING, now + delay
            self._schedule(m)
        else:
            self._make_ready(m)

    def _end(self, m: Stored, now: int, reason: str, status: int | None = None, detail: str = "") -> None:
        m.status = status if status is not None else (EXPIRED if m.retry == 0 else EXHAUSTED)
        m.ended_at, m.end_reason, m.end_detail, m.end_seq = now, reason, detail, next(self._seq)
        self._schedule(m)

    # --- helpers

    def _topic(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            topic = self._topics[name] = Topic(name)
        return topic

    def _topic_setting(self, topic: str, name: str) -> int:
        value = self._topic(topic).settings.get(name)
        return int(value) if value is not None else self._defaults[name]

    def _keeps_dead(self, topic: str) -> bool:
        return bool(self._topic(topic).settings.get("deadLetter", True))

    @staticmethod
    def _params(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Answer(400, "request body must be form fields or a JSON object")
        return body

    def _msg_ids_within_limit(self, data: dict[str, Any]) -> dict[str, Any]:
        """Parameters whose msgIds (when given) are at most DELAYQUEUE_MAX_BATCH_SEND, as the server's."""
        count, limit = len(data.get("msgIds") or ()), self.settings.max_batch_send
        if count > limit:
            raise rules.Invalid(f"msgIds: has {count} msgIds, over the limit of {limit}")
        return data

    def _found(self, topic: str, msg_id: str) -> Stored | None:
        """A message the server's Redis holds (getMsg, touchMsg, rescheduleMsg find it): live, or
        ended within the retention and not released."""
        m = self._topic(topic).messages.get(msg_id)
        if m is None or m.released:
            return None
        if m.status not in LIVE and m.ended_at + self.settings.ended_retention_millis <= self.clock.now_ms():
            return None
        return m

    # --- messages

    def _send_one(self, data: dict[str, Any], now: int) -> Stored:
        topic = self._topic(data["topic"])
        topic.registered = True
        msg_id = data.get("msgId") or _new_msg_id(now, self._random)
        old = topic.messages.get(msg_id)
        if old is not None and (old.status in LIVE or (old.status in DEAD and self._keeps_dead(old.topic))
                                or old.ended_at + self.settings.dedupe_window_millis > now):
            return old
        trigger = data["triggerTime"] if data["triggerTime"] is not None else now + data["delayMillis"]
        trigger = max(trigger, now)
        ttl = data["ttlMillis"] if data["ttlMillis"] > 0 else self._topic_setting(topic.name, "ttlMillis")
        max_retry = data["maxRetry"] if data["maxRetry"] >= 0 else self._topic_setting(topic.name, "maxRetry")
        m = Stored(topic.name, msg_id, data["msg"], now, trigger, trigger + ttl, max_retry, 0, WAITING,
                   data["priority"], ttl=ttl)
        topic.messages[msg_id] = m
        if trigger <= now:
            self._make_ready(m)
        else:
            self._schedule(m)
        return m

    def _send_msg(self, body: Any) -> dict[str, Any]:
        data = rules.checked_send(self._params(body), self.settings.max_msg_bytes)
        return {"delayMsg": self._send_one(data, self.clock.now_ms()).wire()}

    def _send_msg_batch(self, body: Any) -> dict[str, Any]:
        items = body["messages"] if isinstance(body, dict) and "messages" in body else body
        if not isinstance(items, list) or not items:
            raise Answer(400, "body must be a non-empty JSON list of messages")
        if len(items) > self.settings.max_batch_send:
            raise Answer(400, f"batch has {len(items)} messages, over the limit of {self.settings.max_batch_send}")
        now, results = self.clock.now_ms(), []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise rules.Invalid("must be a JSON object")
                data = rules.checked_send(item, self.settings.max_msg_bytes)
            except rules.Invalid as exc:
                results.append({"code": 400, "msg": f"message {i}: {exc}"})
            else:
                results.append({"code": 200, "msg": "success", "delayMsg": self._send_one(data, now).wire()})
        return {"results": results}

    def _pull(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        topic, now = self._topic(data["topic"]), self.clock.now_ms()
        if data["batch"] > self.settings.max_pull_batch:
            raise rules.Invalid(f"batch: must be at most {self.settings.max_pull_batch}")
        if topic.paused:
            return []
        batch = data["batch"] if data["batch"] > 0 else self.settings.pull_batch
        ack_timeout = data["ackTimeoutMillis"]
        if ack_timeout <= 0:
            ack_timeout = self._topic_setting(topic.name, "ackTimeoutMillis")
        out: list[dict[str, Any]] = []
        while topic.ready and len(out) < batch:
            _, seq, msg_id = heapq.heappop(topic.ready)
            m = topic.messages.get(msg_id)
            if m is None or m.status != READY or m.ready_seq != seq:
                continue
            if m.expire_time <= now or m.retry > m.max_retry:
                self._end(m, now, "expired" if m.expire_time <= now else "retries_exhausted")
                continue
            m.status, m.retry, m.deadline = CONSUMING, m.retry + 1, now + ack_timeout
            self._schedule(m)
            out.append(m.wire())
        return out

    def _pull_msg(self, body: Any) -> dict[str, Any]:
        return {"delayMsgList": self._pull(rules.parse(rules.PULL, self._params(body)))}

    def _long_polling_msg(self, body: Any) -> dict[str, Any]:
        return {"delayMsgList": self._pull(rules.parse(rules.LONG_POLL, self._params(body)))}

    def _settle_one(self, topic: str, msg_id: str, data: dict[str, Any], retry: int | None) -> bool:
        """ack or nack (data: ackMsg's parameters) of one message; whether it was consuming (in the
        delivery of `retry`, when given)."""
        m, now = self._topic(topic).messages.get(msg_id), self.clock.now_ms()
        if m is None or m.status != CONSUMING or (retry is not None and retry != m.retry):
            return False
        if data["ack"]:
            self._end(m, now, "acked", ACKED)
        elif data["deadLetter"]:
            self._end(m, now, "dead_lettered", EXHAUSTED, data["reason"])
        elif m.expire_time <= now or m.retry > m.max_retry:
            self._end(m, now, "expired" if m.expire_time <= now else "retries_exhausted", EXHAUSTED, data["reason"])
        else:
            delay = data["delayMillis"]
            self._give_back(m, now, delay if delay >= 0 else self._backoff(m))
        return True

    def _ack_msg(self, body: Any) -> dict[str, Any]:
        data = rules.checked_ack(rules.ACK, self._params(body))
        return {"done": self._settle_one(data["topic"], data["msgId"], data, data["retry"])}

    def _ack_msg_batch(self, body: Any) -> dict[str, Any]:
        data = self._msg_ids_within_limit(rules.checked_ack(rules.ACK_BATCH, self._params(body)))
        retries, seen, results = data["retries"] or [None] * len(data["msgIds"]), set(), []
        for msg_id, retry in zip(data["msgIds"], retries):
            # A msgId given twice is settled (or not) by its first mention only, as the server's one script call does.
            done = msg_id not in seen and self._settle_one(data["topic"], msg_id, data, retry)
            seen.add(msg_id)
            results.append({"msgId": msg_id, "done": done})
        return {"results": results}

    def _touch_msg(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.TOUCH, self._params(body))
        m = self._found(data["topic"], data["msgId"])
        if m is None:
            raise Answer(404, f"message {data['msgId']} not found in topic {data['topic']}")
        if m.status != CONSUMING:
            raise Answer(409, f"message {data['msgId']} is not being consumed (status {m.status}): only a consuming "
                              f"message can be touched")
        if data["retry"] is not None and data["retry"] != m.retry:
            raise Answer(409, f"message {data['msgId']} was delivered again (retry {m.retry}): the delivery of retry "
                              f"{data['retry']} has ended, its ack timeout passed")
        now = self.clock.now_ms()
        m.deadline = now + data["ackTimeoutMillis"]
        self._schedule(m)
        return {"ackDeadline": m.deadline}

    def _get_msg(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.MESSAGE_REF, self._params(body))
        m = self._found(data["topic"], data["msgId"])
        if m is None:
            raise Answer(404, f"message {data['msgId']} not found in topic {data['topic']}")
        return {"delayMsg": m.wire()}

    def _delete_msg(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.DELETE, self._params(body))
        topic = self._topic(data["topic"])
        m = topic.messages.get(data["msgId"])
        deleted = m is not None and m.status in LIVE
        if m is not None and deleted:
            self._end(m, self.clock.now_ms(), "deleted", DELETED)
        if m is not None and data["release"] and m.status not in LIVE:
            m.released = True
        if not deleted:
            raise Answer(404, f"message {data['msgId']} not found or already ended in topic {data['topic']}")
        return {}

    def _reschedule_msg(self, body: Any) -> dict[str, Any]:
        data = rules.checked_reschedule(self._params(body))
        topic, msg_id, now = data["topic"], data["msgId"], self.clock.now_ms()
        m = self._found(topic, msg_id)
        if m is None:
            raise Answer(404, f"message {msg_id} not found in topic {topic}")
        if m.status == CONSUMING:
            raise Answer(409, f"message {msg_id} is being consumed: only a waiting or ready message can be rescheduled")
        if m.status not in LIVE:
            raise Answer(404, f"message {msg_id} has already ended (status {m.status}) in topic {topic}")
        trigger = data["triggerTime"] if data["triggerTime"] is not None else now + data["delayMillis"]
        trigger = max(trigger, now)
        if m.expire_time >= m.trigger_time:  # a TTL ending during a nack's delay or a backoff stays, as the server's
            m.expire_time += trigger - m.trigger_time
        was_ready, m.trigger_time = m.status == READY, trigger
        if trigger > now:
            m.status = WAITING
            self._schedule(m)
        else:
            self._make_ready(m, keep_place=was_ready)
        return {"delayMsg": m.wire()}

    # --- topics

    def _topic_info(self, topic: Topic) -> dict[str, Any]:
        now = self.clock.now_ms()
        live = [m for m in topic.messages.values() if m.status in LIVE]
        waiting = [m.trigger_time - now for m in live if m.status == WAITING]
        buckets, lower = {}, None
        for name, upper in WAITING_BUCKETS:
            buckets[name] = sum(1 for d in waiting if (lower is None or d > lower) and (upper is None or d <= upper))
            lower = upper
        return {"topic": topic.name, "waitingQueueSize": len(waiting), "waitingQueueInfo": buckets,
                "hotWaitingSize": len(waiting), "coldWaitingSize": 0,  # the fake keeps every message hot
                "readyQueueSize": sum(1 for m in live if m.status == READY),
                "ackQueueSize": sum(1 for m in live if m.status == CONSUMING)}

    def _get_topic_info(self, body: Any) -> dict[str, Any]:
        return {"data": self._topic_info(self._topic(rules.parse(rules.TOPIC_ONLY, self._params(body))["topic"]))}

    def _get_topic_info_list(self, body: Any) -> dict[str, Any]:
        return {"data": [self._topic_info(t) for t in self._topics.values() if t.registered]}

    def _config(self, topic: Topic) -> dict[str, Any]:
        s = topic.settings
        return {"topic": topic.name, **{name: self._topic_setting(topic.name, name) for name in (
            "ttlMillis", "maxRetry", "ackTimeoutMillis", "retryBackoffMillis", "retryBackoffMaxMillis")},
            "deadLetter": s.get("deadLetter", True), "paused": topic.paused,
            "produceRatePerSecond": s.get("produceRatePerSecond", 0),
            "consumeRatePerSecond": s.get("consumeRatePerSecond", 0), "maxLiveMessages": s.get("maxLiveMessages", 0),
            "pushUrl": "", "pushConcurrency": s.get("pushConcurrency", 8),
            "pushTimeoutMillis": s.get("pushTimeoutMillis", 10_000), "pushRatePerSecond": s.get("pushRatePerSecond", 0),
            "pushSecretRotating": False, "shards": s.get("shards", 1),
            "drainingShards": []}  # one store holds every message here: nothing drains

    def _get_topic_config(self, body: Any) -> dict[str, Any]:
        return {"data": self._config(self._topic(rules.parse(rules.TOPIC_ONLY, self._params(body))["topic"]))}

    def _set_topic_config(self, body: Any) -> dict[str, Any]:
        data = rules.checked_topic_config(self._params(body))
        if data.get("pushUrl") or data.get("rotatePushSecret"):
            raise Answer(400, "pushUrl: the fake server has no push delivery (delayqueue_client.testing)")
        topic = self._topic(data.pop("topic"))
        back_to_default = {"maxRetry": lambda v: v < 0, "ttlMillis": lambda v: v <= 0,
                           "ackTimeoutMillis": lambda v: v <= 0, "retryBackoffMaxMillis": lambda v: v <= 0}
        for name, value in data.items():
            if name in back_to_default and back_to_default[name](value):
                topic.settings.pop(name, None)
            elif name not in ("pushUrl", "rotatePushSecret"):  # (an empty pushUrl: push stays off)
                topic.settings[name] = value
        return {"data": self._config(topic)}

    def _pause_topic(self, body: Any) -> dict[str, Any]:
        self._topic(rules.parse(rules.TOPIC_ONLY, self._params(body))["topic"]).paused = True
        return {}

    def _resume_topic(self, body: Any) -> dict[str, Any]:
        self._topic(rules.parse(rules.TOPIC_ONLY, self._params(body))["topic"]).paused = False
        return {}

    def _purge_topic(self, body: Any) -> dict[str, Any]:
        topic, now = self._topic(rules.parse(rules.TOPIC_ONLY, self._params(body))["topic"]), self.clock.now_ms()
        live = [m for m in topic.messages.values() if m.status in LIVE]
        for m in live:
            self._end(m, now, "purged", DELETED)
        return {"count": len(live)}

    def _get_monitor_data(self, body: Any) -> dict[str, Any]:
        return {"data": {"requestStatsList": [], "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": []}}

    def _restore(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.RESTORE, self._params(body))
        topics = [self._topic(data["topic"])] if "topic" in data else list(self._topics.values())
        found = [m for t in topics for m in t.messages.values()]
        if "topic" in data and not found:
            raise Answer(404, f"topic {data['topic']} has no messages in the message log")
        return self._restore_counts(found)

    def _restore_msg(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.RESTORE_MSG, self._params(body))
        m = self._topic(data["topic"]).messages.get(data["msgId"])
        if m is None:
            raise Answer(404, f"message {data['msgId']} not found in the message log of topic {data['topic']}")
        return self._restore_counts([m])

    @staticmethod
    def _restore_counts(found: list[Stored]) -> dict[str, Any]:
        """Memory loses nothing: every live message is already live, the rest skipped."""
        live = sum(1 for m in found if m.status in LIVE)
        return {"restored": 0, "alreadyLive": live, "skipped": len(found) - live, "leftCold": 0}

    # --- dead letters

    def _dead(self, topic: str, msg_ids: list[str] | None) -> list[Stored]:
        """The topic's dead letters (those of msg_ids), oldest death first."""
        if not self._keeps_dead(topic):
            return []
        wanted = set(msg_ids) if msg_ids is not None else None
        dead = [m for m in self._topic(topic).messages.values()
                if m.status in DEAD and (wanted is None or m.msg_id in wanted)]
        return sorted(dead, key=lambda m: (m.ended_at, m.end_seq))

    def _get_dead_msg_list(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.DEAD_LIST, self._params(body))
        dead = self._dead(data["topic"], None)
        if "cursor" in data:
            at, seq = (int(part) for part in data["cursor"].split("."))
            dead = [m for m in dead if (m.ended_at * 1000, m.end_seq) > (at, seq)]
        page = dead[:data["limit"]]
        answer: dict[str, Any] = {"delayMsgList": [
            {**m.wire(), "deadReason": m.end_reason, "deadDetail": m.end_detail, "deadTime": m.ended_at}
            for m in page]}
        if len(dead) > len(page):
            answer["nextCursor"] = f"{page[-1].ended_at * 1000}.{page[-1].end_seq}"
        return answer

    def _redrive_dead_msg(self, body: Any) -> dict[str, Any]:
        data = self._msg_ids_within_limit(rules.parse(rules.REDRIVE, self._params(body)))
        dead, now = self._dead(data["topic"], data.get("msgIds")), self.clock.now_ms()
        if not dead:
            raise Answer(404, f"topic {data['topic']} has no such dead letter" if "msgIds" in data
                         else f"topic {data['topic']} has no dead letters")
        for m in dead:  # a new life under the same msgId: ready now, retry 0, its TTL and maxRetry as before
            m.produce_time = m.trigger_time = now
            m.expire_time, m.retry, m.ended_at, m.end_reason, m.end_detail = now + m.ttl, 0, 0, "", ""
            self._make_ready(m)
        task_id = len(self._redrives) + 1
        self._redrives[task_id] = len(dead)
        return {"taskId": task_id}

    def _get_redrive_task(self, body: Any) -> dict[str, Any]:
        task_id = rules.parse(rules.REDRIVE_TASK, self._params(body))["taskId"]
        if task_id not in self._redrives:
            raise Answer(404, f"redrive task {task_id} not found")
        return {"moved": self._redrives[task_id], "left": 0, "state": "done"}

    def _purge_dead_msg(self, body: Any) -> dict[str, Any]:
        data = self._msg_ids_within_limit(rules.parse(rules.PURGE_DEAD, self._params(body)))
        dead, now = self._dead(data["topic"], data.get("msgIds")), self.clock.now_ms()
        for m in dead:  # the server's log ends them as deleted: their msgIds taken for the dedupe window from now
            self._end(m, now, "purged", DELETED)
            m.released = True
        return {"count": len(dead)}


    # --- schedules

    def _plan_schedules(self, now: int) -> None:
        """The planner, as if it never stopped: each interval schedule's ticks up to
        SCHEDULE_LEAD_MILLIS ahead sent as messages (msgId `<scheduleId>@<tick>`, the tick as
        triggerTime), each produced when the planner would have sent it (the lead before its
        tick, not before the plan began); so every tick fires, once, whatever the clock jumped."""
        for schedule in self._schedules.values():
            if schedule.paused:
                continue
            ticks = schedule.ticks(schedule.planned_until, now + SCHEDULE_LEAD_MILLIS)
            for tick in ticks:
                self._send_tick(schedule, tick, min(now, max(tick - SCHEDULE_LEAD_MILLIS, schedule.planned_from)))
            if ticks:
                schedule.planned_until = ticks[-1]

    def _send_tick(self, schedule: FakeSchedule, tick: int, now: int) -> Stored:
        """The tick's message: the tick as its triggerTime, under its msgId."""
        return self._send_one({"topic": schedule.topic, "msgId": schedule.msg_id(tick), "msg": schedule.payload,
                               "delayMillis": None, "triggerTime": tick, "ttlMillis": schedule.ttl_millis,
                               "maxRetry": schedule.max_retry, "priority": schedule.priority}, now)

    def _next_plan_ms(self) -> int | None:
        """When the planner has the next tick to send (SCHEDULE_LEAD_MILLIS before it), if any."""
        ahead = [ticks[0] - SCHEDULE_LEAD_MILLIS for schedule in self._schedules.values() if not schedule.paused
                 for ticks in (schedule.ticks(schedule.planned_until, schedule.planned_until + 2 ** 62, 1),) if ticks]
        return min(ahead, default=None)

    def _schedule_of(self, schedule_id: str) -> FakeSchedule:
        schedule = self._schedules.get(schedule_id)
        if schedule is None:
            raise Answer(404, f"no schedule {schedule_id!r}")
        return schedule

    def _checked_schedule(self, fields: dict[str, Any], now: int, *, must_fire: bool) -> dict[str, Any]:
        """The server's checks across a schedule's fields (services/schedules._checked); an interval
        schedule without a start first fires one interval from now. `must_fire` (a create, an update):
        refused when no tick is left after now by endTime (a cron schedule's: only an endTime past,
        the fake has no cron engine)."""
        cron, every = fields["cron"], fields["every_millis"]
        if bool(cron) == (every is not None):
            raise Answer(400, "give either cron or everyMillis")
        if every is not None:
            least = self.settings.schedule_min_interval_millis
            if every < least:
                raise Answer(400, f"everyMillis must be at least {least} (DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS)")
            if fields["start_time"] is None:
                if fields["end_time"] is not None and fields["end_time"] < now + every:
                    raise Answer(400, "endTime must not be before the first tick, one interval from now (or give "
                                      "startTime)")
                fields = {**fields, "start_time": now + every}
            fields = {**fields, "timezone": rules.INTERVAL_ZONE}
        else:
            rules.check_cron(cron, fields["timezone"])
        if fields["end_time"] is not None and fields["start_time"] is not None \
                and fields["end_time"] < fields["start_time"]:
            raise Answer(400, "endTime must not be before startTime")
        end = fields["end_time"]
        if must_fire and end is not None:
            if end <= now:
                raise Answer(400, "endTime must be in the future: the schedule would never fire")
            start = fields["start_time"]
            if every is not None and not _every_ticks(every, start, max(now, start - 1), end, 1):
                bound = "startTime" if start > now else "now"
                raise Answer(400, f"endTime must not be before the first tick after {bound}: "
                                  "the schedule would never fire")
        return fields

    @staticmethod
    def _schedule_fields(data: dict[str, Any]) -> dict[str, Any]:
        """Validated parameters as a schedule's fields (those given); startTime or endTime 0: none."""
        fields = {field: data[name] for name, field in SCHEDULE_NAMES.items() if name in data}
        for name in ("start_time", "end_time"):
            if fields.get(name) == 0:
                fields[name] = None
        return fields

    def _withdraw(self, schedule: FakeSchedule, now: int) -> dict[int, int]:
        """Deletes the ticks sent ahead and not yet due, the latest first; answers the status of each
        that could not be deleted (delivered, or ended by hand) by its time, as on the server."""
        ended = {}
        for tick in reversed(schedule.ticks(now, schedule.planned_until, SCHEDULE_MAX_TICKS_PER_ROUND)):
            msg_id = schedule.msg_id(tick)
            m = self._topic(schedule.topic).messages.get(msg_id)
            if m is not None and m.status in LIVE:
                self._end(m, now, "deleted", DELETED)
            elif (found := self._found(schedule.topic, msg_id)) is not None:
                ended[tick] = found.status
        return ended

    def _send_past_ended(self, schedule: FakeSchedule, start: int, ended: dict[int, int], now: int) -> None:
        """The server's: the new plan's ticks after `start` up to the latest of `ended` (the old plan's
        that could not be withdrawn), none at a delivered one's time, and one at the time of one ended
        by hand ended at once; so every tick sent ahead is under the current generation."""
        for tick in schedule.ticks(start, max(ended), SCHEDULE_MAX_TICKS_PER_ROUND):
            if ended.get(tick, DELETED) == DELETED:
                sent = self._send_tick(schedule, tick, now)
                if tick in ended:
                    self._end(sent, now, "deleted", DELETED)

    def _take_free_generation(self, schedule: FakeSchedule, now: int) -> None:
        """The server's: moves the schedule's generation on past any whose first ticks' msgIds a
        message of its topic holds (the ticks a schedule deleted under the same scheduleId sent
        ahead stay, deleted, under theirs: dedupe would answer the new ticks with them)."""
        ticks = schedule.ticks(schedule.planned_until, now + 2 * SCHEDULE_LEAD_MILLIS, SCHEDULE_MAX_TICKS_PER_ROUND)
        messages = self._topic(schedule.topic).messages
        while ticks and any(schedule.msg_id(tick) in messages for tick in ticks):
            schedule.generation += 1

    @staticmethod
    def _plan_from(fields: dict[str, Any], now: int) -> int:
        return now if fields["start_time"] is None else max(now, fields["start_time"] - 1)

    def _create_schedule(self, body: Any) -> dict[str, Any]:
        data = rules.checked_create_schedule(self._params(body), self.settings.max_msg_bytes)
        now = self.clock.now_ms()
        given = self._schedule_fields(data)
        fields = self._checked_schedule({
            "topic": given["topic"], "payload": given["payload"], "cron": given.get("cron", ""),
            "timezone": given.get("timezone", "UTC"), "every_millis": given.get("every_millis"),
            "start_time": given.get("start_time"), "end_time": given.get("end_time"),
            "catch_up": given.get("catch_up", "latest"), "priority": given.get("priority", 0),
            "ttl_millis": given.get("ttl_millis", 0), "max_retry": given.get("max_retry", -1),
            "paused": given.get("paused", False)}, now, must_fire=True)
        schedule_id = data["scheduleId"]
        if schedule_id in self._schedules:  # a conflict even at the cap, as on the server
            raise Answer(409, f"schedule {schedule_id!r} exists: updateSchedule changes it")
        if len(self._schedules) >= self.settings.max_schedules:
            raise Answer(429, f"namespace {NAMESPACE!r} has {len(self._schedules)} schedules: the cap is "
                              f"{self.settings.max_schedules} (DELAYQUEUE_MAX_SCHEDULES)")
        schedule = self._schedules[schedule_id] = FakeSchedule(
            schedule_id=schedule_id, generation=0, planned_until=self._plan_from(fields, now), created_at=now,
            updated_at=now, planned_from=now, **fields)
        self._take_free_generation(schedule, now)
        self._plan_schedules(now)
        return {"schedule": schedule.wire(now)}

    def _get_schedule(self, body: Any) -> dict[str, Any]:
        data = rules.parse(rules.SCHEDULE_REF, self._params(body))
        return {"schedule": self._schedule_of(data["scheduleId"]).wire(self.clock.now_ms())}

    def _list_schedules(self, body: Any) -> dict[str, Any]:
        data, now = rules.parse(rules.LIST_SCHEDULES, self._params(body)), self.clock.now_ms()
        after, topic = data.get("cursor", ""), data.get("topic")
        found = [self._schedules[i] for i in sorted(self._schedules)
                 if i > after and (topic is None or self._schedules[i].topic == topic)]
        page = found[:data["limit"]]
        answer: dict[str, Any] = {"schedules": [schedule.wire(now) for schedule in page]}
        if len(found) > len(page):
            answer["nextCursor"] = page[-1].schedule_id
        return answer

    def _change_schedule(self, schedule_id: str, change: Callable[[FakeSchedule], dict[str, Any]], *,
                         must_fire: bool = False) -> dict[str, Any]:
        """The server's change of a schedule: the new fields checked, the ticks sent ahead and not
        yet due withdrawn, the schedule planned anew from now under its next generation."""
        schedule, now = self._schedule_of(schedule_id), self.clock.now_ms()
        fields = self._checked_schedule(change(schedule), now, must_fire=must_fire)
        ended = {} if schedule.paused else self._withdraw(schedule, now)  # nothing is planned while paused
        for name, value in fields.items():
            setattr(schedule, name, value)
        schedule.generation += 1
        start = schedule.planned_until = self._plan_from(fields, now)
        schedule.updated_at = schedule.planned_from = now
        if not schedule.paused:  # a paused one is checked when resumed
            self._take_free_generation(schedule, now)
            if ended:
                schedule.planned_until = max(start, max(ended))
                self._send_past_ended(schedule, start, ended, now)
        self._plan_schedules(now)
        return {"schedule": schedule.wire(now)}

    def _update_schedule(self, body: Any) -> dict[str, Any]:
        data = rules.checked_update_schedule(self._params(body), self.settings.max_msg_bytes)
        changes = self._schedule_fields(data)

        def updated(schedule: FakeSchedule) -> dict[str, Any]:
            fields = {**schedule.settable(), **changes}
            if changes.get("cron"):
                fields["every_millis"] = None
            elif changes.get("every_millis") is not None:
                fields["cron"] = ""
            if not fields["cron"] and changes.get("timezone", rules.INTERVAL_ZONE) != rules.INTERVAL_ZONE:
                raise Answer(400, rules.NOT_AN_INTERVAL_SETTING)
            if bool(fields["cron"]) != bool(schedule.cron) and "start_time" not in changes:
                fields["start_time"] = None  # a cron schedule's earliest tick is not an interval's anchor, nor the reverse
            return fields
        return self._change_schedule(data["scheduleId"], updated, must_fire=True)

    def _pause_schedule(self, body: Any) -> dict[str, Any]:
        schedule_id = rules.parse(rules.SCHEDULE_REF, self._params(body))["scheduleId"]
        return self._change_schedule(schedule_id, lambda schedule: {**schedule.settable(), "paused": True})

    def _resume_schedule(self, body: Any) -> dict[str, Any]:
        schedule_id = rules.parse(rules.SCHEDULE_REF, self._params(body))["scheduleId"]
        return self._change_schedule(schedule_id, lambda schedule: {**schedule.settable(), "paused": False})

    def _delete_schedule(self, body: Any) -> dict[str, Any]:
        schedule_id = rules.parse(rules.SCHEDULE_REF, self._params(body))["scheduleId"]
        schedule = self._schedule_of(schedule_id)
        self._withdraw(schedule, self.clock.now_ms())
        del self._schedules[schedule_id]
        return {}


def _without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused as the server refuses one with a key given twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise rules.Invalid(f"{key}: given more than once in the request body")
        obj[key] = value
    return obj


@dataclass
class Fault:
    """A failure fail_next() planned."""

    endpoint: str | None
    times: int
    status: int
    content: bytes
    error: type[Exception] | None
    after_applying: bool

    def strike(self) -> tuple[int, bytes]:
        if self.error is not None:
            raise self.error("injected by FakeServer.fail_next")
        return self.status, self.content


class LongPoll:
    """A long poll held by a transport: `attempt()` answers the call's HTTP status and content
    once it has messages or its time is up (None: not yet); `wait_seconds()` how long to wait
    before the next attempt, unless the server changes first."""

    def __init__(self, server: FakeServer, body: bytes):
        self._server, self._body, self._monotonic, self._first = server, body, time.monotonic, True
        try:
            params = json.loads(body)
            timeout = int(params.get("longPollingTimeoutMillis") or -1) if isinstance(params, dict) else -1
        except (ValueError, TypeError):
            timeout = -1  # the attempt answers the error
        settings = server.settings
        if timeout <= 0:
            timeout = settings.long_polling_timeout_millis
        timeout = min(timeout, settings.max_long_polling_timeout_millis)
        self._until_ms = server.clock.now_ms() + timeout
        real = timeout / 1000 if server.clock.real_time else min(timeout / 1000, server.max_real_wait)
        self._real_until = self._monotonic() + real

    def attempt(self) -> tuple[int, bytes] | None:
        server = self._server
        with server._lock:
            status, content = server.post("longPollingMsg", self._body, record=self._first)
            self._first = False
            timed_out = server.clock.now_ms() >= self._until_ms or self._monotonic() >= self._real_until
            if status != 200 or timed_out or b'"delayMsgList":[]' not in content:
                return status, content
            return None

    def wait_seconds(self) -> float:
        server = self._server
        with server._lock:
            left = self._real_until - self._monotonic()
            if server.clock.real_time:  # wake when the next message falls due, or a tick is to be sent
                timeline = server._timeline
                wake = [timeline[0][0]] if timeline else []
                wake += [at for at in (server._next_plan_ms(),) if at is not None]
                if wake:
                    left = min(left, max(0.0, (min(wake) - server.clock.now_ms()) / 1000))
        return max(0.0, left)


def _new_msg_id(now: int, rng: random.Random) -> str:
    """A version 7 UUID in 32 hex digits, as the server generates them."""
    value = now << 80 | rng.getrandbits(80)
    value = value & ~(0xF << 76) | 0x7 << 76
    value = value & ~(0x3 << 62) | 0x2 << 62
    return f"{value:032x}"

