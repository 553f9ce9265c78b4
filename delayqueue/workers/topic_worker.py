"""A scanner's work on one topic it holds the lock of: move packed lists in ahead of their time,
promote due messages, requeue ack timeouts, expire TTLs and purge ended bodies, each script when
it has work, woken by the precise timer at the earliest due time or earlier by the schedule
channel."""
import asyncio
import functools
import logging
import time

from delayqueue.core.clock import wait_seconds
from delayqueue.core.stopping import cancel_and_wait
from delayqueue.live import scripts
from delayqueue.live.scripts import ScriptCall

log = logging.getLogger(__name__)

# Every script of a topic runs at least this often, even with nothing scheduled. A safety net
# only: sends and pulls that bring work earlier than what a topic sleeps towards wake it through
# the schedule channel, and losing the channel wakes every topic. Each looked-at topic costs
# five script calls, so with thousands of topics this bounds the idle load.
MAX_IDLE_SLEEP = 5.0
TIMER_SLACK = 0.001
ERROR_BACKOFF = 0.5


class TopicWorker:
    """Runs a topic's five scanner scripts, each when it has work: a script answers how long
    until its next item, and the worker's timer fires for the earliest; a wake from the
    schedule channel (something earlier arrived) runs all five. A topic with 5,000 others due
    at the same moment costs one promote call, not five calls."""

    # A packed list moves into the waiting set ahead of its second: first, so a late one is promoted at once.
    SCRIPTS = ("unpack_due", "promote_due", "requeue_timed_out", "expire", "purge_ended")
    COUNTS = dict(zip(SCRIPTS, ("unpacked", "promoted", "requeued", "expired", "purged")))

    def __init__(self, scanner, topic: str):
        self.scanner = scanner
        self.topic = topic
        self._wake = asyncio.Event()
        self._run_all = True  # the first pass looks at everything
        self._due_at = dict.fromkeys(self.SCRIPTS, 0.0)  # monotonic time each script has work again
        self._sleeps = 0
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"scan:{topic}")

    def wake(self) -> None:
        """The topic got earlier work (or the channel was lost and wakes may have been missed)."""
        self._run_all = True
        self._wake.set()

    def _call(self, name: str) -> ScriptCall:
        return scripts.BUILDERS[name](self.scanner.rt.context, self.topic)

    async def tick(self) -> float:
        """One pass over the scripts that have work (all of them after a wake); returns seconds
        until the next one has."""
        async with self.scanner.passes:  # the namespace's share of the process' Redis connection
            run_all, self._run_all = self._run_all, False
            now = time.monotonic()
            # A timer may fire a hair before the due time it was set for: that script runs now.
            names = [n for n in self.SCRIPTS if run_all or self._due_at[n] <= now + TIMER_SLACK]
            sent_at = time.time()
            results = await self.scanner.rt.scripts.run([self._call(name) for name in names])
        received_at, now = time.time(), time.monotonic()
        for name, result in zip(names, results):
            if isinstance(result, Exception):
                self._run_all = True  # try everything again after the back-off
                raise result
            self.scanner.counts[self.COUNTS[name]] += result.count
            wait = functools.partial(wait_seconds, server_now_us=result.server_now_us, sent_at=sent_at,
                                     received_at=received_at)
            due_in = wait(due_in_us=result.next_due_us) if result.next_due_us >= 0 else MAX_IDLE_SLEEP
            self._due_at[name] = now + min(due_in, MAX_IDLE_SLEEP)
            if not isinstance(result, scripts.PromoteReply):
                continue
            if result.stats:
                self.scanner.gather_stats(self.topic, result.stats)
            if result.expires_in_us >= 0:  # what it promoted may expire before what expire waits for
                self._due_at["expire"] = min(self._due_at["expire"], now + wait(due_in_us=result.expires_in_us))
        return min(self._due_at.values()) - now

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                delay = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scanning topic %s failed: %s", self.topic, exc)
                delay = ERROR_BACKOFF
            if delay > 0:
                # Woken by the precise timer at the due time, or earlier by the schedule channel;
                # a timer left over from an earlier sleep finds a newer generation and does nothing.
                self._sleeps += 1
                self.scanner.timer.call_at(time.monotonic() + delay, functools.partial(self._timer_fired, self._sleeps))
                await self._wake.wait()

    def _timer_fired(self, sleep: int) -> None:
        if sleep == self._sleeps:
            self._wake.set()

    async def stop(self) -> None:
        await cancel_and_wait(self.task)
