"""Schedules at scale: 10,000 schedules of 1 s in one namespace for 60 s.

Each schedule ticks every second for a minute (60 ticks; starts spread over one second, or all on
the same millisecond with --aligned). Reported from the message log once the history is written:
ticks fired (each tick's message and its 'ready' event), missing or doubled, the fewest and
most sends the planner made in a second, fire lateness (when the tick's message became ready
minus the tick: its promotion, or its send for a tick the planner sent late; p50, p99, max; goal
p99 <= 10 ms; none early), each second's own p99 (how many
seconds of the run meet the goal, the best and the worst: a run's p99 is set by its worst
seconds), the p99 while the planner sent and in the last seconds after its last send (it sends a
lead ahead), the p99 in the seconds Redis rewrote its AOF and in the others, Redis' own stalls
(its latency monitor: commands, forks, AOF writes of 5 ms or more) and the p99 in the seconds
with one and in the others, and the CPU each
part of the stack used over the minute, with how busy the whole machine was (the scanner
promotes the ticks; its log process plans them and writes their history).

    .venv/bin/python -m bench.schedules [--schedules 10000] [--seconds 60] [--topics 10] [--aligned] [--scanners 1]
                                        [--aof-rewrite-percentage 100]
"""
import argparse
import asyncio
import os
import random
import threading
import time

import aiohttp
import psycopg
import redis

from bench.harness import cpu_by_part, history_written, machine_cpu, stack
from tools.stack import ROOT

API = "/camellia/delayQueue/"
LEAD_MS = 20_000
GOAL_P99_MS = 10


async def create(url: str, count: int, topics: int, start: int, seconds: int, aligned: bool) -> None:
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(url, connector=connector) as client:
        async def one(i: int) -> None:
            first = start + (0 if aligned else random.randint(0, 999))
            async with client.post(API + "createSchedule", data={
                    "scheduleId": f"s{i}", "topic": f"tick{i % topics}", "msg": "x" * 100, "everyMillis": "1000",
                    "startTime": str(first), "endTime": str(first + (seconds - 1) * 1000)}) as response:
                reply = await response.json()
            assert reply["code"] == 200, reply

        for chunk in range(0, count, 200):
            await asyncio.gather(*(one(i) for i in range(chunk, min(count, chunk + 200))))


# When each tick's message became consumable, minus the tick: its promotion (waiting -> ready), or,
# for a tick the planner sent at or after its time, its send (ready at once). A send's row holds the
# sender's clock, which may read a little before the tick Redis' clock had passed: not early, so 0.
BECAME_READY = """
SELECT msg_id, from_status = 1 AS promoted, split_part(msg_id, '@', 2)::int8 / 1000 AS second,
       CASE WHEN from_status = 1 THEN lateness ELSE greatest(lateness, 0) END AS lateness
FROM (SELECT msg_id, from_status, (extract(epoch FROM at) * 1000)::int8 - split_part(msg_id, '@', 2)::int8 AS lateness
      FROM delayqueue_messageevent WHERE to_status = 2 AND (from_status = 1 OR reason = 'sent')) ready
"""
LATENESS = f"""
SELECT count(*), count(DISTINCT msg_id), count(*) FILTER (WHERE promoted AND lateness < 0),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness), percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness),
       max(lateness)
FROM ({BECAME_READY}) ready
"""
# The p99 of the ticks of each second of the run, in order (by the tick's second).
P99_BY_SECOND = f"""
SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness)
FROM ({BECAME_READY}) ready GROUP BY second ORDER BY second
"""
# Ticks the planner sent at or after their time (ready at once, not promoted): none when it keeps up.
SENT_LATE = "SELECT count(*) FROM delayqueue_messageevent WHERE reason = 'sent' AND to_status = 2"
SENT = "SELECT count(*), count(DISTINCT msg_id) FROM delayqueue_messageevent WHERE reason = 'sent'"
# How evenly the planner sends: its sends per whole second of the run (the first and last, partial, left out).
SENDS_PER_SECOND = """
SELECT min(n), max(n) FROM (
  SELECT count(*) AS n, rank() OVER (ORDER BY second) AS nth, count(*) OVER () AS seconds
  FROM (SELECT date_trunc('second', at) AS second FROM delayqueue_messageevent WHERE reason = 'sent') sends
  GROUP BY second) per_second
WHERE nth > 1 AND nth < seconds
"""
# The ticks' p99 while the planner sent and in the seconds after its last send (it sends a lead
# ahead, so the run's last seconds promote with no sends beside them): what the sends' load costs.
P99_BESIDE_SENDS = f"""
SELECT second * 1000 > (SELECT max((extract(epoch FROM at) * 1000)::int8)
                        FROM delayqueue_messageevent WHERE reason = 'sent'),
       count(*), percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness)
FROM ({BECAME_READY}) ready
GROUP BY 1 ORDER BY 1
"""
# The ticks' p99 in the given seconds (those an AOF rewrite ran in: Redis' fork and its child's
# copy-on-write share the two cores; or those Redis itself stalled in) and in the others.
P99_IN_SECONDS = f"""
SELECT second = ANY(%(seconds)s), count(*), percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness)
FROM ({BECAME_READY}) ready GROUP BY 1 ORDER BY 1
"""
PER_SCHEDULE = """
SELECT count(*) FILTER (WHERE n <> %(ticks)s), min(n), max(n)
FROM (SELECT split_part(msg_id, '@', 1) AS schedule, count(*) AS n FROM delayqueue_message GROUP BY 1) per
"""


