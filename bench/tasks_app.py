"""The tasks bench.python_queues sends and runs through `delayqueue worker bench.tasks_app --topics
T --processes N --threads M`: `noop()`, and `record_lateness(due_ms)`, which notes how late it
started (ms started - due_ms) for the Redis list LATENESS_KEY in REDIS_URL's Redis
(bench.lateness_notes). The App's client comes from DELAYQUEUE_URL."""
import os
import time

from bench.lateness_notes import LatenessNotes
from delayqueue_client import App

LATENESS_KEY = "bench:delayqueue:lateness"
app = App()
_notes: list[LatenessNotes] = []  # made in the worker process that first records


@app.task(topic="bench", name="noop")
def noop() -> None:
    pass


@app.task(topic="lateness", name="record_lateness")
def record_lateness(due_ms: int) -> None:
    started_ms = time.time() * 1000
    if not _notes:
        _notes.append(LatenessNotes(LATENESS_KEY, os.environ["REDIS_URL"]))
    _notes[0].add(started_ms - due_ms)
