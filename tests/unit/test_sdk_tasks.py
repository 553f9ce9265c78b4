"""The SDK's task layer without a server: the envelope, arguments (JSON, pydantic models), the
refusals of what cannot be sent, eager mode, and how App.handle routes a message by task name
(what no retry can run goes to the dead letters with a reason; a task's retry_backoff asks for
its retry)."""
import asyncio
import functools
import inspect
import json
from datetime import datetime, timedelta, timezone

import pydantic
import pytest
from delayqueue_client import (App, AsyncClient, Client, DeadLetter, EagerHandle, EnvelopeError, Message, Retry,
                               TaskStatus, TaskTooLarge, Worker)
from delayqueue_client._calls import MAX_REASON
from delayqueue_client.envelope import MAX_MSG_BYTES, Envelope, decode, encode
from delayqueue_client.middleware import Middleware
from delayqueue_client.testing import FakeServer


class Order(pydantic.BaseModel):
    id: int
    lines: list[str] = []


@pytest.fixture
def client():
    with Client("http://127.0.0.1:9") as c:  # never called: eager mode and handle() need no server
        yield c


@pytest.fixture
def app(client):
    return App(client, eager=True)


def message(body: str | None, retry: int = 1) -> Message:
    return Message(topic="t", msg_id="m1", msg=body, produce_time=1, trigger_time=1, expire_time=9, max_retry=3,
                   retry=retry, status=3)


def envelope_of(task: str, *args, **kwargs) -> str:
    return encode(Envelope(task, list(args), kwargs))


# --- the envelope

def test_the_envelope_is_versioned_compact_json_and_reads_back():
    text = encode(Envelope("m.f", [1, "é"], {"k": [True, None]}, {"traceparent": "00-ab"}))
    assert json.loads(text) == {"v": 1, "task": "m.f", "args": [1, "é"], "kwargs": {"k": [True, None]},
                                "headers": {"traceparent": "00-ab"}}
    assert " " not in text and "é" in text  # compact, UTF-8 rather than \u escapes (the limit counts bytes)
    assert decode(text) == Envelope("m.f", [1, "é"], {"k": [True, None]}, {"traceparent": "00-ab"})
    assert decode('{"v": 1, "task": "m.f", "args": [], "kwargs": {}}').headers == {}


@pytest.mark.parametrize("body,problem", [
    (None, "no body"),
    ("plain text", "not JSON"),
    ("[" * 100_000, "nested too deep"),
    ('{"task": "m.f"}', 'no "v"'),
    ('[1, 2]', 'no "v"'),
    ('{"v": 2, "task": "m.f", "args": [], "kwargs": {}}', "version 2 is unknown"),
    ('{"v": 1, "args": [], "kwargs": {}}', "names no task"),
    ('{"v": 1, "task": "m.f", "args": {}, "kwargs": {}}', "args must be a list"),
    ('{"v": 1, "task": "m.f", "args": [], "kwargs": {}, "headers": {"a": 1}}', "headers must map"),
])
def test_a_body_that_is_no_envelope_this_code_reads_says_why(body, problem):
    with pytest.raises(EnvelopeError, match=problem):
        decode(body)


def test_an_envelope_over_the_message_size_limit_is_refused_counting_utf8_bytes(app):
    assert MAX_MSG_BYTES == 1_048_576  # the server's default DELAYQUEUE_MAX_MSG_BYTES
    fits = encode(Envelope("t", ["x" * 100], {}))
    assert encode(Envelope("t", ["x" * 100], {}), max_bytes=len(fits)) == fits
    accented = Envelope("t", ["é" * 50], {})
    characters = len(encode(accented))
    with pytest.raises(TaskTooLarge, match=rf"is {characters + 50} bytes, over the server's limit of {characters} "
                                           r"\(DELAYQUEUE_MAX_MSG_BYTES\)"):
        encode(accented, max_bytes=characters)  # é is 2 bytes in UTF-8

    small = App(app.client, eager=True, max_msg_bytes=1000)

    @small.task(name="echo")
    def echo(text: str) -> str:
        return text
    assert echo.send("x" * 900).result == "x" * 900
    with pytest.raises(TaskTooLarge, match="task echo"):
        echo.send("x" * 1000)


