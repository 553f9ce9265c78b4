"""delayqueue_client.testing: the FakeServer's rules (delays on its clock, dedupe, priorities, ack
timeouts, retries and backoff, TTL, dead letters, touch, reschedule, validation errors), real
clients on it (sync and async, the producer, the Worker, retries through injected faults), and
the pytest fixtures. No server: tests/integration/test_sdk_fake_parity.py holds the fake to the
real one."""
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from delayqueue_client import BadRequest, Conflict, DeadLetter, NotFound, NotTheAPI, ServerError, Worker
from delayqueue_client._calls import Call
from delayqueue_client._http import MaybeSent, NotSent
from delayqueue_client.middleware import Middleware
from delayqueue_client.testing import FakeClock, FakeServer
from delayqueue_client.worker import WorkerFailed

from tests.helpers import ROOT, run_catching, wait_for

pytest_plugins = ["delayqueue_client.testing.pytest_plugin"]

WAITING, READY, CONSUMING, ACKED, EXPIRED, EXHAUSTED, DELETED = 1, 2, 3, 4, 5, 6, 7


@pytest.fixture
def server():
    return FakeServer(seed=7)


@pytest.fixture
def client(server):
    with server.client(backoff_base=0.001, backoff_max=0.002) as c:
        yield c


def call(server, endpoint, **body) -> dict:
    """One raw call: the envelope the fake answers."""
    status, content = server.post(endpoint, json.dumps(body).encode())
    assert status == 200
    return json.loads(content)


def test_a_delayed_message_is_pulled_only_once_the_clock_reaches_its_trigger_time(server, client):
    sent = client.send("t", "later", delay_ms=30_000, msg_id="m")
    assert (sent.status, sent.trigger_time - sent.produce_time) == (WAITING, 30_000)
    assert sent.expire_time == sent.trigger_time + 3_600_000  # the default TTL counts from the trigger time
    server.clock.advance(29.999)
    assert client.pull("t") == []
    server.clock.advance(timedelta(milliseconds=1))
    [pulled] = client.pull("t")
    assert (pulled.msg_id, pulled.status, pulled.retry) == ("m", CONSUMING, 1)
    now = server.clock.now_ms()
    due_now = client.send("t", "x", trigger_time=now - 5000)  # a past triggerTime: due now
    assert (due_now.status, due_now.trigger_time) == (READY, now)


def test_a_resend_under_a_taken_msg_id_answers_the_message_holding_it_until_the_dedupe_window_ends(server, client):
    first = client.send("t", "one", msg_id="m", delay_ms=1000)
    again = client.send("t", "two", msg_id="m")
    assert again == first  # nothing sent: the live message answered, its own body
    server.clock.advance(1)
    [pulled] = client.pull("t")
    assert client.ack("t", "m")
    assert client.send("t", "three", msg_id="m").status == ACKED  # ended, within the window
    server.clock.advance(24 * 3600)
    renewed = client.send("t", "four", msg_id="m")
    assert (renewed.msg, renewed.status, renewed.retry) == ("four", READY, 0)


def test_ready_messages_come_highest_priority_first_oldest_first_within_one(client):
    for msg_id, priority in (("low1", 0), ("high1", 9), ("mid", 5), ("high2", 9), ("low2", 0)):
        client.send("t", msg_id, msg_id=msg_id, priority=priority)
    assert [m.msg_id for m in client.pull("t", batch=10)] == ["high1", "high2", "mid", "low1", "low2"]
    assert client.send("t", "p", priority=3).priority == 3


def test_an_unacked_message_is_delivered_again_after_its_ack_timeout_until_max_retry_then_dead(server, client):
    client.send("t", "x", msg_id="m", max_retry=2)
    for delivery in (1, 2, 3):
        [pulled] = client.pull("t", ack_timeout_ms=1000)
        assert pulled.retry == delivery
        assert client.pull("t") == []
        server.clock.advance(1)
    assert client.pull("t") == []
    gone = client.get("t", "m")
    assert (gone.status, gone.retry) == (EXHAUSTED, 3)
    [dead] = client.dead_letters("t").messages
    assert (dead.msg_id, dead.dead_reason, dead.dead_time) == ("m", "retries_exhausted", server.clock.now_ms())


def test_one_long_advance_runs_what_happens_meanwhile_in_the_order_of_its_times(server, client):
    client.set_topic_config("t", retry_backoff_ms=2000)
    client.send("t", "x", msg_id="m")
    [pulled] = client.pull("t", ack_timeout_ms=1000)
    deadline = server.clock.now_ms() + 1000
    server.clock.advance(100)  # timed out at +1 s, waited its backoff, ready since: no one pulled it
    back = client.get("t", "m")
    assert (back.status, back.retry) == (READY, 1)
    assert deadline + 1600 <= back.trigger_time <= deadline + 2000  # the backoff less up to a fifth
    server.clock.advance(3600)  # its TTL (from the first trigger time) ends it, never delivered again
    gone = client.get("t", "m")
    assert (gone.status, gone.retry) == (EXHAUSTED, 1)
    assert client.dead_letters("t").messages[0].dead_time == pulled.expire_time


def test_a_nack_waits_the_topics_retry_backoff_doubling_per_delivery_less_up_to_a_fifth(server, client):
    client.set_topic_config("t", retry_backoff_ms=1000, retry_backoff_max_ms=3000)
    client.send("t", "x", msg_id="m")
    waits = []
    for _ in range(4):
        [pulled] = client.pull("t")
        now = server.clock.now_ms()
        assert client.nack("t", "m")
        waiting = client.get("t", "m")
        assert waiting.status == WAITING
        waits.append(waiting.trigger_time - now)
        server.clock.advance(3)
    for wait, full in zip(waits, (1000, 2000, 3000, 3000)):
        assert full * 0.8 <= wait <= full
    exact = FakeServer(jitter=False)
    with exact.client() as c:
        c.set_topic_config("t", retry_backoff_ms=500)
        c.send("t", "x", msg_id="m")
        c.pull("t")
        c.nack("t", "m")
        assert c.get("t", "m").trigger_time - exact.clock.now_ms() == 500


