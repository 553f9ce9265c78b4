"""Rebuilding Redis from the message log: manage.py restore, the restore endpoints, retention."""
import asyncio
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import psycopg
import psycopg.sql
import pytest
import redis
from django.core.management import CommandError, call_command

from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Status
from delayqueue.core.exceptions import LogUnavailable
from delayqueue.core.messages import Message
from delayqueue.messagelog import sql
from delayqueue.messagelog.retention import prune_log
from delayqueue.services import messages as messages_module
from delayqueue.services import restore as restore_service
from delayqueue.services.consume import ack_message, nack_message, pull_messages
from delayqueue.services.messages import delete_message, get_message
from delayqueue.services.restore import restorable, restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import list_topics
from tests.helpers import (EVERY_LOG_DATABASE, REDIS_URL, ROOT, TEST_CONFIG, LoopTurns, drain_log, history,
                           log_database_url, logged, make_runtime, query, redis_readings, stamps)
from tools.stack import free_port

API = "/camellia/delayQueue/"
TOPICS = ["r0", "r1", "r2", "r3"]


async def snapshot(rt, topics) -> dict:
    """Every message Redis holds: its stored fields and which structure holds it."""
    state = {}
    for topic in topics:
        k = rt.ns.topic(topic)
        waiting = dict(await rt.redis.zrange(k.waiting, 0, -1, withscores=True))
        ready = set(await rt.redis.lrange(k.ready, 0, -1))
        inflight = set(await rt.redis.zrange(k.inflight, 0, -1))
        expiry = dict(await rt.redis.zrange(k.expiry, 0, -1, withscores=True))
        for msg_id in await rt.redis.hkeys(k.msgs):
            m = await get_message(rt, topic=topic, msg_id=msg_id)
            where = ("waiting" if msg_id in waiting else "ready" if msg_id in ready
                     else "inflight" if msg_id in inflight else None)
            state[(topic, msg_id)] = {**m.to_wire(), "where": where, "waitingScore": waiting.get(msg_id),
                                      "expiryScore": expiry.get(msg_id)}
    return state


GROUPS = {  # share of each base topic's messages, and the delay they are sent with
    "waiting": (0.2, 3_600_000), "ready": (0.2, 0), "inflight": (0.2, 0), "retried_ready": (0.1, 0),
    "retried_inflight": (0.1, 0), "acked": (0.1, 0), "deleted": (0.05, 0), "expired": (0.05, 0),
}
ALL_TOPICS = [f"{base}.{group}" for base in TOPICS for group in GROUPS]


async def fill_every_state(rt, per_topic: int) -> dict[str, set]:
    """per_topic messages for each base topic, spread over every live and ended state (one
    topic per state, so each pull takes exactly its group)."""
    groups = {name: set() for name in GROUPS}
    for base in TOPICS:
        for group, (share, delay) in GROUPS.items():
            topic, count = f"{base}.{group}", int(per_topic * share)
            ttl = 20 if group == "expired" else 7_200_000
            sent = await send_messages(rt, requests=[
                SendRequest(topic=topic, msg=f"{group}-{i}", delay_millis=delay, ttl_millis=ttl, max_retry=5)
                for i in range(count)])
            groups[group] |= {(topic, m.msg_id) for m in sent}

            async def pull():
                return (await pull_messages(rt, topic=topic, batch=count, ack_timeout_millis=3_600_000))[0]

            async def each(action, messages):
                await asyncio.gather(*(action(rt, topic=topic, msg_id=m.msg_id) for m in messages))

            if group == "inflight":
                await pull()
            elif group in ("retried_ready", "retried_inflight"):
                await each(nack_message, await pull())
                pulled = await pull()
                if group == "retried_ready":
                    await each(nack_message, pulled)
            elif group == "acked":
                await each(ack_message, await pull())
            elif group == "deleted":
                await each(delete_message, sent)
            elif group == "expired":
                await asyncio.sleep(0.05)
                assert await pull() == []  # their TTL ran out before anyone pulled them: ended as expired
    return groups


