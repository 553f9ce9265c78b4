"""The camellia-compatible HTTP API. Views only parse (serializers) and render; the queue
logic is in services (writes) and selectors (reads).

Every answer is HTTP 200 with the business result in `code` (200, 400, 404, 500), as the
camellia Java SDK expects.
"""

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.views import APIView

from delayqueue.api import health
from delayqueue.messagelog import recovery
from delayqueue import selectors
from delayqueue import services
from delayqueue.exceptions import error_answer
from delayqueue.api.parsers import FORM_CONTENT_TYPE, JSONBodyParser, TooManyFields, parse_form
from delayqueue.runtime import current
from delayqueue.api.schema import (
    BatchResultSerializer,
    DelayMsgListResultSerializer,
    DelayMsgResultSerializer,
    MonitorDataResultSerializer,
    RestoreResultSerializer,
    ResultSerializer,
    TopicInfoListResultSerializer,
    TopicInfoResultSerializer,
    health_endpoint,
    queue_endpoint,
)
from delayqueue.api.validation import (
    AckMsgSerializer,
    DeleteMsgSerializer,
    FastValidation,
    LongPollingMsgSerializer,
    MessageRefSerializer,
    PullMsgSerializer,
    RestoreMsgSerializer,
    RestoreSerializer,
    SendMsgSerializer,
    TopicSerializer,
    first_error,
)


# Parameters whose empty value is itself an answer (400, or "generate an id"); any other empty
# parameter counts as absent, as Spring treats it.
KEEP_EMPTY = {"topic", "msg", "msgId"}


class BadInput(Exception):
    pass


_parsers: dict[type, tuple] = {}


def parse(serializer_class, data: dict) -> dict:
    """Validates request parameters: the serializer's fast path for the well-formed common case,
    the serializer itself for the rest (and for every error message). One serializer instance per
    class is reused: validation keeps no state on the instance, and building one per request (DRF
    deep-copies every field) costs more than the rest of a send."""
    parser = _parsers.get(serializer_class)
    if parser is None:
        serializer = serializer_class()
        parser = _parsers[serializer_class] = (serializer, FastValidation(serializer))
    validated = parser[1](data)
    if validated is not None:
        return validated
    try:
        return parser[0].run_validation(data)
    except ValidationError as exc:
        raise BadInput(first_error(exc.detail)) from None


def reply(code: int = 200, msg: str = "success", **payload) -> HttpResponse:
    """The API speaks JSON only, so it renders directly instead of through DRF's content
    negotiation and template response (which Django would render via a thread hop)."""
    return HttpResponse(orjson.dumps({"code": code, "msg": msg, **payload}), content_type="application/json")


def to_new_message(data: dict) -> services.SendRequest:
    return services.SendRequest(
        topic=data["topic"],
        msg=data["msg"],
        delay_millis=data["delayMillis"],
        msg_id=data.get("msgId") or None,
        ttl_millis=data["ttlMillis"],
        max_retry=data["maxRetry"],
    )


