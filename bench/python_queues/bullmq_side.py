"""BullMQ's side (Node; bench/package.json pins the version, bullmq_peer.mjs drives it) on the
bench's Redis: enqueue by sequential `queue.add` and by `addBulk` of 500; the drain of a waiting
backlog of no-op jobs by one, then two Node processes each running a `Worker` of concurrency 50;
lateness of delayed jobs through one such Worker (handler start - due). Jobs are removed on
completion. `npm ci` runs in bench/ first when its node_modules lack BullMQ."""
import json
import shutil
import subprocess
from pathlib import Path

import redis

from bench.python_queues.common import (Phases, lateness_figures, show_lateness, show_rate, start_processes,
                                        time_drain)
from tools.stack import ROOT, terminate

SIDE = "bullmq"
NODE_PROJECT = ROOT / "bench"
SCRIPT = Path(__file__).with_name("bullmq_peer.mjs")


def node_command() -> list[str]:
    """`node SCRIPT`, after installing bench/package.json's modules if they are missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise SystemExit("the BullMQ side needs Node.js (20 or later) and npm on PATH: install them, "
                         "or leave BullMQ out (--only huey --only sdk ...)")
    if not (NODE_PROJECT / "node_modules" / "bullmq").is_dir():
        print("installing BullMQ: npm ci in bench/", flush=True)
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_PROJECT, check=True)
    return [node, str(SCRIPT)]


def run_node(node: list[str], env: dict, *args) -> dict:
    """Runs one measuring mode of the script and answers the JSON line it prints."""
    done = subprocess.run([*node, *map(str, args)], cwd=NODE_PROJECT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{SCRIPT.name} {' '.join(map(str, args))} exited with {done.returncode}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(env: dict, phases: Phases) -> dict:
    node = node_command()
    env = dict(env, BENCH_BULLMQ_REDIS_URL=env["REDIS_URL"])
    conn = redis.Redis.from_url(env["REDIS_URL"])
    measured = {}
    print("BullMQ", flush=True)
    try:
        rates = run_node(node, env, "enqueue", "enqueue", phases.messages)
        measured["enqueue one", SIDE], measured["enqueue batch", SIDE] = rates["add"], rates["addBulk"]
        show_rate("enqueue, sequential queue.add", rates["add"])
        show_rate("enqueue, addBulk of 500", rates["addBulk"])

        for count in (1, 2):
            queue = f"drain{count}"
            run_node(node, env, "fill", queue, phases.messages)

            def left(queue=queue):
                with conn.pipeline(transaction=False) as pipe:
                    pipe.llen(f"bull:{queue}:wait").llen(f"bull:{queue}:active").zcard(f"bull:{queue}:prioritized")
                    return sum(pipe.execute())

            procs = start_processes([*node, "worker", queue], count, env, cwd=NODE_PROJECT)
            try:
                measured[f"drain {count}", SIDE] = time_drain(left, phases.messages, procs)
            finally:
                terminate(procs)
            show_rate(f"drain of a waiting backlog, {count} Worker process(es)", measured[f"drain {count}", SIDE])

        answer = run_node(node, env, "lateness", "lateness", phases.due_rate, phases.due_seconds,
                          round(phases.lead_s * 1000))
        measured["lateness", SIDE] = lateness_figures(answer["lateness"])
        show_lateness(f"lateness, {phases.due_rate:,} due/s over {phases.due_seconds} s, 1 Worker process",
                      measured["lateness", SIDE])
    finally:
        conn.close()
    return measured
