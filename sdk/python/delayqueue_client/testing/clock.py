"""The fake server's clock: frozen until a test moves it (`advance`), or following the wall clock
(`real_time=True`), in epoch milliseconds as the server's Redis clock."""
import threading
import time
from datetime import timedelta
from typing import Callable


class FakeClock:
    """`FakeClock()` stands still at the wall-clock time it was made (or at `start`, epoch
    seconds) until `advance(seconds)`; `FakeClock(real_time=True)` runs with the wall clock, and
    `advance` still moves it ahead (a jump of its offset)."""

    def __init__(self, start: float | None = None, *, real_time: bool = False):
        self.real_time = real_time
        self._base_ms = int((time.time() if start is None else start) * 1000)
        self._real_origin_ns = time.time_ns()
        self._offset_ms = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        """The time in epoch ms, as the server's scripts read Redis' clock."""
        with self._lock:
            elapsed = (time.time_ns() - self._real_origin_ns) // 1_000_000 if self.real_time else 0
            return self._base_ms + elapsed + self._offset_ms

    def time(self) -> float:
        """The time in epoch seconds."""
        return self.now_ms() / 1000

    def advance(self, seconds: float | timedelta) -> None:
        """Moves the clock ahead; what falls due, times out or expires meanwhile happens, in the
        order of its times, before the next call reaches the server (and held long polls wake)."""
        amount = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if amount < 0:
            raise ValueError(f"a clock only moves ahead, got {amount} s")
        with self._lock:
            self._offset_ms += round(amount * 1000)
        for listener in list(self._listeners):
            listener()

    def on_advance(self, listener: Callable[[], None]) -> None:
        """Calls `listener` after every advance (the server settles what fell due and wakes long polls)."""
        self._listeners.append(listener)
