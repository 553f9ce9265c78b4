"""Python task queues against delayqueue as a Python user measures them (issue 18): huey, the reference.

One run, one machine, one Redis (the stack's: huey's keys beside delayqueue's), two delayqueue
servers (message log on, the default, and off) and one scanner. Each row is measured with
--messages messages (20,000 by default):

- huey 3.5: one producer (this process) calling the task normally; the drain of a due backlog
  by one, then two `huey_consumer` processes (huey's defaults: one worker thread, logging to a
  scratch file; -q measured the same) running an empty task; lateness of 300 tasks due over
  10 s (task start - eta; huey's scheduler looks once a second).
- requests: a hand-written `requests.Session` loop (keep-alive), one sendMsg after the other from
  one thread, to each server: what a Python user writes without the SDK; then the same with a
  bare `http.client` connection and pre-encoded bodies, the least a client can add to a call.
- sdk (only when `delayqueue_client` is importable): the batching producer (its defaults: linger
  2 ms, batches of 500, 4 in flight), sequential Client.send to each server, the drain by one and two
  `python -m bench.sdk_worker` processes (Worker with an empty handler, its defaults), and
  lateness through a Worker in this process: 300 messages due over 10 s, then 1,000 due a second
  over 20 s (received - triggerTime).

Sends, drains and lateness use the log-on server; the requests loop and Client.send run on
both. A drain's clock starts when the backlog first shrinks (the consumers' start-up is not
counted) and stops when nothing is left (huey: its queue is empty; delayqueue: nothing waiting,
ready or unacked). The ratios issue 18 sets goals for are printed when both sides ran.

    .venv/bin/python -m bench.python_queues [--messages 20000] [--only huey|requests|sdk ...]
        [--worker-concurrency N] [--worker-batch N]
"""
import argparse
import datetime
import gc
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import requests

from bench.harness import empty_redis, percentile, stack
from tools.stack import ROOT, terminate

API = "/camellia/delayQueue/"
FAR_DELAY_MS = 600_000  # sent messages never fall due during the run
LATENESS_MESSAGES, LATENESS_SPREAD_S = 300, 10
BUSY_RATE, BUSY_SECONDS = 1000, 20  # the SDK's second lateness row: due msg/s over seconds
LEAD_S = 3  # every send is done before the first message falls due


def start_processes(argv: list[str], count: int, env: dict) -> list[subprocess.Popen]:
    """`count` copies of a consumer process; each one's stderr goes to a scratch file, shown if it dies."""
    procs = []
    for _ in range(count):
        log = tempfile.TemporaryFile()
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log))
        procs[-1].log = log
    return procs


