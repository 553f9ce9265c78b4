"""Worker: long-polls one or more topics in batches (one poll loop per topic), runs a handler per
message (handler threads for a Client and a plain function, tasks for an AsyncClient and a coroutine
function), acks successes in shared ackMsgBatch calls, and settles failures as the handler asks:
Retry(delay) gives the message back after that delay, DeadLetter(reason) ends it as a dead letter,
any other exception gives it back with "<type>: <message>" as the nack's reason (the worker's
retry_backoff applies when the topic sets none). It touches messages whose handler runs past half
the ack timeout, treats a handler running past handler_timeout as failed, and stops in two steps:
the first stop() drains, the second gives back what is in hand and returns.

A settle loop (a thread, or a task) sends the outcomes and touches; it is supervised: should it
fail unexpectedly, the worker stops hard and run() raises WorkerFailed. So are the poll loops: one
failing unexpectedly drains the worker, then run() raises WorkerFailed."""
import asyncio
import contextvars
import functools
import inspect
import itertools
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any, NamedTuple, TypeVar, cast

from delayqueue_client._calls import MAX_REASON
from delayqueue_client.client import AsyncClient, Client
from delayqueue_client.errors import (BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, NotFound,
                                      NotTheAPI, RateLimited, Retry, Unauthorized)
from delayqueue_client.envelope import EnvelopeError, decode
from delayqueue_client.message import Message
from delayqueue_client.middleware import Chain, HandleContext, Middleware, SettleContext

log = logging.getLogger("delayqueue_client.worker")

ACK, NACK, DEAD = "ack", "nack", "dead"
# The server's default ack timeout (DELAYQUEUE_ACK_TIMEOUT_MILLIS), for a token that may not read the topic's.
DEFAULT_ACK_TIMEOUT_MS = 30_000
MAX_SETTLE_BATCH = 500  # well under the server's DELAYQUEUE_MAX_BATCH_SEND
# The default batch adapts to the handlers: the messages queued beyond the running ones cover
# about QUEUED_WORK_SECONDS of handler time (a message waits about that long in this worker's
# queue, where another worker might have run it), so fast handlers get large polls and slow ones
# small; 4 per handler until handlers have been timed, never above MAX_DEFAULT_BATCH.
QUEUED_WORK_SECONDS = 0.05
MAX_DEFAULT_BATCH = 500
FIRST_BATCH_PER_HANDLER = 4
# Answers no retry can change: the worker stops and raises them.
FATAL = (BadRequest, Unauthorized, Forbidden, NotFound, NotTheAPI)
POLL_STEP = 0.1  # seconds: how often blocked waits look at the stop flag (set by signal handlers)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
DRAIN, HARD = 1, 2  # stop levels: the first stop() drains, the second stops hard
GIVEN_BACK = "worker stopped before handling it"  # the reason of a hard stop's nacks
# A hard stop waits this long past wait_ms for the long polls under way: a poll left running could
# take the messages just given back and, its process gone, leave them to their ack timeout.
POLL_END_MARGIN = 1.0

Handler = Callable[[Message], object]
Key = tuple[str, str]  # (topic, msg_id)
T = TypeVar("T")


class HandlerTimeout(Exception):
    """A handler ran longer than the worker's handler_timeout: its message is given back."""


class WorkerFailed(RuntimeError):
    """The worker's settle loop or a poll loop failed unexpectedly; run() raises it (its cause: the error)."""


class Outcome(NamedTuple):
    """How a message is settled: ack, nack (after delay_ms; None: the topic's backoff) or dead letter."""
    kind: str
    delay_ms: int | None = None
    reason: str | None = None


GIVE_BACK = Outcome(NACK, 0, GIVEN_BACK)  # a hard stop's nack: at once, the delivery counted


# A delivery (the pulled Message) and its outcome: a settle names that delivery, not the one held
# under its key when the call goes (a later delivery of the same msgId may be held by then).
Settle = tuple[Message, Outcome]
Group = tuple[str, Outcome, list[Message]]  # one ackMsgBatch call: a topic's deliveries of one outcome


@dataclass
class _Held:
    """A pulled message not yet settled (acked, nacked or dead-lettered)."""
    message: Message
    touch_at: float  # time.monotonic() at which to move its ack deadline again
    started_at: float | None = None  # when its handler started
    decided: bool = False  # its outcome is decided (handler returned, timed out, or given back): no touches


async def _awaited(task: "asyncio.Task[None]") -> None:
    await task


class _UnwaitedExecutor(ThreadPoolExecutor):
    """An async worker's threads: to_thread's in its handlers (an App runs plain tasks there), and
    run()'s event loop's default executor. A thread past handler_timeout runs on: the loop's end
    does not wait for it, and `busy` counts those still running, for abandoned_handlers."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="dq-to-thread")
        self.busy = 0
        self._busy_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":
        with self._busy_lock:
            self.busy += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: "Future[Any]") -> None:
        with self._busy_lock:
            self.busy -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)


# The async worker's threads, set in each of its handler's tasks (a context of its own: nothing to reset).
_WORKER_THREADS: contextvars.ContextVar[_UnwaitedExecutor | None] = contextvars.ContextVar("_WORKER_THREADS",
                                                                                           default=None)


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """asyncio.to_thread, but in an async Worker's handler on that worker's threads, under any event
    loop: one past handler_timeout runs on without holding up the loop's end, and the worker's
    abandoned_handlers sees it. Elsewhere, on the loop's default executor (as asyncio.to_thread)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_WORKER_THREADS.get(), call)


