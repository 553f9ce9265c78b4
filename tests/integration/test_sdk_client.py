"""The Python client SDK (sdk/python, delayqueue_client) against a real uvicorn server: every method,
every error class provoked for real, retries across a server that is not up yet and a PostgreSQL
that is down, the batching producer under 8 threads (and its asyncio flavour under 8 tasks), AsyncClient, and DELAYQUEUE_URL/_TOKEN."""
import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from delayqueue_client import (AsyncClient, BadRequest, Client, Conflict, DelayQueueError, Forbidden, Message, NotFound,
                               ProducerFull, RateLimited, ServerError, Unauthorized, Unavailable)

from delayqueue.models import Message as LoggedMessage
from delayqueue.stores.rows import set_limits
from tests.helpers import WebProcess, scanner_env, wait_for, wait_until
from tests.integration.test_tokens import new_token

pytestmark = pytest.mark.process


@pytest.fixture
def client(sdk_server):
    with Client(sdk_server) as c:
        yield c


def logged_count(topic: str) -> int:
    return LoggedMessage.objects.filter(topic=topic).count()


def test_send_get_pull_ack_and_the_other_message_calls(client):
    sent = client.send("orders", "hello", delay_ms=0, msg_id="m1", ttl_ms=60_000, max_retry=2, priority=4)
    assert isinstance(sent, Message)
    assert (sent.topic, sent.msg_id, sent.msg, sent.max_retry, sent.priority, sent.status) == (
        "orders", "m1", "hello", 2, 4, 2)
    assert sent.expire_time == sent.trigger_time + 60_000
    assert client.get("orders", "m1") == sent
    assert client.get("orders", "nope") is None
    generated = client.send("orders", "second")  # no msgId given: the client made one
    assert len(generated.msg_id) == 32 and generated.priority == 0

    pulled = client.pull("orders", batch=10, ack_timeout_ms=30_000)
    assert [m.msg_id for m in pulled] == ["m1", generated.msg_id]  # priority 4 first
    assert all(m.status == 3 and m.retry == 1 for m in pulled)
    deadline = client.touch("orders", "m1", ack_timeout_ms=60_000)
    assert deadline >= int(time.time() * 1000) + 55_000
    assert client.ack("orders", "m1") is True
    assert client.ack("orders", "m1") is False  # already ended
    assert client.get("orders", "m1").status == 4
    assert client.nack("orders", generated.msg_id, delay_ms=60_000) is True
    assert client.get("orders", generated.msg_id).status == 1  # waits again

    moved = client.reschedule("orders", generated.msg_id, delay_ms=0)
    assert moved.status == 2 and moved.msg_id == generated.msg_id
    assert client.pull("orders", wait_ms=2_000)[0].msg_id == generated.msg_id  # a long poll
    assert client.nack("orders", generated.msg_id, dead_letter=True) is True
    assert client.get("orders", generated.msg_id).status == 6

    client.send_many([{"topic": "batch", "msg": f"b{i}", "msg_id": f"b{i}"} for i in range(3)])
    assert [m.msg_id for m in client.pull("batch", batch=3)] == ["b0", "b1", "b2"]
    assert client.ack_many("batch", ["b0", "b1", "b2", "b9"]) == [True, True, True, False]

    client.send("orders", "gone", msg_id="d1", delay_ms=60_000)
    assert client.delete("orders", "d1") is True
    assert client.delete("orders", "d1") is False
    assert started_long_poll_returns_empty(client)
    info = client.topic_info("orders")
    assert isinstance(info, dict) and info["topic"] == "orders"


def started_long_poll_returns_empty(client) -> bool:
    started = time.monotonic()
    empty = client.pull("empty-topic", wait_ms=300)
    return empty == [] and time.monotonic() - started >= 0.25


def test_send_many_answers_each_item_its_message_or_its_error(client):
    results = client.send_many([{"topic": "t", "msg": "ok", "msg_id": "a"},
                                {"topic": "t", "msg": "bad", "priority": 12},
                                {"topic": "t", "msg": "ok too", "delay_ms": 60_000}])
    assert isinstance(results[0], Message) and results[0].msg_id == "a"
    assert isinstance(results[1], BadRequest) and "priority" in results[1].msg
    assert isinstance(results[2], Message) and results[2].status == 1
    assert logged_count("t") == 2
    assert client.send_many([]) == []  # nothing to send: no answers (the API refuses an empty batch)