@pytest.mark.fault
async def test_flushall_then_restore_brings_back_every_live_message_as_it_was(single_rt):
    rt = single_rt
    groups = await fill_every_state(rt, per_topic=2500)  # 10,000 messages
    all_topics = ALL_TOPICS
    await drain_log(rt, all_topics)
    before = await snapshot(rt, all_topics)
    assert {before[key]["where"] for key in groups["inflight"] | groups["retried_inflight"]} == {"inflight"}
    assert {before[key]["retry"] for key in groups["retried_ready"]} == {2}
    assert {before[key]["retry"] for key in groups["retried_inflight"]} == {2}

    await rt.redis.flushall()
    counts = await restore(rt)
    live = groups["waiting"] | groups["ready"] | groups["inflight"] | groups["retried_ready"] | groups["retried_inflight"]
    ended = groups["acked"] | groups["deleted"] | groups["expired"]
    assert (counts.restored, counts.already_live, counts.skipped) == (len(live), 0, len(ended))
    after = await snapshot(rt, all_topics)
    assert set(after) == live  # nothing acked, deleted or expired came back
    for key in live:
        old, new = before[key], after[key]
        for field in ("msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry"):
            assert new[field] == old[field], (key, field)
        # A waiting message is in the expiry index only when its TTL ends before it is due.
        expiring = new["status"] != Status.WAITING or old["expireTime"] < old["triggerTime"]
        assert new["expiryScore"] == (old["expireTime"] if expiring else None), key
    for key in groups["waiting"]:
        assert after[key]["status"] == Status.WAITING and after[key]["waitingScore"] == before[key]["triggerTime"]
    for key in live - groups["waiting"]:  # in-flight ones are ready again
        assert after[key]["status"] == Status.READY and after[key]["where"] == "ready"
    assert set(await list_topics(rt)) >= {t for t, _ in live}

    again = await restore(rt)
    assert (again.restored, again.already_live, again.skipped) == (0, len(live), len(ended))
    assert await snapshot(rt, all_topics) == after
    # Restored messages are delivered like any other, and their history says so.
    key = next(iter(groups["inflight"]))
    await drain_log(rt, ALL_TOPICS)
    assert (await history(*key))[-1] == ("restored", 0, Status.READY, before[key]["retry"])
    assert (await logged(*key))["status"] == Status.READY
    # One 'restored' row per restored message, saying what Redis made of it, and the log's
    # message rows moved to that status (in-flight ones to ready).
    rows = await query("SELECT topic, msg_id, to_status, retry FROM delayqueue_messageevent WHERE reason = 'restored'")
    assert len(rows) == len(live)
    assert {(t, i): (s, r) for t, i, s, r in rows} == {key: (after[key]["status"], after[key]["retry"]) for key in live}
    statuses = await query("SELECT topic, msg_id, status FROM delayqueue_message WHERE status = ANY(%s)",
                           [Status.WAITING, Status.READY, Status.CONSUMING])
    assert {(t, i): s for t, i, s in statuses} == {key: after[key]["status"] for key in live}


@pytest.mark.fault
async def test_a_restore_registers_a_page_of_thousands_of_topics(clean_state):
    """A page of the log spans as many topics as it has rows: register_topics.lua takes them in
    one call, more than Lua's unpack() holds at once."""
    rt = make_runtime(REDIS_URL, max_topics=10_000)
    try:
        topics = [f"many{i}" for i in range(4500)]
        for start in range(0, len(topics), 500):
            await send_messages(rt, requests=[SendRequest(topic=topic, msg="x", delay_millis=3_600_000)
                                              for topic in topics[start:start + 500]])
        await rt.redis.flushall()
        counts = await restore(rt)
        assert counts.restored == len(topics)
        assert set(await list_topics(rt)) == set(topics)  # the scanners find every one
    finally:
        await rt.close()


