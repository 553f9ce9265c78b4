"""HTTP send throughput, single and batch, against baselines on the same stack.

1. single: wrk POSTs sendMsg; baseline wrk GETs a bare Django hello-world async view served
   by the same uvicorn process and the same ASGI application. Goal: ratio >= 0.5.
2. batch: wrk POSTs sendMsgBatch with 100 messages per request; baseline: raw EVALSHA of the same
   send script, 100 new messages over four topics per round trip (one call per topic, as the
   service makes them), on the same Redis. Goal: ratio >= 0.5.

Needs wrk (Debian: apt-get install wrk).

With --limits, the namespace and every topic the benchmark sends to get a produce rate and a
live-message cap far above what it reaches: what checking limits costs a send.

With --auth, two servers on the same Redis and PostgreSQL, one with DELAYQUEUE_AUTH=tokens (every
request carries a Bearer token) and one with DELAYQUEUE_AUTH=open, are measured in interleaved
rounds instead of the baselines (each round swapping which goes first): what checking tokens costs
(goal: tokens within 5 % of open).

    .venv/bin/python -m bench.send_throughput [--seconds 10] [--connections 32] [--workers 1] [--message-log off]
                                              [--limits] [--auth]
"""
import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request

from bench.harness import BENCH_HELLO, create_token, empty_redis, set_unreached_limits, stack

API = "/camellia/delayQueue/"
BATCH = 100


