"""Redis failing under a running service. Restarted (a crash, an upgrade, a failover to an
empty replica): script calls reconnect and load the scripts again, held long polls are woken
again and the scanner carries on. Hung (paused, or a network that drops packets): calls fail
after the configured timeout instead of waiting forever. Emptied: a scanner reports the loss
until a full restore. The restart and hang tests use a Redis of their own, not the suite's."""
import asyncio
import os
import signal
import socket
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.core.exceptions import MaybeSent, RedisUnavailable
from delayqueue.live import runners
from delayqueue.live.runners import ScriptRunner
from delayqueue.services.consume import long_poll_messages, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topics import list_topics
from tests.helpers import REDIS_URL, logged, make_runtime, query, wait_until
from tools.stack import Services, free_port

API = "/camellia/delayQueue/"


# Every test here takes Redis away under the code: restarted, hung, unreachable or emptied.
pytestmark = pytest.mark.fault


class RestartableRedis:
    def __init__(self, base):
        self.services = Services(base, durable=False)
        self.port = free_port()
        self.url = self.services.single_redis(self.port)

    def _process(self):
        return next(proc for _, proc, _ in self.services.procs if proc.poll() is None)

    def pause(self) -> None:
        """Redis stops answering; its connections stay open (the kernel still takes the writes)."""
        self._process().send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._process().send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Kills Redis (its data goes with it) and starts an empty one on the same port."""
        for _, proc, _ in self.services.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        self.services.procs.clear()
        self.services.redis("redis", self.port)


@pytest.fixture
def restartable_redis(server_dir):
    redis = RestartableRedis(server_dir)
    yield redis
    redis.resume()  # a paused Redis would not stop on SIGTERM
    redis.services.stop()


async def test_calls_reconnect_and_reload_the_scripts_after_a_restart(restartable_redis):
    rt = make_runtime(restartable_redis.url, message_log=False)
    try:
        before = await send_message(rt, request=SendRequest(topic="t", msg="before", delay_millis=0))
        restartable_redis.restart()
        # The first call finds its connection gone and the new Redis without the scripts.
        after = await send_message(rt, request=SendRequest(topic="t", msg="after", delay_millis=0))
        assert after.status == 2
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert [m.payload for m in pulled] == ["after"]  # "before" went with the old Redis
        assert before.msg_id != after.msg_id
    finally:
        await rt.close()


async def test_a_poll_held_across_a_restart_is_woken_by_a_message_due_after_it(restartable_redis, start_scanner):
    rt = make_runtime(restartable_redis.url, message_log=False)
    try:
        await start_scanner(rt)
        hold_seconds = 20
        poll = asyncio.ensure_future(long_poll_messages(rt, topic="t", batch=1, ack_timeout_millis=-1, timeout_millis=hold_seconds * 1000))
        notifier = await rt.notifier()

        async def held():
            return notifier.waiting("t") == 1

        await wait_until(held, what="the poll to be held")

        restartable_redis.restart()
        sent_at = time.monotonic()
        sent = await send_message(rt, request=SendRequest(topic="t", msg="after", delay_millis=300))
        assert sent.status == 1  # waiting: only the scanner, on the new Redis, can make it due

        messages = await asyncio.wait_for(poll, hold_seconds)
        assert [m.payload for m in messages] == ["after"]
        # Woken when the message fell due, not by the final pull at the end of the hold.
        assert time.monotonic() - sent_at < hold_seconds / 2
    finally:
        await rt.close()



@pytest.mark.process
async def test_a_scanner_process_carries_on_after_a_restart_and_stops_on_sigterm(restartable_redis, scanner_process):
    rt = make_runtime(restartable_redis.url, message_log=False)
    scanner = scanner_process("restart", REDIS_URL=restartable_redis.url, DELAYQUEUE_MESSAGE_LOG=0)
    try:
        scanner.wait_started()
        before = await send_message(rt, request=SendRequest(topic="t", msg="before", delay_millis=100))
        await wait_until(lambda: promoted(rt, before), what="the first message to be promoted")

        restartable_redis.restart()
        after = await send_message(rt, request=SendRequest(topic="t", msg="after", delay_millis=300))
        assert after.status == 1
        await wait_until(lambda: promoted(rt, after), what="a message sent after the restart to be promoted")
    finally:
        await rt.close()
    assert scanner.stop() == 0, scanner.output()  # SIGTERM: a clean exit


async def promoted(rt, message) -> bool:
    stored = await get_message(rt, topic=message.topic, msg_id=message.msg_id)
    return stored is not None and stored.status == 2

async def test_stopping_right_after_a_restart_never_hangs(restartable_redis, start_scanner):
    """Stopping while the listeners reconnect: a cancellation that redis-py's wait_for drops
    (Python 3.11) left the stop waiting forever at one of these delays."""
    for delay in (0, 0.0005, 0.001, 0.001, 0.0015, 0.0015, 0.002, 0.003, 0.005, 0.01):
        rt = make_runtime(restartable_redis.url, message_log=False)
        scanner = await start_scanner(rt)
        await rt.notifier()
        restartable_redis.restart()
        await asyncio.sleep(delay)
        for stopping in (rt.close(), scanner.stop()):  # the notifier's listener; the scanner's tasks
            task = asyncio.ensure_future(stopping)
            await asyncio.wait({task}, timeout=10)
            assert task.done(), f"still stopping 10 s after a restart and {delay * 1000} ms"
            task.result()


async def test_a_hung_redis_fails_calls_after_the_timeout_then_they_work_again(clean_state, restartable_redis):
    rt = make_runtime(restartable_redis.url, redis_timeout_millis=500)  # the message log on
    try:
        await send_message(rt, request=SendRequest(topic="t", msg="before", delay_millis=0))
        restartable_redis.pause()
        try:
            # Script calls (the direct runner) and redis-py's commands alike; the outer bound only
            # keeps a regression from hanging the suite.
            with pytest.raises(MaybeSent, match="send it again with msgId maybe"):
                await asyncio.wait_for(send_message(
                    rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="maybe")), 30)
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(list_topics(rt), 30)
        finally:
            restartable_redis.resume()
        # Redis may have run the send after all (here it did, once it could read it): the log
        # kept its row, and sending it again under its msgId enqueues it once either way.
        assert (await logged("t", "maybe"))["msg"] == "x"
        again = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="maybe"))
        assert again.msg_id == "maybe"
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert [m.payload for m in pulled] == ["before", "x"]
    finally:
        await rt.close()


async def test_a_send_whose_connection_broke_after_redis_ran_it_and_stayed_down_may_have_been_sent(
        clean_state, monkeypatch):
    """The send reached Redis and ran, then its connection broke and Redis could not be reached
    again before the timeout (a partition, a slow restart from the append-only file): it may have
    been enqueued, so it keeps its log row and its answer says so, as a timed-out send's does."""
    rt = make_runtime(REDIS_URL, redis_timeout_millis=300)
    try:
        await send_message(rt, request=SendRequest(topic="t", msg="before", delay_millis=60_000))
        protocol, tries = rt.scripts._protocol, []  # the script connection, which the first send opened
        monkeypatch.setattr(protocol, "data_received", lambda _reply: protocol.transport.abort())  # Redis ran it

        async def refused(_url, _timeout):
            tries.append(_url)
            raise RedisConnectionError("cannot connect to Redis: [Errno 111] Connection refused")

        monkeypatch.setattr(runners, "connect_direct", refused)
        with pytest.raises(MaybeSent, match="send it again with msgId lost"):
            await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=60_000, msg_id="lost"))
        monkeypatch.undo()
        assert tries  # it was tried again
        assert (await get_message(rt, topic="t", msg_id="lost")).payload == "x"  # Redis holds it: so does the log
        assert (await logged("t", "lost"))["msg"] == "x"
    finally:
        await rt.close()


