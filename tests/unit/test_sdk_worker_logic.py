"""The SDK Worker's pure logic (no server): handler and client pairing, the batch default, how
outcomes are grouped into ackMsgBatch calls, which pull failures stop it, what a handler's Retry,
DeadLetter or exception settles its message with, and the threads that run handlers."""
import asyncio
import itertools
import signal
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from delayqueue_client import (App, AsyncClient, Client, Conflict, DeadLetter, Forbidden, Message, NotTheAPI,
                               RateLimited, Retry, ServerError, Unauthorized, Worker)
from delayqueue_client._calls import MAX_REASON
from delayqueue_client._http import NotSent
from delayqueue_client import worker as worker_module
from delayqueue_client.testing import FakeServer
from delayqueue_client.worker import ACK, DEAD, GIVEN_BACK, NACK, Outcome, _HandlerThreads, error_reason

from tests.helpers import run_catching, wait_for

API_MESSAGE = {"topic": "t", "msgId": "m", "msg": "body", "produceTime": 1, "triggerTime": 1, "expireTime": 9,
               "maxRetry": 3, "retry": 1, "status": 3}


@pytest.fixture
def client():
    with Client("http://127.0.0.1:9") as c:  # never called
        yield c


def test_a_handler_must_match_its_client(client):
    async def async_handler(message):
        pass

    with pytest.raises(TypeError, match="async handler"):
        Worker(client, "t", async_handler)
    async_client = AsyncClient("http://127.0.0.1:9")
    with pytest.raises(TypeError, match="async handler"):
        Worker(async_client, "t", lambda message: None)
    asyncio.run(async_client.aclose())
    with pytest.raises(ValueError, match="concurrency"):
        Worker(client, "t", print, concurrency=0)


def test_a_given_batch_is_kept_and_never_below_the_concurrency(client):
    assert Worker(client, "t", print, concurrency=4, batch=100).batch == 100
    assert Worker(client, "t", print, concurrency=4, batch=2).batch == 4
    fixed = Worker(client, "t", print, concurrency=4, batch=10, ack_timeout_ms=1000)
    for i in range(50):  # fast handlers do not change a batch given
        asked, pulled = fixed._reserve(), Message.from_api({**API_MESSAGE, "msgId": f"m{i}"})
        assert fixed._pulled(asked, [pulled], 0.0)
        fixed._finished(pulled, 0.0001)
    assert fixed.batch == 10 and not fixed.adaptive


@pytest.mark.parametrize("handler_seconds,batch", [
    (0.00001, 500),  # fast handlers: the largest default batch
    (0.01, 8 + 40),  # queued work of 50 ms: 5 more per handler
    (1.0, 8),  # slow handlers: nothing queued beyond the running ones
])
def test_the_default_batch_starts_at_four_per_handler_then_follows_the_handlers_time(client, handler_seconds,
                                                                                      batch):
    worker = Worker(client, "t", print, concurrency=8)
    assert worker.adaptive and worker.batch == 32
    for _ in range(100):
        worker._timed(handler_seconds)
    assert worker.batch == batch


def test_outcomes_are_grouped_by_topic_and_outcome_in_calls_of_at_most_500(client):
    worker = Worker(client, ["t", "u"], print)
    boom = Outcome(NACK, None, "ValueError: boom")

    def delivery(topic, msg_id):
        return Message.from_api({**API_MESSAGE, "topic": topic, "msgId": msg_id})
    results = [(delivery("t", f"a{i}"), Outcome(ACK)) for i in range(501)] + [
        (delivery("t", "n1"), boom), (delivery("t", "d1"), Outcome(DEAD, reason="bad")), (delivery("t", "n2"), boom),
        (delivery("t", "n3"), Outcome(NACK, None, "KeyError: 'x'")), (delivery("u", "a1"), Outcome(ACK))]
    calls = worker._settle_groups(results)
    assert [(topic, outcome.kind, len(ids)) for topic, outcome, ids in calls] == [
        ("t", ACK, 500), ("t", ACK, 1), ("t", NACK, 2), ("t", DEAD, 1), ("t", NACK, 1), ("u", ACK, 1)]
    assert [m.msg_id for m in calls[2][2]] == ["n1", "n2"]
    assert worker._settle_kwargs(Outcome(DEAD, reason="bad"), calls[3][2]) == {
        "msg_ids": ["d1"], "ack": False, "dead_letter": True, "delay_ms": None, "reason": "bad", "retries": [1]}
    assert worker._settle_kwargs(Outcome(ACK), calls[5][2]) == {"msg_ids": ["a1"], "ack": True, "retries": [1]}