async def test_an_empty_ack_many_answers_no_results_without_a_call_as_send_many_does(sdk_server):
    # The API refuses an empty ackMsgBatch (400): a list of msgIds filtered down to none is no error.
    with Client(sdk_server) as client:
        assert client.ack_many("t", []) == []
        assert client.ack_many("t", [], ack=False, reason="none") == []
    async with AsyncClient(sdk_server) as async_client:
        assert await async_client.ack_many("t", []) == []


async def test_a_purge_dead_of_no_msg_ids_purges_none_without_a_call(sdk_server):
    # msg_ids=None is every dead letter; a list filtered down to none is none, not the API's 400.
    with Client(sdk_server) as client:
        assert client.purge_dead("t", []) == 0
    async with AsyncClient(sdk_server) as async_client:
        assert await async_client.purge_dead("t", []) == 0


async def test_a_redrive_of_no_msg_ids_is_task_0_done_without_a_call(sdk_server):
    # As purge_dead: a list filtered down to none redrives none, not the API's 400; task 0 is that
    # empty redrive, done (the server numbers its tasks from 1).
    with Client(sdk_server) as client:
        assert client.redrive("t", []) == 0
        assert client.redrive_task(0) == {"moved": 0, "left": 0, "state": "done"}
    async with AsyncClient(sdk_server) as async_client:
        assert await async_client.redrive("t", [], max_per_second=10) == 0
        assert await async_client.redrive_task(0) == {"moved": 0, "left": 0, "state": "done"}


def test_topic_config_pause_resume_and_purge(client):
    config = client.set_topic_config("jobs", max_retry=5, retry_backoff_ms=100, dead_letter=False)
    assert (config["maxRetry"], config["retryBackoffMillis"], config["deadLetter"]) == (5, 100, False)
    assert client.topic_config("jobs") == config
    with pytest.raises(TypeError, match="unknown topic setting colour"):
        client.set_topic_config("jobs", colour="red")
    client.send("jobs", "x", msg_id="j1")
    client.pause("jobs")
    assert client.pull("jobs") == []
    client.resume("jobs")
    assert [m.msg_id for m in client.pull("jobs")] == ["j1"]
    client.send("jobs", "y", delay_ms=60_000)
    assert client.purge("jobs") == 2  # the consuming j1 and the waiting one


def test_dead_letters_listed_redriven_and_purged(client, scanner_process):
    scanner_process("sdk").wait_started()  # its log writer records the deaths the listing reads
    client.send("dl", "dies", msg_id="x1")
    client.pull("dl")
    assert client.nack("dl", "x1", dead_letter=True)
    page = wait_for(lambda: client.dead_letters("dl").messages, timeout=30, what="the dead letter listed")
    assert [(m.msg_id, m.dead_reason) for m in page] == [("x1", "dead_lettered")]
    assert client.dead_letters("dl", limit=1).next_cursor is None
    task = client.redrive("dl", ["x1"], max_per_second=100)
    assert wait_for(lambda: client.redrive_task(task)["state"] == "done", what="the redrive")
    assert client.redrive_task(task)["moved"] == 1
    assert client.get("dl", "x1").status == 2  # live again
    client.pull("dl")
    client.nack("dl", "x1", dead_letter=True)
    wait_for(lambda: client.dead_letters("dl").messages, what="the second death listed")
    assert client.purge_dead("dl") == 1
    assert client.dead_letters("dl").messages == []


def test_bad_input_unknown_and_conflict_raise_their_classes(client):
    with pytest.raises(BadRequest, match="priority") as bad:
        client.send("t", "x", priority=12)
    assert bad.value.code == 400
    with pytest.raises(NotFound):
        client.touch("t", "unknown", ack_timeout_ms=1000)
    with pytest.raises(NotFound):
        client.redrive_task(987654)
    client.send("t", "later", msg_id="w1", delay_ms=60_000)
    with pytest.raises(Conflict) as conflict:  # waiting, not consuming
        client.touch("t", "w1", ack_timeout_ms=1000)
    assert conflict.value.code == 409 and isinstance(conflict.value, DelayQueueError)


