"""The PostgreSQL message log: durable sends, lifecycle history, faults of Postgres and the writer."""
import asyncio
import dataclasses
import json
import os
import re
import signal

import psycopg
import pytest

from delayqueue.core import exceptions
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Status
from delayqueue.core.exceptions import LogMaybeWritten, LogUnavailable, RedisUnavailable
from delayqueue.core.messages import Message
from delayqueue.live.history import Event
from delayqueue.live.keys import Shard
from delayqueue.live.shards import shard_of
from delayqueue.messagelog import sql
from delayqueue.messagelog.group_commit import MessageLog
from delayqueue.services import restore as restore_service
from delayqueue.services import send as send_service
from delayqueue.services.consume import (ack_message, ack_messages, long_poll_messages, nack_message, pull_messages,
                                         touch_message)
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topic_control import set_topic_config
from delayqueue.workers.log_writer import LogWriter
from tests.helpers import (API, REDIS_URL, as_logged, drain_log, history, log_database_url, logged, make_runtime, query,
                           wait_until)


async def test_a_send_is_committed_in_the_log_before_it_is_answered(api):
    reply = (await api.post(API + "sendMsg", data={"topic": "t", "msg": "hello", "delayMillis": 5000,
                                                   "ttlMillis": 60_000, "maxRetry": 3})).json()
    assert reply["code"] == 200
    message = reply["delayMsg"]
    # No log writer has run: the row is there because the send itself committed it.
    assert await logged("t", message["msgId"]) == as_logged(message)
    assert message["status"] == Status.WAITING and message["triggerTime"] == message["produceTime"] + 5000


