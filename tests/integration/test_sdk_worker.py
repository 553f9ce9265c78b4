"""The SDK's Worker (delayqueue_client.Worker) against a real uvicorn server and a real scanner
process: a failure nacked and delivered again, DeadLetter, a handler slower than the ack timeout
(touched, delivered once), the concurrency bound, async handlers, SIGTERM to a worker process
mid-batch (what it holds is finished and acked, the rest left for others, exit 0), and what
docs/sdk.md promises of failures: outcomes given up past their deadline, the 30 s ack timeout
of a consume-only token, a fatal pull error raised after settling, a cancelled run_async()."""
import asyncio
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import pytest
import redis
from delayqueue_client import AsyncClient, BadRequest, Client, DeadLetter, MaybeApplied, Retry, ServerError, Worker
from delayqueue_client.worker import WorkerFailed

from delayqueue.live.keys import topic_keys
from delayqueue.models import MessageEvent
from tests.helpers import REDIS_URL, ROOT, scanner_env, wait_for
from tests.integration.test_tokens import new_token

pytestmark = pytest.mark.process


class ObservedClient(Client):
    """A real Client that records what its worker settles, and the most messages it held unhandled
    (pulled, less those whose handler counted itself in `handled`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.pulled = self.handled = self.peak_unhandled = self.largest_pull = 0
        self.settled: dict[str, list[str]] = defaultdict(list)  # ack/nack/dead -> msgIds
        self.reasons: dict[str, str | None] = {}  # msgId -> the reason of its last nack

    def pull(self, *args, **kwargs):
        pulled = super().pull(*args, **kwargs)
        with self.lock:
            self.pulled += len(pulled)
            self.largest_pull = max(self.largest_pull, len(pulled))
            self.peak_unhandled = max(self.peak_unhandled, self.pulled - self.handled)
        return pulled

    def count_handled(self):
        with self.lock:
            self.handled += 1

    def ack_many(self, topic, msg_ids, *, ack=True, delay_ms=None, dead_letter=False, reason=None, retries=None):
        done = super().ack_many(topic, msg_ids, ack=ack, delay_ms=delay_ms, dead_letter=dead_letter, reason=reason,
                                retries=retries)
        with self.lock:
            self.settled["ack" if ack else "dead" if dead_letter else "nack"].extend(msg_ids)
            if not ack:
                self.reasons.update(dict.fromkeys(msg_ids, reason))
        return done


@pytest.fixture
def client(sdk_server):
    with ObservedClient(sdk_server) as c:
        yield c


@pytest.fixture
def scanner(scanner_process):
    """A scanner process: it makes nacked messages ready again, times out unacked ones and writes the history."""
    scanner_process("sdk-worker").wait_started()


def reasons(topic: str, msg_id: str) -> list[str]:
    """The message's history as the log writer recorded it, oldest first."""
    return list(MessageEvent.objects.filter(topic=topic, msg_id=msg_id).order_by("at", "id")
                .values_list("reason", flat=True))


