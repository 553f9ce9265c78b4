"""The SDK's middleware chain and its OpenTelemetry and Prometheus middlewares, driven hook by hook
(the end-to-end trace, from a task's send to its handler on a real server, is in
tests/integration/test_sdk_observability.py)."""
import contextvars
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from delayqueue_client.message import Message
from delayqueue_client.middleware import (Chain, HandleContext, Middleware, OpenTelemetryMiddleware,
                                          PrometheusMiddleware, SendContext, SettleContext)


def message(topic="t", msg_id="m1", trigger_time=1_000_000, retry=0) -> Message:
    return Message(topic=topic, msg_id=msg_id, msg="{}", produce_time=trigger_time - 10, trigger_time=trigger_time,
                   expire_time=trigger_time + 60_000, max_retry=3, retry=retry, status=3)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class Recorder(Middleware):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def before_send(self, ctx):
        self.calls.append((self.name, "before_send"))

    def after_send(self, ctx, sent, error):
        self.calls.append((self.name, "after_send"))


class Broken(Middleware):
    def before_send(self, ctx):
        raise RuntimeError("exporter down")


def test_the_chain_calls_before_hooks_in_order_and_after_hooks_in_reverse():
    calls = []
    chain = Chain([Recorder("a", calls), Recorder("b", calls)])
    ctx = SendContext(topic="t", msg_id="m")
    chain.before_send(ctx)
    chain.after_send(ctx, None, None)
    assert calls == [("a", "before_send"), ("b", "before_send"), ("b", "after_send"), ("a", "after_send")]


def test_a_hook_that_raises_is_logged_and_the_rest_still_run(caplog):
    calls = []
    chain = Chain([Broken(), Recorder("after", calls)])
    with caplog.at_level(logging.ERROR, logger="delayqueue_client.middleware"):
        chain.before_send(SendContext(topic="t", msg_id="m"))
    assert calls == [("after", "before_send")]
    assert "Broken.before_send failed" in caplog.text


def test_anything_but_a_middleware_is_refused():
    with pytest.raises(TypeError, match="must subclass delayqueue_client.Middleware"):
        Chain([object()])


def test_a_task_send_carries_its_trace_to_the_handler_span(spans):
    provider, exporter = spans
    middleware = OpenTelemetryMiddleware(provider)
    send = SendContext(topic="orders", msg_id="m1", task="shop.charge", headers={})
    middleware.before_send(send)
    assert "traceparent" in send.headers  # what travels inside the envelope
    middleware.after_send(send, message("orders"), None)

    handle = HandleContext(message=message("orders"), task="shop.charge", headers=dict(send.headers))
    middleware.before_handle(handle)
    inner = trace.get_tracer("app", tracer_provider=provider).start_span("charge card")  # the handler's own span
    inner.end()
    middleware.after_handle(handle, None)

    sent, child, processed = exporter.get_finished_spans()
    assert (sent.name, sent.kind, processed.name, processed.kind) == (
        "send orders", trace.SpanKind.PRODUCER, "process orders", trace.SpanKind.CONSUMER)
    assert processed.context.trace_id == sent.context.trace_id  # one trace from send to handler
    assert processed.parent.span_id == sent.context.span_id
    assert child.parent.span_id == processed.context.span_id  # the handler ran inside the process span
    assert sent.attributes["messaging.system"] == "delayqueue"
    assert sent.attributes["messaging.destination.name"] == "orders"
    assert sent.attributes["messaging.message.id"] == "m1"
    assert processed.attributes["messaging.operation.type"] == "process"
    assert processed.attributes["delayqueue.task"] == "shop.charge"
    assert trace.get_current_span() is trace.INVALID_SPAN  # the handler's context was detached


def test_a_failed_handler_marks_its_span_as_an_error(spans):
    provider, exporter = spans
    middleware = OpenTelemetryMiddleware(provider)
    handle = HandleContext(message=message())
    middleware.before_handle(handle)
    middleware.after_handle(handle, ValueError("card declined"))
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.attributes["error.type"] == "ValueError"
    assert [e.name for e in span.events] == ["exception"]