async def test_a_restore_asks_whether_a_shard_is_draining_once_a_slice_and_gives_the_loop_back_between(single_rt,
                                                                                                       monkeypatch):
    """Every restored message is one the log holds live, whose shard's count change (if any has begun)
    decides where it goes: a page of 10,000 rows of a few topics asked it 10,000 times, most of the page's
    time and a stall of the event loop, for as many shards. And a page is read and built a slice of rows
    between two returns to the event loop: read and built whole, it held the web process' loop, and every
    other namespace's request on it, 40-70 ms."""
    await query(FILL_LOG, 2_000)  # 4 topics, one page
    turns, read, built = LoopTurns(), Counter(), Counter()  # per turn, the log rows made and the rows built
    make_dict_row = restore_service.dict_row
    monkeypatch.setattr(restore_service, "dict_row", lambda cursor: turns.counting(read, make_dict_row(cursor)))
    monkeypatch.setattr(restore_service, "restorable", turns.counting(built, restore_service.restorable))
    await single_rt.redis.config_resetstat()
    async with turns:
        assert (await restore(single_rt)).restored == 2_000
    hget = (await single_rt.redis.info("commandstats")).get("cmdstat_hget", {"calls": 0})
    assert hget["calls"] < 100
    assert sum(read.values()) == sum(built.values()) == 2_000
    assert max(read.values()) <= restore_service.ROWS_PER_TURN
    assert max(built.values()) <= restore_service.ROWS_PER_TURN


async def test_a_pull_during_a_restore_is_sent_behind_a_few_of_its_calls_not_every_call_of_its_pages(single_rt):
    """The process' requests share the restore's Redis connection, which Redis serves in order: a pull sent
    while restore calls are in flight runs after all of them. The restore sends a page's calls a few at a
    time; all at once (20 of 500 messages a page), another namespace's pulls waited up to 430 ms."""
    await query(FILL_LOG, 20_000)  # two pages
    other = single_rt.for_namespace("other")
    restoring, behind = 0, []  # restore calls sent and not answered; that, as each pull was sent
    run, call = single_rt.scripts.run, single_rt.scripts.call

    async def running(calls):
        nonlocal restoring
        n = sum(one.script.name == "restore" for one in calls)
        restoring += n
        try:
            return await run(calls)
        finally:
            restoring -= n

    async def calling(one):
        if one.script.name == "pull":
            behind.append(restoring)
        return await call(one)

    single_rt.scripts.run, single_rt.scripts.call = running, calling
    restoring_done = asyncio.Event()

    async def pull_meanwhile():
        while not restoring_done.is_set():
            await pull_messages(other, topic="o", batch=1)

    pulls = asyncio.ensure_future(pull_meanwhile())
    assert (await restore(single_rt)).restored == 20_000
    restoring_done.set()
    await pulls
    assert any(behind), "no pull was sent while the restore's calls were in flight"
    assert max(behind) <= restore_service.PAGES_IN_FLIGHT * restore_service.CALLS_PER_TRIP


async def test_restore_runs_on_a_cluster_too(rt):
    sent = await send_messages(rt, requests=[SendRequest(topic=f"c{i % 7}", msg=str(i), delay_millis=(i % 2) * 60_000)
                                             for i in range(70)])
    before = {m.msg_id: m for m in sent}
    await drain_log(rt, [f"c{i}" for i in range(7)])
    for topic in range(7):
        k = rt.ns.topic(f"c{topic}")
        await rt.redis.delete(k.waiting, k.ready, k.msgs, k.expiry)
    counts = await restore(rt)
    assert counts.restored == 70
    for msg_id, m in before.items():
        assert await get_message(rt, topic=m.topic, msg_id=msg_id) == m


@pytest.mark.fault
async def test_restore_while_sends_continue_loses_nothing(single_rt):
    rt = single_rt
    old = await send_messages(rt, requests=[SendRequest(topic="busy", msg=str(i), delay_millis=60_000)
                                            for i in range(3000)])
    await rt.redis.flushall()
    new = []

    async def keep_sending():
        for i in range(30):
            new.extend(await send_messages(
                rt, requests=[SendRequest(topic="busy", msg=f"n{i}-{j}", delay_millis=60_000) for j in range(20)]))
            await asyncio.sleep(0.003)

    sending = asyncio.ensure_future(keep_sending())
    counts = await restore(rt)
    await sending
    # Every old message restored; a new one whose log row the restore read before its own send
    # reached Redis may be restored too (its send then finds it live and answers with it).
    assert 3000 <= counts.restored and counts.restored + counts.already_live <= 3600
    k = rt.ns.topic("busy")
    assert await rt.redis.zcard(k.waiting) == 3000 + 600
    for m in old[:50] + new[:50]:
        assert (await get_message(rt, topic="busy", msg_id=m.msg_id)).payload == m.payload


