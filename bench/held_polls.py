"""Send latency with and without 2,000 long polls held open in the same server process.

Goal: p99 with the holds <= 1.2 x p99 without. The holds and the sends use separate client
sessions, so the client's own pool bookkeeping for 2,000 connections is not what is measured.

    .venv/bin/python -m bench.held_polls [--holds 2000] [--sends 3000]
"""
import argparse
import asyncio
import json
import time

import aiohttp

from bench.harness import percentile, stack

API = "/camellia/delayQueue/"


async def send_latencies(client: aiohttp.ClientSession, count: int, concurrency: int = 4) -> list[float]:
    latencies: list[float] = []

    async def worker(n):
        for _ in range(n):
            started = time.perf_counter()
            async with client.post(API + "sendMsg", data={"topic": "sends", "msg": "x", "delayMillis": "600000"}) as r:
                body = await r.read()
            latencies.append((time.perf_counter() - started) * 1000)
            assert json.loads(body)["code"] == 200

    await asyncio.gather(*[worker(count // concurrency) for _ in range(concurrency)])
    return latencies


async def hold(client: aiohttp.ClientSession, topic: str) -> None:
    async with client.post(API + "longPollingMsg", data={"topic": topic, "longPollingTimeoutMillis": "60000"}) as r:
        await r.read()


async def run(url: str, holds: int, sends: int) -> None:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=16), timeout=timeout) as senders, \
            aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=holds + 16), timeout=timeout) as holders:
        await send_latencies(senders, 500)  # warm-up
        without = await send_latencies(senders, sends)
        polls = [asyncio.create_task(hold(holders, f"idle{i % 50}")) for i in range(holds)]
        await asyncio.sleep(5)  # let every hold reach the server
        with_holds = await send_latencies(senders, sends)
        still_held = sum(1 for p in polls if not p.done())
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await asyncio.sleep(1)
        # Measured again without holds: shows how far the stack itself drifted meanwhile
        # (PostgreSQL's autovacuum and checkpoints start as the log fills).
        after = await send_latencies(senders, sends)
    p99_without, p99_with, p99_after = percentile(without, 99), percentile(with_holds, 99), percentile(after, 99)
    print(f"send latency over {sends} sends (4 concurrent), ms:")
    print(f"  without holds: p50 {percentile(without, 50):.2f}  p99 {p99_without:.2f}")
    print(f"  with {still_held} of {holds} long polls held: p50 {percentile(with_holds, 50):.2f}  p99 {p99_with:.2f}")
    print(f"  without holds again: p50 {percentile(after, 50):.2f}  p99 {p99_after:.2f}")
    print(f"  p99 ratio {p99_with / p99_without:.2f} (goal <= 1.2); "
          f"against the later run without holds {p99_with / p99_after:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=2000)
    parser.add_argument("--sends", type=int, default=3000)
    args = parser.parse_args()
    with stack(scanners=1) as (urls, _env):
        url = urls["main"]
        asyncio.run(run(url, args.holds, args.sends))


if __name__ == "__main__":
    main()