def test_pull_failures_pause_or_stop_the_worker(client):
    worker = Worker(client, "t", print)
    assert worker._pull_failed("t", 0, ServerError("redis unavailable: x")) is not None
    assert worker._failure is None and worker._stop_level == 0
    for fatal in (Unauthorized("no"), Forbidden("no"), NotTheAPI(404)):  # a wrong URL: no pause changes it
        assert worker._pull_failed("t", 0, fatal) is None
        assert worker._stop_level == 1 and isinstance(worker._failure, Unauthorized)  # drains, then raises the first


@pytest.mark.parametrize("asynchronous", [False, True], ids=["threads", "asyncio"])
def test_a_worker_started_while_the_server_is_unreachable_waits_for_it(asynchronous, caplog):
    """As a failed pull is tried again, so is the read of the topic's settings a worker starts
    with: a consumer started before its server (a deploy, a restart) must not die of it."""
    server = FakeServer()
    client = server.async_client(max_retries=0) if asynchronous else server.client(max_retries=0)
    server.client().send("t", "x")
    handled = []
    if asynchronous:
        async def handler(m):
            handled.append(m.msg)
    else:
        def handler(m):
            handled.append(m.msg)
    server.fail_next("getTopicConfig", times=2, error=NotSent)
    worker = Worker(client, "t", handler)
    if asynchronous:
        asyncio.run(worker.run_async(burst=True))
    else:
        worker.run(burst=True)
    assert handled == ["x"]
    assert [r.getMessage() for r in caplog.records if "settings" in r.getMessage()] == [
        "reading topic t's settings failed: delayqueue server unreachable: injected by FakeServer.fail_next; "
        "trying again in 1 s"] * 2


def test_a_thread_workers_wait_to_try_again_never_asks_for_a_negative_sleep(monkeypatch):
    """The waits after a failed read of the settings and a failed pull looked at the clock twice: past
    the end by the second look (a thread kept from the GIL between them), time.sleep(<0) raised, out of
    run() or as a failed poll loop (WorkerFailed). Here each reading of the clock is 0.6 s after the last."""
    server = FakeServer()
    server.client().send("t", "x")
    server.fail_next("getTopicConfig", error=NotSent)
    server.fail_next("pullMsg", error=NotSent)
    readings = itertools.count(time.monotonic(), 0.6)
    monkeypatch.setattr(worker_module, "time", SimpleNamespace(monotonic=lambda: next(readings), sleep=time.sleep,
                                                               time=time.time))
    handled = []
    Worker(server.client(max_retries=0), "t", lambda m: handled.append(m.msg)).run(burst=True)
    assert handled == ["x"]


def test_a_worker_stopped_while_waiting_for_its_server_returns(caplog):
    server = FakeServer()
    server.fail_next("getTopicConfig", times=1_000_000, error=NotSent)
    worker = Worker(server.client(max_retries=0), "t", print)
    failures = []
    running = threading.Thread(target=lambda: failures.extend(run_catching(worker)))
    running.start()
    while not any("settings failed" in r.getMessage() for r in caplog.records):
        running.join(0.05)
    worker.stop()  # as SIGTERM does
    running.join(10)
    assert not running.is_alive() and failures == []


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_worker_runs_once_and_a_second_run_says_so(asynchronous):
    # A second run() found the first's stop and returned at once: a silent no-op.
    server = FakeServer()
    client = server.async_client() if asynchronous else server.client()

    async def handler_async(m):
        pass
    worker = Worker(client, "t", handler_async if asynchronous else print)
    worker.run(burst=True, install_signal_handlers=False)
    calls = len(server.calls)
    with pytest.raises(RuntimeError, match="a Worker runs once"):
        worker.run(burst=True, install_signal_handlers=False)
    if asynchronous:
        with pytest.raises(RuntimeError, match="a Worker runs once"):
            asyncio.run(worker.run_async(burst=True, install_signal_handlers=False))
    assert len(server.calls) == calls


def message(retry: int = 1, topic: str = "t") -> Message:
    return Message.from_api({**API_MESSAGE, "retry": retry, "topic": topic})


def test_a_retry_delay_must_be_a_finite_number_of_seconds_not_negative():
    """Raised where the handler builds it, naming the problem: an endless or NaN delay reached the
    worker's nack, which could not read it ("could not read how the handler failed")."""
    for bad in (-1, float("inf"), float("nan"), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="Retry's delay must be a finite number of seconds, not negative"):
            Retry(bad)
    assert Retry(0).delay == 0 and Retry(timedelta(days=1)).delay == 86_400


