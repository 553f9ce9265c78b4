"""Push delivery: how late the pushers POST due messages, what many push topics cost them, and
whether an endpoint that hangs delays another topic.

A local receiver, a process of its own (a bare asyncio protocol on uvloop: HTTP/1.1 keep-alive,
one request at a time per connection), notes each request's arrival (epoch ms, once the whole
request is read) and answers 200 at once; a path starting with /hang is never answered. Lateness
= arrival - the body's triggerTime. The pushers run inside the stack's `run_scanners` process.

    .venv/bin/python -m bench.push_delivery [--scenario rate|topics|hang] [--seconds N] [--control]
                                            [--rate 1000] [--topics 500]

rate:   one topic (default pushConcurrency 8), --rate messages due a second for --seconds
        (default 20), one every 1000/rate ms, the first due ~5 s after the sends are done.
        Goal: p50 <= 3 ms, p99 <= 15 ms, none early.
topics: --topics push topics (default 500), one message due a second on each, each topic at its
        own ms of the second, for --seconds (default 60). The run_scanners process' RSS and CPU
        idle (topics set, nothing due, 5 s), then every 5 s of the run. Goal: p99 <= 20 ms, flat.
hang:   topic "healthy" 200 due msg/s for --seconds (default 20); topic "stuck" (a /hang URL on
        the same receiver, pushTimeoutMillis 10000, pushConcurrency 8) 200 due msg/s over the
        second half. healthy's lateness in each half, side by side. --control: stuck answers
        like healthy, so the second half's rise from the added load alone is seen.

No --scenario: all three, each on a fresh stack. Internal: `--receiver PORT OUTFILE` runs the
receiver (it writes its records to OUTFILE on SIGTERM).
"""
import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from bench.harness import child_pid, cpu_seconds, percentile, stack

API = "/camellia/delayQueue/"
LEAD_MS = 5000  # the first message falls due this long after the sends are done
SEND_MS_PER_MESSAGE = 0.15  # a guess of the send time, to place the first due time before sending
BATCH = 500
DRAIN_SECONDS = 30  # after the last due time, how long to wait for what is still missing
SAMPLE_SECONDS = 5
IDLE_SECONDS = 5
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


# The receiver (its own process) ------------------------------------------------------------

class _Receiving(asyncio.Protocol):
    """One connection: requests one after another (no pipelining), each read to its
    Content-Length; (arrival ms, path, body) noted, 200 answered, except under /hang."""

    def __init__(self, records: list, counts: list):
        self.records = records
        self.counts = counts  # [answered, held open]
        self.buffer = bytearray()
        self.transport = None
        self.hung = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        now = time.time() * 1000
        if self.hung:  # nothing more is answered on a connection held open
            return
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end])
            length = 0
            at = head.lower().find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17:stop if stop >= 0 else len(head)])
            total = end + 4 + length
            if len(buffer) < total:
                return
            path = head.split(b" ", 2)[1]
            body = bytes(buffer[end + 4:total])
            del buffer[:total]
            if path == b"/stats":
                counts = b"%d %d" % tuple(self.counts)
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(counts), counts))
                continue
            self.records.append((now, path, body))
            if path.startswith(b"/hang"):
                self.counts[1] += 1
                self.hung = True
                return
            self.counts[0] += 1
            self.transport.write(OK)


def receiver_main(port: int, outfile: str) -> None:
    import gc

    import orjson
    import uvloop

    gc.disable()  # a short-lived process that makes no cycles worth a pause

    async def serve():
        records: list = []
        counts = [0, 0]
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        server = await loop.create_server(lambda: _Receiving(records, counts), "127.0.0.1", port, backlog=1024)
        await stopping.wait()
        server.close()
        rows = []
        for arrival, path, body in records:
            try:
                m = orjson.loads(body)
                rows.append([arrival, path.decode(), m.get("msgId"), m.get("topic"), m.get("triggerTime")])
            except (orjson.JSONDecodeError, AttributeError):
                rows.append([arrival, path.decode(), None, None, None])
        Path(outfile + ".tmp").write_bytes(orjson.dumps(rows))
        os.replace(outfile + ".tmp", outfile)

    uvloop.run(serve())