async def test_every_transition_is_in_the_history_and_moves_the_message_row(single_rt, start_scanner):
    rt = single_rt
    m = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=400, max_retry=5))
    await start_scanner(rt)  # promotes it, requeues the ack timeout, and runs the log writer
    [m1] = await long_poll_messages(rt, topic="t", ack_timeout_millis=100, timeout_millis=5000)
    [m2] = await long_poll_messages(rt, topic="t", timeout_millis=5000)  # back after the ack timeout
    assert (await nack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.READY
    [m3], _ = await pull_messages(rt, topic="t")
    assert (await ack_message(rt, topic="t", msg_id=m.msg_id)).status == Status.ACKED
    assert (m1.retry, m2.retry, m3.retry) == (1, 2, 3)
    expected = [
        ("sent", 0, Status.WAITING, 0), ("due", Status.WAITING, Status.READY, 0), ("pulled", Status.READY, Status.CONSUMING, 1),
        ("ack_timeout", Status.CONSUMING, Status.READY, 1), ("pulled", Status.READY, Status.CONSUMING, 2), ("nacked", Status.CONSUMING, Status.READY, 2),
        ("pulled", Status.READY, Status.CONSUMING, 3), ("acked", Status.CONSUMING, Status.ACKED, 3),
    ]
    await wait_until(lambda: _equal(history("t", m.msg_id), expected), what="complete history")
    row = await logged("t", m.msg_id)
    assert (row["status"], row["retry"]) == (Status.ACKED, 3)
    [(process, host)] = await query(
        "SELECT DISTINCT process, host FROM delayqueue_messageevent WHERE reason = 'due'")
    assert process.startswith("scanner ") and host


async def _equal(coro, expected):
    return await coro == expected


async def test_ends_are_recorded_with_their_reason(single_rt):
    rt = single_rt
    deleted = await send_message(rt, request=SendRequest(topic="t", msg="d", delay_millis=0))
    # Due in a second, not 10 ms: a send that reaches Redis after its trigger time is stored ready,
    # which the log's write before it made happen on a loaded machine; this one must expire waiting.
    expired = await send_message(rt, request=SendRequest(topic="t", msg="e", delay_millis=1000, ttl_millis=30))
    exhausted = await send_message(rt, request=SendRequest(topic="u", msg="x", delay_millis=0, max_retry=0))
    assert await delete_message(rt, topic="t", msg_id=deleted.msg_id)
    [pulled], _ = await pull_messages(rt, topic="u")
    assert (await nack_message(rt, topic="u", msg_id=pulled.msg_id)).status == Status.EXHAUSTED
    await asyncio.sleep(1.1)  # past triggerTime + TTL, and no scanner has promoted it
    assert (await get_message(rt, topic="t", msg_id=expired.msg_id)).status == Status.EXPIRED
    await drain_log(rt, ["t", "u"])
    assert (await history("t", deleted.msg_id))[-1] == ("deleted", Status.READY, Status.DELETED, 0)
    assert (await history("t", expired.msg_id))[-1] == ("expired", Status.WAITING, Status.EXPIRED, 0)
    assert (await history("u", exhausted.msg_id))[-1] == ("retries_exhausted", Status.CONSUMING, Status.EXHAUSTED, 1)
    assert [(await logged(t, m.msg_id))["status"] for t, m in (("t", deleted), ("t", expired), ("u", exhausted))] \
        == [Status.DELETED, Status.EXPIRED, Status.EXHAUSTED]


async def test_a_duplicate_send_leaves_the_logged_message_alone(single_rt):
    rt = single_rt
    first = await send_message(rt, request=SendRequest(topic="t", msg="first", delay_millis=60_000, msg_id="dup"))
    again = await send_message(rt, request=SendRequest(topic="t", msg="second", delay_millis=0, msg_id="dup"))
    assert again == first
    assert await logged("t", "dup") == as_logged(first)
    assert await history("t", "dup") == [("sent", 0, Status.WAITING, 0)]  # the duplicate was no send


async def test_a_live_duplicate_only_redis_knew_takes_back_the_sent_row(single_rt):
    """The log lost sight of a live message (its row gone); Redis still holds it, so a send of the
    same msgId is a duplicate: the log gets Redis' message and no 'sent' row for the refused send."""
    rt = single_rt
    first = await send_message(rt, request=SendRequest(topic="t", msg="first", delay_millis=60_000, msg_id="d"))
    await query("DELETE FROM delayqueue_message WHERE msg_id = 'd'")
    await query("DELETE FROM delayqueue_messageevent WHERE msg_id = 'd'")
    again = await send_message(rt, request=SendRequest(topic="t", msg="second", delay_millis=0, msg_id="d"))
    assert again == first
    assert await logged("t", "d") == as_logged(first)
    assert await history("t", "d") == []


async def test_a_send_due_by_the_time_redis_took_it_is_logged_ready(single_rt, monkeypatch):
    """The web process's clock said 'not yet due'; Redis' clock said due: Redis decides, for the
    row and for its 'sent' history row."""
    rt = single_rt
    behind = now_millis() - 50
    monkeypatch.setattr(send_service, "now_millis", lambda: behind)
    m = await send_message(rt, request=SendRequest(topic="t", msg="late", delay_millis=10, msg_id="late"))
    assert m.status == Status.READY
    assert (await logged("t", "late"))["status"] == Status.READY
    assert await history("t", "late") == [("sent", 0, Status.READY, 0)]


def _consume_before_the_correction(rt, monkeypatch) -> None:
    """A send's log correction (MessageLog.overwrite) commits only after a consumer pulled and acked
    the message on topic t and the log writer recorded both."""
    correct = MessageLog.overwrite

    async def consumed_first(log, rows, started_us):
        [pulled], _ = await pull_messages(rt, topic="t")
        await ack_message(rt, topic="t", msg_id=pulled.msg_id)
        await drain_log(rt, ["t"])
        await correct(log, rows, started_us)

    monkeypatch.setattr(MessageLog, "overwrite", consumed_first)


async def test_a_status_correction_that_commits_after_the_writer_moved_the_row_leaves_it_moved(single_rt,
                                                                                               monkeypatch):
    """The correction of a send Redis took as ready (its status when sent) commits after the
    writer recorded the message's pull and ack: the row keeps its last state, acked, or a restore
    brings the acked message back."""
    rt = single_rt
    behind = now_millis() - 50
    monkeypatch.setattr(send_service, "now_millis", lambda: behind)
    _consume_before_the_correction(rt, monkeypatch)
    await send_message(rt, request=SendRequest(topic="t", msg="late", delay_millis=10, msg_id="late"))
    row = await logged("t", "late")
    assert (row["status"], row["retry"]) == (Status.ACKED, 1)
    await rt.redis.flushall()  # Redis lost its data: only the row says the message ended
    assert (await restore(rt)).restored == 0


async def test_a_correction_that_moves_the_row_to_a_new_life_keeps_the_events_the_writer_recorded_first(
        single_rt, monkeypatch):
    """A resend right after a delete with release starts a new life that only Redis knew of (the
    log's row was the old life, live): the correction moves the row to it. The writer recorded the
    new life's pull and ack before that correction committed, while the row was still the old life's;
    the row must end acked all the same, or a restore brings the acked message back."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 60_000, "again"))
    assert await delete_message(rt, topic="t", msg_id="again", release=True)
    _consume_before_the_correction(rt, monkeypatch)
    second = await send_message(rt, request=SendRequest("t", "second", 0, "again"))
    row = await logged("t", "again")
    assert (row["msg"], row["produceTime"], row["status"], row["retry"]) == (
        "second", second.produce_time, Status.ACKED, 1)
    await rt.redis.flushall()  # Redis lost its data: only the row says the message ended
    assert (await restore(rt)).restored == 0


async def _nacked_with_a_delay(rt) -> None:
    await pull_messages(rt, topic="t")
    await nack_message(rt, topic="t", msg_id="again", delay_millis=60_000)


async def _rescheduled(rt) -> None:
    await reschedule_message(rt, topic="t", msg_id="again", delay_millis=120_000)


@pytest.mark.parametrize("change, delay", [(_nacked_with_a_delay, 0), (_rescheduled, 60_000)])
async def test_a_correction_to_a_new_life_takes_the_times_the_writer_recorded_of_it_first(
        single_rt, monkeypatch, change, delay):
    """The new life (a resend after a delete with release) is nacked with a delay, or rescheduled, and
    the writer records it before the send's correction commits: the row must take the new times, not
    the send's, or a restore after Redis lost its data delivers the message a minute early."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 60_000, "again"))
    assert await delete_message(rt, topic="t", msg_id="again", release=True)
    correct = MessageLog.overwrite

    async def changed_first(log, rows, started_us):
        await change(rt)
        await drain_log(rt, ["t"])
        await correct(log, rows, started_us)

    monkeypatch.setattr(MessageLog, "overwrite", changed_first)
    second = await send_message(rt, request=SendRequest("t", "second", delay, "again"))
    changed = await get_message(rt, topic="t", msg_id="again")
    assert changed.trigger_time > second.trigger_time + 50_000
    row = await logged("t", "again")
    assert (row["produceTime"], row["status"], row["triggerTime"], row["expireTime"]) == (
        second.produce_time, Status.WAITING, changed.trigger_time, changed.expire_time)
    await rt.redis.flushall()  # Redis lost its data: the row's times are what a restore puts back
    assert (await restore(rt)).restored == 1
    assert (await get_message(rt, topic="t", msg_id="again")).trigger_time == changed.trigger_time


async def test_a_correction_that_takes_the_row_while_the_writer_records_the_new_life_loses_none_of_it(
        single_rt, monkeypatch):
    """The writer's transaction recording a resend's new life (its pull and ack, after the old life's
    delete with release) overlaps the send's correction, which takes the row first. The row must end
    acked all the same: left ready, a restore after Redis dropped the acked body brings it back."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 60_000, "again"))
    assert await delete_message(rt, topic="t", msg_id="again", release=True)
    correct = MessageLog.overwrite

    async def overlapped(log, rows, started_us):
        await pull_messages(rt, topic="t")
        await ack_message(rt, topic="t", msg_id="again")
        # Another transaction holds the row: the correction waits for it first, then the writer.
        async with await psycopg.AsyncConnection.connect(log_database_url()) as holder:
            await holder.execute("SELECT FROM delayqueue_message WHERE msg_id = 'again' FOR UPDATE")
            correction = asyncio.ensure_future(correct(log, rows, started_us))
            await wait_until(lambda: _waiting_for_locks(1), what="the correction waiting")
            writing = asyncio.ensure_future(drain_log(rt, ["t"]))
            await wait_until(lambda: _waiting_for_locks(2), what="the writer waiting")
        await asyncio.gather(correction, writing)

    monkeypatch.setattr(MessageLog, "overwrite", overlapped)
    second = await send_message(rt, request=SendRequest("t", "second", 0, "again"))
    row = await logged("t", "again")
    assert (row["msg"], row["produceTime"], row["status"], row["retry"]) == (
        "second", second.produce_time, Status.ACKED, 1)


async def test_a_correction_after_a_reshard_keeps_the_new_lifes_events_recorded_before_the_old_lifes_end(
        single_rt, monkeypatch):
    """The topic's shard count changed between a message's send and its delete with release: a resend's
    new life goes to the new count's shard, whose stream the writer may record first (another scanner's,
    or the old one's backlog). The correction then finds the row still the old life's, live; it must
    take the new life's events all the same: left ready, a restore after Redis dropped the acked body
    brings it back (the old life's late delete is no longer the row's). The first send's web process
    has a clock ahead of Redis': the row's time, its produceTime, is later than the new life's events."""
    rt = single_rt
    msg_id = next(f"again-{n}" for n in range(100) if shard_of("t", f"again-{n}", 3).index == 1)
    ahead = now_millis() + 2000
    with monkeypatch.context() as clock:
        clock.setattr(send_service, "now_millis", lambda: ahead)
        await send_message(rt, request=SendRequest("t", "first", 60_000, msg_id))
    await set_topic_config(rt, topic="t", changes={"shards": 3}, limits={})
    assert await delete_message(rt, topic="t", msg_id=msg_id, release=True)
    correct = MessageLog.overwrite

    async def new_count_first(log, rows, started_us):
        await pull_messages(rt, topic="t")
        await ack_message(rt, topic="t", msg_id=msg_id)
        await drain_log(rt, [Shard("t", 3, 1)])
        await correct(log, rows, started_us)

    monkeypatch.setattr(MessageLog, "overwrite", new_count_first)
    second = await send_message(rt, request=SendRequest("t", "second", 0, msg_id))
    await drain_log(rt, ["t"])
    row = await logged("t", msg_id)
    assert (row["msg"], row["produceTime"], row["status"], row["retry"]) == (
        "second", second.produce_time, Status.ACKED, 1)


@pytest.mark.parametrize("dedupe_window, before_its_script", [(86_400_000, False), (0, False), (0, True)])
async def test_a_late_correction_to_a_new_life_leaves_a_later_life_in_the_log(clean_state, monkeypatch, dedupe_window,
                                                                               before_its_script):
    """A resend after a delete with release starts a second life that only Redis knew of; its correction
    (moving the row to it) is late. Meanwhile that life is deleted with release too and a third send starts
    a third life, answered sent, which the log holds (through its own correction, or, with no dedupe window
    and the writer caught up, its record). The late correction, committed after the third's answer or
    between its record and its script, must leave the row the third life's: a restore after Redis lost its
    data would not bring it back."""
    rt = make_runtime(REDIS_URL, dedupe_window_millis=dedupe_window)
    try:
        await send_message(rt, request=SendRequest("t", "first", 60_000, "again"))
        assert await delete_message(rt, topic="t", msg_id="again", release=True)
        correct, run_sends = MessageLog.overwrite, send_service.run_sends
        third = []

        async def late(log, rows, started_us):
            monkeypatch.setattr(MessageLog, "overwrite", correct)  # the third's correction is not late
            assert await delete_message(rt, topic="t", msg_id="again", release=True)
            if not dedupe_window:  # the writer caught up: the third's record replaces the ended row
                await drain_log(rt, ["t"])
            later = rows[0].produce_time + 5  # a life of its own, whatever the clock's resolution
            with monkeypatch.context() as patched:
                patched.setattr(send_service, "now_millis", lambda: later)
                if before_its_script:
                    async def corrected_first(*args):
                        await correct(log, rows, started_us)
                        return await run_sends(*args)

                    patched.setattr(send_service, "run_sends", corrected_first)
                third.append(await send_message(rt, request=SendRequest("t", "third", 60_000, "again")))
            if not before_its_script:
                await correct(log, rows, started_us)

        monkeypatch.setattr(MessageLog, "overwrite", late)
        await send_message(rt, request=SendRequest("t", "second", 60_000, "again"))
        [third] = third
        assert third.payload == "third"
        assert await logged("t", "again") == as_logged(third)
        await rt.redis.flushall()  # Redis lost its data: the log is what a restore brings back
        assert (await restore(rt)).restored == 1
        assert (await get_message(rt, topic="t", msg_id="again")).payload == "third"
    finally:
        await rt.close()


async def test_a_correction_to_a_new_life_takes_no_change_of_the_old_life_for_the_new_lifes(single_rt):
    """The old life, pulled and then touched (the writer recorded both, the pull moving the row, the
    touch nothing), is deleted with release, and a resend starts a new life before the writer
    records the delete: the row moved to it says the send's waiting, not the old life's consuming
    (a restore would deliver it at once)."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 0, "again"))
    await pull_messages(rt, topic="t")
    await touch_message(rt, topic="t", msg_id="again", ack_timeout_millis=60_000)
    await drain_log(rt, ["t"])
    assert await delete_message(rt, topic="t", msg_id="again", release=True)
    second = await send_message(rt, request=SendRequest("t", "second", 60_000, "again"))
    assert await logged("t", "again") == as_logged(second)


async def test_a_correction_to_a_new_life_takes_no_change_of_the_old_life_redis_made_in_the_same_ms(single_rt):
    """The old life's last changes (pulled, nacked, pulled again) fell in one ms of Redis' clock, so two
    of its history rows went into consuming at the row's updated_at. The old life is deleted with
    release and a resend starts a new life, waiting a minute, before the writer records the delete:
    the row moved to it says the send's waiting, retry 0, not the old life's consuming, retry 2 (a
    restore would deliver it at once)."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 0, "again"))
    await pull_messages(rt, topic="t")
    await nack_message(rt, topic="t", msg_id="again", delay_millis=0)
    await pull_messages(rt, topic="t")
    await drain_log(rt, ["t"])
    # Redis did all three in the ms of the last (the row's updated_at): as many scripts run in one.
    await query("UPDATE delayqueue_messageevent e SET at = m.updated_at FROM delayqueue_message m"
                " WHERE e.msg_id = 'again' AND m.msg_id = 'again' AND e.reason <> 'sent'")
    assert await delete_message(rt, topic="t", msg_id="again", release=True)
    second = await send_message(rt, request=SendRequest("t", "second", 60_000, "again"))
    assert await logged("t", "again") == as_logged(second)


async def test_a_change_redis_makes_before_a_send_time_from_a_clock_ahead_moves_the_row(single_rt, monkeypatch):
    """The web process's clock runs ahead of Redis': the row's updated_at (its produceTime) is
    later than the delete's event time (Redis'), which must move it all the same, or a restore
    brings the deleted message back."""
    rt = single_rt
    ahead = now_millis() + 2000
    monkeypatch.setattr(send_service, "now_millis", lambda: ahead)
    m = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=60_000, msg_id="ahead"))
    await delete_message(rt, topic="t", msg_id=m.msg_id)
    await drain_log(rt, ["t"])
    assert (await logged("t", "ahead"))["status"] == Status.DELETED
    await rt.redis.flushall()  # Redis lost its data: only the row says the message ended
    assert (await restore(rt)).restored == 0