@contextmanager
def running(worker: Worker):
    """worker.run() in a thread (no signal handlers outside the main thread); stopped and joined after."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(15)
        assert not thread.is_alive(), "the worker did not stop"


def test_a_failure_is_nacked_and_delivered_again_and_dead_letter_ends_the_message(client, scanner, caplog):
    client.set_topic_config("jobs", retry_backoff_ms=100)
    client.send("jobs", "flaky", msg_id="f1")
    client.send("jobs", "poison", msg_id="p1")
    deliveries = defaultdict(list)

    def handler(message):
        deliveries[message.msg_id].append(message.retry)
        if message.msg == "poison":
            raise DeadLetter("cannot parse")
        if len(deliveries[message.msg_id]) == 1:
            raise RuntimeError("flaky the first time")

    with caplog.at_level(logging.WARNING, logger="delayqueue_client.worker"), \
            running(Worker(client, "jobs", handler, concurrency=2, wait_ms=300)):
        dead = wait_for(lambda: client.dead_letters("jobs").messages, timeout=15, what="the dead letter listed")
        wait_for(lambda: "acked" in reasons("jobs", "f1"), timeout=15, what="f1 acked")
    assert [(m.msg_id, m.dead_reason) for m in dead] == [("p1", "dead_lettered")]
    assert deliveries == {"f1": [1, 2], "p1": [1]}  # delivered again after the nack, then acked
    history = reasons("jobs", "f1")
    assert (history.count("pulled"), history.count("nacked"), history.count("acked")) == (2, 1, 1)
    assert history.index("nacked") < history.index("acked") and "ack_timeout" not in history
    failed = [r for r in caplog.records if r.levelno == logging.ERROR and "jobs/f1" in r.getMessage()]
    assert len(failed) == 1 and "flaky the first time" in str(failed[0].exc_info[1])
    assert "Traceback" in caplog.text
    assert client.settled == {"nack": ["f1"], "dead": ["p1"], "ack": ["f1"]}


def test_a_handler_slower_than_the_ack_timeout_is_touched_and_delivered_once(client, scanner):
    client.send("slow", "x", msg_id="s1")
    calls = []

    def handler(message):
        calls.append(message.msg_id)
        time.sleep(2.0)  # over three ack timeouts

    with running(Worker(client, "slow", handler, concurrency=1, ack_timeout_ms=600, wait_ms=300)):
        wait_for(lambda: "acked" in reasons("slow", "s1"), timeout=15, what="s1 acked")
        time.sleep(1.0)  # past another ack timeout: nothing comes again
    assert calls == ["s1"]
    history = reasons("slow", "s1")
    assert (history.count("pulled"), history.count("acked")) == (1, 1)
    assert history.count("touched") >= 3 and "ack_timeout" not in history
    assert client.settled == {"ack": ["s1"]}


def test_acks_refused_for_a_while_are_retried_while_the_running_handlers_stay_touched(client, scanner):
    # The ackMsgBatch calls fail (500: store unavailable) for 1.5 s; meanwhile the slow handler's
    # message must stay touched while f1's ack is tried again.
    client.send("flaky", "fast", msg_id="f1")
    client.send("flaky", "slow", msg_id="s1")
    refuse_until = time.monotonic() + 1.5
    ack_many = client.ack_many

    def refusing_ack_many(topic, msg_ids, **kwargs):
        if time.monotonic() < refuse_until:
            raise ServerError("redis unavailable: failing over")
        return ack_many(topic, msg_ids, **kwargs)
    client.ack_many = refusing_ack_many

    def handler(message):
        if message.msg_id == "s1":
            time.sleep(2.0)  # over three ack timeouts, while the acks are refused

    with running(Worker(client, "flaky", handler, concurrency=2, ack_timeout_ms=600, wait_ms=300)):
        wait_for(lambda: all("acked" in reasons("flaky", i) for i in ("f1", "s1")), timeout=15, what="both acked")
    history = reasons("flaky", "s1")  # f1, done and unacked past its deadline, may come back: at least once
    assert (history.count("pulled"), history.count("acked")) == (1, 1) and "ack_timeout" not in history
    assert history.count("touched") >= 3


def test_concurrency_bounds_the_handlers_and_the_batch_the_messages_in_hand(client):
    ids = [f"c{i}" for i in range(20)]
    client.send_many([{"topic": "many", "msg": i, "msg_id": i} for i in ids])
    lock, now, peak, handled = threading.Lock(), [0], [0], []

    def handler(message):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.03 * (int(message.msg_id[1:]) % 3 + 1))  # uneven, so they do not all end together
        with lock:
            now[0] -= 1
            handled.append(message.msg_id)
        client.count_handled()  # before the worker counts it: the observed peak is never low

    with running(Worker(client, "many", handler, concurrency=3, batch=10, wait_ms=300)):
        wait_for(lambda: len(client.settled["ack"]) == 20, timeout=15, what="all acked")
    assert peak[0] == 3 and client.peak_unhandled == 10  # reached, never passed
    assert sorted(handled) == sorted(ids) and sorted(client.settled["ack"]) == sorted(ids)  # each once


def test_the_default_batch_grows_for_fast_handlers_and_stays_small_for_slow_ones(client):
    client.send_many([{"topic": "fast", "msg": str(i)} for i in range(400)])
    fast = Worker(client, "fast", lambda message: None, concurrency=2, wait_ms=300)
    with running(fast):
        wait_for(lambda: len(client.settled["ack"]) == 400, timeout=30, what="all acked")
    assert fast.batch > 8 and client.largest_pull > 8  # above the first 4 per handler

    client.send_many([{"topic": "slow", "msg": str(i)} for i in range(12)])
    slow = Worker(client, "slow", lambda message: time.sleep(0.2), concurrency=2, wait_ms=300)
    with running(slow):
        wait_for(lambda: len(client.settled["ack"]) == 412, timeout=30, what="all acked")
    assert slow.batch == 2  # 0.2 s handlers: nothing queued beyond the two running


def test_an_async_handler_runs_as_tasks_on_an_async_client(sdk_server, client):
    ids = [f"a{i}" for i in range(8)]
    client.send_many([{"topic": "aio", "msg": i, "msg_id": i} for i in ids])
    acked, now, peak, handled = [], [0], [0], []
    pulled, peak_unhandled = [0], [0]

    class ObservedAsyncClient(AsyncClient):
        async def pull(self, *args, **kwargs):
            messages = await super().pull(*args, **kwargs)
            pulled[0] += len(messages)
            peak_unhandled[0] = max(peak_unhandled[0], pulled[0] - len(handled))
            return messages

        async def ack_many(self, topic, msg_ids, **kwargs):
            done = await super().ack_many(topic, msg_ids, **kwargs)
            acked.extend(msg_ids)
            return done

    async def handler(message):
        now[0] += 1
        peak[0] = max(peak[0], now[0])
        await asyncio.sleep(0.03 * (int(message.msg_id[1:]) % 3 + 1))
        now[0] -= 1
        handled.append(message.msg_id)

    async def main():
        async with ObservedAsyncClient(sdk_server) as aclient:
            worker = Worker(aclient, "aio", handler, concurrency=3, batch=6, wait_ms=300)
            running_worker = asyncio.create_task(worker.run_async(install_signal_handlers=False))
            while len(acked) < 8:
                assert not running_worker.done(), running_worker
                await asyncio.sleep(0.02)
            worker.stop()
            await asyncio.wait_for(running_worker, 10)

    asyncio.run(main())
    assert peak[0] == 3 and peak_unhandled[0] == 6 and sorted(handled) == sorted(acked) == sorted(ids)


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_sigterm_mid_batch_finishes_and_acks_what_the_worker_holds_and_exits_0(client, sdk_server, scanner, tmp_path,
                                                                               flavour):
    ids = [f"g{i}" for i in range(6)]
    client.send_many([{"topic": "sig", "msg": i, "msg_id": i} for i in ids])
    done = tmp_path / "done"
    command = [sys.executable, "-m", "tests.sdk_worker_process", sdk_server, "sig", "1.5", str(done), flavour]
    proc = subprocess.Popen(command, cwd=ROOT, env=scanner_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def four_in_hand():
            consuming = [i for i in ids if client.get("sig", i).status == 3]
            return consuming if len(consuming) == 4 else None
        consuming = wait_for(four_in_hand, timeout=15, what="the worker holding 4 messages")
        assert not done.exists()  # the handlers are still sleeping
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    finished = done.read_text().split()
    assert sorted(finished) == sorted(consuming)  # every message in hand was finished
    for msg_id in consuming:
        wait_for(lambda: "acked" in reasons("sig", msg_id), timeout=15, what=f"{msg_id} acked")
        assert reasons("sig", msg_id).count("acked") == 1
    for msg_id in set(ids) - set(consuming):  # never pulled: still ready for another worker
        assert client.get("sig", msg_id).status == 2


def test_an_outcome_refused_past_its_ack_deadline_is_given_up_and_the_server_delivers_again(client, scanner,
                                                                                            caplog):
    client.send("lost", "x", msg_id="g1")

    def refusing_ack_many(topic, msg_ids, **kwargs):
        raise ServerError("redis unavailable: failing over")
    client.ack_many = refusing_ack_many
    handled = []
    worker = Worker(client, "lost", lambda message: handled.append(message.msg_id), concurrency=1,
                    ack_timeout_ms=600, wait_ms=200)
    with caplog.at_level(logging.WARNING, logger="delayqueue_client.worker"), running(worker):
        wait_for(lambda: "gave up the ack of lost/g1" in caplog.text, timeout=10, what="the worker giving up")
        # Not "after their ack timeout": by the time the retries gave up, that timeout had passed.
        assert "the server delivers them again (past their ack deadline: it may have already)" in caplog.text
        # Given up, not lost: the server makes it ready again after its ack timeout, and it is pulled again.
        wait_for(lambda: "ack_timeout" in reasons("lost", "g1") and handled.count("g1") >= 2, timeout=10,
                 what="g1 delivered again")
    # running() joined the worker: a given-up outcome holds nothing at the stop.


def test_a_worker_whose_token_may_not_read_the_topic_config_uses_a_30_s_ack_timeout(web_processes):
    (web,) = web_processes(1, DELAYQUEUE_AUTH="tokens")
    producer = Client(web.url, token=new_token(namespace="shop", scopes=["produce"], name="p"))
    consumer = Client(web.url, token=new_token(namespace="shop", scopes=["consume"], name="c"))
    producer.send("t", "x", msg_id="f1")
    release = threading.Event()
    worker = Worker(consumer, "t", lambda message: release.wait(10), concurrency=1, wait_ms=200)
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with running(worker):
            deadline = wait_for(lambda: r.zscore(topic_keys("shop", "t").inflight, "f1"), what="f1 pulled")
            seconds, micros = r.time()
            now_ms = seconds * 1000 + micros // 1000
            assert worker._ack_timeouts == {"t": 30_000}  # getTopicConfig was Forbidden to it
            assert 30_000 - 2_000 <= deadline - now_ms <= 30_000
            release.set()
    finally:
        r.close()
        producer.close()
        consumer.close()


def test_a_fatal_pull_error_is_raised_by_run_after_what_the_worker_holds_is_settled(client):
    client.send("fatal", "x", msg_id="h1")
    pull = client.pull
    pulls = []

    def pull_then_refuse(*args, **kwargs):
        pulls.append(1)
        if len(pulls) > 1:
            raise BadRequest("topic: not allowed any more")
        return pull(*args, **kwargs)
    client.pull = pull_then_refuse

    def slow(message):
        time.sleep(0.5)  # still running when the second pull fails

    with pytest.raises(BadRequest):
        Worker(client, "fatal", slow, concurrency=2, batch=2, ack_timeout_ms=5_000, wait_ms=200).run(
            install_signal_handlers=False)
    assert client.settled["ack"] == ["h1"]  # sent before run() raised
    assert client.get("fatal", "h1").status == 4


def test_a_cancelled_run_async_waits_for_its_handlers_and_settles_their_messages(sdk_server):
    async def scenario():
        async with AsyncClient(sdk_server) as client:
            await client.send("cancelled", "x", msg_id="c1")
            started = asyncio.Event()

            async def handler(message):
                started.set()
                await asyncio.sleep(0.5)

            worker = Worker(client, "cancelled", handler, concurrency=1, ack_timeout_ms=5_000, wait_ms=200)
            task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return (await client.get("cancelled", "c1")).status

    assert asyncio.run(scenario()) == 4  # acked: the handler finished and its outcome was sent


# --- failure handling (issue 30): Retry, DeadLetter's reason, the exception's text, retry_backoff, handler_timeout


def details(topic: str, msg_id: str) -> list[tuple[str, str]]:
    """(reason, detail) of the message's history, oldest first."""
    return list(MessageEvent.objects.filter(topic=topic, msg_id=msg_id).order_by("at", "id")
                .values_list("reason", "detail"))


