"""`delayqueue worker MODULE[:attr]`: a supervisor of N worker processes. Each child imports MODULE,
takes its App (the attribute named after the colon, else the one module-level object with a
`worker(...)` method) and runs `app.worker(topics=..., concurrency=threads or tasks, asynchronous=...,
max_messages=max_tasks_per_child).run()`.

A child that crashes (killed, or raising; a worker stopped hard by its failed settle loop exits at
once, its abandoned thread handlers with it), or exits soon after its start, is started again after
a backoff that doubles while it keeps doing so (so a child that always crashes or has no work does
not spin); one that served its max tasks, or exits after STABLE_AFTER, is replaced at once.
SIGTERM or SIGINT to the supervisor drains: it is forwarded as SIGTERM to every child (whose Worker
stops pulling, finishes and settles what it holds), and the supervisor exits once they have. A
second signal stops hard: forwarded as HARD_STOP_SIGNAL, the children give back the messages in
hand (nacked without delay) and exit; a child still running HARD_STOP_GRACE seconds later (a thread
handler that never returns) is killed, its messages left to their ack timeout. A child drains on any number of SIGTERMs:
systemd's stop sends one to every process of the unit, besides the one the supervisor forwards.

The children run in their own session: a Ctrl-C in the terminal reaches the supervisor only, which
forwards it (a second Ctrl-C as HARD_STOP_SIGNAL). A child whose supervisor is gone (killed
with SIGKILL, which it cannot forward) drains and exits, as on SIGTERM."""
import argparse
import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

log = logging.getLogger("delayqueue_client.supervisor")

RESTART_DELAY = 0.5  # seconds before restarting a child that crashed, doubling per crash in a row
MAX_RESTART_DELAY = 30.0
STABLE_AFTER = 30.0  # a child that ran this long: its crash restarts after RESTART_DELAY again, its exit at once
HARD_STOP_GRACE = 10.0  # seconds a child has to exit after a hard stop before it is killed
TURN = 0.1  # seconds between the supervisor's looks at its children and its stop level
ORPHAN_CHECK = 1.0  # seconds between a child's looks at whether its supervisor is still there
# The supervisor's pid, handed to each child: a child that read its parent pid only once started
# could read that of whoever adopted it, had the supervisor died meanwhile.
SUPERVISOR_PID = "DELAYQUEUE_WORKER_SUPERVISOR_PID"
# The supervisor's second stop, to its children (the first is SIGTERM). Not SIGQUIT: a child still
# starting (no handler yet) would dump core; SIGUSR1, as SIGTERM, ends it quietly.
HARD_STOP_SIGNAL = signal.SIGUSR1
# A child's exit code once its worker served --max-tasks-per-child: replaced at once, however short its
# life (an exit 0 soon after the start is a worker with nothing to do, restarted after the backoff).
SERVED_MAX_TASKS = 100
DEFAULT_CONCURRENCY = 8  # handler threads, or asyncio tasks with --async, per process


class UnusableApp(Exception):
    """MODULE[:attr] names no importable object with a worker(...) method, or one whose worker(...)
    refuses the options given (an App with no tasks, --async without an AsyncClient): a usage error."""


