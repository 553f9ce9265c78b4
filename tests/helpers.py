"""Plain helpers shared by the tests (fixtures live in the conftests). `./dev test` starts a real
Redis, a real 3-master Redis Cluster and a real PostgreSQL and passes them in REDIS_URL,
REDIS_CLUSTER_URL and DATABASE_URL; unit tests use none of them."""
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psycopg
import pytest

from delayqueue.api import wire
from delayqueue.api.http_protocol import HTTP_PROTOCOL
from delayqueue.config.settings import load_config
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.live.keys import Shard
from delayqueue.messagelog import sql
from delayqueue.runtime import Runtime, run_with_runtime
from delayqueue.services.dead_letters import dead_letters
from delayqueue.services.send import SendRequest, send_calls, send_message
from delayqueue.workers.log_writer import LogWriter
from delayqueue.workers.scanner import Scanner

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL")
REDIS_CLUSTER_URL = os.environ.get("REDIS_CLUSTER_URL")
API = "/camellia/delayQueue/"

# Short windows so that TTLs, retention and lock take-over happen within a test.
TEST_CONFIG = {
    "ENDED_RETENTION_MILLIS": 2_000,
    "SCANNER_LOCK_TTL_MILLIS": 1_500,
    "MONITOR_INTERVAL_SECONDS": 2,
    "PUSH_ALLOWED_HOSTS": "127.0.0.1",  # the tests' push receivers (PushReceiver)
}


# Tests of what reaches every database of the log (prune_log): the second is the one ./dev test
# routes namespace `routed` to (tests/integration/test_log_routing.py).
EVERY_LOG_DATABASE = pytest.mark.django_db(databases=["default", "second"], transaction=True)


def require_servers() -> None:
    """Called by the conftests of the tests that need Redis and PostgreSQL (not tests/unit)."""
    if not REDIS_URL:
        raise pytest.UsageError("REDIS_URL is not set: run the suite with ./dev test, which starts Redis and "
                                "PostgreSQL (tests/unit needs neither: pytest tests/unit)")


def make_runtime(url: str, **overrides) -> Runtime:
    return Runtime(load_config().with_overrides(redis_url=url, **overrides))


def log_database_url(alias: str = "default") -> str:
    """The database pytest-django created (test_...), for processes the tests start."""
    from django.db import connections

    s = connections[alias].settings_dict
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{s['USER']}{password}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def scanner_env(**extra) -> dict:
    env = dict(os.environ)
    env["DATABASE_URL"] = log_database_url()
    env["DELAYQUEUE_LOG_DATABASES"] = ",".join(f"{alias}={log_database_url(alias)}"
                                               for alias in load_config().log_database_urls)
    env.update({f"DELAYQUEUE_{k}": str(v) for k, v in TEST_CONFIG.items()})
    env.update({k: str(v) for k, v in extra.items()})
    return env


class RunningScanner:
    """A Scanner on this loop, with the history writer of the topics it holds beside it (as
    run_scanners' log process runs it, workers/log_process.py), unless the message log is off."""

    def __init__(self, runtime: Runtime, name: str | None = None):
        self.scanner = Scanner(runtime, name)
        self.writer = LogWriter(runtime, lambda: list(self.scanner.workers)) if runtime.config.message_log else None
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self.scanner.run())
        self.writer_task = loop.create_task(self.writer.run(self._stopping)) if self.writer else None

    async def started(self) -> "RunningScanner":
        await self.scanner._subscribed.wait()
        if self.writer is not None:
            await self.writer.subscribed.wait()
        return self

    def stopped(self) -> bool:
        return self.task.done() and (self.writer_task is None or self.writer_task.done())

    async def stop(self):
        self.scanner.stop()
        self._stopping.set()
        await asyncio.wait_for(asyncio.gather(*(t for t in (self.task, self.writer_task) if t is not None)), 10)


