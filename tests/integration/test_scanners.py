"""`manage.py run_scanners` as real processes: cooperation, SIGKILL take-over, SIGTERM."""
import asyncio
import signal
import time
from collections import Counter

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue.api import wire
from delayqueue.core.clock import now_millis
from delayqueue.live import stats
from delayqueue.live.keys import Shard
from delayqueue.runtime import SCANNER_PASSES_IN_FLIGHT
from delayqueue.services.consume import ack_message, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import topic_info
from delayqueue.workers.scanner import STATS_CALLS_PER_TRIP
from tests.helpers import REDIS_URL, make_runtime, wait_until


async def drain(rt, topics, expected, timeout=30):
    """Pulls (and acks) until `expected` messages were delivered; returns every delivery."""
    delivered = []
    deadline = time.monotonic() + timeout
    while len(delivered) < expected and time.monotonic() < deadline:
        got_any = False
        for topic in topics:
            messages, _ = await pull_messages(rt, topic=topic, batch=500)
            for m in messages:
                delivered.append(m)
                await ack_message(rt, topic=topic, msg_id=m.msg_id)
            got_any = got_any or bool(messages)
        if not got_any:
            await asyncio.sleep(0.02)
    return delivered


@pytest.mark.process
async def test_two_scanner_processes_promote_each_message_once(single_rt, scanner_process):
    rt = single_rt
    topics = [f"t{i}" for i in range(8)]
    a, b = scanner_process("a"), scanner_process("b")
    a.wait_started(), b.wait_started()
    messages = [SendRequest(topic=topics[i % 8], msg=str(i), delay_millis=200 + (i % 50) * 20) for i in range(2000)]
    await send_messages(rt, requests=messages)
    delivered = await drain(rt, topics, 2000)
    counts = Counter(m.payload for m in delivered)
    assert len(counts) == 2000 and set(counts.values()) == {1}
    assert all(m.retry == 1 for m in delivered)  # first delivery each: nothing promoted twice


@pytest.mark.process
async def test_two_scanners_sharing_one_lock_token_still_promote_once(single_rt, scanner_process):
    """Both believe they hold every lock (as a scanner resuming from a long pause would):
    atomic scripts alone must keep each message promoted once."""
    rt = single_rt
    a, b = scanner_process("same"), scanner_process("same")
    a.wait_started(), b.wait_started()
    messages = [SendRequest(topic="shared", msg=str(i), delay_millis=100 + i) for i in range(1000)]
    await send_messages(rt, requests=messages)
    delivered = await drain(rt, ["shared"], 1000)
    counts = Counter(m.payload for m in delivered)
    assert len(counts) == 1000 and set(counts.values()) == {1}
    info = wire.topic_info(await topic_info(rt, topic="shared"))
    assert (info["waitingQueueSize"], info["readyQueueSize"]) == (0, 0)


@pytest.mark.process
async def test_sigkill_mid_run_another_scanner_takes_over_within_the_lock_ttl(long_retention_rt, scanner_process,
                                                                              settings):
    rt = long_retention_rt  # its acks are read back after the drain, seconds later on a loaded machine
    lock_ttl = settings.DELAYQUEUE["SCANNER_LOCK_TTL_MILLIS"] / 1000
    a = scanner_process("a")
    a.wait_started()
    await send_message(rt, request=SendRequest(topic="k", msg="warm-up", delay_millis=0))
    await wait_until(lambda: rt.redis.get(rt.ns.topic("k").lock), what="scanner a to take topic k")
    b = scanner_process("b")
    b.wait_started()
    assert await rt.redis.get(rt.ns.topic("k").lock) == "a"
    # A steady stream of due messages; kill a while they flow.
    sends = [await send_message(rt, request=SendRequest(topic="k", msg=str(i), delay_millis=100 + 50 * i))
             for i in range(40)]
    await asyncio.sleep(0.5)
    a.kill(signal.SIGKILL)
    killed_at = time.time() * 1000
    delivered = await drain(rt, ["k"], 41, timeout=30)
    assert sorted(m.payload for m in delivered) == sorted(["warm-up", *[str(i) for i in range(40)]])
    assert await rt.redis.get(rt.ns.topic("k").lock) == "b"
    # No due message waited longer than the lock TTL (plus scheduling slack) for promotion.
    due_after_kill = [m for m in sends if m.trigger_time > killed_at]
    assert due_after_kill
    for m in due_after_kill:
        stored = await get_message(rt, topic="k", msg_id=m.msg_id)
        assert stored.status == 4
    stats = await rt.redis.hgetall(rt.ns.topic("k").stats)
    max_ready_gap = max(int(v) for f, v in stats.items() if f.endswith("readyGap:max"))
    assert max_ready_gap <= lock_ttl * 1000 + 1000, max_ready_gap