def test_arguments_that_json_cannot_carry_are_refused_naming_the_argument(app):
    @app.task(name="f")
    def f(a: object, *, b: object = None) -> None:
        pass
    with pytest.raises(TypeError, match="task f: argument 0 is not JSON-serializable"):
        f.send({1, 2})
    with pytest.raises(TypeError, match="task f: argument 'b' is not JSON-serializable"):
        f.send(1, b=datetime.now(timezone.utc))
    with pytest.raises(TypeError, match="argument 0 is not JSON-serializable"):
        f.send(float("nan"))  # JSON has no NaN
    # JSON turns a key 1 into "1" without a word (eager mode's round trip too): the task would look for 1 in vain.
    with pytest.raises(TypeError, match="task f: argument 'b' is not JSON-serializable .a dict key that is not a str"):
        f.send(1, b={1: "x"})
    with pytest.raises(TypeError, match="task f: argument 0 is not JSON-serializable .a dict key that is not a str"):
        f.send([{"a": {None: 1}}])
    with pytest.raises(TypeError, match="task f: too many positional arguments"):
        f.send(1, 2, 3)  # a call that does not fit fails in the sender
    with pytest.raises(TypeError, match="headers must map str to str"):
        f.with_options(headers={"a": 1}).send(1)  # type: ignore[dict-item]


# --- tasks

def test_a_task_stays_a_plain_function_and_is_named_module_qualname(app):
    @app.task(topic="maths")
    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b
    assert add(2, 3) == 5 and add.__doc__ == "Adds." and add.__name__ == "add"
    assert add.name == f"{__name__}.test_a_task_stays_a_plain_function_and_is_named_module_qualname.<locals>.add"
    assert add.topic == "maths" and app.topics() == ["maths"]

    @app.task()
    def other() -> None:
        pass
    assert other.topic == "tasks" and app.topics() == ["maths", "tasks"]


def test_a_duplicate_task_name_is_refused(app):
    @app.task(name="jobs.send")
    def first() -> None:
        pass
    with pytest.raises(ValueError, match="a task named 'jobs.send' is already in this app"):
        @app.task(name="jobs.send")
        def second() -> None:
            pass


def test_times_naive_datetimes_and_bad_durations_are_refused(app):
    @app.task(name="t")
    def t() -> None:
        pass
    with pytest.raises(ValueError, match="naive datetime .* has no time zone"):
        t.delay_at(datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="the delay must be 0 or more"):
        t.delay_in(-1)
    with pytest.raises(ValueError, match="ttl must be 0 or more"):
        app.task(name="u", ttl=timedelta(seconds=-5))
    for endless in (float("inf"), float("nan"), 10 ** 400):  # a ValueError, not an OverflowError
        with pytest.raises(ValueError, match="the delay must be 0 or more .* and finite"):
            t.delay_in(endless)
        with pytest.raises(ValueError, match="ttl must be 0 or more .* and finite"):
            app.task(name="w", ttl=endless)
    with pytest.raises(ValueError, match="first delay .* is over the largest"):
        app.task(name="v", retry_backoff=(60, 1))
    with pytest.raises(ValueError, match="a msg_id names one message"):
        t.with_options(msg_id="one").send_many([(), ()])
    with pytest.raises(TypeError, match="a tuple of positional arguments or a dict of keyword arguments, got str"):
        t.send_many(["ab"])
    with pytest.raises(TypeError, match="too many positional arguments") as refused:
        t.send_many([(), (), (1,)])  # eager
    assert refused.value.__notes__ == ["send_many's item 2"]


