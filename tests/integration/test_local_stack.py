"""The servers `./dev` starts are locked down (a password each, an unprivileged user when run as
root), a Redis Sentinel URL works end to end, and `./dev run` keeps serving when its scanner
exits. The servers are the ones `./dev test` started, reached through the URLs it handed over."""
import asyncio
import contextlib
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import redis

from delayqueue.config.redis_urls import url_credentials, url_nodes
from delayqueue.services.consume import long_poll_messages, pull_messages
from delayqueue.services.send import SendRequest, send_message
from tests.helpers import REDIS_CLUSTER_URL, REDIS_URL, ROOT, log_database_url, make_runtime, scanner_env
from delayqueue.models import ApiToken
from delayqueue.stores.tokens import token_hash
from tools.stack import SYSTEM_USER, Services, free_port, local_token, pg_bin, token_file


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.netloc.rpartition('@')[2]}"))


def process_uid(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))


def test_the_local_redis_refuses_a_client_without_its_password_and_serves_one_with_it():
    assert urlsplit(REDIS_URL).password, "./dev test hands over a URL with the password"
    for url, refusal in ((without_credentials(REDIS_URL), redis.AuthenticationError),
                         (with_password(REDIS_URL, "wrong"), redis.AuthenticationError)):
        client = redis.Redis.from_url(url)
        try:
            with pytest.raises(refusal):
                client.set("dq:test:written", "1")
        finally:
            client.close()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_every_node_of_the_local_cluster_refuses_a_client_without_its_password():
    password = url_credentials(REDIS_CLUSTER_URL)["password"]
    for host, port in url_nodes(REDIS_CLUSTER_URL):
        for kwargs in ({}, {"password": password}):
            client = redis.Redis(host=host, port=port, **kwargs)
            try:
                if kwargs:
                    assert client.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
                else:
                    with pytest.raises(redis.AuthenticationError):
                        client.execute_command("CLUSTER INFO")
            finally:
                client.close()


def test_the_local_postgresql_refuses_a_connection_without_its_password_and_takes_one_with_it(monkeypatch):
    for variable in ("PGPASSWORD", "PGPASSFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PGPASSFILE", os.devnull)  # no ~/.pgpass may supply it either
    url = log_database_url().replace("postgres://", "postgresql://")
    assert urlsplit(url).password, "./dev test hands over a URL with the password"
    for refused in (without_credentials(url).replace("://", "://postgres@"), with_password(url, "wrong")):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(refused, connect_timeout=5).close()
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        # scram-sha-256, not md5 or trust, for every connection pg_hba.conf describes
        methods = {row[0] for row in conn.execute("SELECT auth_method FROM pg_hba_file_rules")}
        assert methods == {"scram-sha-256"}


@pytest.mark.skipif(os.geteuid() != 0, reason="only a run as root hands the servers to another user")
def test_run_as_root_the_local_servers_run_as_the_unprivileged_user():
    import pwd

    uid = pwd.getpwnam(SYSTEM_USER).pw_uid
    client = redis.Redis.from_url(REDIS_URL)
    try:
        redis_pid = client.info("server")["process_id"]
    finally:
        client.close()
    assert process_uid(redis_pid) == uid
    with psycopg.connect(log_database_url(), connect_timeout=5) as conn:
        # While connected: the backend process ends with its connection.
        assert process_uid(conn.info.backend_pid) == uid


@pytest.mark.process
def test_the_servers_logs_and_their_folder_are_private_to_their_owner(server_dir):
    """A server's log may quote its clients' statements and keys: no other local user reads it, nor
    lists the folder (run as root, others may only pass through it to reach the servers' data)."""
    base = server_dir / "run"
    base.mkdir(mode=0o755)  # as `mkdir` leaves ./dev run's folder under the usual umask
    base.chmod(0o755)
    stale = base / "redis.log"
    stale.write_text("a run before this one\n")
    stale.chmod(0o644)
    servers = Services(base, durable=False)
    try:
        servers.single_redis()
        servers.postgres(free_port())
    finally:
        servers.stop()
    assert stat.S_IMODE(base.stat().st_mode) == (0o701 if os.geteuid() == 0 else 0o700)
    for name in ("redis.log", "postgres.log"):
        assert stat.S_IMODE((base / name).stat().st_mode) == 0o600, name
    assert stale.read_text().startswith("a run before this one\n")  # appended to, not replaced


