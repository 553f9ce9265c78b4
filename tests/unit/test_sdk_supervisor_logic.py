"""The `delayqueue worker` supervisor's pure logic (no server): finding the App in MODULE[:attr],
a child's command line, the restart backoff of a crashing child."""
import argparse
import subprocess
import sys

import pytest
from delayqueue_client.cli import build_parser, main
from delayqueue_client.supervisor import (SERVED_MAX_TASKS, ChildOptions, Slot, Supervisor, UnusableApp, add_arguments,
                                          load_app, options_of)


def test_the_app_is_the_named_attribute_or_the_one_object_with_a_worker_method():
    from tests import sdk_worker_app
    assert load_app("tests.sdk_worker_app") is sdk_worker_app.app
    assert load_app("tests.sdk_worker_app:app") is sdk_worker_app.app
    with pytest.raises(UnusableApp, match="cannot import tests.nowhere"):
        load_app("tests.nowhere")
    with pytest.raises(UnusableApp, match="has no attribute nope"):
        load_app("tests.sdk_worker_app:nope")
    with pytest.raises(UnusableApp, match="is not an App"):
        load_app("tests.sdk_worker_app:handler")
    with pytest.raises(UnusableApp, match="found none"):
        load_app("tests.helpers")
    for spec in ("", ":app", ".relative"):  # importlib raised ValueError or TypeError: a traceback, not a usage error
        with pytest.raises(UnusableApp, match="not a module name"):
            load_app(spec)


def test_a_module_failing_at_import_is_one_line_saying_what_and_where(tmp_path, monkeypatch, capsys):
    (tmp_path / "dq_raising_app.py").write_text("import os\nos.environ['DQ_NO_SUCH_SETTING']\n")
    (tmp_path / "dq_unparsable_app.py").write_text("app = (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnusableApp) as raised:
        load_app("dq_raising_app")
    assert str(raised.value) == (f"cannot import dq_raising_app: KeyError: 'DQ_NO_SUCH_SETTING' "
                                 f"({tmp_path / 'dq_raising_app.py'}, line 2)")
    with pytest.raises(UnusableApp, match=r"^cannot import dq_unparsable_app: SyntaxError: .*\(dq_unparsable_app.py, "
                                          r"line 1\)$"):
        load_app("dq_unparsable_app")
    # One parsing its own arguments at import exits there: not an exit (0 here) of the command itself.
    (tmp_path / "dq_exiting_app.py").write_text("import sys\nsys.exit()\n")
    for command in (["worker", "dq_exiting_app"], ["schedule", "sync", "dq_exiting_app"]):
        with pytest.raises(SystemExit) as usage:
            main(command)
        assert usage.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: cannot import dq_exiting_app: SystemExit ({tmp_path / 'dq_exiting_app.py'}, line 2)")


def test_a_child_runs_the_same_options_in_its_own_interpreter():
    args = build_parser().parse_args(["worker", "my.tasks:app", "--topics", "a, b", "--processes", "3", "--async",
                                      "--max-tasks-per-child", "100"])
    options = options_of(args)
    assert options == ChildOptions("my.tasks:app", ["a", "b"], 8, True, 100)
    assert options.command() == [sys.executable, "-m", "delayqueue_client.supervisor", "my.tasks:app", "--async",
                                 "--tasks", "8", "--topics", "a,b", "--max-tasks-per-child", "100"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "m", "--threads", "2", "--async"])  # one or the other


@pytest.mark.parametrize("option", ["--processes", "--threads", "--tasks", "--max-tasks-per-child"])
def test_a_count_of_the_worker_command_that_is_no_whole_number_says_so(option, capsys):
    for text in ("0", "²"):  # "²" is a digit to str.isdigit, not to int(): argparse's generic "invalid value" then
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "m", "--async", option, text] if option == "--tasks" else
                                      ["worker", "m", option, text])
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"argument {option}: invalid count {text!r}: a whole number of at least 1")


@pytest.mark.parametrize("how", [["--threads", "3"], ["--async", "--tasks", "3"]])
def test_the_handlers_at_once_of_a_child_are_those_asked_threads_or_async_tasks(how):
    from tests import sdk_worker_app
    options = options_of(build_parser().parse_args(["worker", "tests.sdk_worker_app", *how]))
    child = argparse.ArgumentParser()
    add_arguments(child)
    worker = options_of(child.parse_args(options.command()[3:])).worker(sdk_worker_app.app)  # what the child runs
    assert (worker.concurrency, worker.is_async) == (3, "--async" in how)
    with pytest.raises(SystemExit) as usage:
        main(["worker", "tests.sdk_worker_app", "--tasks", "3"])  # without --async: threads are --threads
    assert usage.value.code == 2


def test_a_child_crashing_again_and_again_waits_longer_each_time_and_one_that_served_its_tasks_none():
    supervisor = Supervisor(ChildOptions("m", None, 8, False, None), 1)
    slot = Slot(0)
    delays = []
    for _ in range(8):
        slot.process = subprocess.Popen(["true"])
        slot.process.wait()
        supervisor._exited(slot, 1, slot.started_at + 1.0)  # crashed a second after its start
        delays.append(slot.restart_at - (slot.started_at + 1.0))
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30]
    slot.process = subprocess.Popen(["true"])
    slot.process.wait()
    supervisor._exited(slot, 1, slot.started_at + 60.0)  # it had run a while: the backoff starts over
    assert slot.restart_at == slot.started_at + 60.5
    slot.process = subprocess.Popen(["true"])
    slot.process.wait()
    supervisor._exited(slot, SERVED_MAX_TASKS, 5.0)  # exited by itself after its max tasks: replaced at once
    assert (slot.crashes, slot.restart_at) == (0, 5.0)

    def exits_0(started_at: float, at: float) -> tuple[int, float]:
        slot.started_at, slot.process = started_at, subprocess.Popen(["true"])
        slot.process.wait()
        supervisor._exited(slot, 0, at)
        return slot.crashes, slot.restart_at
    # Exit 0 soon after its start (a worker with nothing to do): the backoff of a crash, not a busy loop.
    assert exits_0(10.0, 10.1) == (1, 10.6)
    assert exits_0(10.6, 10.7) == (2, 11.7)
    assert exits_0(20.0, 60.0) == (0, 60.0)  # after a long life: replaced at once
