"""The SDK's schedules against a real server (a uvicorn, and a scanner where ticks must fire):
every schedule method of Client and AsyncClient, the error classes of the server's 404, 409 and
400 answers, the task layer's sync_schedules (twice is one schedule; a changed declaration
updates it), one real tick of an everyMillis=1000 schedule pulled, and a scheduled task run by a
worker. tests/unit/test_sdk_schedules.py covers the same on the fake server."""
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from delayqueue_client import App, AsyncClient, BadRequest, Client, Conflict, NotFound, Schedule

from tests.helpers import wait_for

pytestmark = pytest.mark.process

CLI = [sys.executable, "-m", "delayqueue_client.cli"]


@pytest.fixture
def client(sdk_server):
    with Client(sdk_server) as c:
        yield c


def now_ms() -> int:
    return int(time.time() * 1000)


def test_every_schedule_method_round_trips(client):
    before = now_ms()
    made = client.create_schedule("sdk.beat", "sdk-t", "beat body", every=timedelta(minutes=1), priority=4,
                                  ttl=30, max_retry=2, catch_up="all")
    assert isinstance(made, Schedule)
    assert (made.schedule_id, made.topic, made.msg, made.cron, made.timezone, made.every_ms, made.every) == (
        "sdk.beat", "sdk-t", "beat body", None, None, 60_000, timedelta(minutes=1))
    assert (made.catch_up, made.priority, made.ttl_ms, made.max_retry, made.paused, made.end_time) == (
        "all", 4, 30_000, 2, False, None)
    # Without a start, an interval schedule first fires one interval after it was made.
    assert made.start_time == made.create_time + 60_000 and before <= made.create_time <= now_ms()
    assert list(made.next_fire_times) == [made.start_time + i * 60_000 for i in range(5)]
    assert made.update_time == made.create_time

    start = datetime(2031, 1, 6, 0, 0, tzinfo=timezone.utc)
    nightly = client.create_schedule("sdk:nightly", "sdk-reports", '{"kind": "nightly"}', cron="30 2 * * *",
                                     timezone="Europe/Berlin", start=start, end=start + timedelta(days=30))
    assert (nightly.cron, nightly.timezone, nightly.every_ms, nightly.catch_up, nightly.priority, nightly.ttl_ms,
            nightly.max_retry) == ("30 2 * * *", "Europe/Berlin", None, "latest", 0, 0, -1)
    assert (nightly.start_time, nightly.end_time) == (int(start.timestamp() * 1000),
                                                      int((start + timedelta(days=30)).timestamp() * 1000))
    first = datetime(2031, 1, 6, 1, 30, tzinfo=timezone.utc)  # 02:30 in Berlin (UTC+1 in January)
    assert list(nightly.next_fire_times) == [int((first + timedelta(days=i)).timestamp() * 1000) for i in range(5)]

    assert client.get_schedule("sdk.beat") == made
    paged = [client.list_schedules(limit=1), ]
    while paged[-1].next_cursor:
        paged.append(client.list_schedules(limit=1, cursor=paged[-1].next_cursor))
    assert [[s.schedule_id for s in page.schedules] for page in paged] == [["sdk.beat"], ["sdk:nightly"]]
    assert [s.schedule_id for s in client.list_schedules().schedules] == ["sdk.beat", "sdk:nightly"]
    assert client.list_schedules("sdk-reports").schedules == [nightly]
    assert client.list_schedules("nobody's").schedules == []

    changed = client.update_schedule("sdk.beat", every=120, msg="new body",
                                     end=datetime(2040, 1, 1, tzinfo=timezone.utc))
    assert (changed.every_ms, changed.msg, changed.start_time, changed.priority) == (
        120_000, "new body", made.start_time, 4)
    assert changed.end_time == int(datetime(2040, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    assert changed.update_time >= made.update_time
    assert client.update_schedule("sdk.beat", end=0).end_time is None  # 0: no end
    to_cron = client.update_schedule("sdk.beat", cron="*/5 * * * *")
    assert (to_cron.cron, to_cron.timezone, to_cron.every_ms) == ("*/5 * * * *", "UTC", None)
    back = client.update_schedule("sdk.beat", every=60)
    assert (back.cron, back.every_ms) == (None, 60_000)
    assert back.start_time >= changed.update_time + 60_000  # from a cron schedule: one interval from now

    paused = client.pause_schedule("sdk.beat")
    assert paused.paused and paused.next_fire_times == ()
    resumed = client.resume_schedule("sdk.beat")
    assert not resumed.paused and len(resumed.next_fire_times) == 5 and resumed.next_fire_times[0] > now_ms()

    assert client.delete_schedule("sdk.beat") is True
    assert client.get_schedule("sdk.beat") is None
    assert client.delete_schedule("sdk.beat") is False
    assert [s.schedule_id for s in client.list_schedules().schedules] == ["sdk:nightly"]


def test_the_async_client_has_the_same_methods(sdk_server):
    async def main():
        async with AsyncClient(sdk_server) as client:
            made = await client.create_schedule("async", "sdk-t", "x", cron="0 * * * *", paused=True)
            assert made.paused and made.next_fire_times == ()
            assert await client.get_schedule("async") == made
            assert (await client.list_schedules("sdk-t")).schedules == [made]
            assert (await client.update_schedule("async", priority=9)).priority == 9
            assert not (await client.resume_schedule("async")).paused
            assert (await client.pause_schedule("async")).paused
            assert await client.delete_schedule("async") is True
            with pytest.raises(NotFound):
                await client.resume_schedule("async")
    asyncio.run(main())


def error(action) -> tuple[str, int, str]:
    with pytest.raises(Exception) as caught:
        action()
    return type(caught.value).__name__, caught.value.code, caught.value.msg


def test_errors_raise_the_sdks_classes(client):
    client.create_schedule("dup", "sdk-t", "x", every=60)
    assert error(lambda: client.create_schedule("dup", "sdk-t", "y", every=60)) == (
        "Conflict", 409, "schedule 'dup' exists: updateSchedule changes it")
    for action in (lambda: client.update_schedule("missing", priority=1), lambda: client.pause_schedule("missing"),
                   lambda: client.resume_schedule("missing")):
        assert error(action) == ("NotFound", 404, "no schedule 'missing'")
    assert client.get_schedule("missing") is None and client.delete_schedule("missing") is False

    refused = {
        "bad id": lambda: client.create_schedule("no spaces", "t", "x", every=60),
        "neither": lambda: client.create_schedule("s", "t", "x"),
        "both": lambda: client.create_schedule("s", "t", "x", cron="* * * * *", every=60),
        "fields": lambda: client.create_schedule("s", "t", "x", cron="* * *"),
        "zone": lambda: client.create_schedule("s", "t", "x", cron="* * * * *", timezone="Mars/Olympus"),
        "never": lambda: client.create_schedule("s", "t", "x", cron="0 0 30 2 *"),
        "too often": lambda: client.create_schedule("s", "t", "x", every=0.5),
        "end first": lambda: client.create_schedule("s", "t", "x", every=60, start=2_000_000_000_000,
                                                   end=1_999_000_000_000),
        "nothing to change": lambda: client.update_schedule("dup"),
        "catch up": lambda: client.create_schedule("s", "t", "x", every=60, catch_up="some"),
    }
    texts = {name: error(action) for name, action in refused.items()}
    assert {name: (cls, code) for name, (cls, code, _) in texts.items()} == {
        name: ("BadRequest", 400) for name in refused}
    assert texts["bad id"][2] == "scheduleId: must be 1 to 128 letters, digits, '.', '_', ':' or '-'"
    assert texts["neither"][2] == texts["both"][2] == "cron: give either cron or everyMillis"
    assert texts["fields"][2] == "cron: needs 5 fields (minute hour day-of-month month day-of-week), got 3"
    assert texts["zone"][2] == "unknown time zone 'Mars/Olympus'"
    assert texts["never"][2] == "cron '0 0 30 2 *' never fires"
    assert texts["too often"][2].startswith("everyMillis must be at least 1000")
    assert [s.schedule_id for s in client.list_schedules().schedules] == ["dup"]  # nothing else was made
    with pytest.raises(BadRequest):
        client.list_schedules(limit=1001)


def test_a_scheduled_task_synced_twice_is_one_schedule_and_a_changed_declaration_updates_it(sdk_server, client):
    app = App(Client(sdk_server))

    @app.task(topic="sdk-tasks", name="reports.nightly", schedule="0 2 * * *", schedule_timezone="Europe/Berlin",
              priority=2)
    def nightly() -> None:
        pass

    @app.task(topic="sdk-tasks", name="reports.adhoc")
    def adhoc(report_id: int) -> None:
        pass

    assert app.sync_schedules() == {"task:reports.nightly": "created"}
    first = client.get_schedule("task:reports.nightly")
    assert app.sync_schedules() == {"task:reports.nightly": "unchanged"}
    assert client.list_schedules().schedules == [first]  # one schedule, untouched (same generation of ticks)
    assert json.loads(first.msg) == {"v": 1, "task": "reports.nightly", "args": [], "kwargs": {}, "headers": {}}
    assert (first.topic, first.cron, first.timezone, first.priority) == ("sdk-tasks", "0 2 * * *", "Europe/Berlin", 2)

    moved = App(Client(sdk_server))  # the next deploy: another rule

    @moved.task(topic="sdk-tasks", name="reports.nightly", schedule=timedelta(hours=6))
    def nightly_again() -> None:
        pass

    assert moved.sync_schedules() == {"task:reports.nightly": "updated"}
    now = client.get_schedule("task:reports.nightly")
    assert (now.cron, now.every_ms, now.priority, now.create_time) == (None, 6 * 3_600_000, 0, first.create_time)
    assert moved.sync_schedules(prune=True) == {"task:reports.nightly": "unchanged"}
    app.client.close()
    moved.client.close()


def test_an_every_second_schedule_ticks_into_a_message_pulled_within_seconds(sdk_server, scanner_process, client):
    scanner_process("sdk-schedules").wait_started()
    made = client.create_schedule("sdk.second", "sdk-ticks", "tick", every=1)
    pulled = wait_for(lambda: client.pull("sdk-ticks", batch=10), timeout=10, what="the first tick's message")
    tick = pulled[0]
    tick_time = int(tick.msg_id.removeprefix("sdk.second@"))
    assert tick.msg_id == f"sdk.second@{tick_time}" and tick.msg == "tick"
    assert (tick_time - made.start_time) % 1000 == 0 and tick_time >= made.start_time
    # Sent ahead, a tick is due at its time; sent after it (a planner behind on a busy machine), at
    # its send (docs/schedules.md).
    assert tick.trigger_time == tick_time or tick.trigger_time == tick.produce_time > tick_time
    assert now_ms() - tick_time < 6000  # pulled when due, not many seconds late (a loaded machine takes some)
    client.ack("sdk-ticks", tick.msg_id)
    assert client.delete_schedule("sdk.second")


def test_a_scheduled_task_runs_on_a_worker(sdk_server, scanner_process):
    scanner_process("sdk-schedule-task").wait_started()
    app = App(Client(sdk_server))
    ran = []

    @app.task(topic="sdk-beats", name="beats.second", schedule=1)
    def beat() -> None:
        ran.append(time.time())

    assert app.sync_schedules() == {"task:beats.second": "created"}

    def ran_once() -> bool:
        app.worker(wait_ms=200).run(burst=True, install_signal_handlers=False)
        return bool(ran)

    wait_for(ran_once, timeout=15, what="a tick run by the worker")
    app.client.delete_schedule("task:beats.second")
    app.client.close()


def test_the_command_line_creates_lists_and_deletes(sdk_server):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DELAYQUEUE_")}, "DELAYQUEUE_URL": sdk_server}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True, timeout=30)

    made = cli("schedule", "create", "cli.beat", "sdk-t", "hello", "--every", "5m", "--priority", "3")
    assert made.returncode == 0 and made.stdout.startswith("created schedule cli.beat on sdk-t: every 5m, next "), made
    shown = json.loads(cli("schedule", "get", "cli.beat", "--json").stdout)
    assert (shown["every_ms"], shown["priority"], shown["msg"]) == (300_000, 3, "hello")
    assert cli("schedule", "list").stdout.startswith("cli.beat\tsdk-t\tevery 5m\tnext ")
    refused = cli("schedule", "create", "cli.bad", "sdk-t", "x", "--cron", "61 * * * *")
    assert (refused.returncode, refused.stderr) == (1, "delayqueue: error: 400 cron: minute field: 61 is out of "
                                                       "range 0-59\n")
    assert cli("schedule", "delete", "cli.beat").stdout == "deleted schedule cli.beat\n"
    missing = cli("schedule", "get", "cli.beat")
    assert (missing.returncode, missing.stderr) == (1, "delayqueue: error: 404 no schedule 'cli.beat'\n")