@pytest.mark.process
async def test_a_redis_sentinel_url_sends_and_pulls_through_the_master_it_names(server_dir):
    """A redis-server and one `redis-server --sentinel` watching it, both with a password."""
    servers = Services(server_dir, durable=False)
    try:
        master_port, sentinel_port = free_port(), free_port()
        servers.single_redis(master_port)
        url = servers.sentinel(sentinel_port, master_port)
        rt = make_runtime(url, message_log=False)
        try:
            assert (await rt.redis.info("server"))["tcp_port"] == master_port  # the sentinel named it
            sent = await send_message(rt, request=SendRequest(topic="sentinel", msg="through the sentinel", delay_millis=0))
            pulled, _ = await pull_messages(rt, topic="sentinel", batch=10)
            assert [(m.msg_id, m.payload) for m in pulled] == [(sent.msg_id, "through the sentinel")]
            # Long polls are woken over pub/sub through the sentinel's master as well.
            started = time.monotonic()
            poll = asyncio.ensure_future(long_poll_messages(
                rt, topic="sentinel", batch=1, ack_timeout_millis=-1, timeout_millis=20_000))
            notifier = await rt.notifier()
            while notifier.waiting("sentinel") != 1:
                await asyncio.sleep(0.01)
            await send_message(rt, request=SendRequest(topic="sentinel", msg="woken", delay_millis=0))
            assert [m.payload for m in await asyncio.wait_for(poll, 20)] == ["woken"]
            assert time.monotonic() - started < 10  # by the wake, not by the end of the hold
        finally:
            await rt.close()
        # Django's cache (sessions, admin login counts) goes through the sentinel too.
        shell = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", "from django.core.cache import cache; cache.set('k', 'v')"],
            cwd=ROOT, env={**os.environ, "REDIS_URL": url}, capture_output=True, text=True, timeout=60)
        assert shell.returncode == 0, shell.stderr
        master = redis.Redis(port=master_port, password=servers.redis_password)
        try:
            assert master.keys("dqcache:*") == [b"dqcache:1:k"]
        finally:
            master.close()
        refused = make_runtime(url.split("?")[0], message_log=False)  # the sentinel's own password left out
        try:
            with pytest.raises(redis.RedisError):
                await refused.redis.ping()
        finally:
            await refused.close()
    finally:
        servers.stop()


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the process' children."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:  # any process of the machine, whose name or arguments need not be UTF-8 (a test's "bad\udcffbyte")
            stat = open(f"/proc/{entry}/stat", "rb").read().decode(errors="replace")
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry), cmdline))
    return found


def test_children_reads_processes_whose_arguments_are_not_utf8():
    # Another test's process on the machine (a command line given "bad\udcffbyte") failed the
    # ./dev run test that looks for its scanner among every process.
    odd = subprocess.Popen([sys.executable.encode(), b"-c", b"import time; time.sleep(30)", b"\xffbyte"])
    try:
        wait_for(lambda: any(pid == odd.pid and cmd.endswith(" \ufffdbyte ") for pid, cmd in children(os.getpid())),
                 10, "its command line")
    finally:
        odd.kill()
        odd.wait()


# A stack's start: seconds alone, over 60 once beside other test sessions on two cores.
STARTUP_SECONDS = 120


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