@pytest.mark.fault
async def test_restore_scope_options_and_dry_run(single_rt):
    rt = single_rt
    a = await send_message(rt, request=SendRequest(topic="a", msg="a", delay_millis=0))
    b = await send_messages(rt, requests=[SendRequest(topic="b", msg=str(i), delay_millis=0) for i in range(3)])
    await send_message(rt, request=SendRequest(topic="c", msg="c", delay_millis=60_000))
    await rt.redis.flushall()
    dry = await restore(rt, dry_run=True)
    assert (dry.restored, dry.already_live) == (5, 0)
    assert await rt.redis.keys("dq:{*") == []
    one = await restore(rt, msg_id=b[1].msg_id)
    assert one.restored == 1 and await get_message(rt, topic="b", msg_id=b[0].msg_id) is None
    assert not await rt.redis.exists(rt.ns.topic("c").meta)  # only the topic holding the msgId is touched
    assert (await restore(rt, topic="b", msg_id=b[1].msg_id)).already_live == 1
    topic = await restore(rt, topic="b")
    assert (topic.restored, topic.already_live) == (2, 1)
    assert await get_message(rt, topic="a", msg_id=a.msg_id) is None


@pytest.mark.fault
async def test_include_expired_brings_back_undelivered_expired_messages_with_a_fresh_ttl(single_rt):
    rt = single_rt
    # A TTL long enough that the restored message's, counted from the restore, outlasts the checks.
    m = await send_message(rt, request=SendRequest(topic="x", msg="late", delay_millis=0, ttl_millis=1_000))
    await asyncio.sleep(1.05)
    assert (await pull_messages(rt, topic="x"))[0] == []  # ends it: expired, never delivered
    await drain_log(rt, ["x"])
    await rt.redis.flushall()
    assert (await restore(rt)).skipped == 1
    counts = await restore(rt, include_expired=True)
    assert counts.restored == 1
    back = await get_message(rt, topic="x", msg_id=m.msg_id)
    assert back.status == Status.READY and back.expire_time - back.trigger_time >= 1_000
    [pulled], _ = await pull_messages(rt, topic="x")
    assert pulled.payload == "late"
    await drain_log(rt, ["x"])
    # The log takes the fresh TTL too: after a second loss, a restore would find it expired by its old one.
    assert (await logged("x", m.msg_id))["expireTime"] == back.expire_time


@pytest.mark.fault
async def test_include_expired_gives_a_message_whose_retry_wait_passed_its_ttl_the_ttl_it_was_sent_with(single_rt):
    """A nack's delay moved its triggerTime past its expireTime (which a retry's wait leaves alone),
    and Redis was lost before it fell due: the TTL anew is the one it was sent with, 1 s, not
    what its last trigger left (nothing: it came back with 1 ms and died at once)."""
    rt = single_rt
    m = await send_message(rt, request=SendRequest(topic="x", msg="slow", delay_millis=0, ttl_millis=1_000))
    assert (await pull_messages(rt, topic="x"))[0]
    assert (await nack_message(rt, topic="x", msg_id=m.msg_id, delay_millis=1_100)).done
    await drain_log(rt, ["x"])
    await rt.redis.flushall()
    await asyncio.sleep(1.15)  # past its trigger and its expireTime
    restored_at = now_millis()
    assert (await restore(rt, include_expired=True)).restored == 1
    back = await get_message(rt, topic="x", msg_id=m.msg_id)
    assert (back.status, back.retry) == (Status.READY, 1)
    assert back.expire_time >= restored_at + 1_000
    [pulled], _ = await pull_messages(rt, topic="x")
    assert pulled.payload == "slow"