def check_alive(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            proc.log.seek(0)
            raise SystemExit(f"{proc.args} exited with {proc.returncode}:\n{proc.log.read().decode()}")


def time_drain(left, total: int, procs: list[subprocess.Popen], timeout: float = 300) -> float:
    """msg/s of a drain, from the first poll that sees the backlog (`left()`) below `total` to the
    first that sees it empty; the messages taken before the clock started are not counted."""
    deadline = time.monotonic() + timeout
    while (remaining := left()) >= total:
        check_alive(procs)
        if time.monotonic() > deadline:
            raise SystemExit("the consumers took nothing")
        time.sleep(0.01)
    started, counted = time.perf_counter(), remaining
    while left() > 0:
        check_alive(procs)
        if time.monotonic() > deadline:
            raise SystemExit(f"the drain did not end: {left()} left")
        time.sleep(0.01)
    return counted / (time.perf_counter() - started)


def lateness_figures(values: list[float]) -> tuple[float, float, float, int]:
    """p50, p99, max (ms) and how many were early."""
    return percentile(values, 50), percentile(values, 99), max(values), sum(1 for v in values if v < 0)


def show_lateness(label: str, figures: tuple[float, float, float, int]) -> None:
    p50, p99, worst, early = figures
    print(f"  {label}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms, early {early}", flush=True)


def show_rate(label: str, rate: float) -> None:
    print(f"  {label}: {rate:,.0f} msg/s", flush=True)


def huey_rows(env: dict, messages: int) -> dict:
    os.environ["BENCH_HUEY_REDIS_URL"] = env["BENCH_HUEY_REDIS_URL"]
    from bench import huey_app

    huey = huey_app.huey
    consumer = [sys.executable, "-m", "huey.bin.huey_consumer", "bench.huey_app.huey"]
    rows = {}
    print("huey", flush=True)
    huey.flush()
    started = time.perf_counter()
    for _ in range(messages):
        huey_app.noop()
    rows["huey enqueue"] = messages / (time.perf_counter() - started)
    show_rate("one producer, normal call", rows["huey enqueue"])
    for count in (1, 2):
        if count > 1:  # the enqueue row left the first backlog
            for _ in range(messages):
                huey_app.noop()
        procs = start_processes(consumer, count, env)
        try:
            rows[f"huey drain {count}"] = time_drain(huey.pending_count, messages, procs)
        finally:
            terminate(procs)
        show_rate(f"drain of a due backlog, {count} consumer process{'es' if count > 1 else ''}",
                  rows[f"huey drain {count}"])
    procs = start_processes(consumer, 1, env)
    try:
        huey.storage.conn.delete(huey_app.LATENESS_KEY)
        now = time.time()
        for _ in range(LATENESS_MESSAGES):
            due = now + LEAD_S + random.uniform(0, LATENESS_SPREAD_S)
            huey_app.record_lateness.schedule(args=(due * 1000,),
                                              eta=datetime.datetime.fromtimestamp(due, tz=datetime.timezone.utc))
        deadline = time.monotonic() + LEAD_S + LATENESS_SPREAD_S + 30
        while huey.storage.conn.llen(huey_app.LATENESS_KEY) < LATENESS_MESSAGES:
            check_alive(procs)
            if time.monotonic() > deadline:
                raise SystemExit("huey's scheduled tasks did not all run")
            time.sleep(0.1)
    finally:
        terminate(procs)
    rows["huey lateness"] = lateness_figures([float(v) for v in huey.storage.conn.lrange(huey_app.LATENESS_KEY, 0, -1)])
    show_lateness(f"lateness, {LATENESS_MESSAGES} tasks due over {LATENESS_SPREAD_S} s", rows["huey lateness"])
    huey.flush()
    return rows


def requests_rows(urls: dict, env: dict, messages: int) -> dict:
    rows = {}
    print("requests.Session loop, sequential sendMsg from one thread", flush=True)
    for log in ("on", "off"):
        empty_redis(env["REDIS_URL"])
        with requests.Session() as session:
            url = urls[log] + API + "sendMsg"
            session.post(url, data={"topic": "requests", "msg": "warm-up", "delayMillis": FAR_DELAY_MS})
            started = time.perf_counter()
            for i in range(messages):
                answer = session.post(url, data={"topic": "requests", "msg": f"m{i}", "delayMillis": FAR_DELAY_MS}).json()
                assert answer["code"] == 200, answer
            rows[f"requests log {log}"] = messages / (time.perf_counter() - started)
        show_rate(f"log {log}", rows[f"requests log {log}"])
    print("bare http.client loop, sequential sendMsg from one thread (no client library: the server's floor)",
          flush=True)
    for log in ("on", "off"):
        empty_redis(env["REDIS_URL"])
        address = urllib.parse.urlsplit(urls[log])
        connection = http.client.HTTPConnection(address.hostname, address.port)
        headers = {"Content-Type": "application/json"}
        bodies = [json.dumps({"topic": "bare", "msg": f"m{i}", "delayMillis": FAR_DELAY_MS}) for i in range(messages)]
        started = time.perf_counter()
        for body in bodies:
            connection.request("POST", API + "sendMsg", body, headers)
            answer = json.loads(connection.getresponse().read())
            assert answer["code"] == 200, answer
        rows[f"bare log {log}"] = messages / (time.perf_counter() - started)
        connection.close()
        show_rate(f"log {log}", rows[f"bare log {log}"])
    return rows


def sdk_rows(urls: dict, env: dict, messages: int, worker_options: dict) -> dict:
    try:
        from delayqueue_client import Client, Worker
    except ImportError:
        print("SDK rows: delayqueue_client not installed", flush=True)
        return {}
    rows = {}
    print("delayqueue_client", flush=True)
    clients = {log: Client(urls[log]) for log in ("on", "off")}
    client = clients["on"]
    try:
        empty_redis(env["REDIS_URL"])
        producer = client.producer(linger_ms=2, max_batch=500)
        started = time.perf_counter()
        futures = [producer.send("producer", f"m{i}", delay_ms=FAR_DELAY_MS) for i in range(messages)]
        producer.flush()
        rows["sdk producer"] = messages / (time.perf_counter() - started)
        producer.close()
        assert len({future.result().msg_id for future in futures}) == messages
        show_rate("batching producer, one process, log on", rows["sdk producer"])

        for log, log_client in clients.items():
            empty_redis(env["REDIS_URL"])
            log_client.send("send", "warm-up", delay_ms=FAR_DELAY_MS)
            started = time.perf_counter()
            for i in range(messages):
                log_client.send("send", f"m{i}", delay_ms=FAR_DELAY_MS)
            rows[f"sdk send log {log}"] = messages / (time.perf_counter() - started)
            show_rate(f"sequential Client.send, log {log}", rows[f"sdk send log {log}"])

        for count in (1, 2):
            empty_redis(env["REDIS_URL"])
            topic = f"drain{count}"
            for start in range(0, messages, 500):
                results = client.send_many([{"topic": topic, "msg": f"m{i}", "delay_ms": 0}
                                            for i in range(start, min(start + 500, messages))])
                assert not any(isinstance(result, Exception) for result in results), results

            def left(topic=topic):
                info = client.topic_info(topic)
                return info["waitingQueueSize"] + info["readyQueueSize"] + info["ackQueueSize"]

            options = [f"{name}={value}" for name, value in worker_options.items()]
            procs = start_processes([sys.executable, "-m", "bench.sdk_worker", urls["on"], topic, *options],
                                    count, env)
            try:
                rows[f"sdk drain {count}"] = time_drain(left, messages, procs)
            finally:
                terminate(procs)
            show_rate(f"drain of a due backlog, {count} Worker process{'es' if count > 1 else ''}",
                      rows[f"sdk drain {count}"])

        gc.freeze()  # this process's own GC pauses are not the service's lateness
        for key, count, spread_s in (("sdk lateness", LATENESS_MESSAGES, LATENESS_SPREAD_S),
                                     ("sdk lateness busy", BUSY_RATE * BUSY_SECONDS, BUSY_SECONDS)):
            empty_redis(env["REDIS_URL"])
            rows[key] = worker_lateness(client, Worker, f"late{count}", count, spread_s, worker_options)
            show_lateness(f"lateness through a Worker, {count:,} messages due over {spread_s} s", rows[key])
    finally:
        for each in clients.values():
            each.close()
    return rows


def worker_lateness(client, worker_class, topic: str, count: int, spread_s: float,
                    worker_options: dict) -> tuple:
    """Sends `count` messages due uniformly over `spread_s` after the lead, runs a Worker (on this
    thread: it may want the signals) until each was handled, and answers the lateness figures
    (received - triggerTime)."""
    lateness: list[float] = []
    all_in = threading.Event()

    def handler(message):
        lateness.append(time.time() * 1000 - message.trigger_time)
        if len(lateness) >= count:
            all_in.set()

    # Due times from one instant after a lead that covers the sends (about 5,000 msg/s at worst).
    first_due_ms = time.time() * 1000 + (LEAD_S + count / 5000) * 1000
    producer = client.producer(linger_ms=2, max_batch=500)
    for i in range(count):
        producer.send(topic, f"m{i}", trigger_time=int(first_due_ms + random.uniform(0, spread_s * 1000)))
    producer.close()
    if time.time() * 1000 > first_due_ms:
        raise SystemExit("the lateness row's sends took longer than their lead: its figures would count them")
    worker = worker_class(client, topic, handler, **worker_options)

    def stop_when_all_in():
        all_in.wait(LEAD_S + count / 5000 + spread_s + 30)
        worker.stop()

    threading.Thread(target=stop_when_all_in, daemon=True).start()
    worker.run()
    if not all_in.is_set():
        raise SystemExit(f"the Worker handled {len(lateness)} of {count}")
    return lateness_figures(lateness)


def ratio(rows: dict, ours: str, theirs: str, label: str, goal: float | None) -> None:
    if ours in rows and theirs in rows:
        print(f"  {label}: {rows[ours]:,.0f} / {rows[theirs]:,.0f} msg/s = {rows[ours] / rows[theirs]:.2f}x"
              + (f" (goal >= {goal:g}x)" if goal else ""))


def summary(rows: dict) -> None:
    print("ratios (issue 18's goals)")
    ratio(rows, "sdk producer", "huey enqueue", "batching producer / huey enqueue", 2)
    for log in ("on", "off"):
        ratio(rows, f"sdk send log {log}", f"requests log {log}", f"Client.send / requests loop, log {log}", 3)
        ratio(rows, f"bare log {log}", f"requests log {log}",
              f"bare http.client loop / requests loop, log {log} (the most any client reaches)", None)
    for count in (1, 2):
        ratio(rows, f"sdk drain {count}", f"huey drain {count}", f"Worker drain / huey drain, {count} process(es)", 2)
    if "sdk lateness" in rows:
        p50, p99, worst, early = rows["sdk lateness"]
        print(f"  Worker lateness: p50 {p50:.2f} (goal <= 1.5), p99 {p99:.2f} (<= 3), max {worst:.2f} (<= 10) ms, "
              f"early {early} (0)" + (f"; huey {rows['huey lateness'][0]:.0f} / {rows['huey lateness'][1]:.0f} / "
                                      f"{rows['huey lateness'][2]:.0f} ms" if "huey lateness" in rows else ""))
        print(f"  Worker lateness at {BUSY_RATE} due msg/s: p99 {rows['sdk lateness busy'][1]:.2f} ms (goal <= 10), "
              f"early {rows['sdk lateness busy'][3]} (0)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per throughput row")
    parser.add_argument("--worker-concurrency", type=int, default=None,
                        help="the SDK Worker's concurrency in its rows; default: the Worker's")
    parser.add_argument("--worker-batch", type=int, default=None,
                        help="the SDK Worker's batch (messages in hand) in its rows; default: the Worker's")
    parser.add_argument("--only", action="append", choices=("huey", "requests", "sdk"),
                        help="run only these sides (repeatable); all by default")
    args = parser.parse_args()
    sides = args.only or ["huey", "requests", "sdk"]
    servers = {"on": {"DELAYQUEUE_MESSAGE_LOG": "1"}, "off": {"DELAYQUEUE_MESSAGE_LOG": "0"}}
    rows = {}
    with stack(scanners=1, servers=servers) as (urls, env):
        env = dict(env, BENCH_HUEY_REDIS_URL=env["REDIS_URL"])
        if "huey" in sides:
            rows.update(huey_rows(env, args.messages))
        if "requests" in sides:
            rows.update(requests_rows(urls, env, args.messages))
        if "sdk" in sides:
            worker_options = {name: value for name, value in (("concurrency", args.worker_concurrency),
                                                              ("batch", args.worker_batch)) if value}
            rows.update(sdk_rows(urls, env, args.messages, worker_options))
    summary(rows)


if __name__ == "__main__":
    main()
