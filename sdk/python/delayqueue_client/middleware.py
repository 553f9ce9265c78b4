"""Middleware: hooks around what the SDK does with a message, for tracing, metrics and logging.

A middleware subclasses `Middleware` and overrides the hooks it needs; `Client(middleware=[...])`
runs the send hooks, `Worker(middleware=[...])` (and `App.worker`) the handle and settle hooks, in
list order before and in reverse order after. A hook that raises is logged and skipped: a
broken exporter never costs a send or a message.

Two middlewares ship here, each needing its optional dependency only when made:
`OpenTelemetryMiddleware` (pip install delayqueue-client[otel]) and `PrometheusMiddleware`
(pip install delayqueue-client[prometheus]).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from delayqueue_client.message import Message

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

log = logging.getLogger("delayqueue_client.middleware")


@dataclass
class SendContext:
    """One message being sent. `headers` are the task envelope's (None for a plain message, which
    has nowhere to carry them): what a before_send hook writes there travels with the message."""

    topic: str
    msg_id: str
    task: str | None = None
    headers: dict[str, str] | None = None
    state: dict[str, Any] = field(default_factory=dict)  # a middleware's own, from before to after


@dataclass
class HandleContext:
    """One message handed to a handler; `headers` and `task` are its envelope's ({} and None for
    a plain message). `interrupted`, set for after_handle: the handler raised KeyboardInterrupt (Ctrl-C),
    or the async one was cancelled or closed from outside (a hard stop, its event loop ending), so it
    neither returned nor failed, and after_handle's error is None; its message is given back (or left to
    its ack timeout), not failed."""

    message: Message
    task: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    started: float = 0.0  # time.time() when its handling began
    state: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False


@dataclass
class SettleContext:
    """A handled message's outcome as the server took it: "ack", "nack" or "dead"; `done` False
    when the server no longer held it (settled too late: it is delivered again or ended)."""

    message: Message
    outcome: str
    done: bool


class Middleware:
    """The hooks, each a no-op here."""

    def before_send(self, ctx: SendContext) -> None:
        pass

    def after_send(self, ctx: SendContext, sent: Message | None, error: BaseException | None) -> None:
        pass

    def before_handle(self, ctx: HandleContext) -> None:
        pass

    def after_handle(self, ctx: HandleContext, error: BaseException | None) -> None:
        pass

    def after_settle(self, ctx: SettleContext) -> None:
        pass


class Chain:
    """The middlewares of a client or worker, called in order (before) and reverse order (after)."""

    def __init__(self, middleware: Sequence[Middleware] = ()):
        for each in middleware:
            if not isinstance(each, Middleware):
                raise TypeError(f"middleware must subclass delayqueue_client.Middleware, got {type(each).__name__}")
        self.middleware = tuple(middleware)

    def __bool__(self) -> bool:
        return bool(self.middleware)

    def _call(self, hook: str, ordered: Sequence[Middleware], *args: Any) -> None:
        for each in ordered:
            try:
                getattr(each, hook)(*args)
            except Exception:
                log.exception("%s.%s failed (skipped)", type(each).__name__, hook)

    def before_send(self, ctx: SendContext) -> None:
        self._call("before_send", self.middleware, ctx)

    def after_send(self, ctx: SendContext, sent: Message | None, error: BaseException | None) -> None:
        self._call("after_send", self.middleware[::-1], ctx, sent, error)

    def before_handle(self, ctx: HandleContext) -> None:
        self._call("before_handle", self.middleware, ctx)

    def after_handle(self, ctx: HandleContext, error: BaseException | None) -> None:
        self._call("after_handle", self.middleware[::-1], ctx, error)

    def after_settle(self, ctx: SettleContext) -> None:
        self._call("after_settle", self.middleware[::-1], ctx)


MESSAGING_SYSTEM = "delayqueue"


class OpenTelemetryMiddleware(Middleware):
    """Spans per OpenTelemetry's messaging conventions: a PRODUCER span "send <topic>" per send and
    a CONSUMER span "process <topic>" per handling, the handler running inside it. A task's send
    writes its trace context into the envelope's headers (the global propagator's format, W3C
    traceparent by default), so the process span continues the sender's trace: one trace from
    send to handler. Plain messages have no headers: their process spans start a new trace."""

    def __init__(self, tracer_provider: TracerProvider | None = None):
        try:
            from opentelemetry import trace
        except ImportError:
            raise ImportError("OpenTelemetryMiddleware needs opentelemetry-api: "
                              "pip install 'delayqueue-client[otel]'") from None
        from importlib import metadata

        self._tracer = trace.get_tracer("delayqueue_client", metadata.version("delayqueue-client"),
                                        tracer_provider=tracer_provider)

    @staticmethod
    def _attributes(operation: str, topic: str, msg_id: str, task: str | None) -> dict[str, str]:
        attributes = {"messaging.system": MESSAGING_SYSTEM, "messaging.operation.type": operation,
                      "messaging.operation.name": operation, "messaging.destination.name": topic,
                      "messaging.message.id": msg_id}
        if task is not None:
            attributes["delayqueue.task"] = task
        return attributes

    def before_send(self, ctx: SendContext) -> None:
        from opentelemetry import context, propagate, trace

        span = self._tracer.start_span(f"send {ctx.topic}", kind=trace.SpanKind.PRODUCER,
                                       attributes=self._attributes("send", ctx.topic, ctx.msg_id, ctx.task))
        ctx.state["otel_span"] = span
        if ctx.headers is not None:
            propagate.inject(ctx.headers, context=trace.set_span_in_context(span, context.get_current()))

    def after_send(self, ctx: SendContext, sent: Message | None, error: BaseException | None) -> None:
        span = ctx.state.pop("otel_span", None)
        if span is not None:
            _end(span, error)

    def before_handle(self, ctx: HandleContext) -> None:
        from opentelemetry import context, propagate, trace

        parent = propagate.extract(ctx.headers) if ctx.headers else None
        attributes = self._attributes("process", ctx.message.topic, ctx.message.msg_id, ctx.task)
        attributes["messaging.delayqueue.retry"] = str(ctx.message.retry)
        span = self._tracer.start_span(f"process {ctx.message.topic}", context=parent, kind=trace.SpanKind.CONSUMER,
                                       attributes=attributes)
        # The handler runs in this context (same thread or task), so its own spans are children.
        ctx.state["otel_span"] = span
        ctx.state["otel_token"] = context.attach(trace.set_span_in_context(span))

    def after_handle(self, ctx: HandleContext, error: BaseException | None) -> None:
        from opentelemetry import context, trace

        token = ctx.state.pop("otel_token", None)
        span = ctx.state.pop("otel_span", None)
        # An interrupted async handler closed with its loop gone runs this in another context, where detaching
        # fails (and OpenTelemetry logs an error); one still in its own (a thread's Ctrl-C) is detached there.
        if token is not None and (not ctx.interrupted or trace.get_current_span() is span):
            context.detach(token)
        if span is not None:
            if ctx.interrupted:
                span.set_attribute("delayqueue.interrupted", True)
            _end(span, error)


def _end(span: Any, error: BaseException | None) -> None:
    from opentelemetry.trace import Status, StatusCode

    try:
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.record_exception(error)
    finally:  # an error whose text cannot be read (its str() raises) still ends its span, marked by its type
        span.end()


class PrometheusMiddleware(Middleware):
    """Client-side metrics, labelled by topic (and task where there is one):
    - delayqueue_client_sent_total{topic, outcome="ok"|"error"}
    - delayqueue_client_handled_total{topic, task, outcome="ok"|"error"|"interrupted"}
    - delayqueue_client_handle_seconds{topic, task}: how long handlers ran
    - delayqueue_client_lateness_seconds{topic}: handling start minus the message's triggerTime
      (the server's clock against this machine's: keep them in sync)
    - delayqueue_client_settled_total{topic, outcome="ack"|"nack"|"dead", taken="true"|"false"}
    Registered in `registry` (prometheus_client's default registry when None)."""

    LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

    def __init__(self, registry: CollectorRegistry | None = None, *, prefix: str = "delayqueue_client"):
        try:
            import prometheus_client
        except ImportError:
            raise ImportError("PrometheusMiddleware needs prometheus-client: "
                              "pip install 'delayqueue-client[prometheus]'") from None
        where: dict[str, Any] = {"registry": registry} if registry is not None else {}
        self.sent = prometheus_client.Counter(f"{prefix}_sent", "Messages sent", ["topic", "outcome"], **where)
        self.handled = prometheus_client.Counter(f"{prefix}_handled", "Messages handled",
                                                 ["topic", "task", "outcome"], **where)
        self.handle_seconds = prometheus_client.Histogram(f"{prefix}_handle_seconds", "Handler duration",
                                                          ["topic", "task"], **where)
        self.lateness = prometheus_client.Histogram(f"{prefix}_lateness_seconds",
                                                    "Handling start minus the message's trigger time", ["topic"],
                                                    buckets=self.LATENESS_BUCKETS, **where)
        self.settled = prometheus_client.Counter(f"{prefix}_settled", "Handled messages settled",
                                                 ["topic", "outcome", "taken"], **where)

    def after_send(self, ctx: SendContext, sent: Message | None, error: BaseException | None) -> None:
        self.sent.labels(ctx.topic, "ok" if error is None else "error").inc()

    def before_handle(self, ctx: HandleContext) -> None:
        ctx.state["prometheus_started"] = time.monotonic()
        started = ctx.started or time.time()
        self.lateness.labels(ctx.message.topic).observe(max(0.0, started - ctx.message.trigger_time / 1000))

    def after_handle(self, ctx: HandleContext, error: BaseException | None) -> None:
        task = ctx.task or ""
        outcome = "interrupted" if ctx.interrupted else "ok" if error is None else "error"
        self.handled.labels(ctx.message.topic, task, outcome).inc()
        began = ctx.state.pop("prometheus_started", None)
        if began is not None:
            self.handle_seconds.labels(ctx.message.topic, task).observe(time.monotonic() - began)

    def after_settle(self, ctx: SettleContext) -> None:
        self.settled.labels(ctx.message.topic, ctx.outcome, "true" if ctx.done else "false").inc()