class ScannerProcess:
    """`manage.py run_scanners` as a real separate process."""

    def __init__(self, name: str, env: dict | None = None):
        self.name = name
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"dq-scanner-{name}-{os.getpid()}-{time.time_ns()}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_scanners", "--name", name],
            cwd=ROOT, env=env or scanner_env(), stdout=self.log, stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def wait_started(self, timeout=20):
        deadline = time.monotonic() + timeout
        while f"scanner {self.name} started" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"scanner {self.name} did not start:\n{self.output()}")
            time.sleep(0.05)

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)

    def log_process_pids(self) -> list[int]:
        """The pids of the log processes it started (workers/log_process.py), oldest first."""
        return [int(pid) for pid in re.findall(r"log process (\d+) started", self.output())]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class WebProcess:
    """uvicorn serving project.asgi:application as a real separate process (one worker), on the
    test servers, as `./dev run` serves it; `url` is its base URL once started."""

    def __init__(self, name: str, env: dict | None = None, access_log: bool = False):
        from tools.stack import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"dq-web-{name}-{os.getpid()}-{time.time_ns()}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1", "--port",
             str(self.port), "--lifespan", "off", "--http", HTTP_PROTOCOL, *(() if access_log else ("--no-access-log",))],
            cwd=ROOT, env=env or scanner_env(), stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        """What the process wrote so far (its log lines, and uvicorn's access log when on)."""
        self.log.flush()
        return self.log_path.read_text()

    def wait_started(self, timeout=30):
        from tools.stack import wait_for_port

        self.log.flush()
        wait_for_port(self.port, self.proc, "uvicorn", self.log_path, timeout)

    def stop(self) -> None:
        from tools.stack import terminate

        terminate([self.proc])
        self.log.close()
        self.log_path.unlink(missing_ok=True)


def process_ended(pid: int) -> bool:
    """Whether the process is gone or a zombie (ended, not yet reaped by whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def run_catching(worker) -> list[BaseException]:
    """What an SDK Worker's run() raised (without its signal handlers), for a run in a thread."""
    try:
        worker.run(install_signal_handlers=False)
    except BaseException as exc:
        return [exc]
    return []