def test_a_span_ends_even_when_its_errors_text_cannot_be_read(spans):
    """The worker settles a message whose exception's str() raises; its span was never ended (lost)."""
    class Unreadable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    provider, exporter = spans
    chain = Chain([OpenTelemetryMiddleware(provider)])
    handle = HandleContext(message=message())
    chain.before_handle(handle)
    chain.after_handle(handle, Unreadable())
    [span] = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "Unreadable"


def test_an_interrupted_handlers_span_is_no_error_and_says_so(spans, caplog):
    """A handler cancelled by a hard stop, its message given back: not a failure of the handler.
    Closed with its loop gone, its after_handle runs outside its task's context, where OpenTelemetry
    cannot detach the handler's (and logged an error for each)."""
    provider, exporter = spans
    middleware = OpenTelemetryMiddleware(provider)
    handle = HandleContext(message=message())
    contextvars.copy_context().run(middleware.before_handle, handle)  # in the handler's task's context
    handle.interrupted = True  # as the worker sets it, passing no error
    middleware.after_handle(handle, None)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == trace.StatusCode.UNSET and span.events == ()
    assert span.attributes["delayqueue.interrupted"] is True
    # Interrupted in its own context (a thread handler's KeyboardInterrupt): its span was left current there.
    own, thread_handler = contextvars.copy_context(), HandleContext(message=message())
    own.run(middleware.before_handle, thread_handler)
    thread_handler.interrupted = True
    own.run(middleware.after_handle, thread_handler, None)
    assert own.run(trace.get_current_span) is trace.INVALID_SPAN


def test_a_plain_message_has_no_headers_and_its_process_span_starts_a_trace(spans):
    provider, exporter = spans
    middleware = OpenTelemetryMiddleware(provider)
    send = SendContext(topic="t", msg_id="m1")  # headers None: nothing to write into
    middleware.before_send(send)
    middleware.after_send(send, None, None)
    handle = HandleContext(message=message())
    middleware.before_handle(handle)
    middleware.after_handle(handle, None)
    sent, processed = exporter.get_finished_spans()
    assert processed.parent is None and processed.context.trace_id != sent.context.trace_id


def test_prometheus_counts_outcomes_durations_and_lateness():
    registry = CollectorRegistry()
    middleware = PrometheusMiddleware(registry)
    send = SendContext(topic="t", msg_id="m1")
    middleware.after_send(send, None, None)
    middleware.after_send(send, None, RuntimeError("down"))
    due = message(trigger_time=1_000_000)
    ok = HandleContext(message=due, task="a.b", started=1_000.250)  # 250 ms after its trigger time
    middleware.before_handle(ok)
    middleware.after_handle(ok, None)
    failed = HandleContext(message=due, task="a.b", started=1_000.0)
    middleware.before_handle(failed)
    middleware.after_handle(failed, ValueError())
    interrupted = HandleContext(message=due, task="a.b", started=1_000.0, interrupted=True)
    middleware.before_handle(interrupted)
    middleware.after_handle(interrupted, None)
    middleware.after_settle(SettleContext(message=due, outcome="ack", done=True))
    middleware.after_settle(SettleContext(message=due, outcome="nack", done=False))

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("delayqueue_client_sent_total", topic="t", outcome="ok") == 1
    assert value("delayqueue_client_sent_total", topic="t", outcome="error") == 1
    assert value("delayqueue_client_handled_total", topic="t", task="a.b", outcome="ok") == 1
    assert value("delayqueue_client_handled_total", topic="t", task="a.b", outcome="error") == 1
    assert value("delayqueue_client_handled_total", topic="t", task="a.b", outcome="interrupted") == 1
    assert value("delayqueue_client_handle_seconds_count", topic="t", task="a.b") == 3
    assert value("delayqueue_client_lateness_seconds_count", topic="t") == 3
    assert value("delayqueue_client_lateness_seconds_sum", topic="t") == pytest.approx(0.25)
    assert value("delayqueue_client_lateness_seconds_bucket", topic="t", le="0.25") == 3
    assert value("delayqueue_client_settled_total", topic="t", outcome="ack", taken="true") == 1
    assert value("delayqueue_client_settled_total", topic="t", outcome="nack", taken="false") == 1
