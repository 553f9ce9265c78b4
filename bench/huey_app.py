"""The huey application bench.python_queues measures (the reference queue of issue 18): an empty
task and one that records how late it started. Its consumers run as real processes:

    BENCH_HUEY_REDIS_URL=redis://... python -m huey.bin.huey_consumer bench.huey_app.huey
"""
import os
import time

from huey import RedisHuey

from bench.lateness_notes import LatenessNotes

LATENESS_KEY = "bench:huey:lateness"
REDIS_URL = os.environ.get("BENCH_HUEY_REDIS_URL", "redis://127.0.0.1:6379/0")

huey = RedisHuey("bench", url=REDIS_URL)
notes = LatenessNotes(LATENESS_KEY, REDIS_URL)


@huey.task()
def noop():
    pass


@huey.task()
def record_lateness(due_ms: float):
    """Started (due_ms given as its eta): notes ms started - due for the Redis list the benchmark reads."""
    notes.add(time.time() * 1000 - due_ms)