@pytest.mark.process
async def test_sigterm_stops_cleanly_and_releases_locks(single_rt, scanner_process):
    rt = single_rt
    a = scanner_process("a")
    a.wait_started()
    await send_message(rt, request=SendRequest(topic="term", msg="x", delay_millis=0))
    await wait_until(lambda: rt.redis.get(rt.ns.topic("term").lock), what="scanner to take the topic")
    assert a.stop() == 0
    assert await rt.redis.get(rt.ns.topic("term").lock) is None
    assert "stopped" in a.output()


async def test_scanner_precision_single_message(single_rt, start_scanner):
    """A due message is promoted within a few ms of its triggerTime (sleep-until-due, not a tick).
    Only checks that it is promoted on time-ish; the figures are in bench/fire_lateness.py."""
    rt = single_rt
    await start_scanner(rt)
    sent = await send_message(rt, request=SendRequest(topic="p", msg="x", delay_millis=500))

    async def ready():
        return (await get_message(rt, topic="p", msg_id=sent.msg_id)).status == 2

    await wait_until(ready, timeout=5, interval=0.005, what="promotion")

    async def gaps():  # the scanner writes what its promotions counted once a second
        stats = await rt.redis.hgetall(rt.ns.topic("p").stats)
        return [int(v) for f, v in stats.items() if f.endswith("readyGap:max")]

    [gap] = await wait_until(gaps, what="the promotion to be counted")
    assert gap < 500  # far inside a whole delay: it was not waiting for a coarse tick


async def test_a_scanner_writes_what_its_promotions_counted_within_a_second_and_when_it_stops(single_rt,
                                                                                             start_scanner):
    rt = single_rt
    scanner = await start_scanner(rt)
    ready_total = stats.field("total", name=stats.Counter.READY)

    async def counted():
        return int(await rt.redis.hget(rt.ns.topic("c").stats, ready_total) or 0)

    async def ready(n):
        return (await topic_info(rt, topic="c")).ready == n

    await send_messages(rt, requests=[SendRequest(topic="c", msg="x", delay_millis=300) for _ in range(3)])
    await wait_until(lambda: ready(3), what="promotion")
    await wait_until(lambda: _equal(counted(), 3), timeout=3, what="the promotions to be counted")
    await send_message(rt, request=SendRequest(topic="c", msg="x", delay_millis=300))
    await wait_until(lambda: ready(4), interval=0.002, what="promotion")
    await scanner.stop()  # within the second: what it counted since is written as it stops
    assert await counted() == 4


async def _equal(value, expected) -> bool:
    return await value == expected


async def test_a_topic_runs_only_the_scripts_that_have_work_and_all_of_them_on_a_wake(single_rt, start_scanner):
    """The scripts run on the real Redis; the spy only records which ones each pass ran."""
    rt = single_rt
    passes = []
    run = rt.scripts.run

    async def recording(calls):
        names = [call.script.name for call in calls if call.keys and call.keys[0].startswith("dq:{default:s}")]
        if names and names[0] != "lock_renew":
            passes.append(names)
        return await run(calls)

    first = await send_message(rt, request=SendRequest(topic="s", msg="x", delay_millis=700))
    rt.scripts.run = recording  # from here on: the scanner's passes
    await start_scanner(rt)

    async def ready(message):
        return (await get_message(rt, topic="s", msg_id=message.msg_id)).status == 2

    await wait_until(lambda: ready(first), timeout=5, interval=0.005, what="the first promotion")
    everything = ["unpack_due", "promote_due", "requeue_timed_out", "expire", "purge_ended"]
    assert passes[0] == everything  # a new worker looks at everything
    assert passes[-1] == ["promote_due"]  # woken for the due message: nothing else had work
    # A send due before anything the topic sleeps towards wakes it through the schedule channel.
    await send_message(rt, request=SendRequest(topic="s", msg="later", delay_millis=60_000))
    woken = len(passes)
    earlier = await send_message(rt, request=SendRequest(topic="s", msg="sooner", delay_millis=300))

    async def woke():
        return len(passes) > woken

    await wait_until(woke, timeout=2, what="the wake")
    assert passes[woken] == everything
    await wait_until(lambda: ready(earlier), timeout=5, interval=0.005, what="the second promotion")
    assert passes[-1] == ["promote_due"]