async def test_a_hung_redis_answers_sends_with_code_500_over_http(restartable_redis, api, settings):
    settings.REDIS_URL = restartable_redis.url
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 500, "MESSAGE_LOG": False}
    form = {"topic": "t", "msg": "x", "delayMillis": 0}
    assert (await api.post(API + "sendMsg", data=form)).json()["code"] == 200
    restartable_redis.pause()
    try:
        reply = (await api.post(API + "sendMsg", data=form)).json()
    finally:
        restartable_redis.resume()
    assert reply["code"] == 500 and reply["msg"].startswith(
        "redis unavailable: timed out; the message may have been enqueued: send it again with msgId ")
    assert (await api.post(API + "sendMsg", data=form)).json()["code"] == 200


@pytest.fixture
def unanswering_redis_url():
    """A redis:// URL whose host takes no new connection (a host that drops packets): a listener
    whose accept queue is full, so the kernel ignores further connection attempts."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    while True:  # fill the accept queue until a connection attempt goes unanswered
        probe = socket.socket()
        probe.settimeout(0.3)
        fillers.append(probe)
        try:
            probe.connect(("127.0.0.1", port))
        except TimeoutError:
            break
        assert len(fillers) < 10, "the kernel kept accepting connections on a full queue"
    yield f"redis://127.0.0.1:{port}/0"
    for sock in (*fillers, listener):
        sock.close()


async def test_a_redis_that_takes_no_connection_fails_sends_after_the_timeout(unanswering_redis_url, api, settings):
    rt = make_runtime(unanswering_redis_url, redis_timeout_millis=500)  # the message log on
    try:
        # The outer bound only keeps a regression from hanging the suite.
        with pytest.raises(RedisUnavailable, match="^redis unavailable: timed out$") as refused:
            await asyncio.wait_for(send_message(
                rt, request=SendRequest(topic="t", msg="x", delay_millis=0, msg_id="never")), 30)
        assert refused.value.detail == "cannot connect to Redis: no answer within 0.5 s"  # for the log
        with pytest.raises(RedisTimeoutError, match="Timeout connecting"):
            await asyncio.wait_for(list_topics(rt), 30)
    finally:
        await rt.close()
    assert await logged("t", "never") is None  # Redis cannot have taken it: the log keeps nothing of it
    settings.REDIS_URL = unanswering_redis_url
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 500}
    reply = (await api.post(API + "sendMsg", data={"topic": "t", "msg": "x", "delayMillis": 0})).json()
    assert reply == {"code": 500, "msg": "redis unavailable: timed out"}


@pytest.mark.parametrize("credentials", [":not-its-password@", ""], ids=["wrong password", "no password"])
async def test_a_redis_that_refuses_the_password_answers_authentication_failed(credentials, clean_state):
    """Not 'connection refused', which sends an operator looking for a server that is not running;
    and at once: a refused password is not retried for the whole Redis timeout (here 60 s)."""
    parts = urlsplit(REDIS_URL)
    rt = make_runtime(urlunsplit(parts._replace(netloc=credentials + parts.netloc.rpartition("@")[2])),
                      redis_timeout_millis=60_000)
    try:
        with pytest.raises(RedisUnavailable, match="^redis unavailable: authentication failed$"):
            await asyncio.wait_for(send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=0)), 10)
    finally:
        await rt.close()


async def test_a_held_poll_is_not_cut_by_the_redis_timeout(restartable_redis, caplog):
    """The timeout bounds commands, not the wait for the next pub/sub message: a listener must
    not drop and renew its subscription every time nothing was published for that long."""
    rt = make_runtime(restartable_redis.url, message_log=False, redis_timeout_millis=300)
    try:
        poll = asyncio.ensure_future(long_poll_messages(rt, topic="t", batch=1, ack_timeout_millis=-1, timeout_millis=20_000))
        await asyncio.sleep(1.5)  # five timeouts with nothing published
        assert not poll.done()
        assert not [r.getMessage() for r in caplog.records if "subscription" in r.getMessage()]
        await send_message(rt, request=SendRequest(topic="t", msg="now", delay_millis=0))
        messages = await asyncio.wait_for(poll, 5)  # woken, well before the 20 s hold ends
        assert [m.payload for m in messages] == ["now"]
    finally:
        await rt.close()


def _lost_reports(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Redis lost its data")]


async def _data_lost_gauge(api) -> float:
    for line in (await api.get("/metrics")).text.splitlines():
        if line.startswith('delayqueue_redis_data_lost_timestamp_seconds{namespace="default"} '):
            return float(line.split()[1])
    raise AssertionError("no delayqueue_redis_data_lost_timestamp_seconds in /metrics")


async def test_a_scanner_reports_redis_losing_its_data_until_a_full_restore(single_rt, start_scanner, api, caplog):
    rt = single_rt
    await send_messages(rt, requests=[SendRequest(topic="t", msg=str(i), delay_millis=60_000) for i in range(3)])
    await start_scanner(rt)

    async def marked():
        return await rt.redis.exists(rt.ns.marker)

    async def reported():
        return await rt.redis.get(rt.ns.data_lost)

    await wait_until(marked, what="the scanner to set the marker")
    assert await _data_lost_gauge(api) == 0 and not _lost_reports(caplog)

    await rt.redis.flushall()  # Redis loses everything under the running scanner
    await wait_until(reported, what="the scanner to report the loss")
    assert _lost_reports(caplog) == ["Redis lost its data (its marker key vanished while this scanner ran): "
                                     "run `manage.py restore` to bring back the messages the log holds"]
    assert await _data_lost_gauge(api) > 0

    partial = await restore(rt, topic="t")
    assert partial.restored == 3 and await reported()  # only a full restore answers the report
    full = await restore(rt)
    assert full.already_live == 3 and not await reported()
    assert await _data_lost_gauge(api) == 0


async def test_a_full_restore_before_the_scanner_looks_again_leaves_no_report_behind(single_rt, start_scanner, caplog):
    """The restore sets the marker: a scanner's next look (once a second) finds Redis holding its data."""
    rt = single_rt
    await send_messages(rt, requests=[SendRequest(topic="t", msg=str(i), delay_millis=60_000) for i in range(3)])
    await start_scanner(rt)

    async def marked():
        return await rt.redis.exists(rt.ns.marker)

    await wait_until(marked, what="the scanner to set the marker")
    await rt.redis.flushall()
    assert (await restore(rt)).restored == 3
    await asyncio.sleep(1.5)  # a look or two later
    assert await rt.redis.get(rt.ns.data_lost) is None