def test_a_task_send_the_client_refuses_before_sending_begins_no_send_in_the_middleware():
    # Refused before anything is sent, it must not leave a send begun (a span never ended) either.
    calls = []

    class Recording(Middleware):
        def before_send(self, ctx):
            calls.append("before_send")

        def after_send(self, ctx, sent, error):
            calls.append("after_send")

    with Client("http://127.0.0.1:9", max_retries=0, middleware=[Recording()]) as client:
        app = App(client)

        @app.task(name="t")
        def t() -> None:
            pass

        @app.task(name="u", topic="caf\udc80")
        def u() -> None:
            pass
        with pytest.raises(ValueError, match="a lone surrogate"):
            t.with_options(msg_id="caf\udc80").send()
        with pytest.raises(ValueError, match="a lone surrogate"):
            u.send_many([()])
        with pytest.raises(ValueError, match="priority must be a whole number, got nan"):
            t.with_options(priority=float("nan")).send()
        assert calls == []

        @app.task(name="v")
        def v(n: int) -> None:
            pass
        # A send_many refused for its second item's arguments sends nothing: the first's send, begun, ends too.
        with pytest.raises(TypeError, match="argument 0") as refused:
            v.send_many([(1,), (object(),)])
        assert refused.value.__notes__ == ["send_many's item 1"]  # which of them: "argument 0" is in each
    assert calls == ["before_send", "before_send", "after_send", "after_send"]


def test_a_middlewares_headers_never_cost_a_send_that_fits_without_them(caplog):
    """A body just under the limit, which a trace's headers would put over it: sent without them
    (send_on_commit checks its body at the call, so at the commit only they could make it too large)."""
    class Tracing(Middleware):
        def before_send(self, ctx):
            ctx.headers["traceparent"] = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"

    server = FakeServer()
    with server.client(middleware=[Tracing()]) as client:
        limit = len(encode(Envelope("echo", ["x" * 100], {}, {"k": "v"})))
        app = App(client, max_msg_bytes=limit)

        @app.task(name="echo", topic="t")
        def echo(text: str) -> None:
            pass
        kept = echo.with_options(headers={"k": "v"})
        [handle, *_] = [kept.send("x" * 100), *kept.send_many([("x" * 100,)])]
        assert decode(client.get("t", handle.msg_id).msg).headers == {"k": "v"}
        assert "sent without the middleware's headers" in caplog.text
        assert decode(client.get("t", echo.send("x").msg_id).msg).headers["traceparent"].startswith("00-a")
        with pytest.raises(TaskTooLarge, match="task echo"):  # too large of its own: refused as before
            kept.send("x" * 101)


def test_the_retry_delay_doubles_from_the_first_up_to_the_largest(app):
    @app.task(name="b", retry_backoff=(timedelta(seconds=1), 10))
    def b() -> None:
        pass

    @app.task(name="c", retry_backoff=5)
    def c() -> None:
        pass
    assert [b.retry_delay(n) for n in (1, 2, 3, 4, 5, 100)] == [1, 2, 4, 8, 10, 10]
    assert [c.retry_delay(n) for n in (1, 7)] == [5, 5]


# --- eager mode

def test_eager_sends_run_after_a_json_round_trip_and_answer_a_done_handle(app):
    seen = []

    @app.task(name="record")
    def record(pair: tuple[int, int], *, note: str = "") -> int:
        seen.append((pair, note))
        return sum(pair)
    handle = record.send((1, 2), note="n")
    assert isinstance(handle, EagerHandle) and handle.result == 3 and handle.status() is TaskStatus.DONE
    assert seen == [([1, 2], "n")]  # a list, as a worker would get it: the envelope went through JSON
    assert record.delay_in(timedelta(hours=1), (3, 4)).result == 7  # delays are ignored
    assert record.delay_at(datetime.now(timezone.utc) + timedelta(days=1), (0, 1)).result == 1
    handles = record.send_many([((1, 1),), {"pair": (2, 2), "note": "kw"}])
    assert [h.result for h in handles] == [2, 4] and seen[-1] == ([2, 2], "kw")
    assert record.with_options(msg_id="mine").send((0, 0)).msg_id == "mine"
    assert handle.cancel() is False and handle.message() is None  # nothing was sent: no server to ask
    with pytest.raises(RuntimeError, match="ran eagerly"):
        handle.reschedule(10)


