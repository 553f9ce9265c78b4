"""Starts what a benchmark measures: Redis (unless REDIS_URL is set), the HTTP service under
uvicorn (project.asgi, bench.settings adds a hello-world view) and scanner processes."""
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import redis

from tools.stack import ROOT, Services, free_port, terminate

BENCH_HELLO = "/camellia/bench/hello"


def raise_fd_limit(wanted: int = 16_384) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process `pid` has used."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parent_pid(pid: int | str) -> int:
    """The parent of process `pid` (OSError when it is gone)."""
    return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])


def history_written(client) -> None:
    """Waits until the log writer has emptied every event stream of this Redis (redis.Redis)."""
    while any(client.xlen(key) for key in client.scan_iter("*:events")):
        time.sleep(0.05)


def descendants() -> dict[int, str]:
    """pid -> command line of every process below this one."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parents[int(entry)] = parent_pid(entry)
            commands[int(entry)] = open(f"/proc/{entry}/cmdline").read().replace("\0", " ")
        except OSError:  # gone meanwhile
            continue
    below, grown = {os.getpid()}, True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in below} - below
        below |= more
        grown = bool(more)
    return {pid: commands[pid] for pid in below - {os.getpid()}}


def cpu_by_part(parts: tuple[tuple[str, str], ...]) -> dict[str, float]:
    """CPU seconds so far of the processes below this one, by part: (name, what the command
    lines of its processes hold), the first that matches."""
    totals = dict.fromkeys((name for name, _ in parts), 0.0)
    for pid, command in descendants().items():
        for name, marker in parts:
            if marker in command:
                try:
                    totals[name] += cpu_seconds(pid)
                except OSError:
                    pass
                break
    return totals


def machine_cpu() -> tuple[float, float]:
    """The whole machine's busy and total CPU seconds so far, over every core (/proc/stat)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq + steal
    return busy / tick, (busy + idle + iowait) / tick


def child_pid(command: str) -> int:
    """The pid of this process' child whose command line names `command`."""
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or parent_pid(entry) != os.getpid():
                continue
            if command in open(f"/proc/{entry}/cmdline").read():
                return int(entry)
        except OSError:  # gone meanwhile
            continue
    raise SystemExit(f"no {command} process found")


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def start_uvicorn(env: dict, workers: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--lifespan", "off", "--no-access-log", "--workers", str(workers),
         "--backlog", "4096"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + BENCH_HELLO, timeout=1).read()
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(log.read_text())
            time.sleep(0.1)


def set_unreached_limits(env: dict, topics: list[str]) -> None:
    """The highest produce rate and live cap on the namespace and on each topic: every check a
    send can meet, none of them reached."""
    from delayqueue.core.constants import MAX_LIMIT

    for topic in [None, *topics]:
        subprocess.run([sys.executable, "manage.py", "set_limits", *(["--topic", topic] if topic else []),
                        "--produce-rate", str(MAX_LIMIT), "--max-live", str(MAX_LIMIT)],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def create_token(env: dict, scopes: str = "produce,consume,manage,monitor") -> str:
    """A new API token of the default namespace (create_token prints it alone on its last line)."""
    out = subprocess.run([sys.executable, "manage.py", "create_token", "--namespace",
                          env.get("DELAYQUEUE_NAMESPACE") or "default", "--scopes", scopes],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


_own_redis: set[str] = set()  # the Redis servers stack() started (the only ones empty_redis empties)


def empty_redis(url: str) -> None:
    """Empties a Redis this harness started, between benchmark phases (the scripts stay loaded).
    One given in REDIS_URL may hold someone's data: the benchmark stops instead."""
    if url not in _own_redis:
        raise SystemExit("this benchmark empties Redis between phases: run it without REDIS_URL, so it starts its own")
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


@contextlib.contextmanager
def scratch_services(prefix: str, durable: bool):
    """Services (Redis, PostgreSQL on demand) in a fresh folder under .local/, stopped and the
    folder removed afterwards (a durable PostgreSQL after a send benchmark holds gigabytes);
    kept, with the servers' logs, when the benchmark failed."""
    (ROOT / ".local").mkdir(exist_ok=True)  # where the benchmarks look for their servers' logs
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=ROOT / ".local"))
    services = Services(base, durable=durable)
    try:
        yield services
    except BaseException:
        print(f"the benchmark's data and logs are kept in {base}", file=sys.stderr)
        raise
    finally:
        services.stop()
    shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def stack(scanners: int = 1, workers: int = 1, servers: dict[str, dict] | None = None):
    """Yields ({server name: base_url}, env) with Redis, PostgreSQL (the message log, durable:
    fsync on, as in production), one uvicorn per entry of `servers` (name -> extra environment;
    default one server "main") and scanners running; stops them after."""
    raise_fd_limit()
    with scratch_services("bench-", durable=True) as services:
        base = services.base
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
        # The benchmarks measure the queue; what tokens cost is send_throughput --auth's question.
        env.setdefault("DELAYQUEUE_AUTH", "open")
        procs = []
        try:
            if not env.get("REDIS_URL"):
                env["REDIS_URL"] = services.single_redis()
                _own_redis.add(env["REDIS_URL"])
            if not env.get("DATABASE_URL"):
                env["DATABASE_URL"] = services.postgres(free_port())
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
            urls = {}
            for name, extra in (servers or {"main": {}}).items():
                proc, urls[name] = start_uvicorn({**env, **extra}, workers, base / f"uvicorn-{name}.log")
                procs.append(proc)
            for i in range(scanners):
                procs.append(subprocess.Popen([sys.executable, "manage.py", "run_scanners", "--name", f"bench-{i}"],
                                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                              stderr=open(base / f"scanner-{i}.log", "wb")))
            time.sleep(0.5)  # scanners subscribed
            yield urls, env
        finally:
            terminate(procs)