async def test_a_delete_with_release_during_a_restore_is_not_undone(single_rt, monkeypatch):
    """The restore read the message's row (live) before the delete, which released its body, so
    Redis held nothing of it when the restore wrote its page: brought back, it would be delivered
    though deleted."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "x", 60_000, "gone"))
    write = restore_service.restore_rows

    async def deleted_meanwhile(rt_, **kwargs):
        assert await delete_message(rt, topic="t", msg_id="gone", release=True)
        return await write(rt_, **kwargs)

    monkeypatch.setattr(restore_service, "restore_rows", deleted_meanwhile)
    counts = await restore(rt)
    assert (counts.restored, counts.already_live) == (0, 1)
    assert await get_message(rt, topic="t", msg_id="gone") is None
    await drain_log(rt, ["t"])
    assert (await logged("t", "gone"))["status"] == Status.DELETED


# Waiting, ready, beyond the hot window; and deleted with release, which writes no body into Redis.
@pytest.mark.parametrize("delay, release", [(60_000, False), (0, False), (7_200_000, False), (60_000, True)])
async def test_a_delete_between_a_loss_and_the_restore_is_not_undone(single_rt, monkeypatch, delay, release):
    """Redis lost the message, the log holds it live: the delete finds it in neither Redis nor the
    cold tier, and the restore must not bring it back to be delivered though deleted."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "x", delay, "gone"))
    await drain_log(rt, ["t"])
    await rt.redis.flushall()
    readings = redis_readings(monkeypatch, messages_module)
    assert await delete_message(rt, topic="t", msg_id="gone", release=release)
    assert await stamps("t", "gone") == readings[-1:] * 2
    counts = await restore(rt)
    assert (counts.restored, counts.left_cold) == (0, 0)
    kept = await get_message(rt, topic="t", msg_id="gone")
    assert kept is None if release else (kept.status, kept.payload) == (Status.DELETED, "x")
    if not release:  # the tombstone, without the body: the log keeps it, deleted, and getMsg reads it from there
        assert Message.from_stored(await rt.redis.hget(rt.ns.topic("t").msgs, "gone"), "gone").payload == ""
    assert (await logged("t", "gone"))["status"] == Status.DELETED
    assert not await delete_message(rt, topic="t", msg_id="gone", release=release)


@pytest.mark.fault
async def test_a_delete_of_a_lost_message_that_postgresql_failed_part_way_is_finished_by_its_retry(clean_state):
    """Redis lost the message, the log holds it live, and the log fails the delete (its row locked
    past the statement timeout): the retry deletes it, so a restore does not bring it back."""
    rt = make_runtime(REDIS_URL, log_timeout_millis=500)
    try:
        await send_message(rt, request=SendRequest("t", "x", 60_000, "gone"))
        await rt.redis.flushall()
        async with await psycopg.AsyncConnection.connect(log_database_url()) as locker:
            await locker.execute("LOCK TABLE delayqueue_message IN EXCLUSIVE MODE")  # reads pass, writes wait
            with pytest.raises(LogUnavailable):
                await delete_message(rt, topic="t", msg_id="gone")
        assert await delete_message(rt, topic="t", msg_id="gone")
        assert (await logged("t", "gone"))["status"] == Status.DELETED
        await rt.redis.flushall()  # the tombstone's retention over
        assert (await restore(rt)).restored == 0
    finally:
        await rt.close()


