"""Starts what a benchmark measures: Redis (unless REDIS_URL is set), the HTTP service under
uvicorn (project.asgi, bench.settings adds a hello-world view) and scanner processes."""
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tools.stack import ROOT, Services, free_port, terminate

BENCH_HELLO = "/camellia/bench/hello"


def raise_fd_limit(wanted: int = 16_384) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


@contextlib.contextmanager
def stack(scanners: int = 1, workers: int = 1):
    """Yields (base_url, env) with Redis, uvicorn and scanners running; stops them after."""
    raise_fd_limit()
    base = Path(tempfile.mkdtemp(prefix="bench-", dir=ROOT / ".local" if (ROOT / ".local").exists() else None))
    services = Services(base, durable=False)
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
    procs = []
    try:
        if not env.get("REDIS_URL"):
            port = free_port()
            services.redis("redis", port)
            env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        http_port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1",
             "--port", str(http_port), "--lifespan", "off", "--no-access-log", "--workers", str(workers),
             "--backlog", "4096"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(base / "uvicorn.log", "wb"),
        ))
        for i in range(scanners):
            procs.append(subprocess.Popen([sys.executable, "manage.py", "run_scanners", "--name", f"bench-{i}"],
                                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(base / f"scanner-{i}.log", "wb")))
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + BENCH_HELLO, timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit((base / "uvicorn.log").read_text())
                time.sleep(0.1)
        time.sleep(0.5)  # scanners subscribed
        yield url, env
    finally:
        terminate(procs)
        services.stop()
