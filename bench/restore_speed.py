"""Restore speed: `manage.py restore` of N messages from the message log into an empty Redis.

Fills the log with N live messages over 10 topics (half not yet due, half due; some with
retries) by SQL, then times the real command end to end, as an operator would run it after
losing Redis. Goal (issue 3): >= 50,000 messages/s for 1,000,000 messages.

With --cold-messages C, C more waiting messages due 2 h to 30 days ahead go into the log too,
and the same log is restored three times, Redis emptied before each: with the cold tier
(DELAYQUEUE_HOT_WINDOW_MILLIS, 1 h), which brings back only the N and leaves the C to the
loader; the old way (window 0), which brings back all N + C; and with the cold tier again.
Issue 27 asks for the ratio at 1 M hot and 10 M cold.

    .venv/bin/python -m bench.restore_speed [--messages 1000000] [--cold-messages 10000000]
"""
import argparse
import os
import subprocess
import sys
import time

import psycopg
import redis

from bench.harness import scratch_services
from tools.stack import ROOT, free_port

TOPICS = 10
FILL = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'restore' || (g %% 10), 'm' || g, 'payload of message ' || g,
       now() - interval '1 minute',
       now() + (CASE WHEN g %% 2 = 0 THEN interval '30 minutes' ELSE -interval '30 seconds' END),
       now() + interval '40 days', 10, g %% 3, 1 + g %% 3, now()
FROM generate_series(1, %s) AS g
"""
# Waiting, due from 2 h to 30 days ahead, spread evenly.
FILL_COLD = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'restore' || (g %% 10), 'c' || g, 'payload of message ' || g,
       now() - interval '1 minute',
       now() + interval '2 hours' + (g::float8 / %(count)s) * interval '28 days',
       now() + interval '40 days', 10, 0, 1, now()
FROM generate_series(1, %(count)s) AS g
"""
WINDOW_MILLIS = 3_600_000


def restore(env: dict, window_millis: int) -> tuple[float, str, int]:
    """Empties Redis, runs manage.py restore: (seconds end to end, its line, messages Redis holds)."""
    client = redis.Redis.from_url(env["REDIS_URL"], socket_timeout=None)  # flushing GBs takes seconds
    client.flushall()
    started = time.monotonic()
    out = subprocess.run([sys.executable, "manage.py", "restore"], cwd=ROOT, check=True, capture_output=True,
                         text=True, env={**env, "DELAYQUEUE_HOT_WINDOW_MILLIS": str(window_millis)})
    elapsed = time.monotonic() - started
    held = sum(client.hlen(f"dq:{{default:restore{i}}}:msgs") for i in range(TOPICS))
    memory = client.info("memory")["used_memory"]
    client.close()
    return elapsed, f"{out.stdout.strip()}; Redis used_memory {memory / 2**20:,.0f} MiB", held


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--cold-messages", type=int, default=0)
    args = parser.parse_args()
    with scratch_services("bench-", durable=True) as services:
        env = dict(os.environ, REDIS_URL=services.single_redis(), DATABASE_URL=services.postgres(free_port()))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        started = time.monotonic()
        with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://"), autocommit=True) as conn:
            conn.execute(FILL, [args.messages])
            if args.cold_messages:
                conn.execute(FILL_COLD, {"count": args.cold_messages})
            conn.execute("VACUUM ANALYZE delayqueue_message")
        total = args.messages + args.cold_messages
        print(f"filled the log with {total:,} live messages ({args.cold_messages:,} due 2 h to 30 days ahead) in "
              f"{time.monotonic() - started:.1f} s")
        runs = [("the cold tier (1 h window)", WINDOW_MILLIS), ("every message (window 0)", 0),
                ("the cold tier again", WINDOW_MILLIS)] if args.cold_messages else [("", 0)]
        timings = {}
        for name, window in runs:
            elapsed, line, held = restore(env, window)
            timings.setdefault(window, []).append(elapsed)
            print(f"manage.py restore{', ' + name if name else ''}: {line}")
            print(f"  {elapsed:.1f} s end to end (process start included): {total / elapsed:,.0f} log messages/s"
                  f" (goal >= 50,000 for all-hot); Redis now holds {held:,}")
        if args.cold_messages:
            cold, hot = min(timings[WINDOW_MILLIS]), timings[0][0]
            print(f"the cold tier's restore against every message's: {hot:.1f} s / {cold:.1f} s = {hot / cold:.1f}x "
                  "faster (the quicker of its two runs)")


if __name__ == "__main__":
    main()
