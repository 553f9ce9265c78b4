"""The task layer: `App` turns functions into tasks sent as JSON envelopes (envelope.py) and a
Worker that runs them by name.

    app = App(Client())

    @app.task(topic="emails", max_retry=5, retry_backoff=(1, 3600))
    def welcome(user_id: int) -> None: ...

    welcome(7)                                  # runs here, as a plain call
    handle = welcome.send(7)                    # due now; also delay_in, delay_at, send_on_commit, send_many
    welcome.with_options(msg_id="welcome-7").delay_in(timedelta(hours=1), 7)
    app.worker().run()                          # elsewhere: runs welcome(7) when it is due

    @app.task(topic="reports", schedule="0 2 * * *", schedule_timezone="Europe/Berlin")
    def nightly() -> None: ...                  # a scheduled task: the server sends it at each tick
    app.sync_schedules()                        # at deploy: one server schedule per scheduled task

Arguments travel as JSON; a parameter annotated with a pydantic model (or a type containing one,
such as `list[Order] | None`) is validated and dumped on send and validated back into the model
on the worker. pydantic stays optional: it is used only when the task's module has imported it."""
import asyncio
import contextvars
import copy
import functools
import hashlib
import inspect
import logging
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, NamedTuple, NoReturn, ParamSpec, TypeVar

from delayqueue_client._calls import MAX_REASON, Call, send_body, send_call
from delayqueue_client.client import AsyncClient, Client
from delayqueue_client.envelope import MAX_MSG_BYTES, Envelope, EnvelopeError, TaskTooLarge, decode, encode
from delayqueue_client.errors import Conflict, DeadLetter, DelayQueueError, Retry
from delayqueue_client.message import Message, new_msg_id
from delayqueue_client.middleware import SendContext
from delayqueue_client.producer import Producer
from delayqueue_client.schedule import Schedule, duration_ms
from delayqueue_client.worker import Worker, to_thread

log = logging.getLogger("delayqueue_client.app")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Duration = float | timedelta
# A scheduled task's server schedule: "task:<task name>" (schedule_id_for), within the server's
# rule for a scheduleId (1-128 of letters, digits, '.', '_', ':', '-').
SCHEDULE_PREFIX = "task:"
MAX_SCHEDULE_ID_LENGTH = 128
_SCHEDULE_ID = re.compile(r"[A-Za-z0-9._:-]+")
_NOT_IN_SCHEDULE_ID = re.compile(r"[^A-Za-z0-9._:-]+")
_DIGEST_CHARS = 16
MAX_SHAPES = 64  # call shapes a task's _Signature keeps the binding of


class TaskStatus(StrEnum):
    """Where a sent task is, in the server's message statuses."""
    WAITING = "waiting"  # before its time (again, after a failed run: waiting for its retry)
    READY = "ready"  # due, waiting for a worker
    RUNNING = "running"  # a worker has it and has not finished
    DONE = "done"  # it ran and returned (acked)
    EXPIRED = "expired"  # its ttl passed before any worker took it
    DEAD = "dead"  # a dead letter: out of retries (or ttl), or DeadLetter raised; see client.dead_letters
    CANCELLED = "cancelled"  # deleted (handle.cancel())
    UNKNOWN = "unknown"  # no such message: never sent, or forgotten after the server's retention


_STATUS_BY_CODE = {1: TaskStatus.WAITING, 2: TaskStatus.READY, 3: TaskStatus.RUNNING, 4: TaskStatus.DONE,
                   5: TaskStatus.EXPIRED, 6: TaskStatus.DEAD, 7: TaskStatus.CANCELLED}


def _seconds(value: Duration, what: str) -> float:
    return duration_ms(value, what) / 1000


def _epoch_ms(when: datetime) -> int:
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"a naive datetime ({when.isoformat()}) has no time zone, so no one instant: give an aware "
                         "one, e.g. datetime.now(timezone.utc) + timedelta(hours=1)")
    return round(when.timestamp() * 1000)


def schedule_id_for(task_name: str) -> str:
    """The scheduleId of a scheduled task's server schedule: `task:<task name>` when that is a
    valid scheduleId (letters, digits, '.', '_', ':', '-'; at most 128 characters, so names of up
    to 123); else `task:<the name, other characters as '-', cut>-<16 hex digits of its SHA-256>`,
    so that two task names never share one."""
    verbatim = SCHEDULE_PREFIX + task_name
    if _SCHEDULE_ID.fullmatch(task_name) and len(verbatim) <= MAX_SCHEDULE_ID_LENGTH:
        return verbatim
    digest = hashlib.sha256(task_name.encode()).hexdigest()[:_DIGEST_CHARS]
    readable = _NOT_IN_SCHEDULE_ID.sub("-", task_name).strip("-")
    room = MAX_SCHEDULE_ID_LENGTH - len(SCHEDULE_PREFIX) - _DIGEST_CHARS - 1
    return f"{SCHEDULE_PREFIX}{readable[:room]}-{digest}" if readable else SCHEDULE_PREFIX + digest


