"""Wakes long polls held in this process when a topic gets ready messages.

One pub/sub subscription per process. The Lua scripts publish on the namespace's ready channel
when a topic (a shard of it) goes from no ready message to some (any priority), naming its ready
list, so the shard too; each process then wakes its oldest waiter on that topic, whose pull asks
that shard first. A waiter that pulls and sees messages left wakes the next
one (`pass_on`), across processes if this one has nobody left waiting.

A poll that found nothing ready but a message waiting also asks for a wake at its due time
(`wake_at`): the pull then made takes it the moment it is due (pull.lua makes due messages
ready), without waiting for the scanner to promote it and publish. Of a sharded topic, that
pull asks the message's shard first: the waiter is woken with it.
"""
import asyncio
from collections import deque

from delayqueue.core.stopping import cancel_and_wait
from delayqueue.core.timer import PreciseTimer
from delayqueue.live.client import connect_pubsub_node
from delayqueue.live.keys import NamespaceKeys, Shard
from delayqueue.live.pubsub import subscribe_forever


class ReadyNotifier:
    def __init__(self, redis_url: str, redis_timeout: float, ns: NamespaceKeys):
        self._redis_url = redis_url
        self._redis_timeout = redis_timeout
        self._ns = ns
        self._waiters: dict[str, deque[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None
        self._subscribed = asyncio.Event()
        self._publisher = None
        self._timer: PreciseTimer | None = None  # its thread starts with the first wake_at
        self._due_wakes: dict[str, float] = {}  # topic -> the earliest wake asked for (time.monotonic())

    async def start(self) -> None:
        self._publisher = connect_pubsub_node(self._redis_url, self._redis_timeout)
        self._task = asyncio.get_running_loop().create_task(self._listen(), name="ready-notifier")
        await self._subscribed.wait()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._publisher is not None:
            await self._publisher.aclose()
        if self._timer is not None:
            self._timer.close()

    def register(self, topic: str) -> asyncio.Future:
        """A waiter on the topic: its result is True when woken (or the shard to pull first, of a
        sharded topic), False at the waiter's own timeout."""
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

    def wake(self, topic: str, count: int, shard: Shard | None = None) -> int:
        """Wakes up to `count` of this process's waiters on the topic, oldest first (with the
        shard to pull first, when there is one)."""
        queue = self._waiters.get(topic)
        woken = 0
        while queue and woken < count:
            future = queue.popleft()
            if not future.done():
                future.set_result(shard or True)
                woken += 1
        if queue is not None and not queue:
            del self._waiters[topic]
        return woken

    def wake_at(self, topic: str, when: float, shard: Shard | None = None) -> None:
        """Wakes the topic's oldest waiter at `when` (time.monotonic()), when a message falls due
        (in `shard`, of a sharded topic); one wake per topic and due time, however many polls ask."""
        if self._due_wakes.get(topic, float("inf")) <= when:
            return
        self._due_wakes[topic] = when
        if self._timer is None:
            self._timer = PreciseTimer(asyncio.get_running_loop())
        self._timer.call_at(when, lambda: self._due(topic, when, shard))

    def _due(self, topic: str, when: float, shard: Shard | None) -> None:
        if self._due_wakes.get(topic) == when:
            del self._due_wakes[topic]
        self.wake(topic, 1, shard)

    async def pass_on(self, topic: str, remaining: int) -> None:
        """Messages are left ready after a pull: wake waiters to take them."""
        if self.wake(topic, remaining) < remaining:
            await self._publisher.publish(self._ns.ready_channel, self._ns.topic(topic).ready)

    def waiting(self, topic: str) -> int:
        return len(self._waiters.get(topic, ()))

    def _wake_everyone(self) -> None:
        for topic in list(self._waiters):
            self.wake(topic, len(self._waiters.get(topic, ())))

    async def _listen(self) -> None:
        def subscribed(rescan: bool) -> None:
            if rescan:  # wakes may have been missed while disconnected: let every waiter pull again
                self._wake_everyone()
            self._subscribed.set()

        def received(message: dict) -> None:
            if message["type"] == "message" and (shard := self._ns.shard_of_ready(message["data"])) is not None:
                self.wake(shard.topic, 1, shard if shard.count > 1 else None)

        # A lost subscription still releases start(): waiters time out and pull.
        await subscribe_forever(self._redis_url, self._redis_timeout, what="ready notifier",
                                channels=(self._ns.ready_channel,), on_message=received, on_subscribed=subscribed,
                                on_lost=self._subscribed.set)