def rate_limited(client, topic: str, call) -> RateLimited:
    """The RateLimited `call(client)` raises once the web process has read the topic's limit."""
    def refused():
        try:
            call(client)
        except RateLimited as exc:
            return exc
    return wait_for(refused, what="the limit read by the web process")


def test_over_a_limit_is_rate_limited_with_retry_after(sdk_server):
    set_limits(namespace="default", topic="limited", produce_rate=2)
    with Client(sdk_server, max_retries=0) as impatient:
        error = rate_limited(impatient, "limited", lambda c: [c.send("limited", "x") for _ in range(3)])
    assert error.code == 429 and "produce rate limit of topic limited" in error.msg
    assert 0 < error.retry_after <= 1 and error.retry_after == error.retry_after_ms / 1000


def test_calls_over_a_rate_limit_wait_its_retry_after_and_go_through_even_pulls(client, sdk_server):
    set_limits(namespace="default", topic="paced", produce_rate=5, consume_rate=2)
    with Client(sdk_server, max_retries=0) as impatient:
        # Six at once: over 5 a second however slowly a loaded machine answers them one by one.
        rate_limited(impatient, "paced", lambda c: [c.send("paced", "probe") for _ in range(6)])
        stored_before = client.topic_info("paced")["readyQueueSize"]
        sent = [client.send("paced", f"m{i}") for i in range(10)]  # 5 a second: some refused once, then waited
        assert [client.get("paced", m.msg_id) for m in sent] == sent
        assert client.topic_info("paced")["readyQueueSize"] == stored_before + 10  # each stored once
        rate_limited(impatient, "paced", lambda c: [c.pull("paced") for _ in range(3)])  # pulls at this pace: refused
    # A refused pull took nothing, so it goes again too: every one of these pulls answers a message.
    assert all(len(client.pull("paced", ack_timeout_ms=60_000)) == 1 for _ in range(5))


def test_restore_restore_msg_and_monitor_data(client):
    sent = client.send("rest", "x", msg_id="r1", delay_ms=60_000)  # in Redis and in the message log
    assert client.restore_msg("rest", "r1") == {"restored": 0, "alreadyLive": 1, "skipped": 0, "leftCold": 0}
    assert client.restore("rest") == {"restored": 0, "alreadyLive": 1, "skipped": 0, "leftCold": 0}
    assert client.restore()["alreadyLive"] >= 1  # every topic
    with pytest.raises(NotFound, match="not found in the message log"):
        client.restore_msg("rest", "nope")
    assert client.get("rest", "r1") == sent
    data = client.monitor_data()
    assert isinstance(data["requestStatsList"], list) and "pullMsgTimeGapStatsList" in data


def test_tokens_unauthorized_forbidden_and_the_environment(web_processes, monkeypatch):
    (web,) = web_processes(1, DELAYQUEUE_AUTH="tokens")
    produce_only = new_token(namespace="shop", scopes=["produce"])
    with Client(web.url, token="dq_not-a-token") as stranger, pytest.raises(Unauthorized) as unauthorized:
        stranger.send("t", "x")
    assert unauthorized.value.code == 401 and "dq_not-a-token" not in str(unauthorized.value)
    with Client(web.url) as anonymous, pytest.raises(Unauthorized):
        anonymous.get("t", "x")
    monkeypatch.setenv("DELAYQUEUE_URL", web.url)
    monkeypatch.setenv("DELAYQUEUE_TOKEN", produce_only)
    with Client() as from_env:
        assert from_env.send("t", "x", msg_id="e1").msg_id == "e1"
        with pytest.raises(Forbidden) as forbidden:
            from_env.pull("t")
    assert forbidden.value.code == 403
    assert LoggedMessage.objects.get(msg_id="e1").namespace == "shop"
    # A token read from a secret file often ends with its newline: the ends' whitespace is no token's.
    with Client(web.url, token=f" {produce_only}\n") as from_file:
        assert from_file.send("t", "x", msg_id="e2").msg_id == "e2"
    for cls in (Client, AsyncClient):  # one that cannot be a header's value is refused, and not shown
        for bad in (produce_only[:9] + "\n" + produce_only[9:], produce_only + "\x00", produce_only + "é"):
            with pytest.raises(ValueError, match="the token must be printable ASCII") as refused:
                cls(web.url, token=bad)
            assert produce_only[9:] not in str(refused.value)