async def test_a_resend_after_the_end_replaces_the_row_even_before_the_log_caught_up(clean_state):
    """With no dedupe window (test_send_dedupe.py has the window's own tests)."""
    rt = make_runtime(REDIS_URL, dedupe_window_millis=0)
    try:
        await send_message(rt, request=SendRequest(topic="t", msg="first", delay_millis=0, msg_id="again"))
        [m], _ = await pull_messages(rt, topic="t")
        await ack_message(rt, topic="t", msg_id="again")
        # The log still says "ready" (no writer ran); Redis knows it is acked and takes the new send.
        assert (await logged("t", "again"))["status"] == Status.READY
        second = await send_message(rt, request=SendRequest(topic="t", msg="second", delay_millis=1000, msg_id="again"))
        assert second.payload == "second" and second.status == Status.WAITING
        assert await logged("t", "again") == as_logged(second)
        # The first life's late events do not move the second life's row.
        await drain_log(rt, ["t"])
        assert (await logged("t", "again"))["status"] == Status.WAITING
        assert await history("t", "again") == [
            ("sent", 0, Status.READY, 0), ("pulled", Status.READY, Status.CONSUMING, 1), ("acked", Status.CONSUMING, Status.ACKED, 1), ("sent", 0, Status.WAITING, 0)]
    finally:
        await rt.close()


