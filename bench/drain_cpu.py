"""Where a drain's CPU goes: a due backlog of no-op tasks (bench.tasks_app) drained by
`delayqueue worker --processes 1 --threads 8`, with the CPU seconds each part of the stack used
meanwhile (Redis, PostgreSQL, the web process, the scanner with its log writer, the worker).

The backlog is sent with sendMsgBatch (due at once) and its `sent` history written before the
worker starts, so the figures are the drain's: pulls, handlers, acks and their history.

    .venv/bin/python -m bench.drain_cpu [--messages 20000] [--rounds 2]
"""
import argparse
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from bench.harness import cpu_by_part, empty_redis, history_written, stack
from bench.python_queues.common import time_drain
from bench.python_queues.delayqueue_side import NOOP_BODY, start_consumers, unsettled
from delayqueue_client import Client
from tools.stack import terminate

TOPIC = "drain"
# Each part of the stack by what its processes' command lines hold (harness.cpu_by_part).
PARTS = (("Redis", "redis-server"), ("PostgreSQL", "postgres"), ("web process", "uvicorn"),
         ("scanner", "run_scanners"), ("log process", "workers.log_process"), ("worker", "delayqueue"))


def one_round(client: Client, env: dict, messages: int) -> tuple[float, dict[str, float]]:
    empty_redis(env["REDIS_URL"])
    for start in range(0, messages, 500):
        client.send_many([{"topic": TOPIC, "msg": NOOP_BODY, "delay_ms": 0}
                          for _ in range(start, min(start + 500, messages))])
    events = redis.Redis.from_url(env["REDIS_URL"])
    history_written(events)  # the sends' history, before the drain's CPU is counted
    events.close()

    before = cpu_by_part(PARTS)
    procs = start_consumers(TOPIC, 1, 8, env)
    try:
        rate = time_drain(functools.partial(unsettled, client, TOPIC), messages, procs)
        used = cpu_by_part(PARTS)  # before the worker exits: its CPU is counted while it lives
    finally:
        terminate(procs)
    # A worker's start-up (imports) is in its figure; the others started before `before`.
    return rate, {name: used[name] - before[name] for name in used}


@contextmanager
def tasks_stack() -> Iterator[tuple[Client, dict]]:
    """The stack with one server and one scanner, a Client of the server, and the environment
    the consumers run in: DELAYQUEUE_URL names the server for bench.tasks_app's App, in this
    process too."""
    with stack(scanners=1) as (urls, env):
        os.environ["DELAYQUEUE_URL"] = urls["main"]
        with Client(urls["main"]) as client:
            yield client, dict(env, DELAYQUEUE_URL=urls["main"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tasks_stack() as (client, env):
        for round_number in range(1, args.rounds + 1):
            rate, used = one_round(client, env, args.messages)
            parts = ", ".join(f"{name} {seconds:.2f} s ({seconds / args.messages * 1e6:.0f} µs/msg)"
                              for name, seconds in used.items())
            print(f"round {round_number}: {args.messages:,} tasks drained at {rate:,.0f} msg/s; CPU: {parts}",
                  flush=True)


if __name__ == "__main__":
    main()