def test_a_token_given_as_camellias_url_prefix_goes_in_no_url_the_clients_log(web_processes, caplog):
    (web,) = web_processes(1, DELAYQUEUE_AUTH="tokens")
    token = new_token(namespace="shop", scopes=["produce", "consume"])
    caplog.set_level("DEBUG")  # httpx logs each request's URL at INFO

    async def through_async() -> str:
        async with AsyncClient(f"{web.url}/t/{token}") as client:
            return (await client.send("t", "x", msg_id="a1")).msg_id

    with Client(f"{web.url}/t/{token}/") as client:
        assert client.send("t", "x", msg_id="b1").msg_id == "b1"
        assert "/t/" not in client._settings.url
    assert asyncio.run(through_async()) == "a1"
    assert "HTTP Request: POST" in caplog.text and token not in caplog.text
    assert set(LoggedMessage.objects.values_list("namespace", flat=True)) == {"shop"}


@pytest.mark.fault
def test_postgres_down_is_a_server_error_and_a_send_retried_until_it_is_back_is_stored_once(client, sdk_server,
                                                                                            postgres):
    postgres.stop()
    try:
        with Client(sdk_server, max_retries=0) as impatient, pytest.raises(ServerError, match="unavailable") as down:
            impatient.send("pg", "x")
        assert down.value.code == 500
        with Client(sdk_server, max_retries=100, backoff_base=0.05, backoff_max=0.2) as patient, \
                ThreadPoolExecutor(2) as pool, patient.producer() as producer:
            sending = pool.submit(patient.send, "pg", "survives", msg_id="p1")
            # A batch's items each answer their own 500 in a 200 answer: sent again as well.
            batch = pool.submit(patient.send_many, [{"topic": "pg", "msg": "b", "msg_id": "p2"}])
            produced = producer.send("pg", "produced", msg_id="p3")
            time.sleep(0.5)
            assert not (sending.done() or batch.done() or produced.done())  # retrying while PostgreSQL is down
            postgres.start()
            assert sending.result(timeout=30).msg_id == "p1"
            assert [m.msg_id for m in batch.result(timeout=30)] == ["p2"]
            assert produced.result(timeout=30).msg_id == "p3"
    finally:
        if postgres._pid() is None:
            postgres.start()
    assert client.get("pg", "p1").msg == "survives"
    assert sorted(LoggedMessage.objects.filter(topic="pg").values_list("msg_id", flat=True)) == ["p1", "p2", "p3"]


def test_a_send_made_before_the_server_listens_is_retried_until_it_does(web_processes):
    web = WebProcess("late", scanner_env())
    try:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", web.port)) != 0  # not listening yet: refused
        with Client(web.url, max_retries=200, backoff_base=0.05, backoff_max=0.1) as client:
            sent = client.send("late", "x", msg_id="l1")
            assert client.get("late", "l1") == sent
    finally:
        web.stop()
    assert logged_count("late") == 1


def test_an_unreachable_server_fails_after_the_retries_as_a_server_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]  # bound, never listening: connections are refused
        with Client(f"http://127.0.0.1:{port}", max_retries=2, backoff_base=0.01) as client, \
                pytest.raises(Unavailable, match="unreachable: ConnectionRefusedError"):
            client.get("t", "x")


