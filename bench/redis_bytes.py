"""Redis memory per hot pending message (issue 27's figure): `--messages` waiting messages with
`--body-bytes` bodies, sent with sendMsgBatch due in 30 minutes (inside the default one-hour hot
window: later ones wait in the message log only and cost Redis nothing, bench.cold_tier), and
INFO memory's used_memory before and after, divided by the count, with what each key holds. With the message log on (the default) the sends' history
is written first, so the event stream holds nothing when memory is read.

    .venv/bin/python -m bench.redis_bytes [--messages 100000] [--body-bytes 100] [--topics 1]
"""
import argparse

import redis

from bench.harness import empty_redis, history_written, stack
from delayqueue_client import Client

HOT_DELAY_MS = 30 * 60 * 1000  # nothing falls due during the run, and all of it is in Redis
BATCH = 500


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--topics", type=int, default=1, help="the messages spread over this many topics")
    args = parser.parse_args()
    body = "x" * args.body_bytes
    with stack(scanners=1) as (urls, env):
        empty_redis(env["REDIS_URL"])
        memory = redis.Redis.from_url(env["REDIS_URL"])
        with Client(urls["main"]) as client:
            for topic in range(args.topics):  # each topic's own keys (meta, stats) exist before the baseline
                client.send(f"bytes{topic}", body, delay_ms=HOT_DELAY_MS)
            history_written(memory)
            before = used_memory(memory)
            for start in range(0, args.messages, BATCH):
                client.send_many([{"topic": f"bytes{i % args.topics}", "msg": body, "delay_ms": HOT_DELAY_MS}
                                  for i in range(start, min(start + BATCH, args.messages))])
            history_written(memory)
            after = used_memory(memory)
        # MEMORY USAGE of every key (all samples): which structure holds the bytes.
        by_key = sorted(((memory.memory_usage(key, samples=0) or 0, key.decode()) for key in memory.scan_iter()),
                        reverse=True)
        keys = len(by_key)
        memory.close()
    per_message = (after - before) / args.messages
    print(f"{args.messages:,} waiting messages of {args.body_bytes} body bytes on {args.topics} topic(s): "
          f"used_memory {before:,} -> {after:,} bytes, {per_message:,.1f} bytes a message ({keys} keys)")
    for size, key in by_key[:5]:
        print(f"  {key}: {size:,} bytes, {size / args.messages:,.1f} a message")
    print(f"at that rate: {per_message * 100_000_000 / 2**30:,.1f} GiB of Redis for 100 M hot pending "
          f"(issue 27's goal: 150 bytes a hot message)")


if __name__ == "__main__":
    main()
