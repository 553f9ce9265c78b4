"""Helpers of the spark/ job tests: a standalone Spark cluster, the jobs' command lines, and small
message logs with known contents (times in epoch milliseconds)."""
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pyspark

from delayqueue.core.clock import from_millis, to_millis
from delayqueue.models import Message, MessageEvent
from spark import common
from tests.helpers import ROOT
from tools.stack import free_port, terminate, wait_for_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
LOCAL_IP = "127.0.0.1"


class StandaloneCluster:
    def __init__(self, base: Path, workers: int = 1):
        self.base = base
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": LOCAL_IP,
                    "SPARK_LOG_DIR": str(base), "PYSPARK_PYTHON": sys.executable}
        self.procs: list[subprocess.Popen] = []
        port, ui_port = free_port(), free_port()
        self.url = f"spark://{LOCAL_IP}:{port}"
        self.ui = f"http://{LOCAL_IP}:{ui_port}/json/"
        master = self._start("master", "org.apache.spark.deploy.master.Master",
                             "--host", LOCAL_IP, "--port", str(port), "--webui-port", str(ui_port))
        wait_for_port(port, master, "spark master", base / "master.log")
        for i in range(workers):
            work = base / f"worker-{i}"
            work.mkdir()
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", LOCAL_IP,
                        "--cores", "2", "--memory", "2g", "--work-dir", str(work),
                        "--webui-port", str(free_port()), self.url)
        self._wait_workers(workers)

    def _start(self, name: str, main_class: str, *args: str) -> subprocess.Popen:
        log = open(self.base / f"{name}.log", "wb")
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), main_class, *args], env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_workers(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.ui, timeout=2) as answer:
                    if json.load(answer).get("aliveworkers", 0) >= count:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the Spark standalone cluster did not get {count} workers within {timeout}s; logs in {self.base}")

    def stop(self) -> None:
        """Workers first (each stops its executors), then the master; then anything left in
        their process groups."""
        terminate(self.procs[:0:-1] + self.procs[:1])
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()


def job_args(module_name: str, *argv: str):
    """A job's options as its command line would parse them."""
    return common.parse_args(module_name, list(argv))[1]


def run_cli(module_name: str, *argv: str, env: dict | None = None, command: list[str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m spark.<job> ...` (or `command ...`) as a separate process."""
    return subprocess.run([*(command or [sys.executable, "-m", module_name]), *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=ROOT)


def ms(text: str) -> int:
    """'2026-11-20T10:00:00' (UTC) -> epoch milliseconds."""
    return to_millis(datetime.fromisoformat(text).replace(tzinfo=timezone.utc))


dt = from_millis




class LogBuilder:
    def __init__(self, namespace: str = "default"):
        self.namespace = namespace
        self.messages: list[Message] = []
        self.events: list[MessageEvent] = []
        self._seq = itertools.count()

    def message(self, topic: str, msg_id: str, produce: int, *, delay: int = 0, ttl: int = 3_600_000,
                max_retry: int = 3, retry: int = 0, status: int = 1, updated: int | None = None,
                payload: str | None = None, namespace: str | None = None) -> Message:
        message = Message(namespace=namespace or self.namespace, topic=topic, msg_id=msg_id,
                          payload=payload if payload is not None else f"body of {msg_id}",
                          produce_time=dt(produce), trigger_time=dt(produce + delay),
                          expire_time=dt(produce + delay + ttl), max_retry=max_retry, retry=retry,
                          status=status, updated_at=dt(updated if updated is not None else produce))
        self.messages.append(message)
        return message

    def event(self, topic: str, msg_id: str, at: int, from_status: int, to_status: int, reason: str,
              retry: int = 0, namespace: str | None = None) -> MessageEvent:
        event = MessageEvent(namespace=namespace or self.namespace, topic=topic, msg_id=msg_id,
                             event_id=f"{at}-{next(self._seq)}", at=dt(at), from_status=from_status,
                             to_status=to_status, retry=retry, reason=reason, process="test", host="test")
        self.events.append(event)
        return event

    def save(self, database: str = "default") -> "LogBuilder":
        Message.objects.using(database).bulk_create(self.messages, batch_size=2000)
        MessageEvent.objects.using(database).bulk_create(self.events, batch_size=2000)
        return self


H0 = ms("2026-11-20T10:00:00")
HOUR = 3_600_000


def stats_log() -> LogBuilder:
    """The log the stats job is checked on. orders, hour H0: 100 messages sent with a 60 s delay, message i ready i ms late;
    1-80 acked 70 s + 10·i ms after being sent; 81-85 nacked, redelivered, timed out, exhausted;
    86-90 timed out then out of TTL (ended 6); 91-95 expired undelivered; 96-100 deleted.
    o1 also has an earlier lifecycle in hour H0-1 (counted, but not in its latencies).
    mail, hour H0+1: 3 messages sent already due. Namespace `other`: one message, not counted."""
    log = LogBuilder()
    for i in range(1, 101):
        msg_id, produce = f"o{i}", H0 + i * 1000
        ready = produce + 60_000 + i
        status = 4 if i <= 80 else 6 if i <= 90 else 5 if i <= 95 else 7
        log.message("orders", msg_id, produce, delay=60_000, status=status)
        log.event("orders", msg_id, produce, 0, 1, "sent")
        log.event("orders", msg_id, ready, 1, 2, "due")
        if i <= 80:
            log.event("orders", msg_id, ready + 10, 2, 3, "pulled", 1)
            log.event("orders", msg_id, produce + 70_000 + 10 * i, 3, 4, "acked", 1)
        elif i <= 85:
            log.event("orders", msg_id, ready + 10, 2, 3, "pulled", 1)
            log.event("orders", msg_id, ready + 20, 3, 2, "nacked", 1)
            log.event("orders", msg_id, ready + 30, 2, 3, "pulled", 2)
            log.event("orders", msg_id, ready + 40, 3, 2, "ack_timeout", 2)
            log.event("orders", msg_id, ready + 50, 2, 6, "retries_exhausted", 2)
        elif i <= 90:
            log.event("orders", msg_id, ready + 10, 2, 3, "pulled", 1)
            log.event("orders", msg_id, ready + 20, 3, 2, "ack_timeout", 1)
            log.event("orders", msg_id, ready + 30, 2, 6, "expired", 1)
        elif i <= 95:
            log.event("orders", msg_id, ready + 10, 2, 5, "expired")
        else:
            log.event("orders", msg_id, ready + 10, 2, 7, "deleted")
    earlier = H0 - HOUR + 5000
    for offset, (from_status, to_status, reason) in enumerate([(0, 1, "sent"), (1, 2, "due"), (2, 3, "pulled"), (3, 4, "acked")]):
        log.event("orders", "o1", earlier + 1000 * offset, from_status, to_status, reason)
    for i in range(1, 4):
        log.message("mail", f"m{i}", H0 + HOUR + i * 1000, status=2)
        log.event("mail", f"m{i}", H0 + HOUR + i * 1000, 0, 2, "sent")
    log.message("orders", "x1", H0 + 500, namespace="other")
    log.event("orders", "x1", H0 + 500, 0, 1, "sent", namespace="other")
    return log.save()
