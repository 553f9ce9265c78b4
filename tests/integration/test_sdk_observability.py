"""The SDK's middleware against a real server: one OpenTelemetry trace from a task's send to its
handler (the context carried in the envelope's headers through the server), and the Prometheus
middleware's counts of what a Client and a Worker did."""
import pytest
from delayqueue_client import App, Client, Retry, Worker
from delayqueue_client.middleware import Middleware, OpenTelemetryMiddleware, PrometheusMiddleware
from django.db import transaction
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from tests.integration.test_sdk_django import a_write
from tests.unit.test_sdk_middleware import spans  # noqa: F401  (the fixture: a provider and its in-memory exporter)

pytestmark = pytest.mark.process


def test_one_trace_runs_from_a_tasks_send_to_its_handler(sdk_server, spans):
    provider, exporter = spans
    registry = CollectorRegistry()
    with Client(sdk_server, middleware=[OpenTelemetryMiddleware(provider), PrometheusMiddleware(registry)]) as client:
        app = App(client)
        seen = []

        @app.task(topic="traced", name="shop.charge")
        def charge(order_id: int) -> None:
            with trace.get_tracer("shop", tracer_provider=provider).start_as_current_span("charge card"):
                seen.append(order_id)

        with trace.get_tracer("web", tracer_provider=provider).start_as_current_span("POST /orders"):
            handle = charge.send(42)
        app.worker(wait_ms=200).run(burst=True, install_signal_handlers=False)

    assert seen == [42]
    by_name = {span.name: span for span in exporter.get_finished_spans()}
    request, sent, processed, inner = (by_name[n] for n in ("POST /orders", "send traced", "process traced",
                                                              "charge card"))
    # One trace: the web request, its send, the worker's handling, the handler's own span.
    assert {s.context.trace_id for s in (request, sent, processed, inner)} == {request.context.trace_id}
    assert sent.parent.span_id == request.context.span_id
    assert processed.parent.span_id == sent.context.span_id
    assert inner.parent.span_id == processed.context.span_id
    assert (sent.kind, processed.kind) == (trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER)
    assert sent.attributes["messaging.message.id"] == processed.attributes["messaging.message.id"] == handle.msg_id
    assert processed.attributes["delayqueue.task"] == "shop.charge"

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("delayqueue_client_sent_total", topic="traced", outcome="ok") == 1
    assert value("delayqueue_client_handled_total", topic="traced", task="shop.charge", outcome="ok") == 1
    assert value("delayqueue_client_settled_total", topic="traced", outcome="ack", taken="true") == 1
    assert value("delayqueue_client_lateness_seconds_count", topic="traced") == 1
    assert value("delayqueue_client_handle_seconds_count", topic="traced", task="shop.charge") == 1


def test_a_task_sent_on_commit_carries_the_trace_it_was_called_in(sdk_server, spans):
    provider, exporter = spans
    recorder = Recorder()
    with Client(sdk_server, middleware=[OpenTelemetryMiddleware(provider), recorder]) as client:
        app = App(client)

        @app.task(topic="committed", name="shop.ship")
        def ship(order_id: int) -> None:
            pass

        with transaction.atomic():
            a_write("ship")
            with trace.get_tracer("web", tracer_provider=provider).start_as_current_span("POST /ship"):
                handle = ship.send_on_commit(7)
            assert client.get("committed", handle.msg_id) is None  # not before the commit
        # Rolled back: its before_send ran at the call and no after_send ever came (a producer span never ended).
        with pytest.raises(RuntimeError), transaction.atomic():
            ship.send_on_commit(8)
            raise RuntimeError("the caller's work failed")
        app.worker(wait_ms=200).run(burst=True, install_signal_handlers=False)

    by_name = {span.name: span for span in exporter.get_finished_spans()}
    request, sent, processed = by_name["POST /ship"], by_name["send committed"], by_name["process committed"]
    assert sent.parent.span_id == request.context.span_id and processed.parent.span_id == sent.context.span_id
    assert [c[:2] for c in recorder.calls if c[0].endswith("_send")] == [("before_send", handle.msg_id),
                                                                           ("after_send", handle.msg_id)]


class Recorder(Middleware):
    def __init__(self):
        self.calls = []

    def before_send(self, ctx):
        self.calls.append(("before_send", ctx.msg_id, ctx.headers))

    def after_send(self, ctx, sent, error):
        self.calls.append(("after_send", ctx.msg_id, sent.msg_id if sent else type(error).__name__))

    def before_handle(self, ctx):
        self.calls.append(("before_handle", ctx.message.msg_id, ctx.task))

    def after_handle(self, ctx, error):
        self.calls.append(("after_handle", ctx.message.msg_id, type(error).__name__ if error else None))

    def after_settle(self, ctx):
        self.calls.append(("after_settle", ctx.message.msg_id, ctx.outcome, ctx.done))


def test_every_hook_sees_plain_messages_sends_batches_failures_and_settles(sdk_server):
    recorder = Recorder()
    with Client(sdk_server, middleware=[recorder]) as client:
        one = client.send("plain", "a", msg_id="m-1")
        [two, three] = client.send_many([{"topic": "plain", "msg": "b", "msg_id": "m-2"},
                                         {"topic": "plain", "msg": "c", "msg_id": "m-3", "priority": 42}])
        with client.producer() as producer:
            four = producer.send("plain", "d", msg_id="m-4").result()

        def handle(message):
            if message.msg == "b":
                raise Retry(delay=60)  # not back within the burst

        Worker(client, "plain", handle, wait_ms=200).run(burst=True, install_signal_handlers=False)

    assert [type(m).__name__ for m in (one, two, three, four)] == ["Message", "Message", "BadRequest", "Message"]
    calls = recorder.calls
    sends = [c for c in calls if c[0].endswith("_send")]
    assert sends == [("before_send", "m-1", None), ("after_send", "m-1", "m-1"),
                     ("before_send", "m-2", None), ("before_send", "m-3", None),
                     ("after_send", "m-2", "m-2"), ("after_send", "m-3", "BadRequest"),
                     ("before_send", "m-4", None), ("after_send", "m-4", "m-4")]
    handled = {c[1]: c for c in calls if c[0] == "after_handle"}
    assert handled == {"m-1": ("after_handle", "m-1", None), "m-2": ("after_handle", "m-2", "Retry"),
                       "m-4": ("after_handle", "m-4", None)}
    assert {c[1]: c[2] for c in calls if c[0] == "before_handle"} == {"m-1": None, "m-2": None, "m-4": None}
    settled = {c[1]: c[2:] for c in calls if c[0] == "after_settle"}
    assert settled == {"m-1": ("ack", True), "m-2": ("nack", True), "m-4": ("ack", True)}
    for msg_id in ("m-1", "m-2", "m-4"):  # each message's hooks in their order
        order = [c[0] for c in calls if c[1] == msg_id and c[0] in ("before_handle", "after_handle", "after_settle")]
        assert order == ["before_handle", "after_handle", "after_settle"]