def test_eager_errors_propagate_and_app_eager_switches_the_mode_for_a_block(client):
    app = App(client)

    @app.task(name="boom")
    def boom(n: int) -> None:
        raise LookupError(f"no {n}")
    assert not app.is_eager
    with app.eager():
        assert app.is_eager
        with pytest.raises(LookupError, match="no 7"):
            boom.send(7)
        with app.eager(False):
            assert not app.is_eager
        assert app.is_eager
    assert not app.is_eager


def test_eager_async_tasks_run_to_their_end_even_inside_an_event_loop(app):
    @app.task(name="double")
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n
    assert double.send(4).result == 8

    async def in_a_loop():
        return double.send(5).result
    assert asyncio.run(in_a_loop()) == 10


def test_pydantic_models_are_validated_dumped_and_rebuilt(app):
    got = []

    @app.task(name="ship")
    def ship(order: Order, extra: list[Order] | None = None, *more: Order) -> int:
        got.append((order, extra, more))
        return order.id
    assert ship.send({"id": "7"}, [Order(id=8)], {"id": 9, "lines": ["a"]}).result == 7
    order, extra, more = got[0]
    assert order == Order(id=7) and extra == [Order(id=8)] and more == (Order(id=9, lines=["a"]),)
    assert ship.send(Order(id=1)).result == 1
    with pytest.raises(pydantic.ValidationError, match="id"):
        ship.send({"id": "not a number"})  # refused in the sender: nothing would be sent
    body = ship._body(ship._options, (Order(id=3, lines=["x"]),), {})
    assert json.loads(body)["args"] == [{"id": 3, "lines": ["x"]}]  # the model's JSON data travels


def test_a_model_parameter_counts_when_another_annotation_cannot_be_resolved(app):
    """As under `from __future__ import annotations` with a name imported only under TYPE_CHECKING:
    that one annotation failing made every one unread, and the Order parameter took plain data."""
    got = []

    @app.task(name="charge")
    def charge(order: "Order", discount: "Decimal | None" = None) -> None:  # noqa: F821  (Decimal: not imported)
        got.append(order)
    charge.send({"id": "7"})
    charge.send(Order(id=8))
    assert got == [Order(id=7), Order(id=8)]


# --- the worker's side: App.handle

def test_what_no_retry_can_run_is_dead_lettered_with_a_reason(app):
    @app.task(name="known")
    def known(order: Order) -> None:
        pass
    cases = [
        (envelope_of("nobody.knows"), "unknown task 'nobody.knows': this worker's app has no task of that name"),
        ("not json", "not JSON"),
        ('{"v": 3, "task": "known", "args": [], "kwargs": {}}', "version 3 is unknown"),
        (envelope_of("known"), "task known: the message's arguments do not fit the function: missing a required"),
        (envelope_of("known", {"id": "x"}), "task known: invalid arguments: 1 validation error"),
    ]
    for body, reason in cases:
        with pytest.raises(DeadLetter) as raised:
            app.handle(message(body))
        assert reason in raised.value.reason, raised.value.reason
    with pytest.raises(DeadLetter) as long:  # the server bounds a reason: a message's text cannot overflow it
        app.handle(message(envelope_of("x" * 5000)))
    # Cut where the server cuts a nack's reason (the worker sends no more), so its dead_detail shows the "…".
    assert long.value.reason.startswith("unknown task 'xxx") and len(long.value.reason) == MAX_REASON
    assert long.value.reason.endswith("…")


def test_a_plain_task_runs_each_call_that_fits_and_dead_letters_each_that_does_not(app):
    runs = []

    @app.task(name="add")
    def add(a: int, b: int = 0, *, scale: int = 1) -> None:
        runs.append((a + b) * scale)
    fitting = [envelope_of("add", 1), envelope_of("add", 2), envelope_of("add", 1, 2), envelope_of("add", 1, b=5),
               envelope_of("add", 1, scale=3), envelope_of("add", 4)]
    not_fitting = [envelope_of("add"), envelope_of("add", 1, 2, 3), envelope_of("add", 1, c=1),
                   envelope_of("add", b=1), envelope_of("add", 1, 2, b=2)]
    for _ in range(2):  # a shape that fitted once still runs; one that did not is refused every time
        for body in fitting:
            app.handle(message(body))
        for body in not_fitting:
            with pytest.raises(DeadLetter, match="do not fit the function"):
                app.handle(message(body))
    assert runs == [1, 2, 3, 6, 3, 4] * 2


