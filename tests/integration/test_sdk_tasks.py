"""The SDK's task layer (delayqueue_client.App) against a real uvicorn server: tasks sent and run by
App.worker (threads and asyncio, several tasks on one topic), pydantic arguments through the
server, what no retry can run dead-lettered with its reason, handles (status, cancel,
reschedule), per-call options (an idempotent msg_id, priority, ttl), send_many and send_on_commit
with the project's Django and PostgreSQL."""
import asyncio
import json
import logging
import threading
from datetime import datetime, timedelta, timezone

import pydantic
import pytest
from delayqueue_client import App, AsyncClient, Client, TaskHandle, TaskStatus
from delayqueue_client.envelope import Envelope, encode
from delayqueue_client.middleware import Middleware
from django.db import transaction

from tests.helpers import wait_for
from tests.integration.test_sdk_django import a_write
from tests.integration.test_sdk_worker import running

pytestmark = pytest.mark.process


class Order(pydantic.BaseModel):
    id: int
    lines: list[str]


@pytest.fixture
def app(sdk_server):
    with Client(sdk_server) as client:
        yield App(client)


def test_tasks_sharing_a_topic_are_sent_and_run_by_name(app):
    client = app.client
    done: list[tuple[str, object]] = []
    lock = threading.Lock()

    @app.task(topic="shop", name="shop.add")
    def add(a: int, b: int) -> None:
        with lock:
            done.append(("add", a + b))

    @app.task(topic="shop", name="shop.ship", priority=3)
    def ship(order: Order, *, express: bool = False) -> None:
        assert isinstance(order, Order)  # rebuilt from its JSON data on the worker
        with lock:
            done.append(("ship", (order.id, order.lines, express)))

    sent = [add.send(1, 2), ship.send(Order(id=7, lines=["book"]), express=True),
            ship.send({"id": "8", "lines": []})]  # a dict validated (and "8" made 8) before it is sent
    assert all(isinstance(h, TaskHandle) and h.status() is TaskStatus.READY for h in sent)
    assert client.get("shop", sent[1].msg_id).priority == 3
    handles = add.send_many([(10, 20), {"a": 5, "b": 5}])
    assert all(isinstance(h, TaskHandle) for h in handles)

    with running(app.worker(concurrency=2, wait_ms=300)):
        wait_for(lambda: len(done) == 5, timeout=15, what="the five tasks run")
        wait_for(lambda: all(h.status() is TaskStatus.DONE for h in sent + handles), timeout=15,
                 what="every message acked")
    assert sorted(done, key=repr) == sorted([("add", 3), ("ship", (7, ["book"], True)), ("ship", (8, [], False)),
                                             ("add", 30), ("add", 10)], key=repr)


def test_async_tasks_run_on_the_apps_async_client(sdk_server, app):
    app = App(app.client, async_client=AsyncClient(sdk_server))
    done: list[str] = []

    @app.task(topic="aio-tasks", name="greet")
    async def greet(who: str) -> None:
        await asyncio.sleep(0.01)
        done.append(f"hello {who}")

    @app.task(topic="aio-tasks", name="plain")
    def plain(who: str) -> None:
        done.append(f"plain {who}")

    greet.send("ada")
    plain.send("bob")
    with running(app.worker(asynchronous=True, concurrency=4, wait_ms=300)):
        wait_for(lambda: len(done) == 2, timeout=15, what="both tasks run")
    assert sorted(done) == ["hello ada", "plain bob"]


def test_what_no_retry_can_run_is_dead_lettered_at_once_with_its_reason(app, caplog):
    client = app.client
    runs: list[int] = []

    @app.task(topic="strict", name="strict.count")
    def count(order: Order) -> None:
        runs.append(order.id)

    bodies = {
        "unknown": ('{"v": 1, "task": "strict.nobody", "args": [], "kwargs": {}, "headers": {}}',
                    "unknown task 'strict.nobody'"),
        "invalid": ('{"v": 1, "task": "strict.count", "args": [{"id": "x"}], "kwargs": {}, "headers": {}}',
                    "task strict.count: invalid arguments"),
        "future": ('{"v": 9, "task": "strict.count", "args": [], "kwargs": {}}', "version 9 is unknown"),
        "text": ("just text", "not JSON"),
    }
    for msg_id, (body, _) in bodies.items():
        client.send("strict", body, msg_id=msg_id, max_retry=5)
    good = count.send({"id": 1, "lines": []})
    with caplog.at_level(logging.WARNING, logger="delayqueue_client.worker"), \
            running(app.worker(wait_ms=300)):
        wait_for(lambda: all(client.get("strict", i).status == 6 for i in bodies), timeout=15,
                 what="the four dead letters")
        wait_for(lambda: good.status() is TaskStatus.DONE, timeout=15, what="the good task acked")
    assert runs == [1]
    for msg_id, (_, reason) in bodies.items():
        message = client.get("strict", msg_id)
        assert message.retry == 1  # delivered once: no retry loop
        logged = [r.getMessage() for r in caplog.records if f"strict/{msg_id}" in r.getMessage()]
        assert len(logged) == 1 and "dead-lettered" in logged[0] and reason in logged[0], logged


