"""Spark for the spark/ job tests: one SparkSession at a time for the whole run, first on
local[2], then on a standalone cluster (a master and two workers on localhost,
started from pyspark's own launch classes and stopped at the end). Each worker offers two
cores and each application takes at most two, so a spark-submit run can share the cluster
with the test session's own application.

Tests that use the `spark` fixture run on both; `@pytest.mark.parametrize("spark", ["local"],
indirect=True)` keeps a test on local mode. pytest groups the tests by the session's
parameter, so each session starts once.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pyspark
import pytest

from delayqueue.epoch import from_millis, to_millis
from tools.stack import free_port, terminate, wait_for_port
from spark import common

SPARK_HOME = Path(pyspark.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]
LOCAL_IP = "127.0.0.1"


class StandaloneCluster:
    def __init__(self, base: Path, workers: int = 2):
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


@pytest.fixture(scope="session", params=["local", "cluster"])
def spark(request, tmp_path_factory):
    """The SparkSession the jobs run on: local[2], or the standalone cluster."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its goodbye at exit, after pytest closed stderr
    from pyspark.sql import SparkSession

    cluster = None
    if request.param == "cluster":
        cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
        master = cluster.url
    else:
        master = "local[2]"
    builder = (SparkSession.builder.master(master).appName(f"delayqueue-tests-{request.param}")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.host", LOCAL_IP).config("spark.driver.bindAddress", LOCAL_IP)
               .config("spark.executor.memory", "512m").config("spark.cores.max", "2"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if cluster:
        cluster.stop()


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
