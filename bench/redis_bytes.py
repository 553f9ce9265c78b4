"""Redis memory per hot pending message (issue 27's figure): `--messages` waiting messages with
`--body-bytes` bodies, sent with sendMsgBatch due in 30 minutes (inside the default one-hour hot
window: later ones wait in the message log only and cost Redis nothing, bench.cold_tier), or
spread from there over `--spread-ms` (a packed list per second of due time: fewer messages a
second cost a list's own bytes over fewer), and
INFO memory's used_memory before and after, divided by the count, with what each kind of key
holds. Run twice, one stack each: without packed lists (DELAYQUEUE_PACK_LEAD_MILLIS 0: every
message in the waiting set) and with them (`--pack-lead-ms`, the default 5 s: each message in
its second's list until a lead before it). With `--shards` n > 1 each topic is sharded first
(setTopicConfig shards), and its messages spread over its n shards. The sends start once the
scanner's loader has given each topic (each shard) its window. With the message log on (the
default) the sends' history is written first, so the event stream holds nothing when memory is
read.

    .venv/bin/python -m bench.redis_bytes [--messages 100000] [--body-bytes 100] [--topics 1] [--pack-lead-ms 5000]
                                          [--spread-ms 0] [--shards 1]
"""
import argparse
import os
import re
import time
from collections import Counter

import redis

from bench.harness import empty_redis, history_written, stack
from delayqueue.live.keys import Meta, namespace_keys
from delayqueue.live.shards import topic_shards
from delayqueue_client import Client

HOT_DELAY_MS = 30 * 60 * 1000  # nothing falls due during the run, and all of it is in Redis
BATCH = 500


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(messages: int, body_bytes: int, topics: int, spread_ms: int, shards: int) -> tuple[float, Counter]:
    """(used_memory's growth a message, MEMORY USAGE by kind of key) on a stack of its own."""
    body = "x" * body_bytes
    names = [f"bytes{topic}" for topic in range(topics)]
    with stack(scanners=1) as (urls, env):
        empty_redis(env["REDIS_URL"])
        memory = redis.Redis.from_url(env["REDIS_URL"])
        with Client(urls["main"]) as client:
            for name in names:  # each topic's own keys (meta, stats) exist before the baseline
                if shards > 1:
                    client.set_topic_config(name, shards=shards)
                client.send(name, body, delay_ms=HOT_DELAY_MS)
            metas = [namespace_keys("default").topic(shard).meta for name in names
                     for shard in topic_shards(name, (shards,))]
            while not all(memory.hexists(meta, Meta.HOT_UNTIL) for meta in metas):
                time.sleep(0.05)  # the loader's first look at a topic gives it its window
            history_written(memory)
            before = used_memory(memory)
            for start in range(0, messages, BATCH):
                client.send_many([{"topic": names[i % topics], "msg": body,
                                   "delay_ms": HOT_DELAY_MS + i * spread_ms // messages}
                                  for i in range(start, min(start + BATCH, messages))])
            history_written(memory)
            after = used_memory(memory)
        # MEMORY USAGE of every key (all samples), a packed list (and a shard's key) counted with the
        # others of its kind.
        by_kind = Counter()
        for key in memory.scan_iter():
            kind = re.sub(r":packed:\d+$", ":packed:<second>", re.sub(r"%s\d+\.\d+\.\d+}", "%s<shard>}", key.decode()))
            by_kind[kind] += memory.memory_usage(key, samples=0) or 0
        memory.close()
    return (after - before) / messages, by_kind


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--topics", type=int, default=1, help="the messages spread over this many topics")
    parser.add_argument("--pack-lead-ms", type=int, default=5_000, help="DELAYQUEUE_PACK_LEAD_MILLIS of the second run")
    parser.add_argument("--spread-ms", type=int, default=0, help="the messages' due times spread over this long")
    parser.add_argument("--shards", type=int, default=1, help="each topic sharded over this many key sets")
    args = parser.parse_args()
    results = {}
    for lead in (0, args.pack_lead_ms):
        os.environ["DELAYQUEUE_PACK_LEAD_MILLIS"] = str(lead)
        per_message, by_kind = results[lead] = measure(args.messages, args.body_bytes, args.topics, args.spread_ms,
                                                       args.shards)
        layout = "in packed lists" if lead else "in the waiting set"
        print(f"{args.messages:,} waiting messages of {args.body_bytes} body bytes on {args.topics} topic(s) of "
              f"{args.shards} shard(s), due over "
              f"{args.spread_ms:,} ms, {layout} (pack lead {lead} ms): {per_message:,.1f} bytes a message")
        for key, size in by_kind.most_common(5):
            print(f"  {key}: {size:,} bytes, {size / args.messages:,.1f} a message")
    unpacked, packed = results[0][0], results[args.pack_lead_ms][0]
    print(f"packed / waiting set: {packed:,.1f} / {unpacked:,.1f} bytes = {packed / unpacked:.2f}x; at the packed "
          f"rate 100 M hot pending take {packed * 100_000_000 / 2**30:,.1f} GiB of Redis (issue 27's goal: 150 bytes "
          f"a hot message)")


if __name__ == "__main__":
    main()
