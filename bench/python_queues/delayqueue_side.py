"""delayqueue's side, through the SDK (delayqueue_client): enqueue by the batching producer (its
defaults: linger 2 ms, batches of 500, 4 in flight) and by sequential `Client.send` to each server
(message log on, off); the drain of a due backlog of no-op tasks by one, then two consumer
processes; lateness through one consumer process (handler start - due). Messages are the tasks
of bench.tasks_app, run by `delayqueue worker bench.tasks_app`; the task layer's own rows send
the same tasks by `noop.send()` and `noop.send_many()` (through the App's producer)."""
import functools
import os
import random
import sys
import time
from pathlib import Path

import redis

from bench.harness import empty_redis
from bench.python_queues.common import (Phases, check_lead, lateness_figures, show_lateness, show_rate,
                                        start_processes, time_drain, wait_until_recorded)
from bench.tasks_app import LATENESS_KEY, noop, record_lateness
from delayqueue_client.envelope import Envelope, encode
from tools.stack import terminate

SIDE = "delayqueue"
FAR_DELAY_MS = 600_000  # sent messages never fall due during the run
TURN = 250  # sends a turn when the task layer's sends and plain sends alternate
# The consumers: the SDK's worker command on the bench's App (one supervisor, N processes).
CONSUMER = [str(Path(sys.executable).with_name("delayqueue")), "worker", "bench.tasks_app"]
# The body of a noop task, as the task layer sends it: the raw sends' payload.
NOOP_BODY = encode(Envelope(noop.name, [], {}))


def with_log(phase: str, log: str) -> str:
    """The phase's row for the server with the message log `log` (on: the phase's own row)."""
    return phase if log == "on" else f"{phase}, log off"


def start_consumers(topic: str, processes: int, threads: int, env: dict):
    """One command serving `topic` with `processes` processes of `threads` handler threads each."""
    return start_processes([*CONSUMER, "--topics", topic, "--processes", str(processes), "--threads", str(threads)],
                           1, env)


def unsettled(client, topic: str) -> int:
    """The topic's messages not yet acked: waiting, ready and being consumed (a drain is over at 0)."""
    info = client.topic_info(topic)
    return info["waitingQueueSize"] + info["readyQueueSize"] + info["ackQueueSize"]


