"""`delayqueue worker` (delayqueue_client/supervisor.py) as real processes against a real server and
scanner: a child killed with SIGKILL is replaced and every message is still acked exactly once; a
child that always crashes, or always exits 0 at once, is restarted with a growing delay; a child that
served its max tasks is replaced at once; SIGTERM drains (every message in hand handled and acked
once, the rest left ready); a second SIGTERM stops hard (the messages in hand given back, none acked)."""
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from delayqueue_client.worker import GIVEN_BACK
from tests.helpers import ROOT, scanner_env, wait_for
# The fixtures too: a real client, and a scanner that times out a killed child's messages and writes the history.
from tests.integration.test_sdk_worker import client, details, reasons, scanner  # noqa: F401

pytestmark = pytest.mark.process

READY, CONSUMING, ACKED = 2, 3, 4


class Supervised:
    def __init__(self, process: subprocess.Popen, output: Path, done: Path):
        self.process, self.output_path, self.done_path = process, output, done

    def output(self) -> str:
        return self.output_path.read_text()

    def started_pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"worker process \d+ started \(pid (\d+)\)", self.output())]

    def done(self) -> list[tuple[int, str]]:
        """(pid, msgId) of every handler that finished, in order."""
        if not self.done_path.exists():
            return []
        return [(int(pid), msg_id) for pid, msg_id in (line.split() for line in self.done_path.read_text().split("\n")
                                                       if line)]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout=timeout)


@contextmanager
def supervisor(url: str, tmp_path: Path, *args: str, **env: str):
    output, done = tmp_path / "output", tmp_path / "done"
    command = [sys.executable, "-m", "delayqueue_client.cli", "worker", "tests.sdk_worker_app", "--topics", "sup",
               *args]
    with open(output, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env=scanner_env(DELAYQUEUE_URL=url, SDK_APP_DONE=str(done), **env))
    supervised = Supervised(process, output, done)
    try:
        yield supervised
    finally:
        if process.poll() is None:  # a failed test: no process left behind
            for pid in supervised.started_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.kill()
            process.wait()


def acked_or_gone(client, msg_id: str) -> bool:
    """Acked, or ended so long ago that its body left Redis (acked_once then checks the history)."""
    message = client.get("sup", msg_id)
    return message is None or message.status == ACKED


def acked_once(msg_id: str) -> bool:
    return reasons("sup", msg_id).count("acked") == 1


def test_a_child_killed_with_sigkill_is_replaced_and_no_message_is_lost(client, sdk_server, scanner, tmp_path):
    client.set_topic_config("sup", ack_timeout_ms=1_000)  # a killed child's messages come back after 1 s
    ids = [f"k{i}" for i in range(16)]
    client.send_many([{"topic": "sup", "msg": "0.3", "msg_id": i} for i in ids])
    with supervisor(sdk_server, tmp_path, "--processes", "2", "--threads", "2") as sup:
        first_pid = wait_for(lambda: sup.done() and sup.done()[0][0], timeout=30, what="a message handled")
        os.kill(first_pid, signal.SIGKILL)  # mid-batch: it holds messages
        wait_for(lambda: len(sup.started_pids()) == 3, timeout=30, what="a child started in its place")
        wait_for(lambda: all(acked_or_gone(client, i) for i in ids), timeout=60, what="every message acked")
        sup.signal()
        assert sup.wait() == 0, sup.output()
    assert "crashed (killed by signal 9): restarting in 0.5 s" in sup.output()
    for msg_id in ids:
        wait_for(lambda: acked_once(msg_id), timeout=15, what=f"{msg_id} acked once in its history")
    assert {msg_id for _, msg_id in sup.done()} == set(ids)


CONCURRENCY = {"threads": ("--threads", "2"), "async": ("--async",)}