async def test_a_batch_naming_one_msgid_twice_logs_the_first(single_rt):
    rt = single_rt
    results = await send_messages(rt, requests=[
        SendRequest(topic="t", msg="a", delay_millis=0, msg_id="same"),
        SendRequest(topic="t", msg="b", delay_millis=0, msg_id="same"),
        SendRequest(topic="t", msg="c", delay_millis=0, msg_id="other"),
    ])
    assert [r.payload for r in results] == ["a", "a", "c"]
    assert (await logged("t", "same"))["msg"] == "a"
    assert (await query("SELECT count(*) FROM delayqueue_message"))[0][0] == 2
    assert await history("t", "same") == [("sent", 0, Status.READY, 0)]


async def test_two_processes_groups_naming_the_same_msgids_in_opposite_orders_both_commit(clean_state):
    """Two web processes' groups lock the same rows (a retry storm after a restart): in opposite
    orders they deadlock, and PostgreSQL fails one of them, every send of its group with it."""
    rows = [Message("t", f"m{i:04}", "x", 1_000, 2_000, 3_000, 3, 0, Status.WAITING) for i in range(3000)]
    logs = [MessageLog("default", "web@host", 10_000, 2_500, 0, "default") for _ in range(2)]
    try:
        resent = [dataclasses.replace(row, payload="y") for row in reversed(rows)]
        first, second = await asyncio.gather(logs[0].record(rows), logs[1].record(resent))
    finally:
        for log in logs:
            await log.close()
    assert sorted([sum(first.written), sum(second.written)]) == [0, len(rows)]


async def test_the_log_writer_and_a_group_of_resends_take_the_same_rows_in_one_order(single_rt):
    """The writer moves the rows of messages a pull took (in the pull's order) while a group of
    resends of them locks the same rows: in opposite orders they deadlock, and PostgreSQL fails one
    (the writer's drain, or every send of the group). A held lock on a middle row makes both
    statements meet there, each with its half of the rows locked."""
    rt = single_rt
    ids = [f"m{i:03}" for i in range(200, 0, -1)]
    sent = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=0, msg_id=msg_id)
                                             for msg_id in ids])
    assert [m.msg_id for m in (await pull_messages(rt, topic="t", batch=200))[0]] == ids
    writer = LogWriter(rt, lambda: [Shard("t")])
    resends = MessageLog("default", "web@host", 10_000, 2_500, 0, "default")
    async with await psycopg.AsyncConnection.connect(log_database_url("default")) as blocker:
        await blocker.execute("SELECT FROM delayqueue_message WHERE msg_id = 'm100' FOR UPDATE")
        both = [asyncio.ensure_future(writer.drain_once()),
                asyncio.ensure_future(resends.record([dataclasses.replace(m, payload="again") for m in sent]))]
        await wait_until(lambda: _waiting_for_locks(2), what="both statements to wait at the held row")
        await blocker.rollback()
    try:
        await asyncio.gather(*both)
    finally:
        await resends.close()
        await writer.close()
    assert {row["status"] for row in [await logged("t", msg_id) for msg_id in ids]} == {Status.CONSUMING}


