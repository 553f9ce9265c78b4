"""The batching producers: sends from any number of threads (Producer) or asyncio tasks
(AsyncProducer) gathered into sendMsgBatch calls."""
from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, wait
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import TYPE_CHECKING, Any, Literal, cast

from delayqueue_client._calls import Body, SendResult, send_body
from delayqueue_client.message import Message
from delayqueue_client.middleware import SendContext

if TYPE_CHECKING:
    from delayqueue_client.client import AsyncClient, Client

# The server's default DELAYQUEUE_MAX_BATCH_SEND: a larger sendMsgBatch is refused (code 400). The
# API does not tell a client its server's value, so max_batch is held to the default.
MAX_BATCH_SEND = 1000
_CLOSE: Any = object()
log = logging.getLogger("delayqueue_client.producer")


class ProducerFull(Exception):
    """A send to a producer whose queue holds max_queue sends not yet in a batch (when_full="raise",
    or AsyncProducer.send)."""


class ProducerTimeout(TimeoutError):
    """Producer.flush(timeout) or close(timeout) ran out before every send was answered. `msg_ids`:
    those sends'; they are still being sent, and the interpreter's exit waits for them."""

    def __init__(self, waited: str, timeout: float, msg_ids: list[str]):
        super().__init__(f"the producer's {waited} timed out after {timeout:g} s with {len(msg_ids)} sends not "
                         "answered yet: they are still being sent, and the interpreter's exit waits for them")
        self.msg_ids = msg_ids


def _checked_batch(max_batch: int, in_flight: int, max_queue: int) -> int:
    """max_batch held to the server's limit, once the three are checked."""
    if max_batch < 1 or in_flight < 1 or max_queue < 1:
        raise ValueError(f"max_batch, in_flight and max_queue must be at least 1, got {max_batch}, {in_flight} "
                         f"and {max_queue}")
    return min(max_batch, MAX_BATCH_SEND)


# Producers not closed yet: each is closed (its pending sends sent) when the interpreter exits.
_open_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


@atexit.register
def _close_open_producers() -> None:
    for producer in list(_open_producers):
        producer.close()