def test_a_nack_with_a_delay_waits_that_long_keeping_its_retry_count_and_dead_letter_ends_it(server, client):
    client.send("t", "x", msg_id="m")
    client.pull("t")
    assert client.nack("t", "m", delay_ms=5000)
    assert client.nack("t", "m") is False  # no longer consuming
    waiting = client.get("t", "m")
    assert (waiting.status, waiting.retry, waiting.trigger_time) == (WAITING, 1, server.clock.now_ms() + 5000)
    server.clock.advance(5)
    [again] = client.pull("t")
    assert again.retry == 2
    assert client.nack("t", "m", dead_letter=True)
    assert client.get("t", "m").status == EXHAUSTED
    assert [(m.msg_id, m.dead_reason) for m in client.dead_letters("t").messages] == [("m", "dead_lettered")]


def test_a_nack_reason_is_kept_as_the_dead_letters_detail(server):
    call(server, "sendMsg", topic="t", msg="x", msgId="m", delayMillis=0, maxRetry=0)
    call(server, "pullMsg", topic="t")
    assert call(server, "ackMsg", topic="t", msgId="m", ack=False, reason="ValueError: bad order")["done"]
    [dead] = call(server, "getDeadMsgList", topic="t")["delayMsgList"]
    assert (dead["deadReason"], dead["deadDetail"]) == ("retries_exhausted", "ValueError: bad order")
    only_nack = call(server, "ackMsg", topic="t", msgId="m", reason="x")
    assert only_nack == {"code": 400, "msg": "reason: only with ack=false"}
    too_long = call(server, "ackMsg", topic="t", msgId="m", ack=False, reason="x" * 201)
    assert too_long == {"code": 400, "msg": "reason: Ensure this field has no more than 200 characters."}


def test_the_ttl_ends_a_message_never_delivered_as_expired_and_one_delivered_as_exhausted(server, client):
    client.send("t", "never pulled", msg_id="a", ttl_ms=10_000)
    client.send("t", "pulled", msg_id="b", ttl_ms=10_000, delay_ms=1)
    server.clock.advance(0.001)
    assert [m.msg_id for m in client.pull("t", batch=1)] == ["a"]
    client.nack("t", "a", delay_ms=60_000)  # its expireTime stays: the delay outlasts it
    server.clock.advance(10)
    assert client.pull("t") == []
    assert (client.get("t", "a").status, client.get("t", "b").status) == (EXHAUSTED, EXPIRED)
    dead = client.dead_letters("t").messages
    assert sorted((m.msg_id, m.dead_reason, m.status) for m in dead) == [("a", "expired", EXHAUSTED),
                                                                        ("b", "expired", EXPIRED)]
    server.clock.advance(300)  # past the ended retention: getMsg forgets it, the msgId stays taken
    assert client.get("t", "a") is None
    assert client.send("t", "again", msg_id="a").status == EXHAUSTED


def test_a_dead_letter_is_listed_with_its_priority_and_redriven_with_its_ttl_as_sent(server, client):
    """As the server: the list shows its priority, and a nack's delay past its TTL (which moved its
    triggerTime, not its expireTime) does not leave the new life without a TTL."""
    client.send("t", "x", msg_id="m", ttl_ms=10_000, priority=4)
    client.pull("t")
    client.nack("t", "m", delay_ms=60_000)
    server.clock.advance(10)
    [dead] = client.dead_letters("t").messages
    assert (dead.dead_reason, dead.priority) == ("expired", 4)
    client.redrive("t")
    back = client.get("t", "m")
    assert (back.status, back.expire_time - back.trigger_time, back.priority) == (READY, 10_000, 4)


def test_a_topic_without_dead_letters_lists_none_and_redrive_and_purge_take_them_back(client):
    client.send("t", "x", msg_id="m", max_retry=0)
    client.pull("t")
    client.nack("t", "m")
    client.set_topic_config("t", dead_letter=False)
    assert client.dead_letters("t").messages == []
    with pytest.raises(NotFound, match="topic t has no dead letters"):
        client.redrive("t")
    client.set_topic_config("t", dead_letter=True)
    task = client.redrive("t", ["m"])
    assert client.redrive_task(task) == {"moved": 1, "left": 0, "state": "done"}
    back = client.get("t", "m")
    assert (back.status, back.retry, back.max_retry) == (READY, 0, 0)
    client.pull("t")
    client.nack("t", "m", dead_letter=True)
    assert client.purge_dead("t") == 1
    assert client.dead_letters("t").messages == [] and client.get("t", "m") is None


def test_dead_letters_page_oldest_death_first(server, client):
    for i in range(5):
        client.send("t", "x", msg_id=f"m{i}")
    for i in range(5):
        client.pull("t")
        client.nack("t", f"m{i}", dead_letter=True)
        server.clock.advance(0.001)
    first = client.dead_letters("t", limit=3)
    rest = client.dead_letters("t", limit=3, cursor=first.next_cursor)
    assert [m.msg_id for m in first.messages + rest.messages] == [f"m{i}" for i in range(5)]
    assert rest.next_cursor is None


