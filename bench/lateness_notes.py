"""How the consumers of bench.python_queues record how late each lateness task started: notes
kept in the process and appended to a Redis list in one RPUSH every RECORD_EVERY_S, so recording
costs a handler a list append, not a Redis round trip (one RPUSH a message cost delayqueue's
consumer more at 1,000 due/s than the queue did)."""
import threading
import time
from collections import deque

import redis

RECORD_EVERY_S = 0.1


class LatenessNotes:
    """`add(late_ms)` from any thread; a daemon thread, started by the first note, moves the notes
    to the list `key` in the Redis at `redis_url` for the life of the process."""

    def __init__(self, key: str, redis_url: str):
        self.key, self.redis_url = key, redis_url
        self._notes: deque[float] = deque()
        self._start = threading.Lock()
        self._recorder: threading.Thread | None = None

    def add(self, late_ms: float) -> None:
        self._notes.append(late_ms)
        if self._recorder is None:
            with self._start:
                if self._recorder is None:
                    self._recorder = threading.Thread(target=self._record, daemon=True)
                    self._recorder.start()

    def _record(self) -> None:
        conn = redis.Redis.from_url(self.redis_url)
        while True:
            time.sleep(RECORD_EVERY_S)
            taken = [self._notes.popleft() for _ in range(len(self._notes))]  # popleft: atomic beside appends
            if taken:
                conn.rpush(self.key, *(f"{late_ms:.3f}" for late_ms in taken))
