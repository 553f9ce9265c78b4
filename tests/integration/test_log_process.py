"""run_scanners' log process (workers/log_process.py): the held topics' history and the
schedules' ticks come from a child process, which is started again when it dies and ends with
its scanner."""
import os
import signal

import pytest

from delayqueue.core.clock import now_millis
from delayqueue.core.schedules import tick_msg_id
from delayqueue.services.consume import ack_message, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.schedules import ScheduleSpec, create_schedule
from delayqueue.services.send import SendRequest, send_message
from tests.helpers import history, process_ended, query, wait_until

pytestmark = pytest.mark.process

LIFE = ["sent", "pulled", "acked"]


async def one_life(rt, topic: str) -> str:
    """Sends, pulls and acks a message of `topic`; its msgId."""
    sent = await send_message(rt, request=SendRequest(topic=topic, msg="x", delay_millis=0))
    async def pulled_one():
        return (await pull_messages(rt, topic=topic))[0]

    [pulled] = await wait_until(pulled_one, what=f"a message of {topic} to pull")
    assert pulled.msg_id == sent.msg_id
    await ack_message(rt, topic=topic, msg_id=sent.msg_id)
    return sent.msg_id


async def written(topic: str, msg_id: str) -> bool:
    return [row[0] for row in await history(topic, msg_id)] == LIFE


async def log_process_of(scanner, count: int = 1) -> int:
    """The pid of the scanner process' `count`-th log process, once it started."""
    async def started():
        pids = scanner.log_process_pids()
        return pids[count - 1] if len(pids) >= count else None

    return await wait_until(started, timeout=20, interval=0.05, what=f"log process {count} to start")


async def test_the_history_and_the_ticks_come_from_the_log_process_which_stops_with_its_scanner(single_rt,
                                                                                                scanner_process):
    rt = single_rt
    scanner = scanner_process("logs")
    scanner.wait_started()
    child = await log_process_of(scanner)
    msg_id = await one_life(rt, "lives")
    await wait_until(lambda: written("lives", msg_id), timeout=30, what="the message's history in the log")
    start = now_millis() + 3000
    await create_schedule(rt, spec=ScheduleSpec(schedule_id="s", topic="ticks", payload="tick", every_millis=1000,
                                                start_time=start))
    first = await wait_until(lambda: get_message(rt, topic="ticks", msg_id=tick_msg_id("s", start, 0)), timeout=30,
                             what="the schedule's first tick to be planned")
    assert first.trigger_time == start
    # Its 'sent' row names the scanner whose log process planned it, as the scanner's own rows do.
    [(process,)] = await query("SELECT process FROM delayqueue_messageevent WHERE msg_id = %s AND reason = 'sent'",
                               first.msg_id)
    assert process == "scanner logs"

    assert scanner.stop() == 0
    assert process_ended(child)
    assert "log process stopped: history rows written {'default': " in scanner.output()


async def test_a_killed_log_process_is_started_again_and_the_history_goes_on(single_rt, scanner_process):
    rt = single_rt
    scanner = scanner_process("restarts")
    scanner.wait_started()
    before = await one_life(rt, "lives")
    first = await log_process_of(scanner)
    await wait_until(lambda: written("lives", before), timeout=30, what="the first message's history")

    os.kill(first, signal.SIGKILL)
    second = await log_process_of(scanner, 2)
    assert second != first and process_ended(first)
    assert f"the log process {first} ended (exit code -9): starting it again" in scanner.output()
    after = await one_life(rt, "lives")
    await wait_until(lambda: written("lives", after), timeout=30, what="the history written by the new log process")
    assert scanner.stop() == 0


async def test_a_scanner_killed_takes_its_log_process_with_it(single_rt, scanner_process):
    scanner = scanner_process("killed")
    scanner.wait_started()
    child = await log_process_of(scanner)
    scanner.kill()
    scanner.proc.wait()

    async def ended():
        return process_ended(child)

    # It sees its parent gone only once started: its own start-up (Django's) took 5-9.5 s beside busy loops.
    await wait_until(ended, timeout=30, interval=0.05, what="the orphaned log process to end")
    assert "log process stopped" in scanner.output()  # it stopped, it did not crash