def test_a_handlers_retry_dead_letter_or_exception_decides_the_nack(client, caplog):
    worker = Worker(client, "t", print)
    assert worker._outcome(message(), None) == Outcome(ACK)
    with caplog.at_level("INFO", logger="delayqueue_client.worker"):
        assert worker._outcome(message(), Retry(30)) == Outcome(NACK, 30_000, "Retry: retry in 30 s")
        assert worker._outcome(message(), Retry()) == Outcome(NACK, None, "Retry: retry")  # the topic's backoff
        # Its last delivery (maxRetry 3): the server ends it however long the delay; the log said "retry in 30 s".
        assert worker._outcome(message(retry=4), Retry(30)) == Outcome(NACK, 30_000, "Retry: retry in 30 s")
    # Asked for by the handler, with or without a delay: no failure, so INFO and no traceback (docs/sdk.md).
    assert [(r.levelname, r.exc_info, r.getMessage()) for r in caplog.records] == [
        ("INFO", None, "handler asked to retry t/m (retry in 30 s)"),
        ("INFO", None, "handler asked to retry t/m (retry)"),
        ("INFO", None, "handler asked to retry t/m (no retry left: delivery 4 of 4, the server ends it)")]
    assert worker._outcome(message(), Retry(timedelta(milliseconds=1500))).delay_ms == 1500
    assert worker._outcome(message(), DeadLetter("unknown task x")) == Outcome(DEAD, None, "unknown task x")
    assert worker._outcome(message(), DeadLetter()) == Outcome(DEAD, None, None)
    assert worker._outcome(message(), ValueError("bad input")) == Outcome(NACK, None, "ValueError: bad input")
    assert worker._outcome(message(), KeyError("k")) == Outcome(NACK, None, "KeyError: 'k'")
    with pytest.raises(ValueError, match="negative"):
        Retry(-1)


def test_a_retry_raised_from_a_failure_keeps_the_failure_as_its_reason_and_logs_its_traceback(client, caplog):
    # A task's retry_backoff raises Retry(delay) from the task's error: its dead letter showed "Retry: retry in 2 s"
    # and the error was logged at INFO without its traceback.
    app = App(client)

    @app.task(name="flaky", retry_backoff=2)
    def flaky() -> None:
        raise ConnectionError("db down")

    body = '{"v":1,"task":"flaky","args":[],"kwargs":{},"headers":{}}'
    with pytest.raises(Retry) as raised:
        app.handle(Message.from_api({**API_MESSAGE, "msg": body}))
    worker = Worker(client, "t", print)
    with caplog.at_level("INFO", logger="delayqueue_client.worker"):
        assert worker._outcome(message(), raised.value) == Outcome(NACK, 2_000, "ConnectionError: db down")
    [record] = caplog.records
    assert record.levelname == "ERROR" and record.exc_info[1] is raised.value.__cause__
    assert worker._outcome(message(), Retry(5)) == Outcome(NACK, 5_000, "Retry: retry in 5 s")  # asked, not failed


def test_a_reason_is_bounded_and_free_of_what_the_server_refuses():
    long = error_reason(RuntimeError("x" * 1000))
    assert len(long) == MAX_REASON and long.startswith("RuntimeError: xxx")
    assert error_reason(ValueError("a\x00b\udc80c")) == "ValueError: a?b?c"
    assert error_reason(ValueError()) == "ValueError"


@pytest.mark.parametrize("topic_backoff,retry,delay_ms", [
    (0, 1, 1_000), (0, 2, 2_000), (0, 4, 8_000), (0, 10, 60_000),  # min 1 s, doubling per delivery, max 60 s
    (500, 3, None),  # the topic sets its own: the server applies it
])
def test_retry_backoff_grows_with_the_deliveries_where_the_topic_sets_none(client, topic_backoff, retry, delay_ms):
    worker = Worker(client, "t", print, retry_backoff=(1, 60))
    worker._configured("t", {"ackTimeoutMillis": 30_000, "retryBackoffMillis": topic_backoff})
    assert worker._outcome(message(retry), ValueError("x")).delay_ms == delay_ms
    assert worker._outcome(message(retry), Retry()).delay_ms == delay_ms
    assert worker._outcome(message(retry), Retry(5)).delay_ms == 5_000  # the handler's own delay wins