def test_a_sends_arguments_are_as_bind_leaves_them_whatever_shapes_were_sent_before():
    # Each call shape is bound once: a later call of the same shape carries its own values, one of another
    # shape (another keyword order too) its own binding, and one that does not fit is refused every time.
    def f(a, /, b, c=0, *rest, d=1, **extra):
        pass
    calls = [((1, 2), {}), ((3, 4), {}), ((1,), {"b": 2}), ((5,), {"c": 7, "b": 6}), ((5,), {"b": 6, "c": 7}),
             ((1, 2, 3, 4, 5), {"d": 6, "z": 7}), ((8, 9, 10, 11, 12), {"z": 13, "d": 14}), ((1,), {"b": 2, "y": 3}),
             ((1, 2), {"y": 3, "z": 4}), ((1, 2), {"z": 5, "y": 6})]
    server = FakeServer()
    with server.client() as client:
        app = App(client)
        task = app.task(name="f", topic="t")(f)
        for _ in range(2):
            for args, kwargs in calls:
                bound = inspect.signature(f).bind(*args, **kwargs)
                for handle in (task.send(*args, **kwargs), *task.send_many([args] if not kwargs else [])):
                    sent = client.get("t", handle.msg_id).msg
                    assert sent == encode(Envelope("f", list(bound.args), bound.kwargs)), (args, kwargs)
            for args, kwargs in [((), {}), ((1,), {}), ((), {"a": 1, "b": 2}), ((1, 2), {"b": 3})]:
                with pytest.raises(TypeError, match="task f: "):
                    task.send(*args, **kwargs)


def test_a_failed_task_is_retried_after_its_backoff_or_left_to_the_worker(app):
    runs = []

    @app.task(name="flaky", retry_backoff=(2, 60))
    def flaky(n: int) -> None:
        runs.append(n)
        raise ConnectionError("down")

    @app.task(name="plain")
    def plain() -> None:
        raise ConnectionError("down")

    @app.task(name="asks", retry_backoff=(2, 60))
    def asks(how: str) -> None:
        raise Retry(delay=30) if how == "retry" else DeadLetter("gave up")
    for delivery, delay in ((1, 2), (3, 8), (9, 60)):
        with pytest.raises(Retry) as raised:
            app.handle(message(envelope_of("flaky", delivery), retry=delivery))
        assert raised.value.delay == delay and isinstance(raised.value.__cause__, ConnectionError)
    assert runs == [1, 3, 9]
    with pytest.raises(ConnectionError):  # no task backoff: the worker's (or the topic's) applies
        app.handle(message(envelope_of("plain")))
    with pytest.raises(Retry) as retry:  # the task's own choice wins over its backoff
        app.handle(message(envelope_of("asks", "retry")))
    assert retry.value.delay == 30
    with pytest.raises(DeadLetter, match="gave up"):
        app.handle(message(envelope_of("asks", "dead")))


def test_a_retry_without_a_delay_waits_the_tasks_backoff_as_any_failure_does(app):
    @app.task(name="later", retry_backoff=(2, 60))
    def later(cause: bool) -> None:
        if cause:
            raise Retry() from ConnectionError("down")
        raise Retry()
    with pytest.raises(Retry) as plain:
        app.handle(message(envelope_of("later", False), retry=3))
    assert plain.value.delay == 8 and isinstance(plain.value.__cause__, Retry)  # asked for: no failure to log
    with pytest.raises(Retry) as caused:
        app.handle(message(envelope_of("later", True), retry=1))
    assert caused.value.delay == 2 and isinstance(caused.value.__cause__, ConnectionError)  # the failure, its reason