@pytest.mark.fault
async def test_restore_endpoints(api, single_rt):
    sent = (await api.post(API + "sendMsg", data={"topic": "h", "msg": "m", "delayMillis": 60_000})).json()["delayMsg"]
    await single_rt.redis.flushall()
    missing = (await api.get(API + "restoreMsg", params={"topic": "h", "msgId": "nope"})).json()
    assert missing["code"] == 404 and "nope" in missing["msg"]
    unknown = (await api.get(API + "restore", params={"topic": "never"})).json()
    assert unknown["code"] == 404 and "never" in unknown["msg"]
    bad = (await api.get(API + "restore", params={"expire": "perhaps"})).json()
    assert bad["code"] == 400 and "expire" in bad["msg"]
    one = (await api.get(API + "restoreMsg", params={"topic": "h", "msgId": sent["msgId"]})).json()
    assert (one["code"], one["restored"], one["alreadyLive"]) == (200, 1, 0)
    everything = (await api.post(API + "restore", data={"expire": "false"})).json()
    assert (everything["code"], everything["restored"], everything["alreadyLive"]) == (200, 0, 1)
    got = (await api.get(API + "getMsg", params={"topic": "h", "msgId": sent["msgId"]})).json()
    assert got["delayMsg"] == sent


def manage(*args, **env_overrides):
    env = {**os.environ, "DATABASE_URL": log_database_url(), **{f"DELAYQUEUE_{k}": str(v) for k, v in TEST_CONFIG.items()},
           **env_overrides}
    # 150,000 rows restored on a loaded 2-core machine have taken 60 s.
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


def restore_in_process(*args) -> str:
    """manage.py restore's handling (its parser, its checks, its output) through call_command,
    in this process: its stdout. A refusal raises the CommandError that a process prints as
    one line and exits with."""
    out = io.StringIO()
    call_command("restore", *args, stdout=out)
    return out.getvalue()


@pytest.mark.process
@pytest.mark.fault
def test_restore_command_prints_counts_and_refuses_bad_options(clean_state, settings):
    """The command line as an operator meets it: a process for a restore (its counts on stdout,
    its progress on stderr), for a refusal by the command (exit 1) and for one by its parser
    (exit 2), each a line without a traceback. The other refusals and counts go through the
    same command's code in this process."""
    async def setup():
        rt = make_runtime(REDIS_URL)
        await send_messages(rt, requests=[SendRequest(topic="cli", msg=str(i), delay_millis=0) for i in range(5)])
        await rt.redis.flushall()
        await rt.close()

    asyncio.run(setup())
    assert "would restore 5, already live 0" in restore_in_process("--dry-run")
    done = manage("restore", "--topic", "cli")
    assert done.returncode == 0 and "restored 5, already live 0, skipped (ended or expired) 0" in done.stdout
    assert "100.0%" in done.stderr  # the progress report
    assert "restored 0, already live 5" in restore_in_process()

    for scope in (["--topic", "never"], ["--topic", "cli", "--msg-id", "nope"], ["--msg-id", "nope"]):
        with pytest.raises(CommandError) as unknown:
            restore_in_process(*scope)
        assert f"no message in the message log matches {' '.join(scope)}" in str(unknown.value)

    bad_topic = manage("restore", "--topic", "no\ttabs")
    assert bad_topic.returncode == 2 and "Traceback" not in bad_topic.stderr
    assert "argument --topic: 'no\\ttabs': a topic must be 1-255 bytes of UTF-8 text without control characters; " \
           "it has U+0009" in bad_topic.stderr
    with pytest.raises(CommandError, match="unrecognized arguments: --bogus"):
        restore_in_process("--bogus")
    # A byte of argv that is not UTF-8 (a surrogate in Python) reached the log's driver, which
    # raised; a control character is no msgId either (the API refuses it). The parser refuses both.
    for msg_id, refused in (("bad\udcffbyte", "U\\+DCFF"), ("a\x01b", "U\\+0001")):
        with pytest.raises(CommandError, match=f"argument --msg-id: .*a msgId must be UTF-8 text without control "
                                               f"characters, 1-256 characters long; it has {refused}"):
            restore_in_process("--msg-id", msg_id)
    no_log = manage("restore", DATABASE_URL="postgres://postgres@127.0.0.1:1/none")
    assert no_log.returncode == 1 and "message log unavailable" in no_log.stderr and "Traceback" not in no_log.stderr
    # A refused connection is retried (Redis may be restarting) until the timeout.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 300}
    with pytest.raises(CommandError, match="^redis unavailable"):
        restore_in_process()