def test_a_retry_delay_that_fails_leaves_the_wait_to_the_retry_backoff(client, caplog):
    """retry_delay is the user's code (reading the message, say): raising, or answering no number of
    seconds, it made the outcome raise, and the thread worker never settled the message (nor drained);
    a negative one made a nack the server refuses."""
    for answer in (lambda m: 1 / 0, lambda m: "soon", lambda m: float("inf"), lambda m: -1):
        worker = Worker(client, "t", print, retry_backoff=(2, 60), retry_delay=answer)
        worker._configured("t", {"ackTimeoutMillis": 30_000, "retryBackoffMillis": 0})
        with caplog.at_level("ERROR", logger="delayqueue_client.worker"):
            assert worker._outcome(message(retry=2), ValueError("x")) == Outcome(NACK, 4_000, "ValueError: x")
    assert [r.getMessage() for r in caplog.records if "retry_delay" in r.getMessage()] == [
        "retry_delay failed on t/m; the worker's retry_backoff (or the topic's) applies"] * 4


def test_worker_options_are_checked(client):
    assert Worker(client, ["a", "b", "a"], print).topics == ("a", "b")
    assert Worker(client, "a", print).topics == ("a",)
    for bad in ({"retry_backoff": (0, 1)}, {"retry_backoff": (5, 1)}, {"handler_timeout": 0},
                {"max_messages": 0}):
        with pytest.raises(ValueError):
            Worker(client, "t", print, **bad)
    with pytest.raises(ValueError, match="at least one topic"):
        Worker(client, [], print)


def test_max_messages_bounds_what_the_polls_take(client):
    worker = Worker(client, ["a", "b"], print, concurrency=4, batch=10, max_messages=7)
    with worker._room:
        first, second = worker._reserve(), worker._reserve()
    assert (first, second) == (5, 2)  # each topic's share of the batch, then what max_messages leaves
    worker._pulled(first, [message(topic="a")], 0.0)  # 4 fewer than asked: back within reach
    assert worker._reserve() == 4 and worker._poll_done()


def test_a_pull_waits_for_a_quarter_of_a_share_unless_nothing_is_in_hand(client):
    """Fast handlers returning one by one must not each set off a pull of one message."""
    worker = Worker(client, "t", print, concurrency=4, batch=100)
    assert worker._reserve() == 100
    pulled = [Message.from_api({**API_MESSAGE, "msgId": f"m{i}"}) for i in range(100)]
    worker._pulled(100, pulled, 0.0)
    for i in range(24):
        worker._finished(pulled[i], None)
        assert worker._reserve() == 0  # 1 to 24 free: less than a quarter of the share (25)
    worker._finished(pulled[24], None)
    assert worker._reserve() == 25
    small = Worker(client, "t", print, concurrency=4, batch=100, max_messages=3)
    assert small._reserve() == 3  # nothing in hand: any room is worth a pull


def test_a_nacked_message_delivered_again_before_the_nacks_answer_is_kept(client):
    """The server may hand a nacked message back to this worker's poll before the settle loop has
    read the nack's answer: releasing the nack must not drop that new delivery."""
    worker = Worker(client, "t", print, concurrency=4, batch=10)
    first = Message.from_api({**API_MESSAGE, "msgId": "m", "retry": 1})
    worker._pulled(worker._reserve(), [first], 0.0)
    assert worker._started(first) and worker._finished(first, 0.01)  # handler failed: a nack to send
    again = Message.from_api({**API_MESSAGE, "msgId": "m", "retry": 2})
    worker._pulled(worker._reserve(), [again], 0.0)  # the poll's answer came first
    assert worker._settle_kwargs(Outcome(NACK), [first])["retries"] == [1]  # a nack sent again names its own
    worker._settled("t", Outcome(NACK, None, "Error: x"), [first], [True])  # then the nack's
    assert worker._held[("t", "m")].message.retry == 2
    worker._touched(first, 0.0, Conflict("not consuming"))  # a touch of the first, answered late
    assert worker._held[("t", "m")].touch_at != float("inf")  # leaves the second's touches alone
    assert worker._started(again) and worker._finished(again, 0.01)  # its outcome will be sent
    worker._settled("t", Outcome(ACK), [again], [True])
    assert not worker._held


