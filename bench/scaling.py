"""What one process of each kind carries per core: the CPU each part of the stack spends on a
message in each phase of its life, from one run, and so the messages a second one core of that
part keeps up with (docs/scaling.md turns these figures into a deployment).

Each round sends --messages no-op tasks (bench.tasks_app) to one topic and times three phases
apart, each with the CPU every part used from /proc, and each ending once the message log holds
its history:
- send: the SDK's batching producer (its defaults: batches of up to 500, 4 in flight) from the
  benchmark process, every message due --lead-ms after the first send, spread over --spread-ms;
- promote: from the first due time until every message is ready (the scanner promoting them as
  they fall due, about messages / spread a second);
- pull + ack: `delayqueue worker bench.tasks_app --processes 1 --threads 8` drains the topic;
- or, with --consumer-waits, promote + pull + ack: that worker is started before the first due
  time and pulls the messages as they fall due.
Parts: Redis, PostgreSQL (the message log), the web process (one uvicorn worker), the scanner
process (promotions and the log writer), the consumer (the worker process) and, for sends, the
benchmark process as the producer.

    .venv/bin/python -m bench.scaling [--messages 100000] [--rounds 2] [--lead-ms 30000] [--spread-ms 10000]
                                      [--consumer-waits]
"""
import argparse
import functools
import time

import redis

from bench.drain_cpu import PARTS, tasks_stack
from bench.harness import cpu_by_part, empty_redis, history_written
from bench.python_queues.common import time_drain
from bench.python_queues.delayqueue_side import NOOP_BODY, start_consumers, unsettled
from delayqueue_client import Client
from tools.stack import terminate

TOPIC = "scaling"
PRODUCER = "producer (this process)"
TOGETHER = "promote + pull + ack"


def used_since(before: dict[str, float], client_seconds: float = 0.0) -> dict[str, float]:
    """CPU seconds of each part since `before` (and the producer's, when given)."""
    after = cpu_by_part(PARTS)
    used = {part: after[part] - before[part] for part in after}
    if client_seconds:
        used[PRODUCER] = client_seconds
    return used


def one_round(client: Client, env: dict, messages: int, lead_ms: int, spread_ms: int,
              consumer_waits: bool = False) -> dict[str, dict[str, float]]:
    """CPU seconds per part of each phase."""
    empty_redis(env["REDIS_URL"])
    events = redis.Redis.from_url(env["REDIS_URL"])
    cpu = {}
    first_due = int(time.time() * 1000) + lead_ms
    before, own = cpu_by_part(PARTS), time.process_time()
    producer = client.producer()
    for i in range(messages):
        producer.send(TOPIC, NOOP_BODY, trigger_time=first_due + i * spread_ms // messages)
    producer.close()
    history_written(events)
    cpu["send"] = used_since(before, time.process_time() - own)
    if time.time() * 1000 >= first_due:
        raise SystemExit(f"the sends took longer than --lead-ms {lead_ms}: the phases overlap")

    if consumer_waits:
        return {**cpu, TOGETHER: consumed_as_due(client, env, messages, first_due, events)}
    before = cpu_by_part(PARTS)
    while time.time() * 1000 < first_due:
        time.sleep(0.01)
    while client.topic_info(TOPIC)["readyQueueSize"] < messages:
        time.sleep(0.05)
    history_written(events)
    cpu["promote"] = used_since(before)

    before = cpu_by_part(PARTS)
    procs = start_consumers(TOPIC, 1, 8, env)
    try:
        time_drain(functools.partial(unsettled, client, TOPIC), messages, procs)
        history_written(events)
        cpu["pull + ack"] = used_since(before)  # before the worker exits: its CPU is counted while it lives
    finally:
        terminate(procs)
        events.close()
    return cpu


def consumed_as_due(client: Client, env: dict, messages: int, first_due: int, events) -> dict[str, float]:
    """The worker, started before the first due time, pulls the messages as they fall due: the
    promotions and the pulls with their acks as one phase, from the first due time until the
    history is written. A pull that follows its promotion within milliseconds reaches the log
    writer in the same batch, so the message row is updated once for both."""
    procs = start_consumers(TOPIC, 1, 8, env)
    try:
        while time.time() * 1000 < first_due:
            time.sleep(0.01)
        before = cpu_by_part(PARTS)
        while unsettled(client, TOPIC):
            time.sleep(0.05)
        history_written(events)
        return used_since(before)  # before the worker exits: its CPU is counted while it lives
    finally:
        terminate(procs)
        events.close()


def show(cpu: dict[str, dict[str, float]], messages: int) -> None:
    phases = list(cpu)
    parts = list(dict.fromkeys(part for phase in cpu.values() for part in phase))
    print("| part | " + " | ".join(f"{phase}: µs a message (messages/s a core)" for phase in phases) + " |")
    print("|---|" + "---:|" * len(phases))
    for part in parts:
        cells = []
        for phase in phases:
            seconds = cpu[phase].get(part)
            micros = None if seconds is None else seconds / messages * 1e6
            cells.append("-" if micros is None else f"{micros:.1f} ({1e6 / micros:,.0f})" if micros >= 0.5
                         else f"{micros:.1f}")
        print(f"| {part} | " + " | ".join(cells) + " |")
    totals = [sum(cpu[phase].values()) / messages * 1e6 for phase in phases]
    print("| all parts | " + " | ".join(f"{total:.1f}" for total in totals) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lead-ms", type=int, default=30_000)
    parser.add_argument("--spread-ms", type=int, default=10_000)
    parser.add_argument("--consumer-waits", action="store_true",
                        help="start the worker before the first due time: it pulls the messages as they fall due, "
                             "and promotions, pulls and acks are one phase")
    args = parser.parse_args()
    with tasks_stack() as (client, env):
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number}: {args.messages:,} messages, due over {args.spread_ms / 1000:g} s "
                  f"({args.messages * 1000 // args.spread_ms:,} a second)", flush=True)
            show(one_round(client, env, args.messages, args.lead_ms, args.spread_ms, args.consumer_waits),
                 args.messages)


if __name__ == "__main__":
    main()