def load_app(spec: str) -> Any:
    """The App of `MODULE[:attr]`: the attribute, else the one module-level object (not a class,
    module or function) with a callable `worker`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or module_name.startswith("."):  # importlib raises ValueError or TypeError for them
        raise UnusableApp(f"{module_name!r} is not a module name: MODULE[:attr], e.g. myapp.tasks:app")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the project's modules import
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnusableApp(f"cannot import {module_name}: {exc}") from exc
    # The module's own error, or its sys.exit() (one parsing its own arguments at import): one line
    # saying where, as for any usage error, not the command's exit.
    except (Exception, SystemExit) as exc:
        raise UnusableApp(f"cannot import {module_name}: {raised_where(exc)}") from exc
    if attr:
        if not hasattr(module, attr):
            raise UnusableApp(f"{module_name} has no attribute {attr}")
        found = getattr(module, attr)
        if not callable(getattr(found, "worker", None)):
            raise UnusableApp(f"{spec} is not an App: it has no worker(...) method")
        return found
    apps = {name: value for name, value in vars(module).items() if not name.startswith("_")
            and not isinstance(value, (type, ModuleType)) and not callable(value)
            and callable(getattr(value, "worker", None))}
    if len(apps) != 1:
        what = f"several ({', '.join(sorted(apps))})" if apps else "none"
        raise UnusableApp(f"{module_name} must hold one App (an object with a worker(...) method), found {what}: "
                          "name it as MODULE:attr")
    return next(iter(apps.values()))


def raised_where(error: BaseException) -> str:
    """`Type: text (file, line N)`, the line of the innermost module being imported (a SyntaxError's
    text says its place itself; `Type` alone without text, as a bare sys.exit()'s)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.name == "<module>"]
    what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if isinstance(error, SyntaxError) or not frames:
        return what
    return f"{what} ({frames[-1].filename}, line {frames[-1].lineno})"


@dataclass
class ChildOptions:
    spec: str
    topics: list[str] | None
    concurrency: int  # handlers at once: threads, or asyncio tasks (use_async)
    use_async: bool
    max_tasks_per_child: int | None

    def worker(self, app: Any) -> Any:
        """The app's worker with these options (what a child runs)."""
        return app.worker(topics=self.topics, concurrency=self.concurrency, asynchronous=self.use_async,
                          max_messages=self.max_tasks_per_child)

    def command(self) -> list[str]:
        how = ["--async", "--tasks", str(self.concurrency)] if self.use_async else ["--threads", str(self.concurrency)]
        command = [sys.executable, "-m", "delayqueue_client.supervisor", self.spec, *how]
        if self.topics:
            command += ["--topics", ",".join(self.topics)]
        if self.max_tasks_per_child is not None:
            command += ["--max-tasks-per-child", str(self.max_tasks_per_child)]
        return command


@dataclass
class Slot:
    """One of the N children: its process, and its crashes in a row (for the restart backoff)."""
    number: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    crashes: int = 0
    restart_at: float = field(default=0.0)


class Supervisor:
    def __init__(self, options: ChildOptions, processes: int):
        self.options = options
        self.slots = [Slot(i) for i in range(processes)]
        self._stop_level = 0  # signals: 1 drain, 2 hard (a plain int: set from a signal handler)
        self._forwarded = 0
        self._hard_since: float | None = None

    def stop(self) -> None:
        self._stop_level = min(2, self._stop_level + 1)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def run(self) -> int:
        """Runs the children until stopped and they have exited; answers the exit code (0)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while True:
                self._forward()
                alive = self._look_after()
                if self._stop_level and not alive:
                    log.info("every worker process has exited")
                    return 0
                time.sleep(TURN)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()

    def _start(self, slot: Slot) -> None:
        slot.process = subprocess.Popen(self.options.command(), start_new_session=True,
                                        env={**os.environ, SUPERVISOR_PID: str(os.getpid())})
        slot.started_at = time.monotonic()
        log.info("worker process %d started (pid %d)", slot.number, slot.process.pid)

    def _look_after(self) -> bool:
        """Starts, restarts and reaps the children; answers whether any is running."""
        now, alive = time.monotonic(), False
        for slot in self.slots:
            if slot.process is not None:
                code = slot.process.poll()
                if code is None:
                    alive = True
                    continue
                self._exited(slot, code, now)
            if not self._stop_level and now >= slot.restart_at:
                self._start(slot)
                alive = True
        return alive

    def _exited(self, slot: Slot, code: int, now: float) -> None:
        assert slot.process is not None
        pid, slot.process = slot.process.pid, None
        if self._stop_level:
            log.info("worker process %d (pid %d) exited with %d", slot.number, pid, code)
            return
        lived = now - slot.started_at
        if code == SERVED_MAX_TASKS or (code == 0 and lived >= STABLE_AFTER):
            log.info("worker process %d (pid %d) %s: starting another", slot.number, pid,
                     "served its max tasks" if code else "exited")
            slot.crashes, slot.restart_at = 0, now
            return
        if lived >= STABLE_AFTER:
            slot.crashes = 0
        delay = min(MAX_RESTART_DELAY, RESTART_DELAY * 2 ** slot.crashes)
        slot.crashes += 1
        slot.restart_at = now + delay
        if code == 0:
            log.warning("worker process %d (pid %d) exited (code 0) %.1f s after its start: restarting in %g s",
                        slot.number, pid, lived, delay)
            return
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        log.error("worker process %d (pid %d) crashed (%s): restarting in %g s", slot.number, pid, how, delay)

    def _forward(self) -> None:
        """Passes each stop on to the children as a SIGTERM of its own; kills them once a hard
        stop's grace has run out."""
        while self._forwarded < self._stop_level:
            self._forwarded += 1
            log.warning("%s to every worker process", "draining: SIGTERM" if self._forwarded == 1 else
                        f"stopping hard: {HARD_STOP_SIGNAL.name}")
            if self._forwarded == 2:
                self._hard_since = time.monotonic()
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is None:
                    slot.process.send_signal(signal.SIGTERM if self._forwarded == 1 else HARD_STOP_SIGNAL)
        if self._hard_since is not None and time.monotonic() - self._hard_since > HARD_STOP_GRACE:
            self._kill_all()

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                log.error("worker process %d (pid %d) still running: killed", slot.number, slot.process.pid)
                slot.process.kill()
                slot.process.wait()


def run_child(options: ChildOptions) -> int:
    """A child's life: the App's worker until it returns (stopped, or max tasks served: SERVED_MAX_TASKS)."""
    worker = options.worker(load_app(options.spec))
    supervisor_pid = int(os.environ.get(SUPERVISOR_PID) or os.getppid())
    drain = _Drain(worker)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, drain.on_signal)
    signal.signal(HARD_STOP_SIGNAL, drain.stop_hard)
    threading.Thread(target=_drain_when_orphaned, args=(drain, supervisor_pid), name="dq-orphan-check",
                     daemon=True).start()
    try:
        worker.run(install_signal_handlers=False)
    except Exception:
        if not getattr(worker, "stopped_hard", False):
            raise
        log.exception("the worker failed")  # its settle loop: it stopped hard, and the child crashes
        _exit_now(1)
    except (SystemExit, KeyboardInterrupt) as exc:  # a handler's sys.exit(): the worker stopped hard
        if not getattr(worker, "abandoned_handlers", False):
            raise
        log.error("a handler ended the worker (%s %s): exiting without waiting for its abandoned handler threads",
                  type(exc).__name__, getattr(exc, "code", ""))
        _exit_now(1)
    code = SERVED_MAX_TASKS if getattr(worker, "served_max_messages", False) else 0
    if getattr(worker, "abandoned_handlers", False):
        if not getattr(worker, "stopped_hard", False):
            log.warning("handler thread(s) past their handler_timeout still run: exiting without waiting for them")
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Ends the process: a thread handler the worker abandoned (a hard stop, a handler_timeout)
    must not keep it alive."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Drain:
    """A child's stops: the first drain() stops its worker (a drain), later ones do nothing (the
    worker's second stop() would stop hard); stop_hard stops it hard."""

    def __init__(self, worker: Any):
        self.worker, self.draining = worker, False

    def drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.worker.stop()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.drain()

    def stop_hard(self, signum: int, frame: FrameType | None) -> None:
        self.drain()
        self.worker.stop()