def test_the_producer_batches_sends_of_8_threads_each_stored_once_in_flight_bounded(client):
    per_thread, threads = 250, 8
    out, peak, lock = [0], [0], threading.Lock()
    send_batch = client._send_batch

    def observed_send_batch(bodies, sends=None):
        with lock:
            out[0] += 1
            peak[0] = max(peak[0], out[0])
        try:
            return send_batch(bodies, sends)
        finally:
            with lock:
                out[0] -= 1
    client._send_batch = observed_send_batch
    producer = client.producer(linger_ms=2, max_batch=50, in_flight=3)
    futures = []

    def produce(t):
        mine = [producer.send("prod", f"{t}-{i}", delay_ms=60_000) for i in range(per_thread)]
        with lock:
            futures.extend(mine)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(produce, range(threads)))
    producer.flush()
    assert all(f.done() for f in futures)
    messages = [f.result() for f in futures]
    assert len(messages) == threads * per_thread
    assert sorted(m.msg for m in messages) == sorted(f"{t}-{i}" for t in range(threads) for i in range(per_thread))
    assert len({m.msg_id for m in messages}) == len(messages)
    assert 1 < peak[0] <= 3  # 40 batches or more: several out at once, never more than in_flight
    assert logged_count("prod") == len(messages)
    assert client.topic_info("prod")["waitingQueueSize"] == len(messages)
    for message in messages[::97]:
        assert client.get("prod", message.msg_id) == message
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        producer.send("prod", "late")


def test_the_producer_fails_a_refused_item_with_its_class_and_a_failed_batch_with_the_reason(client, sdk_server):
    set_limits(namespace="default", topic="plim", produce_rate=3)
    with Client(sdk_server, max_retries=0) as impatient, impatient.producer(linger_ms=50) as producer:
        def refused_some():
            futures = [producer.send("plim", f"m{i}") for i in range(6)]
            producer.flush()
            return [f.exception() for f in futures if f.exception() is not None]
        errors = wait_for(refused_some, what="the limit read by the web process")
    assert all(isinstance(e, RateLimited) and e.retry_after_ms > 0 for e in errors)
    with client.producer() as producer:
        bad = producer.send("plim", "x", priority=99)
        assert isinstance(bad.exception(timeout=10), BadRequest)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        with Client(f"http://127.0.0.1:{holder.getsockname()[1]}", max_retries=0) as nowhere:
            producer = nowhere.producer(linger_ms=20)
            futures = [producer.send("t", str(i)) for i in range(3)]
            producer.close()
    reasons = [f.exception(timeout=0) for f in futures]
    assert all(isinstance(r, Unavailable) and "unreachable" in r.msg for r in reasons)


def raise_refusal(results: list) -> None:
    for result in results:
        if isinstance(result, RateLimited):
            raise result


def test_a_producer_batch_over_a_rate_limit_sends_its_refused_items_again_after_the_retry_after(client, sdk_server):
    set_limits(namespace="default", topic="pwait", produce_rate=5)
    with Client(sdk_server, max_retries=0) as impatient:
        rate_limited(impatient, "pwait", lambda c: raise_refusal(c.send_many([{"topic": "pwait", "msg": "p"}] * 10)))
    stored_before = client.topic_info("pwait")["readyQueueSize"]
    with Client(sdk_server, max_retries=10) as patient, patient.producer(linger_ms=20) as producer:
        futures = [producer.send("pwait", f"m{i}") for i in range(12)]
        messages = [f.result(timeout=60) for f in futures]  # no RateLimited: the refused items went again
    assert client.topic_info("pwait")["readyQueueSize"] == stored_before + 12
    assert [client.get("pwait", m.msg_id) for m in messages] == messages


def test_a_full_producer_raises_or_blocks_until_a_batch_takes_its_sends(sdk_server):
    release = threading.Event()
    with Client(sdk_server) as client:
        send_batch = client._send_batch
        client._send_batch = lambda bodies, sends=None: release.wait(30) and send_batch(bodies, sends)  # slow to answer

        def stalled(producer) -> list:
            """Two sends out of the queue: one in a batch the server holds, one taken for the next batch."""
            held = []
            for text in ("out", "next"):
                held.append(producer.send("full", text))
                wait_for(lambda: producer._queue.empty(), what=f"{text!r} taken from the queue")
            return held

        with client.producer(linger_ms=0, max_batch=2, in_flight=1, max_queue=3, when_full="raise") as producer:
            try:
                sent = stalled(producer) + [producer.send("full", f"q{i}") for i in range(3)]
                with pytest.raises(ProducerFull, match="queue is full"):
                    producer.send("full", "over")
            finally:
                release.set()
            assert [f.result(timeout=30).msg for f in sent] == ["out", "next", "q0", "q1", "q2"]
        release.clear()
        with client.producer(linger_ms=0, max_batch=2, in_flight=1, max_queue=2) as producer, \
                ThreadPoolExecutor(1) as pool:
            try:
                sent = stalled(producer) + [producer.send("full", f"w{i}") for i in range(2)]
                blocked = pool.submit(producer.send, "full", "waits")
                with pytest.raises(TimeoutError):
                    blocked.result(timeout=0.3)  # no room: the send waits (it did not raise)
            finally:
                release.set()
            assert blocked.result(timeout=30).result(timeout=30).msg == "waits"
            assert all(f.result(timeout=30) for f in sent)
        assert client.topic_info("full")["readyQueueSize"] == 10