@pytest.mark.parametrize("flavour", CONCURRENCY)
def test_sigterm_drains_every_message_in_hand_and_none_is_acked_twice(client, sdk_server, scanner, tmp_path, flavour):
    ids = [f"s{i}" for i in range(12)]
    client.send_many([{"topic": "sup", "msg": "2", "msg_id": i} for i in ids])
    with supervisor(sdk_server, tmp_path, "--processes", "2", *CONCURRENCY[flavour]) as sup:
        wait_for(lambda: sum(client.get("sup", i).status == CONSUMING for i in ids) >= 4, timeout=30,
                 what="messages in hand")
        assert not sup.done()  # their handlers are still sleeping
        sup.signal()
        assert sup.wait() == 0, sup.output()
    # An acked message's body may already have left Redis (its retention): None is an ended one.
    statuses = {i: m.status if (m := client.get("sup", i)) else None for i in ids}
    assert set(statuses.values()) <= {READY, ACKED, None}, statuses  # nothing left consuming (in hand)
    ended = sorted(i for i, status in statuses.items() if status != READY)
    assert len(ended) >= 4 and sorted(msg_id for _, msg_id in sup.done()) == ended  # each handled once
    for msg_id in ended:
        wait_for(lambda: acked_once(msg_id), timeout=15, what=f"{msg_id} acked once in its history")
    assert "draining: SIGTERM to every worker process" in sup.output()


@pytest.mark.parametrize("flavour", CONCURRENCY)
def test_sigterm_to_the_supervisor_and_its_children_at_once_drains(client, sdk_server, scanner, tmp_path, flavour):
    """As systemd's stop does (KillMode=control-group): every process of the unit gets SIGTERM, and
    each child the supervisor's forward too. Two SIGTERMs at a child are still one drain."""
    ids = [f"u{i}" for i in range(4)]
    client.send_many([{"topic": "sup", "msg": "2", "msg_id": i} for i in ids])
    with supervisor(sdk_server, tmp_path, "--processes", "1", *CONCURRENCY[flavour]) as sup:
        wait_for(lambda: all(client.get("sup", i).status == CONSUMING for i in ids), timeout=30,
                 what="all four in hand")
        sup.signal()
        for pid in sup.started_pids():
            os.kill(pid, signal.SIGTERM)
        assert sup.wait() == 0, sup.output()
    assert sorted(msg_id for _, msg_id in sup.done()) == ids, sup.output()  # each finished, none abandoned
    for msg_id in ids:
        wait_for(lambda: acked_once(msg_id), timeout=15, what=f"{msg_id} acked once in its history")
    assert "stopping hard" not in sup.output()


@pytest.mark.parametrize("flavour", CONCURRENCY)
def test_a_second_sigterm_stops_hard_and_gives_back_the_messages_in_hand(client, sdk_server, scanner, tmp_path,
                                                                         flavour):
    ids = [f"h{i}" for i in range(4)]
    client.send_many([{"topic": "sup", "msg": "60", "msg_id": i} for i in ids])  # handlers that would run a minute
    with supervisor(sdk_server, tmp_path, "--processes", "1", *CONCURRENCY[flavour]) as sup:
        wait_for(lambda: all(client.get("sup", i).status == CONSUMING for i in ids), timeout=30,
                 what="all four in hand")
        sup.signal()
        wait_for(lambda: "draining" in sup.output(), timeout=10, what="the drain forwarded")
        sup.signal()
        assert sup.wait(timeout=30) == 0, sup.output()  # well before the handlers would have returned
    statuses = {i: client.get("sup", i).status for i in ids}
    assert set(statuses.values()) == {READY}, (statuses, sup.output())  # given back: delivered again, not lost
    assert not sup.done()
    for msg_id in ids:
        wait_for(lambda: ("nacked", GIVEN_BACK) in details("sup", msg_id), timeout=15, what=f"{msg_id} nacked")
        assert "acked" not in reasons("sup", msg_id)
    assert "stopping hard" in sup.output()