def _drain_when_orphaned(drain: _Drain, supervisor_pid: int) -> None:
    """Stops the worker (a drain) once the supervisor is gone: the child is then another process'
    (its parent pid changes), and no one would ever stop or restart it."""
    while os.getppid() == supervisor_pid:
        time.sleep(ORPHAN_CHECK)
    log.warning("the supervisor (pid %d) is gone: draining and exiting", supervisor_pid)
    drain.drain()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker command's arguments (the CLI's `worker` subcommand and a child's command line)."""
    parser.add_argument("app", metavar="MODULE[:attr]", help="the module holding the App (MODULE:attr names it)")
    parser.add_argument("--topics", type=topic_list,
                        help="comma-separated topics each process serves (default: every topic of the app's tasks)")
    parser.add_argument("--processes", type=positive_int, default=1, help="worker processes (default 1)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--threads", type=positive_int, default=DEFAULT_CONCURRENCY,
                     help=f"handler threads per process (default {DEFAULT_CONCURRENCY})")
    how.add_argument("--async", dest="use_async", action="store_true",
                     help="asyncio: the app's worker with an AsyncClient and async handlers")
    parser.add_argument("--tasks", type=positive_int,
                        help=f"with --async: handler tasks at once per process (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--max-tasks-per-child", type=positive_int,
                        help="a process drains and is replaced after handling this many messages")
    parser.add_argument("--sync-schedules", action="store_true",
                        help="first make the server's schedules of the app's scheduled tasks (app.sync_schedules(), "
                             "once, in the supervisor; needs a token with the manage scope)")


def topic_list(text: str) -> list[str]:
    topics = [t.strip() for t in text.split(",") if t.strip()]
    if not topics:
        raise argparse.ArgumentTypeError(f"invalid topics {text!r}: comma-separated topic names")
    return topics


def positive_int(text: str) -> int:
    """A count of the command line (the CLI's too)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # isdigit alone takes "²", which int() refuses
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a whole number of at least 1")
    return int(text)


def options_of(args: argparse.Namespace) -> ChildOptions:
    concurrency = (args.tasks or DEFAULT_CONCURRENCY) if args.use_async else args.threads
    return ChildOptions(args.app, args.topics, concurrency, args.use_async, args.max_tasks_per_child)


def supervise(args: argparse.Namespace) -> int:
    """The `delayqueue worker` command: checks the App imports and makes a worker of the options
    given, then supervises the children."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # --url and --token reach the App's client (and the children's) as the variables a Client reads.
    for name, option in (("DELAYQUEUE_URL", "url"), ("DELAYQUEUE_TOKEN", "token")):
        if value := getattr(args, option, None):
            os.environ[name] = value
    app, options = load_app(args.app), options_of(args)  # a clear error now rather than N crashing children
    try:  # a worker the app cannot make: every child would fail at its start, restarted for ever
        options.worker(app)
    except (ValueError, TypeError) as exc:
        raise UnusableApp(f"{args.app} cannot make a worker of these options: {exc}") from None
    if getattr(args, "sync_schedules", False):
        for schedule_id, action in app.sync_schedules().items():
            log.info("schedule %s: %s", schedule_id, action)
    return Supervisor(options, args.processes).run()


def child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delayqueue worker (child)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s")
    return run_child(options_of(args))


if __name__ == "__main__":
    sys.exit(child_main())
