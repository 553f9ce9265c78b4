"""Fire lateness: 10,000 messages falling due over ~10 s, consumed by long polling.

Lateness = (time the consumer received the message) - triggerTime. Goal: p50 <= 2 ms,
p99 <= 10 ms, max <= 50 ms (camellia publishes 43 ms average, 798 ms max).

    .venv/bin/python -m bench.fire_lateness [--messages 10000] [--spread-ms 10000] [--pollers 4]
                                            [--priorities] [--backoff-ms 0] [--hot-window-ms 0] [--shards 1]

--priorities sends each message with a random priority 0-9; --backoff-ms gives the topic that retry
backoff (setTopicConfig) before the sends, so the scripts run with a topic's settings in force.
Lateness with both should match a plain run's (p99 within 10%). --hot-window-ms runs the service
with that DELAYQUEUE_HOT_WINDOW_MILLIS (at least 1000; below the 3 s lead every message is sent
cold, into the message log only, and crosses into Redis through the loader before it falls due).
--shards shards the topic (setTopicConfig) before the sends; the figures then cover its shards.
"""
import argparse
import asyncio
import gc
import json
import os
import random
import time

import aiohttp
import redis

from bench.harness import percentile, stack

API = "/camellia/delayQueue/"


async def promotion_lateness(redis_url: str, shards: int = 1) -> str:
    """The scanner's share: (ready time - triggerTime), from the per-topic monitor counters (of
    every shard)."""
    from delayqueue.config.settings import QueueConfig
    from delayqueue.runtime import Runtime

    rt = Runtime(QueueConfig(redis_url=redis_url))
    stats = [await rt.redis.hgetall(rt.ns.topic(shard).stats) for shard in lateness_shards(shards)]
    await rt.close()
    fields = [(k, int(v)) for each in stats for k, v in each.items()]
    total = sum(v for k, v in fields if k.endswith("readyGap:sum"))
    count = sum(v for k, v in fields if k.endswith("readyGap:count"))
    worst = max((v for k, v in fields if k.endswith("readyGap:max")), default=0)
    mean = total / max(count, 1)
    return f"promotion (ready - triggerTime, whole ms): mean {mean:.2f} ms, max {worst} ms over {count}"


def lateness_shards(shards: int) -> list:
    """The lateness topic's shards (its own keys, unsharded)."""
    from delayqueue.live.shards import topic_shards

    return topic_shards("lateness", (shards,))


def shard_metas(redis_url: str, shards: int):
    """A Redis client and the meta hash of each of the lateness topic's shards."""
    from delayqueue.live.keys import topic_keys as keys_of

    return (redis.Redis.from_url(redis_url, decode_responses=True),
            [keys_of("default", *shard).meta for shard in lateness_shards(shards)])


async def window_raised(client: aiohttp.ClientSession, redis_url: str, shards: int) -> None:
    """Registers the topic and waits until the scanner's loader has given it (each shard) a hot
    window: sends compare with it from then on."""
    from delayqueue.live.keys import Meta

    memory, metas = shard_metas(redis_url, shards)
    if all(memory.hexists(meta, Meta.HOT_UNTIL) for meta in metas):  # an earlier run in the same stack
        memory.close()
        return
    async with client.post(API + "sendMsg", data={"topic": "lateness", "msg": "registers the topic",
                                                  "msgId": "register", "delayMillis": "600000"}) as response:
        assert (await response.json())["code"] == 200
    while not all(memory.hexists(meta, Meta.HOT_UNTIL) for meta in metas):  # a reshard: its settling first
        await asyncio.sleep(0.05)
    async with client.post(API + "deleteMsg", data={"topic": "lateness", "msgId": "register"}) as response:
        assert (await response.json())["code"] == 200
    memory.close()


