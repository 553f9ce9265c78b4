"""Sends across faults: a producer that never retries sends at a steady 300/s over HTTP while 8
long-poll consumers pull and ack, and during the run PostgreSQL is restarted (fast shutdown, then
started again), Redis is killed with SIGKILL and started again (its append-only file brings the
data back), and the scanner holding the topic is killed with SIGKILL while a standby runs.

Prints the sends each fault failed (with their answers), how long each store was down, the
messages lost (answered 200, never delivered) and doubled (delivered twice), and the scanner
take-over: from the kill to the standby's lock, and to its first promotion (the first 'due'
history row it wrote). Durable stores (fsync on), the message log on, the default settings.

    .venv/bin/python -m bench.fault_sends [--sends 20000]
"""
import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import psycopg
import redis

from bench.harness import percentile, raise_fd_limit, scratch_services, start_uvicorn
from delayqueue.config.arguments import positive_int
from delayqueue.live.keys import namespace_keys
from tools.stack import ROOT, free_port, terminate

API = "/camellia/delayQueue/"
RATE = 300
TOPIC = "faults"
CONSUMERS = 8
SCANNERS = ("bench-a", "bench-b")
# Each message due this long after its send, and up to 0.9 s more: a stream of promotions for the
# scanners, none due before Redis takes it (one that is costs its send two more log statements).
DELAY_MILLIS = 2_000
# Longer than an ack can take on a loaded machine (else a message is given again while its ack
# is on its way, a double that is no fault's); a pull whose answer a fault lost comes again
# after it, so the end waits that long for the last messages.
ACK_TIMEOUT_MILLIS = 60_000
# Each failure counted against the fault of the store its answer names; others by their time.
STORE_FAULTS = {"message log unavailable": "postgres fast restart", "redis unavailable": "redis kill -9 + restart"}

def running(services, what: str) -> subprocess.Popen:
    return next(proc for name, proc, _ in services.procs if name == what and proc.poll() is None)


def wait_until_up(check) -> float:
    """Calls check() until it stops raising; when it first did (monotonic)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            check()
            return time.monotonic()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def restart_postgres(services, database_url: str) -> tuple[float, float]:
    """A fast shutdown (SIGINT: sessions cut off) and a start on the same data and port; the
    time it went down and the time it first took a connection again (monotonic)."""
    down_at = time.monotonic()
    proc = running(services, "postgres")
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    with ThreadPoolExecutor(1) as starter:
        started = starter.submit(services.postgres, services.postgres_control["port"])
        up_at = wait_until_up(lambda: psycopg.connect(database_url, connect_timeout=1).close())
        started.result()
    return down_at, up_at


def restart_redis(services, url: str, port: int) -> tuple[float, float]:
    """kill -9, then a Redis on the same data (its append-only file) and port; the time it went
    down and the time it answered a command after loading (monotonic)."""
    down_at = time.monotonic()
    proc = running(services, "redis")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    services.redis("redis", port)
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        return down_at, wait_until_up(lambda: client.get(namespace_keys("default").topic(TOPIC).lock))
    finally:
        client.close()


def kill_scanner(scanners: dict[str, subprocess.Popen], url: str) -> tuple[str, str, float, float, float]:
    """SIGKILLs the scanner holding the topic's lock; its name, the standby's, the kill's wall time
    and the time until the standby holds the lock (monotonic, from the kill)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    lock = namespace_keys("default").topic(TOPIC).lock
    try:
        while (holder := client.get(lock)) not in scanners:  # none, for a moment after a restart
            time.sleep(0.01)
        standby = next(name for name in scanners if name != holder)
        killed_wall, killed_at = time.time(), time.monotonic()
        scanners[holder].send_signal(signal.SIGKILL)
        while client.get(lock) != standby:
            assert time.monotonic() - killed_at < 60, "the standby never took the lock"
            time.sleep(0.005)
        return holder, standby, killed_wall, killed_at, time.monotonic() - killed_at
    finally:
        client.close()


async def first_promotion_after(database_url: str, standby: str, since_wall: float) -> float:
    """The standby's first 'due' history row after `since_wall`: its time (epoch s), once its log
    writer has written it."""
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(
                "SELECT extract(epoch FROM min(at)) FROM delayqueue_messageevent WHERE topic = %s AND reason = 'due'"
                " AND process = %s AND at > to_timestamp(%s)", [TOPIC, f"scanner {standby}", since_wall])).fetchone()
            if row[0] is not None:
                return float(row[0])
            if time.monotonic() > deadline:
                raise SystemExit("no promotion by the standby in the message log")
            await asyncio.sleep(0.2)


