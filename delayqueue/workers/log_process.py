"""The log process of `manage.py run_scanners`: the history writer of the topics each of its
scanners holds (workers/log_writer.py) and each namespace's schedule planner
(workers/scheduler.py) run in a child process of their own.

Both do Python work by the batch (parsing thousands of stream entries, preparing thousands of
sends a second) which, on the scanner's event loop or on a thread beside it under the same
interpreter lock, held due promotions up (docs/benchmarks.md, "Schedules").

The parent tells the child, over a pipe, each scanner's namespace, lock token and held topics
whenever they change. The child ends when told to stop, on SIGTERM or SIGINT, and when the pipe
closes (the parent was killed). A child that dies is started again at the parent's next check
and told everything again; meanwhile the events wait in Redis, and the ticks already sent
(SCHEDULE_LEAD_MILLIS ahead) fire, so a short gap loses nothing.
"""
import asyncio
import logging
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Iterable

from delayqueue.live.keys import Shard

log = logging.getLogger(__name__)

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # where `delayqueue` and the Django project are imported from
CHECK_SECONDS = 1.0  # how often the parent looks whether its child still runs
STOP_SECONDS = 10.0  # how long a stopping child may finish its round before it is killed


class LogProcess:
    """The parent's side: starts the child, tells it what the scanners hold, and starts it again
    if it dies."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, frozenset[Shard]]] = {}  # namespace -> (scanner token, topics)
        self._unsent: set[str] = set()
        self._changed = asyncio.Event()
        self._process: subprocess.Popen | None = None
        self._pipe: Connection | None = None

    def hold(self, *, namespace: str, owner: str, topics: Iterable[Shard]) -> None:
        """The scanner `owner` of `namespace` holds `topics` now (the first call for a namespace
        starts its writer and planner in the child)."""
        self._held[namespace] = (owner, frozenset(topics))
        self._unsent.add(namespace)
        self._changed.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Runs the child until `stopping` is set, then stops it."""
        self._start()
        try:
            while not stopping.is_set():
                if self._process.poll() is not None:
                    log.warning("the log process %d ended (exit code %s): starting it again", self._process.pid,
                                self._process.returncode)
                    self._start()
                self._changed.clear()  # before sending: what changes meanwhile is sent at once after
                await self._send_unsent()
                waiting = [asyncio.ensure_future(event.wait()) for event in (stopping, self._changed)]
                await asyncio.wait(waiting, timeout=CHECK_SECONDS, return_when=asyncio.FIRST_COMPLETED)
                for each in waiting:
                    each.cancel()
        finally:
            await self._stop()

    def _start(self) -> None:
        # A fresh interpreter (a fork would copy this process' event loop, sockets and threads),
        # named in `ps` for what it is; the pipe is its stdin.
        if self._pipe is not None:
            self._pipe.close()  # a dead child's
        reading, writing = os.pipe()
        self._process = subprocess.Popen([sys.executable, "-c", f"from {__name__} import main; main()"], stdin=reading,
                                         cwd=SOURCE_ROOT)
        os.close(reading)
        self._pipe = Connection(writing, readable=False)
        self._unsent = set(self._held)
        log.info("log process %d started (history writer and schedule planner)", self._process.pid)

    async def _send_unsent(self) -> None:
        sending, self._unsent = self._unsent, set()
        try:
            for namespace in sorted(sending):
                owner, topics = self._held[namespace]
                # On a thread: a child busy for a moment must not block this loop on a full pipe.
                await asyncio.to_thread(self._pipe.send, ("hold", namespace, owner, topics))
        except OSError:
            self._unsent |= sending  # the child is gone: the check starts it again and tells it all
            log.debug("the log process did not take what the scanners hold: it is gone")

    async def _stop(self) -> None:
        try:
            await asyncio.to_thread(self._pipe.send, ("stop",))
        except OSError:
            pass  # gone already
        self._pipe.close()
        try:
            await asyncio.to_thread(self._process.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("the log process %d did not stop within %.0f s: killed", self._process.pid, STOP_SECONDS)
            self._process.kill()
            await asyncio.to_thread(self._process.wait)


def main() -> None:
    """The child: sets Django up (its settings module is the parent's, from the environment)
    and runs the writers and planners it is told of through its stdin."""
    import django
    import uvloop

    django.setup()
    sys.exit(uvloop.run(_serve(Connection(sys.stdin.fileno(), writable=False))))


async def _serve(pipe: Connection) -> int:
    # Imported once Django is set up: they reach its models.
    from delayqueue.config.settings import load_config
    from delayqueue.runtime import Runtime
    from delayqueue.workers.log_writer import LogWriter
    from delayqueue.workers.scheduler import Scheduler

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    root = Runtime(load_config())
    held: dict[str, frozenset[Shard]] = {}
    writers: dict[str, LogWriter] = {}
    work: list[asyncio.Task] = []
    failed: list[BaseException] = []

    def ended(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            failed.append(task.exception())
            log.error("log process: %s failed", task.get_name(), exc_info=task.exception())
            stopping.set()

    def start(namespace: str, owner: str) -> None:
        rt = root.for_namespace(namespace)
        rt.set_process(f"scanner {owner}")  # the history rows name the scanner, as its own transitions do
        runners = {f"planner {namespace}": Scheduler(rt, owner)}
        if rt.config.message_log:
            writers[namespace] = runners[f"log writer {namespace}"] = LogWriter(rt, lambda: held[namespace])
        for name, runner in runners.items():
            work.append(loop.create_task(runner.run(stopping), name=name))
            work[-1].add_done_callback(ended)

    def received() -> None:
        try:
            while pipe.poll():
                kind, *told = pipe.recv()
                if kind == "stop":
                    stopping.set()
                    return
                namespace, owner, topics = told
                if namespace not in held:  # its first word: with the log off it has a planner and no writer
                    start(namespace, owner)
                held[namespace] = topics
        except (EOFError, OSError):  # the parent is gone
            loop.remove_reader(pipe.fileno())
            stopping.set()

    loop.add_reader(pipe.fileno(), received)
    try:
        await stopping.wait()
        await asyncio.gather(*work, return_exceptions=True)
    finally:
        await root.close()
    log.info("log process stopped: history rows written %s",
             {namespace: writer.written for namespace, writer in sorted(writers.items())})
    return 1 if failed else 0
