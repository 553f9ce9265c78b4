"""delayqueue against its peers, as a Python user measures them (issues 18 and 30): BullMQ (Node),
huey and a hand-written requests loop, every side in one run on one machine and one Redis.

The bench starts its own stack (Redis, PostgreSQL, two delayqueue servers: message log on, the
default, and off; one scanner); BullMQ's and huey's keys live in the same Redis. Phases, each
with --messages messages (20,000 by default):

- enqueue: delayqueue's sequential `Client.send` and batching producer, to each server (BullMQ
  and huey keep nothing but Redis: the log-off rows are the like-for-like ones), and the task
  layer's `noop.delay_in()` and `noop.send_many()` (bench.tasks_app, log on); BullMQ's
  sequential `queue.add` and `addBulk` of 500; huey's normal call (it has no batch);
- drain of a due backlog of no-op tasks by 1, then 2 consumer processes: delayqueue's
  (`delayqueue worker bench.tasks_app --processes N --threads M`, --worker-threads threads a
  process), BullMQ's Worker (concurrency 50) in as many Node
  processes, huey's `huey_consumer` (its defaults);
- lateness (handler start - due time) of --due-rate messages due a second over --due-seconds,
  through one consumer process of each;
- the references for sequential sends without the SDK: a `requests.Session` loop and a bare
  `http.client` loop to each server.

A drain's clock starts when the backlog first shrinks (the consumers' start-up is not counted) and
stops when nothing is left. Drains and lateness use the log-on server. The end prints one
table of every row with delayqueue's ratios against BullMQ and huey from the same run. With
--rounds N the sides take turns N times and the table shows each row's median, after a table of
each round's drains (a drain of 20,000 lasts about a second, which one busy moment can halve).

    .venv/bin/python -m bench.python_queues [--messages 20000] [--due-rate 1000] [--due-seconds 5]
        [--only sdk|bullmq|huey|requests ...] [--worker-threads 8] [--rounds 1]

The BullMQ side needs Node.js and npm; it runs `npm ci` in bench/ when BullMQ is not installed.
"""
import argparse
import statistics

from bench.harness import stack
from bench.python_queues import bullmq_side, delayqueue_side, huey_side, requests_side
from bench.python_queues.common import Phases

PEERS = (bullmq_side.SIDE, huey_side.SIDE)
# (delayqueue's phase, the peers' phase, label, what each side runs, goal against BullMQ, against huey)
RATE_ROWS = (
    ("enqueue one", "enqueue one", "enqueue, one call at a time, msg/s", "Client.send / queue.add / normal call",
     None, None),
    ("enqueue one, log off", "enqueue one", "the same, delayqueue's message log off", "", None, None),
    ("enqueue batch", "enqueue batch", "enqueue, batched, msg/s",
     "producer / addBulk of 500 / normal call (huey has no batch)", None, 2),
    ("enqueue batch, log off", "enqueue batch", "the same, delayqueue's message log off", "", None, 2),
    ("enqueue task one", "enqueue one", "enqueue, one task at a time, msg/s", "noop.delay_in / queue.add / normal call",
     None, None),
    ("enqueue task batch", "enqueue batch", "enqueue, tasks batched, msg/s",
     "noop.send_many (the App's producer) / addBulk of 500 / normal call", None, 2),
    ("drain 1", "drain 1", "drain, 1 process, msg/s",
     "delayqueue worker / BullMQ Worker, concurrency 50 / huey_consumer",
     1.5, 3),
    ("drain 2", "drain 2", "drain, 2 processes, msg/s", "the same, 2 processes each", 1.5, 3),
)
LATENESS_P99_GOAL_MS = 5


def cell(rows: dict, phase: str, side: str, format_value) -> str:
    return format_value(rows[phase, side]) if (phase, side) in rows else "-"


def ratio_cell(rows: dict, phase: str, peer_phase: str, peer: str, goal: float | None,
               lower_is_better: bool = False) -> str:
    ours, theirs = rows.get((phase, delayqueue_side.SIDE)), rows.get((peer_phase, peer))
    if ours is None or theirs is None:
        return "-"
    if lower_is_better:  # lateness figures: the ratio of the p99s
        return f"p99 {ours[1] / theirs[1]:.3g}x"
    met = "" if goal is None else (" ✓" if ours / theirs >= goal else " ✗") + f" (goal ≥ {goal:g}x)"
    return f"{ours / theirs:.2f}x{met}"


def lateness_text(figures: tuple) -> str:
    p50, p99, worst, early = figures
    return f"{p50:.1f} / {p99:.1f} / {worst:.1f}" + (f", {early} early" if early else "")


