"""Send latency with and without 2,000 long polls held open in the same server process.

Goal: p99 with the holds <= 1.2 x p99 without.

    .venv/bin/python -m bench.held_polls [--holds 2000] [--sends 3000]
"""
import argparse
import asyncio
import time

import httpx

from bench.harness import percentile, stack

API = "/camellia/delayQueue/"


async def send_latencies(client: httpx.AsyncClient, count: int, concurrency: int = 4) -> list[float]:
    latencies: list[float] = []

    async def worker(n):
        for _ in range(n):
            started = time.perf_counter()
            reply = await client.post(API + "sendMsg", data={"topic": "sends", "msg": "x", "delayMillis": "600000"})
            latencies.append((time.perf_counter() - started) * 1000)
            assert reply.json()["code"] == 200

    await asyncio.gather(*[worker(count // concurrency) for _ in range(concurrency)])
    return latencies


async def run(url: str, holds: int, sends: int) -> None:
    limits = httpx.Limits(max_connections=holds + 16, max_keepalive_connections=holds + 16)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        await send_latencies(client, 500)  # warm-up
        without = await send_latencies(client, sends)
        polls = [asyncio.create_task(client.post(API + "longPollingMsg", data={
            "topic": f"idle{i % 50}", "longPollingTimeoutMillis": "60000"})) for i in range(holds)]
        await asyncio.sleep(5)  # let every hold reach the server
        with_holds = await send_latencies(client, sends)
        still_held = sum(1 for p in polls if not p.done())
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    p99_without, p99_with = percentile(without, 99), percentile(with_holds, 99)
    print(f"send latency over {sends} sends (4 concurrent), ms:")
    print(f"  without holds: p50 {percentile(without, 50):.2f}  p99 {p99_without:.2f}")
    print(f"  with {still_held} of {holds} long polls held: p50 {percentile(with_holds, 50):.2f}  p99 {p99_with:.2f}")
    print(f"  p99 ratio {p99_with / p99_without:.2f} (goal <= 1.2)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=2000)
    parser.add_argument("--sends", type=int, default=3000)
    args = parser.parse_args()
    with stack(scanners=1) as (url, _env):
        asyncio.run(run(url, args.holds, args.sends))


if __name__ == "__main__":
    main()