def test_touch_moves_the_ack_deadline_of_a_consuming_message_only(server, client):
    client.send("t", "x", msg_id="m")
    client.pull("t", ack_timeout_ms=1000)
    assert client.touch("t", "m", ack_timeout_ms=5000) == server.clock.now_ms() + 5000
    server.clock.advance(4)
    assert client.pull("t") == []  # not given back at the first deadline
    server.clock.advance(1)
    assert [m.retry for m in client.pull("t")] == [2]
    client.ack("t", "m")
    with pytest.raises(Conflict, match=r"message m is not being consumed \(status 4\)"):
        client.touch("t", "m", ack_timeout_ms=10)
    with pytest.raises(NotFound, match="message nope not found in topic t"):
        client.touch("t", "nope", ack_timeout_ms=10)


def test_reschedule_moves_trigger_and_expire_time_and_run_now_makes_it_ready(server, client):
    sent = client.send("t", "x", msg_id="m", delay_ms=60_000)
    moved = client.reschedule("t", "m", delay_ms=120_000)
    now = server.clock.now_ms()
    assert (moved.trigger_time, moved.expire_time) == (now + 120_000, sent.expire_time + 60_000)
    assert client.reschedule("t", "m", trigger_time=0).status == READY
    client.pull("t")
    with pytest.raises(Conflict, match="is being consumed"):
        client.reschedule("t", "m", delay_ms=1)
    client.ack("t", "m")
    with pytest.raises(NotFound, match=r"has already ended \(status 4\)"):
        client.reschedule("t", "m", delay_ms=1)


def test_delete_ends_a_live_message_and_release_forgets_its_body(client):
    client.send("t", "x", msg_id="m", delay_ms=1000)
    assert client.delete("t", "m") is True and client.delete("t", "m") is False
    assert client.get("t", "m").status == DELETED
    client.send("t", "x", msg_id="n")
    client.delete("t", "n", release=True)
    assert client.get("t", "n") is None


