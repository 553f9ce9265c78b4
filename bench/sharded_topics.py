"""One hot topic on a 3-master Redis Cluster, unsharded and in 6 shards (setTopicConfig shards).

The whole stack runs on a local 3-master cluster (one uvicorn worker, one scanner process, a
durable PostgreSQL). Two parts, each alternating unsharded and sharded rounds in one run:

1. Load split and throughput: per round a new topic gets --messages messages with sendMsgBatch
   (500 a call, 4 in flight), due over --spread-ms after a 2 s lead, promoted by the scanner,
   pulled (pullMsg, batch 100) and acked (ackMsgBatch) by --consumers consumers. Per master: the
   Redis CPU the round cost, as INFO commandstats' usec summed (reset before the round) and as
   INFO cpu's used_cpu_user + used_cpu_sys; its share of the three, and the three's sum; the web
   and scanner processes' CPU from /proc. The masters share this machine's cores, so the split
   of the work is the figure, not the wall rate. Throughput: messages / (first send to last ack).
2. Fire lateness: --lateness-messages due over 10 s, consumed by --pollers long polls; lateness
   = receipt - triggerTime, p50/p99/max per topic, and the scanner's share of it (promotion).

    .venv/bin/python -m bench.sharded_topics [--messages 200000] [--shards 6] [--rounds 2]
        [--spread-ms 10000] [--consumers 4] [--lateness-messages 10000] [--pollers 4]

--messages 0 or --lateness-messages 0 leaves that part out. Each sharded topic is used only once
the scanner has retired the shard count 1 it was created with (10 s after the change).
"""
import argparse
import asyncio
import json
import os
import random
import time
from urllib.parse import urlsplit

import aiohttp
import redis

from bench.harness import child_pid, cpu_seconds, percentile, scratch_services, stack
from tools.stack import cluster_ports

API = "/camellia/delayQueue/"


def masters(cluster_url: str) -> list[redis.Redis]:
    parts = urlsplit(cluster_url.replace("redis-cluster://", "redis://", 1))
    return [redis.Redis(host=host, port=int(port), password=parts.password)
            for host, port in (node.split(":") for node in parts.netloc.split("@")[1].split(","))]


def redis_cpu(nodes: list[redis.Redis]) -> list[tuple[float, float]]:
    """Per master: (commandstats usec summed, used_cpu_user + used_cpu_sys seconds)."""
    figures = []
    for node in nodes:
        usec = sum(stat["usec"] for stat in node.info("commandstats").values())
        cpu = node.info("cpu")
        figures.append((usec, cpu["used_cpu_user"] + cpu["used_cpu_sys"]))
    return figures


async def call(client: aiohttp.ClientSession, endpoint: str, method: str = "POST", **kwargs) -> dict:
    async with client.request(method, API + endpoint, **kwargs) as response:
        reply = await response.json()
    assert reply["code"] == 200, reply
    return reply


async def sharded(client, topic: str, shards: int) -> None:
    """Sets the new topic's shard count and waits until the count it had (1) is retired, which
    the scanner does once it is empty 10 s after the change: until then a pull asks it too."""
    await call(client, "setTopicConfig", data={"topic": topic, "shards": str(shards)})
    if shards == 1:
        return
    await call(client, "sendMsg", data={"topic": topic, "msg": "registers the topic", "msgId": "register",
                                        "delayMillis": "0"})
    await call(client, "pullMsg", data={"topic": topic, "batch": "1"})
    await call(client, "ackMsg", data={"topic": topic, "msgId": "register"})
    deadline = time.monotonic() + 60
    while (await call(client, "getTopicConfig", method="GET", params={"topic": topic}))["data"]["drainingShards"]:
        assert time.monotonic() < deadline, "the scanner did not retire the topic's shard count 1"
        await asyncio.sleep(0.5)