async def test_a_scanner_started_on_an_emptied_redis_reports_the_live_messages_of_the_log(
        single_rt, start_scanner, caplog):
    rt = single_rt
    await send_messages(rt, requests=[SendRequest(topic="t", msg="m", delay_millis=60_000)])
    await rt.redis.flushall()  # lost before any scanner ran

    async def reported():
        return await rt.redis.get(rt.ns.data_lost)

    await start_scanner(rt)
    await wait_until(reported, what="the scanner to report the loss")
    assert [m.split(":")[0] for m in _lost_reports(caplog)] == [
        "Redis lost its data (it held no topic and no marker key while the message log holds live messages)"]


async def test_no_loss_is_reported_for_a_new_redis_or_sends_made_before_the_first_scanner(
        single_rt, start_scanner, caplog):
    rt = single_rt
    await send_messages(rt, requests=[SendRequest(topic="t", msg="m", delay_millis=60_000)])  # no scanner yet
    await start_scanner(rt)

    async def marked():
        return await rt.redis.exists(rt.ns.marker)

    await wait_until(marked, what="the scanner to set the marker")
    await asyncio.sleep(1.5)  # a check or two later
    assert await rt.redis.get(rt.ns.data_lost) is None and not _lost_reports(caplog)



@pytest.fixture
def loading_redis(server_dir):
    """A Redis with an append-only file fsynced on every write, and a filler of 20 MB in its RDB
    preamble; restarted with a delay per key loaded, it answers LOADING for a couple of seconds
    (every 2 MB of the file, when Redis 6.2 looks at its clients while loading)."""
    services = Services(server_dir, durable=True)
    port = free_port()
    url = f"redis://:{services.redis_password}@127.0.0.1:{port}/0"
    services.redis("redis", port, "--appendfsync", "always")
    filler = redis.Redis(port=port, db=1, password=services.redis_password)
    for start in range(0, 20_000, 1000):
        filler.mset({f"filler:{i}": os.urandom(1000) for i in range(start, start + 1000)})
    filler.bgrewriteaof()
    while filler.info("persistence")["aof_rewrite_in_progress"] or filler.info("persistence")["aof_rewrite_scheduled"]:
        time.sleep(0.05)
    filler.close()

    def restart():
        for _, proc, _ in services.procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        services.procs.clear()
        services.redis("redis", port, "--appendfsync", "always", "--key-load-delay", "100")

    yield url, restart
    services.stop()