def test_topic_info_counts_waiting_by_delay_ready_and_consuming_and_a_paused_topic_hands_out_nothing(client):
    client.send("t", "a", delay_ms=30_000)
    client.send("t", "b", delay_ms=2 * 3_600_000)
    for _ in range(3):
        client.send("t", "c")
    client.pull("t")
    info = client.topic_info("t")
    assert (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == (2, 2, 1)
    assert (info["waitingQueueInfo"]["sizeOf0To1min"], info["waitingQueueInfo"]["sizeOf1hourTo6hour"]) == (1, 1)
    assert [t["topic"] for t in client.topic_infos()] == ["t"]
    client.pause("t")
    assert client.pull("t", batch=5) == [] and client.topic_config("t")["paused"] is True
    client.resume("t")
    assert len(client.pull("t", batch=5)) == 2
    assert client.purge("t") == 5  # two waiting, three consuming


def test_topic_settings_are_defaults_of_sends_and_pulls_and_back_to_the_service_default_at_zero(server, client):
    config = client.set_topic_config("t", ttl_ms=5000, max_retry=1, ack_timeout_ms=2000)
    assert (config["ttlMillis"], config["maxRetry"], config["ackTimeoutMillis"]) == (5000, 1, 2000)
    sent = client.send("t", "x", msg_id="m")
    assert (sent.expire_time - sent.trigger_time, sent.max_retry) == (5000, 1)
    client.pull("t")
    server.clock.advance(2)
    assert client.get("t", "m").status == READY  # given back at the topic's ack timeout
    reset = client.set_topic_config("t", ttl_ms=0, max_retry=-1)
    assert (reset["ttlMillis"], reset["maxRetry"]) == (3_600_000, 10)


@pytest.mark.parametrize("send,error", [
    ({"priority": 10}, "priority: Ensure this value is less than or equal to 9."),
    ({"delay_ms": 5, "trigger_time": 5}, "triggerTime: give triggerTime or delayMillis, not both"),
    ({"msg_id": "a" * 257}, "msgId: Ensure this field has no more than 256 characters."),
    ({"msg_id": "a\n"}, "msgId: must not contain control characters"),
    ({"topic": ""}, "topic: must be 1-255 bytes of UTF-8 text without control characters; it is empty"),
    ({"max_retry": 100_001}, "maxRetry: Ensure this value is less than or equal to 100000."),
    ({"delay_ms": 10 ** 13}, "delayMillis: Ensure this value is less than or equal to 315360000000."),
])
def test_bad_sends_answer_code_400_with_the_servers_words(client, send, error):
    with pytest.raises(BadRequest) as raised:
        client.send(send.pop("topic", "t"), "x", **send)
    assert (raised.value.code, raised.value.msg) == (400, error)


def test_other_bad_parameters_and_a_bad_batch_item_answer_as_the_server(server, client):
    with pytest.raises(BadRequest, match="^batch: must be at most 1000$"):
        client.pull("t", batch=1001)
    with pytest.raises(BadRequest, match="^ackTimeoutMillis: Ensure this value is greater than or equal to 1.$"):
        client.touch("t", "m", ack_timeout_ms=0)
    with pytest.raises(BadRequest, match="^delayMillis: give exactly one of delayMillis and triggerTime$"):
        client.reschedule("t", "m")
    with pytest.raises(BadRequest, match="^deadLetter: cannot be given with delayMillis$"):
        client.nack("t", "m", delay_ms=1, dead_letter=True)
    assert call(server, "sendMsg", topic="t", msg="x") == {"code": 400, "msg": "delayMillis: This field is required."}
    ok, bad = client.send_many([{"topic": "t", "msg": "fine"}, {"topic": "t", "msg": "x", "priority": -1}])
    assert ok.msg == "fine"
    assert (bad.code, bad.msg) == (400, "message 1: priority: Ensure this value is greater than or equal to 0.")
    status, answer = server.post("sendMsg", b'{"topic": "t", "msg": "x", "delayMillis": 0, "msg": "y"}')
    assert (status, json.loads(answer)) == (200, {"code": 400, "msg": "msg: given more than once in the request body"})


def test_an_unknown_endpoint_answers_as_djangos_404_page_not_the_envelope(server, client):
    status, content = server.post("noSuchEndpoint", b"{}")
    assert status == 404 and b"Not Found" in content
    with pytest.raises(NotTheAPI, match="HTTP 404 answer, not the delay queue API's"):
        client._run(Call("noSuchEndpoint", {}, lambda answer: answer, idempotent=True))


def test_the_clients_retries_run_on_injected_faults(server, client):
    client.send("t", "x", msg_id="m")
    server.fail_next("getMsg", times=2, status=200, content=b'{"code":500,"msg":"redis unavailable: timed out"}')
    server.fail_next("getMsg", error=NotSent)
    assert client.get("t", "m").msg_id == "m"  # an idempotent call goes again: four attempts
    assert server.calls[-4:] == ["getMsg"] * 4
    client.pull("t")
    server.fail_next("ackMsg", error=MaybeSent, after_applying=True)
    with pytest.raises(ServerError):  # an ack is not sent twice: its lost answer is the caller's to judge
        client.ack("t", "m")
    assert client.get("t", "m").status == ACKED  # it was applied


def test_a_fault_for_the_next_call_is_not_taken_by_a_long_poll_held_since_before(server):
    # A held long poll's later attempts (not in `calls`) took it: the test's next call then went through.
    polling, client = server.client(max_retries=0), server.client(max_retries=0)
    answers = []
    poller = threading.Thread(target=lambda: answers.append(polling.pull("t", wait_ms=5_000)))
    poller.start()
    wait_for(lambda: "longPollingMsg" in server.calls, what="the long poll held")
    server.fail_next()
    poller.join(10)
    assert answers == [[]]
    with pytest.raises(ServerError):
        client.get("t", "m")
    assert server.calls == ["longPollingMsg", "getMsg"]


def test_the_producer_sends_through_the_fake(server, client):
    with client.producer(linger_ms=1, max_batch=100) as producer:
        futures = [producer.send("t", f"m{i}", msg_id=f"m{i}") for i in range(250)]
    assert [f.result().msg_id for f in futures] == [f"m{i}" for i in range(250)]
    assert client.topic_info("t")["readyQueueSize"] == 250


def test_a_send_blocked_on_a_full_producer_fails_when_it_closes_and_those_queued_go_out(client):
    release = threading.Event()
    send_batch = client._send_batch
    client._send_batch = lambda bodies, sends=None: release.wait(30) and send_batch(bodies, sends)  # slow to answer
    producer = client.producer(linger_ms=0, max_batch=1, in_flight=1, max_queue=1)
    sent = [producer.send("t", "out")]
    wait_for(lambda: producer._queue.empty(), what="'out' taken for a batch")
    sent += [producer.send("t", "next")]  # taken for the next batch, while the first is held
    wait_for(lambda: producer._queue.empty(), what="'next' taken for a batch")
    sent += [producer.send("t", "queued")]  # the queue's one place
    outcome = []
    blocked = threading.Thread(target=lambda: outcome.append(_raised(producer.send, "t", "blocked")))
    blocked.start()
    closing = threading.Thread(target=producer.close)
    closing.start()
    blocked.join(10)  # raised while the batch is still held: close did not wait for room
    assert not blocked.is_alive() and isinstance(outcome[0], RuntimeError) and "closed" in str(outcome[0])
    release.set()
    closing.join(30)
    assert [f.result(timeout=30).msg for f in sent] == ["out", "next", "queued"]


def test_a_producers_futures_wait_for_their_own_answer_and_work_with_waits_and_callbacks(client):
    """The producer's futures share one condition (producer._SendFuture): another send's answer
    wakes a waiter, which waits on until its own comes; concurrent.futures' wait and as_completed,
    callbacks and cancels behave as on any Future."""
    release = threading.Event()
    send_batch = client._send_batch
    client._send_batch = lambda bodies, sends=None: release.wait(30) and send_batch(bodies, sends)
    producer = client.producer(linger_ms=0, max_batch=1, in_flight=1)
    first = producer.send("t", "first")
    wait_for(lambda: producer._queue.empty(), what="'first' taken for a batch")
    second, third = producer.send("t", "second"), producer.send("t", "third")
    assert third.cancel() and third.cancelled()  # not yet sent: it never will be
    called = []
    first.add_done_callback(lambda f: called.append(("first", f.result().msg)))
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(second.result(timeout=30).msg))
    waiter.start()
    with pytest.raises(concurrent.futures.TimeoutError):
        second.result(timeout=0.05)
    release.set()
    waiter.join(30)  # woken by first's answer, it waited on for its own
    assert outcome == ["second"] and called == [("first", "first")]
    done, not_done = concurrent.futures.wait([first, second, third], timeout=30)
    assert done == {first, second, third} and not not_done
    assert sorted(f.result().msg for f in concurrent.futures.as_completed([first, second], timeout=30)) == [
        "first", "second"]
    second.add_done_callback(lambda f: called.append(("second", f.exception())))  # already done: runs at once
    assert called[-1] == ("second", None)
    producer.close()
    assert client.topic_info("t")["readyQueueSize"] == 2


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return None