async def _waiting_for_locks(count: int) -> bool:
    return (await query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"))[0][0] >= count


async def test_sends_sharing_a_redis_turn_write_the_log_together_and_reach_redis_one_at_a_time(single_rt):
    """The schedule planner's pipeline: while one call holds the turn, the others' log rows are
    written, and their scripts wait for it."""
    rt, turn, ids = single_rt, asyncio.Lock(), ["turn0", "turn1"]

    async def logged_all() -> bool:
        return all([await logged("t", msg_id) for msg_id in ids])

    async def in_redis() -> list[bool]:
        return [await rt.redis.hexists(rt.ns.topic("t").msgs, msg_id) for msg_id in ids]

    await turn.acquire()
    calls = [asyncio.ensure_future(send_messages(rt, requests=[SendRequest(topic="t", msg="x", msg_id=msg_id)],
                                                 redis_turn=turn))
             for msg_id in ids]
    await wait_until(logged_all, what="both sends logged")
    assert await in_redis() == [False, False] and not any(call.done() for call in calls)
    turn.release()
    sent = [outcome for call in await asyncio.gather(*calls) for outcome in call]
    assert [message.msg_id for message in sent] == ids
    assert await in_redis() == [True, True]


async def test_a_batch_with_a_logged_msgid_logs_the_new_ones_once_and_leaves_that_one(single_rt, monkeypatch):
    """New messages go in as plain INSERTs; a msgId the log holds fails that statement, and the
    rows go again through the upsert, which decides row by row (and so do the next groups, for
    UPSERTS_AFTER_CONFLICT statements, after which plain INSERTs come back)."""
    rt = single_rt
    monkeypatch.setattr(MessageLog, "UPSERTS_AFTER_CONFLICT", 2)
    first = await send_message(rt, request=SendRequest(topic="t", msg="first", delay_millis=60_000, msg_id="dup"))
    # Which of the two statements the log's (real) connection runs, per send.
    conn, statements = rt.log._db._conn, []
    execute = conn.execute
    kinds = {sql.INSERT_NEW: "insert", sql.RECORD: "upsert"}

    async def recording_execute(query, params=None, **kwargs):
        statements[-1].append(kinds.get(query, "other"))
        return await execute(query, params, **kwargs)

    monkeypatch.setattr(conn, "execute", recording_execute)
    for round_ in range(4):  # the conflict, upserts only, then plain INSERTs again
        # The logged msgId last: the plain INSERT has written the others when it meets it.
        batch = [SendRequest(topic="t", msg=f"new{round_}-{i}", delay_millis=0, msg_id=f"n{round_}-{i}")
                 for i in range(3)] + [SendRequest(topic="t", msg="again", delay_millis=0, msg_id="dup")]
        statements.append([])
        results = await send_messages(rt, requests=batch)
        assert results[-1] == first
        for i, result in enumerate(results[:3]):
            assert result.payload == f"new{round_}-{i}" and result.status == Status.READY
            assert await logged("t", f"n{round_}-{i}") == as_logged(result)
            assert await history("t", f"n{round_}-{i}") == [("sent", 0, Status.READY, 0)]
    statements.append([])
    await send_message(rt, request=SendRequest(topic="t", msg="fresh", delay_millis=0, msg_id="fresh"))
    assert statements == [["insert", "upsert"], ["upsert"], ["insert", "upsert"], ["upsert"], ["insert"]]
    assert await logged("t", "dup") == as_logged(first)
    assert await history("t", "dup") == [("sent", 0, Status.WAITING, 0)]
    assert (await query("SELECT count(*) FROM delayqueue_message"))[0][0] == 14
    assert (await query("SELECT count(*) FROM delayqueue_messageevent"))[0][0] == 14


@pytest.mark.fault
async def test_postgres_down_means_500_and_nothing_in_redis(api, single_rt, postgres, caplog, monkeypatch):
    monkeypatch.setattr(exceptions, "_logged", {})  # an earlier test's same failure would hold this one's log line back
    postgres.stop()
    reply = (await api.post(API + "sendMsg", data={"topic": "t", "msg": "lost?", "delayMillis": 0})).json()
    # What failed, not where: PostgreSQL's text names its host and port; that goes to the log.
    assert reply == {"code": 500, "msg": "message log unavailable: connection refused"}
    batch = (await api.post(API + "sendMsgBatch", json=[{"topic": "t", "msg": "b", "delayMillis": 0}])).json()
    assert batch["results"][0] == {"code": 500, "msg": "message 0: message log unavailable: connection refused"}
    assert any(f'port {postgres.spec["port"]} failed' in r.getMessage() for r in caplog.records)
    assert await single_rt.redis.keys("dq:{*") == []
    postgres.start()
    reply = (await api.post(API + "sendMsg", data={"topic": "t", "msg": "back", "delayMillis": 0})).json()
    assert reply["code"] == 200
    assert (await logged("t", reply["delayMsg"]["msgId"]))["msg"] == "back"


async def test_sends_redis_refuses_are_taken_out_of_the_log(clean_state):
    rt = make_runtime("redis://127.0.0.1:1/0", redis_timeout_millis=300)  # nothing listens there
    with pytest.raises(Exception):
        await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="refused"))
    batch = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=0, msg_id=f"refused{i}")
                                              for i in range(3)])
    await rt.close()
    assert all(isinstance(outcome, RedisUnavailable) for outcome in batch)
    for msg_id in ("refused", "refused0", "refused1", "refused2"):
        assert await logged("t", msg_id) is None
        assert await history("t", msg_id) == []