def wrk(url: str, seconds: int, connections: int, script: str | None = None) -> float:
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        if script:
            lua.write(script)
            lua.flush()
            argv += ["-s", lua.name]
        out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise SystemExit(f"wrk saw HTTP errors:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def post_script(body: str, content_type: str, token: str | None = None) -> str:
    script = (f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
              f'wrk.headers["Content-Type"] = "{content_type}"\n')
    if token:
        script += f'wrk.headers["Authorization"] = "Bearer {token}"\n'
    return script


async def raw_evalsha_rate(redis_url: str, seconds: int, concurrency: int) -> float:
    """Messages/s of the send script called by SHA, 100 messages per round trip (a call per topic)."""
    from delayqueue.config.settings import QueueConfig
    from delayqueue.live.scripts import load_scripts
    from delayqueue.runtime import Runtime
    from delayqueue.live.keys import Shard
    from delayqueue.services.send import SendRequest, prepared, send_calls

    rt = Runtime(QueueConfig(redis_url=redis_url, namespace="raw"))
    await load_scripts(rt.redis)
    sent = 0
    deadline = time.monotonic() + seconds

    async def worker():
        nonlocal sent
        while time.monotonic() < deadline:
            # New msgIds every round, over four topics as the HTTP batches: a msgId sent again
            # while live is a duplicate, which the script answers without writing anything.
            produced = time.time_ns() // 1_000_000
            rows = [prepared(rt, SendRequest(topic=f"raw{i % 4}", msg="hello", delay_millis=600_000), produced, {})
                    for i in range(BATCH)]
            await rt.scripts.run([call for call, _ in send_calls(rt, rows, shards=[Shard(row.topic) for row in rows])])
            sent += BATCH

    started = time.monotonic()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    rate = sent / (time.monotonic() - started)
    await rt.close()
    return rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--message-log", choices=["on", "off"], default="off",
                        help="the server's DELAYQUEUE_MESSAGE_LOG (bench.log_overhead compares the two)")
    parser.add_argument("--limits", action="store_true",
                        help="set limits that are never reached on the namespace and the topics sent to")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure each side this many times, interleaved; medians are reported")
    parser.add_argument("--auth", action="store_true",
                        help="compare a server with DELAYQUEUE_AUTH=tokens to one with DELAYQUEUE_AUTH=open")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is needed: apt-get install wrk")
    if args.auth:
        return compare_auth(args)
    single_body = "topic=bench&msg=hello&delayMillis=600000"
    batch_body = json.dumps([{"topic": f"bench{i % 4}", "msg": "hello", "delayMillis": 600000} for i in range(BATCH)])
    # Each pair is measured back to back and the rounds interleaved: on a shared machine the
    # rate drifts between minutes, and a ratio of two distant measurements would carry that drift.
    rounds = {"hello": [], "single": [], "batch": [], "raw": []}
    servers = {"main": {"DELAYQUEUE_MESSAGE_LOG": "1" if args.message_log == "on" else "0"}}
    with stack(scanners=0, workers=args.workers, servers=servers) as (urls, env):
        url = urls["main"]
        if args.limits:
            set_unreached_limits(env, ["bench", *(f"bench{i}" for i in range(4))])
            time.sleep(1)  # every web process has read them
        wrk(url + BENCH_HELLO, 2, args.connections)  # warm-up
        # Every send phase starts on an empty Redis: sorted sets holding a million messages from
        # the phases before make the scripts slower, and would favour whichever phase runs first.
        for _ in range(args.rounds):
            rounds["hello"].append(wrk(url + BENCH_HELLO, args.seconds, args.connections))
            empty_redis(env["REDIS_URL"])
            rounds["single"].append(wrk(url + API + "sendMsg", args.seconds, args.connections,
                                        post_script(single_body, "application/x-www-form-urlencoded")))
            empty_redis(env["REDIS_URL"])
            rounds["batch"].append(wrk(url + API + "sendMsgBatch", args.seconds, max(4, args.connections // 4),
                                       post_script(batch_body, "application/json")) * BATCH)
            empty_redis(env["REDIS_URL"])
            rounds["raw"].append(asyncio.run(raw_evalsha_rate(env["REDIS_URL"], args.seconds, 4)))
    hello, single, batch, raw = (statistics.median(rounds[k]) for k in ("hello", "single", "batch", "raw"))
    single_ratio = statistics.median(s / h for s, h in zip(rounds["single"], rounds["hello"]))
    batch_ratio = statistics.median(b / r for b, r in zip(rounds["batch"], rounds["raw"]))
    print(f"limits {'set, never reached' if args.limits else 'none'}, "
          f"message log {args.message_log}, uvicorn workers: {args.workers}, wrk connections: {args.connections}, "
          f"medians of {args.rounds} interleaved rounds of {args.seconds} s")
    print(f"  hello-world view   {hello:10.0f} req/s")
    print(f"  sendMsg (single)   {single:10.0f} msg/s   ratio to hello-world {single_ratio:.2f} (goal >= 0.5)")
    print(f"  raw EVALSHA x{BATCH}    {raw:10.0f} msg/s")
    print(f"  sendMsgBatch x{BATCH}  {batch:10.0f} msg/s   ratio to raw EVALSHA {batch_ratio:.2f} (goal >= 0.5)")


def send_once(url: str, body: str, token: str | None) -> dict:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body.encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def compare_auth(args) -> None:
    """sendMsg and sendMsgBatch on a tokens server and an open one, in interleaved rounds. A third
    phase sends the same Bearer header to the open server, which ignores it: the difference
    between it and the tokens server is the check itself, the rest what carrying the header costs."""
    single_body = "topic=bench&msg=hello&delayMillis=600000"
    batch_body = json.dumps([{"topic": f"bench{i % 4}", "msg": "hello", "delayMillis": 600000} for i in range(BATCH)])
    log = "1" if args.message_log == "on" else "0"
    servers = {side: {"DELAYQUEUE_MESSAGE_LOG": log, "DELAYQUEUE_AUTH": side} for side in ("tokens", "open")}
    phases = {"tokens": "tokens", "open": "open", "open, header sent": "open"}  # phase -> its server
    rounds = {(phase, kind): [] for phase in phases for kind in ("single", "batch")}
    with stack(scanners=0, workers=args.workers, servers=servers) as (urls, env):
        token = create_token(env, "produce")
        for side in servers:  # refusals are HTTP 200 too (camellia's envelope): wrk would not see them
            answer = send_once(urls[side] + API + "sendMsg", single_body, token if side == "tokens" else None)
            if answer["code"] != 200:
                raise SystemExit(f"the {side} server refused a send: {answer}")
        wrk(urls["open"] + BENCH_HELLO, 2, args.connections)  # warm-up
        for round_number in range(args.rounds):
            # Each round turns the order round, so that an order effect (what the previous phase
            # left in Redis, the CPU's state) falls on every phase alike.
            order = list(phases)[round_number % 3:] + list(phases)[:round_number % 3]
            for phase in order:
                url = urls[phases[phase]]
                bearer = None if phase == "open" else token
                empty_redis(env["REDIS_URL"])
                rounds[phase, "single"].append(wrk(url + API + "sendMsg", args.seconds, args.connections,
                                                   post_script(single_body, "application/x-www-form-urlencoded", bearer)))
                empty_redis(env["REDIS_URL"])
                rounds[phase, "batch"].append(wrk(url + API + "sendMsgBatch", args.seconds, max(4, args.connections // 4),
                                                  post_script(batch_body, "application/json", bearer)) * BATCH)
    print(f"DELAYQUEUE_AUTH tokens vs open, message log {args.message_log}, uvicorn workers: {args.workers}, "
          f"wrk connections: {args.connections}, medians of {args.rounds} interleaved rounds of {args.seconds} s; "
          "ratios: medians of the rounds' ratios")
    for kind, label in (("single", "sendMsg (single)  "), ("batch", f"sendMsgBatch x{BATCH}")):
        median = {phase: statistics.median(rounds[phase, kind]) for phase in phases}

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(rounds[a, kind], rounds[b, kind]))

        print(f"  {label}  tokens {median['tokens']:8.0f}  open {median['open']:8.0f}  "
              f"open, header sent {median['open, header sent']:8.0f} msg/s;  tokens/open {ratio('tokens', 'open'):.3f} "
              f"(goal >= 0.95), tokens/open with header {ratio('tokens', 'open, header sent'):.3f}")


if __name__ == "__main__":
    main()