def test_a_worker_runs_on_the_fake_retrying_a_failing_handler_as_the_server_would(server, client):
    client.set_topic_config("jobs", retry_backoff_ms=10_000)
    handled, failed_once = [], set()

    def handler(message):
        if message.msg == "flaky" and message.msg_id not in failed_once:
            failed_once.add(message.msg_id)
            raise RuntimeError("first try fails")
        handled.append((message.msg, message.retry))

    for body in ("a", "flaky", "b"):
        client.send("jobs", body, msg_id=body)
    client.send("jobs", "later", msg_id="later", delay_ms=60_000)
    worker = Worker(client, "jobs", handler, concurrency=2, wait_ms=1000)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        wait_for(lambda: len(handled) == 2 and client.get("jobs", "flaky").status == WAITING, what="first pass")
        server.clock.advance(10)  # the flaky one's backoff
        wait_for(lambda: len(handled) == 3, what="the retry")
        server.clock.advance(50)
        wait_for(lambda: len(handled) == 4, what="the delayed one")
    finally:
        worker.stop()
        runner.join(timeout=30)
    assert sorted(handled) == [("a", 1), ("b", 1), ("flaky", 2), ("later", 1)]
    assert {client.get("jobs", m).status for m in ("a", "b", "flaky", "later")} == {ACKED}


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_handler_exception_the_worker_cannot_read_still_settles_its_message(server, client, asynchronous):
    # Their outcome failed to compute after the message was marked decided: never settled, a drain never ended.
    def raised(message):
        if message.msg == "exc":
            raise DeadLetter(ValueError("not a number"))  # a reason that is not a str
        raise Unprintable()

    async def raised_async(message):
        raised(message)

    client.send("odd", "exc", msg_id="d")
    client.send("odd", "unprintable", msg_id="u")
    worker = (Worker(server.async_client(), "odd", raised_async, wait_ms=10) if asynchronous else
              Worker(client, "odd", raised, wait_ms=10))
    runner = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False},
                              daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the worker did not finish"
    assert [(m.msg_id, m.dead_detail) for m in client.dead_letters("odd").messages] == [("d", "not a number")]
    assert client.get("odd", "u").status == READY  # nacked: delivered again


def test_a_long_poll_is_woken_by_a_send_and_on_a_real_time_clock_by_a_message_falling_due():
    server = FakeServer(real_time=True)
    with server.client() as client:
        client.send("t", "soon", delay_ms=200)
        assert [m.msg for m in client.pull("t", wait_ms=10_000)] == ["soon"]
        got: list = []
        poller = threading.Thread(target=lambda: got.extend(client.pull("u", wait_ms=10_000)))
        poller.start()
        client.send("u", "now")
        poller.join(timeout=30)
        assert [m.msg for m in got] == ["now"]


def test_a_long_poll_on_a_still_clock_answers_empty_soon(server, client):
    assert client.pull("t", wait_ms=60_000) == []


async def test_an_async_client_runs_on_the_fake_and_its_long_poll_wakes_on_a_send():
    server = FakeServer(real_time=True)
    client = server.async_client()
    try:
        sent = await client.send("t", "x", msg_id="m", delay_ms=1000)
        assert sent.status == WAITING
        waiting = asyncio.create_task(client.pull("u", wait_ms=10_000))
        await asyncio.sleep(0.01)
        await client.send("u", "woken")
        assert [m.msg for m in await waiting] == ["woken"]
        assert await client.ack("u", (await client.get("u", (await waiting)[0].msg_id)).msg_id)
    finally:
        await client.aclose()


def test_a_clock_moves_only_ahead_and_a_given_start_is_kept():
    clock = FakeClock(start=1_000)
    assert clock.now_ms() == 1_000_000
    clock.advance(timedelta(minutes=1))
    assert clock.time() == 1_060
    with pytest.raises(ValueError, match="only moves ahead"):
        clock.advance(-1)


def test_the_pytest_fixtures_give_a_client_on_the_fake_and_its_clock(delayqueue_fake, delayqueue_client,
                                                                     delayqueue_clock):
    delayqueue_client.send("t", "x", delay_ms=5000)
    assert delayqueue_client.pull("t") == []
    delayqueue_clock.advance(5)
    assert len(delayqueue_client.pull("t")) == 1
    assert delayqueue_fake.calls == ["sendMsg", "pullMsg", "pullMsg"]