def summary(rows: dict, phases: Phases) -> None:
    sides = (delayqueue_side.SIDE, *PEERS)
    print("\n| phase | sides run | delayqueue | BullMQ | huey | delayqueue / BullMQ | delayqueue / huey |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for phase, peer_phase, label, what, bullmq_goal, huey_goal in RATE_ROWS:
        values = " | ".join(cell(rows, phase if side == delayqueue_side.SIDE else peer_phase, side, "{:,.0f}".format)
                            for side in sides)
        print(f"| {label} | {what} | {values} | "
              f"{ratio_cell(rows, phase, peer_phase, bullmq_side.SIDE, bullmq_goal)} | "
              f"{ratio_cell(rows, phase, peer_phase, huey_side.SIDE, huey_goal)} |")
    values = " | ".join(cell(rows, "lateness", side, lateness_text) for side in sides)
    ratios = " | ".join(ratio_cell(rows, "lateness", "lateness", peer, None, lower_is_better=True) for peer in PEERS)
    met = ""
    if ("lateness", delayqueue_side.SIDE) in rows:
        met = " ✓" if rows["lateness", delayqueue_side.SIDE][1] <= LATENESS_P99_GOAL_MS else " ✗"
    print(f"| lateness p50 / p99 / max, ms, {phases.due_rate:,} due/s over {phases.due_seconds} s "
          f"(goal p99 ≤ {LATENESS_P99_GOAL_MS} ms{met}) | 1 consumer process each | {values} | {ratios} |")

    ours = rows.get(("enqueue task one", delayqueue_side.SIDE))
    theirs = rows.get(("enqueue one, beside tasks", delayqueue_side.SIDE))
    if ours and theirs:
        slower = (theirs / ours - 1) * 100
        print(f"\nThe task layer's cost: noop.delay_in {ours:,.0f} msg/s against Client.send of the same body "
              f"{theirs:,.0f} msg/s (in turns of {delayqueue_side.TURN}), {slower:+.1f}% time a send "
              f"(goal at most +10%: {'✓' if slower <= 10 else '✗'})")
    print("\n| sequential sends, one thread, msg/s | Client.send | requests loop | bare http.client loop "
          "| Client.send / requests loop |")
    print("|---|---:|---:|---:|---:|")
    for phase, log in (("enqueue one", "on"), ("enqueue one, log off", "off")):
        values = " | ".join(cell(rows, phase, side, "{:,.0f}".format)
                            for side in (delayqueue_side.SIDE, requests_side.REQUESTS, requests_side.BARE))
        ours, theirs = rows.get((phase, delayqueue_side.SIDE)), rows.get((phase, requests_side.REQUESTS))
        print(f"| message log {log} | {values} | {f'{ours / theirs:.2f}x' if ours and theirs else '-'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per enqueue and drain phase")
    parser.add_argument("--due-rate", type=int, default=1_000, help="the lateness phase's due messages a second")
    parser.add_argument("--due-seconds", type=int, default=5, help="how long the lateness phase's messages fall due")
    parser.add_argument("--worker-threads", type=int, default=8, help="delayqueue's handler threads per process")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every side this many times, taking turns; the table shows each row's median")
    parser.add_argument("--only", action="append", choices=("sdk", "bullmq", "huey", "requests"),
                        help="run only these sides (repeatable); all by default")
    args = parser.parse_args()
    sides = args.only or ["sdk", "bullmq", "huey", "requests"]
    phases = Phases(messages=args.messages, due_rate=args.due_rate, due_seconds=args.due_seconds)
    servers = {"on": {"DELAYQUEUE_MESSAGE_LOG": "1"}, "off": {"DELAYQUEUE_MESSAGE_LOG": "0"}}
    rounds = []
    with stack(scanners=1, servers=servers) as (urls, env):
        for number in range(1, args.rounds + 1):
            if args.rounds > 1:
                print(f"\n== round {number} of {args.rounds}", flush=True)
            rows = {}
            if "sdk" in sides:
                rows.update(delayqueue_side.rows(urls, env, phases, args.worker_threads))
            if "bullmq" in sides:
                rows.update(bullmq_side.rows(env, phases))
            if "huey" in sides:
                rows.update(huey_side.rows(env, phases))
            if "requests" in sides:
                rows.update(requests_side.rows(urls, env, phases))
            rounds.append(rows)
    if len(rounds) > 1:
        each_round(rounds)
    summary(medians(rounds), phases)


def medians(rounds: list[dict]) -> dict:
    """Each row's median over the rounds (a lateness row's, figure by figure): the sides took
    turns within each round, so a slow spell of the shared machine weighs on a round, not a side."""
    combined = {}
    for key in rounds[0]:
        values = [rows[key] for rows in rounds if key in rows]
        combined[key] = (tuple(statistics.median(figures) for figures in zip(*values))
                         if isinstance(values[0], tuple) else statistics.median(values))
    return combined


def each_round(rounds: list[dict]) -> None:
    """The drains' figures and ratios round by round, before their medians: their spread."""
    print("\n| round | " + " | ".join(f"{label}: delayqueue / BullMQ" for _, _, label, *_ in RATE_ROWS[-2:]) + " |")
    print("|---|" + "---|" * 2)
    for number, rows in enumerate(rounds, 1):
        cells = []
        for phase, peer_phase, *_ in RATE_ROWS[-2:]:
            ours, theirs = rows.get((phase, delayqueue_side.SIDE)), rows.get((peer_phase, bullmq_side.SIDE))
            cells.append(f"{ours:,.0f} / {theirs:,.0f} = {ours / theirs:.2f}x" if ours and theirs else "-")
        print(f"| {number} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
