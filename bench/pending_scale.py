"""Millions of pending messages in the cold tier (issue 27): what they cost Redis and
PostgreSQL, and whether sends and firing slow down while they wait.

The real stack (uvicorn, a scanner, Redis, durable PostgreSQL) with DELAYQUEUE_HOT_WINDOW_MILLIS
= 1 h. First, on an empty log: the send rate (sendMsgBatch of 1,000 from one client, messages due
in 2 days, so cold) and the fire lateness of 10,000 messages due over 10 s (bench.fire_lateness).
Then `--pending` messages due from 2 h to 30 days ahead go into the log at COPY speed (SQL, over
10 topics whose windows the scanner's loader raised first, so they are cold as a send would have
left them), and the same figures again, with Redis' used_memory and the log's bytes a message.

    .venv/bin/python -m bench.pending_scale [--pending 20000000] [--send-seconds 10]
"""
import argparse
import asyncio
import gc
import os
import time

import psycopg
import redis

from bench.fire_lateness import run as fire_lateness
from bench.harness import history_written, percentile, stack
from delayqueue_client import Client

WINDOW_MS = 3_600_000
TOPICS = 10
SEND_DELAY_MS = 2 * 86_400_000
BATCH = 1000
FILL = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'pending' || (g %% {topics}), 'p' || g, repeat('x', 100), now(),
       now() + interval '2 hours' + ((g %% 1000000)::float8 / 1000000 + (g / 1000000) * 0.000001) * interval '28 days',
       now() + interval '40 days', 10, 0, 1, now()
FROM generate_series(%(first)s, %(last)s) AS g
"""
FILL_CHUNK = 1_000_000  # rows a statement: one long transaction would hold back every vacuum


def send_rate(client: Client, seconds: float) -> float:
    """Cold sends a second from one client, sendMsgBatch of 1,000, for about `seconds`."""
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        client.send_many([{"topic": "sends", "msg": "x" * 100, "delay_ms": SEND_DELAY_MS} for _ in range(BATCH)])
        sent += BATCH
    return sent / (time.perf_counter() - started)


def lateness(url: str, redis_url: str) -> list[float]:
    gc.freeze()
    return asyncio.run(fire_lateness(url, 10_000, 10_000, 4, False, 0, redis_url, WINDOW_MS))


def figures(values: list[float]) -> str:
    return (f"p50 {percentile(values, 50):.2f} ms, p99 {percentile(values, 99):.2f} ms, max {max(values):.2f} ms, "
            f"early {sum(1 for v in values if v < 0)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=20_000_000)
    parser.add_argument("--send-seconds", type=float, default=10)
    args = parser.parse_args()
    os.environ["DELAYQUEUE_HOT_WINDOW_MILLIS"] = str(WINDOW_MS)
    with stack(scanners=1) as (urls, env):
        memory = redis.Redis.from_url(env["REDIS_URL"], socket_timeout=None)
        dsn = env["DATABASE_URL"].replace("postgres://", "postgresql://")
        with Client(urls["main"], timeout=60) as client:
            for topic in ["sends", *(f"pending{i}" for i in range(TOPICS))]:
                client.send(topic, "registers the topic", delay_ms=SEND_DELAY_MS)
                while not memory.hexists(f"dq:{{default:{topic}}}:meta", "hot_until"):
                    time.sleep(0.05)
            empty_rate = send_rate(client, args.send_seconds)
            print(f"empty log: cold sends {empty_rate:,.0f}/s")
            empty_lateness = lateness(urls["main"], env["REDIS_URL"])
            client.purge("lateness")  # its consumers ack nothing: those messages would come back
            history_written(memory)
            redis_before = int(memory.info("memory")["used_memory"])
            started = time.monotonic()
            with psycopg.connect(dsn, autocommit=True) as conn:
                rows_before = conn.execute("SELECT count(*) FROM delayqueue_message").fetchone()[0]
                bytes_before = conn.execute("SELECT pg_total_relation_size('delayqueue_message')").fetchone()[0]
                for first in range(1, args.pending + 1, FILL_CHUNK):
                    conn.execute(FILL.format(topics=TOPICS),
                                 {"first": first, "last": min(first + FILL_CHUNK - 1, args.pending)})
                conn.execute("VACUUM ANALYZE delayqueue_message")
                log_bytes = conn.execute("SELECT pg_total_relation_size('delayqueue_message')").fetchone()[0]
            for i in range(TOPICS):  # the cold count the sends would have kept (getTopicInfo's)
                memory.hincrby(f"dq:{{default:pending{i}}}:meta", "cold", args.pending // TOPICS)
            print(f"filled {args.pending:,} pending messages (due 2 h to 30 days ahead, 100-byte bodies) in "
                  f"{time.monotonic() - started:.0f} s")
            redis_after = int(memory.info("memory")["used_memory"])
            full_rate = send_rate(client, args.send_seconds)
            print(f"{args.pending:,} pending: cold sends {full_rate:,.0f}/s")
            full_lateness = lateness(urls["main"], env["REDIS_URL"])
        memory.close()
    per_row = (log_bytes - bytes_before) / args.pending
    print(f"\n{args.pending:,} pending messages, window {WINDOW_MS // 60_000} min:")
    print(f"  Redis used_memory {redis_before / 2**20:,.1f} MiB before the fill, {redis_after / 2**20:,.1f} MiB after: "
          f"{(redis_after - redis_before) / args.pending:,.3f} bytes a pending message")
    print(f"  the message log: {per_row:,.0f} bytes a message (table, TOAST and indexes; "
          f"{rows_before:,} rows before the fill)")
    print(f"  100 M pending by that slope: Redis {max(redis_after - redis_before, 0) / args.pending * 1e8 / 2**30:,.2f} GiB "
          f"beyond what is due within the window (goal: all of it within 4 GiB), the log "
          f"{per_row * 1e8 / 2**30:,.0f} GiB")
    print(f"  cold sends from one client: {empty_rate:,.0f}/s on the empty log, {full_rate:,.0f}/s with them "
          f"pending ({full_rate / empty_rate:.2f}x)")
    print(f"  fire lateness, empty log: {figures(empty_lateness)}")
    print(f"  fire lateness, {args.pending:,} pending: {figures(full_lateness)}")


if __name__ == "__main__":
    main()