class _HandlerThreads:
    """`count` threads running `handle(message)` for each message put, in the order put. A message
    is a SimpleQueue item, where a thread pool's submit made a future and a work item (with them,
    the worker spent 26-29 us of CPU on a no-op task's message; without, 14-16). Not daemons, as
    a pool's threads: a process waits at exit for handlers still running after a hard stop."""

    def __init__(self, count: int, handle: Callable[[Message], bool]):
        self._work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._closed = False
        self._handle = handle
        self._threads: list[threading.Thread] = []  # those running (a given-up one leaves once it ends)
        self._numbers = itertools.count()  # for the threads' names
        self._excess = 0  # threads beyond `count` (replace_one): those whose handler was given up end
        self._lock = threading.Lock()
        for _ in range(count):
            self._start()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name=f"dq-worker-{next(self._numbers)}")
        self._threads.append(thread)
        thread.start()

    def replace_one(self) -> None:
        """A handler given up (handler_timeout) runs on in its thread: another takes its place, so
        the messages queued behind it still run (and a drain ends)."""
        with self._lock:
            if not self._closed:
                self._excess += 1
                self._start()

    def put(self, message: Message) -> bool:
        """Queues `message` for a handler; False once closed (it will not be handled)."""
        if self._closed:
            return False
        self._work.put(message)
        return True

    def close(self) -> None:
        """Takes no more: the messages no thread has started are dropped, and each thread ends
        once its handler returns."""
        with self._lock:
            self._closed = True
        try:
            while True:
                self._work.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            for _thread in self._threads:
                self._work.put(None)

    def _run(self) -> None:
        while (message := self._work.get()) is not None:
            counted = True
            try:
                counted = self._handle(message)
            except Exception:  # a middleware hook's error (the handler's own are settled): the thread goes on
                log.exception("handling %s/%s failed outside its handler", message.topic, message.msg_id)
            if not counted and self._excess:  # its handler was given up and replaced: the pool is its size again
                with self._lock:
                    if self._excess:
                        self._excess -= 1
                        self._threads.remove(threading.current_thread())
                        return


async def _answer(answer: T | Awaitable[T]) -> T:
    """A client call's answer: a Client's as it is, an AsyncClient's awaited."""
    return cast(T, await answer) if inspect.isawaitable(answer) else answer


def _run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine of the worker's calls on a Client here, in one step: it awaits nothing that suspends."""
    try:
        coroutine.send(None)
    except StopIteration as end:
        return cast(T, end.value)
    coroutine.close()
    raise RuntimeError("a worker's call on a Client waited for an event loop")


def _taken(first: Settle | None, results: "queue.SimpleQueue[Settle | None] | asyncio.Queue[Settle | None]"
           ) -> tuple[list[Settle], bool]:
    """A settle loop's take for a turn: `first` and the outcomes queued behind it now (those that came while
    the previous call was out share the next one), and whether its end (None) is among them. The loop is the
    queue's one reader (run() once it is gone), so what qsize() counts is there."""
    taken = [first, *(results.get_nowait() for _ in range(results.qsize()))]
    return [item for item in taken if item is not None], None in taken


def _left_in(results: "queue.SimpleQueue[Settle | None] | asyncio.Queue[Settle | None]") -> list[Settle]:
    """The outcomes queued for a settle loop that is gone."""
    return _taken(None, results)[0]


