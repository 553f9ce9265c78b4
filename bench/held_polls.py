"""Send latency with and without 2,000 long polls held open in the same server process.

Goal: p99 with the holds <= 1.2 x p99 without. The holds come from a client process of their
own, so the measuring client's bookkeeping for 2,000 connections is not what is measured.

    .venv/bin/python -m bench.held_polls [--holds 2000] [--sends 3000] [--rounds 3]
"""
import argparse
import asyncio
import json
import multiprocessing
import queue
import statistics
import time

import aiohttp

from bench.harness import percentile, stack
from delayqueue.config.arguments import positive_int

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


def hold_polls(url: str, holds: int, held: multiprocessing.Queue, release: multiprocessing.Event) -> None:
    """In a process of its own: opens the long polls, reports how many are held, keeps them open
    until released. The holders are other clients than the producer, as in production; in the
    measuring process their 2,000 connections' objects and garbage collections would add the
    client's own pauses to the send latencies."""
    async def main():
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=holds + 16),
                                         timeout=timeout) as holders:
            polls = [asyncio.create_task(hold(holders, f"idle{n % 50}")) for n in range(holds)]
            await asyncio.sleep(5)  # let every hold reach the server
            held.put(sum(1 for p in polls if not p.done()))
            await asyncio.get_running_loop().run_in_executor(None, release.wait)
            for p in polls:
                p.cancel()
            await asyncio.gather(*polls, return_exceptions=True)

    asyncio.run(main())


async def run(url: str, holds: int, sends: int, rounds: int) -> None:
    """Each round measures sends without holds, then with them. Rounds interleave because on a
    shared machine a p99 drifts between minutes more than the holds move it; the goal is judged
    on the median of the rounds' ratios."""
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    timeout = aiohttp.ClientTimeout(total=120)
    ratios = []
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=16), timeout=timeout) as senders:
        await send_latencies(senders, 500)  # warm-up
        print(f"send latency over {sends} sends (4 concurrent) per phase, ms:")
        for i in range(rounds):
            without = await send_latencies(senders, sends)
            held, release = spawn.Queue(), spawn.Event()
            holder = spawn.Process(target=hold_polls, args=(url, holds, held, release))
            holder.start()
            try:
                try:
                    still_held = await loop.run_in_executor(None, lambda: held.get(timeout=120))
                except queue.Empty:
                    raise SystemExit("the process holding the long polls reported nothing in 120 s") from None
                with_holds = await send_latencies(senders, sends)
            finally:  # the holder never outlives its round, whatever happened in it
                release.set()
                await loop.run_in_executor(None, holder.join, 30)
                if holder.is_alive():
                    holder.kill()
            await asyncio.sleep(1)  # the server sees the hang-ups
            ratios.append(percentile(with_holds, 99) / percentile(without, 99))
            print(f"  round {i + 1}: without holds p50 {percentile(without, 50):.2f} p99 {percentile(without, 99):.2f}; "
                  f"with {still_held} of {holds} held p50 {percentile(with_holds, 50):.2f} "
                  f"p99 {percentile(with_holds, 99):.2f}; p99 ratio {ratios[-1]:.2f}")
    print(f"  p99 ratio, median of {rounds} rounds: {statistics.median(ratios):.2f} (goal <= 1.2)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=positive_int, default=2000)
    parser.add_argument("--sends", type=positive_int, default=3000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    with stack(scanners=1) as (urls, _env):
        url = urls["main"]
        asyncio.run(run(url, args.holds, args.sends, args.rounds))


if __name__ == "__main__":
    main()