def test_a_child_whose_settle_loop_failed_exits_at_once_and_is_replaced(client, sdk_server, scanner, tmp_path):
    """The failed worker stopped hard: a thread handler still running must not keep its process."""
    client.send_many([{"topic": "sup", "msg": "0", "msg_id": "b0"}, {"topic": "sup", "msg": "60", "msg_id": "b1"}])
    with supervisor(sdk_server, tmp_path, "--processes", "1", "--threads", "2", SDK_APP_BREAK_SETTLE="1") as sup:
        wait_for(lambda: len(sup.started_pids()) == 2, timeout=30, what="the failed child replaced")  # not in 60 s
        assert "settle loop failed: KeyError" in sup.output() and "crashed (exit code 1)" in sup.output()
        sup.signal()
        wait_for(lambda: "draining" in sup.output(), timeout=10, what="the drain forwarded")
        sup.signal()
        assert sup.wait(timeout=30) == 0, sup.output()


def test_a_child_whose_handler_called_sys_exit_exits_at_once_and_is_replaced(client, sdk_server, scanner, tmp_path):
    """A handler's sys.exit() stops the worker hard and run() raises it: the handler thread it abandoned
    kept the child alive (the interpreter's exit waits for it), its slot never replaced."""
    client.send_many([{"topic": "sup", "msg": "60", "msg_id": "e0"}, {"topic": "sup", "msg": "exit", "msg_id": "e1"}])
    with supervisor(sdk_server, tmp_path, "--processes", "1", "--threads", "2") as sup:
        wait_for(lambda: len(sup.started_pids()) >= 2, timeout=30, what="the exited child replaced")  # not in 60 s
        assert "a handler ended the worker (SystemExit 3)" in sup.output()
        sup.signal()
        wait_for(lambda: "draining" in sup.output(), timeout=10, what="the drain forwarded")
        sup.signal()
        assert sup.wait(timeout=30) == 0, sup.output()


def test_a_child_that_served_its_max_tasks_exits_though_a_timed_out_handler_still_runs(client, sdk_server, scanner,
                                                                                      tmp_path):
    client.send("sup", "60", msg_id="stuck")  # past its handler_timeout, the handler thread runs on a minute
    with supervisor(sdk_server, tmp_path, "--processes", "1", "--threads", "2", "--max-tasks-per-child", "1",
                    SDK_APP_HANDLER_TIMEOUT="0.5") as sup:
        wait_for(lambda: len(sup.started_pids()) >= 2, timeout=30, what="the child replaced")  # not in 60 s
        sup.signal()
        assert sup.wait(timeout=30) == 0, sup.output()
    assert "handler thread(s) past their handler_timeout still run" in sup.output()


def test_children_of_a_supervisor_killed_with_sigkill_drain_and_exit(client, sdk_server, scanner, tmp_path):
    ids = [f"o{i}" for i in range(4)]
    client.send_many([{"topic": "sup", "msg": "1", "msg_id": i} for i in ids])
    with supervisor(sdk_server, tmp_path, "--processes", "2", "--threads", "2") as sup:
        wait_for(lambda: len(sup.started_pids()) == 2, timeout=30, what="two children")
        children = sup.started_pids()
        wait_for(lambda: sum(client.get("sup", i).status == CONSUMING for i in ids) >= 2, timeout=30,
                 what="messages in hand")
        sup.signal(signal.SIGKILL)
        sup.wait()

        def gone(pid: int) -> bool:  # exited: no process, or a zombie its new parent has not reaped
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True
        wait_for(lambda: all(gone(pid) for pid in children), timeout=30, what="the orphaned children to exit")
    # What they held was handled and acked (the drain), the rest left ready: none consuming, none lost.
    statuses = {i: m.status if (m := client.get("sup", i)) else None for i in ids}
    assert set(statuses.values()) <= {READY, ACKED, None}, statuses
    assert sorted(msg_id for _, msg_id in sup.done()) == sorted(i for i, s in statuses.items() if s != READY)
    assert sup.output().count("draining and exiting") == 2, sup.output()


