"""CPU per sendMsg in the web process: the ASGI application called in-process (no HTTP, no
load generator sharing the cores), message log off, on a Redis and a PostgreSQL (where the
limits are read) of its own. What the Python side of a send costs, steadier than a wrk run; run
it on two commits to compare them. --limits sets limits that are never reached on the namespace
and the topic (bench.harness.set_unreached_limits): what checking them costs.

    .venv/bin/python -m bench.send_cpu [--sends 20000] [--concurrency 32] [--rounds 3] [--limits]
"""
import argparse
import asyncio
import os
import subprocess
import sys
import time

from bench.harness import scratch_services, set_unreached_limits
from delayqueue.config.arguments import positive_int
from tools.stack import ROOT, free_port

PATH = "/camellia/delayQueue/sendMsg"
BODY = b"topic=bench&msg=hello&delayMillis=60000"


def scope() -> dict:
    return {"type": "http", "method": "POST", "path": PATH, "raw_path": PATH.encode(), "query_string": b"",
            "headers": [(b"content-type", b"application/x-www-form-urlencoded"), (b"host", b"127.0.0.1")],
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1234), "scheme": "http", "root_path": "",
            "http_version": "1.1", "asgi": {"version": "3.0"}}


async def send_one(application) -> None:
    answer = []

    async def receive():
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message):
        answer.append(message)

    await application(scope(), receive, send)
    if b'"code":200' not in answer[-1]["body"]:
        raise SystemExit(f"sendMsg failed: {answer[-1]['body'][:200]!r}")


async def cpu_per_send(application, sends: int, concurrency: int) -> float:
    await send_one(application)  # connected, scripts loaded
    started = time.process_time()
    for _ in range(sends // concurrency):
        await asyncio.gather(*[send_one(application) for _ in range(concurrency)])
    return (time.process_time() - started) / (sends // concurrency * concurrency) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sends", type=positive_int, default=20_000)
    parser.add_argument("--concurrency", type=positive_int, default=32)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--limits", action="store_true", help="limits set on the namespace and topic, never reached")
    args = parser.parse_args()
    with scratch_services("bench-", durable=False) as services:
        os.environ.update(REDIS_URL=services.single_redis(), DATABASE_URL=services.postgres(free_port()),
                          DELAYQUEUE_MESSAGE_LOG="off", DJANGO_SETTINGS_MODULE="bench.settings")
        # As the other benchmarks: the queue's cost, not the tokens' (send_throughput --auth's question).
        os.environ.setdefault("DELAYQUEUE_AUTH", "open")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
        if args.limits:
            set_unreached_limits(dict(os.environ), ["bench"])
        import uvloop

        from project.asgi import application

        figures = [uvloop.run(cpu_per_send(application, args.sends, args.concurrency)) for _ in range(args.rounds)]
    print(f"CPU per sendMsg in the web process (limits {'set, never reached' if args.limits else 'none'}, "
          f"message log off, {args.sends} sends, {args.concurrency} at once):")
    print("  " + ", ".join(f"{us:.1f} us" for us in figures) + f"; median {sorted(figures)[len(figures) // 2]:.1f} us")


if __name__ == "__main__":
    main()