@EVERY_LOG_DATABASE
def test_prune_log_deletes_old_ended_messages_and_their_history_only(clean_state):
    async def setup():
        rt = make_runtime(REDIS_URL)
        done = await send_messages(rt, requests=[SendRequest(topic="p", msg=str(i), delay_millis=0) for i in range(6)])
        pulled, _ = await pull_messages(rt, topic="p", batch=4)
        for m in pulled:
            await ack_message(rt, topic="p", msg_id=m.msg_id)
        await drain_log(rt, ["p"])
        await rt.close()
        return done

    asyncio.run(setup())
    asyncio.run(query("UPDATE delayqueue_message SET updated_at = updated_at - interval '10 days'"))
    asyncio.run(query("UPDATE delayqueue_messageevent SET at = at - interval '10 days'"))
    assert prune_log(timedelta(days=30)) == (0, 0)
    assert prune_log(timedelta(days=7), batch=3) == (4, 12)  # 4 acked: sent, pulled, acked each
    statuses = sorted(r[0] for r in asyncio.run(query("SELECT status FROM delayqueue_message")))
    assert statuses == [Status.READY, Status.READY]
    assert asyncio.run(query("SELECT count(*) FROM delayqueue_messageevent"))[0][0] == 2
    out = manage("prune_log", "--older-than-days", "0")  # the command line: exit 2, one line
    assert out.returncode == 2 and "--older-than-days: must be at least 1, got 0" in out.stderr
    assert "Traceback" not in out.stderr
    # Past bigint PostgreSQL refused it: exit 1, "message log unavailable".
    out = manage("prune_log", "--batch", "99999999999999999999")
    assert out.returncode == 2 and "--batch: must be at most 1000000, got 99999999999999999999" in out.stderr
    with pytest.raises(CommandError, match="--older-than-days: must be at most 36500 days"):  # the same parser
        call_command("prune_log", "--older-than-days", "99999999999")
    call_command("prune_log", "--older-than-days", "1")  # nothing left to prune, still fine


@pytest.mark.process
def test_prune_log_says_in_one_line_that_postgresql_is_unreachable():
    # psycopg's error has a second line ("Is the server running on that host ..."): not printed.
    out = manage("prune_log", DATABASE_URL=f"postgres://postgres:secret@127.0.0.1:{free_port()}/delayqueue")
    assert out.returncode == 1 and out.stdout == ""
    assert re.fullmatch(r"CommandError: message log unavailable: connection failed: .*Connection refused\n",
                        out.stderr)


def test_which_logged_rows_are_restored(clean_state):
    row = {"status": Status.CONSUMING, "expire_time": 10_000, "trigger_time": 1_000, "ttl": 9_000}
    assert restorable(row, now=5_000, include_expired=False) == row
    assert restorable(row, now=20_000, include_expired=False) is None  # its TTL ran out
    assert restorable(row, now=20_000, include_expired=True)["expire_time"] == 29_000  # TTL anew
    assert restorable({**row, "status": 4}, now=5_000, include_expired=True) is None  # acked


FILL_LOG = """
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'bulk' || (g %% 4), 'm' || g, 'payload ' || g, now(),
       now() + (CASE WHEN g %% 2 = 0 THEN interval '1 hour' ELSE interval '0' END), now() + interval '1 day',
       10, 0, 1 + g %% 2, now()
FROM generate_series(1, %s) AS g
"""


