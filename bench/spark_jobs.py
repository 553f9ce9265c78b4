"""Spark jobs at size: restore of N live messages by Spark local[2] versus `manage.py restore`,
the stats job over N messages and 5·N history rows, and the partitioned log reader alone.

Starts its own Redis and PostgreSQL, fills the log with generate_series (16 topics, 10 hours),
runs each job as its command line would (JVM start-up included) and prints wall times and
rows/s. `--messages` (default 1,000,000) scales it down for a quick look.
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

EVENTS_PER_MESSAGE = 5

FILL_MESSAGES = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'bench.' || (g %% 16), md5(g::text), repeat('x', 100),
       base + g * interval '36 ms', base + g * interval '36 ms' + d, now() + interval '30 days',
       10, 0, CASE WHEN base + g * interval '36 ms' + d > now() THEN 1 ELSE 2 END, base + g * interval '36 ms'
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT now() - interval '9 hours' AS base, (g %% 7) * interval '5 minutes' + (g %% 997) * interval '1 ms' AS d) AS t
"""
# Per message: sent, due, pulled, a nack or an ack timeout, pulled again (5 history rows).
FILL_EVENTS = """
INSERT INTO delayqueue_messageevent (namespace, topic, msg_id, event_id, at, from_status, to_status, retry, reason,
                                     process, host)
SELECT m.namespace, m.topic, m.msg_id, e.k || '-' || m.id, m.trigger_time + e.k * interval '1 s' + (m.id % 50) * interval '1 ms',
       e.f, e.t, e.r, CASE WHEN e.k = 3 AND m.id % 3 = 0 THEN 'nacked' ELSE e.w END, 'bench', 'bench'
FROM delayqueue_message m,
     (VALUES (0, 0, 1, 0, 'sent'), (1, 1, 2, 0, 'due'), (2, 2, 3, 1, 'pulled'), (3, 3, 2, 1, 'ack_timeout'),
             (4, 2, 3, 2, 'pulled')) AS e(k, f, t, r, w)
"""


def timed(what: str, argv: list[str], env: dict, rows: int) -> float:
    started = time.monotonic()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode:
        raise SystemExit(f"{what} failed:\n{result.stdout}\n{result.stderr[-4000:]}")
    last = (result.stdout.strip().splitlines() or [""])[-1]
    print(f"{what:<42} {elapsed:7.1f} s  {rows / elapsed:>10,.0f} rows/s   [{last}]", flush=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    n = parser.parse_args().messages

    with scratch_services("bench-spark-", durable=False) as services:
        env = dict(os.environ, REDIS_URL=services.single_redis(), DATABASE_URL=services.postgres(free_port()),
                   PYSPARK_PYTHON=sys.executable)
        subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True)
        started = time.monotonic()
        with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
            conn.execute(FILL_MESSAGES, {"n": n})
            conn.execute(FILL_EVENTS)
            conn.execute("VACUUM ANALYZE")
            events = conn.execute("SELECT count(*) FROM delayqueue_messageevent").fetchone()[0]
        print(f"log: {n:,} live messages in 16 topics, {events:,} history rows "
              f"(generated in {time.monotonic() - started:.1f} s)", flush=True)
        client = redis.Redis.from_url(env["REDIS_URL"])

        timed("manage.py restore", [sys.executable, "manage.py", "restore"], env, n)
        held_by_command = sum(client.hlen(f"dq:{{default:bench.{t}}}:msgs") for t in range(16))
        client.flushall()
        timed("spark restore, local[2]", [sys.executable, "-m", "spark.restore", "--master", "local[2]"], env, n)
        held_by_spark = sum(client.hlen(f"dq:{{default:bench.{t}}}:msgs") for t in range(16))
        print(f"messages in Redis after each restore: manage.py {held_by_command:,}, spark {held_by_spark:,}")
        client.flushall()
        client.close()

        timed(f"spark stats, local[2] ({n:,} + {events:,} rows)",
              [sys.executable, "-m", "spark.stats", "--master", "local[2]"], env, n + events)
        timed("log reader alone, local[2], history rows",
              [sys.executable, "-m", "bench.spark_read", "--master", "local[2]"], env, events)


if __name__ == "__main__":
    main()