def test_a_handle_tells_the_status_and_cancels_and_reschedules(app):
    client = app.client
    @app.task(topic="later", name="later.remind", ttl=timedelta(days=2))
    def remind(text: str) -> None:
        pass

    handle = remind.delay_in(timedelta(hours=1), "call back")
    assert handle.status() is TaskStatus.WAITING
    message = client.get("later", handle.msg_id)
    assert message.trigger_time - message.produce_time == 3_600_000
    assert message.expire_time - message.trigger_time == 2 * 86_400_000  # the task's ttl
    handle.reschedule(0)  # run now
    assert handle.status() is TaskStatus.READY
    when = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=1)
    handle.reschedule(when)
    assert handle.status() is TaskStatus.WAITING
    assert client.get("later", handle.msg_id).trigger_time == int(when.timestamp() * 1000)
    assert handle.cancel() is True and handle.status() is TaskStatus.CANCELLED
    assert handle.cancel() is False

    at = remind.delay_at(when, "at a time")
    assert client.get("later", at.msg_id).trigger_time == int(when.timestamp() * 1000)
    assert TaskHandle(app, "later", "never-sent", "later.remind").status() is TaskStatus.UNKNOWN


def test_per_call_options_and_an_idempotent_msg_id(app):
    client = app.client
    @app.task(topic="opts", name="opts.f", priority=1)
    def f(n: int) -> None:
        pass

    once = f.with_options(msg_id="order-42", priority=7, ttl=60, max_retry=2)
    first, second = once.delay_in(600, 1), once.delay_in(600, 2)
    assert first.msg_id == second.msg_id == "order-42"
    stored = client.get("opts", "order-42")
    assert (stored.priority, stored.max_retry, stored.expire_time - stored.trigger_time) == (7, 2, 60_000)
    assert '"args":[1]' in stored.msg  # the second send stored nothing new
    assert client.topic_info("opts")["waitingQueueSize"] == 1
    assert client.get("opts", f.send(3).msg_id).priority == 1  # the task itself kept its options


def test_send_many_sends_each_item_once_through_the_producer(app):
    client = app.client

    @app.task(topic="bulk", name="bulk.f", priority=4)
    def f(n: int, *, tag: str = "") -> None:
        pass

    handles = f.send_many([(n,) if n % 2 else {"n": n, "tag": "even"} for n in range(1_200)])
    ids = [h.msg_id for h in handles if isinstance(h, TaskHandle)]
    assert len(set(ids)) == 1_200  # more than a batch: every item answered, each with its own message
    assert client.topic_info("bulk")["readyQueueSize"] == 1_200
    sent = [json.loads(client.get("bulk", ids[i]).msg) for i in (0, 1)]
    assert [(e["args"], e["kwargs"]) for e in sent] == [([0], {"tag": "even"}), ([1], {})]  # bound to f
    assert client.get("bulk", ids[-1]).priority == 4


def test_send_on_commit_sends_after_the_commit_and_never_after_a_rollback(app):
    client = app.client
    @app.task(topic="orders", name="orders.cancel")
    def cancel(order_id: int) -> None:
        pass

    with transaction.atomic():
        a_write("task-committed")
        handle = cancel.with_options(priority=2).send_on_commit(42)
        assert handle.status() is TaskStatus.UNKNOWN  # not before the commit
    stored = client.get("orders", handle.msg_id)
    assert handle.status() is TaskStatus.READY and stored.priority == 2 and '"args":[42]' in stored.msg

    with pytest.raises(RuntimeError), transaction.atomic():
        a_write("task-rolled-back")
        dropped = cancel.send_on_commit(43)
        raise RuntimeError("the caller's work failed")
    assert dropped.status() is TaskStatus.UNKNOWN
    with transaction.atomic(), pytest.raises(TypeError, match="not JSON-serializable"):
        cancel.send_on_commit(object())  # fails in the caller, before the commit

    eager_runs: list[int] = []

    @app.task(topic="orders", name="orders.eager")
    def record(order_id: int) -> None:
        eager_runs.append(order_id)
    with app.eager(), transaction.atomic():
        ran = record.send_on_commit(5)
        assert eager_runs == [] and ran.status() is TaskStatus.WAITING
    assert eager_runs == [5] and ran.status() is TaskStatus.DONE
    assert client.topic_info("orders")["readyQueueSize"] == 1  # eager sends nothing

    # Its size checked at the call, with the headers it has then: what a middleware writes at the commit (a
    # trace's context) must not make it fail there, after the caller's writes are in, where none can handle it.
    class Tracing(Middleware):
        def before_send(self, ctx):
            ctx.headers["traceparent"] = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    with Client(client.base_url, middleware=[Tracing()]) as traced:
        fitting = App(traced, max_msg_bytes=len(encode(Envelope("orders.pack", [44], {}))))

        @fitting.task(topic="orders", name="orders.pack")
        def pack(order_id: int) -> None:
            pass
        with transaction.atomic():
            a_write("task-traced")
            packed = pack.send_on_commit(44)
    assert packed.status() is TaskStatus.READY