@dataclass(frozen=True)
class _TaskSchedule:
    """A scheduled task's rule: a cron expression in a time zone, or an interval in ms."""
    cron: str | None = None
    timezone: str | None = None
    every_ms: int | None = None


def _task_schedule(schedule: str | Duration | None, timezone: str | None) -> _TaskSchedule | None:
    if schedule is None:
        if timezone is not None:
            raise ValueError("schedule_timezone is the time zone of a cron schedule: give schedule= too")
        return None
    if isinstance(schedule, str):
        if not schedule.strip():
            raise ValueError("schedule: an empty cron expression (5 fields, e.g. \"*/5 * * * *\")")
        return _TaskSchedule(cron=schedule.strip(), timezone=timezone or "UTC")
    if isinstance(schedule, bool) or not isinstance(schedule, (int, float, timedelta)):
        raise TypeError(f"schedule must be a cron expression (str) or an interval (seconds or a timedelta), "
                        f"got {type(schedule).__name__}")
    if timezone is not None:
        raise ValueError("schedule_timezone is for a cron schedule; an interval has no time zone")
    every_ms = duration_ms(schedule, "schedule")
    if every_ms <= 0:
        raise ValueError(f"schedule: an interval must be above 0, got {schedule!r}")
    return _TaskSchedule(every_ms=every_ms)


def _run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """An async task's coroutine run to its end from synchronous code (in a thread of its own when
    this thread already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="delayqueue-task") as pool:
        return pool.submit(asyncio.run, coroutine).result()


@dataclass(frozen=True)
class _Options:
    """A send's message options: the task's, overridden per call by Task.with_options."""
    msg_id: str | None = None
    priority: int | None = None
    ttl: Duration | None = None
    max_retry: int | None = None
    headers: Mapping[str, str] | None = None


class _From(NamedTuple):
    """A marker bound in place of an argument: `source` is its index among the positional
    arguments, or its keyword's name."""
    source: int | str


class _Plan(NamedTuple):
    """Where a call's bound arguments come from (the sources of _From), in bind()'s order."""
    positional: tuple[int | str, ...]
    named: tuple[tuple[str, int | str], ...]


