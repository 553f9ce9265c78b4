"""Issue 27's compact hot layout, measured before building it: the Redis bytes a hot waiting
message costs in the layout the scripts use and in candidate layouts, written straight into a
scratch Redis (no service): `--messages` messages with `--body-bytes` bodies, due over 30
minutes, msgIds as the service makes them. used_memory before and after each layout, divided.

    .venv/bin/python -m bench.hot_layouts [--messages 100000] [--body-bytes 100]

Layouts:
- as it is: the `msgs` hash (msgId -> the stored record, core.messages.stored) and the
  `waiting` sorted set (msgId, score triggerTime);
- packed member: one sorted set whose member is the packed record, score triggerTime;
- second strings: one string per second of due time holding that second's packed records one
  after another, and a sorted set of the seconds; nothing finds a message by msgId;
- second strings + msgId index: the same, with msgId -> its second in small hashes (1,024 of
  them, kept compact by Redis up to 128 entries each), which getMsg, deleteMsg, rescheduleMsg
  and a send's dedupe need;
- second lists: one list per second of due time, each message's packed record pushed on its own
  (RPUSH, as sends would: no string rewritten), and a sorted set of the seconds; nothing finds a
  message by msgId in Redis (the message log would, as it does for a cold message).
A packed record: the msgId's 16 bytes, then the triggerTime's ms within its second, the TTL,
the produceTime before the triggerTime, maxRetry, retry, priority, and the body.
"""
import argparse
import struct
import time
import zlib

import redis

from bench.harness import scratch_services
from delayqueue.core.messages import new_msg_id, stored

SPREAD_MS = 30 * 60 * 1000
TTL_MS = 3_600_000
INDEX_HASHES = 1024
PIPELINE = 2000


def packed(msg_id: str, trigger: int, produce: int, body: bytes) -> bytes:
    return bytes.fromhex(msg_id) + struct.pack(">HIIBBB", trigger % 1000, TTL_MS, trigger - produce, 3, 0, 0) + body


def as_it_is(client, messages, body):
    pipe = client.pipeline(transaction=False)
    for n, (msg_id, trigger, produce) in enumerate(messages, 1):
        pipe.hset("{t}:msgs", msg_id, stored("orders", msg_id, body.decode(), produce, trigger, trigger + TTL_MS, 3, 0,
                                             1, 0))
        pipe.zadd("{t}:waiting", {msg_id: trigger})
        if n % PIPELINE == 0:
            pipe.execute()
    pipe.execute()


def packed_member(client, messages, body):
    pipe = client.pipeline(transaction=False)
    for n, (msg_id, trigger, produce) in enumerate(messages, 1):
        pipe.zadd("{t}:waiting", {packed(msg_id, trigger, produce, body): trigger})
        if n % PIPELINE == 0:
            pipe.execute()
    pipe.execute()


def second_strings(client, messages, body):
    seconds: dict[int, list[bytes]] = {}
    for msg_id, trigger, produce in messages:
        seconds.setdefault(trigger // 1000, []).append(packed(msg_id, trigger, produce, body))
    pipe = client.pipeline(transaction=False)
    for second, records in seconds.items():
        pipe.set(f"{{t}}:due:{second}", b"".join(records))  # written whole: APPEND's spare room would count
        pipe.zadd("{t}:seconds", {second: second * 1000})
    pipe.execute()


def second_strings_indexed(client, messages, body):
    second_strings(client, messages, body)
    pipe = client.pipeline(transaction=False)
    for n, (msg_id, trigger, _produce) in enumerate(messages, 1):
        key = bytes.fromhex(msg_id)
        pipe.hset(f"{{t}}:ids:{zlib.crc32(key) % INDEX_HASHES}", key, trigger // 1000)
        if n % PIPELINE == 0:
            pipe.execute()
    pipe.execute()


def second_lists(client, messages, body):
    pipe = client.pipeline(transaction=False)
    for n, (msg_id, trigger, produce) in enumerate(messages, 1):
        pipe.rpush(f"{{t}}:due:{trigger // 1000}", packed(msg_id, trigger, produce, body))
        pipe.zadd("{t}:seconds", {trigger // 1000: trigger // 1000 * 1000})
        if n % PIPELINE == 0:
            pipe.execute()
    pipe.execute()


LAYOUTS = (("as it is", as_it_is), ("packed member", packed_member), ("second strings", second_strings),
           ("second strings + msgId index", second_strings_indexed), ("second lists", second_lists))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    args = parser.parse_args()
    body = b"x" * args.body_bytes
    now = int(time.time() * 1000)
    messages = []  # (msgId, triggerTime, produceTime): sent over the last minute, due over the next 30
    for i in range(args.messages):
        produce = now - 60_000 + i * 60_000 // args.messages
        messages.append((new_msg_id(produce), now + 60_000 + i * SPREAD_MS // args.messages, produce))
    with scratch_services("bench-layouts-", durable=False) as services:
        client = redis.Redis.from_url(services.single_redis())
        print(f"{args.messages:,} waiting messages of {args.body_bytes} body bytes, due over 30 min:")
        for name, fill in LAYOUTS:
            client.flushall()
            before = int(client.info("memory")["used_memory"])
            fill(client, messages, body)
            after = int(client.info("memory")["used_memory"])
            print(f"  {name}: {(after - before) / args.messages:,.1f} bytes a message ({client.dbsize():,} keys)",
                  flush=True)
        client.close()


if __name__ == "__main__":
    main()