@pytest.mark.parametrize("runner", ["direct", "redis-py"])
async def test_sends_ride_out_a_restart_and_loading_and_are_each_enqueued_once(clean_state, loading_redis, runner):
    """Both script runners: the direct connection (a plain Redis) and redis-py's pipeline (what
    a Cluster, a Sentinel's master and TLS use)."""
    url, restart = loading_redis
    # The message log on. The calls' deadline (10 s by default) must outlast the kill, the start
    # and the loading, which take several times as long on a loaded machine: a minute.
    rt = make_runtime(url, redis_timeout_millis=60_000)
    if runner == "redis-py":
        rt.scripts = ScriptRunner(rt.redis, rt.config.redis_timeout)
    answers, stop, started = [], asyncio.Event(), set()

    async def all_started():
        return len(started) == 8

    async def producer(n):
        i = 0
        while not stop.is_set():
            try:
                answers.append(await send_message(rt, request=SendRequest(topic="t", msg=f"{n}-{i}", delay_millis=60_000)))
            except Exception as exc:
                answers.append(exc)
            started.add(n)
            i += 1

    try:
        producers = [asyncio.ensure_future(producer(n)) for n in range(8)]
        # Every producer's first send answered before the restart (a fixed 0.3 s saw none on a
        # loaded machine): the first sends open the connections.
        await wait_until(all_started, timeout=30, what="every producer's first send")
        before = len(answers)
        await asyncio.get_running_loop().run_in_executor(None, restart)  # SIGKILL, then a Redis that loads
        loading_since = time.monotonic()
        probe = redis.asyncio.Redis.from_url(url)
        saw_loading = False
        while time.monotonic() - loading_since < 10:
            try:
                await probe.get("x")
                break
            except redis.exceptions.BusyLoadingError:
                saw_loading = True
            except redis.exceptions.ConnectionError:
                pass
            await asyncio.sleep(0.05)
        await probe.aclose()
        loaded_after = time.monotonic() - loading_since
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*producers)
    finally:
        await rt.close()
    assert saw_loading and loaded_after > 1, "Redis did not answer LOADING for a while"
    failures = [a for a in answers if isinstance(a, Exception)]
    assert not failures, failures[:3]
    assert before > 0 and len(answers) > before + 8  # sends were in flight across the restart and went on
    sent = {a.msg_id: a.payload for a in answers}
    assert len(sent) == len(answers)
    # Each answered send is in Redis once and in the log once, with one 'sent' history row.
    check = redis.Redis.from_url(url, decode_responses=True)
    keys = rt.ns.topic("t")
    assert check.zcard(keys.waiting) == check.hlen(keys.msgs) == len(sent)
    assert set(check.zrange(keys.waiting, 0, -1)) == set(sent)
    check.close()
    rows = await query("SELECT msg_id, payload FROM delayqueue_message WHERE topic = 't'")
    assert dict(rows) == sent
    history_rows = await query("SELECT msg_id, count(*) FROM delayqueue_messageevent WHERE topic = 't'"
                               " AND reason = 'sent' GROUP BY msg_id")
    assert dict(history_rows) == dict.fromkeys(sent, 1)


