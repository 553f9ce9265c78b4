"""huey 3.5's side (bench/huey_app.py, on the bench's Redis): enqueue by a normal call from this
process; the drain of a due backlog of empty tasks by one, then two `huey_consumer` processes
(huey's defaults: one worker thread); lateness with one consumer (task start - eta; huey's
scheduler looks once a second)."""
import datetime
import os
import random
import sys
import time

from bench.python_queues.common import (Phases, check_lead, lateness_figures, show_lateness, show_rate,
                                        start_processes, time_drain, wait_until_recorded)
from tools.stack import terminate

SIDE = "huey"


def rows(env: dict, phases: Phases) -> dict:
    os.environ["BENCH_HUEY_REDIS_URL"] = env["REDIS_URL"]
    env = dict(env, BENCH_HUEY_REDIS_URL=env["REDIS_URL"])
    from bench import huey_app

    huey = huey_app.huey
    consumer = [sys.executable, "-m", "huey.bin.huey_consumer", "bench.huey_app.huey"]
    measured = {}
    print("huey", flush=True)
    for _ in range(phases.warm_up):
        huey_app.noop()
    huey.flush()
    started = time.perf_counter()
    for _ in range(phases.messages):
        huey_app.noop()
    # huey has no batch: its normal call is also the reference for delayqueue's producer
    measured["enqueue one", SIDE] = measured["enqueue batch", SIDE] = phases.messages / (time.perf_counter() - started)
    show_rate("enqueue, one producer, normal call", measured["enqueue one", SIDE])
    for count in (1, 2):
        if count > 1:  # the enqueue row left the first backlog
            for _ in range(phases.messages):
                huey_app.noop()
        procs = start_processes(consumer, count, env)
        try:
            measured[f"drain {count}", SIDE] = time_drain(huey.pending_count, phases.messages, procs)
        finally:
            terminate(procs)
        show_rate(f"drain of a due backlog, {count} consumer process(es)", measured[f"drain {count}", SIDE])

    procs = start_processes(consumer, 1, env)
    conn = huey.storage.conn
    try:
        conn.delete(huey_app.LATENESS_KEY)
        first_due = time.time() + phases.lead_s
        for _ in range(phases.due_messages):
            due = first_due + random.uniform(0, phases.due_seconds)
            huey_app.record_lateness.schedule(args=(due * 1000,),
                                              eta=datetime.datetime.fromtimestamp(due, tz=datetime.timezone.utc))
        check_lead(first_due)
        wait_until_recorded(lambda: conn.llen(huey_app.LATENESS_KEY), phases.due_messages, procs,
                            phases.lead_s + phases.due_seconds + 60)
    finally:
        terminate(procs)
    measured["lateness", SIDE] = lateness_figures([float(v) for v in conn.lrange(huey_app.LATENESS_KEY, 0, -1)])
    show_lateness(f"lateness, {phases.due_rate:,} due/s over {phases.due_seconds} s, 1 consumer",
                  measured["lateness", SIDE])
    huey.flush()
    return measured