@pytest.mark.process
def test_dev_run_restarts_a_scanner_that_exits_and_keeps_serving(clean_state, tmp_path):
    """./dev run on the test servers (so it starts none of its own): its scanner killed, it says
    so, starts another and the API answers throughout; Ctrl-C stops everything."""
    port = free_port()
    env = {**scanner_env(), "REDIS_URL": REDIS_URL, "PORT": str(port), "HOST": "127.0.0.1", "WEB_CONCURRENCY": "1",
           "DELAYQUEUE_AUTH": "tokens"}
    token_path = token_file(env["DATABASE_URL"])
    output = tmp_path / "dev-run.log"
    with open(output, "wb") as log:
        dev = subprocess.Popen([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        def scanner():
            return next((pid for pid, cmd in children(dev.pid) if "run_scanners" in cmd), None)

        first = wait_for(scanner, STARTUP_SECONDS, "the scanner to start")
        wait_for(lambda: "delayqueue is serving http://127.0.0.1:" in output.read_text(), STARTUP_SECONDS,
                 "the serving line")
        # Its first start made an API token, kept (0600) and printed with ready-to-paste lines.
        token = token_path.read_text().strip()
        assert oct(token_path.stat().st_mode & 0o777) == "0o600"
        assert wait_for(lambda: f"API token (every scope; kept in {token_path}): {token}" in output.read_text(), 10,
                        "the token line")
        assert f"-H 'Authorization: Bearer {token}'" in output.read_text()
        assert f"http://127.0.0.1:{port}/t/{token}" in output.read_text()
        assert (serving(port) or {}).get("code") == 401  # no token; it answers once it says it serves
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "run_scanners exited with code -9; starting it again in 1 s" in output.read_text(), 10,
                 "the restart line")
        second = wait_for(lambda: (pid := scanner()) not in (None, first) and pid, 10, "a new scanner")
        assert dev.poll() is None
        assert wait_for(lambda: serving(port, token), 30, "the API to answer")["code"] == 200
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(30)
        token_path.unlink(missing_ok=True)  # the token lives in the test database, gone after the test
    assert dev.returncode == 0, output.read_text()
    assert not os.path.exists(f"/proc/{second}"), "the scanner outlived ./dev run"


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its new parent has not reaped."""
    try:
        return open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def children_end_when_killed(parent: subprocess.Popen, ready, named: tuple[str, ...]) -> None:
    """Once ready() (called until true), the parent's children are one of each `named`; killed with
    SIGKILL, which it cannot catch to stop them, the parent leaves none of them running."""
    started: dict[int, str] = {}
    try:
        wait_for(ready, STARTUP_SECONDS, "the parent to start its children")
        started = dict(children(parent.pid))
        assert all(any(name in cmd for cmd in started.values()) for name in named), started
    finally:
        parent.kill()
        parent.wait(30)
    try:
        wait_for(lambda: all(gone(pid) for pid in started), 30, f"{started} to end after their parent was killed")
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.process
def test_dev_run_killed_with_sigkill_leaves_no_web_server_or_scanner_behind(clean_state, tmp_path):
    env = {**scanner_env(), "REDIS_URL": REDIS_URL, "PORT": str(free_port()), "WEB_CONCURRENCY": "1"}
    output = tmp_path / "dev-run.log"
    with open(output, "wb") as log:
        dev = subprocess.Popen([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    children_end_when_killed(dev, lambda: "delayqueue is serving" in output.read_text(), ("run_scanners", "uvicorn"))


@pytest.mark.process
def test_local_servers_end_when_the_process_that_started_them_is_killed(server_dir):
    """./dev run's Redis and PostgreSQL (tied servers)."""
    starter = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from tools.stack import Services, free_port\n"
        f"servers = Services(Path({str(server_dir)!r}), durable=False, tied=True)\n"
        "servers.single_redis(); servers.postgres(free_port()); print('up', flush=True); time.sleep(600)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    # After its lines saying what it starts.
    children_end_when_killed(starter, lambda: "up\n" in iter(starter.stdout.readline, ""), ("redis-server", "postgres"))


@pytest.mark.process
def test_dev_run_makes_another_token_when_the_database_does_not_hold_the_kept_one(transactional_db, capsys):
    """A PostgreSQL data folder removed to start afresh keeps its password file, so the same URL
    and token file: ./dev run must not offer the old token, which every call would refuse (401);
    nor one revoked since."""
    env = scanner_env(DELAYQUEUE_AUTH="tokens")
    path = token_file(env["DATABASE_URL"])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # ./dev run's folder: absent in a checkout that never ran it
        path.write_text("dq_" + "x" * 43 + "\n")  # kept from a database since made afresh
        first = local_token(env)
        assert first and first != "dq_" + "x" * 43 and path.read_text().strip() == first
        assert "is unknown to the database (made afresh?), revoked or of another namespace than default: making " \
               "another" in capsys.readouterr().out
        row = ApiToken.objects.get(token_hash=token_hash(first))
        assert local_token(env) == first  # in force: kept
        row.revoked_at = row.created_at
        row.save()
        second = local_token(env)
        assert second not in (None, first) and ApiToken.objects.get(token_hash=token_hash(second)).revoked_at is None
        # DELAYQUEUE_NAMESPACE changed since: the token it shows must work in the namespace served.
        third = local_token({**env, "DELAYQUEUE_NAMESPACE": "elsewhere"})
        assert third != second and ApiToken.objects.get(token_hash=token_hash(third)).namespace == "elsewhere"
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.process
def test_dev_run_on_a_port_something_else_listens_on_says_so_and_fails(clean_state):
    """It must not take the other server for its own: say it serves, print the token for it, and
    end with exit code 0 once uvicorn fails to bind."""
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        ran = subprocess.run([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env={**scanner_env(), "REDIS_URL": REDIS_URL, "PORT": str(port),
                                              "HOST": "127.0.0.1", "WEB_CONCURRENCY": "1"})
    assert ran.returncode == 1, ran
    assert ran.stderr == (f"cannot serve on 127.0.0.1:{port}: something already listens there (stop it, or set PORT "
                          "to another port)\n")
    assert ran.stdout == ""


@pytest.mark.process
def test_dev_run_with_a_database_it_cannot_log_in_to_or_reach_says_so_in_one_line(transactional_db):
    """With DATABASE_URL set, a database down or a wrong password is one line naming the variable
    (never the password), not migrate's traceback."""
    parts = urlsplit(log_database_url())
    wrong_password = urlunsplit(parts._replace(
        netloc=f"{parts.username}:not-its-password@{parts.hostname}:{parts.port}"))
    down = f"postgres://postgres:not-its-password@127.0.0.1:{free_port()}/delayqueue"
    for url, problem in ((down, "Connection refused"), (wrong_password, 'password authentication failed for user')):
        ran = subprocess.run([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env={**scanner_env(), "REDIS_URL": REDIS_URL, "DATABASE_URL": url,
                                              "PORT": str(free_port())})
        assert ran.returncode == 1, ran
        assert re.fullmatch(f"cannot connect to the message log's database default \\(DATABASE_URL\\): "
                            f"connection failed: .*{problem}.*\n", ran.stderr), ran.stderr
        assert "not-its-password" not in ran.stdout + ran.stderr


def serving(port: int, token: str | None = None) -> dict | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.post(f"http://127.0.0.1:{port}/camellia/delayQueue/getMonitorData", headers=headers,
                          timeout=5).json()
    except httpx.HTTPError:
        return None


@pytest.mark.process
def test_a_data_folder_from_before_passwords_is_given_the_password_and_requires_it(server_dir):
    """PostgreSQL data folders made by ./dev run before it used passwords trust every local
    connection: the next start sets the password and makes pg_hba.conf ask for it."""
    servers = Services(server_dir, durable=False)
    data = server_dir / "postgres"
    servers._own(data)
    subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--locale=C"], check=True, stdout=subprocess.DEVNULL, **servers.as_owner)
    try:
        url = servers.postgres(free_port()).replace("postgres://", "postgresql://")
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(without_credentials(url).replace("://", "://postgres@"), connect_timeout=5,
                            passfile=os.devnull).close()
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("delayqueue",)
    finally:
        servers.stop()


@pytest.mark.process
def test_dev_manage_runs_manage_py_with_the_local_secret_key():
    """Without SECRET_KEY, plain manage.py refuses to start; ./dev manage passes the key
    ./dev run keeps in .local/run/ (made there if this is the first use)."""
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    plain = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 1 and plain.stderr.startswith("SECRET_KEY is not set: set it to a long random string")
    managed = subprocess.run([sys.executable, "-m", "tools.stack", "manage", "check"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert managed.returncode == 0, managed.stderr
    assert "System check identified no issues" in managed.stdout
    key_file = ROOT / ".local" / "run" / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