async def test_a_full_async_producer_raises_and_send_when_room_waits_for_a_batch_to_take_some(sdk_server):
    release = asyncio.Event()
    async with AsyncClient(sdk_server) as client:
        send_batch = client._send_batch

        async def slow_server(bodies):
            await release.wait()
            return await send_batch(bodies)
        client._send_batch = slow_server

        async def queue_emptied():
            return producer._queue.empty()
        async with client.producer(linger_ms=0, max_batch=1, in_flight=1, max_queue=2) as producer:
            try:
                sent = []
                for text in ("out", "next"):  # one in the batch the server holds, one taken for the next
                    sent.append(producer.send("afull", text))
                    await wait_until(queue_emptied, what=f"{text!r} taken from the queue")
                sent += [producer.send("afull", f"q{i}") for i in range(2)]
                with pytest.raises(ProducerFull, match="queue is full"):
                    producer.send("afull", "over")
                waiting = asyncio.create_task(producer.send_when_room("afull", "waits"))
                await asyncio.sleep(0.3)
                assert not waiting.done()  # no room yet: it waits (it did not raise)
            finally:
                release.set()
            sent.append(await waiting)
            assert [(await f).msg for f in sent] == ["out", "next", "q0", "q1", "waits"]
        assert (await client.topic_info("afull"))["readyQueueSize"] == 5


def test_max_batch_is_held_to_the_servers_limit(client):
    # All 2,500 wait within the linger: one batch of them would be refused whole (code 400).
    with client.producer(max_batch=5000, linger_ms=2000) as producer:
        futures = [producer.send("big", str(i)) for i in range(2500)]
    assert all(f.result().topic == "big" for f in futures)
    assert client.topic_info("big")["readyQueueSize"] == 2500


def test_a_producer_not_closed_sends_its_pending_messages_at_interpreter_exit(sdk_server, tmp_path):
    script = tmp_path / "unclosed.py"
    script.write_text(
        "import sys\n"
        "from delayqueue_client import Client\n"
        "producer = Client(sys.argv[1]).producer(linger_ms=500)\n"
        "for i in range(300):\n"
        "    producer.send('atexit', f'm{i}', msg_id=f'ax{i}')\n")  # no flush, no close: exits at once
    subprocess.run([sys.executable, str(script), sdk_server], check=True, timeout=60)
    assert logged_count("atexit") == 300


UNCLOSED_ASYNC_PRODUCER = """\
import asyncio, sys
from delayqueue_client import AsyncClient
async def main():
    producer = AsyncClient(sys.argv[1]).producer(linger_ms=float(sys.argv[3]), max_batch=40, in_flight=2)
    for i in range(300):
        producer.send(sys.argv[2], f'm{i}', msg_id=f'{sys.argv[2]}{i}')
    await asyncio.sleep(float(sys.argv[4]))  # the first batch taken out of the queue, or some sent
"""