class _SendFuture(Future[Message]):
    """A send: its body, its middleware context (when the task layer made it), and the Future its
    caller holds. Its condition is its producer's, not a Condition and an RLock of its own, and its
    list of callbacks is made by the first one: a producer's queue holds thousands of sends, and
    the garbage collector's passes over their objects took half the client's CPU at 20,000 sends
    a second. One send's answer wakes those waiting on any of them, so a wait loops until its own
    future is done."""

    def __init__(self, condition: threading.Condition, body: Body, context: SendContext | None):
        # Future.__init__'s fields, the condition shared and no callback list yet.
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Callable[[Future[Message]], object]] | tuple[()] = ()
        self.body, self.context = body, context

    def add_done_callback(self, fn: Callable[[Future[Message]], object]) -> None:
        with self._condition:
            if not self._done_callbacks:
                self._done_callbacks = []
        super().add_done_callback(fn)

    def _wait_done(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                self._condition.wait(remaining)

    def result(self, timeout: float | None = None) -> Message:
        # Answered (as send_many finds most of its sends): no lock. _answer sets the result before the state.
        if self._state == FINISHED and self._exception is None:
            return cast(Message, self._result)
        self._wait_done(timeout)
        return super().result(0)  # its outcome, or TimeoutError / CancelledError as Future answers them

    def _answer(self, outcome: SendResult | BaseException) -> None:
        """What set_result or set_exception does under the condition, which the sender holds (and
        notifies) once for a whole batch's answers rather than once a send."""
        if isinstance(outcome, BaseException):
            self._exception = outcome
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
        else:
            self._result = outcome
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_done(timeout)
        return super().exception(0)


class Producer:
    """`send()` answers a Future of the stored Message at once; one thread gathers the sends of
    `linger_ms` after the first waiting one (or `max_batch` of them, at most the server's default
    limit MAX_BATCH_SEND) into one sendMsgBatch, and up to `in_flight` batches are out at once
    (while all are, the sends waiting gather into the next one). At most `max_queue` sends wait
    for a batch: a send beyond them waits for room (`when_full="block"`) or raises ProducerFull
    ("raise"). Every message gets its msgId here, so a batch whose answer was lost, or an item a
    store was unavailable for, is sent again without doubles (Client.send_many's retries). A
    producer not closed, or whose close timed out or was interrupted (Ctrl-C), is closed at
    interpreter exit, so its pending sends are not lost."""

    def __init__(self, client: Client, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4,
                 max_queue: int = 100_000, when_full: Literal["block", "raise"] = "block"):
        if when_full not in ("block", "raise"):
            raise ValueError(f'when_full must be "block" or "raise", got {when_full!r}')
        self._client, self._linger = client, linger_ms / 1000
        self._max_batch = _checked_batch(max_batch, in_flight, max_queue)
        self._block = when_full == "block"
        self._slots = threading.BoundedSemaphore(in_flight)
        self._queue: queue.SimpleQueue[_SendFuture] = queue.SimpleQueue()
        self._batches: queue.SimpleQueue[list[_SendFuture]] = queue.SimpleQueue()
        # Under _lock: the sends not yet answered (forgotten a batch at a time), and how many of
        # them wait for a batch (at most max_queue; _room wakes a send blocked on it).
        self._pending: set[_SendFuture] = set()
        self._waiting, self._max_queue = 0, max_queue
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._answered = threading.Condition()  # every send's future waits on this one
        self._closed = False
        # Threads of its own, not an executor: concurrent.futures refuses work once the interpreter
        # exits, when the pending sends must still go out.
        self._senders = [threading.Thread(target=self._send_loop, name="delayqueue-producer-send", daemon=True)
                         for _ in range(in_flight)]
        gatherer = threading.Thread(target=self._run, name="delayqueue-producer", daemon=True)
        # The gatherer's end, for close(), not its join(): on Python 3.11 a join interrupted by Ctrl-C marks a
        # running thread ended.
        self._ended = threading.Event()
        for thread in (*self._senders, gatherer):
            thread.start()
        _open_producers.add(self)

    def send(self, topic: str, msg: str, *, context: SendContext | None = None, **options: Any) -> Future[Message]:
        """send()'s arguments (delay_ms, trigger_time, msg_id, ttl_ms, max_retry, priority); the
        Future fails with the message's error (RateLimited, BadRequest, ...) or the batch's.
        `context`: the send's middleware context, its before_send run (the task layer's)."""
        return self._put(send_body(topic, msg, **options), context)

    def _put(self, body: Body, context: SendContext | None) -> Future[Message]:
        """send() of a body as send_body makes them, checked (the task layer makes its bodies so)."""
        future = _SendFuture(self._answered, body, context)
        with self._lock:  # one lock a send: its cost is paid by every send
            while self._waiting >= self._max_queue and not self._closed:
                if not self._block:
                    raise ProducerFull("the producer's queue is full: sends come faster than the server takes them")
                self._room.wait()
            if self._closed:
                raise RuntimeError("the producer is closed")
            self._waiting += 1
            self._pending.add(future)
            self._queue.put(future)
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every send made before this call is answered; ProducerTimeout when `timeout`
        ran out first."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout)
        unanswered = [future.body["msgId"] for future in pending if not future.done()]
        if unanswered:
            raise ProducerTimeout("flush", timeout or 0, unanswered)

    def close(self, timeout: float | None = None) -> None:
        """Takes no more sends, waits for those pending and stops the sender threads. ProducerTimeout
        when `timeout` ran out first: the sends go on (a later close waits for them again, as after a
        KeyboardInterrupt)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_CLOSE)
                self._room.notify_all()  # a send blocked on a full queue raises
        if not self._ended.wait(timeout):
            # Kept among the open producers: the exit's close waits for them, where the daemon threads would drop them.
            with self._lock:
                pending = [future.body["msgId"] for future in self._pending]
            raise ProducerTimeout("close", timeout or 0, pending)
        _open_producers.discard(self)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            self._gather()
        finally:
            for _sender in self._senders:
                self._batches.put(_CLOSE)
            for sender in self._senders:
                sender.join()
            self._ended.set()

    def _gather(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is _CLOSE:
                return
            self._made_room(1)  # taken for the next batch, while it waits for a sender
            self._slots.acquire()  # a sender is free: what waits now, and for the linger, goes in this batch
            batch, deadline = [first], time.monotonic() + self._linger
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is _CLOSE:
                    closing = True
                    break
                batch.append(item)
            self._made_room(len(batch) - 1)
            self._batches.put(batch)

    def _made_room(self, sends: int) -> None:
        """`sends` left the queue for a batch: as many blocked sends may go on."""
        with self._lock:
            self._waiting -= sends
            self._room.notify(sends)

    def _send_loop(self) -> None:
        while (batch := self._batches.get()) is not _CLOSE:
            try:
                self._send_batch(batch)
            except BaseException as exc:  # the sender lives on (the producer would stall): its sends fail with it
                for future in batch:
                    if not future.done():
                        future.set_exception(exc)
            finally:
                self._slots.release()
                with self._lock:  # answered, or cancelled by their callers
                    self._pending.difference_update(batch)

    def _send_batch(self, batch: list[_SendFuture]) -> None:
        # A future its caller cancelled is not sent; the others can no longer be cancelled.
        batch = [future for future in batch if future.set_running_or_notify_cancel()]
        if not batch:
            return
        bodies = [future.body for future in batch]
        results: list[SendResult] | list[BaseException]
        try:
            sends = self._client._send_contexts(bodies, [future.context for future in batch])
            results = self._client._send_batch(bodies, sends)
        except BaseException as exc:  # the whole batch failed: each of its sends with the reason
            results = [exc] * len(batch)
        with self._answered:  # running, so no longer cancellable: each is answered here
            for future, result in zip(batch, results):
                future._answer(result)
            self._answered.notify_all()
        for future in batch:
            future._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own, as set_result runs it


def _say_lost(pending: dict[asyncio.Future[Message], Body]) -> None:
    """Logs the sends of an AsyncProducer that will never be sent (its task ended, or its loop closed)."""
    _log_lost([body["msgId"] for future, body in pending.items() if not future.done()])


def _log_lost(msg_ids: list[str], why: str = "") -> None:
    """The lost sends' warning; `why`: the error of their failed sending as the loop ended."""
    if msg_ids:
        log.warning("an AsyncProducer never closed lost %d sends (msgIds %s)%s: close it with await aclose() or "
                    "async with", len(msg_ids), ", ".join(msg_ids[:10]) + (", ..." if len(msg_ids) > 10 else ""),
                    f" as its loop ended, their sending failed ({why})" if why else "")


class AsyncProducer:
    """Producer for AsyncClient: `send()` answers an asyncio Future of the stored Message; one task
    gathers the sends of `linger_ms` after the first waiting one (or `max_batch`, at most
    MAX_BATCH_SEND) into one call, up to `in_flight` calls out at once. At most `max_queue` sends
    wait for a batch: beyond them `send()` raises ProducerFull and `await send_when_room()` waits
    for room. Made inside a running event loop; `flush()` and `aclose()` are awaited. Close it: one
    not closed sends its pending sends when asyncio.run ends (which cancels the tasks left), but
    those its loop closed under it are lost, logged when it is collected or at interpreter exit
    (those whose sending failed then too, with the error: no task is left to read their futures)."""

    def __init__(self, client: AsyncClient, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4,
                 max_queue: int = 100_000):
        self._client, self._linger = client, linger_ms / 1000
        self._max_batch = _checked_batch(max_batch, in_flight, max_queue)
        self._max_queue = max_queue
        self._room = asyncio.Event()  # set when a send left the queue
        self._slots = asyncio.Semaphore(in_flight)
        self._sending: set[asyncio.Task[None]] = set()
        self._queue: asyncio.Queue[tuple[Body, asyncio.Future[Message]]] = asyncio.Queue()
        self._pending: dict[asyncio.Future[Message], Body] = {}  # the sends not answered yet
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._run())
        # Said once: when the task ends, or for a task its closed loop left waiting, at collection or exit.
        self._say_lost = weakref.finalize(self, _say_lost, self._pending)
        self._task.add_done_callback(lambda _task: self._say_lost())

    def send(self, topic: str, msg: str, **options: Any) -> asyncio.Future[Message]:
        body = send_body(topic, msg, **options)
        if self._closed:
            raise RuntimeError("the producer is closed")
        if self._queue.qsize() >= self._max_queue:
            raise ProducerFull("the producer's queue is full: sends come faster than the server takes them")
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[future] = body
        future.add_done_callback(self._pending.pop)  # not a method of self: _say_lost's finalizer holds it
        self._queue.put_nowait((body, future))
        return future

    async def send_when_room(self, topic: str, msg: str, **options: Any) -> asyncio.Future[Message]:
        """send(), first waiting while max_queue sends wait for a batch."""
        while self._queue.qsize() >= self._max_queue and not self._closed:
            self._room.clear()
            await self._room.wait()
        return self.send(topic, msg, **options)

    async def flush(self) -> None:
        """Waits until every send made before this call is answered."""
        if self._pending:
            await asyncio.wait(list(self._pending))

    async def aclose(self) -> None:
        """Takes no more sends, waits for those pending and ends the sending task. Cancelled (a
        timeout around it), it leaves the sends going: a later aclose waits for them again."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_CLOSE)
        if not self._task.cancelled():  # cancelled as its loop ended: what it could send, it sent then
            await asyncio.shield(self._task)  # a cancelled wait must not cancel the sending

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> None:
        try:
            await self._gather()
            await self._sent()
        except asyncio.CancelledError:
            # Cancelled with the loop's other tasks, never closed (asyncio.run ends so), the loop runs
            # until they end: what is pending, the batches cancelled with it included, is sent (same msgIds).
            self._closed = True
            await self._sent()
            left = list(self._pending.items())
            for start in range(0, len(left), self._max_batch):
                await self._send_batch([(body, future) for future, body in left[start:start + self._max_batch]])
            # Their senders' tasks are ending too: a failure left in a future would go unread, so it is said here.
            failed: dict[str, list[str]] = {}
            for future, body in left:
                if not future.cancelled() and (error := future.exception()) is not None:
                    failed.setdefault(f"{type(error).__name__}: {error}", []).append(body["msgId"])
            for why, msg_ids in failed.items():
                _log_lost(msg_ids, why)
            raise

    async def _sent(self) -> None:
        """Waits for the batches out."""
        if self._sending:
            await asyncio.wait(list(self._sending))

    async def _gather(self) -> None:
        closing = False
        while not closing:
            first = await self._queue.get()
            if first is _CLOSE:
                return
            self._room.set()
            await self._slots.acquire()
            if self._queue.qsize() + 1 < self._max_batch:
                await asyncio.sleep(self._linger)  # then take what came meanwhile, without waiting more
            batch = [first]
            while len(batch) < self._max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is _CLOSE:
                    closing = True
                    break
                batch.append(item)
            self._room.set()  # send_when_room's waits
            task = asyncio.create_task(self._send([(body, future) for body, future in batch if not future.done()]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Body, asyncio.Future[Message]]]) -> None:
        try:
            await self._send_batch(batch)
        finally:
            self._slots.release()

    async def _send_batch(self, batch: list[tuple[Body, asyncio.Future[Message]]]) -> None:
        if not batch:
            return
        results: list[SendResult] | list[Exception]
        try:
            results = await self._client._send_batch([body for body, _future in batch])
        except Exception as exc:  # the whole batch failed: each of its sends with the reason
            results = [exc] * len(batch)
        for (_body, future), result in zip(batch, results):
            if future.done():  # cancelled by its caller meanwhile
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