async def load_round(client, topic: str, shards: int, messages: int, spread_ms: int, consumers: int,
                     nodes: list[redis.Redis]) -> dict:
    await sharded(client, topic, shards)
    for node in nodes:
        node.config_resetstat()
    before = redis_cpu(nodes)
    web, scanner = child_pid("uvicorn"), child_pid("run_scanners")
    web_before, scanner_before = cpu_seconds(web), cpu_seconds(scanner)
    started = time.perf_counter()
    lead = 2000
    batches = [[{"topic": topic, "msg": "x", "delayMillis": lead + random.randint(0, spread_ms)}
                for _ in range(min(500, messages - start))] for start in range(0, messages, 500)]
    acked = 0

    async def send(mine):
        for batch in mine:
            reply = await call(client, "sendMsgBatch", json=batch)
            assert all(r["code"] == 200 for r in reply["results"])

    async def consume():
        nonlocal acked
        while acked < messages:
            pulled = (await call(client, "pullMsg", data={"topic": topic, "batch": "100",
                                                          "ackTimeoutMillis": "300000"}))["delayMsgList"]
            if not pulled:
                await asyncio.sleep(0.005)
                continue
            reply = await call(client, "ackMsgBatch", json={"topic": topic, "msgIds": [m["msgId"] for m in pulled]})
            assert all(r["done"] for r in reply["results"])
            acked += len(pulled)

    await asyncio.gather(*(send(batches[i::4]) for i in range(4)), *(consume() for _ in range(consumers)))
    wall = time.perf_counter() - started
    after = redis_cpu(nodes)
    usec = [a[0] - b[0] for a, b in zip(after, before)]
    cpu = [a[1] - b[1] for a, b in zip(after, before)]
    return {"shards": shards, "wall": wall, "rate": messages / wall, "usec": usec, "cpu": cpu,
            "web_cpu": cpu_seconds(web) - web_before, "scanner_cpu": cpu_seconds(scanner) - scanner_before}


async def lateness_round(client, topic: str, shards: int, messages: int, spread_ms: int, pollers: int) -> list[float]:
    await sharded(client, topic, shards)
    lead = 3000
    batch = [{"topic": topic, "msg": str(i), "delayMillis": lead + random.randint(0, spread_ms)}
             for i in range(messages)]
    for start in range(0, messages, 500):
        await call(client, "sendMsgBatch", json=batch[start:start + 500])
    lateness: list[float] = []
    done = asyncio.Event()

    async def poller():
        while not done.is_set():
            async with client.post(API + "longPollingMsg", data={
                    "topic": topic, "batch": "100", "ackTimeoutMillis": "120000",
                    "longPollingTimeoutMillis": "2000"}) as response:
                body = await response.read()
            received = time.time() * 1000
            lateness.extend(received - m["triggerTime"] for m in json.loads(body)["delayMsgList"])
            if len(lateness) >= messages:
                done.set()

    tasks = [asyncio.create_task(poller()) for _ in range(pollers)]
    await asyncio.wait_for(done.wait(), timeout=(lead + spread_ms) / 1000 + 60)
    await asyncio.gather(*tasks)
    return lateness


def promotion(cluster_url: str, topic: str, shards: int) -> str:
    """The scanner's share of the lateness: ready time - triggerTime, from the shards' stats."""
    from delayqueue.live.keys import Shard, topic_keys
    from delayqueue.live.shards import topic_shards

    first = masters(cluster_url)[0].connection_pool.connection_kwargs
    client = redis.RedisCluster(host=first["host"], port=first["port"], password=first["password"])
    total = count = worst = 0
    for shard in topic_shards(topic, (shards,)):
        stats = client.hgetall(topic_keys("default", *Shard(*shard)).stats)
        total += sum(int(v) for k, v in stats.items() if k.endswith(b"readyGap:sum"))
        count += sum(int(v) for k, v in stats.items() if k.endswith(b"readyGap:count"))
        worst = max([worst, *(int(v) for k, v in stats.items() if k.endswith(b"readyGap:max"))])
    client.close()
    return f"promotion (ready - triggerTime, whole ms): mean {total / max(count, 1):.2f} ms, max {worst} ms"


