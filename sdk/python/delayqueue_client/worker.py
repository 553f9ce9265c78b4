"""Worker: long-polls one topic in batches, runs a handler per message (a thread pool for a Client
and a plain function, tasks for an AsyncClient and a coroutine function), acks successes in shared
ackMsgBatch calls, nacks failures (the topic's retry backoff applies), dead-letters on DeadLetter,
touches messages whose handler runs past half the ack timeout, and stops gracefully."""
import asyncio
import inspect
import logging
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, cast

from delayqueue_client.client import AsyncClient, Client
from delayqueue_client.errors import (BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, NotFound,
                                      RateLimited, Unauthorized)
from delayqueue_client.message import Message

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
FATAL = (BadRequest, Unauthorized, Forbidden, NotFound)
POLL_STEP = 0.1  # seconds: how often blocked waits look at the stop flag (set by signal handlers)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Held:
    """A pulled message not yet settled (acked, nacked or dead-lettered)."""
    message: Message
    touch_at: float  # time.monotonic() at which to move its ack deadline again
    running: bool = True


class Worker:
    """`Worker(client, topic, handler, concurrency=8)`. `run()` blocks until `stop()` (or SIGTERM /
    SIGINT when run in the main thread); with an AsyncClient and an async handler, `await
    worker.run_async()` (or `run()`, which runs it in a new event loop).

    `concurrency` handlers run at once; up to `batch` messages are in hand unhandled, so the next
    poll is out while handlers run and while their acks are being sent. By default the batch adapts
    to how long handlers take (see QUEUED_WORK_SECONDS)."""

    def __init__(self, client: Client | AsyncClient, topic: str, handler: Callable[[Message], object], *,
                 concurrency: int = 8, batch: int | None = None, ack_timeout_ms: int | None = None,
                 wait_ms: int = 5_000):
        self.is_async = isinstance(client, AsyncClient)
        if self.is_async != inspect.iscoroutinefunction(handler):
            raise TypeError("an AsyncClient needs an async handler (async def), a Client a plain function")
        if concurrency < 1 or (batch is not None and batch < 1):
            raise ValueError("concurrency and batch must be at least 1")
        if ack_timeout_ms is not None and ack_timeout_ms < 2:
            raise ValueError("ack_timeout_ms must be at least 2 (ms)")
        self.client, self.topic, self.handler = client, topic, handler
        self.concurrency = concurrency
        self.adaptive = batch is None
        self.batch = max(batch or FIRST_BATCH_PER_HANDLER * concurrency, concurrency)
        self._handler_seconds: float | None = None  # a moving mean of how long handlers take
        self.ack_timeout_ms = ack_timeout_ms
        self.wait_ms = wait_ms
        # A plain flag, not an Event: a signal handler may interrupt a thread holding an Event's lock.
        self._stopping = False
        self._held: dict[str, _Held] = {}
        self._unhandled = 0  # held messages whose handler has not returned
        self._room_changed: asyncio.Event | None = None  # run_async's wake for its polls (threads: _room)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)

    @property
    def _sync_client(self) -> Client:
        return cast(Client, self.client)  # run() uses it when not is_async

    @property
    def _async_client(self) -> AsyncClient:
        return cast(AsyncClient, self.client)  # run_async() uses it when is_async

    @property
    def _ack_timeout(self) -> int:
        assert self.ack_timeout_ms is not None, "resolved as run starts"
        return self.ack_timeout_ms

    def stop(self) -> None:
        """Stop pulling; run() returns once every message in hand is handled and settled. Safe from
        any thread and from a signal handler."""
        self._stopping = True

    # --- shared logic

    def _outcome(self, message: Message, error: BaseException | None) -> str:
        if error is None:
            return ACK
        if isinstance(error, DeadLetter):
            log.warning("handler dead-lettered %s/%s: %s", message.topic, message.msg_id, error)
            return DEAD
        log.error("handler failed on %s/%s; nacked, the topic's retry backoff applies", message.topic,
                  message.msg_id, exc_info=error)
        return NACK

    def _hold(self, message: Message, pulled_at: float) -> None:
        # The server's deadline counts from its answer, so from the pull's start is a safe estimate.
        with self._lock:
            self._held[message.msg_id] = _Held(message, pulled_at + self._ack_timeout / 2000)
            self._unhandled += 1

    def _release(self, msg_ids: list[str]) -> None:
        with self._room:
            for msg_id in msg_ids:
                self._held.pop(msg_id, None)
            self._room_freed()

    def _finished(self, msg_id: str, seconds: float | None) -> None:
        """The handler of msg_id returned (or raised) after `seconds` (None: it never started)."""
        with self._room:
            if held := self._held.get(msg_id):
                held.running = False
            self._unhandled -= 1
            if self.adaptive and seconds is not None:
                self._timed(seconds)
            self._room_freed()

    def _room_freed(self) -> None:
        """Wakes a poll waiting for room (called holding _room)."""
        self._room.notify_all()
        if self._room_changed is not None:
            self._room_changed.set()

    def _timed(self, seconds: float) -> None:
        mean = self._handler_seconds
        self._handler_seconds = mean = seconds if mean is None else mean + 0.1 * (seconds - mean)
        queued = QUEUED_WORK_SECONDS / max(mean, 1e-6) * self.concurrency
        self.batch = max(self.concurrency, min(MAX_DEFAULT_BATCH, int(self.concurrency + queued)))

    def _free(self) -> int:
        """How many messages the next poll may take (0: wait): the batch less those unhandled,
        while the outcomes not yet answered stay few (a server slow to take acks slows the polls)."""
        if len(self._held) >= self.batch + MAX_SETTLE_BATCH:
            return 0
        return self.batch - self._unhandled

    def _due_touches(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [i for i, h in self._held.items() if h.running and h.touch_at <= now]

    def _next_touch_in(self) -> float:
        with self._lock:
            times = [h.touch_at for h in self._held.values() if h.running]
        return min(POLL_STEP, max(0.0, min(times) - time.monotonic())) if times else POLL_STEP

    def _touched(self, msg_id: str, called_at: float, error: DelayQueueError | None) -> None:
        with self._lock:
            held = self._held.get(msg_id)
            if held is None:
                return
            if error is None:
                held.touch_at = called_at + self._ack_timeout / 2000
            elif isinstance(error, (Conflict, NotFound)):
                log.warning("%s/%s is no longer being consumed (ack timeout passed?): it will be delivered again",
                            self.topic, msg_id)
                held.touch_at = float("inf")
            else:  # transient: try again soon, well before the deadline
                log.warning("touch of %s/%s failed: %s", self.topic, msg_id, error)
                held.touch_at = called_at + min(0.2, self._ack_timeout / 8000)

    def _settle_groups(self, results: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
        """(outcome, msg_ids) calls for these handler results, each at most MAX_SETTLE_BATCH ids."""
        groups: dict[str, list[str]] = {}
        for msg_id, outcome in results:
            groups.setdefault(outcome, []).append(msg_id)
        return [(outcome, ids[i:i + MAX_SETTLE_BATCH]) for outcome, ids in groups.items()
                for i in range(0, len(ids), MAX_SETTLE_BATCH)]

    def _settle_kwargs(self, outcome: str) -> dict[str, bool]:
        return {"ack": outcome == ACK, "dead_letter": outcome == DEAD}

    def _settled(self, outcome: str, msg_ids: list[str], done: list[bool]) -> None:
        late = [i for i, ok in zip(msg_ids, done) if not ok]
        if late:
            log.warning("%s of %s/%s came too late (no longer consuming: delivered again or ended)", outcome,
                        self.topic, ", ".join(late))
        self._release(msg_ids)

    def _settle_failed(self, outcome: str, msg_ids: list[str], error: DelayQueueError) -> bool:
        """Whether to try again: while some of them may still be before their ack deadline."""
        log.warning("%s of %d message(s) of %s failed: %s", outcome, len(msg_ids), self.topic, error)
        with self._lock:
            before_deadline = any(self._held[i].touch_at != float("inf") and
                                  time.monotonic() < self._held[i].touch_at + self._ack_timeout / 2000
                                  for i in msg_ids if i in self._held)
        if not before_deadline or isinstance(error, FATAL):
            log.error("gave up the %s of %s/%s: the server delivers them again after their ack timeout", outcome,
                      self.topic, ", ".join(msg_ids))
            self._release(msg_ids)
            return False
        return True

    def _pull_failed(self, error: DelayQueueError) -> float:
        """Seconds to wait before the next pull; raises what no retry can change."""
        if isinstance(error, FATAL):
            raise error
        log.warning("pull from %s failed: %s", self.topic, error)
        return error.retry_after if isinstance(error, RateLimited) and error.retry_after else 1.0

    def _resolved_ack_timeout(self, config: dict[str, Any] | None) -> int:
        if self.ack_timeout_ms is not None:
            return self.ack_timeout_ms
        return int(config["ackTimeoutMillis"]) if config else DEFAULT_ACK_TIMEOUT_MS

    # --- threads (Client)

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Blocks until stopped; then finishes and settles every message in hand. In the main thread
        (and install_signal_handlers), SIGTERM and SIGINT stop it; the previous handlers come back after."""
        if self.is_async:
            return asyncio.run(self.run_async(install_signal_handlers=install_signal_handlers))
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, lambda *_: self.stop()) for sig in SIGNALS}
        try:
            self._run_threads()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_threads(self) -> None:
        if self.ack_timeout_ms is None:
            try:
                self.ack_timeout_ms = self._resolved_ack_timeout(self._sync_client.topic_config(self.topic))
            except Forbidden:
                self.ack_timeout_ms = self._resolved_ack_timeout(None)
        results: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        settler = threading.Thread(target=self._settle_thread, args=(results,), name=f"dq-settle-{self.topic}",
                                   daemon=True)
        settler.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"dq-worker-{self.topic}")
        try:
            while not self._stopping:
                free = self._wait_for_room()
                if not free:
                    break
                pulled_at = time.monotonic()
                try:
                    messages = self._sync_client.pull(self.topic, batch=free,
                                                ack_timeout_ms=self.ack_timeout_ms, wait_ms=self.wait_ms)
                except DelayQueueError as error:
                    self._sleep(self._pull_failed(error))
                    continue
                for message in messages:
                    self._hold(message, pulled_at)
                    pool.submit(self._handle, message, results)
        finally:
            pool.shutdown(wait=True)  # every handler has queued its result
            results.put(None)
            settler.join()

    def _wait_for_room(self) -> int:
        with self._room:
            while self._free() <= 0 and not self._stopping:
                self._room.wait(POLL_STEP)
            return 0 if self._stopping else self._free()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < end:
            time.sleep(min(POLL_STEP, end - time.monotonic()))

    def _handle(self, message: Message, results: queue.SimpleQueue[tuple[str, str] | None]) -> None:
        error, started = None, time.monotonic()
        try:
            self.handler(message)
        except BaseException as exc:  # SystemExit too: its message must still be settled
            error = exc
        self._finished(message.msg_id, time.monotonic() - started)
        results.put((message.msg_id, self._outcome(message, error)))

    def _settle_thread(self, results: queue.SimpleQueue[tuple[str, str] | None]) -> None:
        closing, again = False, list[tuple[str, list[str]]]()
        while not closing or self._held:
            gathered = []
            try:  # results that arrive while the previous call was out share the next one
                item = results.get(timeout=self._next_touch_in())
                while True:
                    if item is None:
                        closing = True
                    else:
                        gathered.append(item)
                    item = results.get_nowait()
            except queue.Empty:
                pass
            # A failed call is tried again on the next turn (at most POLL_STEP later), after the
            # touches: a server refusing acks for a while must not let running messages time out.
            groups, again = again + self._settle_groups(gathered), []
            for outcome, msg_ids in groups:
                try:
                    done = self._sync_client.ack_many(self.topic, msg_ids, **self._settle_kwargs(outcome))
                except DelayQueueError as error:
                    if self._settle_failed(outcome, msg_ids, error):
                        again.append((outcome, msg_ids))
                else:
                    self._settled(outcome, msg_ids, done)
            for msg_id in self._due_touches():
                called_at = time.monotonic()
                try:
                    self._sync_client.touch(self.topic, msg_id, ack_timeout_ms=self._ack_timeout)
                    self._touched(msg_id, called_at, None)
                except DelayQueueError as error:
                    self._touched(msg_id, called_at, error)

    # --- tasks (AsyncClient)

    async def run_async(self, *, install_signal_handlers: bool = True) -> None:
        """run() for an AsyncClient and an async handler, in the running event loop."""
        if not self.is_async:
            raise TypeError("run_async() needs an AsyncClient and an async handler; use run()")
        loop = asyncio.get_running_loop()
        installed = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
        try:
            await self._run_tasks()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _run_tasks(self) -> None:
        if self.ack_timeout_ms is None:
            try:
                self.ack_timeout_ms = self._resolved_ack_timeout(await self._async_client.topic_config(self.topic))
            except Forbidden:
                self.ack_timeout_ms = self._resolved_ack_timeout(None)
        results: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        settler = asyncio.create_task(self._settle_task(results))
        handlers: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(self.concurrency)
        self._room_changed = asyncio.Event()
        try:
            while not self._stopping:
                while self._free() <= 0 and not self._stopping:
                    self._room_changed.clear()
                    try:
                        await asyncio.wait_for(self._room_changed.wait(), POLL_STEP)
                    except asyncio.TimeoutError:
                        pass
                if self._stopping:
                    break
                pulled_at = time.monotonic()
                try:
                    messages = await self._async_client.pull(self.topic, batch=self._free(),
                                                      ack_timeout_ms=self.ack_timeout_ms, wait_ms=self.wait_ms)
                except DelayQueueError as error:
                    end = time.monotonic() + self._pull_failed(error)
                    while not self._stopping and time.monotonic() < end:
                        await asyncio.sleep(POLL_STEP)
                    continue
                for message in messages:
                    self._hold(message, pulled_at)
                    task = asyncio.create_task(self._handle_async(message, results, slots))
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)
        finally:
            # Shielded: a cancelled run_async still settles what it holds.
            await asyncio.shield(self._finish_tasks(handlers, results, settler))

    async def _finish_tasks(self, handlers: set[asyncio.Task[None]], results: asyncio.Queue[tuple[str, str] | None],
                            settler: asyncio.Task[None]) -> None:
        if handlers:
            await asyncio.gather(*handlers, return_exceptions=True)
        results.put_nowait(None)
        await settler

    async def _handle_async(self, message: Message, results: asyncio.Queue[tuple[str, str] | None],
                            slots: asyncio.Semaphore) -> None:
        error, started = None, None
        try:
            async with slots:
                started = time.monotonic()
                await cast(Awaitable[object], self.handler(message))  # an async def, checked in __init__
        except BaseException as exc:  # a cancelled handler too: its message is nacked, then it is cancelled
            error = exc
        self._finished(message.msg_id, time.monotonic() - started if started is not None else None)
        results.put_nowait((message.msg_id, self._outcome(message, error)))
        if error is not None and not isinstance(error, Exception):
            raise error

    async def _settle_task(self, results: asyncio.Queue[tuple[str, str] | None]) -> None:
        closing, again = False, list[tuple[str, list[str]]]()
        while not closing or self._held:
            gathered = []
            try:
                item = await asyncio.wait_for(results.get(), self._next_touch_in())
                while True:
                    if item is None:
                        closing = True
                    else:
                        gathered.append(item)
                    item = results.get_nowait()
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                pass
            groups, again = again + self._settle_groups(gathered), []  # as in _settle_thread
            for outcome, msg_ids in groups:
                try:
                    done = await self._async_client.ack_many(self.topic, msg_ids, **self._settle_kwargs(outcome))
                except DelayQueueError as error:
                    if self._settle_failed(outcome, msg_ids, error):
                        again.append((outcome, msg_ids))
                else:
                    self._settled(outcome, msg_ids, done)
            for msg_id in self._due_touches():
                called_at = time.monotonic()
                try:
                    await self._async_client.touch(self.topic, msg_id, ack_timeout_ms=self._ack_timeout)
                    self._touched(msg_id, called_at, None)
                except DelayQueueError as error:
                    self._touched(msg_id, called_at, error)

