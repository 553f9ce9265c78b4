"""What the message log costs a send: the same HTTP sends with the log on and off.

Two uvicorn servers on one Redis and one durable PostgreSQL (fsync on): one with
DELAYQUEUE_MESSAGE_LOG=1 (every send committed in Postgres first, group commit; history
events into Redis streams, drained by the scanner's log writer), one with it off. wrk
measures them in interleaved rounds. Goals: batch ratio >= 0.8, single ratio >= 0.6.

Needs wrk (Debian: apt-get install wrk).

    .venv/bin/python -m bench.log_overhead [--seconds 10] [--connections 32] [--rounds 3]
"""
import argparse
import json
import shutil
import statistics

from bench.harness import empty_redis, stack
from bench.send_throughput import BATCH, post_script, wrk

API = "/camellia/delayQueue/"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scanners", type=int, default=1,
                        help="scanner processes (their log writer drains the history); 0 isolates the send path")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is needed: apt-get install wrk")
    single = post_script("topic=logbench&msg=hello&delayMillis=600000", "application/x-www-form-urlencoded")
    batch = post_script(json.dumps([{"topic": f"logbench{i % 4}", "msg": "hello", "delayMillis": 600000}
                                    for i in range(BATCH)]), "application/json")
    servers = {"on": {"DELAYQUEUE_MESSAGE_LOG": "1"}, "off": {"DELAYQUEUE_MESSAGE_LOG": "0"}}
    rates = {(kind, log): [] for kind in ("single", "batch") for log in servers}
    with stack(scanners=args.scanners, servers=servers) as (urls, env):
        for log in servers:  # warm-up
            wrk(urls[log] + API + "sendMsg", 2, args.connections, single)
        # Every phase starts on an empty Redis, so neither side pays for the other's messages.
        for _ in range(args.rounds):
            for log in servers:
                empty_redis(env["REDIS_URL"])
                rates["single", log].append(wrk(urls[log] + API + "sendMsg", args.seconds, args.connections, single))
            for log in servers:
                empty_redis(env["REDIS_URL"])
                rates["batch", log].append(wrk(urls[log] + API + "sendMsgBatch", args.seconds,
                                               max(4, args.connections // 4), batch) * BATCH)
    print(f"medians of {args.rounds} interleaved rounds of {args.seconds} s, wrk connections {args.connections}")
    for kind, goal in (("single", 0.6), ("batch", 0.8)):
        on, off = statistics.median(rates[kind, "on"]), statistics.median(rates[kind, "off"])
        ratio = statistics.median(a / b for a, b in zip(rates[kind, "on"], rates[kind, "off"]))
        print(f"  {kind:6}  log on {on:9.0f} msg/s   log off {off:9.0f} msg/s   ratio {ratio:.2f} (goal >= {goal})")


if __name__ == "__main__":
    main()