class _Signature:
    """A task function's parameters: binds a call's arguments (a wrong call fails in the sender), and
    converts those of parameters annotated with pydantic models (found on first use, so a model
    defined after the task still counts)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.signature = inspect.signature(fn)
        self._adapters: dict[str, tuple[inspect.Parameter, Any]] | None = None
        # How a call binds depends only on how many positional arguments it has and its keywords'
        # names in order: each shape is bound once (binding was a fifth of a worker's handling of a
        # no-op task, and of a task send's CPU), at most MAX_SHAPES of them (a **kwargs function
        # called with keys made at run time would grow it for ever).
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def adapters(self) -> dict[str, tuple[inspect.Parameter, Any]]:
        if self._adapters is None:
            pydantic = sys.modules.get("pydantic")
            self._adapters = {} if pydantic is None else self._model_adapters(pydantic)
        return self._adapters

    def _model_adapters(self, pydantic: Any) -> dict[str, tuple[inspect.Parameter, Any]]:
        hints = self._type_hints()
        return {name: (param, pydantic.TypeAdapter(hints[name]))
                for name, param in self.signature.parameters.items()
                if name in hints and _mentions(hints[name], pydantic.BaseModel)}

    def _type_hints(self) -> dict[str, Any]:
        """The parameters' annotations, resolved. One that cannot be (a name imported only under
        TYPE_CHECKING, with `from __future__ import annotations`) is left out, not every one with it."""
        try:
            return typing.get_type_hints(self.fn)
        except Exception:
            pass
        hints: dict[str, Any] = {}
        for name, param in self.signature.parameters.items():
            if param.annotation is inspect.Parameter.empty:
                continue
            one = types.SimpleNamespace(__annotations__={name: param.annotation})  # what get_type_hints reads
            try:
                hints.update(typing.get_type_hints(one, globalns=getattr(inspect.unwrap(self.fn), "__globals__", None)))
            except Exception:
                continue
        return hints

    def _converted(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                   convert: Callable[[Any, Any], Any]) -> tuple[list[Any], dict[str, Any]]:
        bound = self.signature.bind(*args, **kwargs)
        for name, (param, adapter) in self.adapters().items():
            if name not in bound.arguments:
                continue
            value = bound.arguments[name]
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(convert(adapter, v) for v in value)
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                bound.arguments[name] = {k: convert(adapter, v) for k, v in value.items()}
            else:
                bound.arguments[name] = convert(adapter, value)
        return list(bound.args), dict(bound.kwargs)

    def _plan(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _Plan:
        """Where bind() puts a call of this shape's arguments; TypeError when they do not fit."""
        shape = (len(args), *kwargs)
        plan = self._plans.get(shape)
        if plan is None:
            bound = self.signature.bind(*map(_From, range(len(args))), **{name: _From(name) for name in kwargs})
            plan = _Plan(tuple(marker.source for marker in bound.args),
                         tuple((name, marker.source) for name, marker in bound.kwargs.items()))
            if len(self._plans) < MAX_SHAPES:
                self._plans[shape] = plan
        return plan

    def dumped(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The arguments to send, as bind() leaves them: models validated and dumped to JSON data.
        TypeError: they do not fit the function; pydantic's ValidationError: a model's data is invalid."""
        if self.adapters():
            return self._converted(args, kwargs, lambda a, v: a.dump_python(a.validate_python(v), mode="json"))
        positional, named = self._plan(args, kwargs)
        return ([args[s] if isinstance(s, int) else kwargs[s] for s in positional],
                {name: args[s] if isinstance(s, int) else kwargs[s] for name, s in named})

    def loaded(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The arguments to call the function with: models rebuilt from their data. TypeError: they
        do not fit the function."""
        if self.adapters():
            return self._converted(args, kwargs, lambda a, v: a.validate_python(v))
        self._plan(args, kwargs)
        return list(args), dict(kwargs)


def _schedule_changes(current: Schedule, wanted: dict[str, Any]) -> dict[str, Any]:
    """update_schedule's keywords making `current` what a task declares (`wanted`, Task._schedule_fields)."""
    changes: dict[str, Any] = {}
    for name in ("topic", "msg", "priority", "max_retry"):
        if getattr(current, name) != wanted[name]:
            changes[name] = wanted[name]
    if current.ttl_ms != wanted["ttl_ms"]:
        changes["ttl"] = timedelta(milliseconds=wanted["ttl_ms"])
    if wanted["cron"] is not None:
        if (current.cron, current.timezone) != (wanted["cron"], wanted["timezone"]):
            changes.update(cron=wanted["cron"], timezone=wanted["timezone"])
    elif current.every_ms != wanted["every_ms"]:
        changes["every"] = timedelta(milliseconds=wanted["every_ms"])
    return changes


def _mentions(annotation: Any, model: type) -> bool:
    """Whether an annotation is a pydantic model or has one inside (Optional, list, Annotated, ...)."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return issubclass(annotation, model)
    return any(_mentions(arg, model) for arg in typing.get_args(annotation))


@contextmanager
def _naming_item(index: int) -> Iterator[None]:
    """A send_many item's error says which item it is (in a traceback's notes): "argument 0" alone
    does not tell one among thousands."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"send_many's item {index}")
        raise


def _dead(reason: str) -> DeadLetter:
    """A message's own text (a task name, a validation error) may be of any length: cut where the
    server bounds a nack's reason (the worker sends no more), marked, so its dead_detail shows it."""
    return DeadLetter(reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 1] + "…")


def _backoff(value: Duration | tuple[Duration, Duration] | None) -> tuple[float, float] | None:
    """retry_backoff as (first delay, largest delay) in seconds."""
    if value is None:
        return None
    first, largest = value if isinstance(value, tuple) else (value, value)
    first_s, largest_s = _seconds(first, "retry_backoff"), _seconds(largest, "retry_backoff")
    if first_s > largest_s:
        raise ValueError(f"retry_backoff: the first delay ({first_s} s) is over the largest ({largest_s} s)")
    return first_s, largest_s


class TaskHandle:
    """A sent task: its `msg_id`, `topic` and `task` name; `status()`, `cancel()`, `reschedule()`
    ask the server (the App's Client)."""

    def __init__(self, app: "App", topic: str, msg_id: str, task: str):
        self._app, self.topic, self.msg_id, self.task = app, topic, msg_id, task

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.task!r}, topic={self.topic!r}, msg_id={self.msg_id!r})"

    def message(self) -> Message | None:
        """The server's message (getMsg), None when it has none of that msgId."""
        return self._app.client.get(self.topic, self.msg_id)

    def status(self) -> TaskStatus:
        message = self.message()
        return TaskStatus.UNKNOWN if message is None else _STATUS_BY_CODE.get(message.status, TaskStatus.UNKNOWN)

    def cancel(self) -> bool:
        """Deletes it (deleteMsg): True when deleted, False when it had already ended or is unknown."""
        return self._app.client.delete(self.topic, self.msg_id)

    def reschedule(self, when: Duration | datetime) -> None:
        """Moves it to run after a delay (seconds or a timedelta; 0: now) or at an aware datetime;
        Conflict while a worker runs it, NotFound once it has ended."""
        if isinstance(when, datetime):
            self._app.client.reschedule(self.topic, self.msg_id, trigger_time=_epoch_ms(when))
        else:
            self._app.client.reschedule(self.topic, self.msg_id, delay_ms=duration_ms(when, "the delay"))


