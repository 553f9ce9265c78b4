"""The SDK Worker's pure logic (no server): handler and client pairing, the batch default, how
outcomes are grouped into ackMsgBatch calls, which pull failures stop it."""
import asyncio

import pytest
from delayqueue_client import AsyncClient, Client, Forbidden, Message, RateLimited, ServerError, Unauthorized, Worker

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
        fixed._hold(Message.from_api({**API_MESSAGE, "msgId": f"m{i}"}), 0.0)
        fixed._finished(f"m{i}", 0.0001)
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


def test_outcomes_are_grouped_by_kind_in_calls_of_at_most_500(client):
    worker = Worker(client, "t", print)
    results = [(f"a{i}", "ack") for i in range(501)] + [("n1", "nack"), ("d1", "dead"), ("n2", "nack")]
    calls = worker._settle_groups(results)
    assert [(outcome, len(ids)) for outcome, ids in calls] == [("ack", 500), ("ack", 1), ("nack", 2), ("dead", 1)]
    assert calls[2][1] == ["n1", "n2"]
    assert worker._settle_kwargs("dead") == {"ack": False, "dead_letter": True}


def test_pull_failures_pause_or_stop_the_worker(client):
    worker = Worker(client, "t", print)
    assert worker._pull_failed(ServerError("redis unavailable: x")) == 1.0
    assert worker._pull_failed(RateLimited("slow down", retry_after_ms=250)) == 0.25
    for fatal in (Unauthorized("no"), Forbidden("no")):
        with pytest.raises(type(fatal)):
            worker._pull_failed(fatal)
