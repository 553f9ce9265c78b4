"""Fixtures for the tests that use Redis, the Redis Cluster and PostgreSQL (tests/integration,
tests/spark). None that starts or empties a server is autouse: a test pays only for the servers
it asks for, and tests/unit asks for none (the one autouse fixture, fast_password_hashing, only
changes a setting). Plain helpers are in tests/helpers.py."""
import asyncio
import json
import os
import shutil
import signal
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import redis

from delayqueue.config.redis_urls import url_credentials, url_nodes
from delayqueue.runtime import close_current
from delayqueue.workers.pusher import Pusher
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, TEST_CONFIG, PostgresControl, PushReceiver, RunningScanner,
                           ScannerProcess, WebProcess, make_runtime, scanner_env)
from tools.stack import LOCAL

SPARK_TESTS = "tests/spark/"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """On pytest-xdist's workers (./dev test), tests/spark/ is one unit of work for one worker:
    Spark's JVMs (a SparkSession per worker) would fight over the cores. The other tests go out
    one by one, as with --dist load. (--dist loadgroup cannot do it on pytest 9.2: it marks the
    group in the node ids, which pytest 9.2 no longer lets a plugin change; pytest-xdist#1386.)"""
    if config.getvalue("dist") != "load":
        return None  # another distribution, asked for with --dist
    from xdist.scheduler import LoadScopeScheduling

    class SparkOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SPARK_TESTS if nodeid.startswith(SPARK_TESTS) else nodeid

    return SparkOnOneWorker(config, log)


def pytest_configure(config):
    """A run started in the background (`./dev test &`, or by a CI runner that does the same)
    inherits SIGINT ignored, as would every process a test starts: the tests that interrupt one
    as Ctrl-C does, and ./dev test stopping pytest, need SIGINT taken as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_runtest_logstart(nodeid, location):
    """Each test this worker starts, timed: when a server dies mid-run, ./dev test shows what ran then."""
    if timeline := os.environ.get("DELAYQUEUE_TEST_TIMELINE"):
        with open(timeline, "a") as out:
            out.write(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S.%f} test {nodeid}\n")


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing():
    """Django's default password hasher (PBKDF2, a million rounds) spends most of a second of
    CPU on every password set or checked, and every admin test sets one (admin_client's user).
    What the tests check of passwords and logins (the admin's lock-out, its validators, its
    pages) does not depend on the hash function, so passwords set in this process are hashed
    with a fast one; the project's hashers still check a hash made elsewhere. A process a test
    starts (uvicorn) keeps the project's hashers only: a user who logs in there is made with
    them (test_browser), so that path still runs the real one."""
    from django.conf import settings
    from django.test.utils import override_settings

    fast = ["django.contrib.auth.hashers.MD5PasswordHasher", *settings.PASSWORD_HASHERS]
    with override_settings(PASSWORD_HASHERS=fast):
        yield


@pytest.fixture(scope="session", autouse=True)
def fast_database_emptying():
    """pytest-django empties the databases after each transactional test with Django's flush: one
    TRUNCATE of every table (new files for each: about 0.1 s a test) and the post_migrate signal,
    which writes the content types and permissions back as they were. A test mostly leaves a few
    rows, which DELETE removes in milliseconds; a table left with many is truncated still, as the
    dead rows and index entries a DELETE leaves would weigh on later tests' plans. The content types
    and permissions stay as migrated. The triggers are off meanwhile (session_replication_role),
    as TRUNCATE fires none."""
    from django.db import connections, transaction
    from django.test import TransactionTestCase

    flush = TransactionTestCase._fixture_teardown
    kept = {"django_content_type", "auth_permission"}
    emptied: dict[str, str] = {}  # database alias: its statement

    def empty(self):
        if self.available_apps is not None or self.serialized_rollback:
            return flush(self)
        for alias in self._databases_names(include_mirrors=False):
            connection = connections[alias]
            if alias not in emptied:
                tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
                each = "".join(f"IF EXISTS (SELECT FROM {name} OFFSET 999) THEN TRUNCATE {name} CASCADE;"
                               f" ELSE DELETE FROM {name}; END IF;"
                               for name in map(connection.ops.quote_name, sorted(set(tables) - kept)))
                emptied[alias] = f"SET LOCAL session_replication_role = replica; DO $$BEGIN {each} END$$;"
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                cursor.execute(emptied[alias])

    TransactionTestCase._fixture_teardown = empty
    yield
    TransactionTestCase._fixture_teardown = flush


@pytest.fixture
def clean_redis(settings):
    """An empty Redis and Redis Cluster, and the queue's test config (short TTLs and lock take-over)."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, **TEST_CONFIG}
    client = redis.Redis.from_url(REDIS_URL)
    client.flushall()
    client.close()
    if REDIS_CLUSTER_URL:
        cluster = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in url_nodes(REDIS_CLUSTER_URL)],
                                     **url_credentials(REDIS_CLUSTER_URL))
        cluster.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
        cluster.close()


@pytest.fixture
def clean_state(clean_redis, transactional_db):
    """Empty Redis and an empty message log. The log is written by the services' own connections,
    so tests use real commits (transactional_db), emptied after each test."""


@pytest.fixture(params=["single", "cluster"])
async def rt(request, clean_state):
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
async def single_rt(clean_state):
    runtime = make_runtime(REDIS_URL)
    yield runtime
    await runtime.close()