@pytest.mark.fault
async def test_history_waits_in_redis_while_postgres_is_down(long_retention_rt, start_scanner, postgres):
    # The acked messages are compared with Redis at the end, after PostgreSQL's restart and the
    # writer's catching up: seconds on a loaded machine, past the suite's retention.
    rt = long_retention_rt
    sent = await send_messages(rt, requests=[SendRequest(topic="t", msg=str(i), delay_millis=0) for i in range(50)])
    await start_scanner(rt)
    postgres.stop()
    pulled, _ = await pull_messages(rt, topic="t", batch=50)
    for m in pulled[:25]:
        await ack_message(rt, topic="t", msg_id=m.msg_id)
    for m in pulled[25:]:
        await nack_message(rt, topic="t", msg_id=m.msg_id)
    await asyncio.sleep(0.5)  # the writer tries, fails and keeps the events
    entries = await rt.redis.xrange(rt.ns.topic("t").events)
    assert sum(len(Event.parse("t", entry_id, fields)) for entry_id, fields in entries) >= 100
    postgres.start()
    await wait_until(lambda: _event_count(), timeout=20, what="history after Postgres came back")
    for m in sent:
        reasons = [h[0] for h in await history("t", m.msg_id)]
        assert reasons in (["sent", "pulled", "acked"], ["sent", "pulled", "nacked"]), reasons
        assert (await logged("t", m.msg_id))["status"] == (await get_message(rt, topic="t", msg_id=m.msg_id)).status


async def _event_count(expected=150):
    return (await query("SELECT count(*) FROM delayqueue_messageevent"))[0][0] == expected


@pytest.mark.process
def test_a_log_process_killed_mid_batch_loses_and_repeats_nothing(scanner_process):
    asyncio.run(_fill_history(3000))
    scanner = scanner_process("writer", DELAYQUEUE_LOG_WRITER_BATCH="100")
    scanner.wait_started()
    asyncio.run(wait_until(lambda: _some_events(), timeout=20, interval=0.005, what="the first writer to start"))
    [first] = scanner.log_process_pids()
    os.kill(first, signal.SIGKILL)
    written = asyncio.run(query("SELECT count(*) FROM delayqueue_messageevent"))[0][0]
    assert 0 < written < 9000, f"kill landed outside the drain ({written} rows)"
    # The scanner starts another log process, which writes the rest.
    asyncio.run(wait_until(lambda: _event_count(9000), timeout=30, what="the second writer to finish"))
    assert len(scanner.log_process_pids()) == 2
    per_message = asyncio.run(query(
        "SELECT string_agg(reason, ',' ORDER BY at, id) FROM delayqueue_messageevent GROUP BY msg_id"))
    assert len(per_message) == 3000 and {r[0] for r in per_message} == {"sent,pulled,acked"}
    assert asyncio.run(query("SELECT count(*) FROM delayqueue_message WHERE status = %s", Status.ACKED))[0][0] == 3000


async def _fill_history(count: int) -> None:
    rt = make_runtime(REDIS_URL)
    await send_messages(rt, requests=[SendRequest(topic="k", msg=str(i), delay_millis=0) for i in range(count)])
    for _ in range(count // 1000):
        pulled, _ = await pull_messages(rt, topic="k", batch=1000)
        await asyncio.gather(*(ack_message(rt, topic="k", msg_id=m.msg_id) for m in pulled))
    await rt.close()


async def _some_events():
    return (await query("SELECT count(*) FROM delayqueue_messageevent"))[0][0] > 0


async def test_with_the_log_off_nothing_reaches_postgres_or_the_streams(clean_state):
    rt = make_runtime(REDIS_URL, message_log=False)
    m = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0))
    [pulled], _ = await pull_messages(rt, topic="t")
    assert pulled.msg_id == m.msg_id
    assert not await rt.redis.exists(rt.ns.topic("t").events)
    await rt.close()
    assert await logged("t", m.msg_id) is None


async def test_a_restarted_scanner_writer_picks_up_what_it_left(single_rt):
    """Events read but not yet deleted (a crash after commit) are written once, not twice."""
    rt = single_rt
    m = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0))
    await pull_messages(rt, topic="t")
    entries = await rt.redis.xrange(rt.ns.topic("t").events)
    assert len(entries) == 1  # the pull ('sent' is written by the send itself)
    writer = LogWriter(rt, lambda: [Shard("t")])
    try:  # a crash after the commit, before the XDEL:
        await writer._commit([event for entry_id, fields in entries for event in Event.parse("t", entry_id, fields)])
    finally:
        await writer.close()
    await ack_message(rt, topic="t", msg_id=m.msg_id)  # an entry not yet written, read with the one that was
    assert await drain_log(rt, ["t"]) == 2
    assert await history("t", m.msg_id) == [("sent", 0, Status.READY, 0), ("pulled", Status.READY, Status.CONSUMING, 1),
                                            ("acked", Status.CONSUMING, Status.ACKED, 1)]
    assert (await logged("t", m.msg_id))["status"] == Status.ACKED


@pytest.mark.fault
async def test_a_restore_logs_one_stream_entry_per_script_call_and_one_row_per_message(clean_state, monkeypatch):
    """restore.lua records its messages as one entry per call; the writer splits entries into
    rows and, with entries bigger than its batch, still writes each event exactly once."""
    monkeypatch.setattr(restore_service, "SCRIPT_MESSAGES", 30)
    rt = make_runtime(REDIS_URL, log_writer_batch=50)
    try:
        sent = [await send_message(rt, request=SendRequest(topic="r", msg=str(n), delay_millis=60_000))
                for n in range(120)]
        await rt.redis.flushall()
        assert (await restore(rt)).restored == 120
        assert await rt.redis.xlen(rt.ns.topic("r").events) == 4
        assert await drain_log(rt, ["r"]) == 120
        assert await rt.redis.xlen(rt.ns.topic("r").events) == 0
        for m in sent:
            assert (await history("r", m.msg_id))[-1] == ("restored", 0, Status.WAITING, 0)
        assert (await query("SELECT count(*) FROM delayqueue_messageevent WHERE reason = 'restored'")) == [(120,)]
    finally:
        await rt.close()


async def test_a_backlog_in_many_streams_is_written_a_batch_at_a_time(clean_state):
    """After an outage every held stream has a backlog. Written in one transaction, it grew with the
    topics held (a thousand topics of 5,000 events: millions of rows) past the statement timeout,
    and was read and tried again whole, for ever, while Redis kept every event."""
    rt = make_runtime(REDIS_URL, log_writer_batch=100)
    topics = ["a", "b", "c", "d"]
    writer = LogWriter(rt, lambda: [Shard(topic) for topic in topics])
    try:
        for topic in topics:
            await send_messages(rt, requests=[SendRequest(topic=topic, msg=str(n), delay_millis=0) for n in range(100)])
            for _ in range(100):
                await pull_messages(rt, topic=topic, batch=1)  # an entry each
        assert await writer.drain_once()
        assert writer.written <= 100
        while await writer.drain_once():
            pass
        assert writer.written == 400
        assert await query("SELECT count(*) FROM delayqueue_messageevent WHERE reason = 'pulled'") == [(400,)]
    finally:
        await writer.close()
        await rt.close()


