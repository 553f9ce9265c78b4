"""Wakes long polls held in this process when a topic's ready list gets messages.

One pub/sub subscription per process. The Lua scripts publish a topic on its ready
channel when its ready list goes from empty to non-empty; each process then wakes its
oldest waiter on that topic. A waiter that pulls and sees messages left wakes the next
one (`pass_on`), across processes if this one has nobody left waiting.
"""
import asyncio
import logging
from collections import deque

from delayqueue.live import store
from delayqueue.stopping import cancel_and_wait

log = logging.getLogger(__name__)


class ReadyNotifier:
    def __init__(self, redis_url: str, redis_timeout: float, channel: str):
        self._redis_url = redis_url
        self._redis_timeout = redis_timeout
        self._channel = channel
        self._waiters: dict[str, deque[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None
        self._subscribed = asyncio.Event()
        self._publisher = None

    async def start(self) -> None:
        self._publisher = store.connect_pubsub_node(self._redis_url, self._redis_timeout)
        self._task = asyncio.get_running_loop().create_task(self._listen(), name="ready-notifier")
        await self._subscribed.wait()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._publisher is not None:
            await self._publisher.aclose()

    def register(self, topic: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, deque()).append(future)
        return future

    def discard(self, topic: str, future: asyncio.Future) -> None:
        """Forget a waiter; a wake it received but will not use goes to the next waiter."""
        queue = self._waiters.get(topic)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self._waiters[topic]
        elif future.done() and not future.cancelled() and future.result():  # True: it was woken
            self.wake(topic, 1)

    def wake(self, topic: str, count: int) -> int:
        """Wakes up to `count` of this process's waiters on the topic, oldest first."""
        queue = self._waiters.get(topic)
        woken = 0
        while queue and woken < count:
            future = queue.popleft()
            if not future.done():
                future.set_result(True)
                woken += 1
        if queue is not None and not queue:
            del self._waiters[topic]
        return woken

    async def pass_on(self, topic: str, remaining: int) -> None:
        """Messages are left in the ready list after a pull: wake waiters to take them."""
        if self.wake(topic, remaining) < remaining:
            await self._publisher.publish(self._channel, topic)

    def waiting(self, topic: str) -> int:
        return len(self._waiters.get(topic, ()))

    def _wake_everyone(self) -> None:
        for topic in list(self._waiters):
            self.wake(topic, len(self._waiters.get(topic, ())))

    async def _listen(self) -> None:
        backoff = 0.05
        while True:
            client = store.connect_pubsub_node(self._redis_url, self._redis_timeout)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                if self._subscribed.is_set():
                    # Wakes may have been missed while disconnected: let every waiter pull again.
                    self._wake_everyone()
                self._subscribed.set()
                backoff = 0.05
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message["type"] == "message":
                        self.wake(message["data"], 1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost: back off and subscribe again
                log.warning("ready notifier lost its subscription (%s); retrying in %.2fs", exc, backoff)
                self._subscribed.set()  # waiters still time out and pull; do not block start()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except Exception:
                    pass