def rows(urls: dict, env: dict, phases: Phases, threads: int) -> dict:
    try:
        from delayqueue_client import Client
    except ImportError:
        print("delayqueue's side: delayqueue_client not installed", flush=True)
        return {}
    measured = {}
    print(f"delayqueue (SDK; consumers: delayqueue {' '.join(CONSUMER[1:])}, {threads} threads a process)",
          flush=True)
    env = dict(env, DELAYQUEUE_URL=urls["on"])
    os.environ["DELAYQUEUE_URL"] = urls["on"]  # the bench's App (bench.tasks_app) sends to the log-on server
    clients = {log: Client(urls[log]) for log in ("on", "off")}
    client = clients["on"]
    try:
        for log, log_client in clients.items():
            empty_redis(env["REDIS_URL"])
            producer = log_client.producer(linger_ms=2, max_batch=500)
            for _ in range(phases.warm_up):
                producer.send("warm-up", NOOP_BODY, delay_ms=FAR_DELAY_MS)
            producer.flush()
            started = time.perf_counter()
            futures = [producer.send("producer", NOOP_BODY, delay_ms=FAR_DELAY_MS)
                       for _ in range(phases.messages)]
            producer.flush()
            rate = phases.messages / (time.perf_counter() - started)
            producer.close()
            assert len({future.result().msg_id for future in futures}) == phases.messages
            measured[with_log("enqueue batch", log), SIDE] = rate
            show_rate(f"enqueue, batching producer, log {log}", rate)

        for log, log_client in clients.items():
            empty_redis(env["REDIS_URL"])
            log_client.send("send", "warm-up", delay_ms=FAR_DELAY_MS)
            started = time.perf_counter()
            for _ in range(phases.messages):
                log_client.send("send", NOOP_BODY, delay_ms=FAR_DELAY_MS)
            rate = phases.messages / (time.perf_counter() - started)
            measured[with_log("enqueue one", log), SIDE] = rate
            show_rate(f"enqueue, sequential Client.send, log {log}", rate)

        # The task layer's cost: blocks of noop.delay_in() and of Client.send() of the same body take
        # turns, so the log's commit times (which vary over a run) weigh on both alike.
        empty_redis(env["REDIS_URL"])
        noop.delay_in(FAR_DELAY_MS / 1000)  # the App's client connected
        task_seconds = plain_seconds = 0.0
        for start in range(0, phases.messages, TURN):
            count = min(TURN, phases.messages - start)
            started = time.perf_counter()
            for _ in range(count):
                noop.delay_in(FAR_DELAY_MS / 1000)
            between = time.perf_counter()
            for _ in range(count):
                client.send(noop.topic, NOOP_BODY, delay_ms=FAR_DELAY_MS)
            task_seconds, plain_seconds = task_seconds + between - started, plain_seconds + time.perf_counter() - between
        measured["enqueue task one", SIDE] = rate = phases.messages / task_seconds
        measured["enqueue one, beside tasks", SIDE] = plain = phases.messages / plain_seconds
        show_rate("enqueue, sequential noop.delay_in (the task layer), log on", rate)
        show_rate("enqueue, sequential Client.send of the same body in turns with it, log on", plain)

        empty_redis(env["REDIS_URL"])
        noop.send_many([()] * phases.warm_up)  # untimed, as the producer's and huey's rows: the App's producer made
        started = time.perf_counter()
        handles = noop.send_many([()] * phases.messages)
        measured["enqueue task batch", SIDE] = rate = phases.messages / (time.perf_counter() - started)
        assert len({handle.msg_id for handle in handles}) == phases.messages, handles[:3]
        show_rate("enqueue, noop.send_many (the task layer, through the App's producer), log on", rate)

        for count in (1, 2):
            empty_redis(env["REDIS_URL"])
            topic = f"drain{count}"
            for start in range(0, phases.messages, 500):
                results = client.send_many([{"topic": topic, "msg": NOOP_BODY, "delay_ms": 0}
                                            for _ in range(start, min(start + 500, phases.messages))])
                assert not any(isinstance(result, Exception) for result in results), results

            procs = start_consumers(topic, count, threads, env)
            try:
                measured[f"drain {count}", SIDE] = time_drain(functools.partial(unsettled, client, topic),
                                                              phases.messages, procs)
            finally:
                terminate(procs)
            show_rate(f"drain of a due backlog, {count} consumer process(es)", measured[f"drain {count}", SIDE])

        empty_redis(env["REDIS_URL"])
        measured["lateness", SIDE] = consumer_lateness(client, env, phases, threads)
        show_lateness(f"lateness, {phases.due_rate:,} due/s over {phases.due_seconds} s, 1 consumer process",
                      measured["lateness", SIDE])
    finally:
        for each in clients.values():
            each.close()
    return measured


def consumer_lateness(client, env: dict, phases: Phases, threads: int) -> tuple:
    """Starts one consumer process, sends record_lateness tasks due uniformly over the phase's
    seconds after the lead, and answers the figures the tasks recorded."""
    recorded = redis.Redis.from_url(env["REDIS_URL"])
    procs = start_consumers("lateness", 1, threads, env)
    try:
        first_due_ms = (time.time() + phases.lead_s) * 1000
        producer = client.producer(linger_ms=2, max_batch=500)
        for _ in range(phases.due_messages):
            due_ms = int(first_due_ms + random.uniform(0, phases.due_seconds * 1000))
            producer.send("lateness", encode(Envelope(record_lateness.name, [due_ms], {})), trigger_time=due_ms)
        producer.close()
        check_lead(first_due_ms / 1000)
        wait_until_recorded(lambda: recorded.llen(LATENESS_KEY), phases.due_messages, procs,
                            phases.lead_s + phases.due_seconds + 60)
        return lateness_figures([float(v) for v in recorded.lrange(LATENESS_KEY, 0, -1)])
    finally:
        terminate(procs)
        recorded.close()
