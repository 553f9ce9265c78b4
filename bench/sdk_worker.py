"""The delayqueue consumers bench.python_queues measures: the SDK's Worker serving the bench's two
tasks, sent as task envelopes ({"v": 1, "task": ..., "args": [...], "kwargs": {}, "headers": {}}),
with the options of `delayqueue worker`: `--processes` copies of one Worker with `--threads`
handler threads (none is restarted: a child that dies makes this command fail). SIGTERM drains
(each Worker finishes and acks what it holds).

    DELAYQUEUE_URL=http://... REDIS_URL=redis://... \\
        python -m bench.sdk_worker --topics TOPIC [--processes N] [--threads M]

The tasks: `noop()`, and `record_lateness(due_ms)`, which notes how late it started
(ms started - due_ms) for the Redis list LATENESS_KEY in REDIS_URL's Redis (bench.lateness_notes).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from bench.lateness_notes import LatenessNotes
from delayqueue_client import Client, Worker

NOOP, RECORD_LATENESS = "noop", "record_lateness"
LATENESS_KEY = "bench:delayqueue:lateness"


def envelope(task: str, *args) -> str:
    """The message body that runs `task(*args)`."""
    return json.dumps({"v": 1, "task": task, "args": list(args), "kwargs": {}, "headers": {}})


def serve(topic: str, threads: int) -> None:
    notes = LatenessNotes(LATENESS_KEY, os.environ["REDIS_URL"])

    def handle(message):
        task = json.loads(message.msg)
        if task["task"] == RECORD_LATENESS:
            notes.add(time.time() * 1000 - task["args"][0])

    with Client() as client:
        Worker(client, topic, handle, concurrency=threads).run()


def supervise(child_argv: list[str], processes: int) -> None:
    """Runs `processes` children, passes SIGTERM / SIGINT on, and fails if one dies unasked."""
    children = [subprocess.Popen(child_argv) for _ in range(processes)]
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in children:
        pid, status = os.wait()
        if not stopping:
            stop(signal.SIGTERM, None)
            raise SystemExit(f"a Worker process ({pid}) exited unasked, status {status}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", required=True, help="the topic to serve (one: the Worker serves one topic)")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--threads", type=int, default=8, help="the Worker's concurrency")
    args = parser.parse_args()
    if "," in args.topics:
        parser.error("--topics: the SDK's Worker serves one topic")
    if args.processes == 1:
        serve(args.topics, args.threads)
    else:
        supervise([sys.executable, "-m", "bench.sdk_worker", "--topics", args.topics, "--threads", str(args.threads)],
                  args.processes)


if __name__ == "__main__":
    main()
