"""What a batch send costs Redis: the send script's CPU per message (INFO commandstats, EVALSHA's
usec over the messages sent) and the rate of one client sending batches over HTTP, message log
on (durable PostgreSQL), no scanner running. Run it on two commits to compare them.

Phases of --messages each, batches of --batch to one topic (ten topics in turn): due in 30 s
(waiting), due now (ready), msgIds of a schedule's shape, and the first phase again.

    .venv/bin/python -m bench.send_redis_cost [--messages 20000] [--batch 1000]
"""
import argparse
import time

import redis

from bench.harness import stack
from delayqueue.config.arguments import positive_int
from delayqueue_client import Client

PHASES = (("due in 30 s", 30_000, False), ("due now", 0, False), ("due in 30 s, msgIds as a schedule's", 30_000, True),
          ("due in 30 s, again", 30_000, False))


def script_usec(client: redis.Redis) -> int:
    return client.info("commandstats").get("cmdstat_evalsha", {"usec": 0})["usec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=positive_int, default=20_000, help="messages per phase")
    parser.add_argument("--batch", type=positive_int, default=1000, help="messages per sendMsgBatch")
    args = parser.parse_args()
    with stack(scanners=0) as (urls, env):
        memory = redis.Redis.from_url(env["REDIS_URL"])
        client = Client(urls["main"])
        for label, delay_ms, schedule_ids in PHASES:
            before, started, sent = script_usec(memory), time.perf_counter(), 0
            for batch in range(0, args.messages, args.batch):
                stamp = int(time.time() * 1000)
                count = min(args.batch, args.messages - batch)
                client.send_many([{"topic": f"t{batch // args.batch % 10}", "msg": "x" * 100, "delay_ms": delay_ms,
                                   **({"msg_id": f"s{batch + i}@{stamp}"} if schedule_ids else {})}
                                  for i in range(count)])
                sent += count
            seconds = time.perf_counter() - started
            print(f"{label:38} {sent / seconds:8,.0f} msg/s   Redis {(script_usec(memory) - before) / sent:5.1f} µs "
                  f"per message")


if __name__ == "__main__":
    main()