async def test_a_pull_and_an_ack_batch_log_one_stream_entry_each_and_a_row_per_message(clean_state):
    """pull.lua and ack.lua record the messages they move as one entry per call; an ackMsgBatch
    answers each msgId in order (unknown, or acked already: not done) and logs only those it acked."""
    rt = make_runtime(REDIS_URL)
    try:
        await send_messages(rt, requests=[SendRequest(topic="b", msg=str(n), delay_millis=0) for n in range(5)])
        await drain_log(rt, ["b"])
        pulled, _ = await pull_messages(rt, topic="b", batch=5)
        assert len(pulled) == 5
        assert await rt.redis.xlen(rt.ns.topic("b").events) == 1
        ids = [m.msg_id for m in pulled]
        done = await ack_messages(rt, topic="b", msg_ids=[ids[0], "unknown", ids[1], ids[0], *ids[2:4]])
        assert done == [True, False, True, False, True, True]
        assert await rt.redis.xlen(rt.ns.topic("b").events) == 2
        assert await drain_log(rt, ["b"]) == 9
        for msg_id in ids[:4]:
            assert [h[0] for h in await history("b", msg_id)] == ["sent", "pulled", "acked"]
            assert (await logged("b", msg_id))["status"] == Status.ACKED
        assert [h[0] for h in await history("b", ids[4])] == ["sent", "pulled"]
        assert (await logged("b", ids[4]))["status"] == Status.CONSUMING
    finally:
        await rt.close()


@pytest.mark.fault
async def test_a_hung_message_log_answers_a_send_maybe_logged_and_a_resend_under_its_msg_id_enqueues_it_once(single_rt):
    """A PostgreSQL that stops answering (here the connection's backend, paused) cannot end the
    wait with its own statement timeout: the send path gives up after DELAYQUEUE_LOG_TIMEOUT_MILLIS
    (and the 5 s psycopg gives the server to cancel the statement). The INSERT it was sent commits
    once the backend goes on, so the answer cannot say nothing was sent: it names the msgId to send
    again, and that resend puts the logged message into Redis."""
    rt = make_runtime(REDIS_URL, log_timeout_millis=500)
    try:
        before = await send_message(rt, request=SendRequest(topic="t", msg="before", delay_millis=0))
        backend = rt.log._db._conn.info.backend_pid
        os.kill(backend, signal.SIGSTOP)
        try:
            with pytest.raises(LogMaybeWritten, match="no answer within 0.5 s; the message may have been enqueued: "
                                                      "send it again with msgId hung to be sure"):
                await asyncio.wait_for(
                    send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="hung")), 60)
        finally:
            os.kill(backend, signal.SIGCONT)
        assert await single_rt.redis.hget(rt.ns.topic("t").msgs, "hung") is None
        await wait_until(lambda: logged("t", "hung"), what="the paused backend's INSERT to commit")
        again = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="hung"))
        assert again.msg_id == "hung" and again.status == Status.READY
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert [m.msg_id for m in pulled] == [before.msg_id, "hung"]
        after = await send_message(rt, request=SendRequest(topic="t", msg="after", delay_millis=0))
        assert (await logged("t", after.msg_id))["msg"] == "after"  # a new connection
    finally:
        await rt.close()


@pytest.fixture
def notices_only(monkeypatch):
    """Puts the log writer's every-few-seconds read of every held stream out of reach: a history
    row that comes in can only have come through a script's notice."""
    from delayqueue.workers import log_writer
    monkeypatch.setattr(log_writer, "SWEEP_SECONDS", 3600.0)


async def scanner_holding(rt, start_scanner, count: int):
    running = await start_scanner(rt)

    async def all_held():
        return len(running.scanner.workers) == count

    await wait_until(all_held, what="the scanner to hold every topic")
    await asyncio.sleep(0.5)  # its first reads of the newly held streams are done


async def test_the_log_writer_reads_only_the_streams_a_script_said_got_entries(single_rt, start_scanner, notices_only):
    """With thousands of topics, reading every held stream every 100 ms cost a scanner most of a core."""
    rt = single_rt
    sent = [await send_message(rt, request=SendRequest(topic=f"w{i}", msg="x", delay_millis=60_000)) for i in range(40)]
    await scanner_holding(rt, start_scanner, 40)

    async def xrange_calls():
        return (await rt.redis.info("commandstats")).get("cmdstat_xrange", {}).get("calls", 0)

    before = await xrange_calls()
    await asyncio.sleep(1.0)  # ten writer cycles
    assert await xrange_calls() == before  # no stream got an entry: none was read

    await delete_message(rt, topic="w7", msg_id=sent[7].msg_id, release=False)

    async def deleted_logged():
        return ("deleted", Status.WAITING, Status.DELETED, 0) in await history("w7", sent[7].msg_id)

    await wait_until(deleted_logged, timeout=5, what="the deletion's history row")
    assert await xrange_calls() - before <= 2  # that one stream, read until it was empty


async def test_a_notice_reaches_the_log_writer_on_a_cluster_too(rt, start_scanner, notices_only):
    """The notice is published by a script on the topic's node; the writer's scanner listens on
    whichever node it subscribed to (on a cluster, pub/sub reaches every node)."""
    sent = [await send_message(rt, request=SendRequest(topic=f"n{i}", msg="x", delay_millis=0)) for i in range(6)]
    await scanner_holding(rt, start_scanner, 6)
    for i in range(6):  # topics spread over the cluster's nodes
        [pulled], _ = await pull_messages(rt, topic=f"n{i}")
        assert pulled.msg_id == sent[i].msg_id

    async def pulls_logged():
        return all([("pulled", Status.READY, Status.CONSUMING, 1) in await history(f"n{i}", sent[i].msg_id) for i in range(6)])

    await wait_until(pulls_logged, timeout=5, what="the pulls' history rows")