def share_line(label: str, values: list[float], unit: float, unit_name: str) -> str:
    total = sum(values) or 1
    return (f"{label}: " + "  ".join(f"{v / total:5.1%}" for v in values) + f"  (busiest {max(values) / total:.1%}; "
            f"all {total / unit:.2f} {unit_name})")


async def run(url: str, cluster_url: str, args) -> None:
    nodes = masters(cluster_url)
    connector = aiohttp.TCPConnector(limit=16 + args.pollers)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        print(f"part 1: {args.messages:,} messages a round sent, promoted, pulled and acked; masters "
              f"{', '.join(str(n.connection_pool.connection_kwargs['port']) for n in nodes)}")
        results = {1: [], args.shards: []}
        for round_number in range(args.rounds if args.messages else 0):
            order = [1, args.shards] if round_number % 2 == 0 else [args.shards, 1]
            for shards in order:
                result = await load_round(client, f"load-{round_number}-{shards}", shards, args.messages,
                                          args.spread_ms, args.consumers, nodes)
                results[shards].append(result)
                print(f"  round {round_number + 1}, {shards} shard(s): {result['rate']:,.0f} msg/s "
                      f"({result['wall']:.1f} s)")
                print("    " + share_line("commandstats usec per master", result["usec"], 1e6, "s"))
                print("    " + share_line("used_cpu per master          ", result["cpu"], 1, "s"))
                print(f"    web process CPU {result['web_cpu']:.1f} s, "
                      f"scanner process CPU {result['scanner_cpu']:.1f} s")
        for shards, rounds in results.items():
            busiest = [max(r["usec"]) / sum(r["usec"]) for r in rounds]
            rates = ", ".join(f"{r['rate']:,.0f}" for r in rounds)
            print(f"  {shards} shard(s): busiest master {', '.join(f'{b:.1%}' for b in busiest)} of the Redis "
                  f"work (commandstats); {rates} msg/s")
        if args.messages:
            one, many = (sum(r["rate"] for r in results[s]) / len(results[s]) for s in (1, args.shards))
            print(f"  throughput {args.shards} shards / 1 shard: {many:,.0f} / {one:,.0f} = {many / one:.2f}x")
        print(f"part 2: fire lateness, {args.lateness_messages:,} messages due over 10 s, {args.pollers} long polls")
        late = {1: [], args.shards: []}
        for round_number in range(args.rounds if args.lateness_messages else 0):
            order = [1, args.shards] if round_number % 2 == 0 else [args.shards, 1]
            for shards in order:
                values = await lateness_round(client, f"late-{round_number}-{shards}", shards, args.lateness_messages,
                                              10_000, args.pollers)
                late[shards].append(percentile(values, 99))
                print(f"  round {round_number + 1}, {shards} shard(s): p50 {percentile(values, 50):.2f} ms  "
                      f"p99 {percentile(values, 99):.2f} ms  max {max(values):.2f} ms  "
                      f"early {sum(1 for v in values if v < 0)}; "
                      + promotion(cluster_url, f"late-{round_number}-{shards}", shards))
        if args.lateness_messages:
            one, many = (sum(late[s]) / len(late[s]) for s in (1, args.shards))
            print(f"  p99 {args.shards} shards / 1 shard: {many:.2f} / {one:.2f} ms = {many / one:.2f}x")
    for node in nodes:
        node.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spread-ms", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--lateness-messages", type=int, default=10_000)
    parser.add_argument("--pollers", type=int, default=4, help="long polls at once in part 2")
    args = parser.parse_args()
    if os.environ.get("REDIS_URL"):
        raise SystemExit("this benchmark starts its own 3-master Redis Cluster: run it without REDIS_URL")
    with scratch_services("bench-cluster-", durable=False) as services:
        cluster_url = services.redis_cluster(cluster_ports(3))
        os.environ["REDIS_URL"] = cluster_url
        with stack(scanners=1) as (urls, _env):
            asyncio.run(run(urls["main"], cluster_url, args))


if __name__ == "__main__":
    main()
