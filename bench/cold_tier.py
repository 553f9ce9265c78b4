"""The cold tier (issue 27): Redis bytes per hot and per cold waiting message, the send rate of
each, and the loader's throughput, in one run of the real stack (uvicorn, a scanner, Redis,
durable PostgreSQL) with DELAYQUEUE_HOT_WINDOW_MILLIS = 1 h.

1. `--messages` hot messages (due in 30 min, inside the window) and as many cold ones (due in 30
   days) through sendMsgBatch: used_memory before and after each, divided by the count, read once
   the sends' notes in cold_sent are gone (a cold send's first 5 s: a cost of the send rate), and
   for the cold ones also right after the sends.
2. `--load` more cold messages, then (after a VACUUM ANALYZE and a CHECKPOINT, as PostgreSQL
   would have run them in the hours the messages waited) a loader in this process
   (workers/loader.py, the scanner's own code on the same Redis and PostgreSQL, with a window
   that covers them) moves them all into Redis: messages moved per second.
3. The same for a topic of `--shards` shards (set before its first send, once its first count
   has retired): one loader reads its rows once and loads each into its shard, a call per shard
   and page. The stack's Redis is a single one, so this measures what the shards cost the
   loader, not a spread over masters.

    .venv/bin/python -m bench.cold_tier [--messages 100000] [--load 200000] [--body-bytes 100] [--shards 3]
"""
import argparse
import asyncio
import os
import time

import psycopg
import redis

from bench.harness import history_written, stack
from delayqueue_client import Client

WINDOW_MS = 3_600_000
HOT_DELAY_MS = 30 * 60 * 1000
COLD_DELAY_MS = 30 * 24 * 3600 * 1000
BATCH = 1000


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def send_timed(client: Client, topic: str, body: str, count: int, delay_ms: int) -> float:
    """Sends `count` messages in batches; seconds taken."""
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        client.send_many([{"topic": topic, "msg": body, "delay_ms": delay_ms}
                          for _ in range(min(BATCH, count - start))])
    return time.perf_counter() - started


def notes_gone(memory: redis.Redis) -> None:
    """Waits until no topic's cold_sent holds a note: a cold send is noted there for its first
    IN_FLIGHT_MILLIS (the key expires twice that after the last), a cost of the send rate, not of
    the messages waiting."""
    while any(memory.scan_iter(match="dq:*:cold_sent", count=1000)):
        time.sleep(0.2)


def memory_per_message(client: Client, memory: redis.Redis, topic: str, body: str, count: int,
                       delay_ms: int) -> tuple[float, float, float]:
    """(bytes of Redis a message once the sends' notes are gone, sends a second, bytes a message
    right after the sends) for `count` messages sent `delay_ms` ahead."""
    history_written(memory)
    notes_gone(memory)
    before = used_memory(memory)
    seconds = send_timed(client, topic, body, count, delay_ms)
    history_written(memory)
    right_after = used_memory(memory)
    notes_gone(memory)
    return (used_memory(memory) - before) / count, count / seconds, (right_after - before) / count