async def test_namespaces_with_many_topics_due_at_once_do_not_hold_up_another_namespaces_promotion(clean_state,
                                                                                                     start_scanner):
    """The scanners of one process share its Redis connection, as under run_scanners. Four busy namespaces' 100
    topics each fall due at once, a pass of 50 messages each; a quiet namespace's message falls due 10 ms later,
    well inside the busy backlog's drain. Each ready list's first message is published on its namespace's ready
    channel, so one subscriber hears the promotions in the order Redis ran them. The busy promotions heard before
    the quiet one, less those answered before its call was sent, are the busy calls it was sent behind: fewer
    than the process' bound on passes in flight (64 while each namespace had 16 of its own; all 400 while the
    busy topics queued all their calls at once). What ran before it was sent depends on the machine's speed.
    The busy scanners' stats prune and fold, a call per topic, go a few dozen calls a round trip too."""
    root = make_runtime(REDIS_URL, message_log=False)
    busy, quiet = [root.for_namespace(f"busy{i}") for i in range(4)], root.for_namespace("quiet")
    trips = {"prune_stats": [], "fold_stats": []}  # the number of such calls in each round trip
    busy_channels = {rt.ns.ready_channel for rt in busy}  # a promote_due call's ARGV[4]
    answered = 0  # busy promotions that promoted, answered
    answered_before_quiet = []  # `answered` as the quiet promotion's call was sent
    run = root.scripts.run

    async def recording(calls):
        nonlocal answered
        for name, sizes in trips.items():
            if n := sum(call.script.name == name for call in calls):
                sizes.append(n)
        answered_then = answered
        replies = await run(calls)
        for call, reply in zip(calls, replies):
            if call.script.name == "promote_due" and not isinstance(reply, Exception) and reply.count:
                if call.args[3] in busy_channels:
                    answered += 1
                elif call.args[3] == quiet.ns.ready_channel:
                    answered_before_quiet.append(answered_then)
        return replies

    root.scripts.run = recording
    scanners = [await start_scanner(rt) for rt in (*busy, quiet)]
    topics = [f"a{i}" for i in range(100)]
    # Held before the backlog is sent, so the backlog's due time need not allow for taking them too.
    for rt in busy:
        await send_messages(rt, requests=[SendRequest(topic=topic, msg="later", delay_millis=60_000)
                                          for topic in topics])
    await send_message(quiet, request=SendRequest(topic="q", msg="later", delay_millis=60_000))

    async def held():
        return all(len(running.scanner.workers) == (1 if running is scanners[-1] else len(topics))
                   for running in scanners)

    await wait_until(held, what="the scanners to hold every topic")
    pubsub = root.redis.pubsub()
    await pubsub.subscribe(*(rt.ns.ready_channel for rt in (*busy, quiet)))
    # 20,000 sends: about a second, several on a machine busy with other test processes.
    due = now_millis() + 4000
    await asyncio.gather(*(send_messages(rt, requests=[SendRequest(topic=topic, msg="x", trigger_time=due)
                                                       for topic in topics for _ in range(50)]) for rt in busy))
    await send_message(quiet, request=SendRequest(topic="q", msg="x", trigger_time=due + 10))
    assert now_millis() < due - 200, "the sends took too long for the test to say anything"
    busy_before = 0
    async with asyncio.timeout(10):
        async for message in pubsub.listen():
            if message["type"] != "message":
                continue
            if message["channel"] == quiet.ns.ready_channel:
                break
            busy_before += 1
    await pubsub.aclose()
    await wait_until(lambda: asyncio.sleep(0, answered_before_quiet), what="the quiet promotion's answer")
    assert busy_before - answered_before_quiet[0] < SCANNER_PASSES_IN_FLIGHT

    async def pruned_and_folded():  # every held topic's stats pruned, and the promoted ones' folded
        return all(sum(sizes) >= len(busy) * len(topics) for sizes in trips.values())

    await wait_until(pruned_and_folded, timeout=5, what="the stats prune and fold")
    assert max(trips["prune_stats"] + trips["fold_stats"]) <= STATS_CALLS_PER_TRIP
    for running in scanners:  # before the runtime they run on closes
        await running.stop()
    await root.close()