class EagerHandle(TaskHandle):
    """The handle of a task sent in eager mode: it ran in the sender (or runs at the commit, for
    send_on_commit), nothing went to the server. `result` is what the task returned."""

    def __init__(self, app: "App", topic: str, msg_id: str, task: str):
        super().__init__(app, topic, msg_id, task)
        self.ran = False
        self.result: Any = None

    def message(self) -> Message | None:
        return None  # nothing went to the server

    def status(self) -> TaskStatus:
        return TaskStatus.DONE if self.ran else TaskStatus.WAITING

    def cancel(self) -> bool:
        return False

    def reschedule(self, when: Duration | datetime) -> None:
        raise RuntimeError(f"task {self.task} ran eagerly (App eager mode): there is nothing to reschedule")


class Task(Generic[P, R]):
    """A function made a task by `@app.task(...)`. Calling it runs it here, as before. Sending it:

    - `send(*args, **kwargs)`: due now; `delay_in(delay, *args, **kwargs)` (seconds or a timedelta);
      `delay_at(when, *args, **kwargs)` (an aware datetime; a naive one is refused);
    - `send_on_commit(*args, **kwargs)`: sent when the Django transaction open on the default
      database commits, never if it rolls back; its arguments encoded at the call, its middleware
      run at the commit in the call's context, so a trace the caller is in travels with it;
    - `send_many(items)`: one message per item, a tuple of positional arguments or a dict of
      keyword arguments, through the App's batching producer (sendMsgBatch calls, several at
      once); per item its handle or its error (not raised).

    Each answers a TaskHandle. Per-call message options come from `with_options(msg_id=...,
    priority=..., ttl=..., max_retry=..., headers=...)`, which answers the same task with them:
    `task.with_options(msg_id="order-42-cancel").delay_in(1800, 42)`. A msg_id makes the send
    idempotent: a second send of the same msg_id stores nothing new."""

    def __init__(self, app: "App", fn: Callable[P, R], *, name: str, topic: str, options: _Options,
                 retry_backoff: tuple[float, float] | None, schedule: _TaskSchedule | None = None):
        functools.update_wrapper(self, fn)
        self.app, self.fn, self.name, self.topic = app, fn, name, topic
        self.is_async = inspect.iscoroutinefunction(fn)
        self.retry_backoff = retry_backoff
        self._options = options
        self._signature = _Signature(fn)
        self._schedule = schedule
        # The server schedule app.sync_schedules() keeps for it; None for a task without schedule=.
        self.schedule_id: str | None = None if schedule is None else schedule_id_for(name)
        if schedule is not None:
            try:
                self._signature.signature.bind()
            except TypeError as exc:
                raise TypeError(f"task {name}: a scheduled task runs with no arguments, and this function needs "
                                f"some ({exc}): give its parameters defaults") from None

    def __repr__(self) -> str:
        return f"<task {self.name} on topic {self.topic!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def with_options(self, *, msg_id: str | None = None, priority: int | None = None, ttl: Duration | None = None,
                     max_retry: int | None = None, headers: Mapping[str, str] | None = None) -> "Task[P, R]":
        """This task with these options for its next sends (the others as the task sets them)."""
        given: dict[str, Any] = {"msg_id": msg_id, "priority": priority, "ttl": ttl, "max_retry": max_retry,
                                 "headers": headers}
        if ttl is not None:
            _seconds(ttl, "ttl")
        bound = copy.copy(self)
        bound._options = replace(self._options, **{k: v for k, v in given.items() if v is not None})
        return bound

    def send(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        return self.app._send(self, self._options, args, kwargs)

    def delay_in(self, delay: Duration, /, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        return self.app._send(self, self._options, args, kwargs, delay_ms=duration_ms(delay, "the delay"))

    def delay_at(self, when: datetime, /, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        return self.app._send(self, self._options, args, kwargs, trigger_time=_epoch_ms(when))

    def send_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        return self.app._send_on_commit(self, self._options, args, kwargs)

    def send_many(self, items: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[TaskHandle | DelayQueueError]:
        return self.app._send_many(self, self._options, items)

    def retry_delay(self, delivery: int) -> float | None:
        """Seconds before delivery `delivery` + 1 after a failed one (Message.retry counts from 1):
        the retry_backoff's first delay doubled per failed delivery, at most its largest."""
        if self.retry_backoff is None:
            return None
        first, largest = self.retry_backoff
        return min(largest, first * 2.0 ** min(max(delivery - 1, 0), 64))

    def _body(self, options: _Options, args: Sequence[Any], kwargs: Mapping[str, Any],
              headers: Mapping[str, str] | None = None) -> str:
        """The message body; `headers` in place of the options' (what the middleware wrote)."""
        try:
            args_data, kwargs_data = self._signature.dumped(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"task {self.name}: {exc}") from None
        headers = options.headers if headers is None else headers
        return encode(Envelope(self.name, args_data, kwargs_data, dict(headers or {})), max_bytes=self.app.max_msg_bytes)

    def _with_headers(self, body: str, headers: Mapping[str, str] | None) -> str:
        """A body _body encoded, with these headers in place of its own (None: as it is)."""
        if headers is None:
            return body
        return encode(replace(decode(body), headers=dict(headers)), max_bytes=self.app.max_msg_bytes)

    def _schedule_fields(self) -> dict[str, Any]:
        """The fields of its server schedule, as Schedule names them: what sync_schedules keeps."""
        schedule = self._schedule
        assert schedule is not None
        options = self._options
        return {"topic": self.topic, "msg": self._body(_Options(), (), {}), "cron": schedule.cron,
                "timezone": schedule.timezone, "every_ms": schedule.every_ms,
                "priority": options.priority if options.priority is not None else 0,
                "ttl_ms": duration_ms(options.ttl, "ttl") if options.ttl is not None else 0,
                "max_retry": options.max_retry if options.max_retry is not None else -1}

    def _run_body(self, body: str) -> R:
        """Runs the task on a sent body, as a worker does (models rebuilt); for eager mode."""
        envelope = decode(body)
        args, kwargs = self._signature.loaded(envelope.args, envelope.kwargs)
        result = self.fn(*args, **kwargs)
        return _run_coroutine(result) if inspect.iscoroutine(result) else result


class App:
    """`App(client, *, async_client=None, eager=False, default_topic="tasks", max_msg_bytes=1 MiB)`.

    `client` (a Client; None: `Client()` from DELAYQUEUE_URL / DELAYQUEUE_TOKEN, made on first use)
    sends tasks and answers handles. `async_client` (an AsyncClient for the same server) is needed
    only by `worker(asynchronous=True)`. `eager=True` (or `with app.eager():`) runs every send in
    the sender instead, after a JSON round trip of its envelope. `max_msg_bytes` is the server's
    DELAYQUEUE_MAX_MSG_BYTES: a bigger envelope is refused before it is sent (TaskTooLarge)."""

    def __init__(self, client: Client | None = None, *, async_client: AsyncClient | None = None,
                 eager: bool = False, default_topic: str = "tasks", max_msg_bytes: int = MAX_MSG_BYTES):
        self._client, self.async_client = client, async_client
        self._eager = eager
        self.default_topic = default_topic
        self.max_msg_bytes = max_msg_bytes
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._made_producer: Producer | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = Client()
        return self._client

    @property
    def is_eager(self) -> bool:
        return self._eager

    @contextmanager
    def eager(self, enabled: bool = True) -> Iterator["App"]:
        """Eager mode (or not) for the block, for tests: every send runs the task in the sender after
        a JSON round trip of its envelope (so what would not survive the trip fails here too), and
        its errors propagate; delays are ignored and nothing is sent."""
        previous, self._eager = self._eager, enabled
        try:
            yield self
        finally:
            self._eager = previous

    def task(self, *, topic: str | None = None, name: str | None = None, max_retry: int | None = None,
             ttl: Duration | None = None, priority: int | None = None,
             retry_backoff: Duration | tuple[Duration, Duration] | None = None,
             schedule: str | Duration | None = None, schedule_timezone: str | None = None
             ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """The decorator making a plain or async function a task. `topic`: where its messages go
        (several tasks may share one; default the App's default_topic). `name`: what the envelope
        calls it, unique in the app (default `module.qualname`: give one for a function in
        `__main__`, which a worker imports under another name). `max_retry`, `ttl` (seconds or a
        timedelta), `priority`: its messages' (the topic's when None). `retry_backoff`: a delay, or
        (first, largest) doubling per failed run, before a failed run is retried (None: the
        worker's, else the topic's). `schedule`: run it recurrently, with no arguments: a cron
        expression (5 fields, in `schedule_timezone`, an IANA name, default UTC) or an interval
        (seconds or a timedelta); `app.sync_schedules()` makes its server schedule."""
        options = _Options(priority=priority, ttl=ttl, max_retry=max_retry)
        if ttl is not None:
            _seconds(ttl, "ttl")
        backoff = _backoff(retry_backoff)
        task_schedule = _task_schedule(schedule, schedule_timezone)

        def decorate(fn: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            made = Task(self, fn, name=task_name, topic=topic or self.default_topic, options=options,
                        retry_backoff=backoff, schedule=task_schedule)
            with self._lock:
                if task_name in self._tasks:
                    raise ValueError(f"a task named {task_name!r} is already in this app: give one a name=")
                self._tasks[task_name] = made
            return made
        return decorate

    def topics(self) -> list[str]:
        """The topics of the app's tasks, in the order first used."""
        with self._lock:
            return list(dict.fromkeys(task.topic for task in self._tasks.values()))

    def scheduled_tasks(self) -> list[Task[Any, Any]]:
        """The app's tasks declared with schedule=, in the order declared."""
        with self._lock:
            return [task for task in self._tasks.values() if task.schedule_id is not None]

    # --- schedules

    def sync_schedules(self, *, prune: bool = False) -> dict[str, str]:
        """Makes the server hold one schedule per scheduled task, as declared: created when missing,
        updated when its topic, body, rule (cron and time zone, or interval), priority, ttl or
        max_retry differ, else left alone (so a second sync changes nothing, and the ticks already
        planned stay). Its pause, start, end and catch-up are left as they are. `prune=True` also
        deletes the schedules of the app's topics whose scheduleId starts with `task:` that no task
        of this app claims (a scheduled task removed or renamed). Answers per scheduleId what it
        did: "created", "updated", "unchanged" or "deleted". Needs a token with the manage scope;
        in eager mode it sends nothing and answers {}."""
        if self._eager:
            return {}
        client = self.client
        done = {task.schedule_id: self._sync_schedule(client, task) for task in self.scheduled_tasks()
                if task.schedule_id is not None}
        if prune:
            for topic in self.topics():
                cursor: str | None = None
                while True:
                    page = client.list_schedules(topic, limit=1000, cursor=cursor)
                    for schedule in page.schedules:
                        if (schedule.schedule_id.startswith(SCHEDULE_PREFIX) and schedule.schedule_id not in done
                                and client.delete_schedule(schedule.schedule_id)):
                            done[schedule.schedule_id] = "deleted"
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
        return done

    @staticmethod
    def _sync_schedule(client: Client, task: Task[Any, Any]) -> str:
        assert task.schedule_id is not None
        wanted = task._schedule_fields()
        current = client.get_schedule(task.schedule_id)
        if current is None:
            try:
                client.create_schedule(
                    task.schedule_id, wanted["topic"], wanted["msg"], cron=wanted["cron"], timezone=wanted["timezone"],
                    every=None if wanted["every_ms"] is None else timedelta(milliseconds=wanted["every_ms"]),
                    priority=wanted["priority"], ttl=timedelta(milliseconds=wanted["ttl_ms"]),
                    max_retry=wanted["max_retry"])
                return "created"
            except Conflict:  # another process' sync created it meanwhile: compare with that one
                current = client.get_schedule(task.schedule_id)
                if current is None:
                    raise
        changes = _schedule_changes(current, wanted)
        if not changes:
            return "unchanged"
        client.update_schedule(task.schedule_id, **changes)
        return "updated"

    # --- sending

    def _send_options(self, options: _Options) -> dict[str, Any]:
        return {"msg_id": options.msg_id, "priority": options.priority, "max_retry": options.max_retry,
                "ttl_ms": None if options.ttl is None else duration_ms(options.ttl, "ttl")}

    def _send(self, task: Task[Any, Any], options: _Options, args: Sequence[Any], kwargs: Mapping[str, Any], *,
              delay_ms: int | None = None, trigger_time: int | None = None) -> TaskHandle:
        if self._eager:
            return self._ran_eagerly(task, task._body(options, args, kwargs), options.msg_id)
        call = self._send_call(task, options, functools.partial(task._body, options, args, kwargs),
                               delay_ms=delay_ms, trigger_time=trigger_time)
        sent = self.client._run(call)
        return TaskHandle(self, task.topic, sent.msg_id, task.name)

    def _send_call(self, task: Task[Any, Any], options: _Options, body: Callable[[Mapping[str, str] | None], str],
                   delay_ms: int | None = None, trigger_time: int | None = None) -> Call[Message]:
        """The sendMsg call of a task's message, ready to run: the body encoded, the middleware's
        before_send run (in the caller's trace) and the arguments checked now."""
        text, msg_id, sends = self._traced_body(task, options, body)
        request = send_body(task.topic, text, delay_ms=delay_ms, trigger_time=trigger_time,
                            **{**self._send_options(options), "msg_id": msg_id})
        return send_call(request, sends)

    def _traced_body(self, task: Task[Any, Any], options: _Options, body: Callable[[Mapping[str, str] | None], str]
                     ) -> tuple[str, str, tuple[SendContext, ...]]:
        """A send's body (`body(headers)`; None: the options' headers) and msgId, and its middleware
        context when the client has middleware: before_send runs first, so what it writes into the
        headers (a trace's context) travels in the envelope."""
        msg_id = options.msg_id or new_msg_id()
        if not self.client.middleware:
            return body(None), msg_id, ()
        # What send_body refuses (a lone surrogate, an option no number), refused before a send begins.
        send_body(task.topic, "", **{**self._send_options(options), "msg_id": msg_id})
        context = SendContext(topic=task.topic, msg_id=msg_id, task=task.name, headers=dict(options.headers or {}))
        self.client.middleware.before_send(context)
        try:
            try:
                return body(context.headers), msg_id, (context,)
            except TaskTooLarge:
                pass
            # What the middleware wrote (a trace's context) never costs a send that fits without it: nor may it
            # make send_on_commit, whose body was checked at the call, fail at the commit where none can handle it.
            text = body(None)
            log.warning("task %s: its message %s is sent without the middleware's headers, which would put it over "
                        "the server's message size limit (%d bytes)", task.name, msg_id, self.max_msg_bytes)
            return text, msg_id, (context,)
        except BaseException as exc:
            self.client.middleware.after_send(context, None, exc)
            raise

    def _ran_eagerly(self, task: Task[Any, Any], body: str, msg_id: str | None,
                     handle: EagerHandle | None = None) -> EagerHandle:
        handle = handle or EagerHandle(self, task.topic, msg_id or new_msg_id(), task.name)
        handle.result = task._run_body(body)
        handle.ran = True
        return handle

    def _send_on_commit(self, task: Task[Any, Any], options: _Options, args: Sequence[Any],
                        kwargs: Mapping[str, Any]) -> TaskHandle:
        # Django only for send_on_commit: the SDK runs without it.
        from delayqueue_client.django import run_on_commit

        body, msg_id = task._body(options, args, kwargs), options.msg_id or new_msg_id()  # the arguments as called
        if self._eager:
            handle = EagerHandle(self, task.topic, msg_id, task.name)
            run_on_commit(lambda: self._ran_eagerly(task, body, msg_id, handle))
            return handle
        options = replace(options, msg_id=msg_id)
        send_body(task.topic, body, **self._send_options(options))  # what the server would refuse, refused now
        # Sent, and so traced (before_send), only at the commit: after a rollback no after_send would
        # follow. Run in this call's context, so the trace the caller is in travels with it all the same.
        def send() -> None:
            self.client._run(self._send_call(task, options, functools.partial(task._with_headers, body)))
        run_on_commit(functools.partial(contextvars.copy_context().run, send))
        return TaskHandle(self, task.topic, msg_id, task.name)

    def _send_many(self, task: Task[Any, Any], options: _Options,
                   items: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[TaskHandle | DelayQueueError]:
        if options.msg_id is not None:
            raise ValueError(f"task {task.name}: a msg_id names one message, so not one for send_many")
        calls: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
        for item in items:
            if isinstance(item, Mapping):
                calls.append(((), item))
            elif isinstance(item, (str, bytes)) or not isinstance(item, Sequence):
                raise TypeError(f"task {task.name}: send_many takes per message a tuple of positional arguments "
                                f"or a dict of keyword arguments, got {type(item).__name__} (one argument: (x,))")
            else:
                calls.append((item, {}))
        if self._eager:
            handles: list[TaskHandle | DelayQueueError] = []
            for args, kwargs in calls:
                with _naming_item(len(handles)):
                    handles.append(self._ran_eagerly(task, task._body(options, args, kwargs), None))
            return handles
        # The messages differ only in their text (valid UTF-8: encode() made it) and msgId: the rest of
        # their body is checked once, before any is made, and each copies it (send_body's keys, in its order).
        common = send_body(task.topic, "", **self._send_options(options))
        bodies: list[tuple[str, str, tuple[SendContext, ...]]] = []
        try:
            for args, kwargs in calls:
                body = functools.partial(task._body, options, args, kwargs)
                with _naming_item(len(bodies)):
                    bodies.append(self._traced_body(task, options, body))
        except BaseException as exc:  # nothing is sent: the sends begun (before_send) end with the refusal
            for _, _, sends in bodies:
                for context in sends:
                    self.client.middleware.after_send(context, None, exc)
            raise
        producer = self._producer()
        futures = [producer._put({**common, "msg": text, "msgId": msg_id}, sends[0] if sends else None)
                   for text, msg_id, sends in bodies]
        results: list[TaskHandle | DelayQueueError] = []
        for future in futures:
            try:
                sent = future.result()
            except DelayQueueError as error:
                results.append(error)
            else:
                results.append(TaskHandle(self, task.topic, sent.msg_id, task.name))
        return results

    def _producer(self) -> Producer:
        """The batching producer of send_many, made on first use on the App's client."""
        if self._made_producer is None:
            client = self.client  # made first: its own first use takes the same lock
            with self._lock:
                if self._made_producer is None:
                    self._made_producer = client.producer()
        return self._made_producer

    # --- running

    def worker(self, topics: str | Sequence[str] | None = None, *, concurrency: int = 8, asynchronous: bool = False,
               retry_delay: Callable[[Message], float | None] | None = None, **worker_options: Any) -> Worker:
        """A Worker over `topics` (a topic name or a sequence of them, as Worker takes them; default:
        every topic of the app's tasks) running the tasks by the name in their envelope:
        `app.worker().run()`. With `asynchronous=True` it runs on the App's
        async_client, async tasks as asyncio tasks and plain ones in the worker's threads (worker.to_thread);
        else in `concurrency` threads, an async task in an event loop of its own per run.
        `retry_delay` (as Worker takes it) applies to the messages whose task sets no retry_backoff.
        `worker_options` go to Worker (batch, wait_ms, ack_timeout_ms, ...)."""
        chosen = self.topics() if topics is None else [topics] if isinstance(topics, str) else list(topics)
        if not chosen:
            raise ValueError("no topic to serve: the app has no tasks yet (import the modules defining them first)")
        served: str | list[str] = chosen[0] if len(chosen) == 1 else chosen
        delay = functools.partial(self._retry_delay, retry_delay)  # the task's backoff first, then retry_delay
        if asynchronous:
            if self.async_client is None:
                raise ValueError("worker(asynchronous=True) runs on an AsyncClient: make the app with "
                                 "App(client, async_client=AsyncClient(...))")
            return Worker(self.async_client, served, self.handle_async, concurrency=concurrency,
                          retry_delay=delay, **worker_options)
        return Worker(self.client, served, self.handle, concurrency=concurrency, retry_delay=delay, **worker_options)

    def _retry_delay(self, otherwise: Callable[[Message], float | None] | None, message: Message) -> float | None:
        """The retry_backoff of the task a message names, for a failure its task did not see (a
        handler_timeout); for a message naming no task of this app, or one without a retry_backoff,
        `otherwise`'s delay (the worker's retry_delay: the task's own comes first, as on a failure it saw)."""
        try:
            task = self._tasks.get(decode(message.msg).task)
        except EnvelopeError:
            task = None
        delay = None if task is None else task.retry_delay(message.retry)
        return otherwise(message) if delay is None and otherwise is not None else delay

    def _prepared(self, message: Message) -> tuple[Task[Any, Any], list[Any], dict[str, Any]]:
        """The task a message names and its arguments; DeadLetter for a message no retry can run."""
        try:
            envelope = decode(message.msg)
        except EnvelopeError as exc:
            raise _dead(str(exc)) from None
        task = self._tasks.get(envelope.task)
        if task is None:
            raise _dead(f"unknown task {envelope.task!r}: this worker's app has no task of that name")
        try:
            args, kwargs = task._signature.loaded(envelope.args, envelope.kwargs)
        except TypeError as exc:
            raise _dead(f"task {task.name}: the message's arguments do not fit the function: {exc}") from None
        except ValueError as exc:  # pydantic's ValidationError
            raise _dead(f"task {task.name}: invalid arguments: {exc}") from None
        return task, args, kwargs

    def _failed(self, task: Task[Any, Any], message: Message, error: Exception) -> NoReturn:
        """After a task raised: DeadLetter and Retry(delay) as raised; else (Retry() without a delay
        too, as the worker takes it) Retry after the task's backoff (the failure as its cause), or
        the error itself for the worker's (or the topic's) backoff."""
        chosen = isinstance(error, DeadLetter) or (isinstance(error, Retry) and error.delay is not None)
        delay = None if chosen else task.retry_delay(message.retry)
        if delay is None:
            raise error
        # A Retry() raised from a failure: that failure stays the cause, so it is logged and the reason.
        cause = error.__cause__ if isinstance(error, Retry) and isinstance(error.__cause__, Exception) else error
        raise Retry(delay=delay) from cause

    def handle(self, message: Message) -> None:
        """Runs the task a message names (the handler of worker()'s thread Worker)."""
        task, args, kwargs = self._prepared(message)
        try:
            result = task.fn(*args, **kwargs)
            if inspect.iscoroutine(result):
                _run_coroutine(result)
        except Exception as error:
            self._failed(task, message, error)

    async def handle_async(self, message: Message) -> None:
        """handle() for worker(asynchronous=True)."""
        task, args, kwargs = self._prepared(message)
        try:
            if task.is_async:
                await task.fn(*args, **kwargs)
            elif inspect.iscoroutine(result := await to_thread(task.fn, *args, **kwargs)):
                await result  # a plain function answering a coroutine (a plain decorator's), as handle() runs it
        except Exception as error:
            self._failed(task, message, error)