async def test_a_send_whose_topic_cannot_be_registered_says_so_and_sending_it_again_registers_it(
        single_rt, start_scanner):
    """Redis runs the send but fails the registry write after it (here a registry of the wrong
    type; in life a restart between the two): the message would never fall due, as no scanner
    would find its topic. The answer says so, and the same send again repairs it."""
    rt = single_rt
    request = SendRequest(topic="unlisted", msg="x", delay_millis=200, msg_id="m-1")
    await rt.redis.set(rt.ns.topics, "not a sorted set")
    with pytest.raises(MaybeSent, match="could not be registered.*msgId m-1"):
        await send_message(rt, request=request)
    await rt.redis.delete(rt.ns.topics)
    # Another topic's send registers only its own; the unlisted topic's next send registers it.
    await send_message(rt, request=SendRequest(topic="other", msg="y", delay_millis=60_000))
    assert await rt.redis.zscore(rt.ns.topics, "unlisted") is None
    again = await send_message(rt, request=request)
    assert again.msg_id == "m-1" and await rt.redis.zscore(rt.ns.topics, "unlisted") is not None
    assert await rt.redis.hget(rt.ns.topic("unlisted").meta, "registered") == "1"
    await start_scanner(rt)

    async def due():
        return (await get_message(rt, topic="unlisted", msg_id="m-1")).status == 2

    await wait_until(due, timeout=10, what="the message to fall due")
