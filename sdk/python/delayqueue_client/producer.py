"""The batching producers: sends from any number of threads (Producer) or asyncio tasks
(AsyncProducer) gathered into sendMsgBatch calls."""
import asyncio
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from delayqueue_client._calls import send_body

_CLOSE = object()


def _check(max_batch: int, in_flight: int) -> None:
    if max_batch < 1 or in_flight < 1:
        raise ValueError(f"max_batch and in_flight must be at least 1, got {max_batch} and {in_flight}")


class Producer:
    """`send()` answers a Future of the stored Message at once; one thread gathers the sends of
    `linger_ms` after the first waiting one (or `max_batch` of them) into one sendMsgBatch, and up to
    `in_flight` batches are out at once (while all are, the sends waiting gather into the next one).
    Every message gets its msgId here, so a batch whose answer was lost, or an item a store was
    unavailable for, is sent again without doubles (Client.send_many's retries)."""

    def __init__(self, client, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4):
        _check(max_batch, in_flight)
        self._client, self._linger, self._max_batch = client, linger_ms / 1000, max_batch
        self._senders = ThreadPoolExecutor(in_flight, thread_name_prefix="delayqueue-producer-send")
        self._slots = threading.BoundedSemaphore(in_flight)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: set[Future] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="delayqueue-producer", daemon=True)
        self._thread.start()

    def send(self, topic: str, msg: str, **options) -> Future:
        """send()'s arguments (delay_ms, trigger_time, msg_id, ttl_ms, max_retry, priority); the
        Future fails with the message's error (RateLimited, BadRequest, ...) or the batch's."""
        body = send_body(topic, msg, **options)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the producer is closed")
            self._pending.add(future)
            self._queue.put((body, future))
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every send made before this call is answered."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Takes no more sends, waits for those pending and stops the sender thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_CLOSE)
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self) -> None:
        try:
            self._gather()
        finally:
            self._senders.shutdown(wait=True)

    def _gather(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is _CLOSE:
                return
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
            self._senders.submit(self._send, batch)

    def _send(self, batch: list) -> None:
        try:
            self._send_batch(batch)
        finally:
            self._slots.release()

    def _send_batch(self, batch: list) -> None:
        # A future its caller cancelled is not sent; the others can no longer be cancelled.
        batch = [(body, future) for body, future in batch if future.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            results = self._client._send_batch([body for body, _future in batch])
        except BaseException as exc:  # the whole batch failed: each of its sends with the reason
            for _body, future in batch:
                future.set_exception(exc)
            return
        for (_body, future), result in zip(batch, results):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


class AsyncProducer:
    """Producer for AsyncClient: `send()` answers an asyncio Future of the stored Message; one task
    gathers the sends of `linger_ms` after the first waiting one (or `max_batch`) into one call, up
    to `in_flight` calls out at once. Made inside a running event loop; `flush()` and `aclose()` are
    awaited."""

    def __init__(self, client, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4):
        _check(max_batch, in_flight)
        self._client, self._linger, self._max_batch = client, linger_ms / 1000, max_batch
        self._slots = asyncio.Semaphore(in_flight)
        self._sending: set[asyncio.Task] = set()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pending: set[asyncio.Future] = set()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, topic: str, msg: str, **options) -> asyncio.Future:
        body = send_body(topic, msg, **options)
        if self._closed:
            raise RuntimeError("the producer is closed")
        future = asyncio.get_running_loop().create_future()
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        self._queue.put_nowait((body, future))
        return future

    async def flush(self) -> None:
        """Waits until every send made before this call is answered."""
        if self._pending:
            await asyncio.wait(list(self._pending))

    async def aclose(self) -> None:
        """Takes no more sends, waits for those pending and ends the sending task."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_CLOSE)
        await self._task

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def _run(self) -> None:
        try:
            await self._gather()
        finally:
            if self._sending:
                await asyncio.wait(list(self._sending))

    async def _gather(self) -> None:
        closing = False
        while not closing:
            first = await self._queue.get()
            if first is _CLOSE:
                return
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
            task = asyncio.create_task(self._send([(body, future) for body, future in batch if not future.done()]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list) -> None:
        try:
            await self._send_batch(batch)
        finally:
            self._slots.release()

    async def _send_batch(self, batch: list) -> None:
        if not batch:
            return
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
