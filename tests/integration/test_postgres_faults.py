"""PostgreSQL (the message log) failing under sends. Restarted (a fast shutdown and a start,
as an upgrade or a failover does): the sends made meanwhile wait for it and are each stored and
delivered once, for a client that never retries. Down for longer than
DELAYQUEUE_LOG_RETRY_MILLIS: sends fail with code 500, the first after about that long, the
later ones at once until PostgreSQL is back. A write whose answer was lost after PostgreSQL
committed it: the retry stores it once."""
import asyncio
import contextlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from delayqueue_client import Client
from django.db import connections
from psycopg.conninfo import make_conninfo

from delayqueue.core.retry import MAX_RETRY_BACKOFF
from delayqueue.messagelog import connection
from delayqueue.services.consume import ack_message, pull_messages
from tests.helpers import API, logged, query, wait_until

pytestmark = pytest.mark.fault

RATE = 300  # sends a second, steady whatever the answers take
TOPIC = "pg"
# The sends' wait for the log in these tests: the 2.5 s default outlasts a fast restart on an
# idle machine, but a stop and start take several times as long on a loaded one.
PATIENT_LOG = {"DELAYQUEUE_LOG_RETRY_MILLIS": 60_000}


async def send_steadily(send_one, stop: asyncio.Event) -> list:
    """Calls `send_one(i)` RATE times a second, each without waiting for the earlier ones to be
    answered, until `stop`; the answers (or errors) and when each send began."""
    loop = asyncio.get_running_loop()
    started, sends = loop.time(), []

    async def timed(i):
        began = time.monotonic()
        try:
            return began, await send_one(i)
        except Exception as exc:
            return began, exc

    while not stop.is_set():
        sends.append(asyncio.ensure_future(timed(len(sends))))
        await asyncio.sleep(max(0.0, started + len(sends) / RATE - loop.time()))
    return await asyncio.gather(*sends)


async def restart_under_sends(postgres, send_one, answered_ok) -> tuple[list, float, float]:
    """Sends steadily; once some are answered, restarts PostgreSQL (fast shutdown, start), and
    goes on for a second after it is back. The sends, and when PostgreSQL was down (monotonic)."""
    stop = asyncio.Event()
    sending = asyncio.ensure_future(send_steadily(send_one, stop))
    try:
        await wait_until(answered_ok, timeout=60, what="the first sends to be answered")
        stop_began = time.monotonic()
        await asyncio.to_thread(postgres.stop)
        await asyncio.to_thread(postgres.start)
        back_at = time.monotonic()
        await asyncio.sleep(1)  # sends after the restart, on connections made again
    finally:
        stop.set()
        sends = await sending
    return sends, stop_began, back_at


async def deliver_all(rt, expected: set[str]) -> Counter:
    """Pulls and acks until every expected msgId came (a scanner promotes the delayed ones);
    how many times each msgId was delivered, counting a last pull that finds nothing more."""
    deliveries = Counter()

    async def all_delivered():
        messages, _ = await pull_messages(rt, topic=TOPIC, batch=500)
        for m in messages:
            deliveries[m.msg_id] += 1
            await ack_message(rt, topic=TOPIC, msg_id=m.msg_id)
        return expected <= set(deliveries)

    await wait_until(all_delivered, timeout=60, interval=0.05, what="every sent message to be delivered")
    more, _ = await pull_messages(rt, topic=TOPIC, batch=500)
    deliveries.update(m.msg_id for m in more)
    return deliveries


async def check_each_stored_and_delivered_once(rt, sends, stop_began, back_at) -> None:
    """Every send answered with its message, none lost or doubled: in the log once with one
    'sent' history row, delivered once. Sends were made while PostgreSQL was down."""
    failures = [(began, answer) for began, answer in sends if isinstance(answer, Exception)]
    assert not failures, f"{len(failures)} of {len(sends)} sends failed, first: {failures[:3]}"
    during = [began for began, _ in sends if stop_began <= began <= back_at]
    assert during and any(began > back_at for began, _ in sends), "no send was made during and after the restart"
    sent = {answer: began for began, answer in sends}
    assert len(sent) == len(sends)  # one msgId per send
    deliveries = await deliver_all(rt, set(sent))
    assert set(deliveries) == set(sent), f"lost: {len(set(sent) - set(deliveries))}"
    doubled = [msg_id for msg_id, count in deliveries.items() if count > 1]
    assert not doubled, f"{len(doubled)} delivered twice, e.g. {doubled[:3]}"
    rows = await query("SELECT msg_id, count(*) FROM delayqueue_message WHERE topic = %s GROUP BY msg_id", TOPIC)
    assert dict(rows) == dict.fromkeys(sent, 1)
    history_rows = await query("SELECT msg_id, count(*) FROM delayqueue_messageevent WHERE topic = %s"
                               " AND reason = 'sent' GROUP BY msg_id", TOPIC)
    assert dict(history_rows) == dict.fromkeys(sent, 1)


