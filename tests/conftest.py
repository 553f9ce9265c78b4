"""Shared fixtures. `./dev test` starts a real Redis, a real 3-master Redis Cluster and a real
PostgreSQL and passes them in REDIS_URL, REDIS_CLUSTER_URL and DATABASE_URL."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest
import redis

from delayqueue.live.client import cluster_nodes
from delayqueue.conf import load_config
from delayqueue.runtime import Runtime, close_current
from delayqueue.scanner.scanner import Scanner

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL")
REDIS_CLUSTER_URL = os.environ.get("REDIS_CLUSTER_URL")

if not REDIS_URL:
    raise pytest.UsageError("REDIS_URL is not set: run the suite with ./dev test, which starts Redis and PostgreSQL")

# Short windows so that TTLs, retention and lock take-over happen within a test.
TEST_CONFIG = {
    "ENDED_RETENTION_MILLIS": 2_000,
    "SCANNER_LOCK_TTL_MILLIS": 1_500,
    "MONITOR_INTERVAL_SECONDS": 2,
}


@pytest.fixture(autouse=True)
def clean_redis(settings, transactional_db):
    """Every test starts from an empty Redis (and cluster), an empty message log and the test config.
    The log is written by the services' own connections, so tests use real commits (transactional_db)."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, **TEST_CONFIG}
    client = redis.Redis.from_url(REDIS_URL)
    client.flushall()
    client.close()
    if REDIS_CLUSTER_URL:
        cluster = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in cluster_nodes(REDIS_CLUSTER_URL)])
        cluster.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
        cluster.close()
    yield


def make_runtime(url: str, **overrides) -> Runtime:
    return Runtime(load_config().with_overrides(redis_url=url, **overrides))


@pytest.fixture(params=["single", "cluster"])
async def rt(request):
    """A runtime on a single Redis and on the Redis Cluster: the Lua layer must behave the same."""
    if request.param == "cluster":
        if not REDIS_CLUSTER_URL:
            pytest.fail("REDIS_CLUSTER_URL is not set: ./dev test starts a local cluster")
        runtime = make_runtime(REDIS_CLUSTER_URL)
    else:
        runtime = make_runtime(REDIS_URL)
    yield runtime
    await runtime.close()


@pytest.fixture
async def single_rt():
    runtime = make_runtime(REDIS_URL)
    yield runtime
    await runtime.close()


class RunningScanner:
    def __init__(self, scanner: Scanner, task: asyncio.Task):
        self.scanner, self.task = scanner, task

    async def stop(self):
        self.scanner.stop()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def start_scanner():
    """Starts in-process scanners on a runtime; stops them at the end of the test."""
    running = []

    async def start(runtime: Runtime, name: str | None = None) -> RunningScanner:
        scanner = Scanner(runtime, name)
        task = asyncio.get_running_loop().create_task(scanner.run())
        handle = RunningScanner(scanner, task)
        running.append(handle)
        await scanner._subscribed.wait()
        return handle

    yield start
    for handle in running:
        if not handle.task.done():
            await handle.stop()


@pytest.fixture
async def api():
    """An HTTP client on the project's ASGI application (the same stack uvicorn serves)."""
    from project.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
        yield client
    await close_current()


def log_database_url() -> str:
    """The database pytest-django created (test_...), for processes the tests start."""
    from django.db import connections

    s = connections["default"].settings_dict
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{s['USER']}{password}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def scanner_env(**extra) -> dict:
    env = dict(os.environ)
    env["DATABASE_URL"] = log_database_url()
    env.update({f"DELAYQUEUE_{k}": str(v) for k, v in TEST_CONFIG.items()})
    env.update({k: str(v) for k, v in extra.items()})
    return env


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
        while "started" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"scanner {self.name} did not start:\n{self.output()}")
            time.sleep(0.05)

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)

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


@pytest.fixture
def scanner_process():
    started = []

    def start(name: str, **env) -> ScannerProcess:
        proc = ScannerProcess(name, scanner_env(**env) if env else None)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        proc.log_path.unlink(missing_ok=True)


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

    def _pid(self) -> int | None:
        try:
            return int((Path(self.spec["data"]) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        pid = self._pid()
        assert pid, "PostgreSQL is not running"
        os.kill(pid, signal.SIGINT)  # fast shutdown: open sessions are cut off, as in a crash of the server
        deadline = time.monotonic() + 20
        while self._pid() is not None:
            assert time.monotonic() < deadline, "PostgreSQL did not stop"
            time.sleep(0.05)

    def start(self) -> None:
        user = {"user": self.spec["uid"], "group": self.spec["gid"], "extra_groups": []} if self.spec["uid"] is not None else {}
        with open(self.spec["log"], "ab") as log:
            self.restarted = subprocess.Popen(self.spec["argv"], stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, **user)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(log_database_url(), connect_timeout=1).close()
                return
            except Exception:
                assert self.restarted.poll() is None, "PostgreSQL did not start again"
                assert time.monotonic() < deadline, "PostgreSQL did not accept connections again"
                time.sleep(0.1)


@pytest.fixture
def postgres():
    spec = os.environ.get("DELAYQUEUE_TEST_POSTGRES")
    if not spec:
        pytest.fail("DELAYQUEUE_TEST_POSTGRES is not set: ./dev test starts PostgreSQL and says how to restart it")
    control = PostgresControl(json.loads(spec))
    yield control
    if control._pid() is None:  # a failed test must not leave the rest of the suite without a database
        control.start()


async def drain_log(runtime: Runtime, topics) -> int:
    """Runs the log writer over these topics until their streams are empty; returns events written."""
    from delayqueue.messagelog.writer import LogWriter

    writer = LogWriter(runtime, lambda: topics)
    try:
        while await writer.drain_once():
            pass
    finally:
        await writer.close()
    return writer.written