def test_retry_dead_letter_and_an_exception_settle_with_their_delay_and_reason(client, scanner):
    client.send("steer", "retry", msg_id="r1")
    client.send("steer", "dead", msg_id="d1")
    client.send("steer", "boom", msg_id="b1", max_retry=0)
    deliveries = defaultdict(list)

    def handler(message):
        deliveries[message.msg_id].append(time.monotonic())
        if message.msg == "retry" and len(deliveries["r1"]) == 1:
            raise Retry(delay=0.5)
        if message.msg == "dead":
            raise DeadLetter("unknown task 'x'")
        if message.msg == "boom":
            raise ValueError("bad <input>")

    with running(Worker(client, "steer", handler, wait_ms=200)):
        wait_for(lambda: "acked" in reasons("steer", "r1"), timeout=15, what="r1 acked")
        dead = wait_for(lambda: (d := client.dead_letters("steer").messages) and len(d) == 2 and d, timeout=15,
                        what="two dead letters")
    assert {m.msg_id: (m.dead_reason, m.dead_detail) for m in dead} == {
        "d1": ("dead_lettered", "unknown task 'x'"), "b1": ("retries_exhausted", "ValueError: bad <input>")}
    assert deliveries["r1"][1] - deliveries["r1"][0] >= 0.5  # not before the delay Retry asked for
    assert ("nacked", "Retry: retry in 0.5 s") in details("steer", "r1")
    assert client.reasons == {"r1": "Retry: retry in 0.5 s", "d1": "unknown task 'x'", "b1": "ValueError: bad <input>"}