def delay_of(i: int) -> int:
    """Some due at once, some for the scanner to promote."""
    return (i % 4) * 150


class SendFailed(Exception):
    pass


@pytest.mark.process
async def test_sends_over_http_ride_out_a_postgres_restart_and_are_each_delivered_once(
        single_rt, start_scanner, web_processes, postgres):
    (web,) = web_processes(1, **PATIENT_LOG)
    await start_scanner(single_rt)
    ok = 0
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=web.url, timeout=120, limits=limits) as http:
        async def send_one(i):  # one try: a client that never retries
            nonlocal ok
            reply = (await http.post(API + "sendMsg", data={"topic": TOPIC, "msg": f"m{i}",
                                                            "delayMillis": delay_of(i)})).json()
            if reply["code"] != 200:
                raise SendFailed(reply)
            ok += 1
            return reply["delayMsg"]["msgId"]

        async def answered_ok():
            return ok >= 100

        sends, stop_began, back_at = await restart_under_sends(postgres, send_one, answered_ok)
    await check_each_stored_and_delivered_once(single_rt, sends, stop_began, back_at)


@pytest.mark.process
async def test_sdk_sends_without_retries_ride_out_a_postgres_restart_and_are_each_delivered_once(
        single_rt, start_scanner, web_processes, postgres):
    """The SDK's Client with its retries off (max_retries=0): the server alone rides it out."""
    (web,) = web_processes(1, **PATIENT_LOG)
    await start_scanner(single_rt)
    loop, ok = asyncio.get_running_loop(), 0
    # A thread per send in flight: during the restart a few hundred wait at once.
    with Client(web.url, max_retries=0, timeout=120) as client, ThreadPoolExecutor(1000) as threads:
        async def send_one(i):
            nonlocal ok
            message = await loop.run_in_executor(threads, lambda: client.send(TOPIC, f"m{i}", delay_ms=delay_of(i)))
            ok += 1
            return message.msg_id

        async def answered_ok():
            return ok >= 100

        sends, stop_began, back_at = await restart_under_sends(postgres, send_one, answered_ok)
    await check_each_stored_and_delivered_once(single_rt, sends, stop_began, back_at)


async def test_postgres_down_past_the_retry_bound_fails_sends_with_code_500_after_it(api, single_rt, postgres,
                                                                                      settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "LOG_RETRY_MILLIS": 1_000}
    postgres.stop()
    try:
        message = {"topic": "t", "msg": "x", "delayMillis": 0}
        began = time.monotonic()
        # The outer bound only keeps a regression from hanging the suite.
        reply = (await asyncio.wait_for(api.post(API + "sendMsg", data=message), 60)).json()
        waited = time.monotonic() - began
        batch = (await asyncio.wait_for(api.post(API + "sendMsgBatch", json=[message]), 60)).json()
        config = (await asyncio.wait_for(api.post(API + "setTopicConfig", data={"topic": "t", "maxRetry": "3"}),
                                         60)).json()
        # Redis holds no such msgId: whether the log holds it live (Redis lost it) cannot be told.
        deleted = (await asyncio.wait_for(api.post(API + "deleteMsg", data={"topic": "t", "msgId": "m0"}), 60)).json()
    finally:
        await asyncio.to_thread(postgres.start)
    # Refused while the port is closed. In full runs a connection to the stopped server's port was
    # also seen accepted and closed at once ("server closed the connection unexpectedly"), 50 ms
    # after a refusal, by something else on the machine for a moment: named "connection lost".
    unreachable = {f"message log unavailable: connection {how}" for how in ("refused", "lost")}
    assert reply["code"] == 500 and reply["msg"] in unreachable, reply
    # Tried again until the bound, not failed at the first refusal: the last pause that fits may
    # end up to one back-off step before the bound.
    assert waited >= 1.0 - MAX_RETRY_BACKOFF - 0.1
    # The outage has outlasted the bound: the next send fails after its first try.
    [failed] = batch["results"]
    assert failed["code"] == 500 and failed["msg"] in {f"message 0: {msg}" for msg in unreachable}, batch
    assert config["code"] == 500 and config["msg"] in unreachable, config  # the ORM's save, answered alike
    assert deleted["code"] == 500 and deleted["msg"] in unreachable, deleted
    assert await single_rt.redis.keys("dq:{*") == []  # nothing enqueued
    back = (await api.post(API + "sendMsg", data=message)).json()
    assert back["code"] == 200 and (await logged("t", back["delayMsg"]["msgId"]))["msg"] == "x"