def wait_for(predicate, timeout=10.0, what="condition"):
    """wait_until for synchronous tests (the SDK's): the predicate's truthy value, polled every 50 ms.
    `what` may be a function, called for the failure's text (to show the state at the time)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.05)
    return value


class LoopTurns:
    """Counts the event loop's turns while entered (a task that counts its own), so that a test can say
    how much work one turn did without timing it: `counting(counts, func)` is func, adding one to
    counts[the turn it ran in] per call."""

    def __init__(self):
        self.turn = 0
        self._task = None

    async def __aenter__(self) -> "LoopTurns":
        self._task = asyncio.ensure_future(self._count())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()

    async def _count(self) -> None:
        while True:
            self.turn += 1
            await asyncio.sleep(0)

    def counting(self, counts: dict, func):
        def counted(*args):
            counts[self.turn] += 1
            return func(*args)
        return counted


async def wait_until(predicate, timeout=10.0, interval=0.01, what="condition"):
    """Polls an async predicate until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class PostgresControl:
    """Stops and restarts the test PostgreSQL that ./dev test started (same data, same port)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.restarted: subprocess.Popen | None = None

    # A fast shutdown ends with a checkpoint that writes every dirty buffer: on a machine busy
    # with other test workers' writes that has taken over 20 s.
    STOP_SECONDS = 180

    def _pid(self) -> int | None:
        """The postmaster's, while it runs (its pid file outlives a postmaster killed outright)."""
        try:
            pid = int((Path(self.spec["data"]) / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
        except PermissionError:  # alive, under the servers' own user
            return pid
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def stop(self) -> None:
        pid = self._pid()
        assert pid, "PostgreSQL is not running"
        os.kill(pid, signal.SIGINT)  # fast shutdown: open sessions are cut off, as in a crash of the server
        self._stopped(f"PostgreSQL did not stop within {self.STOP_SECONDS} s")

    def _stopped(self, failure: str) -> None:
        deadline = time.monotonic() + self.STOP_SECONDS
        while (pid := self._pid()) is not None:
            if time.monotonic() > deadline:
                processes = subprocess.run(["ps", "-o", "pid,stat,etime,args", "--pid", str(pid), "--ppid", str(pid)],
                                           capture_output=True, text=True).stdout
                log = Path(self.spec["log"]).read_text(errors="replace").splitlines()[-20:]
                raise AssertionError("\n".join([failure, processes, *log]))
            time.sleep(0.05)
        # The postmaster removes its pid file a moment before it closes its listening socket: a
        # connection made then is taken, and closed, instead of refused.
        while self._listening():
            assert time.monotonic() < deadline, failure
            time.sleep(0.01)

    def _listening(self) -> bool:
        """Whether the port takes connections; only a refusal says no. A connection that times out
        (a busy machine, a backlog the stopping postmaster no longer accepts from) may still be
        taken, and closed, by the socket it has not closed yet."""
        try:
            socket.create_connection(("127.0.0.1", self.spec["port"]), timeout=1).close()
            return True
        except ConnectionRefusedError:
            return False
        except OSError:
            return True

    def ensure_running(self) -> None:
        """After a test: a server it stopped, or left stopping, runs again."""
        pid = self._pid()
        if pid is not None:
            try:
                psycopg.connect(log_database_url(), connect_timeout=5).close()
                return
            except psycopg.OperationalError:  # shutting down (a stop that outlasted its test)
                self._stopped("PostgreSQL, left stopping by a test, did not stop")
        self.start()

    def start(self) -> None:
        user = {"user": self.spec["uid"], "group": self.spec["gid"], "extra_groups": []} if self.spec["uid"] is not None else {}
        with open(self.spec["log"], "ab") as log:
            self.restarted = subprocess.Popen(self.spec["argv"], stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, **user)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(log_database_url(), connect_timeout=1).close()
                break
            except Exception:
                assert self.restarted.poll() is None, "PostgreSQL did not start again"
                assert time.monotonic() < deadline, "PostgreSQL did not accept connections again"
                time.sleep(0.1)
        if not _in_event_loop():
            # A synchronous test's Django connections died with the server: its next ORM query
            # opens a new one. (Async tests reach the ORM on asgiref's thread: see the fixture.)
            from django.db import connections

            connections.close_all()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def unsharded_calls(runtime: Runtime, rows: list, **options) -> list:
    """send_calls of the messages, each into its topic's own keys (as unsharded topics have)."""
    return send_calls(runtime, rows, shards=[Shard(row.topic) for row in rows], **options)


async def drain_log(runtime: Runtime, topics) -> int:
    """Runs the log writer over these topics (or Shards) until their streams are empty; returns events written."""
    writer = LogWriter(runtime, lambda: [topic if isinstance(topic, Shard) else Shard(topic) for topic in topics])
    try:
        while await writer.drain_once():
            pass
    finally:
        await writer.close()
    return writer.written


# The message log as PostgreSQL holds it.
async def query(statement: str, *params, database: str = "default"):
    async with await psycopg.AsyncConnection.connect(log_database_url(database), autocommit=True) as conn:
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []


async def logged(topic: str, msg_id: str) -> dict | None:
    rows = await query(
        f"SELECT payload, {sql.to_millis('produce_time')}, {sql.to_millis('trigger_time')},"
        f" {sql.to_millis('expire_time')}, max_retry, retry, status"
        " FROM delayqueue_message WHERE topic = %s AND msg_id = %s", topic, msg_id)
    if not rows:
        return None
    names = ("msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry", "status")
    return dict(zip(names, rows[0]))


async def stamps(topic: str, msg_id: str) -> list[int]:
    """The log row's updated_at, then the times of its history rows but the `sent` one, in ms."""
    [(updated,)] = await query(f"SELECT {sql.to_millis('updated_at')} FROM delayqueue_message"
                               " WHERE topic = %s AND msg_id = %s", topic, msg_id)
    events = await query(f"SELECT {sql.to_millis('at')} FROM delayqueue_messageevent"
                         " WHERE topic = %s AND msg_id = %s AND reason <> 'sent' ORDER BY at, id", topic, msg_id)
    return [updated, *(at for (at,) in events)]


def redis_readings(monkeypatch, module) -> list[int]:
    """Records each reading of Redis' clock `module` takes from now on (its redis_millis, the real one):
    a change the log makes of itself is to be stamped with one, never PostgreSQL's clock."""
    readings, real = [], module.redis_millis

    async def recorded(rt: Runtime, *shard) -> int:
        readings.append(await real(rt, *shard))
        return readings[-1]

    monkeypatch.setattr(module, "redis_millis", recorded)
    return readings


async def history(topic: str, msg_id: str) -> list[tuple]:
    return await query(
        "SELECT reason, from_status, to_status, retry FROM delayqueue_messageevent"
        " WHERE topic = %s AND msg_id = %s ORDER BY at, id", topic, msg_id)


def as_logged(message: Message | dict) -> dict:
    """A sent message (as the services or the API answer it) as `logged` reads its log row."""
    wire = message.to_wire() if isinstance(message, Message) else message
    return {k: wire[k] for k in ("msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry", "status")}


async def dead_letter_page(rt: Runtime, **kwargs) -> tuple[list[dict], str | None]:
    """A page of services.dead_letters as getDeadMsgList answers it."""
    page, cursor = await dead_letters(rt, **kwargs)
    return [wire.dead_letter(dead) for dead in page], cursor


async def call(api, endpoint, method="post", json=None, **params):
    if json is not None:
        response = await api.post(API + endpoint, json=json)
    elif method == "get":
        response = await api.get(API + endpoint, params=params)
    else:
        response = await api.post(API + endpoint, data=params)
    assert response.status_code == 200, response.text  # the business code is in the body
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


# The queue as the admin's synchronous code reaches it.
def send(topic, msg_id, delay_millis=0, namespace=None) -> dict:
    """Sends through the services, in DELAYQUEUE_NAMESPACE or in the namespace given."""

    async def send_there(rt):
        return await send_message(rt.for_namespace(namespace or rt.ns.namespace), request=SendRequest(topic=topic, msg=f"body of {msg_id}", delay_millis=delay_millis, msg_id=msg_id))

    return run_with_runtime(send_there)


def drain_history(topic):
    """Runs the scanners' log writer once: the topic's events become history rows."""

    async def drain(rt):
        await LogWriter(rt, lambda: [Shard(topic)]).drain_once()

    run_with_runtime(drain)


async def promote(rt: Runtime, topic: str = "t") -> scripts.PromoteReply:
    """One run of the scanner's promote_due.lua on the topic, and what it counted folded into the
    topic's stats hash, as a scanner does (within a second)."""
    reply = await rt.scripts.call(scripts.promote_due(rt.context, topic))
    if reply.stats:
        await rt.scripts.call(scripts.fold_stats(rt.context, topic, fields=list(reply.stats.items())))
    return reply


def requeue(rt: Runtime, topic: str = "t", seed: int = 12345):
    """One run of the scanner's requeue_timed_out.lua on the topic, as a scanner would call it."""
    return rt.scripts.call(scripts.requeue_timed_out(rt.context, topic, seed=seed))


class PushReceiver:
    """A real HTTP server (aiohttp, on the test's event loop) that push URLs point at: it records
    every request it gets (arrival time, headers, raw body) and answers with what `answer`
    returns for it: a status, or a coroutine's status (a handler that sleeps hangs the pusher)."""

    def __init__(self, answer=None):
        self.requests: list[dict] = []
        self.answer = answer or (lambda request: 200)
        self.in_flight = 0
        self.most_in_flight = 0
        self._runner = None
        self.port = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> "PushReceiver":
        from aiohttp import web

        from tools.stack import free_port

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Stopping does not wait for handlers still hanging (a test's endpoint that never answers).
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        record = {"at": time.time() * 1000, "headers": dict(request.headers), "body": body,
                  "message": orjson.loads(body) if body else None, "path": request.path}
        self.requests.append(record)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            status = self.answer(record)
            if asyncio.iscoroutine(status):
                status = await status
            return web.Response(status=status, headers={"Location": "http://127.0.0.1:1/"} if 300 <= status < 400
                                else None)
        finally:
            self.in_flight -= 1

    def of(self, msg_id: str) -> list[dict]:
        return [r for r in self.requests if r["message"]["msgId"] == msg_id]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


PACKED_HEADER = 22  # a packed entry's bytes before its msgId (lua/includes/packed.lua's PACKED_HEADER)


async def packed_ids(rt: Runtime, topic: str | Shard = "t") -> list[str]:
    """The msgIds of a topic's (or a shard's) packed entries, each list in order, the lists by second."""
    k = rt.ns.topic(topic)
    ids = []
    for second in await rt.redis.zrange(k.packed, 0, -1):
        # The entries are bytes: read without the client's decoding.
        for entry in await rt.redis.execute_command("LRANGE", f"{k.packed}:{second}", 0, -1, NEVER_DECODE=True):
            form, at = entry[0], PACKED_HEADER
            ids.append(entry[at:at + 16].hex() if form == 0 else entry[at:at + form].decode())
    return ids


async def load_killed(runtime: Runtime, loader, killed_after: str) -> None:
    """Runs the loader's load of topic "t" as a loader killed at a step: before its first page
    loads ("raise": after its window raise) or before its second ("first page")."""
    real_call, loads = runtime.scripts.call, 0

    async def dying_call(call):
        nonlocal loads
        if call.script is scripts.LOAD_COLD:
            if killed_after == "raise" or loads == 1:
                raise SystemExit("killed")
            loads += 1
        return await real_call(call)

    runtime.scripts.call = dying_call
    try:
        with pytest.raises(SystemExit):
            await loader.load_topic("t", force=True)
    finally:
        runtime.scripts.call = real_call