class DelayRecordingClient(ObservedClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delays: dict[str, list[int | None]] = defaultdict(list)

    def ack_many(self, topic, msg_ids, *, ack=True, delay_ms=None, **kwargs):
        for msg_id in msg_ids:
            if not ack:
                self.delays[msg_id].append(delay_ms)
        return super().ack_many(topic, msg_ids, ack=ack, delay_ms=delay_ms, **kwargs)


def test_retry_backoff_doubles_per_delivery_where_the_topic_sets_none(sdk_server, scanner):
    with DelayRecordingClient(sdk_server) as client:
        client.set_topic_config("own", retry_backoff_ms=100)
        for topic in ("plain", "own"):
            client.send(topic, "x", msg_id="f1", max_retry=2)
        deliveries = defaultdict(list)

        def handler(message):
            deliveries[message.topic].append(time.monotonic())
            raise RuntimeError("always")

        with running(Worker(client, ["plain", "own"], handler, retry_backoff=(0.2, 0.3), wait_ms=200)):
            for topic in ("plain", "own"):
                wait_for(lambda: client.dead_letters(topic).messages, timeout=20, what=f"{topic} dead")
        plain = deliveries["plain"]
        assert len(plain) == 3 and plain[1] - plain[0] >= 0.2 and plain[2] - plain[1] >= 0.3  # 0.2, then 0.4 capped
        assert client.delays["f1"].count(None) == 3  # "own": the server's backoff (delayMillis left out)
        assert sorted(d for d in client.delays["f1"] if d is not None) == [200, 300, 300]
        assert client.dead_letters("plain").messages[0].dead_detail == "RuntimeError: always"


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_a_handler_over_its_timeout_is_given_back_and_its_late_return_is_not_acked(client, sdk_server, scanner,
                                                                                   flavour):
    client.send("slowpoke", "x", msg_id="t1")
    release = threading.Event()
    calls = []

    def handler(message):
        calls.append(message.retry)
        if len(calls) == 1:
            release.wait(20)  # a thread cannot be killed: it runs on past the timeout

    async def async_handler(message):
        calls.append(message.retry)
        if len(calls) == 1:
            await asyncio.sleep(20)  # cancelled at the timeout

    def acked_then_released():
        wait_for(lambda: "acked" in reasons("slowpoke", "t1"), timeout=15, what="t1 acked")
        release.set()
        time.sleep(0.3)  # the first handler returns now: its outcome must be ignored

    if flavour == "async":
        async def scenario():
            async with AsyncClient(sdk_server) as aclient:
                worker = Worker(aclient, "slowpoke", async_handler, handler_timeout=0.5, wait_ms=200)
                task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
                await asyncio.to_thread(acked_then_released)
                worker.stop()
                await asyncio.wait_for(task, 15)
        asyncio.run(scenario())
    else:
        with running(Worker(client, "slowpoke", handler, handler_timeout=0.5, wait_ms=200)):
            acked_then_released()
        assert client.settled == {"nack": ["t1"], "ack": ["t1"]}
        assert client.reasons == {"t1": "HandlerTimeout: handler ran over 0.5 s"}
    assert calls == [1, 2]
    history = details("slowpoke", "t1")
    assert ("nacked", "HandlerTimeout: handler ran over 0.5 s") in history
    assert [r for r, _ in history].count("acked") == 1


def test_a_timed_out_handlers_late_return_leaves_the_next_delivery_of_its_message_alone(client, scanner):
    client.send("overlap", "x", msg_id="o1")
    release_first, first_returned, release_second = threading.Event(), threading.Event(), threading.Event()
    calls = []

    def handler(message):
        calls.append(message.retry)
        if message.retry == 1:
            release_first.wait(20)  # runs on past its timeout
            first_returned.set()
        elif message.retry == 2:
            release_second.wait(20)
            raise RuntimeError("the second run fails")

    with running(Worker(client, "overlap", handler, concurrency=1, handler_timeout=3, wait_ms=200)):
        # Given back at its timeout, delivered again to this worker and run beside the first run.
        wait_for(lambda: calls == [1, 2], timeout=30, what="o1 delivered again while its first run hangs")
        release_first.set()  # the first run returns: its outcome is not the second delivery's
        assert first_returned.wait(5)
        time.sleep(0.5)  # room for a wrongly taken outcome to be settled
        assert client.get("overlap", "o1").status == 3
        release_second.set()  # its failure is the delivery's outcome: o1 is delivered a third time
        wait_for(lambda: client.get("overlap", "o1").status == 4, timeout=15, what="the third delivery acked")
    assert calls == [1, 2, 3] and client.settled == {"nack": ["o1", "o1"], "ack": ["o1"]}


def test_a_handler_thread_past_its_timeout_is_replaced_so_the_messages_behind_it_run(client, scanner):
    client.send_many([{"topic": "hung", "msg": "x", "msg_id": "h1"}, {"topic": "hung", "msg": "x", "msg_id": "h2"}])
    release = threading.Event()

    def handler(message):
        if message.msg_id == "h1" and message.retry == 1:
            release.wait(30)  # hangs in the only handler thread, h2 queued behind it

    try:
        with running(Worker(client, "hung", handler, concurrency=1, batch=2, handler_timeout=0.5, wait_ms=200)):
            wait_for(lambda: all(client.get("hung", i).status == 4 for i in ("h1", "h2")), timeout=15,
                     what="h2, and h1 delivered again, run while the first run of h1 hangs")
    finally:
        release.set()


# --- several topics, burst, max_messages


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_burst_handles_what_is_due_on_every_topic_then_returns(sdk_server, client, flavour):
    for topic in ("b1", "b2"):
        client.send_many([{"topic": topic, "msg": f"{topic}-{i}", "msg_id": f"{topic}-{i}"} for i in range(7)])
    client.send("b1", "later", msg_id="later", delay_ms=60_000)
    handled = []

    def handler(message):
        handled.append(message.msg)

    async def async_handler(message):
        handled.append(message.msg)

    if flavour == "async":
        async def burst():
            async with AsyncClient(sdk_server) as aclient:
                await Worker(aclient, ["b1", "b2"], async_handler, concurrency=2, batch=4).run_async(burst=True)
        asyncio.run(burst())
    else:
        Worker(client, ["b1", "b2"], handler, concurrency=2, batch=4).run(burst=True, install_signal_handlers=False)
    expected = sorted(f"{t}-{i}" for t in ("b1", "b2") for i in range(7))
    assert sorted(handled) == expected
    assert all(client.get(m.split("-")[0], m).status == 4 for m in expected)  # acked before run returned
    assert client.get("b1", "later").status == 1


def test_max_messages_handles_that_many_then_returns(client):
    client.send_many([{"topic": "few", "msg": str(i), "msg_id": f"m{i}"} for i in range(10)])
    handled = []
    Worker(client, "few", lambda m: handled.append(m.msg_id), concurrency=2, batch=3, max_messages=4,
           wait_ms=200).run(install_signal_handlers=False)
    assert len(handled) == 4 and sorted(client.settled["ack"]) == sorted(handled)
    assert sum(client.get("few", f"m{i}").status == 2 for i in range(10)) == 6  # the rest left ready


# --- a supervised settle loop, and the two-step stop


def test_a_failing_settle_loop_stops_the_worker_loudly_and_gives_back_what_it_holds(client):
    client.send_many([{"topic": "bug", "msg": str(i), "msg_id": f"m{i}"} for i in range(4)])
    ack_many = client.ack_many
    calls = []

    def broken_once(*args, **kwargs):
        calls.append(kwargs.get("ack"))
        if len(calls) == 1:
            raise KeyError("a bug in the settle path")
        return ack_many(*args, **kwargs)
    client.ack_many = broken_once
    gate = threading.Event()

    def handler(message):
        if message.msg_id != "m0":
            gate.wait(20)

    worker = Worker(client, "bug", handler, concurrency=4, batch=4, ack_timeout_ms=20_000, wait_ms=200)
    with pytest.raises(WorkerFailed, match="settle loop failed: KeyError") as failed:
        worker.run(install_signal_handlers=False)
    gate.set()
    assert isinstance(failed.value.__cause__, KeyError)
    # m0's ack was lost with the loop (it comes back after its ack timeout); the others were given back.
    wait_for(lambda: {f"m{i}": client.get("bug", f"m{i}").status for i in range(4)} == {
        "m0": 3, "m1": 2, "m2": 2, "m3": 2}, timeout=10, what="m1-m3 given back, m0 left to its ack timeout")


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_a_failing_poll_loop_drains_what_the_worker_holds_and_run_raises(sdk_server, client, flavour):
    client.send_many([{"topic": "pollbug", "msg": str(i), "msg_id": f"p{i}"} for i in range(4)])
    handled, pulls = [], []

    def second_pull_fails():
        pulls.append(1)
        if len(pulls) == 2:
            raise KeyError("a bug in the poll path")

    if flavour == "async":
        async def async_handler(message):
            handled.append(message.msg_id)

        async def scenario():
            async with AsyncClient(sdk_server) as aclient:
                pull = aclient.pull

                async def pull_failing(*args, **kwargs):
                    second_pull_fails()
                    return await pull(*args, **kwargs)
                aclient.pull = pull_failing
                await Worker(aclient, "pollbug", async_handler, batch=4, wait_ms=200).run_async(
                    install_signal_handlers=False)
        with pytest.raises(WorkerFailed, match="poll loop of pollbug failed: KeyError") as failed:
            asyncio.run(scenario())
    else:
        pull = client.pull

        def pull_failing(*args, **kwargs):
            second_pull_fails()
            return pull(*args, **kwargs)
        client.pull = pull_failing
        worker = Worker(client, "pollbug", lambda m: handled.append(m.msg_id), batch=4, wait_ms=200)
        with pytest.raises(WorkerFailed, match="poll loop of pollbug failed: KeyError") as failed:
            worker.run(install_signal_handlers=False)
    assert isinstance(failed.value.__cause__, KeyError)
    assert sorted(handled) == [f"p{i}" for i in range(4)]  # what it held was handled and acked
    assert all(client.get("pollbug", f"p{i}").status == 4 for i in range(4))


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_a_second_stop_gives_back_the_messages_in_hand_and_returns(sdk_server, client, flavour):
    client.send_many([{"topic": "hard", "msg": str(i), "msg_id": f"h{i}"} for i in range(4)])
    gate = threading.Event()
    started = []

    def handler(message):
        started.append(message.msg_id)
        gate.wait(30)

    async def async_handler(message):
        started.append(message.msg_id)
        await asyncio.sleep(30)

    def stop_twice(worker: Worker):
        wait_for(lambda: len(started) == 2, timeout=15, what="two handlers running")
        worker.stop()  # drains: would wait for the handlers
        time.sleep(0.3)
        assert all(client.get("hard", f"h{i}").status == 3 for i in range(4))
        worker.stop()

    if flavour == "async":
        async def scenario():
            async with AsyncClient(sdk_server) as aclient:
                worker = Worker(aclient, "hard", async_handler, concurrency=2, batch=4, ack_timeout_ms=30_000,
                                wait_ms=200)
                stopper = asyncio.create_task(asyncio.to_thread(stop_twice, worker))
                await worker.run_async(install_signal_handlers=False)
                await stopper
        asyncio.run(scenario())
    else:
        worker = Worker(client, "hard", handler, concurrency=2, batch=4, ack_timeout_ms=30_000, wait_ms=200)
        stopper = threading.Thread(target=stop_twice, args=(worker,))
        stopper.start()
        worker.run(install_signal_handlers=False)  # returns while two handlers still block
        stopper.join()
        assert not gate.is_set()
        gate.set()
        time.sleep(0.3)  # the abandoned handlers return now: nothing is acked
        assert client.settled["ack"] == []
    assert all(client.get("hard", f"h{i}").status == 2 for i in range(4))  # all given back, none lost


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_a_hard_stop_gives_back_again_what_its_own_poll_under_way_took_back(sdk_server, client, flavour):
    """The give-back makes the messages ready, and the poll still waiting takes them at once (a new
    delivery, its retry one more) while their given-back deliveries are still held: its own
    give-back must name the deliveries it brought, or the server takes the nack as late."""
    client.send_many([{"topic": "hardpoll", "msg": "x", "msg_id": f"h{i}"} for i in range(2)])
    started, gate = [], threading.Event()

    def slow_answers(ack_many):
        def settle(topic, msg_ids, **kwargs):
            done = ack_many(topic, msg_ids, **kwargs)
            time.sleep(1.0)  # the give-back's answer read late: the poll under way brings them first
            return done
        return settle

    def stop_twice(worker: Worker):
        wait_for(lambda: len(started) == 2, timeout=15, what="both handlers running")
        worker.stop()
        time.sleep(0.3)  # the poll under way (room for 6 more) waits on
        worker.stop()

    if flavour == "async":
        async def async_handler(message):
            started.append(message.msg_id)
            await asyncio.sleep(30)

        async def scenario():
            async with AsyncClient(sdk_server) as aclient:
                aclient.ack_many = slow_answers_async(aclient.ack_many)
                worker = Worker(aclient, "hardpoll", async_handler, concurrency=2, batch=8, ack_timeout_ms=30_000,
                                wait_ms=5_000)
                stopper = asyncio.create_task(asyncio.to_thread(stop_twice, worker))
                await worker.run_async(install_signal_handlers=False)
                await stopper

        def slow_answers_async(ack_many):
            async def settle(topic, msg_ids, **kwargs):
                done = await ack_many(topic, msg_ids, **kwargs)
                await asyncio.sleep(1.0)
                return done
            return settle
        asyncio.run(scenario())
    else:
        def handler(message):
            started.append(message.msg_id)
            gate.wait(30)
        worker = Worker(client, "hardpoll", handler, concurrency=2, batch=8, ack_timeout_ms=30_000, wait_ms=5_000)
        client.ack_many = slow_answers(client.ack_many)
        stopper = threading.Thread(target=stop_twice, args=(worker,))
        stopper.start()
        worker.run(install_signal_handlers=False)
        stopper.join()
        gate.set()
    retries = {client.get("hardpoll", f"h{i}").retry for i in range(2)}
    assert retries == {2}, retries  # the poll under way did take them again (its second delivery)
    assert all(client.get("hardpoll", f"h{i}").status == 2 for i in range(2))  # given back both times


@pytest.mark.parametrize("flavour", ["threads", "async"])
def test_a_settle_tried_again_names_its_own_delivery_not_the_next_one_held_since(sdk_server, client, flavour):
    """A nack the server applied but whose answer was lost is sent again; meanwhile the worker's poll
    took the message again (a new delivery under the same msgId, its handler running): the second
    try must name the delivery it nacks, or it gives back the running one."""
    client.send("again", "x", msg_id="a1")
    retries, second = [], threading.Event()

    def handle(message):
        retries.append(message.retry)
        if len(retries) == 1:
            raise Retry(0)
        second.set()

    def handler(message):
        handle(message)
        time.sleep(1.0)

    async def async_handler(message):
        handle(message)
        await asyncio.sleep(1.0)

    def lose_first_nack_answer(ack_many):
        def settle(topic, msg_ids, **kwargs):
            done = ack_many(topic, msg_ids, **kwargs)
            if not kwargs["ack"] and not second.is_set():
                second.wait(15)  # the poll takes the message again before the answer is read
                raise MaybeApplied("ackMsgBatch: the answer was lost")
            return done
        return settle

    def lose_first_nack_answer_async(ack_many):
        async def settle(topic, msg_ids, **kwargs):
            done = await ack_many(topic, msg_ids, **kwargs)
            if not kwargs["ack"] and not second.is_set():
                await asyncio.to_thread(second.wait, 15)
                raise MaybeApplied("ackMsgBatch: the answer was lost")
            return done
        return settle

    acked = lambda: client.get("again", "a1").status == 4  # noqa: E731
    if flavour == "async":
        async def scenario():
            async with AsyncClient(sdk_server) as aclient:
                aclient.ack_many = lose_first_nack_answer_async(aclient.ack_many)
                worker = Worker(aclient, "again", async_handler, concurrency=2, wait_ms=1_000)
                run = asyncio.create_task(worker.run_async(install_signal_handlers=False))
                await asyncio.to_thread(wait_for, acked, timeout=15, what="the message acked")
                worker.stop()
                await run
        asyncio.run(scenario())
    else:
        client.ack_many = lose_first_nack_answer(client.ack_many)
        with running(Worker(client, "again", handler, concurrency=2, wait_ms=1_000)):
            wait_for(acked, timeout=15, what="the message acked")
    assert retries == [1, 2]  # the second delivery was not given back: no third


INTERRUPTED_WORKER = """\
import _thread, sys, threading, time
from delayqueue_client import Client, Worker
started, gate = [], threading.Event()
def handler(message):
    started.append(message.msg_id)
    gate.wait(60)
def interrupt():  # Ctrl-C in a program that keeps its own SIGINT handling
    while not started:
        time.sleep(0.05)
    time.sleep(0.3)
    _thread.interrupt_main()
threading.Thread(target=interrupt, daemon=True).start()
worker = Worker(Client(sys.argv[1]), "interrupted", handler, concurrency=1, batch=4, wait_ms=200)
try:
    worker.run(install_signal_handlers=False)
except KeyboardInterrupt:
    print("interrupted", worker.stopped_hard, flush=True)
gate.set()
"""


def test_a_run_ended_by_an_exception_gives_back_what_it_holds_and_raises_it(client, tmp_path):
    """A KeyboardInterrupt (or a SystemExit of the program's own signal handler) out of run(): the
    messages in hand that no handler will take must go back, not hold run() (its settle loop
    waited for their outcomes for ever) while its poll went on pulling."""
    client.send_many([{"topic": "interrupted", "msg": "x", "msg_id": f"i{i}"} for i in range(4)])
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_WORKER)
    ran = subprocess.run([sys.executable, str(script), client.base_url], capture_output=True, text=True, timeout=60)
    assert ran.stdout.split() == ["interrupted", "True"], ran.stderr
    assert all(client.get("interrupted", f"i{i}").status == 2 for i in range(4))  # all four given back