class LogProxy:
    """A TCP proxy in front of the test PostgreSQL, which the service's log connections go
    through (`route`). It forwards everything, except that once `armed` it cuts the connection
    that sent the next statement naming `marker` as soon as PostgreSQL answers it: the statement
    ran (and, autocommitted, committed) but its answer is lost."""

    def __init__(self, marker: bytes):
        db = connections["default"].settings_dict
        self.host, self.port, self.marker = db["HOST"], int(db["PORT"]), marker
        self.armed = False
        self.dropped = 0
        self._server = None

    async def route(self, monkeypatch) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        direct = connection.conninfo
        monkeypatch.setattr(connection, "conninfo", lambda timeout, database: make_conninfo(
            direct(timeout, database), host="127.0.0.1", port=port))

    async def _serve(self, client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection(self.host, self.port)
        asked = asyncio.Event()  # this connection sent the marked statement

        async def upstream():
            while data := await client_reader.read(65536):
                if self.armed and self.marker in data:
                    self.armed = False
                    asked.set()
                server_writer.write(data)
                await server_writer.drain()

        async def downstream():
            while data := await server_reader.read(65536):
                if asked.is_set():
                    self.dropped += 1
                    return  # the answer goes nowhere: both sides are closed
                client_writer.write(data)
                await client_writer.drain()

        try:
            await asyncio.wait([asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())],
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for writer in (client_writer, server_writer):
                with contextlib.suppress(Exception):
                    writer.close()

    async def stop(self) -> None:
        self._server.close()


@contextlib.asynccontextmanager
async def a_send_losing_its_log_answer(api, monkeypatch):
    """Sends msgId m1 (after a warm-up send) with the answer to its log INSERT lost; yields the
    send's reply and the form, with the log still routed through the proxy."""
    dropper = LogProxy(b"INSERT INTO delayqueue_message")
    await dropper.route(monkeypatch)
    try:
        form = {"topic": "t", "msg": "warm-up", "delayMillis": 0}
        assert (await api.post(API + "sendMsg", data=form)).json()["code"] == 200
        dropper.armed = True
        reply = (await api.post(API + "sendMsg", data={**form, "msg": "once", "msgId": "m1"})).json()
        assert dropper.dropped == 1  # the answer of the first try was lost
        yield reply, form
    finally:
        await dropper.stop()


async def test_a_send_whose_committed_log_write_lost_its_answer_is_stored_and_enqueued_once(api, single_rt,
                                                                                           monkeypatch):
    async with a_send_losing_its_log_answer(api, monkeypatch) as (reply, _):
        pass
    assert reply["code"] == 200 and reply["delayMsg"]["msgId"] == "m1"
    assert (await logged("t", "m1"))["msg"] == "once"
    assert await query("SELECT count(*) FROM delayqueue_messageevent WHERE msg_id = 'm1' AND reason = 'sent'") == [(1,)]
    pulled, _ = await pull_messages(single_rt, topic="t", batch=10)
    assert sorted(m.payload for m in pulled) == ["once", "warm-up"]


async def test_a_send_whose_log_write_lost_its_answer_past_the_retries_answers_maybe_sent_naming_its_msg_id(
        api, single_rt, monkeypatch, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "LOG_RETRY_MILLIS": 0}  # the lost answer is not tried again
    async with a_send_losing_its_log_answer(api, monkeypatch) as (reply, form):
        # The row committed: the answer must not say nothing was sent, and says how to make sure.
        assert reply == {"code": 500, "msg": "message log unavailable: connection lost; the message may have been "
                                             "enqueued: send it again with msgId m1 to be sure"}
        assert (await logged("t", "m1"))["msg"] == "once"
        again = (await api.post(API + "sendMsg", data={**form, "msg": "once", "msgId": "m1"})).json()
    assert again["code"] == 200 and again["delayMsg"]["msgId"] == "m1"
    pulled, _ = await pull_messages(single_rt, topic="t", batch=10)
    assert sorted(m.payload for m in pulled) == ["once", "warm-up"]