def test_stop_drains_first_then_stops_hard(client):
    worker = Worker(client, "t", print)
    worker._pulled(worker._reserve(), [message()], 0.0)
    worker.stop()
    assert worker._stop_level == 1 and worker._give_back_all() == [(message(), Outcome(NACK, 0, GIVEN_BACK))]
    worker.stop()
    assert worker._stop_level == 2
    assert not worker._pulled(1, [message()], 0.0)  # a pull answered after a hard stop is given back by its poller


@pytest.mark.parametrize("stops", [1, 2], ids=["drain", "hard"])
def test_no_pull_begins_once_stopped_though_a_handler_frees_room(client, stops):
    """A poll waiting for room looked at the stop before it came: a handler returning after it (one
    draining, or one a hard stop left running) frees room, and must not set off one more pull (whose
    messages a drain would take on, and a hard stop would take and give back with their retry spent)."""
    worker = Worker(client, "t", print, concurrency=1, batch=4)
    pulled = [message_numbered(i) for i in range(4)]
    worker._pulled(worker._reserve(), pulled, 0.0)
    for _ in range(stops):
        worker.stop()
    worker._finished(pulled[0], 0.01)
    assert worker._reserve() == 0


def test_a_run_interrupted_while_a_poll_is_under_way_waits_for_what_it_brings():
    """Ctrl-C lands in run()'s wait for its poll threads: on Python 3.11 a Thread.join so interrupted
    marks the thread ended though it runs on, and run() no longer waited for the pull under way (its
    messages, given back by its loop once answered, were left to their ack timeout at the exit)."""
    server = FakeServer(real_time=True)
    in_flight = []

    class Observed(Client):
        def pull(self, *args, **kwargs):
            in_flight.append(1)
            try:
                return super().pull(*args, **kwargs)
            finally:
                in_flight.pop()
    client = server.install(Observed("http://127.0.0.1:9"))
    worker = Worker(client, "t", print, wait_ms=300)
    main = threading.get_ident()
    threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT)).start()  # a real SIGINT: Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        worker.run(install_signal_handlers=False)
    assert in_flight == []  # the long poll answered (and its loop gave back what it brought) before run() ended
    client.close()


def message_numbered(n: int) -> Message:
    return Message.from_api({**API_MESSAGE, "msgId": f"m{n}"})


def test_a_handler_thread_runs_messages_in_order_and_survives_a_failing_one():
    done, all_done = [], threading.Event()

    def handle(message):
        if message.msg_id == "m3":
            raise RuntimeError("a middleware hook failed")
        done.append(message.msg_id)
        if len(done) == 9:
            all_done.set()

    threads = _HandlerThreads(1, handle)  # one thread: it handles what follows m3 only if m3 did not end it
    assert all(threads.put(message_numbered(n)) for n in range(10))
    assert all_done.wait(10), done
    threads.close()
    threads._threads[0].join(10)
    assert done == [f"m{n}" for n in range(10) if n != 3] and not threads._threads[0].is_alive()


def test_a_handler_thread_given_up_and_replaced_is_forgotten_once_it_ends():
    """Each handler given up at its handler_timeout gets a thread in its place; the given-up one
    ended when it returned but stayed listed: a worker timing out handlers for days grew without end."""
    release, second_done = threading.Event(), threading.Event()
    running_m0: list[threading.Thread] = []

    def handle(message):
        if message.msg_id == "m0":
            running_m0.append(threading.current_thread())
            release.wait(10)
            return False  # given up meanwhile: its outcome is not the message's
        second_done.set()
        return True

    threads = _HandlerThreads(1, handle)
    try:
        threads.put(message_numbered(0))
        wait_for(lambda: running_m0, what="m0's handler running")
        threads.replace_one()  # as the settle loop does once m0's handler ran past its timeout
        threads.put(message_numbered(1))
        assert second_done.wait(10)  # run by the thread in its place
        [given_up] = running_m0
        release.set()
        given_up.join(10)
        assert not given_up.is_alive() and given_up not in threads._threads and len(threads._threads) == 1
    finally:
        release.set()
        threads.close()


def test_closed_handler_threads_take_nothing_and_drop_what_no_thread_started():
    started, release = threading.Event(), threading.Event()
    done = []

    def handle(message):
        started.set()
        release.wait(10)
        done.append(message.msg_id)

    threads = _HandlerThreads(1, handle)
    for n in range(5):
        threads.put(message_numbered(n))
    assert started.wait(10)  # m0 is running; m1-m4 wait
    threads.close()
    assert not threads.put(message_numbered(9))
    release.set()
    threads._threads[0].join(10)
    assert done == ["m0"]  # the one running finished; the others never start