@pytest.mark.process
@pytest.mark.fault
async def test_a_standby_takes_over_a_killed_holders_topic_within_a_second_not_the_lock_ttl(single_rt, scanner_process):
    """The lock TTL is 10 s here: only watching the holder's heartbeat can take over in time."""
    rt = single_rt
    env = {"DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS": 10_000}
    a = scanner_process("a", **env)
    a.wait_started()
    await send_message(rt, request=SendRequest(topic="k", msg="warm-up", delay_millis=0))
    await wait_until(lambda: rt.redis.get(rt.ns.topic("k").lock), what="scanner a to take topic k")
    b = scanner_process("b", **env)
    b.wait_started()
    await asyncio.sleep(1.5)  # b has tried the lock and knows who holds it
    assert await rt.redis.get(rt.ns.topic("k").lock) == "a"
    a.kill(signal.SIGKILL)
    killed_at = time.monotonic()
    sent = await send_message(rt, request=SendRequest(topic="k", msg="due after the kill", delay_millis=300))

    async def promoted():
        return (await get_message(rt, topic="k", msg_id=sent.msg_id)).status == 2

    await wait_until(promoted, timeout=15, interval=0.005, what="the message to be promoted")
    taken_after = time.monotonic() - killed_at
    assert taken_after < 1.5, f"promoted {taken_after:.2f} s after the kill"  # the lock had 10 s left
    assert await rt.redis.get(rt.ns.topic("k").lock) == "b"
    assert "took over topic k from a, which is gone" in b.output()


@pytest.mark.process
async def test_a_standby_takes_a_topic_released_by_sigterm_at_once(single_rt, scanner_process):
    rt = single_rt
    env = {"DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS": 10_000}
    a, b = scanner_process("a", **env), scanner_process("b", **env)
    a.wait_started()
    await send_message(rt, request=SendRequest(topic="k", msg="warm-up", delay_millis=0))
    await wait_until(lambda: rt.redis.get(rt.ns.topic("k").lock), what="a scanner to take topic k")
    b.wait_started()
    await asyncio.sleep(1.5)
    holder = await rt.redis.get(rt.ns.topic("k").lock)
    standby = b if holder == "a" else a
    assert (a if holder == "a" else b).stop() == 0
    stopped_at = time.monotonic()  # from its exit: how long the stop itself takes is the machine's load

    async def taken():
        return await rt.redis.get(rt.ns.topic("k").lock) == standby.name

    await wait_until(taken, timeout=15, interval=0.01, what="the standby to take the topic")
    assert time.monotonic() - stopped_at < 5  # released, not waited out: well under the 10 s lock TTL


async def test_a_renewal_that_failed_leaves_the_lock_to_its_holder_which_takes_it_back_at_once(single_rt, start_scanner,
                                                                                          monkeypatch):
    """A renewal answered with an error stops the topic's worker, yet the lock still names this
    scanner: it takes it back at its next look, not after the lock's TTL (no other can meanwhile)."""
    rt = single_rt
    await send_message(rt, request=SendRequest(topic="t", msg="m", delay_millis=60_000))
    scanner = (await start_scanner(rt)).scanner

    async def held():
        return Shard("t") in scanner.workers

    await wait_until(held, what="the scanner to hold topic t")
    real_run = rt.scripts.run

    async def renewals_fail(calls):
        return [RedisConnectionError("connection to Redis lost")] * len(calls)

    monkeypatch.setattr(rt.scripts, "run", renewals_fail)
    await scanner._renew()
    monkeypatch.setattr(rt.scripts, "run", real_run)
    assert not await held() and await rt.redis.get(rt.ns.topic("t").lock) == scanner.token
    await scanner._acquire(time.monotonic())
    assert await held()