class Receiver:
    """The receiver process, started and read from the benchmark."""

    def __init__(self, folder: str):
        from tools.stack import ROOT, free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.outfile = os.path.join(folder, f"received-{self.port}.json")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.push_delivery", "--receiver", str(self.port),
                                      self.outfile], cwd=ROOT)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.count()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise SystemExit("the receiver did not start")
                time.sleep(0.05)

    def count(self) -> int:
        """Requests answered so far (those under /hang not counted)."""
        return int(urllib.request.urlopen(self.url + "/stats", timeout=5).read().split()[0])

    def wait_for(self, expected: int, deadline: float) -> None:
        while self.count() < expected and time.time() < deadline:
            time.sleep(0.2)

    def stop(self) -> list[list]:
        """[arrival ms, path, msgId, topic, triggerTime] per request."""
        import orjson

        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return orjson.loads(Path(self.outfile).read_bytes())


# The benchmark ------------------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def set_config(http, topic: str, **fields) -> None:
    reply = http.post("setTopicConfig", data={"topic": topic, **{k: str(v) for k, v in fields.items()}}).json()
    assert reply["code"] == 200, reply


def send(http, messages: list[dict]) -> None:
    for start in range(0, len(messages), BATCH):
        reply = http.post("sendMsgBatch", json=messages[start:start + BATCH]).json()
        assert reply["code"] == 200 and all(r["code"] == 200 for r in reply["results"]), reply


def first_due(messages: int) -> int:
    """The epoch ms to put the first due time at: LEAD_MS after the sends' guessed end."""
    return int(time.time() * 1000 + LEAD_MS + messages * SEND_MS_PER_MESSAGE)


def report_lead(due_ms: int) -> None:
    lead = due_ms / 1000 - time.time()
    print(f"  sends done {lead:.1f} s before the first due time" + ("  (SHORT: the sends overlap the run)"
                                                                   if lead < 1 else ""))


def sleep_until(epoch_seconds: float) -> None:
    time.sleep(max(0.0, epoch_seconds - time.time()))


def lateness(rows: list[list], topic: str | None = None, due_from: float = float("-inf"),
             due_to: float = float("inf")) -> tuple[list[float], int, int]:
    """(lateness of each message's first arrival, arrivals, duplicate arrivals) over the rows of
    `topic` (all answered paths when None) whose triggerTime is in [due_from, due_to)."""
    first: dict[str, float] = {}
    arrivals = duplicates = 0
    for arrival, path, msg_id, row_topic, trigger in rows:
        if path.startswith("/hang") or msg_id is None or (topic is not None and row_topic != topic):
            continue
        if not due_from <= trigger < due_to:
            continue
        arrivals += 1
        if msg_id in first:
            duplicates += 1
        else:
            first[msg_id] = arrival - trigger
    return list(first.values()), arrivals, duplicates


def figures_line(late: list[float]) -> str:
    if not late:
        return "nothing received"
    return (f"p50 {percentile(late, 50):.2f} ms   p99 {percentile(late, 99):.2f} ms   max {max(late):.2f} ms   "
            f"mean {sum(late) / len(late):.2f} ms")


def pusher_figures(env: dict) -> str:
    """The pushers' own counts from Redis (pushed, failed by status)."""
    import redis

    from delayqueue.live.keys import namespace_keys
    from delayqueue.live.push_counts import topic_figures

    time.sleep(1.5)  # each pusher adds its counts about once a second
    r = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    try:
        topics = topic_figures(r.hgetall(namespace_keys(env.get("DELAYQUEUE_NAMESPACE") or "default").pushes))
    finally:
        r.close()
    pushed = sum(f.pushed for f in topics.values())
    failed = sum((f.failures for f in topics.values()), Counter())
    return f"pusher's own counts (Redis): pushed {pushed}, failed {dict(failed) or 0}"


def scanner_log(pid: int) -> str | None:
    """The path of the run_scanners process' stderr (the stack's scanner log)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None


def report_log(path: str | None) -> None:
    """The scanner log's warnings and errors, if any (read while the stack still runs)."""
    if path is None or not os.path.exists(path):
        return
    lines = [line.rstrip() for line in open(path, errors="replace")
             if any(word in line for word in ("WARNING", "ERROR", "CRITICAL", "Traceback", "Error"))]
    print(f"  scanner log: {len(lines)} warning/error lines" + (":" if lines else ""))
    for line in lines[:10]:
        print("    " + line[:300])