async def run(url: str, messages: int, spread_ms: int, pollers: int, priorities: bool, backoff_ms: int,
              redis_url: str, hot_window_ms: int, shards: int = 1) -> list[float]:
    """Sends, consumes and prints the lateness figures; the lateness of each message (ms)."""
    connector = aiohttp.TCPConnector(limit=pollers + 8)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        if shards > 1:
            config = {"topic": "lateness", "shards": str(shards)}
            async with client.post(API + "setTopicConfig", data=config) as response:
                reply = await response.json()
            assert reply["code"] == 200, reply
        if hot_window_ms:
            await window_raised(client, redis_url, shards)
        if backoff_ms:
            async with client.post(API + "setTopicConfig", data={"topic": "lateness",
                                                                 "retryBackoffMillis": str(backoff_ms)}) as response:
                reply = await response.json()
            assert reply["code"] == 200, reply
        lead_ms = 3000  # every send is done before the first message falls due
        batch = []
        for i in range(messages):
            message = {"topic": "lateness", "msg": str(i), "delayMillis": lead_ms + random.randint(0, spread_ms)}
            if priorities:
                message["priority"] = random.randint(0, 9)
            batch.append(message)
        for start in range(0, messages, 500):
            async with client.post(API + "sendMsgBatch", json=batch[start:start + 500]) as response:
                reply = await response.json()
            assert reply["code"] == 200 and all(r["code"] == 200 for r in reply["results"]), reply
        from delayqueue.live.keys import Meta

        memory, metas = shard_metas(redis_url, shards)
        # Not in the waiting set: in the message log only, or (of those) in packed lists.
        counts = [memory.hmget(meta, [Meta.COLD, Meta.PACKED]) for meta in metas]
        cold, packed = (sum(int(each[i] or 0) for each in counts) for i in (0, 1))
        memory.close()
        lateness: list[float] = []
        done = asyncio.Event()

        async def poller():
            while not done.is_set():
                async with client.post(API + "longPollingMsg", data={
                        "topic": "lateness", "batch": "100", "ackTimeoutMillis": "120000",
                        "longPollingTimeoutMillis": "2000"}) as response:
                    body = await response.read()
                received = time.time() * 1000
                for m in json.loads(body)["delayMsgList"]:
                    lateness.append(received - m["triggerTime"])
                if len(lateness) >= messages:
                    done.set()

        tasks = [asyncio.create_task(poller()) for _ in range(pollers)]
        await asyncio.wait_for(done.wait(), timeout=lead_ms / 1000 + spread_ms / 1000 + 60)
        await asyncio.gather(*tasks)
    print(f"fire lateness over {len(lateness)} messages due across {spread_ms / 1000:.0f} s, "
          f"{pollers} long-poll consumers" + (f", {shards} shards" if shards > 1 else "")
          + (", priorities 0-9" if priorities else "")
          + (f", topic retry backoff {backoff_ms} ms" if backoff_ms else "") + ":")
    print(f"  p50 {percentile(lateness, 50):.2f} ms   p99 {percentile(lateness, 99):.2f} ms   "
          f"max {max(lateness):.2f} ms   mean {sum(lateness) / len(lateness):.2f} ms")
    early = [x for x in lateness if x < 0]
    print(f"  delivered early: {len(early)} (a message is never consumable before its triggerTime)")
    if hot_window_ms:
        print(f"  right after the sends, of {messages:,}: {cold - packed:,} in the message log only (cold; the loader "
              f"brought them into Redis before they fell due), {packed:,} in packed lists (moved into the waiting set "
              f"a lead before their second); hot window {hot_window_ms} ms, DELAYQUEUE_PACK_LEAD_MILLIS "
              f"{os.environ.get('DELAYQUEUE_PACK_LEAD_MILLIS', 'at its default')}")
    return lateness


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--spread-ms", type=int, default=10_000)
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--priorities", action="store_true", help="send with random priorities 0-9")
    parser.add_argument("--backoff-ms", type=int, default=0, help="the topic's retry backoff (0: none)")
    parser.add_argument("--hot-window-ms", type=int, default=0, help="DELAYQUEUE_HOT_WINDOW_MILLIS (0: off)")
    parser.add_argument("--shards", type=int, default=1, help="the topic's shard count")
    args = parser.parse_args()
    os.environ["DELAYQUEUE_HOT_WINDOW_MILLIS"] = str(args.hot_window_ms)
    with stack(scanners=1) as (urls, env):
        url = urls["main"]
        gc.freeze()  # the consumer's own GC pauses are not the service's lateness
        asyncio.run(run(url, args.messages, args.spread_ms, args.pollers, args.priorities, args.backoff_ms,
                        env["REDIS_URL"], args.hot_window_ms, args.shards))
        print("  " + asyncio.run(promotion_lateness(env["REDIS_URL"], args.shards)))


if __name__ == "__main__":
    main()
