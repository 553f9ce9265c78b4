"""docs/sdk.md's Python examples, and the README's, run as written: each block is saved to a
file and run with DELAYQUEUE_URL naming a real server; the workers run until SIGTERM, as the
pages say. (The Django block runs in test_sdk_django, inside the project's Django and database.)"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from delayqueue_client import Client

from tests.helpers import ROOT, wait_for

pytestmark = pytest.mark.process

BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def example(marker: str, page: str = "docs/sdk.md") -> str:
    blocks = [b for b in BLOCK.findall((ROOT / page).read_text()) if marker in b]
    assert len(blocks) == 1, f"one example with {marker!r} in {page}, found {len(blocks)}"
    return blocks[0]


def start(code: str, url: str, tmp_path) -> subprocess.Popen:
    path = tmp_path / "example.py"
    path.write_text(code)
    env = {**os.environ, "DELAYQUEUE_URL": url, "PYTHONUNBUFFERED": "1"}
    env.pop("DELAYQUEUE_TOKEN", None)
    # The child keeps its own copies of the descriptors. Its output and its log apart: the worker
    # examples log from one handler's thread while another prints, and unbuffered, print's pieces
    # ("cancelled order", " 7") would interleave with a log line in one file.
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=env, stdout=out, stderr=err)
    proc.out, proc.err = tmp_path / "out.txt", tmp_path / "err.txt"
    return proc


def finished(proc: subprocess.Popen, timeout: float = 60) -> str:
    """What the example printed (its stdout)."""
    proc.wait(timeout=timeout)
    out = proc.out.read_text()
    assert proc.returncode == 0, out + proc.err.read_text()
    return out


def test_the_tasks_example_sends_runs_and_cancels_until_sigterm(sdk_server, tmp_path):
    proc = start(example('msg_id="welcome-9"'), sdk_server, tmp_path)
    with Client(sdk_server) as client:
        try:
            wait_for(lambda: (m := client.get("emails", "welcome-9")) and m.status == 4, timeout=30,
                     what="the example's tasks run")
        finally:
            proc.send_signal(signal.SIGTERM)
    first, rest = finished(proc, timeout=30).split("\n", 1)
    # The two runs print from two of the worker's threads at once: a line and its newline are two
    # writes, so one run's line may land before the other's newline.
    assert first.endswith(" ready waiting") and sorted(re.findall(r"welcome \d+ (?:pro|free)", rest)) == [
        "welcome 7 pro", "welcome 9 free"]
    assert rest.count("\n") == 2


def test_the_eager_example_runs_without_a_server(tmp_path):
    proc = start(example("App(eager=True)"), "http://127.0.0.1:9", tmp_path)
    assert finished(proc).strip() == "done 2"


def test_the_middleware_example_prints_its_send_and_counts_the_handling(sdk_server, tmp_path):
    lines = finished(start(example("class PrintSends(Middleware)"), sdk_server, tmp_path)).splitlines()
    assert lines[:2] == ["sent reports reports.build ok", "built 1"]
    assert lines[2] == str(['delayqueue_client_handled_total{outcome="ok",task="reports.build",topic="reports"} 1.0'])


def test_the_client_example_sends_and_polls(sdk_server, tmp_path):
    out = finished(start(example('msg_id="order-42-cancel"'), sdk_server, tmp_path))
    assert out.startswith("order-42-cancel ")
    with Client(sdk_server) as client:
        assert client.get("orders", "order-42-cancel").status == 1  # waiting its 30 minutes


def test_the_producer_example_stores_10000(sdk_server, tmp_path):
    assert finished(start(example("client.producer("), sdk_server, tmp_path)).strip() == "10000 stored"
    with Client(sdk_server) as client:
        assert client.topic_info("orders")["waitingQueueSize"] == 10_000


@pytest.mark.parametrize("marker,topic,expected", [
    ("cancel_order(order", "orders", "cancelled order 7"),
    ("await notify(", "notifications", "notified: hello"),
])
def test_the_worker_examples_handle_then_stop_on_sigterm(sdk_server, tmp_path, marker, topic, expected):
    with Client(sdk_server) as client:
        if topic == "orders":
            client.send(topic, json.dumps({"id": 7}), msg_id="good")
            client.send(topic, json.dumps({"no": "id"}), msg_id="bad")
        else:
            client.send(topic, "hello", msg_id="good")
        proc = start(example(marker), sdk_server, tmp_path)
        try:
            wait_for(lambda: client.get(topic, "good").status == 4, timeout=30, what="the example's ack")
            if topic == "orders":
                wait_for(lambda: client.get(topic, "bad").status == 6, timeout=30, what="the dead letter")
        finally:
            proc.send_signal(signal.SIGTERM)
        assert expected in finished(proc, timeout=30)


def test_the_readme_example_sends_then_its_worker_prints_the_message_when_due(sdk_server, tmp_path):
    proc = start(example("Worker(client, \"orders\"", page="README.md"), sdk_server, tmp_path)
    try:
        wait_for(lambda: "cancel order 42" in proc.out.read_text(), timeout=30, what="the message, 3 s later")
    finally:
        proc.send_signal(signal.SIGTERM)
    finished(proc, timeout=30)
    with Client(sdk_server) as client:
        info = client.topic_info("orders")
        assert info["waitingQueueSize"] + info["readyQueueSize"] + info["ackQueueSize"] == 0  # acked


def test_the_package_readme_example_sends_batches_and_pulls(sdk_server, tmp_path):
    out = finished(start(example("client.producer()", page="sdk/python/README.md"), sdk_server, tmp_path))
    assert out.splitlines() == ["1000 stored", "cancel order 42"]


def test_the_schedules_example_creates_changes_and_deletes(sdk_server, tmp_path):
    out = finished(start(example('client.create_schedule("reports.nightly"'), sdk_server, tmp_path))
    assert out.splitlines() == ["30 2 * * * Europe/Berlin 5 30000", "['heartbeat', 'reports.nightly'] True"]
    with Client(sdk_server) as client:
        assert client.list_schedules().schedules == []


def test_the_scheduled_tasks_example_syncs_once(sdk_server, tmp_path):
    out = finished(start(example('name="reports.weekly"'), sdk_server, tmp_path))
    assert out.splitlines() == [
        "{'task:reports.weekly': 'created', 'task:maintenance.sweep': 'created'}",
        "{'task:reports.weekly': 'unchanged', 'task:maintenance.sweep': 'unchanged'}",
        "task:reports.weekly 600000"]


def test_the_scheduled_task_example_on_the_fake_runs_three_ticks_without_a_server(tmp_path):
    out = finished(start(example("fake.clock.advance(timedelta(minutes=15))"), "http://127.0.0.1:9", tmp_path))
    assert out.splitlines() == ["{'task:maintenance.cleanup': 'created'}", "3 300000"]


def test_the_package_readme_schedules_example(sdk_server, tmp_path):
    out = finished(start(example('create_schedule("nightly-report"', page="sdk/python/README.md"), sdk_server,
                         tmp_path)).splitlines()
    assert out[0].endswith(" True") and int(out[0].split()[0]) > time.time() * 1000
    assert out[1:] == ["{'task:maintenance.sweep': 'created'}"]