def test_the_testing_examples_of_docs_sdk_md_run_as_written(tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs/sdk.md").read_text(), re.MULTILINE | re.DOTALL)
    [example] = [b for b in blocks if "server = FakeServer()" in b]
    ran = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (0, "fake ok\n"), ran.stderr
    [fixtures] = [b for b in blocks if "pytest_plugins" in b]
    (tmp_path / "test_example.py").write_text(fixtures)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_example.py")]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # only what the example enables
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr


def test_an_async_producer_not_closed_whose_sends_fail_as_its_loop_ends_names_them_lost(caplog):
    """Sent as asyncio.run ends, their futures are read by no one: a failure left there said nothing."""
    server = FakeServer()
    server.fail_next("sendMsgBatch", times=2)

    async def main():
        producer = server.async_client(max_retries=0).producer(linger_ms=60_000)
        for i in range(3):
            producer.send("t", "x", msg_id=f"m{i}")

    with caplog.at_level(logging.WARNING, logger="delayqueue_client.producer"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "delayqueue_client.producer"]
    assert said == [
        "an AsyncProducer never closed lost 3 sends (msgIds m0, m1, m2) as its loop ended, their sending failed "
        "(Unavailable: delayqueue server unreachable: HTTP 503 answer, not the API's envelope): close it with await "
        "aclose() or async with"]


def test_the_producer_fails_a_refused_item_with_its_class_and_sends_the_rest(client):
    with client.producer(linger_ms=1) as producer:
        good, bad = producer.send("t", "fine", msg_id="ok"), producer.send("t", "x", priority=10)
    assert good.result().msg_id == "ok"
    with pytest.raises(BadRequest, match="priority: Ensure this value is less than or equal to 9."):
        bad.result()


def test_a_worker_dead_letters_on_dead_letter_and_touches_a_handler_slower_than_half_its_ack_timeout(server, client):
    from delayqueue_client import DeadLetter

    def handler(message):
        if message.msg == "poison":
            raise DeadLetter("cannot parse")
        wait_for(lambda: server.calls.count("touchMsg") >= 2, what="two touches while the handler runs")

    client.send("jobs", "poison", msg_id="p")
    client.send("jobs", "slow", msg_id="s")
    worker = Worker(client, "jobs", handler, concurrency=2, ack_timeout_ms=200, wait_ms=100)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        wait_for(lambda: client.get("jobs", "s").status == ACKED, what="the slow one acked")
    finally:
        worker.stop()
        runner.join(timeout=30)
    assert [(m.msg_id, m.dead_reason) for m in client.dead_letters("jobs").messages] == [("p", "dead_lettered")]


def test_a_body_nested_too_deep_for_json_is_handled_and_settled_under_middleware(client):
    """Reading a body as a task envelope for the middleware's context raised RecursionError outside
    the handler: the thread worker never settled the message, touched it for ever, never drained."""
    handled = []
    client.send("jobs", "[" * 100_000, msg_id="deep")
    worker = Worker(client, "jobs", lambda m: handled.append(m.msg_id), middleware=[Middleware()], wait_ms=50)
    runner = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    runner.start()
    runner.join(timeout=10)
    if runner.is_alive():
        worker.stop()
        worker.stop()
        runner.join(timeout=10)
    assert handled == ["deep"] and client.get("jobs", "deep").status == ACKED


class Settles(Middleware):
    def __init__(self):
        self.settled = []

    def after_settle(self, ctx):
        self.settled.append((ctx.message.msg_id, ctx.message.retry, ctx.outcome, ctx.done))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_what_a_worker_gives_back_without_its_settle_loop_reaches_after_settle(server, client, asynchronous):
    # Sent from run() once the settle loop failed, the give-backs skipped after_settle: middleware missed them.
    failed, release = threading.Event(), threading.Event()
    settles = Settles()
    worker_client = server.async_client() if asynchronous else client
    ack_many = worker_client.ack_many

    def first_fails(*args, **kwargs):
        if not failed.is_set():
            failed.set()
            raise KeyError("a bug in the settle path")
        return ack_many(*args, **kwargs)

    def handler(message):
        if message.msg_id == "slow":
            release.wait(10)

    async def handler_async(message):
        if message.msg_id == "slow":
            await asyncio.sleep(10)
    worker_client.ack_many = first_fails
    client.send("jobs", "fast", msg_id="fast")
    client.send("jobs", "slow", msg_id="slow")
    worker = Worker(worker_client, "jobs", handler_async if asynchronous else handler, concurrency=2, batch=2,
                    wait_ms=10, middleware=[settles])
    with pytest.raises(WorkerFailed):
        worker.run(install_signal_handlers=False)
    release.set()
    # A poll under way may take it again once given back: that delivery is given back too, and settled as such.
    assert ("slow", 1, "nack", True) in settles.settled and {s[::2] for s in settles.settled} == {("slow", "nack")}
    assert client.get("jobs", "slow").status == READY


def test_a_worker_settling_a_delivery_whose_ack_timeout_passed_leaves_the_next_delivery_alone(server, client):
    started, release = threading.Event(), threading.Event()

    def handler(message):
        started.set()
        release.wait(30)

    client.send("jobs", "x", msg_id="m")
    worker = Worker(client, "jobs", handler, concurrency=1, ack_timeout_ms=60_000, wait_ms=100)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        assert started.wait(30)
        server.clock.advance(61)  # its ack timeout passes while the handler runs: delivered again, elsewhere
        [again] = client.pull("jobs", ack_timeout_ms=60_000)
        assert again.retry == 2
        release.set()
        wait_for(lambda: server.calls.count("ackMsgBatch") == 1, what="the worker's ack, late")
    finally:
        release.set()
        worker.stop()
        runner.join(timeout=30)
    assert client.get("jobs", "m").status == CONSUMING  # the worker's ack named its own delivery, which had ended
    assert client.ack("jobs", "m", retry=2)


async def test_an_async_worker_runs_on_the_fake_and_stops_after_settling():
    server = FakeServer()
    client = server.async_client()
    handled = []

    async def handler(message):
        handled.append(message.msg)
        if len(handled) == 3:
            worker.stop()

    for i in range(3):
        await client.send("jobs", f"m{i}", msg_id=f"m{i}")
    worker = Worker(client, "jobs", handler, concurrency=3, wait_ms=100)
    try:
        await asyncio.wait_for(worker.run_async(install_signal_handlers=False), 30)
        assert sorted(handled) == ["m0", "m1", "m2"]
        assert {(await client.get("jobs", f"m{i}")).status for i in range(3)} == {ACKED}
    finally:
        await client.aclose()


def test_an_async_workers_signal_handlers_give_back_the_ones_before_it():
    """As a thread worker's run() does: asyncio's remove_signal_handler alone resets to the default."""
    server = FakeServer()

    async def handler(message):
        pass

    def mine(signum, frame):
        pass

    assert threading.current_thread() is threading.main_thread()  # where the worker installs its own
    before = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Worker(server.async_client(), "jobs", handler).run(burst=True)
        assert [signal.getsignal(sig) for sig in before] == [mine, mine]
    finally:
        for sig, handler_before in before.items():
            signal.signal(sig, handler_before)


def test_an_async_workers_signal_handlers_leave_a_loops_own_in_place():
    """A handler of the loop's (loop.add_signal_handler) was dropped by run_async's own removal:
    SIGTERM then reached no one, and a process could no longer be stopped by it."""
    server = FakeServer()
    got = []

    async def handler(message):
        pass

    async def main():
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, got.append, "mine")
        await Worker(server.async_client(), "jobs", handler).run_async(burst=True)
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # the kill below ends no test run
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)

    assert threading.current_thread() is threading.main_thread()  # where the worker installs its own
    before = signal.getsignal(signal.SIGTERM)
    try:
        asyncio.run(main())
    finally:
        signal.signal(signal.SIGTERM, before)
    assert got == ["mine"]


