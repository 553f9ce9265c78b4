"""Dead letters (status 6, and 5: expired undelivered) in the message log: listed in keyset pages with why and when they
died, kept by prune_log for their own retention, redriven by the scanners as a rate-paced,
resumable task, and purged."""
import asyncio
import os
import subprocess
import sys
from datetime import datetime, timedelta

import psycopg
import pytest
import redis
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command

from delayqueue.api import wire
from delayqueue.core.constants import Status
from delayqueue.live.shards import topic_shards
from delayqueue.messagelog import retention
from delayqueue.messagelog.retention import prune_log
from delayqueue.messagelog.sql import to_millis
from delayqueue.services.consume import ack_message, nack_message, pull_messages
from delayqueue.services import dead_letters as dead_letters_module
from delayqueue.services.dead_letters import create_redrive, purge_dead_letters, redrive_state
from delayqueue.services.messages import get_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import list_topics, topic_info
from delayqueue.services.topic_control import set_topic_config
from delayqueue.workers.redriver import Redriver
from tests.helpers import (EVERY_LOG_DATABASE, REDIS_URL, ROOT, TEST_CONFIG, call, dead_letter_page, drain_log, history,
                           log_database_url, logged, make_runtime, query, redis_readings, stamps, wait_until)

# Dead letters written straight into the log, as the log writer leaves them: their status (6 unless
# told) and the history row that ended them, `g` milliseconds apart in death order.
FILL_DEAD = """
WITH rows AS (
    INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                    max_retry, retry, status, updated_at)
    SELECT 'default', %(topic)s, 'd' || g, 'body ' || g, now() - interval '1 hour', now() - interval '1 hour',
           now() + interval '1 hour', 0, 1, %(status)s, now() - interval '1 hour' + g * interval '1 millisecond'
    FROM generate_series(1, %(count)s) AS g
    RETURNING namespace, topic, msg_id, updated_at
)
INSERT INTO delayqueue_messageevent (namespace, topic, msg_id, event_id, at, from_status, to_status, retry, reason,
                                     process, host, detail)
SELECT namespace, topic, msg_id, 'x', updated_at, 3, %(status)s, 1, %(reason)s, 'test', 'test', %(detail)s FROM rows
"""


async def fill_dead(topic: str, count: int, status: int = Status.EXHAUSTED, reason: str = "retries_exhausted",
                    detail: str = "") -> None:
    async with await psycopg.AsyncConnection.connect(log_database_url(), autocommit=True) as conn:
        await conn.execute(FILL_DEAD, {"topic": topic, "count": count, "status": status, "reason": reason,
                                       "detail": detail})


async def make_dead(rt, topic: str, exhausted: list[str], expired: list[str] = ()) -> None:
    """Real dead letters: delivered once, then given back with no delivery left (retries_exhausted)
    or after their TTL ran out (expired); the log writer then records them."""
    requests = [SendRequest(topic, f"body of {i}", 0, i, max_retry=0) for i in exhausted]
    # A TTL long enough for a loaded machine to pull them before it runs out.
    requests += [SendRequest(topic, f"body of {i}", 0, i, ttl_millis=1_000, max_retry=5) for i in expired]
    await send_messages(rt, requests=requests)
    pulled, _ = await pull_messages(rt, topic=topic, batch=len(requests), ack_timeout_millis=60_000)
    assert len(pulled) == len(requests)
    if expired:
        await asyncio.sleep(1.05)
    for msg_id in [*exhausted, *expired]:
        assert await nack_message(rt, topic=topic, msg_id=msg_id) == (True, Status.EXHAUSTED)
    await drain_log(rt, [topic])


async def all_pages(rt, topic: str, limit: int) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        page, cursor = await dead_letter_page(rt, topic=topic, limit=limit, cursor=cursor)
        pages.append(page)
        if cursor is None:
            return pages