async def load_all(env: dict, topic: str, shards: int = 1) -> tuple[int, float]:
    """Moves every cold message of the topic into Redis with the loader's code; (moved, seconds)."""
    import django

    os.environ.update({k: env[k] for k in ("REDIS_URL", "DATABASE_URL")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    django.setup()
    from delayqueue.config.settings import load_config
    from delayqueue.live.keys import Shard
    from delayqueue.runtime import Runtime
    from delayqueue.workers.loader import Loader

    # A loader moves messages sent hours or days before: PostgreSQL has long since vacuumed and
    # checkpointed them, work that would otherwise run during the timing, right after the sends.
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE delayqueue_message")
        conn.execute("CHECKPOINT")
    rt = Runtime(load_config().with_overrides(hot_window_millis=COLD_DELAY_MS + 86_400_000), process="bench-loader")
    loader = Loader(rt, lambda: [Shard(topic, shards, 0)])
    try:
        started = time.perf_counter()
        moved = await loader.load_topic(topic, force=True)
        return moved, time.perf_counter() - started
    finally:
        await loader.close()
        await rt.close()


def load_sharded(client: Client, memory: redis.Redis, env: dict, body: str, count: int,
                 shards: int) -> tuple[int, float]:
    """Part 3: (moved, seconds) for `count` cold messages of a topic of `shards` shards."""
    from delayqueue.live.keys import Shard, namespace_keys

    topic = "load-sharded"
    client.set_topic_config(topic, shards=shards)
    first = namespace_keys("default").topic(Shard(topic, shards, 0))
    client.send(topic, body, delay_ms=HOT_DELAY_MS)  # registered; the scanner's loader gives it windows
    while client.topic_config(topic)["drainingShards"] or not memory.hexists(first.meta, "hot_until"):
        time.sleep(0.1)
    send_timed(client, topic, body, count, COLD_DELAY_MS)
    history_written(memory)
    return asyncio.run(load_all(env, topic, shards))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--load", type=int, default=200_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()
    body = "x" * args.body_bytes
    os.environ["DELAYQUEUE_HOT_WINDOW_MILLIS"] = str(WINDOW_MS)
    with stack(scanners=1) as (urls, env):
        memory = redis.Redis.from_url(env["REDIS_URL"])
        with Client(urls["main"]) as client:
            for topic in ("hot", "cold", "load"):  # registered, and given their window by the scanner's loader
                client.send(topic, body, delay_ms=HOT_DELAY_MS)
                while not memory.hexists(f"dq:{{default:{topic}}}:meta", "hot_until"):
                    time.sleep(0.05)
            hot_bytes, hot_rate, _ = memory_per_message(client, memory, "hot", body, args.messages, HOT_DELAY_MS)
            cold_bytes, cold_rate, cold_right_after = memory_per_message(client, memory, "cold", body, args.messages,
                                                                         COLD_DELAY_MS)
            send_timed(client, "load", body, args.load, COLD_DELAY_MS)
            pending = 2 * args.messages + args.load
            history_written(memory)
            held = memory.zcard("dq:{default:load}:waiting")
            moved, seconds = asyncio.run(load_all(env, "load"))
            now_held = memory.zcard("dq:{default:load}:waiting")
            sharded_moved, sharded_seconds = load_sharded(client, memory, env, body, args.load, args.shards)
        memory.close()
    print(f"{args.messages:,} waiting messages of {args.body_bytes} body bytes each way, window {WINDOW_MS / 1000:.0f} s:")
    print(f"  hot  (due in 30 min): {hot_bytes:,.1f} bytes of Redis a message, sent at {hot_rate:,.0f}/s")
    print(f"  cold (due in 30 days): {cold_bytes:,.2f} bytes of Redis a message, sent at {cold_rate:,.0f}/s "
          f"(issue 27's goal: at most 2 bytes); right after the sends, with their notes in cold_sent: "
          f"{cold_right_after:,.2f}")
    print(f"  100 M cold messages at that rate: {max(cold_bytes, 0) * 100_000_000 / 2**20:,.1f} MiB of Redis "
          f"(used_memory moves by a few hundred bytes between readings of an idle Redis)")
    print(f"loader: {moved:,} cold messages moved into Redis in {seconds:.2f} s: {moved / seconds:,.0f} a second "
          f"(issue 27's goal: 50,000); waiting in Redis before {held:,}, after {now_held:,}; "
          f"{pending:,} pending in all")
    print(f"loader, a topic of {args.shards} shards: {sharded_moved:,} moved in {sharded_seconds:.2f} s: "
          f"{sharded_moved / sharded_seconds:,.0f} a second, "
          f"{(sharded_moved / sharded_seconds) / (moved / seconds):.2f}x the unsharded topic's")


if __name__ == "__main__":
    main()