@pytest.mark.process
def test_a_restore_interrupted_by_ctrl_c_leaves_nothing_half_done_and_a_rerun_finishes_it(clean_state):
    total = 60_000
    asyncio.run(query(FILL_LOG, total))
    client = redis.Redis.from_url(REDIS_URL)
    topics = [f"bulk{i}" for i in range(4)]
    env = {**os.environ, "DATABASE_URL": log_database_url()}
    proc = subprocess.Popen([sys.executable, "manage.py", "restore"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while sum(client.hlen(f"dq:{{default:{t}}}:msgs") for t in topics) == 0:
        assert proc.poll() is None and time.monotonic() < deadline, "restore did not start writing"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    held = sum(client.hlen(f"dq:{{default:{t}}}:msgs") for t in topics)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert 0 < held < total, f"the interrupt landed outside the restore ({held} restored)"
    for t in topics:  # every message Redis holds is whole: body, waiting or ready, and a ready one's expiry entry
        k = f"dq:{{default:{t}}}:"
        bodies = {m.decode() for m in client.hkeys(k + "msgs")}
        ready = {m.decode() for m in client.lrange(k + "ready", 0, -1)}
        queued = {m.decode() for m in client.zrange(k + "waiting", 0, -1)} | ready
        assert bodies == queued and ready <= {m.decode() for m in client.zrange(k + "expiry", 0, -1)}
    rerun = manage("restore")
    assert f"restored {total - held}, already live {held}," in rerun.stdout
    assert sum(client.hlen(f"dq:{{default:{t}}}:msgs") for t in topics) == total
    client.close()


@pytest.mark.process
@pytest.mark.fault
def test_a_restore_the_log_stops_answering_ends_in_a_plain_error(clean_state):
    """A statement of the restore's that PostgreSQL times out (here: held by a lock) ends the
    command with exit code 1 and one line, not a traceback."""
    async def setup():
        rt = make_runtime(REDIS_URL)
        await send_messages(rt, requests=[SendRequest(topic="locked", msg="m", delay_millis=0)])
        await rt.close()

    asyncio.run(setup())
    with psycopg.connect(log_database_url().replace("postgres://", "postgresql://")) as locker:
        locker.execute("LOCK TABLE delayqueue_message IN ACCESS EXCLUSIVE MODE")
        stuck = manage("restore", DELAYQUEUE_LOG_TIMEOUT_MILLIS="500")
    assert stuck.returncode == 1, stuck.stderr
    assert "message log unavailable" in stuck.stderr and "statement timeout" in stuck.stderr
    assert "Traceback" not in stuck.stderr


async def test_restore_scan_and_retention_use_their_partial_indexes(single_rt):
    """Their statuses are rendered into the text (messagelog.sql) so the planner matches the
    predicates of message_live, message_ended and message_dead; with sequential scans off, EXPLAIN
    names them."""
    scope, candidates, params = sql.restore_scope("default", None, None, include_expired=False)
    async with await psycopg.AsyncConnection.connect(log_database_url(), autocommit=True) as conn:
        # A log of mostly ended messages, as a real one is, analysed: the partial indexes are then
        # the cheapest plans by far, whatever statistics earlier tests left behind. Truncated first:
        # the dead index entries of rows earlier tests deleted would weigh on the partial index' cost.
        await conn.execute("TRUNCATE delayqueue_message")
        await conn.execute(
            "INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time,"
            " expire_time, max_retry, retry, status, updated_at)"
            " SELECT 'default', 't', 'm' || n, '', now(), now(), now(), 0, 0, CASE WHEN n %% 500 = 0 THEN %s ELSE %s END,"
            " now() FROM generate_series(1, 5000) n", [Status.WAITING, Status.ACKED])
        await conn.execute("ANALYZE delayqueue_message")
        await conn.execute("SET enable_seqscan = off")
        for statement, args, index in [
            (sql.restore_page(scope, candidates), {**params, "after": 0, "limit": 10}, "message_live"),
            (psycopg.sql.SQL(sql.HOLDS_LIVE), ["default"], "message_live"),
            (psycopg.sql.SQL(sql.DELETE_ENDED_MESSAGES),
             {"before": datetime.now(timezone.utc), "since": datetime.min.replace(tzinfo=timezone.utc),
              "dead": Status.EXHAUSTED, "dead_letters": False, "batch": 10}, "message_ended"),
            (psycopg.sql.SQL(sql.DEAD_PAGE),
             {"namespace": "default", "topic": "t", "msg_ids": None, "after": None, "after_id": 0, "limit": 10},
             "message_dead"),
        ]:
            plan = await (await conn.execute(psycopg.sql.SQL("EXPLAIN ") + statement, args)).fetchall()
            assert index in "\n".join(line for line, in plan), plan