async def send_all(http: aiohttp.ClientSession, count: int, sends: list) -> None:
    """`count` sends at RATE a second, each sent once (never retried) without waiting for the
    others; each answer lands in `sends` as (answered, msgId or None, failure text, seconds) with
    the time it was answered (monotonic)."""

    async def one(i):
        began = time.monotonic()
        try:
            async with http.post(API + "sendMsg", data={"topic": TOPIC, "msg": f"m{i}",
                                                        "delayMillis": DELAY_MILLIS + (i % 10) * 100}) as response:
                reply = await response.json(content_type=None)
            ok = reply["code"] == 200
            msg_id, failure = (reply["delayMsg"]["msgId"], None) if ok else (None, f"{reply['code']} {reply['msg']}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            msg_id, failure = None, f"http: {type(exc).__name__}"
        answered = time.monotonic()
        sends.append((answered, msg_id, failure, answered - began))

    loop = asyncio.get_running_loop()
    started, tasks = loop.time(), []
    for i in range(count):
        tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.sleep(max(0.0, started + (i + 1) / RATE - loop.time()))
    await asyncio.gather(*tasks)


async def consume(http: aiohttp.ClientSession, deliveries: Counter, stop: asyncio.Event) -> None:
    """One long-poll consumer: pulls, counts each message, acks it (the ack retried until
    answered: a consumer does not give up on its ack)."""
    while not stop.is_set():
        try:
            async with http.post(API + "longPollingMsg", data={"topic": TOPIC, "batch": 16, "ackTimeoutMillis": ACK_TIMEOUT_MILLIS,
                                                               "longPollingTimeoutMillis": 1000}) as response:
                reply = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            await asyncio.sleep(0.05)
            continue
        if reply["code"] != 200:
            await asyncio.sleep(0.05)
            continue
        ids = [m["msgId"] for m in reply["delayMsgList"]]
        deliveries.update(ids)
        while ids:
            try:
                async with http.post(API + "ackMsgBatch", json={"topic": TOPIC, "msgIds": ids}) as response:
                    if (await response.json(content_type=None))["code"] == 200:
                        break
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.05)


async def run(url: str, env: dict, services, redis_port: int, scanners: dict, count: int) -> None:
    loop = asyncio.get_running_loop()
    sends, deliveries, stop = [], Counter(), asyncio.Event()
    duration = count / RATE
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=4000), timeout=timeout) as http:
        consumers = [asyncio.ensure_future(consume(http, deliveries, stop)) for _ in range(CONSUMERS)]
        sending = asyncio.ensure_future(send_all(http, count, sends))
        began = time.monotonic()
        faults = {}
        await asyncio.sleep(duration * 0.25)
        faults["postgres fast restart"] = await loop.run_in_executor(
            None, restart_postgres, services, env["DATABASE_URL"])
        await asyncio.sleep(max(0.0, began + duration * 0.5 - time.monotonic()))
        faults["redis kill -9 + restart"] = await loop.run_in_executor(
            None, restart_redis, services, env["REDIS_URL"], redis_port)
        await asyncio.sleep(max(0.0, began + duration * 0.75 - time.monotonic()))
        holder, standby, killed_wall, killed_at, lock_after = await loop.run_in_executor(
            None, kill_scanner, scanners, env["REDIS_URL"])
        faults["scanner kill -9"] = (killed_at, killed_at)
        await sending
        sent = {msg_id for _, msg_id, _, _ in sends if msg_id}
        last_new, seen = time.monotonic(), 0
        while not sent <= set(deliveries) and time.monotonic() - last_new < ACK_TIMEOUT_MILLIS / 1000 + 30:
            if len(deliveries) != seen:
                seen, last_new = len(deliveries), time.monotonic()
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*consumers)
    promoted_wall = await first_promotion_after(env["DATABASE_URL"], standby, killed_wall)

    by_fault = {name: Counter() for name in faults}
    before = Counter()
    for answered, _msg_id, failure, _ in sends:
        if failure is None:
            continue
        named = [name for text, name in STORE_FAULTS.items() if text in failure]
        preceding = named or [name for name, (down_at, _) in faults.items() if down_at <= answered]
        (by_fault[max(preceding, key=lambda n: faults[n][0])] if preceding else before)[failure] += 1
    latencies = [seconds * 1000 for *_, seconds in sends]
    lost = sent - set(deliveries)
    doubled = [msg_id for msg_id, n in deliveries.items() if n > 1 and msg_id in sent]
    print(f"{count} sends at {RATE}/s over {duration:.0f} s, one try each; {CONSUMERS} long-poll consumers; "
          f"scanners {', '.join(scanners)}; load average at the end {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} cores)")
    for name, (down_at, up_at) in faults.items():
        failed = by_fault[name]
        down = f", down {up_at - down_at:.2f} s" if up_at > down_at else ""
        print(f"  {name} at {down_at - began:.1f} s{down}: {sum(failed.values())} failed sends"
              + (f" ({', '.join(f'{n} {text!r}' for text, n in failed.most_common())})" if failed else ""))
    if before:
        print(f"  before any fault: {sum(before.values())} failed sends ({dict(before)})")
    print(f"  answered 200: {len(sent)}; lost {len(lost)}; doubled {len(doubled)}")
    print(f"  send latency ms: p50 {percentile(latencies, 50):.1f}, p99 {percentile(latencies, 99):.1f}, "
          f"max {max(latencies):.0f}")
    print(f"  scanner take-over ({holder} killed, {standby} standing by): lock after {lock_after:.2f} s, "
          f"first promotion after {promoted_wall - killed_wall:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=positive_int, default=20_000, help="sends in the run, at 300/s")
    count = parser.parse_args().sends
    raise_fd_limit()
    with scratch_services("bench-faults-", durable=True) as services:
        redis_port = free_port()
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings", DELAYQUEUE_AUTH="open",
                   REDIS_URL=services.single_redis(redis_port), DATABASE_URL=services.postgres(free_port()))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        procs = []
        try:
            web, url = start_uvicorn(env, 1, services.base / "uvicorn.log")
            procs.append(web)
            scanners = {name: subprocess.Popen([sys.executable, "manage.py", "run_scanners", "--name", name], cwd=ROOT,
                                               env=env, stdout=subprocess.DEVNULL,
                                               stderr=open(services.base / f"{name}.log", "wb"))
                        for name in SCANNERS}
            procs.extend(scanners.values())
            time.sleep(0.5)  # scanners subscribed
            asyncio.run(run(url, env, services, redis_port, scanners, count))
        finally:
            terminate(procs)


if __name__ == "__main__":
    main()