async def test_entries_whose_notice_was_missed_are_written_by_the_safety_read(single_rt, start_scanner, monkeypatch):
    from delayqueue.live import keys
    from delayqueue.workers import log_writer
    monkeypatch.setattr(log_writer, "SWEEP_SECONDS", 0.5)
    monkeypatch.setattr(keys.NamespaceKeys, "shard_of_history", lambda self, channel: None)  # every notice lost
    rt = single_rt
    sent = await send_message(rt, request=SendRequest(topic="m", msg="x", delay_millis=0))
    await scanner_holding(rt, start_scanner, 1)
    await pull_messages(rt, topic="m")

    async def pull_logged():
        return ("pulled", Status.READY, Status.CONSUMING, 1) in await history("m", sent.msg_id)

    await wait_until(pull_logged, timeout=5, what="the pull's history row")


def _rows_filtered_out(plan: dict) -> int:
    """Rows an executed plan read and then threw away, over all its nodes: a join that scans a
    table once per batch row throws away about rows x batch."""
    return (plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0)
            + sum(_rows_filtered_out(child) for child in plan.get("Plans", [])))


@pytest.mark.parametrize("statement", ["UPDATE_MESSAGES", "FORGET", "CORRECT_SENT", "RECORD", "DELETE_HISTORY"])
async def test_a_batch_of_a_namespace_the_statistics_never_saw_is_found_row_by_row(single_rt, statement):
    """Statistics taken while the log held only another namespace's rows put this one at one
    row, and a join on (namespace, topic, msgId) then led with a scan of the message table and
    compared it with the whole batch: the suite's 12,000-event drain of test_restore took over
    30 s that way. Each batch row must find its rows by a probe, so the work grows with the batch."""
    rt = single_rt
    for table in (sql.tables.MESSAGE, sql.tables.EVENT):
        columns = ("msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, status, updated_at"
                   if table == sql.tables.MESSAGE else "msg_id, event_id, at, from_status, to_status, retry, reason,"
                   " process, host, detail")
        values = ("'m' || n, '', now(), now(), now(), 0, 0, 1, now()" if table == sql.tables.MESSAGE
                  else "'m' || n, 'e', now(), 0, 1, 0, '', '', '', ''")
        await query(f"INSERT INTO {table} (namespace, topic, {columns}) SELECT 'other', 't', {values}"
                    " FROM generate_series(1, 3000) n")
        await query(f"ANALYZE {table}")
        await query(f"DELETE FROM {table}")
    batch = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=600_000)] * 2000)
    messages = [{"topic": m.topic, "msg_id": m.msg_id, "payload": "y", "produce_time": m.produce_time,
                 "trigger_time": m.trigger_time, "expire_time": m.expire_time, "max_retry": m.max_retry, "retry": 0,
                 "status": Status.DELETED, "priority": 0} for m in batch]
    events = [{**m, "to_status": Status.DELETED, "at": m["produce_time"] + 1} for m in messages]
    params = {"namespace": rt.ns.namespace, "events": json.dumps(events), "unsent": json.dumps(messages),
              "rows": json.dumps(messages), "process": "p", "host": "h", "ended": Status.ACKED, "dedupe_window": 0,
              "namespaces": [rt.ns.namespace] * len(batch), "topics": ["t"] * len(batch),
              "msg_ids": [m.msg_id for m in batch], "before": "infinity"}
    async with await psycopg.AsyncConnection.connect(log_database_url()) as conn:  # rolled back
        # As in a log too big to hash: then the statistics decide which side leads the loop.
        await conn.execute("SET enable_hashjoin = off; SET enable_mergejoin = off")
        cursor = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + getattr(sql, statement), params)
        plan = (await cursor.fetchone())[0][0]["Plan"]
        await conn.rollback()
    assert _rows_filtered_out(plan) <= len(batch), json.dumps(plan, indent=1)


@pytest.mark.parametrize("statement", ["UPDATE_MESSAGES", "FORGET"])
async def test_a_batch_sharing_one_produce_time_is_found_by_msg_id_not_by_its_produce_time(single_rt, statement):
    """Stats taken while every send had its own produceTime make produce_time look unique, and
    a plan through (topic, produce_time) then walks a whole batch for each of its events. The
    log rows must be found by msgId."""
    rt = single_rt
    for i in range(300):
        await send_message(rt, request=SendRequest(topic=f"earlier{i % 7}", msg="x", delay_millis=600_000))
    await query(f"ANALYZE {sql.tables.MESSAGE}")
    await query(f"DELETE FROM {sql.tables.MESSAGE}")
    batch = await send_messages(rt, requests=[SendRequest(topic="t", msg="x", delay_millis=600_000)] * 500)
    shared = batch[0].produce_time
    assert {m.produce_time for m in batch} == {shared}
    rows = [{"topic": "t", "msg_id": m.msg_id, "produce_time": shared, "to_status": Status.DELETED, "retry": 0,
             "at": shared + 1, "trigger_time": None, "expire_time": None} for m in batch]
    params = {"namespace": rt.ns.namespace, "events": json.dumps(rows), "unsent": json.dumps(rows)}
    async with await psycopg.AsyncConnection.connect(log_database_url(), autocommit=True) as conn:
        # A log of millions of rows is joined by nested loop; a small one would be hashed.
        await conn.execute("SET enable_hashjoin = off; SET enable_mergejoin = off")
        plan = "\n".join(row[0] for row in await (await conn.execute("EXPLAIN " + getattr(sql, statement), params))
                         .fetchall())
    message_indexes = set(re.findall(rf"Index Scan using (\w+) on {sql.tables.MESSAGE}\b", plan))
    # By msgId, and then (sql.probe_each) by the row's id.
    assert "message_natural_key" in message_indexes <= {"message_natural_key", f"{sql.tables.MESSAGE}_pkey"}, plan