def run_rate(http, env, folder: str, rate: int, seconds: int) -> None:
    receiver = Receiver(folder)
    try:
        set_config(http, "push-rate", pushUrl=receiver.url + "/push")
        time.sleep(1)  # the pushers' settings are read every 0.5 s
        count = rate * seconds
        due = first_due(count)
        step = 1000 / rate
        send(http, [{"topic": "push-rate", "msg": str(i), "triggerTime": due + int(i * step)} for i in range(count)])
        report_lead(due)
        last_due = due + int((count - 1) * step)
        sleep_until(last_due / 1000 + 0.5)
        receiver.wait_for(count, last_due / 1000 + DRAIN_SECONDS)
        log = scanner_log(child_pid("run_scanners"))
        counts = pusher_figures(env)
    finally:
        rows = receiver.stop()
    late, arrivals, duplicates = lateness(rows)
    print(f"push lateness, {rate} due msg/s for {seconds} s to one topic (pushConcurrency 8), "
          f"received - triggerTime:")
    print(f"  {figures_line(late)}   (goal p50 <= 3 ms, p99 <= 15 ms)")
    print(f"  received {len(late)} of {count} messages ({count - len(late)} missing), {duplicates} duplicates; "
          f"early (< 0): {sum(1 for x in late if x < 0)} (goal 0)")
    print("  " + counts)
    report_log(log)