@pytest.fixture
async def long_retention_rt(clean_state):
    """A runtime on the single Redis whose ended messages stay there for the whole test, not the
    suite's 2 s: for tests that read them back after steps a loaded machine makes take seconds."""
    runtime = make_runtime(REDIS_URL, ended_retention_millis=600_000)
    yield runtime
    await runtime.close()


@pytest.fixture
async def start_scanner(clean_state):
    """Starts in-process scanners on a runtime; stops them at the end of the test."""
    running = []

    async def start(runtime, name: str | None = None) -> RunningScanner:
        running.append(RunningScanner(runtime, name))
        return await running[-1].started()

    yield start
    for handle in running:
        if not handle.stopped():
            await handle.stop()


@pytest.fixture
async def start_pusher(clean_state):
    """Starts in-process pushers (each on its own runtime, as separate processes would be); stops them at the end."""
    running = []

    async def start(runtime=None) -> Pusher:
        runtime = runtime or make_runtime(REDIS_URL)
        pusher, stop = Pusher(runtime), asyncio.Event()
        running.append((pusher, asyncio.get_running_loop().create_task(pusher.run(stop)), stop, runtime))
        return pusher

    yield start
    for _pusher, task, stop, runtime in running:
        stop.set()
        await asyncio.wait_for(task, 15)
        await runtime.close()


@pytest.fixture
async def push_receiver():
    """Starts PushReceivers (real HTTP servers); stopped at the end of the test."""
    started = []

    async def start(answer=None) -> PushReceiver:
        receiver = await PushReceiver(answer).start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.stop()


@pytest.fixture
async def api(clean_state):
    """An HTTP client on the project's ASGI application (the same stack uvicorn serves)."""
    from project.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
        yield client
    await close_current()


@pytest.fixture
def scanner_process(clean_state):
    """`manage.py run_scanners` processes on the test servers; stopped at the end of the test."""
    started = []

    def start(name: str, **env) -> ScannerProcess:
        proc = ScannerProcess(name, scanner_env(**env) if env else None)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        proc.log_path.unlink(missing_ok=True)


@pytest.fixture
def server_dir():
    """A fresh folder for the servers a test starts with tools.stack.Services, under .local/:
    run as root, they run as an unprivileged user, who cannot enter pytest's private tmp_path."""
    LOCAL.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="servers-", dir=LOCAL))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def web_processes(clean_state):
    """uvicorn processes on the test servers, started together; stopped at the end of the test."""
    started = []

    def start(count: int, **env) -> list[WebProcess]:
        procs = [WebProcess(f"w{len(started) + i}", scanner_env(**env) if env else None) for i in range(count)]
        started.extend(procs)
        for proc in procs:
            proc.wait_started()
        return procs

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def postgres(transactional_db):
    spec = os.environ.get("DELAYQUEUE_TEST_POSTGRES")
    if not spec:
        pytest.fail("DELAYQUEUE_TEST_POSTGRES is not set: ./dev test starts PostgreSQL and says how to restart it")
    control = PostgresControl(json.loads(spec))
    yield control
    control.ensure_running()  # a failed test must not leave the rest of the suite without a database
    if control.restarted is not None:
        # Django's connections died with the server: the test database's flush must open new ones,
        # and so must later tests' ORM reads through sync_to_async, which run on asgiref's one
        # worker thread with connections of its own.
        from asgiref.sync import SyncToAsync
        from django.db import connections

        def close_all():
            for connection in connections.all(initialized_only=True):
                connection.close()

        close_all()
        SyncToAsync.single_thread_executor.submit(close_all).result()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database, dropped at the end without waiting. Async tests reach the ORM through
    asgiref's worker threads, whose Django connections pytest-django never closes (one was found
    idle after a Spark stats test's ORM read); left open, it makes DROP DATABASE wait 5 s and fail."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all(initialized_only=True):  # the databases the session's tests used
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE datname = current_database() AND pid <> pg_backend_pid()")


class SharedWebProcess:
    """One uvicorn for many tests, started on first use: starting one costs seconds, and the SDK's
    tests, which only talk to it over HTTP, would otherwise start one each."""

    def __init__(self):
        self.web: WebProcess | None = None

    def url(self) -> str:
        if self.web is None:
            self.web = WebProcess("shared")
            self.web.wait_started()
        elif self.web.proc.poll() is not None:
            pytest.fail(f"the shared uvicorn ended (exit {self.web.proc.returncode}):\n{self.web.output()}")
        return self.web.url

    def stop(self) -> None:
        if self.web is not None:
            self.web.stop()
            self.web = None


@pytest.fixture(scope="session")
def shared_web_process(django_db_setup):
    shared = SharedWebProcess()
    yield shared
    shared.stop()


@pytest.fixture
def sdk_server(clean_state, shared_web_process) -> str:
    """A uvicorn in open mode (the suite's default), for the SDK's tests: its base URL. It serves
    the emptied Redis and log of this test."""
    yield shared_web_process.url()
    # The server holds the settings it read (limits, topic settings, tokens) until it sees them
    # deleted, which emptying the log does not show: a test that left some gets the next one a new server.
    from delayqueue.models import ApiToken, Limit, TopicConfig

    if any(model.objects.exists() for model in (Limit, TopicConfig, ApiToken)):
        shared_web_process.stop()