class QueueAPIView(APIView):
    """An async DRF view: serializers validate the parameters, `reply` renders JSON. Form bodies
    (every call of camellia's SDK) and query strings are read from Django's request; DRF's
    Request and parsers are built only for a JSON or multipart body (`body_data`). No
    authentication, permissions or throttling: the API is camellia's, open to its SDK."""

    http_method_names = ["get", "post"]
    parser_classes = [FormParser, JSONBodyParser, MultiPartParser]  # form bodies: see params()
    # Message operations count as use for /camellia/health/offline; monitor reads do not.
    marks_use = True

    # Parsers and the negotiator keep no per-request state: build them once, not per request.
    _parsers = None
    _negotiator = None

    def get_parsers(self):
        if QueueAPIView._parsers is None:
            QueueAPIView._parsers = super().get_parsers()
        return QueueAPIView._parsers

    def get_content_negotiator(self):
        if QueueAPIView._negotiator is None:
            QueueAPIView._negotiator = super().get_content_negotiator()
        return QueueAPIView._negotiator

    async def dispatch(self, request, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.request = request  # Django's: see body_data()
        self.rt = current()  # once: each asyncio.get_running_loop() is a getpid() system call
        if self.marks_use:
            health.mark_use(self.rt)
        try:
            if request.method.lower() not in self.http_method_names:
                raise exceptions.MethodNotAllowed(request.method)
            return await self.handle()
        except Exception as exc:
            return self.handle_exception(exc)

    def handle_exception(self, exc):
        if isinstance(exc, BadInput):
            return reply(400, str(exc))
        if isinstance(exc, RequestDataTooBig):
            return reply(400, f"request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
        if isinstance(exc, exceptions.MethodNotAllowed):
            return reply(400, f"method {self.request.method} not allowed, use GET or POST")
        if isinstance(exc, exceptions.APIException):
            return reply(400, f"bad request: {first_error(exc.detail)}")
        return reply(*error_answer(exc, type(self).__name__))

    def body_data(self):
        """A JSON or multipart body, parsed by DRF (its Request costs more than a form's parse)."""
        return self.initialize_request(self.request, *self.args, **self.kwargs).data

    def params(self) -> dict:
        """Query string and body (form or JSON object) merged; the body wins."""
        request = self.request
        # Building the query-string QueryDict costs a noticeable share of a send: only when there is one.
        params = request.GET.dict() if request.META.get("QUERY_STRING") else {}
        if request.content_type == FORM_CONTENT_TYPE:
            try:
                data = parse_form(request.body, request.encoding or settings.DEFAULT_CHARSET)
            except TooManyFields as exc:
                raise BadInput(f"request body has {exc}") from None
        else:
            data = self.body_data()
            if hasattr(data, "dict"):
                data = data.dict()
            if not isinstance(data, dict):
                raise BadInput("request body must be form fields or a JSON object")
        params.update(data)
        return {k: v for k, v in params.items() if v != "" or k in KEEP_EMPTY}

    def validated(self, serializer_class) -> dict:
        return parse(serializer_class, self.params())

    # Declared async so Django treats the view as async; dispatch() calls handle() for both.
    async def get(self, request, *args, **kwargs):
        return await self.handle()

    async def post(self, request, *args, **kwargs):
        return await self.handle()

    async def handle(self) -> HttpResponse:
        raise NotImplementedError


@queue_endpoint("Send a message", DelayMsgResultSerializer, SendMsgSerializer)
class SendMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(SendMsgSerializer)
        message = (await services.send_messages(self.rt, requests=[to_new_message(data)]))[0]
        if isinstance(message, Exception):
            raise message
        return reply(delayMsg=message)


@queue_endpoint("Send many messages (a JSON list of sendMsg objects)", BatchResultSerializer,
                body=SendMsgSerializer(many=True))
class SendMsgBatchView(QueueAPIView):
    """A JSON list of sendMsg objects; one {code, msg, delayMsg} result per message, in order."""

    async def handle(self):
        items = self.body_data()
        if isinstance(items, dict) and "messages" in items:
            items = items["messages"]
        if not isinstance(items, list) or not items:
            raise BadInput("body must be a non-empty JSON list of messages")
        rt = self.rt
        if len(items) > rt.config.max_batch_send:
            raise BadInput(f"batch has {len(items)} messages, over the limit of {rt.config.max_batch_send}")
        results: list[dict | None] = [None] * len(items)
        accepted, positions = [], []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                results[i] = {"code": 400, "msg": f"message {i}: must be a JSON object"}
                continue
            try:
                data = parse(SendMsgSerializer, {k: v for k, v in item.items() if v != "" or k in KEEP_EMPTY})
            except BadInput as exc:
                results[i] = {"code": 400, "msg": f"message {i}: {exc}"}
            else:
                accepted.append(to_new_message(data))
                positions.append(i)
        sent = await services.send_messages(rt, requests=accepted) if accepted else []
        for i, outcome in zip(positions, sent):
            if isinstance(outcome, Exception):
                code, msg = error_answer(outcome, type(self).__name__)
                results[i] = {"code": code, "msg": f"message {i}: {msg}"}
            else:
                results[i] = {"code": 200, "msg": "success", "delayMsg": outcome}
        return reply(results=results)


@queue_endpoint("Pull ready messages (short poll)", DelayMsgListResultSerializer, PullMsgSerializer)
class PullMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(PullMsgSerializer)
        messages, _remaining = await services.pull_messages(
            self.rt, topic=data["topic"], batch=data["batch"], ack_timeout_millis=data["ackTimeoutMillis"]
        )
        return reply(delayMsgList=messages)


@queue_endpoint("Pull, holding the request until a message is ready or the timeout",
                DelayMsgListResultSerializer, LongPollingMsgSerializer)
class LongPollingMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(LongPollingMsgSerializer)
        messages = await services.long_poll_messages(
            self.rt, topic=data["topic"], batch=data["batch"], ack_timeout_millis=data["ackTimeoutMillis"],
            timeout_millis=data["longPollingTimeoutMillis"]
        )
        return reply(delayMsgList=messages)


@queue_endpoint("Ack (ack=true) or give back for immediate retry (ack=false)", ResultSerializer,
                AckMsgSerializer)
class AckMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(AckMsgSerializer)
        ack = services.ack_message if data["ack"] else services.nack_message
        await ack(self.rt, topic=data["topic"], msg_id=data["msgId"])
        return reply()


@queue_endpoint("Read one message", DelayMsgResultSerializer, MessageRefSerializer)
class GetMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(MessageRefSerializer)
        message = await selectors.get_message(self.rt, topic=data["topic"], msg_id=data["msgId"])
        if message is None:
            return reply(404, f"message {data['msgId']} not found in topic {data['topic']}", delayMsg=None)
        return reply(delayMsg=message)


@queue_endpoint("Delete a live message", ResultSerializer, DeleteMsgSerializer)
class DeleteMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(DeleteMsgSerializer)
        if not await services.delete_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                             release=data["release"]):
            return reply(404, f"message {data['msgId']} not found or already ended in topic {data['topic']}")
        return reply()


@queue_endpoint("Last monitor interval's counters, summed over all processes",
                MonitorDataResultSerializer)
class GetMonitorDataView(QueueAPIView):
    marks_use = False

    async def handle(self):
        return reply(data=await selectors.monitor_data(self.rt))


@queue_endpoint("Queue sizes and nine waiting-delay buckets of a topic", TopicInfoResultSerializer,
                TopicSerializer)
class GetTopicInfoView(QueueAPIView):
    marks_use = False

    async def handle(self):
        data = self.validated(TopicSerializer)
        return reply(data=await selectors.topic_info(self.rt, topic=data["topic"]))


@queue_endpoint("getTopicInfo of every registered topic", TopicInfoListResultSerializer)
class GetTopicInfoListView(QueueAPIView):
    marks_use = False

    async def handle(self):
        rt = self.rt
        return reply(data=await selectors.topic_infos(rt, topics=await selectors.list_topics(rt)))


def restore_reply(counts: recovery.RestoreCounts) -> HttpResponse:
    return reply(restored=counts.restored, alreadyLive=counts.already_live, skipped=counts.skipped)


@queue_endpoint("Restore live messages from the message log into Redis", RestoreResultSerializer,
                RestoreSerializer)
class RestoreView(QueueAPIView):
    """Brings back into Redis what the message log says is live; expire=true also brings back
    messages whose TTL ran out before delivery. Safe to repeat: what Redis holds is skipped."""

    async def handle(self):
        data = self.validated(RestoreSerializer)
        rt = self.rt
        topic = data.get("topic")
        counts = await recovery.restore(rt, topic=topic, include_expired=data["expire"])
        if topic is not None and not counts.seen:
            return reply(404, f"topic {topic} has no messages in the message log")
        return restore_reply(counts)


@queue_endpoint("Restore one message from the message log into Redis", RestoreResultSerializer,
                RestoreMsgSerializer)
class RestoreMsgView(QueueAPIView):
    async def handle(self):
        data = self.validated(RestoreMsgSerializer)
        rt = self.rt
        topic, msg_id = data["topic"], data["msgId"]
        counts = await recovery.restore(rt, topic=topic, msg_id=msg_id, include_expired=data["expire"])
        if not counts.seen:
            return reply(404, f"message {msg_id} not found in the message log of topic {topic}")
        return restore_reply(counts)


def health_reply(code: int) -> HttpResponse:
    """camellia's health answers: {"code": N} with the same HTTP status, for load balancers."""
    return HttpResponse(orjson.dumps({"code": code}), status=code,
                        content_type="application/json")


class HealthView(QueueAPIView):
    marks_use = False


@health_endpoint("200 while this host is online, 500 after /offline", failing="offline")
class HealthStatusView(HealthView):
    async def handle(self):
        return health_reply(200 if await health.is_online(self.rt) else 500)


@health_endpoint("Always 200 while the process serves requests")
class HealthCheckView(HealthView):
    async def handle(self):
        return health_reply(200)


@health_endpoint("Report online again")
class HealthOnlineView(HealthView):
    async def handle(self):
        await health.set_online(self.rt, True)
        return health_reply(200)


@health_endpoint("Report this host offline (to drain); 200 once none of its workers served a queue request "
                 "for 20 s, else 500",
                 failing="still serving queue requests")
class HealthOfflineView(HealthView):
    async def handle(self):
        rt = self.rt
        await health.set_online(rt, False)
        return health_reply(200 if await health.idle(rt) else 500)