def run_topics(http, env, folder: str, topics: int, seconds: int) -> None:
    receiver = Receiver(folder)
    try:
        names = [f"push-{i}" for i in range(topics)]
        for name in names:
            set_config(http, name, pushUrl=receiver.url + "/push")
        pid = child_pid("run_scanners")
        log = scanner_log(pid)
        time.sleep(6)  # past the pushers' settings read and one sweep of every push topic
        rss0, cpu0, t0 = rss_mib(pid), cpu_seconds(pid), time.monotonic()
        time.sleep(IDLE_SECONDS)
        idle_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) * 100
        idle_rss = rss_mib(pid)
        count = topics * seconds
        due = first_due(count)
        offsets = [i * 1000 // topics for i in range(topics)]
        send(http, [{"topic": names[i], "msg": str(s), "triggerTime": due + s * 1000 + offsets[i]}
                    for s in range(seconds) for i in range(topics)])
        report_lead(due)
        samples = []
        previous = None
        for k in range(seconds // SAMPLE_SECONDS + 1):
            sleep_until(due / 1000 + k * SAMPLE_SECONDS)
            now, cpu = time.monotonic(), cpu_seconds(pid)
            percent = (cpu - previous[1]) / (now - previous[0]) * 100 if previous else float("nan")
            samples.append((k * SAMPLE_SECONDS, rss_mib(pid), percent, receiver.count()))
            previous = (now, cpu)
        last_due = due + (seconds - 1) * 1000 + offsets[-1]
        receiver.wait_for(count, last_due / 1000 + DRAIN_SECONDS)
        counts = pusher_figures(env)
    finally:
        rows = receiver.stop()
    late, arrivals, duplicates = lateness(rows)
    print(f"{topics} push topics, one message due a second on each ({topics} msg/s), for {seconds} s:")
    print(f"  run_scanners process (scanner + pusher), idle with the {topics} push topics set and nothing due "
          f"({IDLE_SECONDS} s): RSS {rss0:.1f} -> {idle_rss:.1f} MiB, CPU {idle_cpu:.1f} % of a core")
    print("  during the run (t: seconds since the first due time):")
    print("       t   RSS MiB   CPU % of a core since the previous row   pushes answered so far")
    for t, rss, percent, pushes in samples:
        cpu = "-" if percent != percent else f"{percent:.1f}"
        print(f"    {t:4d}   {rss:7.1f}   {cpu:>38}   {pushes:22d}")
    print(f"  RSS growth, first to last sample: {samples[-1][1] - samples[0][1]:+.1f} MiB")
    print(f"  lateness: {figures_line(late)}   (goal p99 <= 20 ms)")
    print(f"  received {len(late)} of {count} messages ({count - len(late)} missing), {duplicates} duplicates; "
          f"early (< 0): {sum(1 for x in late if x < 0)}")
    print("  " + counts)
    report_log(log)


def run_hang(http, env, folder: str, seconds: int, control: bool = False) -> None:
    rate = 200
    receiver = Receiver(folder)
    try:
        set_config(http, "healthy", pushUrl=receiver.url + "/push")
        # The control run's "stuck" answers like healthy: the same load in the second half, no hang.
        set_config(http, "stuck", pushUrl=receiver.url + ("/push" if control else "/hang"), pushTimeoutMillis=10000,
                   pushConcurrency=8)
        time.sleep(1)
        half_ms = seconds * 1000 // 2
        step = 1000 / rate
        healthy = [{"topic": "healthy", "msg": str(i), "triggerTime": int(i * step)} for i in range(rate * seconds)]
        stuck = [{"topic": "stuck", "msg": str(i), "triggerTime": half_ms + int(i * step)}
                 for i in range(rate * seconds // 2)]
        due = first_due(len(healthy) + len(stuck))
        for m in healthy + stuck:
            m["triggerTime"] += due
        send(http, sorted(healthy + stuck, key=lambda m: m["triggerTime"]))
        report_lead(due)
        last_due = due + seconds * 1000
        sleep_until(last_due / 1000 + 0.5)
        receiver.wait_for(len(healthy), last_due / 1000 + DRAIN_SECONDS)  # stuck's are never answered
        log = scanner_log(child_pid("run_scanners"))
        counts = pusher_figures(env)  # before the receiver stops (stuck's retries then fail to connect)
    finally:
        rows = receiver.stop()
    first, _, dup1 = lateness(rows, "healthy", due, due + half_ms)
    second, _, dup2 = lateness(rows, "healthy", due + half_ms, due + seconds * 1000)
    hung = [row for row in rows if row[1].startswith("/hang")]
    stuck_is = "answering as healthy does (--control)" if control else "never answered"
    print(f"hang: topic healthy {rate} due msg/s for {seconds} s; topic stuck ({stuck_is}, pushTimeoutMillis "
          f"10000, pushConcurrency 8) {rate} due msg/s over the second half; healthy's lateness:")
    print(f"  first {seconds // 2} s, healthy alone:  {figures_line(first)}   ({len(first)} of {len(healthy) // 2}, "
          f"{dup1} duplicates)")
    print(f"  second {seconds // 2} s, with stuck:    {figures_line(second)}   "
          f"({len(second)} of {len(healthy) - len(healthy) // 2}, {dup2} duplicates)")
    if not control:
        print(f"  stuck: {len(hung)} requests reached the receiver (held open, never answered; at most 8 at once "
              f"until the first times out)")
    print("  " + counts)
    report_log(log)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--receiver":
        receiver_main(int(sys.argv[2]), sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("rate", "topics", "hang"), help="one scenario (default: all three)")
    parser.add_argument("--seconds", type=int, help="the run's length (default: rate 20, topics 60, hang 20)")
    parser.add_argument("--rate", type=int, default=1000, help="rate: due messages a second")
    parser.add_argument("--topics", type=int, default=500, help="topics: how many push topics")
    parser.add_argument("--control", action="store_true",
                        help="hang: topic stuck answers as healthy does (the second half's load without the hang)")
    args = parser.parse_args()
    import httpx

    os.environ["DELAYQUEUE_PUSH_ALLOWED_HOSTS"] = "127.0.0.1"
    scenarios = [args.scenario] if args.scenario else ["rate", "topics", "hang"]
    for i, scenario in enumerate(scenarios):
        if i:
            print()
        with tempfile.TemporaryDirectory(prefix="push-bench-") as folder, stack(scanners=1) as (urls, env), \
                httpx.Client(base_url=urls["main"] + API, timeout=60) as http:
            if scenario == "rate":
                run_rate(http, env, folder, args.rate, args.seconds or 20)
            elif scenario == "topics":
                run_topics(http, env, folder, args.topics, args.seconds or 60)
            else:
                run_hang(http, env, folder, args.seconds or 20, args.control)


if __name__ == "__main__":
    main()