def test_a_workers_own_retry_delay_applies_where_the_task_sets_no_backoff(app):
    # App.worker passed its own retry_delay to Worker beside the caller's: a duplicate-keyword TypeError.
    @app.task(name="backs_off", retry_backoff=(2, 60))
    def backs_off() -> None:
        pass

    @app.task(name="plain")
    def plain() -> None:
        pass
    worker = app.worker(retry_delay=lambda m: 5.0 if m.retry < 3 else None, retry_backoff=(1, 1))
    assert worker._backoff_ms(message(envelope_of("backs_off"), retry=2)) == 4_000  # the task's own first
    assert worker._backoff_ms(message(envelope_of("plain"), retry=2)) == 5_000  # then the worker's retry_delay
    assert worker._backoff_ms(message(envelope_of("plain"), retry=3)) == 1_000  # then its retry_backoff
    assert worker._backoff_ms(message("not an envelope")) == 5_000


def test_the_async_handler_runs_async_and_plain_tasks(app):
    ran = []

    @app.task(name="a")
    async def a(n: int) -> None:
        ran.append(("a", n))

    @app.task(name="p")
    def p(n: int) -> None:
        ran.append(("p", n))

    def plain_decorator(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            return fn(*args, **kwargs)
        return call

    @app.task(name="w")  # a plain function answering a coroutine: the async handler acked it unawaited, not run
    @plain_decorator
    async def w(n: int) -> None:
        ran.append(("w", n))
    asyncio.run(app.handle_async(message(envelope_of("a", 1))))
    asyncio.run(app.handle_async(message(envelope_of("p", 2))))
    app.handle(message(envelope_of("a", 3)))  # an async task under a thread worker
    asyncio.run(app.handle_async(message(envelope_of("w", 4))))
    app.handle(message(envelope_of("w", 5)))
    assert ran == [("a", 1), ("p", 2), ("a", 3), ("w", 4), ("w", 5)]
    with pytest.raises(DeadLetter, match="unknown task"):
        asyncio.run(app.handle_async(message(envelope_of("q"))))


def test_app_worker_serves_the_tasks_topics_on_the_right_client(client):
    app = App(client)
    with pytest.raises(ValueError, match="no topic to serve"):
        app.worker()

    @app.task(topic="emails")
    def send_email() -> None:
        pass

    @app.task(topic="emails")
    async def notify() -> None:
        pass
    worker = app.worker(concurrency=3, wait_ms=100)
    assert isinstance(worker, Worker) and worker.client is client and worker.handler == app.handle
    assert worker.concurrency == 3 and worker.wait_ms == 100 and worker.topics == ("emails",)
    assert app.worker("orders").topics == ("orders",)  # a topic name, as Worker takes it (not its letters)
    assert app.worker(["orders", "emails"]).topics == ("orders", "emails")
    with pytest.raises(ValueError, match="async_client=AsyncClient"):
        app.worker(asynchronous=True)
    async_client = AsyncClient("http://127.0.0.1:9")
    async_worker = App(client, async_client=async_client)
    async_worker.task(topic="emails")(notify.fn)
    made = async_worker.worker(asynchronous=True)
    assert made.client is async_client and made.is_async
    asyncio.run(async_client.aclose())


def test_an_app_without_a_client_makes_one_and_its_producer_on_a_first_send_many(monkeypatch):
    """App() makes its client on first use (DELAYQUEUE_URL). A send_many of nothing as that first
    use made the producer under the lock the client's making takes too, and hung."""
    import threading

    monkeypatch.setenv("DELAYQUEUE_URL", "http://127.0.0.1:9")  # nothing is sent here
    app = App()

    @app.task(topic="t")
    def nothing() -> None:
        pass

    answered = []
    sender = threading.Thread(target=lambda: answered.append(nothing.send_many([])), daemon=True)
    sender.start()
    sender.join(10)
    assert not sender.is_alive(), "send_many hung"
    assert answered == [[]] and app._producer()._client is app.client
    app._producer().close()
