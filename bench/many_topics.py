"""Many topics: what thousands of topics cost a scanner and Redis, busy and idle.

One message per topic, every one due at the same millisecond, sent ahead with sendMsgBatch.
Reports the promotion lateness over the topics (ready time - triggerTime, from the topics'
monitor counters: whole ms), then the CPU the scanner process and Redis use over 10 s with
every topic held and nothing due (lock renewals, the safety looks at idle topics, the log
writer's reads).

    .venv/bin/python -m bench.many_topics [--topics 5000]
"""
import argparse
import time

import httpx
import redis

from bench.harness import child_pid, cpu_seconds, percentile, stack
from delayqueue.config.arguments import positive_int
from delayqueue.live.keys import namespace_keys

API = "/camellia/delayQueue/"
LEAD_MS = 5000  # every send is done before the messages fall due
IDLE_SECONDS = 10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=positive_int, default=5000)
    args = parser.parse_args()
    ns = namespace_keys("default")
    with stack(scanners=1) as (urls, env), httpx.Client(base_url=urls["main"] + API, timeout=60) as http:
        r = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
        due = int(time.time() * 1000) + LEAD_MS
        for start in range(0, args.topics, 1000):
            batch = [{"topic": f"mt{i}", "msg": "x", "delayMillis": due - int(time.time() * 1000)}
                     for i in range(start, min(args.topics, start + 1000))]
            results = http.post("sendMsgBatch", json=batch).json()["results"]
            assert all(result["code"] == 200 for result in results), results[:1]
        time.sleep(max(0.0, due / 1000 - time.time()) + 3)
        pipe = r.pipeline(transaction=False)
        for i in range(args.topics):
            pipe.hgetall(ns.topic(f"mt{i}").stats)
        gaps = sorted(int(v) for stats in pipe.execute() for k, v in stats.items() if k.endswith("readyGap:max"))
        print(f"{args.topics} topics, one message each, all due at once; {len(gaps)} promoted")
        print(f"  promotion lateness  p50 {percentile(gaps, 50)} ms   p99 {percentile(gaps, 99)} ms   max {gaps[-1]} ms")

        scanner_pid, redis_pid = child_pid("run_scanners"), r.info("server")["process_id"]
        before = cpu_seconds(scanner_pid), cpu_seconds(redis_pid)
        time.sleep(IDLE_SECONDS)
        after = cpu_seconds(scanner_pid), cpu_seconds(redis_pid)
        scanner, redis_cpu = ((a - b) / IDLE_SECONDS * 100 for a, b in zip(after, before))
        print(f"  idle, every topic held: scanner {scanner:.1f} % of a core, Redis {redis_cpu:.1f} %")


if __name__ == "__main__":
    main()