def _restore_signal_handlers(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        # None: one not installed from Python, which cannot be put back; the default comes back instead.
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def reason_text(text: str) -> str:
    """A nack reason the server takes: at most MAX_REASON characters, no NUL or lone surrogate."""
    return "".join("?" if c == "\x00" or "\ud800" <= c <= "\udfff" else c for c in text[:MAX_REASON])


def error_reason(error: BaseException) -> str:
    text = str(error)
    return reason_text(f"{type(error).__name__}: {text}" if text else type(error).__name__)


class Worker:
    """`Worker(client, topics, handler, concurrency=8)`: `topics` is a topic name or a sequence of
    them. `run()` blocks until `stop()` (or SIGTERM / SIGINT when run in the main thread); with an
    AsyncClient and an async handler, `await worker.run_async()` (or `run()`, which runs it in a
    new event loop).

    `concurrency` handlers run at once; up to `batch` messages are in hand unhandled, so the next
    poll is out while handlers run and while their acks are being sent. By default the batch adapts
    to how long handlers take (see QUEUED_WORK_SECONDS).

    `retry_backoff=(min, max)` (seconds): a message whose handler raised waits min * 2^(deliveries-1),
    at most max, before its next delivery, on a topic that sets no retryBackoffMillis of its own.
    `retry_delay(message)`: seconds a message waits after a failure that set no delay of its own
    (a handler_timeout too), or None for retry_backoff's (App.worker passes its tasks' retry_backoff).
    `handler_timeout` (seconds): a handler running longer is treated as failed and its message
    given back (an async handler is cancelled; a thread cannot be: it runs on, another thread taking
    its place among the handlers, and what it returns is ignored). `max_messages`: drain and return after handling that
    many. `run(burst=True)`: handle what is due now on every topic, then return. `middleware`: its
    handle and settle hooks (delayqueue_client.middleware); by default the client's."""

    def __init__(self, client: Client | AsyncClient, topics: str | Sequence[str], handler: Handler, *,
                 concurrency: int = 8, batch: int | None = None, ack_timeout_ms: int | None = None,
                 wait_ms: int = 5_000, retry_backoff: tuple[float, float] | None = None,
                 handler_timeout: float | None = None, max_messages: int | None = None,
                 middleware: Sequence[Middleware] | None = None,
                 retry_delay: Callable[[Message], float | None] | None = None):
        self.is_async = isinstance(client, AsyncClient)
        if self.is_async != inspect.iscoroutinefunction(handler):
            raise TypeError("an AsyncClient needs an async handler (async def), a Client a plain function")
        self.topics: tuple[str, ...] = (topics,) if isinstance(topics, str) else tuple(dict.fromkeys(topics))
        if not self.topics:
            raise ValueError("topics must name at least one topic")
        if concurrency < 1 or (batch is not None and batch < 1):
            raise ValueError("concurrency and batch must be at least 1")
        if ack_timeout_ms is not None and ack_timeout_ms < 2:
            raise ValueError("ack_timeout_ms must be at least 2 (ms)")
        if retry_backoff is not None and not 0 < retry_backoff[0] <= retry_backoff[1]:
            raise ValueError("retry_backoff must be (min, max) seconds with 0 < min <= max")
        if handler_timeout is not None and handler_timeout <= 0:
            raise ValueError("handler_timeout must be more than 0 (seconds)")
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        self.client, self.handler = client, handler
        self.concurrency = concurrency
        self.adaptive = batch is None
        self.batch = max(batch or FIRST_BATCH_PER_HANDLER * concurrency, concurrency)
        self._handler_seconds: float | None = None  # a moving mean of how long handlers take
        self.ack_timeout_ms = ack_timeout_ms
        self.wait_ms = wait_ms
        self.retry_backoff = retry_backoff
        self.retry_delay = retry_delay
        self.handler_timeout = handler_timeout
        self.max_messages = max_messages
        self.middleware = client.middleware if middleware is None else Chain(middleware)
        self._ack_timeouts: dict[str, int] = {}  # per topic: given, or the topic's
        self._own_backoff: dict[str, bool] = {}  # per topic: whether it sets a retry backoff
        # A plain int, not an Event: a signal handler may interrupt a thread holding an Event's lock.
        self._stop_level = 0
        self._ran = False  # a Worker runs once (see _first_run)
        self._failure: BaseException | None = None
        self._settler_failed = False  # no settle loop: the outcomes left queued for it are sent from run()
        self._held: dict[Key, _Held] = {}
        # At most the earliest touch_at of the held messages not decided (see _due_touches).
        self._earliest_touch = float("inf")
        self._unhandled = 0  # held messages whose handler has not returned
        self._reserved = 0  # room taken by pulls under way
        self._taken = 0  # messages pulled so far (max_messages)
        self._room_changed: asyncio.Event | None = None  # run_async's wake for its polls (threads: _room)
        self._executor = _UnwaitedExecutor() if self.is_async else None  # see to_thread
        self._lock = threading.Lock()
        # Waits for room take _room; the rest take _lock itself (its lock: notifying needs no more),
        # which costs a handler less than the condition's Python-level enter and exit.
        self._room = threading.Condition(self._lock)

    @property
    def topic(self) -> str:
        """The first topic (the only one of a single-topic worker)."""
        return self.topics[0]

    @property
    def stopped_hard(self) -> bool:
        """Whether a second stop (or a failed settle loop) stopped it hard: handler threads it
        abandoned may still run (a process may want os._exit rather than wait for them)."""
        return self._stop_level >= HARD

    @property
    def abandoned_handlers(self) -> bool:
        """After run(): whether handler threads it no longer waits for may still run (stopped hard,
        or a handler past handler_timeout whose thread has not returned): a process may want
        os._exit rather than wait for them."""
        to_thread_busy = self._executor is not None and self._executor.busy > 0
        return self._stop_level >= HARD or self._unhandled > 0 or to_thread_busy

    @property
    def served_max_messages(self) -> bool:
        """After run(): whether it returned for having taken its max_messages, not stopped."""
        return self._stop_level == 0 and self.max_messages is not None and self._taken >= self.max_messages

    def stop(self) -> None:
        """The first call drains: stop pulling; run() returns once every message in hand is handled
        and settled. The second stops hard: messages in hand whose outcome is not decided are nacked
        at once without delay (a running thread handler runs on, its result ignored; an async one
        is cancelled) and run() returns. Safe from any thread and from a signal handler."""
        self._stop_level = min(HARD, self._stop_level + 1)
        if self._stop_level == HARD:
            log.warning("stopping hard: messages in hand not yet handled are given back")

    # --- shared logic

    def _outcome(self, message: Message, error: BaseException | None) -> Outcome:
        try:
            return self._steered(message, error)
        except Exception:  # an exception that cannot be read (its str() raises, ...): its message must still settle
            log.exception("could not read how the handler of %s/%s failed; nacked", message.topic, message.msg_id)
            return Outcome(NACK, self._backoff_ms(message), reason_text(type(error).__name__))

    def _steered(self, message: Message, error: BaseException | None) -> Outcome:
        if error is None:
            return Outcome(ACK)
        if isinstance(error, DeadLetter):
            log.warning("handler dead-lettered %s/%s: %s", message.topic, message.msg_id, error.reason)
            return Outcome(DEAD, reason=reason_text(error.reason) or None)
        if isinstance(error, Retry):
            delay_ms = self._backoff_ms(message) if error.delay is None else round(error.delay * 1000)
            # The server ends a message nacked in its last delivery, whatever the delay: the log says so.
            then = (f"no retry left: delivery {message.retry} of {message.max_retry + 1}, the server ends it"
                    if message.retry > message.max_retry else error)
            # Raised from a failure (a task's retry_backoff does so): the failure is logged and is the reason.
            if isinstance(error.__cause__, Exception) and not isinstance(error.__cause__, (Retry, DeadLetter)):
                log.error("handler failed on %s/%s; nacked (%s)", message.topic, message.msg_id, then,
                          exc_info=error.__cause__)
                return Outcome(NACK, delay_ms, error_reason(error.__cause__))
            log.info("handler asked to retry %s/%s (%s)", message.topic, message.msg_id, then)
            return Outcome(NACK, delay_ms, error_reason(error))
        log.error("handler failed on %s/%s; nacked", message.topic, message.msg_id, exc_info=error)
        return Outcome(NACK, self._backoff_ms(message), error_reason(error))

    def _backoff_ms(self, message: Message) -> int | None:
        """The message's retry delay, else the worker's retry backoff, for this delivery; None where
        the topic's own applies."""
        if self.retry_delay is not None:
            try:  # the user's code: failing, it must not cost the message its settle
                delay = Retry(self.retry_delay(message)).delay  # checked as a handler's Retry(delay) is
                if delay is not None:
                    return round(delay * 1000)
            except Exception:
                log.exception("retry_delay failed on %s/%s; the worker's retry_backoff (or the topic's) applies",
                              message.topic, message.msg_id)
        if self.retry_backoff is None or self._own_backoff.get(message.topic, False):
            return None
        low, high = self.retry_backoff
        return round(min(high, low * 2.0 ** min(max(message.retry - 1, 0), 60)) * 1000)

    def _ack_timeout(self, topic: str) -> int:
        return self._ack_timeouts.get(topic, self.ack_timeout_ms or DEFAULT_ACK_TIMEOUT_MS)

    @property
    def _reads_config(self) -> bool:
        """Whether the worker needs the topics' settings: their ack timeout, or whether they back off."""
        return self.ack_timeout_ms is None or self.retry_backoff is not None

    def _config_failed(self, topic: str, error: DelayQueueError) -> float:
        """Reading a topic's settings at start failed: when (time.monotonic()) to read again, as
        after a failed pull; an error no retry can change is raised (run() raises it)."""
        if isinstance(error, FATAL):
            raise error
        log.warning("reading topic %s's settings failed: %s; trying again in 1 s", topic, error)
        return time.monotonic() + 1.0

    def _configured(self, topic: str, config: dict[str, Any] | None) -> None:
        """What the worker takes from a topic's config (None: the token may not read it)."""
        if self.ack_timeout_ms is not None:
            self._ack_timeouts[topic] = self.ack_timeout_ms
        else:
            self._ack_timeouts[topic] = int(config["ackTimeoutMillis"]) if config else DEFAULT_ACK_TIMEOUT_MS
        self._own_backoff[topic] = bool(config and int(config.get("retryBackoffMillis") or 0) > 0)

    def _share(self) -> int:
        """The most one pull of a topic asks for."""
        return max(1, self.batch // len(self.topics))

    def _worth_a_pull(self, room: int) -> bool:
        """Whether a pull of `room` messages is worth its call: a quarter of a share, or the worker
        has nothing else to do (pulling one message as each handler returns would cost a call each)."""
        return room >= max(1, self._share() // 4) or self._unhandled + self._reserved == 0

    def _reserve(self) -> int:
        """Room for one pull of a topic (called holding _room): its share of the batch, less the
        unhandled, within max_messages; 0 when there is none now, or too little to be worth a pull."""
        if self._stop_level > 0:  # a poll woken by a handler returning after a stop must pull no more
            return 0
        room = min(self._share(), self.batch - self._unhandled - self._reserved)
        if not self._worth_a_pull(room):
            room = 0
        if len(self._held) >= self.batch + MAX_SETTLE_BATCH:  # a server slow to take acks slows the polls
            room = 0
        if self.max_messages is not None:
            room = min(room, self.max_messages - self._taken)
        if room > 0:
            self._reserved += room
            self._taken += room
        return max(room, 0)

    def _pulled(self, asked: int, messages: list[Message], pulled_at: float) -> bool:
        """Holds the pulled messages; False when the worker stopped hard meanwhile (the caller gives
        them back)."""
        # The server's deadline counts from its answer, so from the pull's start is a safe estimate.
        held = {(m.topic, m.msg_id): _Held(m, pulled_at + self._ack_timeout(m.topic) / 2000) for m in messages}
        with self._lock:
            self._reserved -= asked
            self._taken -= asked - len(messages)
            if self._stop_level >= HARD:
                self._room_freed()
                return False
            self._held.update(held)
            self._unhandled += len(held)
            if held:
                self._earliest_touch = min(self._earliest_touch, min(h.touch_at for h in held.values()))
            self._room_freed()
            return True

    def _poll_done(self) -> bool:
        """Whether a poll loop ends: stopping, or max_messages all taken."""
        return self._stop_level > 0 or (self.max_messages is not None and self._taken >= self.max_messages)

    def _started(self, message: Message) -> bool:
        """A handler is about to run: False when its message was given back meanwhile (hard stop).
        Without the lock (which every handler would wait for): a give-back racing this is as if it
        came just after, when the handler runs on and its outcome is ignored (_finished decides)."""
        held = self._held.get((message.topic, message.msg_id))
        if held is None or held.decided or held.message is not message:
            return False
        held.started_at = time.monotonic()
        return True

    def _finished(self, message: Message, seconds: float | None) -> bool:
        """The handler of `message` returned (or raised) after `seconds` (None: it never ran); whether
        its outcome is the message's (not when a timeout or a hard stop decided it first, nor when
        the message was given back and is in hand again: that delivery's handler decides it)."""
        with self._lock:
            self._unhandled -= 1
            if self.adaptive and seconds is not None:
                self._timed(seconds)
            # Waking the polls (and a draining run) for every message would cost each handler the lock again.
            if self._unhandled == 0 or self._worth_a_pull(self.batch - self._unhandled - self._reserved):
                self._room_freed()
            held = self._held.get((message.topic, message.msg_id))
            if held is None or held.decided or held.message is not message:
                return False
            held.decided = True
            return True

    def _release(self, messages: list[Message]) -> None:
        """Forgets settled deliveries. Only these: a nacked message may be delivered to this worker
        again before the nack's answer is read, and that delivery (same key) is held now; dropping
        it would leave its outcome unsent and it would wait out its ack timeout."""
        with self._lock:
            for message in messages:
                key = (message.topic, message.msg_id)
                held = self._held.get(key)
                if held is not None and held.message is message:
                    del self._held[key]
            self._room_freed()

    def _room_freed(self) -> None:
        """Wakes a poll waiting for room (called holding _lock, the condition's own)."""
        self._room.notify_all()
        if self._room_changed is not None:
            self._room_changed.set()

    def _timed(self, seconds: float) -> None:
        mean = self._handler_seconds
        self._handler_seconds = mean = seconds if mean is None else mean + 0.1 * (seconds - mean)
        queued = QUEUED_WORK_SECONDS / max(mean, 1e-6) * self.concurrency
        self.batch = max(self.concurrency, min(MAX_DEFAULT_BATCH, int(self.concurrency + queued)))

    def _undecided(self) -> bool:
        with self._lock:
            return any(not h.decided for h in self._held.values())

    def _timed_out(self) -> list[Settle]:
        """Thread handlers past handler_timeout: their messages are given back now."""
        if self.handler_timeout is None:
            return []
        now, late = time.monotonic(), []
        with self._lock:
            for key, held in self._held.items():
                if not held.decided and held.started_at is not None and now - held.started_at > self.handler_timeout:
                    held.decided = True
                    late.append(held.message)
        error = HandlerTimeout(f"handler ran over {self.handler_timeout:g} s")
        for message in late:
            log.error("handler of %s/%s ran over %g s: its message is given back", message.topic, message.msg_id,
                      self.handler_timeout)
        return [(m, Outcome(NACK, self._backoff_ms(m), error_reason(error))) for m in late]

    @staticmethod
    def _given_back(messages: Iterable[Message]) -> list[Settle]:
        """A hard stop's nacks of these deliveries, without delay."""
        return [(m, GIVE_BACK) for m in messages]

    def _give_back_all(self) -> list[Settle]:
        """A hard stop: every message in hand whose outcome is not decided, nacked without delay."""
        with self._lock:
            undecided = [held for held in self._held.values() if not held.decided]
            for held in undecided:
                held.decided = True
        return self._given_back(held.message for held in undecided)

    def _due_touches(self) -> list[Message]:
        """The messages to touch now. The held messages are looked through only once the earliest
        touch falls due: every settle turn doing so would cost the handlers the lock for long."""
        now = time.monotonic()
        if now < self._earliest_touch:
            return []
        with self._lock:
            due, later = [], float("inf")
            for held in self._held.values():
                if not held.decided:
                    if held.touch_at <= now:
                        due.append(held.message)
                    else:
                        later = min(later, held.touch_at)
            self._earliest_touch = later  # each due one's next touch time comes back in _touched
            return due

    def _next_touch_in(self) -> float:
        return min(POLL_STEP, max(0.0, self._earliest_touch - time.monotonic()))

    def _touched(self, message: Message, called_at: float, error: DelayQueueError | None) -> None:
        """A touch of `message` answered: its next one, unless a later delivery is held since."""
        key = (message.topic, message.msg_id)
        timeout_ms = self._ack_timeout(message.topic)
        with self._lock:
            held = self._held.get(key)
            if held is None or held.message is not message:
                return
            if error is None:
                held.touch_at = called_at + timeout_ms / 2000
            elif isinstance(error, (Conflict, NotFound)):
                log.warning("%s/%s is no longer being consumed (ack timeout passed?): it will be delivered again",
                            *key)
                held.touch_at = float("inf")
            else:  # transient: try again soon, well before the deadline
                log.warning("touch of %s/%s failed: %s", *key, error)
                held.touch_at = called_at + min(0.2, timeout_ms / 8000)
            self._earliest_touch = min(self._earliest_touch, held.touch_at)

    @staticmethod
    def _settle_groups(results: Iterable[Settle]) -> list[Group]:
        """(topic, outcome, deliveries) calls for these results, each at most MAX_SETTLE_BATCH."""
        groups: dict[tuple[str, Outcome], list[Message]] = {}
        for message, outcome in results:
            groups.setdefault((message.topic, outcome), []).append(message)
        return [(topic, outcome, each[i:i + MAX_SETTLE_BATCH]) for (topic, outcome), each in groups.items()
                for i in range(0, len(each), MAX_SETTLE_BATCH)]

    @staticmethod
    def _settle_kwargs(outcome: Outcome, messages: list[Message]) -> dict[str, Any]:
        """ack_many's msg_ids and options: the outcome's, and the deliveries settled (a late settle
        of one delivered again since then leaves the later delivery alone)."""
        settled: dict[str, Any] = {"msg_ids": [m.msg_id for m in messages], "retries": [m.retry for m in messages]}
        if outcome.kind == ACK:
            return {**settled, "ack": True}
        return {**settled, "ack": False, "dead_letter": outcome.kind == DEAD, "delay_ms": outcome.delay_ms,
                "reason": outcome.reason}

    def _settled(self, topic: str, outcome: Outcome, messages: list[Message], done: list[bool]) -> None:
        late = [m.msg_id for m, ok in zip(messages, done) if not ok]
        if late:
            log.warning("%s of %s/%s came too late (no longer consuming: delivered again or ended)", outcome.kind,
                        topic, ", ".join(late))
        if self.middleware:
            for message, ok in zip(messages, done):
                self.middleware.after_settle(SettleContext(message=message, outcome=outcome.kind, done=ok))
        self._release(messages)

    # The calls both workers make alike, as coroutines: on a Client (the thread worker's, run by _run_now)
    # each call answers at once and nothing is awaited.

    async def _read_configs(self, pause: Callable[[float], Awaitable[None] | None]) -> None:
        """Each topic's settings, read before the polls start; a failed read is tried again after
        `pause` (time.sleep for the threads, asyncio.sleep for the tasks) until the worker stops."""
        for topic in self.topics:
            while True:
                try:
                    config = await _answer(self.client.topic_config(topic)) if self._reads_config else None
                except Forbidden:
                    config = None
                except DelayQueueError as error:
                    again = self._config_failed(topic, error)
                    # One look at the clock a turn: past `again` by a second look, a sleep would be negative.
                    while self._stop_level == 0 and (left := again - time.monotonic()) > 0:
                        await _answer(pause(min(POLL_STEP, left)))
                    if self._stop_level == 0:
                        continue
                    config = None  # stopped before the server answered: nothing is pulled
                self._configured(topic, config)
                break

    async def _settle_turn(self, groups: list[Group]) -> list[Group]:
        """A settle loop's calls for one turn: these outcomes, then the touches due. Answers the groups
        whose call failed, tried again on the next turn (at most POLL_STEP later), after the touches: a
        server refusing acks for a while must not let running messages time out."""
        again: list[Group] = []
        for topic, outcome, messages in groups:
            try:
                done = await _answer(self.client.ack_many(topic, **self._settle_kwargs(outcome, messages)))
            except DelayQueueError as error:
                if self._settle_failed(topic, outcome, messages, error):
                    again.append((topic, outcome, messages))
            else:
                self._settled(topic, outcome, messages, done)
        for message in self._due_touches():
            called_at = time.monotonic()
            try:
                await _answer(self.client.touch(message.topic, message.msg_id,
                                                ack_timeout_ms=self._ack_timeout(message.topic), retry=message.retry))
                self._touched(message, called_at, None)
            except DelayQueueError as error:
                self._touched(message, called_at, error)
        return again

    async def _give_back(self, items: list[Settle]) -> None:
        """Sends these outcomes (a hard stop's nacks among them) from run()'s own thread or task (no
        settle loop to do it); a failure leaves them to their ack timeout."""
        for topic, outcome, messages in self._settle_groups(items):
            try:
                done = await _answer(self.client.ack_many(topic, **self._settle_kwargs(outcome, messages)))
            except DelayQueueError as error:
                log.error("could not send the %s of %s/%s (%s): delivered again after their ack timeout",
                          outcome.kind, topic, ", ".join(m.msg_id for m in messages), error)
                self._release(messages)
            else:
                self._settled(topic, outcome, messages, done)

    def _handle_context(self, message: Message) -> HandleContext | None:
        """The middleware's context of a handling, with the task envelope's name and headers when
        the message is one (None without middleware)."""
        if not self.middleware:
            return None
        try:
            envelope = decode(message.msg)
            task, headers = envelope.task, dict(envelope.headers)
        except EnvelopeError:
            task, headers = None, {}
        return HandleContext(message=message, task=task, headers=headers, started=time.time())

    def _settle_failed(self, topic: str, outcome: Outcome, messages: list[Message], error: DelayQueueError) -> bool:
        """Whether to try again: while some of them may still be before their ack deadline (and
        the worker is not stopping hard)."""
        log.warning("%s of %d message(s) of %s failed: %s", outcome.kind, len(messages), topic, error)
        half = self._ack_timeout(topic) / 2000
        with self._lock:
            held = [self._held.get((m.topic, m.msg_id)) for m in messages]
            before_deadline = any(each is not None and each.message is m and each.touch_at != float("inf") and
                                  time.monotonic() < each.touch_at + half for each, m in zip(held, messages))
        if not before_deadline or isinstance(error, FATAL) or self._stop_level >= HARD:
            # Past the deadline (or no longer consuming, per a touch) the server may have delivered them already.
            again = "after their ack timeout" if before_deadline else "(past their ack deadline: it may have already)"
            log.error("gave up the %s of %s/%s: the server delivers them again %s",
                      outcome.kind, topic, ", ".join(m.msg_id for m in messages), again)
            self._release(messages)
            return False
        return True

    def _pull_failed(self, topic: str, asked: int, error: DelayQueueError) -> float | None:
        """A pull of `asked` failed: when (time.monotonic()) to pull again; None when no retry can
        change the answer (the worker drains and run() raises it)."""
        self._pulled(asked, [], 0.0)
        if isinstance(error, FATAL):
            log.error("pull from %s refused: %s; the worker stops", topic, error)
            self._failure = self._failure or error
            self._stop_level = max(self._stop_level, DRAIN)
            return None
        log.warning("pull from %s failed: %s", topic, error)
        return time.monotonic() + (error.retry_after if isinstance(error, RateLimited) and error.retry_after else 1.0)

    def _settle_loop_failed(self, error: BaseException) -> None:
        log.critical("the worker's settle loop failed; the worker stops hard", exc_info=error)
        self._failure = WorkerFailed(f"the worker's settle loop failed: {type(error).__name__}: {error}")
        self._failure.__cause__ = error
        self._settler_ended()

    def _settler_ended(self) -> None:
        """No settle loop any more: a hard stop, whose outcomes run() sends itself."""
        self._settler_failed = True
        self._stop_level = HARD

    def _poll_loop_failed(self, topic: str, error: BaseException) -> None:
        """Not a silent end of the poll: run() would return as if stopped (a process exiting 0)."""
        log.critical("the poll loop of %s failed; the worker drains", topic, exc_info=error)
        failure = WorkerFailed(f"the poll loop of {topic} failed: {type(error).__name__}: {error}")
        failure.__cause__ = error
        self._failure = self._failure or failure
        self._stop_level = max(self._stop_level, DRAIN)

    def _interrupted(self, error: BaseException) -> None:
        """A KeyboardInterrupt (Ctrl-C without the worker's signal handlers) or SystemExit (sys.exit())
        in a handler, thread or async, or in run()'s event loop: a hard stop, then run() (run_async())
        raises it, as the threads' run() does with one in its own thread."""
        log.warning("worker interrupted (%s): messages in hand not yet handled are given back",
                    type(error).__name__)
        self._failure = self._failure or error
        self._stop_level = HARD
        if self._room_changed is not None:
            self._room_changed.set()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # --- threads (Client)

    def run(self, burst: bool = False, *, install_signal_handlers: bool = True) -> None:
        """Blocks until stopped (or, with burst, until what is due now on every topic is handled);
        then finishes and settles every message in hand. In the main thread (and
        install_signal_handlers), SIGTERM and SIGINT stop it (the first drains, the second stops
        hard); the previous handlers come back after. A Worker runs once: a second run() raises
        RuntimeError."""
        self._first_run()
        if self.is_async:
            assert self._executor is not None
            with asyncio.Runner() as runner:  # asyncio.run's, with a hold on run_async's task
                runner.get_loop().set_default_executor(self._executor)
                running = runner.get_loop().create_task(self._run_async(burst, install_signal_handlers))
                try:
                    return runner.run(_awaited(running))
                except (KeyboardInterrupt, SystemExit) as exc:
                    if running.done():  # a first Ctrl-C cancelled it: drained
                        raise
                    # Raised by the loop between steps, it left run_async's tasks pending: closing the
                    # runner would cancel them all, nothing given back. A hard stop, run to its end.
                    self._interrupted(exc)
                    try:
                        runner.run(_awaited(running))
                    except asyncio.CancelledError:
                        pass  # cancelled by a first Ctrl-C, it was draining: given back now all the same
                    raise
        previous = self._install_signal_handlers() if install_signal_handlers else {}
        try:
            self._run_threads(burst)
        finally:
            _restore_signal_handlers(previous)

    def _first_run(self) -> None:
        """A run leaves the worker stopped, its counts and holds its own: no start for another run."""
        with self._lock:
            if self._ran:
                raise RuntimeError("a Worker runs once: make a new Worker to run again")
            self._ran = True

    def _install_signal_handlers(self) -> dict[signal.Signals, Any]:
        """SIGTERM and SIGINT call stop(), when in the main thread (the only one that may set them):
        the handlers they had, for _restore_signal_handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def _run_threads(self, burst: bool) -> None:
        _run_now(self._read_configs(time.sleep))
        results: queue.SimpleQueue[Settle | None] = queue.SimpleQueue()
        handlers = _HandlerThreads(self.concurrency, lambda message: self._handle(message, results))
        settler = threading.Thread(target=self._settle_thread, args=(results, handlers), name="dq-settle",
                                   daemon=True)
        # Daemons: a poll that outlives a hard stop's wait (POLL_END_MARGIN) does not keep the process.
        # Their ends are events, not join(): on Python 3.11 a join interrupted by Ctrl-C marks a running thread ended.
        polls_ended = [threading.Event() for _ in self.topics]
        pollers = [threading.Thread(target=self._poll_thread, args=(topic, burst, handlers, ended),
                                    name=f"dq-poll-{topic}", daemon=True)
                   for topic, ended in zip(self.topics, polls_ended)]
        settler.start()
        for poller in pollers:
            poller.start()
        try:
            for ended in polls_ended:
                while not ended.is_set() and self._stop_level < HARD:
                    ended.wait(POLL_STEP)
            while self._stop_level < HARD and self._undecided():
                with self._room:
                    self._room.wait(POLL_STEP)
        except BaseException:
            # Interrupted (KeyboardInterrupt without the worker's signal handlers, a SystemExit of the
            # program's own): a hard stop, or the settle loop would wait for ever for messages no handler takes.
            self._stop_level = HARD
            log.warning("run() interrupted (%s): messages in hand not yet handled are given back",
                        type(sys.exc_info()[1]).__name__)
            raise
        finally:
            given_back = self._give_back_all() if self._stop_level >= HARD else []
            for item in given_back:
                results.put(item)
            handlers.close()  # a hard stop's handlers that did not start never do
            results.put(None)
            settler.join()
            if self._settler_failed:  # no settle loop sent them
                _run_now(self._give_back(_left_in(results)))
            end = time.monotonic() + self.wait_ms / 1000 + POLL_END_MARGIN
            for ended in polls_ended:  # what a poll under way brings after a hard stop, its loop gives back
                ended.wait(max(0.0, end - time.monotonic()))
        self._raise_failure()

    def _sync_client(self) -> Client:
        assert isinstance(self.client, Client)
        return self.client

    def _poll_thread(self, topic: str, burst: bool, handlers: "_HandlerThreads", ended: threading.Event) -> None:
        try:
            self._poll_turns(topic, burst, handlers)
        except Exception as exc:  # supervised, as _settle_thread
            self._poll_loop_failed(topic, exc)
        finally:
            ended.set()

    def _poll_turns(self, topic: str, burst: bool, handlers: "_HandlerThreads") -> None:
        client = self._sync_client()
        while not self._poll_done():
            with self._room:
                while not (free := self._reserve()) and not self._poll_done():
                    self._room.wait(POLL_STEP)
            if not free:
                return
            pulled_at = time.monotonic()
            try:
                messages = client.pull(topic, batch=free, ack_timeout_ms=self._ack_timeout(topic),
                                       wait_ms=0 if burst else self.wait_ms)
            except DelayQueueError as error:
                if (end := self._pull_failed(topic, free, error)) is None:
                    return
                while not self._poll_done() and (left := end - time.monotonic()) > 0:  # as in _read_configs
                    time.sleep(min(POLL_STEP, left))
                continue
            if not self._pulled(free, messages, pulled_at):
                _run_now(self._give_back(self._given_back(messages)))
                return
            for message in messages:
                if not handlers.put(message):  # closed: a hard stop gave the message back
                    self._finished(message, None)
            if burst and len(messages) < free:
                return  # nothing more due now

    def _handle(self, message: Message, results: "queue.SimpleQueue[Settle | None]") -> bool:
        """Runs the handler of `message`; whether its outcome is the message's (see _finished)."""
        if not self._started(message):
            self._finished(message, None)
            return False
        error, started = None, time.monotonic()
        context = self._handle_context(message)
        if context is not None:
            self.middleware.before_handle(context)
        try:
            self.handler(message)
        except BaseException as exc:  # SystemExit too: its message must still be settled
            error = exc
        interrupted = self._stopped_from_outside(error)
        if context is not None:
            context.interrupted = interrupted
            self.middleware.after_handle(context, None if interrupted else error)
        counted = self._finished(message, time.monotonic() - started)
        if counted:
            results.put((message, GIVE_BACK if interrupted else self._outcome(message, error)))
        if isinstance(error, (KeyboardInterrupt, SystemExit)):  # sys.exit(): as in an async handler
            self._interrupted(error)
        return counted

    def _settle_thread(self, results: "queue.SimpleQueue[Settle | None]",
                       handlers: _HandlerThreads) -> None:
        try:
            self._settle_turns(results, handlers)
        except BaseException as exc:  # supervised: the worker must not stall on a dead settle loop
            self._settle_loop_failed(exc)

    def _settle_turns(self, results: "queue.SimpleQueue[Settle | None]",
                      handlers: _HandlerThreads) -> None:
        closing = False
        again: list[Group] = []
        while not closing or self._held:
            gathered = self._timed_out()
            for _ in gathered:
                handlers.replace_one()
            try:
                taken, ended = _taken(results.get(timeout=self._next_touch_in()), results)
                gathered += taken
                closing = closing or ended
            except queue.Empty:
                pass
            again = _run_now(self._settle_turn(again + self._settle_groups(gathered)))

    # --- tasks (AsyncClient)

    async def run_async(self, burst: bool = False, *, install_signal_handlers: bool = True) -> None:
        """run() for an AsyncClient and an async handler, in the running event loop. Cancelled, it
        still waits for its handlers and settles their messages (a drain)."""
        if not self.is_async:
            raise TypeError("run_async() needs an AsyncClient and an async handler; use run()")
        self._first_run()
        await self._run_async(burst, install_signal_handlers)

    async def _run_async(self, burst: bool, install_signal_handlers: bool) -> None:
        # As run(), not with loop.add_signal_handler: its remove_signal_handler would drop a handler of
        # the loop's own that ours replaced, and SIGTERM would then reach no one.
        previous = self._install_signal_handlers() if install_signal_handlers else {}
        try:
            await self._run_tasks(burst)
        finally:
            _restore_signal_handlers(previous)

    def _async_client(self) -> AsyncClient:
        assert isinstance(self.client, AsyncClient)
        return self.client

    async def _run_tasks(self, burst: bool) -> None:
        await self._read_configs(asyncio.sleep)
        results: asyncio.Queue[Settle | None] = asyncio.Queue()
        self._room_changed = asyncio.Event()
        settler = asyncio.create_task(self._settle_task(results))
        handlers: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(self.concurrency)
        pollers = [asyncio.create_task(self._poll_task(topic, burst, results, slots, handlers))
                   for topic in self.topics]
        try:
            await self._until_done(pollers)
        except asyncio.CancelledError:
            self._stop_level = max(self._stop_level, DRAIN)
            raise
        finally:
            # Shielded: a cancelled run_async still gives back and settles what it holds. Closed pending
            # (GeneratorExit: its loop gone), it can await nothing more: what it holds waits out its ack timeout.
            if not isinstance(sys.exc_info()[1], GeneratorExit):
                await asyncio.shield(self._finish_tasks(pollers, handlers, results, settler))
        self._raise_failure()

    async def _until_done(self, pollers: list["asyncio.Task[None]"]) -> None:
        """Until stopped hard, or the polls ended and every message in hand has its outcome."""
        while self._stop_level < HARD and (any(not p.done() for p in pollers) or self._undecided()):
            await self._room_change()

    async def _room_change(self) -> None:
        assert self._room_changed is not None
        self._room_changed.clear()
        # Not wait_for: on Python 3.11 a cancel arriving as the wait ends (the event set, or its timeout) is lost,
        # and a cancelled run_async ran on as if never cancelled.
        try:
            async with asyncio.timeout(POLL_STEP):
                await self._room_changed.wait()
        except TimeoutError:
            pass

    async def _finish_tasks(self, pollers: list["asyncio.Task[None]"], handlers: set["asyncio.Task[None]"],
                            results: "asyncio.Queue[Settle | None]",
                            settler: "asyncio.Task[None]") -> None:
        await self._until_done(pollers)  # a cancelled run_async drains here, where a hard stop still applies
        given_back = self._give_back_all() if self._stop_level >= HARD else []
        if self._stop_level >= HARD:
            for task in handlers:
                task.cancel()
        for item in given_back:
            results.put_nowait(item)
        # A poll under way ends by itself (what it brings after a hard stop, its loop gives back), or
        # is cancelled once it had wait_ms: a cancelled poll's messages come back after their ack timeout.
        _, late = await asyncio.wait(pollers, timeout=self.wait_ms / 1000 + POLL_END_MARGIN)
        for task in late:
            task.cancel()
        await asyncio.gather(*pollers, *handlers, return_exceptions=True)
        results.put_nowait(None)
        await settler
        if self._settler_failed:  # no settle loop sent them
            await self._give_back(_left_in(results))
        # Its handlers are done: idle threads end now, a busy one (abandoned) once its call returns. Under
        # run() the loop's end does this too; under a loop of one's own nothing else would.
        assert self._executor is not None
        self._executor.shutdown()

    async def _poll_task(self, topic: str, burst: bool, results: "asyncio.Queue[Settle | None]",
                         slots: asyncio.Semaphore, handlers: set["asyncio.Task[None]"]) -> None:
        try:
            await self._poll_turns_async(topic, burst, results, slots, handlers)
        except Exception as exc:  # supervised, as _settle_thread
            self._poll_loop_failed(topic, exc)

    async def _poll_turns_async(self, topic: str, burst: bool,
                                results: "asyncio.Queue[Settle | None]", slots: asyncio.Semaphore,
                                handlers: set["asyncio.Task[None]"]) -> None:
        client = self._async_client()
        while not self._poll_done():
            while not (free := self._reserve()) and not self._poll_done():
                await self._room_change()
            if not free:
                return
            pulled_at = time.monotonic()
            try:
                messages = await client.pull(topic, batch=free, ack_timeout_ms=self._ack_timeout(topic),
                                             wait_ms=0 if burst else self.wait_ms)
            except DelayQueueError as error:
                if (end := self._pull_failed(topic, free, error)) is None:
                    return
                while not self._poll_done() and time.monotonic() < end:
                    await asyncio.sleep(POLL_STEP)
                continue
            except asyncio.CancelledError:
                self._pulled(free, [], pulled_at)
                raise
            if not self._pulled(free, messages, pulled_at):
                await self._give_back(self._given_back(messages))
                return
            for message in messages:
                task = asyncio.create_task(self._handle_async(message, results, slots))
                handlers.add(task)
                task.add_done_callback(handlers.discard)
            if burst and len(messages) < free:
                return

    async def _handle_async(self, message: Message, results: "asyncio.Queue[Settle | None]",
                            slots: asyncio.Semaphore) -> None:
        error: BaseException | None = None
        started: float | None = None
        _WORKER_THREADS.set(self._executor)
        try:
            async with slots:
                if not self._started(message):
                    self._finished(message, None)
                    return
                started = time.monotonic()
                context = self._handle_context(message)
                if context is not None:
                    self.middleware.before_handle(context)
                try:
                    await self._call_async(message)
                finally:
                    if context is not None:
                        failure = sys.exc_info()[1]
                        context.interrupted = self._stopped_from_outside(failure)
                        self.middleware.after_handle(context, None if context.interrupted else failure)
        except GeneratorExit:  # closed pending, its loop gone (see _run_tasks): no failure, nothing to settle
            raise
        except BaseException as exc:  # a cancelled handler too: its message is nacked, then it is cancelled
            error = exc
        if self._finished(message, time.monotonic() - started if started is not None else None):
            # A Ctrl-C, or cancelled not by a hard stop (which decided it first): the loop's end cancelling every task.
            outside = self._stopped_from_outside(error)
            results.put_nowait((message, GIVE_BACK if outside else self._outcome(message, error)))
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            # Raised out of this task it would end the loop's run at once, every task left pending.
            self._interrupted(error)
        elif error is not None and not isinstance(error, Exception):
            raise error

    @staticmethod
    def _stopped_from_outside(error: BaseException | None) -> bool:
        """Whether a handler ended by a Ctrl-C (KeyboardInterrupt: the operator stopping the worker), or
        its task by being closed (its loop gone) or cancelled from outside (a hard stop, the loop's end),
        not by a CancelledError of the handler's own: no failure, its message given back."""
        if isinstance(error, (KeyboardInterrupt, GeneratorExit)):
            return True  # first: with its loop gone there is no current task to ask
        if not isinstance(error, asyncio.CancelledError):
            return False
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a thread handler's own CancelledError: no loop, no one cancelled it
            return False
        return task is not None and task.cancelling() > 0

    async def _call_async(self, message: Message) -> None:
        handler: Callable[[Message], Awaitable[object]] = self.handler  # type: ignore[assignment]
        # In this task, not wait_for's task of its own (Python 3.11): a KeyboardInterrupt or SystemExit
        # raised there would end the loop's run at once, every task left pending, nothing given back.
        try:
            async with asyncio.timeout(self.handler_timeout) as deadline:
                await handler(message)
        except TimeoutError:
            if not deadline.expired():
                raise  # the handler's own
            raise HandlerTimeout(f"handler ran over {self.handler_timeout:g} s") from None

    async def _settle_task(self, results: "asyncio.Queue[Settle | None]") -> None:
        try:
            await self._settle_turns_async(results)
        except asyncio.CancelledError:  # the loop's end cancelling every task (asyncio.run after a second Ctrl-C)
            log.warning("the worker's settle loop was cancelled; the worker stops hard")
            self._settler_ended()
        except GeneratorExit:  # closed pending, its loop gone (see _run_tasks)
            raise
        except (KeyboardInterrupt, SystemExit) as exc:  # a signal handler's, raised in its step: as in a handler's
            self._settler_ended()
            self._interrupted(exc)
        except BaseException as exc:  # supervised, as _settle_thread
            self._settle_loop_failed(exc)
        if self._room_changed is not None:
            self._room_changed.set()

    async def _settle_turns_async(self, results: "asyncio.Queue[Settle | None]") -> None:
        closing = False
        again: list[Group] = []
        while not closing or self._held:
            gathered: list[Settle] = []
            try:
                gathered, ended = _taken(await asyncio.wait_for(results.get(), self._next_touch_in()), results)
                closing = closing or ended
            except asyncio.TimeoutError:
                pass
            again = await self._settle_turn(again + self._settle_groups(gathered))