def forks(client) -> int:
    """How many times Redis has forked (for an AOF rewrite, here)."""
    return client.info("stats")["total_forks"]


# Redis' latency monitor: each second's worst event of at least this many ms, by kind (a fast
# command, a script, a fork, an AOF write...), kept for the last 160 seconds with one.
STALL_MS = 5


def stalls(client) -> dict[str, list[tuple[int, int]]]:
    """Redis' own stalls since its latency monitor was reset: kind -> [(epoch second, ms)]."""
    return {kind.decode(): [(second, ms) for second, ms in client.execute_command("LATENCY", "HISTORY", kind)]
            for kind, *_ in client.execute_command("LATENCY", "LATEST")}


class RewriteSeconds(threading.Thread):
    """The whole seconds (epoch) in which Redis ran an AOF rewrite, looked at every 20 ms."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client, self.seconds, self.done = client, set(), threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            if self.client.info("persistence")["aof_rewrite_in_progress"]:
                self.seconds.add(int(time.time()))


# Where the machine's CPU goes over the minute (harness.cpu_by_part): the scanner promotes the
# ticks; its log process (workers/log_process.py) plans them and writes their history.
PARTS = (("Redis", "redis-server"), ("PostgreSQL", "postgres"), ("scanner", "run_scanners"),
         ("log process", "workers.log_process"), ("web", "uvicorn"))


def p99_of(split: dict, inside: bool) -> str:
    """One side of a split of the ticks (a query's (count, p99) by side): "p99 ms (ticks)" or "-"."""
    part = split.get(inside)
    return f"{part[1]:.0f} ms ({part[0]:,} ticks)" if part else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--aligned", action="store_true", help="every schedule ticks on the same millisecond")
    parser.add_argument("--scanners", type=int, default=1, help="run_scanners processes (they share the planning)")
    parser.add_argument("--aof-rewrite-percentage", type=int, default=100,
                        help="Redis' auto-aof-rewrite-percentage (its default 100: a rewrite each time the AOF "
                             "doubles)")
    args = parser.parse_args()
    with stack(scanners=args.scanners) as (urls, env):
        probe = redis.Redis.from_url(env["REDIS_URL"])
        probe.config_set("auto-aof-rewrite-percentage", args.aof_rewrite_percentage)
        probe.config_set("latency-monitor-threshold", STALL_MS)
        # Each create is a durable commit (about 10 ms here): the first ticks come after the last create.
        start = int(time.time() * 1000) + LEAD_MS + args.schedules * 20
        began = time.monotonic()
        asyncio.run(create(urls["main"], args.schedules, args.topics, start, args.seconds, args.aligned))
        took = time.monotonic() - began
        print(f"created {args.schedules:,} schedules of 1 s over {args.topics} topics in {took:.1f} s "
              f"({args.schedules / took:,.0f}/s); first ticks {(start / 1000 - time.time()):.0f} s later")
        if time.time() * 1000 > start - 12_000:
            raise SystemExit("creating the schedules took too long: their first ticks were not planned in time")
        while time.time() * 1000 < start:
            time.sleep(0.01)
        parts_before, machine_before, forks_before = cpu_by_part(PARTS), machine_cpu(), forks(probe)
        probe.execute_command("LATENCY", "RESET")
        rewrites = RewriteSeconds(redis.Redis.from_url(env["REDIS_URL"]))
        rewrites.start()
        time.sleep(args.seconds)
        rewrites.done.set()
        rewrites.join()
        parts = {name: used - parts_before[name] for name, used in cpu_by_part(PARTS).items()}
        busy, total = (after - before for after, before in zip(machine_cpu(), machine_before))
        forked = forks(probe) - forks_before
        stalled = stalls(probe)
        time.sleep(5)  # the last second's ticks fall due and are promoted
        history_written(probe)
        logs = sorted(ROOT.glob(".local/bench-*/scanner-*.log"), key=lambda p: p.stat().st_mtime)[-args.scanners:]
        warnings = [line for log in logs for line in log.read_text().splitlines()
                    if "WARNING" in line or "ERROR" in line]
        with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://")) as conn:
            # Fresh statistics: planned on those from before the run's rows, a query here once ran
            # for over ten minutes (which one was not caught).
            conn.execute("ANALYZE delayqueue_message, delayqueue_messageevent")
            readied, ready, early, p50, p99, worst = conn.execute(LATENESS).fetchone()
            [sent_late] = conn.execute(SENT_LATE).fetchone()
            sent, distinct_sent = conn.execute(SENT).fetchone()
            fewest_sends, most_sends = conn.execute(SENDS_PER_SECOND).fetchone()
            off, fewest, most = conn.execute(PER_SCHEDULE, {"ticks": args.seconds}).fetchone()
            by_second = [p99 for [p99] in conn.execute(P99_BY_SECOND).fetchall()]
            beside_sends = {after: (count, p99) for after, count, p99 in conn.execute(P99_BESIDE_SENDS).fetchall()}
            beside_rewrites = {inside: (count, p99) for inside, count, p99 in conn.execute(
                P99_IN_SECONDS, {"seconds": sorted(rewrites.seconds)}).fetchall()}
            stall_seconds = sorted({second for events in stalled.values() for second, _ms in events})
            beside_stalls = {inside: (count, p99) for inside, count, p99 in conn.execute(
                P99_IN_SECONDS, {"seconds": stall_seconds}).fetchall()}
    expected = args.schedules * args.seconds
    print(f"ticks expected {expected:,}; messages sent {distinct_sent:,} ('sent' events {sent:,}); "
          f"became ready {ready:,} (events {readied:,}), of them sent at or after their time (ready at once) "
          f"{sent_late:,}")
    print(f"the planner's sends per second (whole seconds): fewest {fewest_sends or 0:,}, most {most_sends or 0:,}")
    print(f"schedules with other than {args.seconds} ticks: {off} (fewest {fewest}, most {most}); "
          f"missing {expected - distinct_sent:,}; doubled {readied - ready + sent - distinct_sent:,}")
    print(f"fire lateness of the ticks (became ready - tick, whole ms; a tick sent late counts from its send): "
          f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst} ms; early {early}")
    print(f"each second's p99: {sum(p99 <= GOAL_P99_MS for p99 in by_second)} of {len(by_second)} seconds within "
          f"{GOAL_P99_MS} ms; best {min(by_second):.0f} ms, worst {max(by_second):.0f} ms")
    print(f"p99 of the ticks while the planner sent: {p99_of(beside_sends, False)}; "
          f"after its last send: {p99_of(beside_sends, True)}")
    print(f"p99 of the ticks in the {len(rewrites.seconds)} seconds an AOF rewrite ran: "
          f"{p99_of(beside_rewrites, True)}; in the others: {p99_of(beside_rewrites, False)}")
    print(f"Redis' own stalls of {STALL_MS} ms or more (its latency monitor; seconds with one, the worst): "
          + (", ".join(f"{kind} {len(events)}, {max(ms for _s, ms in events)} ms"
                       for kind, events in sorted(stalled.items())) or "none"))
    print(f"p99 of the ticks in the {len(stall_seconds)} seconds Redis stalled in: "
          f"{p99_of(beside_stalls, True)}; in the others: {p99_of(beside_stalls, False)}")
    print(f"CPU over the {args.seconds} s, share of a core: " + ", ".join(
        f"{name} {used / args.seconds:.0%}" for name, used in parts.items())
          + f" ({args.scanners} scanner process(es)); the machine {busy / total:.0%} busy on "
          f"{os.cpu_count()} cores; Redis forked {forked} times (AOF rewrites: each second with one is late)")
    if warnings:
        print("the scanner's log said:\n  " + "\n  ".join(warnings[-10:]))


if __name__ == "__main__":
    main()