@pytest.mark.parametrize("linger_ms, sends_for", [("200", "0"), ("0", "0.15")], ids=["queued", "batches out"])
def test_an_async_producer_not_closed_sends_its_pending_messages_when_asyncio_run_ends(sdk_server, tmp_path,
                                                                                       linger_ms, sends_for):
    # asyncio.run cancels the tasks left and runs the loop until they end: the producer's task
    # sends what was queued and the batches cancelled with it, before the loop closes.
    script = tmp_path / "unclosed_async.py"
    script.write_text(UNCLOSED_ASYNC_PRODUCER + "asyncio.run(main())\n")
    ran = subprocess.run([sys.executable, str(script), sdk_server, "arun", linger_ms, sends_for],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert logged_count("arun") == 300


def test_an_async_client_closing_closes_its_producers_first_so_their_sends_go(sdk_server, tmp_path):
    # Its connections closed, the client could send nothing more for a producer left open.
    script = tmp_path / "client_closed.py"
    script.write_text(
        "import asyncio, sys\n"
        "from delayqueue_client import AsyncClient\n"
        "async def main():\n"
        "    async with AsyncClient(sys.argv[1]) as client:\n"
        "        producer = client.producer(linger_ms=200, max_batch=40, in_flight=2)\n"
        "        for i in range(300):\n"
        "            producer.send('aclosed', 'm', msg_id=f'ac{i}')\n"
        "asyncio.run(main())\n")
    ran = subprocess.run([sys.executable, str(script), sdk_server], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert logged_count("aclosed") == 300, ran.stderr


def test_an_async_producer_whose_loop_closed_under_it_says_how_many_sends_it_lost(sdk_server, tmp_path):
    # A loop closed with the producer's task still waiting cannot send any more: not silently.
    script = tmp_path / "unclosed_loop.py"
    script.write_text(UNCLOSED_ASYNC_PRODUCER + "loop = asyncio.new_event_loop()\n"
                      "loop.run_until_complete(main())\nloop.close()\n")
    ran = subprocess.run([sys.executable, str(script), sdk_server, "aloop", "200", "0"], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "an AsyncProducer never closed lost 300 sends (msgIds aloop0, aloop1, aloop2, " in ran.stderr
    assert logged_count("aloop") == 0


def test_a_flush_or_close_that_times_out_or_is_interrupted_leaves_the_sends_unanswered_to_the_exit(
        web_processes, tmp_path):
    # The server is stopped (its socket accepts, nothing answers) while the producer flushes and
    # closes: neither may return as if done, and what close left must not die with the process's
    # daemon threads, also when Ctrl-C ends a close (Python 3.11's interrupted join took the running
    # thread for ended, and the exit's close waited for nothing).
    script = tmp_path / "close_timeout.py"
    script.write_text(
        "import sys\n"
        "from delayqueue_client import Client\n"
        "producer = Client(sys.argv[1]).producer(max_batch=10, in_flight=1)\n"
        "sent = sorted(f'cl{i}' for i in range(50))\n"
        "for msg_id in sent:\n"
        "    producer.send('closing', msg_id, msg_id=msg_id)\n"
        "for wait in (producer.flush, producer.close):\n"
        "    try:\n"
        "        wait(timeout=0.3)\n"
        "        print('returned', flush=True)\n"
        "    except TimeoutError as exc:\n"
        "        print(sorted(exc.msg_ids) == sent, exc, flush=True)\n"
        "try:\n"
        "    print('closing', flush=True)\n"
        "    producer.close()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    raise\n")
    [web] = web_processes(1)
    web.proc.send_signal(signal.SIGSTOP)
    try:
        closing = subprocess.Popen([sys.executable, str(script), web.url], stdout=subprocess.PIPE, text=True)
        said = [closing.stdout.readline() for _ in range(3)]
        closing.send_signal(signal.SIGINT)  # Ctrl-C in the close that waits for ever
        said.append(closing.stdout.readline())
    finally:
        web.proc.send_signal(signal.SIGCONT)
    assert closing.wait(timeout=60) == -signal.SIGINT  # after the exit's close
    assert said[0].startswith("True the producer's flush timed out after 0.3 s with 50 sends not answered")
    assert said[1].startswith("True the producer's close timed out after 0.3 s with 50 sends not answered")
    assert said[2:] == ["closing\n", "interrupted\n"]
    assert logged_count("closing") == 50


async def test_an_async_producer_close_cut_short_by_a_timeout_leaves_its_sends_going(web_processes):
    # A timeout around aclose() cancels it: that must not cancel the sending with it, leaving the
    # sends' futures pending forever and the messages unsent.
    [web] = web_processes(1)
    async with AsyncClient(web.url) as client:
        producer = client.producer(max_batch=10, in_flight=1)
        futures = [producer.send("aclosing", f"m{i}", msg_id=f"ac{i}") for i in range(50)]
        web.proc.send_signal(signal.SIGSTOP)  # its socket accepts, nothing answers
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(producer.aclose(), 0.3)
        finally:
            web.proc.send_signal(signal.SIGCONT)
        await asyncio.wait_for(producer.aclose(), 30)  # waits for them again
        assert sorted(f.result().msg_id for f in futures) == sorted(f"ac{i}" for i in range(50))
    assert await sync_to_async(logged_count)("aclosing") == 50


async def test_the_async_client_has_the_same_methods(sdk_server):
    async with AsyncClient(sdk_server) as client:
        sent = await client.send("async", "hi", msg_id="a1")
        assert await client.get("async", "a1") == sent
        assert await client.get("async", "zz") is None
        assert [m.msg_id for m in await client.pull("async", wait_ms=1000)] == ["a1"]
        assert await client.ack("async", "a1") is True
        with pytest.raises(BadRequest):
            await client.send("async", "x", delay_ms=1, trigger_time=1)
        assert await client.send_many([]) == []


async def test_the_async_producer_batches_sends_of_8_tasks_each_stored_once(sdk_server):
    async with AsyncClient(sdk_server) as client:
        async with client.producer(linger_ms=2, max_batch=100) as producer:
            async def produce(t):
                return [producer.send("aprod", f"{t}-{i}", delay_ms=60_000) for i in range(100)]
            futures = [f for mine in await asyncio.gather(*(produce(t) for t in range(8))) for f in mine]
            await producer.flush()
            assert all(f.done() for f in futures)
            bad = producer.send("aprod", "x", priority=99)
        assert isinstance(bad.exception(), BadRequest)  # aclose waited for it
        with pytest.raises(RuntimeError, match="closed"):
            producer.send("aprod", "late")
        messages = [f.result() for f in futures]
        assert len({m.msg_id for m in messages}) == 800
        assert (await client.topic_info("aprod"))["waitingQueueSize"] == 800
    assert await sync_to_async(logged_count)("aprod") == 800


async def test_a_producer_send_of_text_utf8_cannot_carry_raises_at_once_and_spares_its_batch(sdk_server):
    # As Client.send: a ValueError before anything is sent, not the failure of the whole batch it
    # would have shared with other threads' sends.
    with Client(sdk_server) as client, client.producer(linger_ms=200) as producer:
        kept = producer.send("utf", "fine", msg_id="u1")
        with pytest.raises(ValueError, match=r"cannot send '\\udc80': a lone surrogate"):
            producer.send("utf", "caf\udc80", msg_id="u2")
    assert kept.result().msg_id == "u1"
    async with AsyncClient(sdk_server) as async_client, async_client.producer(linger_ms=200) as async_producer:
        async_kept = async_producer.send("utf", "fine too", msg_id="u3")
        with pytest.raises(ValueError, match="a lone surrogate"):
            async_producer.send("utf", "ok", msg_id="u\ud800")
    assert async_kept.result().msg_id == "u3"
    assert await sync_to_async(logged_count)("utf") == 2


def test_a_producer_send_of_an_option_json_cannot_carry_raises_at_once_and_spares_its_batch(client):
    # NaN or infinity is no JSON number: sent, the server refuses the whole batch's JSON (400), and a
    # Decimal fails its encoding; either would fail every other send of the batch with it.
    with client.producer(linger_ms=200) as producer:
        kept = producer.send("json", "fine", msg_id="j1")
        for name, bad in (("delay_ms", float("inf")), ("ttl_ms", float("nan")), ("priority", Decimal(1))):
            with pytest.raises((ValueError, TypeError), match=f"{name} must be"):
                producer.send("json", "bad", **{name: bad})
    assert kept.result().msg_id == "j1"
    assert logged_count("json") == 1


def test_a_send_cancelled_before_its_batch_left_is_not_sent(client):
    with client.producer(linger_ms=300) as producer:
        kept, dropped = producer.send("cx", "kept", msg_id="k"), producer.send("cx", "dropped", msg_id="d")
        assert dropped.cancel()
    assert kept.result().msg_id == "k"
    assert client.get("cx", "d") is None and logged_count("cx") == 1
