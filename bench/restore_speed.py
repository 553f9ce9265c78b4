"""Restore speed: `manage.py restore` of N messages from the message log into an empty Redis.

Fills the log with N live messages over 10 topics (half not yet due, half due; some with
retries) by SQL, then times the real command end to end, as an operator would run it after
losing Redis. Goal (issue 3): >= 50,000 messages/s for 1,000,000 messages.

    .venv/bin/python -m bench.restore_speed [--messages 1000000]
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

FILL = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'restore' || (g %% 10), 'm' || g, 'payload of message ' || g,
       now() - interval '1 minute',
       now() + (CASE WHEN g %% 2 = 0 THEN interval '1 hour' ELSE -interval '30 seconds' END),
       now() + interval '1 day', 10, g %% 3, 1 + g %% 3, now()
FROM generate_series(1, %s) AS g
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    with scratch_services("bench-", durable=True) as services:
        env = dict(os.environ, REDIS_URL=services.single_redis(), DATABASE_URL=services.postgres(free_port()))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        started = time.monotonic()
        with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://"), autocommit=True) as conn:
            conn.execute(FILL, [args.messages])
            conn.execute("VACUUM ANALYZE delayqueue_message")
        print(f"filled the log with {args.messages:,} live messages in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        out = subprocess.run([sys.executable, "manage.py", "restore"], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True)
        elapsed = time.monotonic() - started
        client = redis.Redis.from_url(env["REDIS_URL"])
        held = sum(client.hlen(f"dq:{{default:restore{i}}}:msgs") for i in range(10))
        print(f"manage.py restore: {out.stdout.strip()}")
        print(f"  {elapsed:.1f} s end to end (process start included): {args.messages / elapsed:,.0f} messages/s"
              f"  (goal >= 50,000); Redis now holds {held:,}")


if __name__ == "__main__":
    main()
