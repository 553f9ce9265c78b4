"""What the message log costs a send: the same HTTP sends with the log on and off.

Two uvicorn servers on one Redis and one durable PostgreSQL (fsync on): one with
DELAYQUEUE_MESSAGE_LOG=1 (every send committed in Postgres first, group commit; history
events into Redis streams, drained by the scanner's log writer), one with it off. wrk
measures them in interleaved rounds. Goals: batch ratio >= 0.8, single ratio >= 0.6.

Throughput is what a server can take, so each side is measured at two loads (wrk connections)
and its higher rate counts: a logged send waits for its group commit, so at the lower load the
log-on server leaves CPU idle that a busier producer would use. The ratio at the lower load
alone is printed as well.

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
    # kind -> (endpoint, body, messages per request, the two loads in wrk connections)
    kinds = {"single": ("sendMsg", single, 1, (args.connections, args.connections * 4)),
             "batch": ("sendMsgBatch", batch, BATCH, (max(4, args.connections // 4), args.connections))}
    rates = {(kind, log, load): [] for kind, (*_, loads) in kinds.items() for log in servers for load in loads}
    with stack(scanners=args.scanners, servers=servers) as (urls, env):
        for log in servers:  # warm-up
            wrk(urls[log] + API + "sendMsg", 2, args.connections, single)
        # Every phase starts on an empty Redis, so neither side pays for the other's messages.
        for round_ in range(1, args.rounds + 1):
            for kind, (endpoint, body, per_request, loads) in kinds.items():
                for load in loads:
                    for log in servers:
                        empty_redis(env["REDIS_URL"])
                        rates[kind, log, load].append(
                            wrk(urls[log] + API + endpoint, args.seconds, load, body) * per_request)
                    print(f"round {round_}: {kind} at {load} connections, log on "
                          f"{rates[kind, 'on', load][-1]:.0f} / off {rates[kind, 'off', load][-1]:.0f} msg/s", flush=True)
    print(f"medians of {args.rounds} interleaved rounds of {args.seconds} s")
    for kind, goal in (("single", 0.6), ("batch", 0.8)):
        low, high = kinds[kind][3]
        peak = {log: [max(a, b) for a, b in zip(rates[kind, log, low], rates[kind, log, high])] for log in servers}
        for label, on, off in ((f"at {low} connections", rates[kind, "on", low], rates[kind, "off", low]),
                               (f"peak of {low} / {high}", peak["on"], peak["off"])):
            ratio = statistics.median(a / b for a, b in zip(on, off))
            print(f"  {kind:6} {label:20} log on {statistics.median(on):9.0f} msg/s   "
                  f"log off {statistics.median(off):9.0f} msg/s   ratio {ratio:.2f} (goal >= {goal})")


if __name__ == "__main__":
    main()