# A child that always crashes, and one whose app's worker always returns at once: restarting either
# every turn would start processes in a busy loop.
ALWAYS = {"crashing": ({"SDK_APP_CRASH": "1"}, r"crashed \(exit code 1\)"),
          "exiting 0": ({"SDK_APP_RETURN_AT_ONCE": "1"}, r"exited \(code 0\) [\d.]+ s after its start")}


@pytest.mark.parametrize("how", ALWAYS)
def test_a_child_that_always_ends_at_once_is_restarted_with_a_growing_delay(sdk_server, tmp_path, how):
    env, ended = ALWAYS[how]
    with supervisor(sdk_server, tmp_path, "--processes", "1", **env) as sup:
        # Four children's starts (an interpreter and the SDK's imports each) and 3.5 s of delays:
        # under the full suite's load a start has taken several seconds.
        wait_for(lambda: sup.output().count("restarting in") >= 3, timeout=60,
                 what=lambda: f"three restarts; the supervisor's output:\n{sup.output()}")
        sup.signal()
        assert sup.wait() == 0, sup.output()
    delays = re.findall(ended + r": restarting in ([\d.]+) s", sup.output())
    assert delays[:3] == ["0.5", "1", "2"], sup.output()
    assert len(sup.started_pids()) <= 4, sup.output()
    if how == "crashing":
        assert "RuntimeError: this app cannot start" in sup.output()  # the child's traceback is shown


def test_a_child_that_served_its_max_tasks_is_replaced(client, sdk_server, scanner, tmp_path):
    ids = [f"m{i}" for i in range(7)]
    client.send_many([{"topic": "sup", "msg": "0", "msg_id": i} for i in ids])
    with supervisor(sdk_server, tmp_path, "--processes", "1", "--threads", "2", "--max-tasks-per-child", "3") as sup:
        wait_for(lambda: all(acked_or_gone(client, i) for i in ids), timeout=60, what="every message acked")
        sup.signal()
        assert sup.wait() == 0, sup.output()
    by_pid: dict[int, int] = {}
    for pid, _ in sup.done():
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert len(by_pid) >= 3 and max(by_pid.values()) <= 3, by_pid
    for msg_id in ids:
        wait_for(lambda: acked_once(msg_id), timeout=15, what=f"{msg_id} acked once in its history")
    assert "served its max tasks: starting another" in sup.output() and "restarting in" not in sup.output()


def test_an_app_that_cannot_be_found_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "delayqueue_client.cli", "worker", "tests.no_such_module"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot import tests.no_such_module" in done.stderr
    several = subprocess.run([sys.executable, "-m", "delayqueue_client.cli", "worker", "tests.sdk_worker_app:nope"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert several.returncode == 2 and "tests.sdk_worker_app has no attribute nope" in several.stderr


@pytest.mark.parametrize("app, args, problem", [
    ("app = App(Client())\n@app.task(topic='t')\ndef f(): pass\n", ["--async"],
     "worker(asynchronous=True) runs on an AsyncClient"),
    ("app = App(Client())\n", [], "no topic to serve: the app has no tasks yet")], ids=["async", "no tasks"])
def test_an_app_that_cannot_make_the_worker_asked_is_a_usage_error_before_any_child(tmp_path, app, args, problem):
    """Not N children failing at their start, restarted for ever."""
    (tmp_path / "dq_unusable_app.py").write_text("from delayqueue_client import App, Client\n" + app)
    done = subprocess.run([sys.executable, "-m", "delayqueue_client.cli", "worker", "dq_unusable_app", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.splitlines()[-1].startswith(
        f"delayqueue: error: dq_unusable_app cannot make a worker of these options: {problem}"), done.stderr
    assert "started" not in done.stderr and "Traceback" not in done.stderr