def test_a_ctrl_c_in_the_async_settle_loops_step_is_raised_not_a_failed_settle_loop(caplog):
    """asyncio's second Ctrl-C raises where the loop's thread is: in the settle task's step too."""
    server = FakeServer()
    client = server.async_client()
    ack_many, calls = client.ack_many, []

    async def handler(message):
        pass

    async def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return await ack_many(*args, **kwargs)

    client.ack_many = interrupted_once
    server.client().send("jobs", "x", msg_id="m0")
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        Worker(client, "jobs", handler, wait_ms=100).run(install_signal_handlers=False)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("handler_timeout", [None, 10])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_an_async_handler_under_a_loop_of_ones_own_stops_hard_giving_back(interrupt, handler_timeout):
    """Ctrl-C while a handler runs, without the worker's signal handlers (or sys.exit() in it):
    raised out of its task, it ended run_until_complete with every task pending, nothing given back.
    With a handler_timeout too: Python 3.11's wait_for ran the handler in a task of its own."""
    server = FakeServer()
    client = server.async_client()

    async def handler(message):
        if message.msg_id == "m0":
            raise interrupt
        await asyncio.sleep(30)

    loop = asyncio.new_event_loop()
    try:
        for i in range(3):
            loop.run_until_complete(client.send("jobs", "x", msg_id=f"m{i}"))
        with pytest.raises(interrupt):
            loop.run_until_complete(Worker(client, "jobs", handler, concurrency=3, handler_timeout=handler_timeout)
                                    .run_async(install_signal_handlers=False))
        assert asyncio.all_tasks(loop) == set()
        assert [loop.run_until_complete(client.get("jobs", f"m{i}")).status for i in range(3)] == [READY] * 3
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


def test_sys_exit_in_a_thread_handler_stops_the_worker_hard_as_in_an_async_one():
    # A thread handler's sys.exit() was only its message's failure, the worker running on, where an async
    # handler's stopped it (as a signal handler's SystemExit, landing in a handler's step, must).
    server = FakeServer()
    client = server.client()
    release = threading.Event()

    def handler(message):
        if message.msg_id == "m0":
            sys.exit(3)
        release.wait(10)

    for i in range(3):
        client.send("jobs", "x", msg_id=f"m{i}")
    worker = Worker(client, "jobs", handler, concurrency=3, wait_ms=50)
    raised = []
    runner = threading.Thread(target=lambda: raised.extend(run_catching(worker)))
    runner.start()
    runner.join(10)
    release.set()
    if runner.is_alive():
        worker.stop()
        runner.join(10)
    assert [type(e) for e in raised] == [SystemExit] and raised[0].code == 3
    assert [client.get("jobs", f"m{i}").status for i in range(3)] == [READY] * 3  # m0 nacked, the others given back


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_ctrl_c_in_a_handler_gives_its_message_back_as_the_others_not_as_failed(asynchronous, caplog):
    """A KeyboardInterrupt out of a handler (Ctrl-C landing in an async handler's step, without the worker's
    signal handlers) is the operator stopping the worker: its message was nacked as failed (after the retry
    backoff, logged as an error, after_handle told of a failure) while the others in hand were given back."""
    server = FakeServer()
    handled, release = [], threading.Event()

    class Recorder(Middleware):
        def after_handle(self, ctx, error):
            handled.append((ctx.message.msg_id, error, ctx.interrupted))

    async def async_handler(message):
        if message.msg_id == "m0":
            raise KeyboardInterrupt
        await asyncio.sleep(30)

    def thread_handler(message):
        if message.msg_id == "m0":
            raise KeyboardInterrupt
        release.wait(10)

    for i in range(3):
        server.client().send("jobs", "x", msg_id=f"m{i}")
    client, handler = (server.async_client(), async_handler) if asynchronous else (server.client(), thread_handler)
    worker = Worker(client, "jobs", handler, concurrency=3, wait_ms=50, retry_backoff=(60, 60),
                    middleware=[Recorder()])
    with caplog.at_level(logging.WARNING):
        raised = run_catching(worker)
    release.set()
    assert [type(e) for e in raised] == [KeyboardInterrupt]
    assert [server.client().get("jobs", f"m{i}").status for i in range(3)] == [READY] * 3  # none backing off
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert ("m0", None, True) in handled


def run_on_a_loop_of_ones_own_then_close_it(worker):
    """run_until_complete() that a KeyboardInterrupt ends between steps, its tasks left pending, then
    the loop closed: collecting a pending task closes its coroutine (GeneratorExit), as here."""
    loop = asyncio.new_event_loop()

    def quiet_about_pending_tasks(loop, context):
        # asyncio's own, logged whenever a task is collected (in a later test, which it must not disturb).
        if context.get("message") != "Task was destroyed but it is pending!":
            loop.default_exception_handler(context)

    try:
        loop.run_until_complete(worker.run_async(install_signal_handlers=False))
    finally:
        pending = asyncio.all_tasks(loop)
        loop.set_exception_handler(quiet_about_pending_tasks)
        loop.close()
        for task in pending:
            if task.get_coro().__qualname__.startswith("Worker."):
                task.get_coro().close()  # raises RuntimeError when it awaits on (coroutine ignored GeneratorExit)
            else:  # asyncio's own Queue.get, under wait_for, cancels a future on the closed loop
                with contextlib.suppress(RuntimeError):
                    task.get_coro().close()


