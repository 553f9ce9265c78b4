"""Wake-ups to the tens of microseconds: the scanner's topic workers, and long polls waiting for a due time.

The event loop's own timers end in epoll, whose timeout is whole milliseconds rounded up: a
sleep until a message's due time ends on average half a millisecond late, most of what a
promotion is late by. This timer thread waits on a condition variable (microsecond timeouts)
and hands what fell due to the loop, whose self-pipe wakes epoll at once.
"""
import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


class PreciseTimer:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="precise-timer", daemon=True)
        self._thread.start()

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Runs callback in the loop at `when`, a time.monotonic() time (whatever clock the loop keeps)."""
        order = next(self._order)
        with self._cond:
            heapq.heappush(self._heap, (when, order, callback))
            if self._heap[0][1] == order:  # the new earliest: the thread must wait less
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                delay = self._heap[0][0] - now
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                # Everything due goes to the loop in one hand-over: thousands of topics falling
                # due at once cost one wake of the loop, not one each.
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                try:
                    self._loop.call_soon_threadsafe(_run_all, due)
                except RuntimeError:  # the loop is closed: nothing left to wake
                    return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5)