async def test_dead_letters_are_listed_in_pages_with_why_and_when_they_died(rt):
    await make_dead(rt, "orders", exhausted=["e1", "e2", "e3"], expired=["x1", "x2"])
    await send_message(rt, request=SendRequest(topic="orders", msg="live", delay_millis=0, msg_id="live"))
    await make_dead(rt, "other", exhausted=["o1"])
    pages = await all_pages(rt, "orders", limit=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    dead = [m for page in pages for m in page]
    reasons = {m["msgId"]: m["deadReason"] for m in dead}
    assert reasons == {"e1": "retries_exhausted", "e2": "retries_exhausted", "e3": "retries_exhausted",
                       "x1": "expired", "x2": "expired"}
    times = [m["deadTime"] for m in dead]
    assert times == sorted(times) and all(m["status"] == Status.EXHAUSTED and m["retry"] == 1 for m in dead)
    assert dead[0]["msg"] == f"body of {dead[0]['msgId']}" and dead[0]["topic"] == "orders"
    for m in dead:  # deadTime is when the log writer recorded the ending: the message row's last change
        row = await logged("orders", m["msgId"])
        assert {k: row[k] for k in ("produceTime", "expireTime", "maxRetry")} == {
            k: m[k] for k in ("produceTime", "expireTime", "maxRetry")}
    # A page as large as everything is the last page: no cursor.
    page, cursor = await dead_letter_page(rt, topic="orders", limit=1000, cursor=None)
    assert len(page) == 5 and cursor is None


async def test_keyset_pages_cover_every_dead_letter_once_in_order(single_rt):
    await fill_dead("bulk", 250)
    pages = await all_pages(single_rt, "bulk", limit=100)
    ids = [m["msgId"] for page in pages for m in page]
    assert [len(p) for p in pages] == [100, 100, 50] and ids == [f"d{g}" for g in range(1, 251)]


@EVERY_LOG_DATABASE
def test_prune_log_keeps_dead_letters_for_their_own_retention(clean_state):
    async def setup():
        rt = make_runtime(REDIS_URL)
        await make_dead(rt, "p", exhausted=["dead"])
        await send_message(rt, request=SendRequest(topic="p", msg="acked", delay_millis=0, msg_id="acked"))
        await pull_messages(rt, topic="p")
        await ack_message(rt, topic="p", msg_id="acked")
        await drain_log(rt, ["p"])
        await rt.close()

    asyncio.run(setup())

    def age(days: int) -> None:
        asyncio.run(query("UPDATE delayqueue_message SET updated_at = now() - %s * interval '1 day'", days))
        asyncio.run(query("UPDATE delayqueue_messageevent SET at = now() - %s * interval '1 day' - interval '1 s'",
                          days))

    def left() -> list[str]:
        return sorted(r[0] for r in asyncio.run(query("SELECT msg_id FROM delayqueue_message")))

    age(10)  # past the log's retention (7 days), within the dead letters' (14, the default)
    assert prune_log(timedelta(days=7)) == (1, 3)  # acked: sent, pulled, acked
    assert left() == ["dead"]
    age(15)  # past its 14 days: left for the archive (spark/archive.py) as long as an ended row past 5 of 7 days
    assert prune_log(timedelta(days=7)) == (0, 0)
    age(22)
    assert prune_log(timedelta(days=7), dead_older_than=timedelta(days=30)) == (0, 0)
    assert prune_log(timedelta(days=7)) == (1, 3)  # the dead letter: sent, pulled, retries_exhausted
    assert left() == []


@EVERY_LOG_DATABASE
def test_prune_log_keeps_messages_that_expired_undelivered_for_the_dead_letters_retention(clean_state):
    asyncio.run(fill_dead("x", 1, Status.EXPIRED, "expired"))
    asyncio.run(query("UPDATE delayqueue_message SET updated_at = now() - interval '10 days'"))
    asyncio.run(query("UPDATE delayqueue_messageevent SET at = now() - interval '10 days'"))
    assert prune_log(timedelta(days=7)) == (0, 0)  # a dead letter: within its 14 days
    assert prune_log(timedelta(days=7), dead_older_than=timedelta(days=2)) == (1, 1)  # 2 + 7 days


@EVERY_LOG_DATABASE
def test_prune_log_ages_messages_by_postgresql_clock_not_its_hosts(clean_state, monkeypatch):
    """A prune_log host whose clock runs 20 days ahead takes no dead letter before its 14 days."""
    class Ahead(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(days=20)

    monkeypatch.setattr(retention, "datetime", Ahead)
    asyncio.run(fill_dead("x", 1, Status.EXPIRED, "expired"))
    asyncio.run(query("UPDATE delayqueue_message SET updated_at = now() - interval '10 days'"))
    asyncio.run(query("UPDATE delayqueue_messageevent SET at = now() - interval '10 days'"))
    assert prune_log(timedelta(days=7)) == (0, 0)
    assert prune_log(timedelta(days=7), dead_older_than=timedelta(days=2)) == (1, 1)  # 2 + 7 days


async def test_a_message_that_expires_undelivered_is_a_dead_letter_listed_and_redriven(api, single_rt,
                                                                                      start_scanner):
    """Nobody pulls it before its TTL runs out: the scanner ends it (status 5, reason expired) and
    getDeadMsgList shows it; a redrive gives it a new life that a consumer pulls."""
    rt = single_rt
    await send_message(rt, request=SendRequest("late", "acked in time", 0, "fine"))
    sent = await send_message(rt, request=SendRequest("late", "never pulled", 0, "lost", ttl_millis=3_000))
    assert [m.msg_id for m in (await pull_messages(rt, topic="late"))[0]] == ["fine"]
    assert await ack_message(rt, topic="late", msg_id="fine")
    await start_scanner(rt)

    async def listed():
        return (await call(api, "getDeadMsgList", method="get", topic="late"))["delayMsgList"]

    [dead] = await wait_until(listed, timeout=20, what="the expired message in getDeadMsgList")
    assert dead == {**sent.to_wire(), "status": Status.EXPIRED, "deadReason": "expired", "deadDetail": "",
                    "deadTime": dead["deadTime"]}
    assert dead["deadTime"] >= sent.expire_time
    started = await call(api, "redriveDeadMsg", json={"topic": "late"})
    assert started["code"] == 200

    async def done():
        task = await call(api, "getRedriveTask", method="get", taskId=str(started["taskId"]))
        return task["state"] == "done" and task

    assert (await wait_until(done, what="the redrive"))["moved"] == 1
    pulled = await call(api, "pullMsg", topic="late")
    assert [(m["msgId"], m["msg"], m["retry"]) for m in pulled["delayMsgList"]] == [("lost", "never pulled", 1)]
    assert (await call(api, "getDeadMsgList", method="get", topic="late"))["delayMsgList"] == []


async def test_a_redrive_sends_dead_letters_back_as_new_lives_that_are_delivered(rt, start_scanner, monkeypatch):
    await make_dead(rt, "t", exhausted=["a", "b", "c"])
    readings = redis_readings(monkeypatch, dead_letters_module)
    task_id = await create_redrive(rt, topic="t", msg_ids=["a", "b", "nope"], max_per_second=500)
    # Bounded by Redis' clock, the deaths': a letter redriven and dead again is never the task's.
    assert await query(f"SELECT {to_millis('created_at')} FROM delayqueue_redrivetask WHERE id = %s",
                       task_id) == [(readings[0],)]
    assert await create_redrive(rt, topic="t", msg_ids=["nope"], max_per_second=500) is None
    assert await create_redrive(rt, topic="empty", msg_ids=None, max_per_second=500) is None
    await start_scanner(rt)

    async def done():
        state = wire.redrive_progress(await redrive_state(rt, task_id=task_id))
        return state if state["state"] == "done" else None

    assert await wait_until(done, timeout=10, what="the redrive") == {"moved": 2, "left": 0, "state": "done"}
    pulled, _ = await pull_messages(rt, topic="t", batch=10)
    assert sorted(m.msg_id for m in pulled) == ["a", "b"]
    assert all(m.retry == 1 and m.status == Status.CONSUMING and m.payload == f"body of {m.msg_id}"
               for m in pulled)
    assert [m["msgId"] for m in (await dead_letter_page(rt, topic="t", limit=10, cursor=None))[0]] == ["c"]
    async def lives():  # the scanner's log writer records the new life's pull
        rows = await history("t", "a")
        return rows if rows[-1][0] == "pulled" and len(rows) == 5 else None

    assert await wait_until(lives, what="the pull in the history") == [
        ("sent", 0, 2, 0), ("pulled", 2, 3, 1), ("retries_exhausted", 3, 6, 1), ("redriven", 6, 2, 0),
        ("pulled", 2, 3, 1)]
    # Dead again: a dead letter again, and another redrive takes it.
    assert await nack_message(rt, topic="t", msg_id="a") == (True, Status.EXHAUSTED)
    await wait_until(lambda: logged_status("t", "a", Status.EXHAUSTED), what="the second death in the log")
    page, _ = await dead_letter_page(rt, topic="t", limit=10, cursor=None)
    assert [(m["msgId"], m["deadReason"]) for m in page] == [("c", "retries_exhausted"), ("a", "retries_exhausted")]


async def logged_status(topic: str, msg_id: str, status: int) -> bool:
    row = await logged(topic, msg_id)
    return row is not None and row["status"] == status


async def test_purge_ends_dead_letters_only_as_deleted_and_keeps_their_history(single_rt, monkeypatch):
    """What they went through stays in the history, for the hours' figures (spark.stats), until the
    retention takes it with the row."""
    rt = single_rt
    await make_dead(rt, "t", exhausted=["a", "b", "c"])
    await send_message(rt, request=SendRequest(topic="t", msg="live", delay_millis=0, msg_id="live"))
    readings = redis_readings(monkeypatch, dead_letters_module)
    assert await purge_dead_letters(rt, topic="t", msg_ids=["a", "live", "nope"]) == 1
    assert (await logged("t", "a"))["status"] == Status.DELETED
    # Stamped, row and history, with Redis' clock: its death's entry, written again by a second writer
    # (a topic changing hands), is never later, as it would be with PostgreSQL's clock behind Redis'.
    [updated, *_, purged] = await stamps("t", "a")
    assert updated == purged == readings[0]
    assert await history("t", "a") == [("sent", 0, Status.READY, 0), ("pulled", Status.READY, Status.CONSUMING, 1),
                                       ("retries_exhausted", Status.CONSUMING, Status.EXHAUSTED, 1),
                                       ("purged", Status.EXHAUSTED, Status.DELETED, 1)]
    page, _ = await dead_letter_page(rt, topic="t", limit=10, cursor=None)
    assert sorted(m["msgId"] for m in page) == ["b", "c"]
    assert await purge_dead_letters(rt, topic="t", batch=1) == 2
    assert await purge_dead_letters(rt, topic="t") == 0
    assert (await logged("t", "live"))["status"] == Status.READY


async def redriven_at(topic: str) -> list[int]:
    rows = await query("SELECT (extract(epoch FROM at) * 1000)::int8 FROM delayqueue_messageevent"
                       " WHERE topic = %s AND reason = 'redriven' ORDER BY at", topic)
    return [r[0] for r in rows]


@pytest.mark.process
async def test_a_redrive_keeps_to_its_rate_in_a_scanner_process(single_rt, scanner_process):
    await fill_dead("paced", 300)
    scanner = scanner_process("pacer")
    scanner.wait_started()
    task_id = await create_redrive(single_rt, topic="paced", msg_ids=None, max_per_second=100)

    async def done():
        return wire.redrive_progress(await redrive_state(single_rt, task_id=task_id))["state"] == "done"

    await wait_until(done, timeout=30, interval=0.1, what="the redrive")
    times = await redriven_at("paced")
    assert len(times) == 300
    rate = (len(times) - 1) / ((times[-1] - times[0]) / 1000)
    assert 90 <= rate <= 110, rate
    assert redis.Redis.from_url(REDIS_URL).llen("dq:{default:paced}:ready") == 300


@pytest.mark.process
@pytest.mark.fault
async def test_a_redrive_goes_on_in_another_scanner_after_its_scanner_is_killed(single_rt, scanner_process):
    total = 400
    await fill_dead("killed", total)
    first = scanner_process("first")
    first.wait_started()
    task_id = await create_redrive(single_rt, topic="killed", msg_ids=None, max_per_second=100)

    async def moved_some():
        return wire.redrive_progress(await redrive_state(single_rt, task_id=task_id))["moved"] >= 100

    await wait_until(moved_some, timeout=20, interval=0.05, what="the first scanner's progress")
    first.kill()
    first.proc.wait()
    second = scanner_process("second")
    second.wait_started()

    async def done():
        state = wire.redrive_progress(await redrive_state(single_rt, task_id=task_id))
        return state if state["state"] == "done" else None

    assert await wait_until(done, timeout=30, interval=0.1, what="the redrive") == {
        "moved": total, "left": 0, "state": "done"}
    assert "runs redrive task" in second.output()
    per_message = await query("SELECT msg_id, count(*) FROM delayqueue_messageevent"
                              " WHERE topic = 'killed' AND reason = 'redriven' GROUP BY msg_id")
    assert len(per_message) == total and {count for _id, count in per_message} == {1}  # none twice, none lost
    statuses = await query("SELECT status, count(*) FROM delayqueue_message WHERE topic = 'killed' GROUP BY status")
    assert statuses == [(Status.READY, total)]
    client = redis.Redis.from_url(REDIS_URL)
    ready = client.lrange("dq:{default:killed}:ready", 0, -1)
    assert len(ready) == total and len(set(ready)) == total


@pytest.mark.process
def test_redrive_command_shows_progress_until_done(clean_state, scanner_process, capsys):
    """As an operator's command line: a process for a redrive (progress on stderr, the count on
    stdout), for a refusal by the command (exit 1) and for one by its parser (exit 2). The other
    runs go through the same command's code in this process."""
    asyncio.run(fill_dead("cli", 50))
    scanner = scanner_process("cli")
    scanner.wait_started()
    env = {**os.environ, "DATABASE_URL": log_database_url(),
           **{f"DELAYQUEUE_{k}": str(v) for k, v in TEST_CONFIG.items()}}
    chosen = subprocess.run([sys.executable, "manage.py", "redrive", "--topic", "cli", "--msg-id", "d3",
                             "--msg-id", "d7", "--msg-id", "nope"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert chosen.returncode == 0, chosen.stderr
    assert "100.0% 2/2" in chosen.stderr and chosen.stdout.strip().endswith("redriven 2")
    assert sorted(redis.Redis.from_url(REDIS_URL).lrange("dq:{default:cli}:ready", 0, -1)) == [b"d3", b"d7"]
    missing = subprocess.run([sys.executable, "manage.py", "redrive", "--topic", "cli", "--msg-id", "d3"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "topic cli has no such dead letter" in missing.stderr
    assert "Traceback" not in missing.stderr
    capsys.readouterr()
    call_command("redrive", "--topic", "cli", "--rate", "100")
    out = capsys.readouterr()
    assert "100.0% 48/48" in out.err and out.out.strip().endswith("redriven 48")
    with pytest.raises(CommandError, match="topic cli has no dead letters"):
        call_command("redrive", "--topic", "cli")
    bad = subprocess.run([sys.executable, "manage.py", "redrive", "--topic", "cli", "--rate", "0"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rate: must be at least 1" in bad.stderr and "Traceback" not in bad.stderr
    # Within the parser's bound but over the deployment's cap: refused by the service, in one line.
    over = subprocess.run([sys.executable, "manage.py", "redrive", "--topic", "cli", "--rate", "5000"], cwd=ROOT,
                          env={**env, "DELAYQUEUE_MAX_REDRIVE_RATE": "1000"}, capture_output=True, text=True,
                          timeout=60)
    assert (over.returncode, over.stderr) == (1, "CommandError: maxPerSecond 5000 is over the redrive rate cap: the "
                                                 "cap is 1000 (DELAYQUEUE_MAX_REDRIVE_RATE)\n")
    # Spaces only: no msgId, as the API answers; "\udcff": a byte of argv that is not UTF-8.
    for bad_id, problem in (("", "it is empty"), ("  ", "it is only spaces"), ("bad\udcffbyte", "it has U\\+DCFF")):
        with pytest.raises(CommandError, match=f"--msg-id: .*a msgId must be .*; {problem}"):
            call_command("redrive", "--topic", "cli", "--msg-id", bad_id)


async def test_the_dead_letter_endpoints_over_http(api, single_rt):
    await make_dead(single_rt, "h", exhausted=["a", "b", "c"])
    first = await call(api, "getDeadMsgList", method="get", topic="h", limit="2")
    assert first["code"] == 200 and [m["msgId"] for m in first["delayMsgList"]] == ["a", "b"]
    assert set(first["delayMsgList"][0]) == {"topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime",
                                             "maxRetry", "retry", "status", "deadReason", "deadDetail",
                                             "deadTime"}
    last = await call(api, "getDeadMsgList", method="get", topic="h", cursor=first["nextCursor"])
    assert [m["msgId"] for m in last["delayMsgList"]] == ["c"] and "nextCursor" not in last
    purged = await call(api, "purgeDeadMsg", json={"topic": "h", "msgIds": ["c"]})
    assert purged == {"code": 200, "msg": "success", "count": 1}
    started = await call(api, "redriveDeadMsg", json={"topic": "h", "msgIds": ["a"], "maxPerSecond": 10})
    assert started["code"] == 200
    task = await call(api, "getRedriveTask", method="get", taskId=str(started["taskId"]))
    assert task == {"code": 200, "msg": "success", "moved": 0, "left": 1, "state": "running"}
    assert (await call(api, "redriveDeadMsg", topic="none"))["code"] == 404


async def test_a_nack_reason_is_kept_on_its_history_row_and_shown_as_the_dead_letters_detail(api, single_rt):
    retries = {"once": 0, "d1": 5, "d2": 5, "again": 5, "plain": 5}
    await send_messages(single_rt, requests=[SendRequest("why", f"body of {i}", 0, i, max_retry=m)
                                             for i, m in retries.items()])
    pulled, _ = await pull_messages(single_rt, topic="why", batch=5, ack_timeout_millis=60_000)
    assert len(pulled) == 5
    reason = "ValueError: <b>bad</b> input ünïcode"
    exhausted = await call(api, "ackMsg", topic="why", msgId="once", ack="false", reason=reason)
    batch = await call(api, "ackMsgBatch", json={"topic": "why", "msgIds": ["d1", "d2"], "ack": False,
                                                "deadLetter": True, "reason": "DeadLetter: unknown task"})
    retried = await call(api, "ackMsg", topic="why", msgId="again", ack="false", delayMillis="60000",
                         reason="Retry: later")
    plain = await call(api, "ackMsg", topic="why", msgId="plain", ack="false", deadLetter="true")
    assert exhausted["done"] and retried["done"] and plain["done"]
    assert [r["done"] for r in batch["results"]] == [True, True]
    await drain_log(single_rt, ["why"])
    details = await query("SELECT msg_id, reason, detail FROM delayqueue_messageevent WHERE topic = 'why' "
                          "AND from_status = %s ORDER BY msg_id", Status.CONSUMING)
    assert details == [("again", "nacked", "Retry: later"), ("d1", "dead_lettered", "DeadLetter: unknown task"),
                       ("d2", "dead_lettered", "DeadLetter: unknown task"), ("once", "retries_exhausted", reason),
                       ("plain", "dead_lettered", "")]
    listed = await call(api, "getDeadMsgList", method="get", topic="why")
    assert {m["msgId"]: (m["deadReason"], m["deadDetail"]) for m in listed["delayMsgList"]} == {
        "once": ("retries_exhausted", reason), "d1": ("dead_lettered", "DeadLetter: unknown task"),
        "d2": ("dead_lettered", "DeadLetter: unknown task"), "plain": ("dead_lettered", "")}


@pytest.mark.parametrize("endpoint,params,problem", [
    ("ackMsg", {"topic": "h", "msgId": "a", "ack": True, "reason": "why"}, "reason: only with ack=false"),
    ("ackMsg", {"topic": "h", "msgId": "a", "ack": False, "reason": "x" * 201},
     "reason: Ensure this field has no more than 200 characters."),
    ("ackMsgBatch", {"topic": "h", "msgIds": ["a"], "ack": True, "reason": "why"}, "reason: only with ack=false"),
    ("ackMsgBatch", {"topic": "h", "msgIds": ["a"], "ack": False, "reason": "x" * 201},
     "reason: Ensure this field has no more than 200 characters."),
    ("ackMsgBatch", {"topic": "h", "msgIds": ["a"], "ack": False, "reason": ["x"]}, "reason: Not a valid string."),
])
async def test_a_nack_reason_is_refused_with_ack_true_or_over_its_bound(api, endpoint, params, problem):
    assert await call(api, endpoint, json=params) == {"code": 400, "msg": problem}


@pytest.mark.parametrize("endpoint,how,params,problem", [
    ("getDeadMsgList", "get", {"topic": "h", "limit": "0"}, "limit: Ensure this value is greater than or equal to 1."),
    ("getDeadMsgList", "get", {"topic": "h", "limit": "1001"}, "limit: Ensure this value is less than or equal to 1000."),
    ("getDeadMsgList", "get", {"topic": "h", "cursor": "x"}, "cursor: not a nextCursor that getDeadMsgList answered"),
    ("getDeadMsgList", "get", {}, "topic: This field is required."),
    ("redriveDeadMsg", "post", {"topic": "h", "msgIds": "a"}, "msgIds: must be a JSON list of msgIds, in a JSON body"),
    ("redriveDeadMsg", "json", {"topic": "h", "msgIds": []}, "msgIds: must not be empty"),
    ("redriveDeadMsg", "json", {"topic": "h", "msgIds": [{"id": 1}]}, "msgIds: 0: Not a valid string."),
    ("redriveDeadMsg", "post", {"topic": "h", "maxPerSecond": "0"},
     "maxPerSecond: Ensure this value is greater than or equal to 1."),
    ("getRedriveTask", "get", {"taskId": "abc"}, "taskId: A valid integer is required."),
    ("purgeDeadMsg", "json", {"topic": "h", "msgIds": ["a\n"]}, "msgIds: 0: must not contain control characters"),
    ("purgeDeadMsg", "json", {"msgIds": ["a"]}, "topic: This field is required."),
])
async def test_bad_input_is_code_400_naming_the_parameter(api, endpoint, how, params, problem):
    body = await (call(api, endpoint, json=params) if how == "json" else call(api, endpoint, method=how, **params))
    assert body == {"code": 400, "msg": problem}


async def test_an_unknown_redrive_task_is_code_404(api):
    assert await call(api, "getRedriveTask", method="get", taskId="999999") == {
        "code": 404, "msg": "redrive task 999999 not found"}


# --- The topic's deadLetter setting


async def age(topic: str, msg_id: str, days: int) -> None:
    """The message and its history last changed `days` ago."""
    await query("UPDATE delayqueue_message SET updated_at = now() - %s * interval '1 day'"
                " WHERE topic = %s AND msg_id = %s", days, topic, msg_id)
    await query("UPDATE delayqueue_messageevent SET at = now() - %s * interval '1 day' - interval '1 s'"
                " WHERE topic = %s AND msg_id = %s", days, topic, msg_id)


async def listed(api, topic: str) -> list[str]:
    body = await call(api, "getDeadMsgList", method="get", topic=topic)
    assert body["code"] == 200, body
    return [m["msgId"] for m in body["delayMsgList"]]


@EVERY_LOG_DATABASE
async def test_the_dead_letter_setting_decides_as_it_stands_whether_status_6_messages_are_dead_letters(
        api, single_rt):
    await make_dead(single_rt, "off", exhausted=["old", "young"])
    await make_dead(single_rt, "on", exhausted=["kept"])
    for topic, on in (("off", "false"), ("on", "true")):
        assert (await call(api, "setTopicConfig", topic=topic, deadLetter=on))["data"]["deadLetter"] is (on == "true")
    # Off: its status-6 messages, those that died while it was on included, are not dead letters.
    assert await listed(api, "off") == []
    assert await call(api, "redriveDeadMsg", json={"topic": "off"}) == {
        "code": 404, "msg": "topic off has no dead letters"}
    assert (await call(api, "redriveDeadMsg", json={"topic": "off", "msgIds": ["old"]}))["code"] == 404
    assert await call(api, "purgeDeadMsg", json={"topic": "off"}) == {"code": 200, "msg": "success", "count": 0}
    assert (await logged("off", "old"))["status"] == Status.EXHAUSTED
    # prune_log removes them after the log's ordinary retention; the kept topic's stays for its own.
    await age("off", "old", 10)
    await age("on", "kept", 10)
    assert await sync_to_async(prune_log)(timedelta(days=7)) == (1, 3)  # sent, pulled, retries_exhausted
    assert await logged("off", "old") is None and await logged("on", "kept") is not None
    assert await listed(api, "on") == ["kept"]
    # On again: those not yet pruned are dead letters again, listed and redriven.
    await call(api, "setTopicConfig", topic="off", deadLetter="true")
    assert await listed(api, "off") == ["young"]
    assert (await call(api, "redriveDeadMsg", json={"topic": "off"}))["code"] == 200


async def test_a_redrive_running_when_dead_letters_are_switched_off_moves_no_more(single_rt, start_scanner):
    rt = single_rt
    await fill_dead("switched", 20)
    task_id = await create_redrive(rt, topic="switched", msg_ids=None, max_per_second=500)
    await set_topic_config(rt, topic="switched", changes={"dead_letter": False}, limits={})
    assert wire.redrive_progress(await redrive_state(rt, task_id=task_id)) == {"moved": 0, "left": 0, "state": "running"}
    await start_scanner(rt)

    async def done():
        state = wire.redrive_progress(await redrive_state(rt, task_id=task_id))
        return state if state["state"] == "done" else None

    assert await wait_until(done, timeout=10, what="the redrive") == {"moved": 0, "left": 0, "state": "done"}
    assert await rt.redis.llen(rt.ns.topic("switched").ready) == 0


async def test_after_flushall_and_restore_dead_letters_stay_dead_and_a_redriven_one_is_live(single_rt,
                                                                                           start_scanner):
    rt = single_rt
    await make_dead(rt, "fr", exhausted=["dead", "back"])
    task_id = await create_redrive(rt, topic="fr", msg_ids=["back"], max_per_second=500)
    scanner = await start_scanner(rt)

    async def done():
        return wire.redrive_progress(await redrive_state(rt, task_id=task_id))["state"] == "done"

    await wait_until(done, timeout=10, what="the redrive")
    await scanner.stop()
    await drain_log(rt, ["fr"])
    redriven = await get_message(rt, topic="fr", msg_id="back")
    await rt.redis.flushall()
    counts = await restore(rt)
    assert (counts.restored, counts.already_live, counts.skipped) == (1, 0, 1)
    # The dead letter stays in the log only: not in Redis, still listed as dead.
    assert await get_message(rt, topic="fr", msg_id="dead") is None
    page, _ = await dead_letter_page(rt, topic="fr", limit=10, cursor=None)
    assert [m["msgId"] for m in page] == ["dead"]
    # The redriven one is live again as it was redriven: ready, retry 0, its new life's times.
    back = await get_message(rt, topic="fr", msg_id="back")
    assert back == redriven and back.status == Status.READY and back.retry == 0
    assert await rt.redis.lrange(rt.ns.topic("fr").ready, 0, -1) == ["back"]
    pulled, _ = await pull_messages(rt, topic="fr", batch=10)
    assert [m.msg_id for m in pulled] == ["back"]



@pytest.mark.parametrize("shards", [1, 3])
async def test_a_redrive_into_a_retired_topic_registers_it_again(rt, start_scanner, shards):
    """The dead letters of a topic retired since (idle, nothing in Redis: as fill_dead leaves it) come
    back in a registered topic, as a send's would: listed, and found by every scanner, not only by
    one that heard the new lives' wake."""
    await fill_dead("retired", 6)
    if shards > 1:
        await set_topic_config(rt, topic="retired", changes={"shards": shards}, limits={})
    task_id = await create_redrive(rt, topic="retired", msg_ids=None, max_per_second=500)
    await start_scanner(rt)

    async def done():
        return wire.redrive_progress(await redrive_state(rt, task_id=task_id))["state"] == "done"

    await wait_until(done, timeout=10, what="the redrive")
    assert await list_topics(rt) == ["retired"]
    for shard in topic_shards("retired", (shards,)):  # confirmed: the next send does not register it again
        assert await rt.redis.hget(rt.ns.topic(shard).meta, "registered") in (None, "1")


@pytest.mark.parametrize("shards", [1, 3])
async def test_a_redriven_message_gets_its_ttl_back_though_a_retry_moved_its_trigger_time(single_rt, start_scanner,
                                                                                         shards):
    """A retry's wait moves a message's triggerTime, not its expireTime: a nack's delay past its TTL
    ends it (expired, after a delivery), and a backoff leaves it less time after its last trigger. Its
    new life has the TTL it was sent with again, not what was left after the last trigger (none: the
    new life would expire at once)."""
    rt = single_rt
    await set_topic_config(rt, topic="moved", changes={"shards": shards, "retry_backoff_millis": 100}, limits={})
    await send_messages(rt, requests=[SendRequest("moved", "body", 0, i, ttl_millis=2_000, max_retry=m)
                                      for i, m in (("delayed", 5), ("backed", 1))])
    pulled, _ = await pull_messages(rt, topic="moved", batch=2, ack_timeout_millis=60_000)
    assert len(pulled) == 2
    assert (await nack_message(rt, topic="moved", msg_id="delayed", delay_millis=60_000)).status == Status.WAITING
    assert (await nack_message(rt, topic="moved", msg_id="backed")).status == Status.WAITING  # the topic's backoff
    await start_scanner(rt)

    async def pulled_again():
        return (await pull_messages(rt, topic="moved", ack_timeout_millis=60_000))[0]

    [again] = await wait_until(pulled_again, timeout=10, what="the backed-off message due again")
    assert again.msg_id == "backed" and again.trigger_time > again.produce_time
    assert await nack_message(rt, topic="moved", msg_id="backed") == (True, Status.EXHAUSTED)

    async def both_dead():
        page, _ = await dead_letter_page(rt, topic="moved", limit=10, cursor=None)
        return len(page) == 2 and page

    page = await wait_until(both_dead, timeout=10, what="both dead letters")
    assert {m["msgId"]: m["deadReason"] for m in page} == {"delayed": "expired", "backed": "retries_exhausted"}
    task_id = await create_redrive(rt, topic="moved", msg_ids=None, max_per_second=500)

    async def done():
        return wire.redrive_progress(await redrive_state(rt, task_id=task_id))["state"] == "done"

    await wait_until(done, timeout=10, what="the redrive")
    for msg_id in ("delayed", "backed"):
        back = await get_message(rt, topic="moved", msg_id=msg_id)
        assert back.status == Status.READY and back.expire_time - back.trigger_time == 2_000, back
        assert (await logged("moved", msg_id))["expireTime"] == back.expire_time


async def test_a_scanner_that_lost_its_redrive_lease_leaves_the_next_holders_batch_to_send(single_rt):
    """Scanner a's send outlasted its lease: b took the task over, sent a's batch again (it was
    recorded as sending), and recorded its own. a's send then ends; it must not mark b's batch sent:
    b dies before sending it, and c, who takes over, sends it from the record."""
    rt = single_rt
    await fill_dead("lease", 4)
    task_id = await create_redrive(rt, topic="lease", msg_ids=None, max_per_second=500)
    a, b, c = (Redriver(rt, name) for name in "abc")
    try:
        task_a = await a._claim()
        first = await a._take_batch(task_a, 2)
        await query("UPDATE delayqueue_redrivetask SET lease_until = now() - interval '1 second'")  # a is slow
        task_b = await b._claim()
        assert task_b.sending == first
        await b._send(task_b.topic, task_b.sending, resumed=True)
        await b._finish_sending(task_b)
        assert [m[0] for m in await b._take_batch(task_b, 2)] == ["d3", "d4"]  # then b dies
        await a._send(task_a.topic, first, resumed=False)
        await a._finish_sending(task_a)
        await query("UPDATE delayqueue_redrivetask SET lease_until = now() - interval '1 second'")
        await c._run_task(await c._claim(), asyncio.Event())
    finally:
        for runner in (a, b, c):
            await runner._db.close()
    assert wire.redrive_progress(await redrive_state(rt, task_id=task_id)) == {"moved": 4, "left": 0, "state": "done"}
    assert sorted(await rt.redis.lrange(rt.ns.topic("lease").ready, 0, -1)) == ["d1", "d2", "d3", "d4"]


@pytest.mark.parametrize("shards,resharded", [(1, None), (3, None), (1, 3)], ids=["plain", "sharded", "resharded"])
async def test_a_batch_a_dead_scanner_sent_before_it_recorded_so_is_not_sent_twice(rt, shards, resharded):
    """The scanner died after its batch reached Redis and before `sending` was cleared: the next
    holder finds those lives in Redis (as stored records, not JSON; in the shard count they were
    sent under, if the topic was resharded since) and finishes the task without sending them
    again. It raised on every try instead, and the task never ended."""
    await set_topic_config(rt, topic="resent", changes={"shards": shards}, limits={})
    await fill_dead("resent", 3)
    task_id = await create_redrive(rt, topic="resent", msg_ids=None, max_per_second=500)
    dead, heir = Redriver(rt, "dead"), Redriver(rt, "heir")
    try:
        task = await dead._claim()
        batch = await dead._take_batch(task, 3)
        await dead._send(task.topic, batch, resumed=False)  # then it dies
        if resharded:
            await set_topic_config(rt, topic="resent", changes={"shards": resharded}, limits={})
        await query("UPDATE delayqueue_redrivetask SET lease_until = now() - interval '1 second'")
        await heir._run_task(await heir._claim(), asyncio.Event())
    finally:
        for runner in (dead, heir):
            await runner._db.close()
    assert wire.redrive_progress(await redrive_state(rt, task_id=task_id)) == {"moved": 3, "left": 0, "state": "done"}
    assert (await topic_info(rt, topic="resent")).ready == 3
    pulled, _ = await pull_messages(rt, topic="resent", batch=10)
    assert sorted(m.msg_id for m in pulled) == ["d1", "d2", "d3"]
    assert [(await get_message(rt, topic="resent", msg_id=m.msg_id)).retry for m in pulled] == [1, 1, 1]


async def test_a_dead_letter_is_listed_with_its_priority(api, single_rt):
    """A dead letter is the message as getMsg shows it, its priority too (a redrive keeps it)."""
    sent = await send_message(single_rt, request=SendRequest("prio", "urgent", 0, "p", max_retry=0, priority=7))
    [pulled], _ = await pull_messages(single_rt, topic="prio", ack_timeout_millis=60_000)
    assert await nack_message(single_rt, topic="prio", msg_id="p", reason="bad") == (True, Status.EXHAUSTED)
    await drain_log(single_rt, ["prio"])
    [dead] = (await call(api, "getDeadMsgList", method="get", topic="prio"))["delayMsgList"]
    assert dead["priority"] == 7 and dead == {**sent.to_wire(), "status": Status.EXHAUSTED, "retry": 1,
                                              "deadReason": "retries_exhausted", "deadDetail": "bad",
                                              "deadTime": dead["deadTime"]}