@pytest.mark.parametrize("how", ["run", "asyncio.run", "own loop"])
def test_an_interrupt_the_event_loop_of_an_async_workers_run_raises_stops_it_hard_giving_back(how, caplog):
    """Ctrl-C while the loop waits (a second one, asyncio.run's first cancelling): it left run_async's
    tasks pending, and closing the loop cancelled them all, nothing given back. Under asyncio.run,
    whose closing cancels every task, that is no failed settle loop or handler either; under a loop of
    one's own, closed with them pending, they can do nothing (left to their ack timeout) but say nothing.
    Their middleware is told so: interrupted, not failed (a span in error, a failure counted)."""
    server = FakeServer()
    client = server.async_client()
    handled = []

    class Recorder(Middleware):
        def after_handle(self, ctx, error):
            handled.append((ctx.message.msg_id, error, ctx.interrupted))

    def interrupt():
        raise KeyboardInterrupt

    async def handler(message):
        if message.msg_id == "m0":
            asyncio.get_running_loop().call_soon(interrupt)
        await asyncio.sleep(30)

    for i in range(3):
        server.client().send("jobs", "x", msg_id=f"m{i}")
    worker = Worker(client, "jobs", handler, concurrency=3, wait_ms=100, middleware=[Recorder()])
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        if how == "asyncio.run":
            asyncio.run(worker.run_async(install_signal_handlers=False))
        elif how == "own loop":
            run_on_a_loop_of_ones_own_then_close_it(worker)
        else:
            worker.run(install_signal_handlers=False)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("delayqueue")] \
        == []
    status = CONSUMING if how == "own loop" else READY
    assert [server.client().get("jobs", f"m{i}").status for i in range(3)] == [status] * 3
    assert sorted(handled) == [(f"m{i}", None, True) for i in range(3)]


async def test_a_cancelled_async_worker_draining_still_stops_hard_on_a_second_stop():
    server = FakeServer()
    client = server.async_client()

    async def handler(message):
        await asyncio.sleep(30)

    for i in range(3):
        await client.send("jobs", "x", msg_id=f"m{i}")
    worker = Worker(client, "jobs", handler, concurrency=3, wait_ms=100)
    running = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    while worker._unhandled < 3:  # all three in hand, their handlers running
        await asyncio.sleep(0.01)
    running.cancel()  # a drain: it waits for the handlers
    await asyncio.sleep(0.05)
    worker.stop()
    worker.stop()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 5)  # not the handlers' 30 s
    assert [(await client.get("jobs", f"m{i}")).status for i in range(3)] == [READY] * 3
    await client.aclose()


def test_a_client_made_elsewhere_is_answered_by_the_fake_once_installed():
    from delayqueue_client import Client

    class CountingClient(Client):
        sends = 0

        def send(self, *args, **kwargs):
            self.sends += 1
            return super().send(*args, **kwargs)

    server = FakeServer()
    with server.install(CountingClient("http://127.0.0.1:9")) as client:  # nothing listens there
        assert client.send("t", "x").status == READY and client.sends == 1
    assert server.calls == ["sendMsg"]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_task_given_up_at_the_handler_timeout_waits_its_own_retry_backoff(server, client, asynchronous):
    # The timeout was the one failure a task's retry_backoff did not cover: redelivered at once (topic backoff 0).
    from delayqueue_client import App
    release = threading.Event()
    app = App(client, async_client=server.async_client())

    @app.task(name="hangs", topic="slow", retry_backoff=(30, 600))
    def hangs() -> None:
        release.wait(20)

    @app.task(name="hangs_async", topic="slow", retry_backoff=(30, 600))
    async def hangs_async() -> None:
        await asyncio.sleep(20)

    sent = (hangs_async if asynchronous else hangs).send()
    worker = app.worker("slow", asynchronous=asynchronous, handler_timeout=0.2, wait_ms=50)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    runner.start()
    try:
        wait_for(lambda: client.get("slow", sent.msg_id).status == WAITING, what="the timed-out message nacked")
    finally:
        release.set()
        worker.stop()
        runner.join(timeout=30)
    assert client.get("slow", sent.msg_id).trigger_time - server.clock.now_ms() == 30_000


@pytest.mark.parametrize("how", ["run", "asyncio.run"])
def test_an_async_worker_returns_from_run_while_a_plain_task_past_its_timeout_runs_on(server, client, how):
    # run()'s asyncio.run waited for asyncio.to_thread's thread at the loop's end: a drain never ended. Under
    # asyncio.run(run_async()) it still did, the thread in the loop's default executor, unseen by abandoned_handlers.
    # The worker's threads end with it: under a loop of one's own, idle, they stayed until the process exited.
    from delayqueue_client import App
    release, before = threading.Event(), set(threading.enumerate())
    app = App(client, async_client=server.async_client())

    @app.task(name="hangs", topic="slow", retry_backoff=60)
    def hangs() -> None:
        release.wait(30)

    sent = hangs.send()
    worker = app.worker("slow", asynchronous=True, handler_timeout=0.2, wait_ms=50)
    run = worker.run if how == "run" else lambda **options: asyncio.run(worker.run_async(**options))
    runner = threading.Thread(target=run, kwargs={"install_signal_handlers": False}, daemon=True)
    runner.start()
    try:
        wait_for(lambda: client.get("slow", sent.msg_id).status == WAITING, what="the timed-out message nacked")
        worker.stop()
        runner.join(timeout=10)
        assert not runner.is_alive(), "run() waited for the abandoned thread"
        assert worker.abandoned_handlers
    finally:
        release.set()
    wait_for(lambda: not [t for t in set(threading.enumerate()) - before if t.name.startswith("dq-to-thread")],
             what="the worker's threads ended")


def test_a_json_null_counts_as_an_absent_parameter_as_on_the_server(server):
    sent = call(server, "sendMsg", topic="t", msg="m", msgId=None, delayMillis=0, ttlMillis=None, priority=None)
    assert sent["code"] == 200 and len(sent["delayMsg"]["msgId"]) == 32
    assert call(server, "sendMsg", topic=None, msg="m", delayMillis=0)["code"] == 400
