"""The camellia-compatible HTTP API. Views only parse (serializers) and render; the queue
logic is in services (writes) and selectors (reads).

Every answer is HTTP 200 with the business result in `code`, as the camellia Java SDK expects;
an error answer is `code` and `msg` (and `retryAfterMillis` when throttled), from exceptions.error_body.
"""
import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from delayqueue.api import health, wire
from delayqueue.api.auth import authorize
from delayqueue.api.parsers import (FORM_CONTENT_TYPE, FormBodyParser, FormError, JSONBodyParser, StrictMultiPartParser,
                                    parse_fields, parse_form)
from delayqueue.api.schema import (AckBatchResultSerializer, AckResultSerializer, BatchResultSerializer,
                                   CountResultSerializer, DeadMsgListResultSerializer, DelayMsgListResultSerializer,
                                   DelayMsgResultSerializer, MonitorDataResultSerializer, PurgeResultSerializer,
                                   RedriveTaskResultSerializer, RestoreResultSerializer, ResultSerializer,
                                   SetTopicConfigResultSerializer, TaskIdResultSerializer, TopicConfigResultSerializer,
                                   TopicInfoListResultSerializer, TopicInfoResultSerializer, TouchResultSerializer,
                                   answer, health_endpoint, queue_endpoint)
from delayqueue.api.validation import (AckMsgBatchSerializer, AckMsgSerializer, DeadMsgListSerializer,
                                       DeleteMsgSerializer, FastValidation, LongPollingMsgSerializer,
                                       MessageRefSerializer, PullMsgSerializer, PurgeDeadMsgSerializer,
                                       RedriveDeadMsgSerializer, RedriveTaskSerializer, RescheduleMsgSerializer,
                                       RestoreMsgSerializer, RestoreSerializer, SendMsgSerializer,
                                       SetTopicConfigSerializer, TopicSerializer, TouchMsgSerializer, first_error)
from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import BadRequest, NotFound, Refused, error_answer, error_body
from delayqueue.runtime import current
from delayqueue.services.consume import (ack_message, ack_messages, long_poll_messages, nack_message, pull_messages,
                                         touch_message)
from delayqueue.services.dead_letters import create_redrive, dead_letters, purge_dead_letters, redrive_state
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.send import send_message, send_messages
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import list_topics, monitor_data, purge_topic, topic_config, topic_info, topic_infos

# Parameters whose empty value is itself an answer (400, "generate an id", "push off"); any other
# empty parameter counts as absent, as Spring treats it.
KEEP_EMPTY = {"topic", "msg", "msgId", "pushUrl"}

# Permission classes that let everyone in: no check to run.
NOTHING_TO_PERMIT = ((), (AllowAny,))

# DRF's refusals of a caller that keep their own code: not authenticated, not allowed, throttled.
CALLER_REFUSALS = (401, 403, 429)


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
        raise BadRequest(first_error(exc.detail)) from None


def reply(code: int = 200, msg: str = "success", **payload) -> HttpResponse:
    """The API speaks JSON only, so it renders directly instead of through DRF's content
    negotiation and template response (which Django would render via a thread hop)."""
    return HttpResponse(orjson.dumps({"code": code, "msg": msg, **payload}), content_type="application/json")


class QueueAPIView(APIView):
    """An async DRF view: serializers validate the parameters, `reply` renders JSON. Form bodies
    (every call of camellia's SDK) and query strings are read from Django's request; DRF's
    Request and parsers are built only for a JSON or multipart body (`body_data`), or when the
    view has authentication, permission or throttle checks to run (`checks_callers`)."""

    http_method_names = ["get", "post"]
    parser_classes = [FormBodyParser, JSONBodyParser, StrictMultiPartParser]  # form bodies: see params()
    # Message operations count as use for /camellia/health/offline; monitor reads do not.
    marks_use = True
    # The scope a token needs (DELAYQUEUE_AUTH=tokens); None: open to anyone.
    needs_scope: Scope | tuple[Scope, ...] | None = None  # a tuple: any one of them
    # Host-wide views (health) work in DELAYQUEUE_NAMESPACE whatever the token's namespace.
    host_wide = False

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

    def checks_callers(self) -> bool:
        """Whether DRF's authentication, permission or throttle checks have anything to do. Only
        then is DRF's Request built before the view runs: for a form body it costs more than the
        rest of a send."""
        return bool(self.authentication_classes or self.throttle_classes) or (
            tuple(self.permission_classes) not in NOTHING_TO_PERMIT)

    async def dispatch(self, request, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.request = request  # Django's: see body_data()
        self.drf_request = None
        try:
            if request.method.lower() not in self.http_method_names:
                raise drf_exceptions.MethodNotAllowed(request.method)
            if self.checks_callers():
                self.drf_request = self.initialize_request(request, *args, **kwargs)
                self.initial(self.drf_request, *args, **kwargs)  # authenticates, checks permissions and throttles
            root = current()  # once: each asyncio.get_running_loop() is a getpid() system call
            self.rt = root
            if self.needs_scope is not None and root.config.auth == "tokens":
                namespace = await authorize(root, request, self.needs_scope)
                if not self.host_wide:
                    self.rt = root.for_namespace(namespace)
            if self.marks_use:
                health.mark_use(root)  # host-wide
            return await self.handle()
        except Exception as exc:
            return self.handle_exception(exc)

    def handle_exception(self, exc):
        return reply(**error_body(self.queue_error(exc), type(self).__name__))

    def queue_error(self, exc: Exception) -> Exception:
        """Problems of the HTTP request itself as the queue's error kinds; error_answer words them all."""
        if isinstance(exc, RequestDataTooBig):
            return BadRequest(f"request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
        if isinstance(exc, TooManyFieldsSent):  # Django's own parse (request.GET, multipart) met the limit
            return BadRequest(f"request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields")
        if isinstance(exc, drf_exceptions.MethodNotAllowed):
            return BadRequest(f"method {self.request.method} not allowed, use GET or POST")
        if isinstance(exc, drf_exceptions.APIException):
            if exc.status_code in CALLER_REFUSALS:
                return Refused(first_error(exc.detail), exc.status_code)
            return BadRequest(f"bad request: {first_error(exc.detail)}")
        return exc

    def body_data(self):
        """A JSON or multipart body, parsed by DRF (its Request costs more than a form's parse)."""
        if self.drf_request is None:
            self.drf_request = self.initialize_request(self.request, *self.args, **self.kwargs)
        return self.drf_request.data

    def params(self) -> dict:
        """Query string and body (form or JSON object) merged; the body wins."""
        request = self.request
        if query_string_error := getattr(request, "query_string_error", None):  # see api/asgi.py
            raise BadRequest(query_string_error)
        encoding = request.encoding or settings.DEFAULT_CHARSET
        query = request.META.get("QUERY_STRING")
        try:
            # As request.GET.dict(), but refusing what it would guess at (see parsers.py), and cheaper.
            params = parse_fields(query, encoding) if query else {}
            data = parse_form(request.body, encoding) if request.content_type == FORM_CONTENT_TYPE else None
        except FormError as exc:
            raise BadRequest(str(exc)) from None
        if data is None:
            data = self.body_data()
            if hasattr(data, "dict"):
                data = data.dict()
            if not isinstance(data, dict):
                raise BadRequest("request body must be form fields or a JSON object")
        params.update(data)
        return {k: v for k, v in params.items() if v != "" or k in KEEP_EMPTY}

    def validated(self, serializer_class) -> dict:
        return parse(serializer_class, self.params())

    def validated_fully(self, serializer_class) -> dict:
        """As validated(), by the serializer alone: for parameters the fast path does not take
        (a JSON list of msgIds), on endpoints that are not hot."""
        try:
            return serializer_class().run_validation(self.params())
        except ValidationError as exc:
            raise BadRequest(first_error(exc.detail)) from None

    # Declared async so Django treats the view as async; dispatch() calls handle() for both.
    async def get(self, request, *args, **kwargs):
        return await self.handle()

    async def post(self, request, *args, **kwargs):
        return await self.handle()

    async def handle(self) -> HttpResponse:
        raise NotImplementedError


@queue_endpoint(
    "Send a message",
    "Stores a message that can be pulled from its topic once delayMillis have passed. The answer carries "
    "the stored message: its msgId (generated when none was given), its times and its status (1 waiting, "
    "or 2 ready when the delay is 0 or less). Sending again under the msgId of a message that is still live "
    "changes nothing and answers the stored message. Over a produce rate or a live-message cap of the "
    "namespace or the topic: code 429 with retryAfterMillis.",
    answer("SendMsgAnswer", DelayMsgResultSerializer), SendMsgSerializer,
    example={"topic": "orders", "msg": '{"orderId": 42, "action": "cancel-if-unpaid"}', "delayMillis": 1800000,
             "msgId": "order-42-cancel", "ttlMillis": 3600000, "maxRetry": 3})
class SendMsgView(QueueAPIView):
    needs_scope = Scope.PRODUCE

    async def handle(self):
        data = self.validated(SendMsgSerializer)
        return reply(delayMsg=wire.message(await send_message(self.rt, request=wire.send_request(data))))


@queue_endpoint(
    "Send many messages",
    "Sends each message of a JSON list (each with sendMsg's parameters), in one call. The answer's "
    "`results` has one entry per message, in request order: code 200 with the stored message, or the "
    "code and msg saying why that message was not sent (its msg starts with `message <index>:`; over a "
    "limit, code 429 with retryAfterMillis). A refused message does not stop the others. The body may also be a JSON object "
    '`{"messages": [...]}`. The list must hold 1 to DELAYQUEUE_MAX_BATCH_SEND (default 1000) messages.',
    answer("SendMsgBatchAnswer", BatchResultSerializer), body=SendMsgSerializer(many=True),
    example=[{"topic": "orders", "msg": "remind 42", "delayMillis": 600000},
             {"topic": "orders", "msg": "cancel 42", "delayMillis": 1800000, "msgId": "order-42-cancel"}])
class SendMsgBatchView(QueueAPIView):
    needs_scope = Scope.PRODUCE

    async def handle(self):
        items = self.body_data()
        if isinstance(items, dict) and "messages" in items:
            items = items["messages"]
        if not isinstance(items, list) or not items:
            raise BadRequest("body must be a non-empty JSON list of messages")
        rt = self.rt
        if len(items) > rt.config.max_batch_send:
            raise BadRequest(f"batch has {len(items)} messages, over the limit of {rt.config.max_batch_send}")
        results: list[dict | None] = [None] * len(items)
        accepted, positions = [], []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise BadRequest("must be a JSON object")
                data = parse(SendMsgSerializer, {k: v for k, v in item.items() if v != "" or k in KEEP_EMPTY})
            except BadRequest as exc:
                results[i] = item_error(i, exc)
            else:
                accepted.append(wire.send_request(data))
                positions.append(i)
        sent = await send_messages(rt, requests=accepted) if accepted else []
        for i, outcome in zip(positions, sent):
            if isinstance(outcome, Exception):
                results[i] = item_error(i, outcome)
            else:
                results[i] = {"code": 200, "msg": "success", "delayMsg": wire.message(outcome)}
        return reply(results=results)


def item_error(index: int, exc: Exception) -> dict:
    """A batch item's error answer: worded as a single send's, prefixed with its position."""
    body = error_body(exc, "sendMsgBatch")
    body["msg"] = f"message {index}: {body['msg']}"
    return body


@queue_endpoint(
    "Pull ready messages",
    "Hands out up to `batch` messages of the topic that are due, oldest first, and answers at once; the "
    "list is empty when none is ready. Each message handed out is consuming (status 3) until it is acked "
    "with ackMsg; if it is not acked within ackTimeoutMillis it is delivered again (while retries last). "
    "Under a consume rate at most as many messages as the rate has tokens left are handed out, and none at "
    "all answers code 429 with retryAfterMillis.",
    answer("PullMsgAnswer", DelayMsgListResultSerializer), PullMsgSerializer,
    example={"topic": "orders", "batch": 10, "ackTimeoutMillis": 30000})
class PullMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(PullMsgSerializer)
        pulled = await pull_messages(self.rt, topic=data["topic"], batch=data["batch"],
                                     ack_timeout_millis=data["ackTimeoutMillis"])
        return reply(delayMsgList=wire.messages(pulled.messages))


@queue_endpoint(
    "Pull, waiting for a ready message",
    "As pullMsg, but when no message is ready the request is held until one becomes ready or "
    "longPollingTimeoutMillis pass; the list is empty if the time ran out. Over a consume rate the request "
    "is held until the rate lets a message through, not refused.",
    answer("LongPollingMsgAnswer", DelayMsgListResultSerializer), LongPollingMsgSerializer,
    example={"topic": "orders", "batch": 10, "ackTimeoutMillis": 30000, "longPollingTimeoutMillis": 10000})
class LongPollingMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(LongPollingMsgSerializer)
        messages = await long_poll_messages(
            self.rt, topic=data["topic"], batch=data["batch"], ack_timeout_millis=data["ackTimeoutMillis"],
            timeout_millis=data["longPollingTimeoutMillis"]
        )
        return reply(delayMsgList=wire.messages(messages))


@queue_endpoint(
    "Acknowledge a pulled message",
    "ack=true (the default) marks a pulled message as consumed (status 4): it is not delivered again. "
    "ack=false gives it back: for immediate redelivery, or with delayMillis after that delay (it waits, status 1, "
    "its retry count kept), or with deadLetter=true it ends now as a dead letter (status 6). `done` says whether "
    "the message was being consumed and so was acked (or given back, or dead-lettered) by this call.",
    answer("AckMsgAnswer", AckResultSerializer), AckMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "ack": True})
class AckMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(AckMsgSerializer)
        if data["ack"]:
            outcome = await ack_message(self.rt, topic=data["topic"], msg_id=data["msgId"])
        else:
            outcome = await nack_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                                  delay_millis=data["delayMillis"], dead_letter=data["deadLetter"])
        return reply(done=outcome.done)


@queue_endpoint(
    "Acknowledge many pulled messages",
    "ackMsg for each msgId of a JSON list (1 to DELAYQUEUE_MAX_BATCH_SEND), all with the same ack, delayMillis and "
    "deadLetter, in one Redis round trip. `results` has one {msgId, done} per msgId, in request order.",
    answer("AckMsgBatchAnswer", AckBatchResultSerializer), body=AckMsgBatchSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel", "order-43-cancel"], "ack": True})
class AckMsgBatchView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(AckMsgBatchSerializer)
        msg_ids = data["msgIds"]
        done = await ack_messages(self.rt, topic=data["topic"], msg_ids=msg_ids, ack=data["ack"],
                                           delay_millis=data["delayMillis"], dead_letter=data["deadLetter"])
        return reply(results=[{"msgId": msg_id, "done": each} for msg_id, each in zip(msg_ids, done)])


@queue_endpoint(
    "Extend a pulled message's ack deadline",
    "A message being consumed (status 3) gets the ack deadline now + ackTimeoutMillis (Redis' clock), answered as "
    "ackDeadline. Code 409 when the message is not being consumed, 404 when the topic has no such message.",
    answer("TouchMsgAnswer", TouchResultSerializer), TouchMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "ackTimeoutMillis": 60000})
class TouchMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(TouchMsgSerializer)
        deadline = await touch_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                                ack_timeout_millis=data["ackTimeoutMillis"])
        return reply(ackDeadline=deadline)


@queue_endpoint(
    "Change when a message falls due",
    "A waiting or ready message gets a new triggerTime: delayMillis from now, or triggerTime (epoch ms); exactly "
    "one of them. One not in the future makes it ready now (run now). Its expireTime moves by as much as its "
    "triggerTime, so its TTL counts from the new trigger time. Answers the updated message. Code 409 when it is "
    "being consumed, 404 when the topic has no such message or it has ended.",
    answer("RescheduleMsgAnswer", DelayMsgResultSerializer), RescheduleMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "delayMillis": 600000})
class RescheduleMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RescheduleMsgSerializer)
        trigger, delay = data["triggerTime"], data["delayMillis"]
        message = await reschedule_message(
            self.rt, topic=data["topic"], msg_id=data["msgId"], trigger_time=-1 if trigger is None else trigger,
            delay_millis=0 if delay is None else delay)
        return reply(delayMsg=wire.message(message))


@queue_endpoint(
    "Read one message",
    "Answers the message with its current status, without changing it. Ended messages (acked, expired, "
    "deleted) stay readable for a while. Code 404 when the topic has no such message.",
    answer("GetMsgAnswer", DelayMsgResultSerializer), MessageRefSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel"})
class GetMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(MessageRefSerializer)
        message = await get_message(self.rt, topic=data["topic"], msg_id=data["msgId"])
        if message is None:
            raise NotFound(f"message {data['msgId']} not found in topic {data['topic']}")
        return reply(delayMsg=wire.message(message))


@queue_endpoint(
    "Delete a message",
    "Ends a message that is waiting, ready or being consumed (status 7): it is not delivered any more. "
    "Code 200 when deleted, 404 when the topic has no such message or it had already ended.",
    answer("DeleteMsgAnswer", ResultSerializer), DeleteMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "release": False})
class DeleteMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(DeleteMsgSerializer)
        if not await delete_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                             release=data["release"]):
            raise NotFound(f"message {data['msgId']} not found or already ended in topic {data['topic']}")
        return reply()


@queue_endpoint(
    "Request counters and delivery delays",
    "Per topic, the number of requests of each kind and of messages becoming ready, ending or timing out, "
    "and the average and longest delays (ms) between a message's trigger time and its pull or its move to "
    "the ready queue, over the last complete monitor interval (DELAYQUEUE_MONITOR_INTERVAL_SECONDS), "
    "summed over all server processes. Empty lists before the first interval completes.",
    answer("GetMonitorDataAnswer", MonitorDataResultSerializer), method="GET")
class GetMonitorDataView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        return reply(data=wire.monitor_data(await monitor_data(self.rt)))


@queue_endpoint(
    "Queue sizes of a topic",
    "How many of the topic's messages are waiting (and how far off they are, in nine buckets), ready, "
    "and pulled but not yet acked. A topic never used answers zeros.",
    answer("GetTopicInfoAnswer", TopicInfoResultSerializer), TopicSerializer, method="GET")
class GetTopicInfoView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        data = self.validated(TopicSerializer)
        return reply(data=wire.topic_info(await topic_info(self.rt, topic=data["topic"])))


@queue_endpoint(
    "Queue sizes of every topic",
    "getTopicInfo for every topic in use, in the order topics were first used.",
    answer("GetTopicInfoListAnswer", TopicInfoListResultSerializer), method="GET")
class GetTopicInfoListView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        rt = self.rt
        return reply(data=[wire.topic_info(info) for info in await topic_infos(rt, topics=await list_topics(rt))])


@queue_endpoint(
    "Restore messages from the message log",
    "Puts back into Redis the messages the message log says are live (after Redis lost data), for every "
    "topic or only `topic`; expire=true also brings back messages whose TTL ran out before delivery. Safe "
    "to repeat: messages Redis still holds are counted in alreadyLive and left alone. Code 404 when "
    "`topic` has no messages in the log.",
    answer("RestoreAnswer", RestoreResultSerializer), RestoreSerializer,
    example={"topic": "orders", "expire": False})
class RestoreView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RestoreSerializer)
        rt = self.rt
        topic = data.get("topic")
        counts = await restore(rt, topic=topic, include_expired=data["expire"])
        if topic is not None and not counts.seen:
            raise NotFound(f"topic {topic} has no messages in the message log")
        return reply(**wire.restore_counts(counts))


@queue_endpoint(
    "Restore one message from the message log",
    "As restore, for one message. Code 404 when the message log does not have it.",
    answer("RestoreMsgAnswer", RestoreResultSerializer), RestoreMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "expire": False})
class RestoreMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RestoreMsgSerializer)
        rt = self.rt
        topic, msg_id = data["topic"], data["msgId"]
        counts = await restore(rt, topic=topic, msg_id=msg_id, include_expired=data["expire"])
        if not counts.seen:
            raise NotFound(f"message {msg_id} not found in the message log of topic {topic}")
        return reply(**wire.restore_counts(counts))


# setTopicConfig's parameters that are limits (set_limits' keywords); the others are TopicConfig fields.
TOPIC_LIMITS = ("produceRatePerSecond", "consumeRatePerSecond", "maxLiveMessages")


def topic_setting(name: str, value):
    """A setTopicConfig value as TopicConfig stores it: None (the default) for "use the default"."""
    if name == "maxRetry":
        return value if value >= 0 else None
    if name in ("ttlMillis", "ackTimeoutMillis", "retryBackoffMaxMillis"):
        return value if value > 0 else None
    return value


@queue_endpoint(
    "A topic's settings",
    "Every setting of the topic in force: the defaults of its sends and pulls (its own, else the server's), "
    "its retry backoff, dead letters on or off, whether it is paused, and its rate limits and live-message cap "
    "(0: none).",
    answer("GetTopicConfigAnswer", TopicConfigResultSerializer), TopicSerializer, method="GET")
class GetTopicConfigView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        data = self.validated(TopicSerializer)
        return reply(data=wire.topic_config(await topic_config(self.rt, topic=data["topic"])))


@queue_endpoint(
    "Change a topic's settings",
    "Sets the settings given; the others stay as they are. Defaults for the topic's sends and pulls that give "
    "none (ttlMillis, maxRetry, ackTimeoutMillis; 0, or below 0 for maxRetry: back to the server's), the retry "
    "backoff after an ack timeout (min(retryBackoffMaxMillis, retryBackoffMillis * 2^(retry-1)), less up to "
    "20% at random), deadLetter (false: the topic's status-6 messages, earlier ones included, are not dead "
    "letters while it stays false), the topic's limits (0: none), and push delivery (pushUrl and its "
    "settings, docs/push.md). In force on every server process within a second. Answers the topic's settings, as "
    "getTopicConfig, with pushSecret when this call made a signing secret.",
    answer("SetTopicConfigAnswer", SetTopicConfigResultSerializer), SetTopicConfigSerializer,
    example={"topic": "orders", "maxRetry": 5, "retryBackoffMillis": 1000, "retryBackoffMaxMillis": 60000})
class SetTopicConfigView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(SetTopicConfigSerializer)
        topic = data["topic"]
        secret = await set_topic_config(
            self.rt, topic=topic,
            changes={field: topic_setting(name, data[name]) for name, field in wire.TOPIC_CONFIG_NAMES.items()
                     if name in data and name not in TOPIC_LIMITS},
            limits={wire.TOPIC_CONFIG_NAMES[name]: data[name] for name in TOPIC_LIMITS if name in data},
            rotate_push_secret=data.get("rotatePushSecret", False))
        answered = wire.topic_config(await topic_config(self.rt, topic=topic))
        return reply(data=answered if secret is None else {**answered, "pushSecret": secret})


@queue_endpoint(
    "Pause a topic",
    "Until resumeTopic, pulls of the topic answer an empty list and long polls are held (until resumed or "
    "their timeout); its messages still fall due and sends still go in.",
    answer("PauseTopicAnswer", ResultSerializer), TopicSerializer, example={"topic": "orders"})
class PauseTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await pause_topic(self.rt, topic=self.validated(TopicSerializer)["topic"])
        return reply()


@queue_endpoint(
    "Resume a paused topic",
    "Pulls hand out the topic's messages again; held long polls are woken.",
    answer("ResumeTopicAnswer", ResultSerializer), TopicSerializer, example={"topic": "orders"})
class ResumeTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await resume_topic(self.rt, topic=self.validated(TopicSerializer)["topic"])
        return reply()


@queue_endpoint(
    "Delete every live message of a topic",
    "Every waiting, ready or consuming message of the topic ends as deleted (status 7, history reason purged), "
    "in bounded batches. Answers how many.",
    answer("PurgeTopicAnswer", PurgeResultSerializer), TopicSerializer, example={"topic": "orders"})
class PurgeTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        return reply(count=await purge_topic(self.rt, topic=self.validated(TopicSerializer)["topic"]))


@queue_endpoint(
    "List a topic's dead letters",
    "Messages of the topic that ended as dead letters (status 6: their deliveries or TTL ran out after a "
    "delivery, or their consumer dead-lettered them), kept in the message log for "
    "DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS (default 14), oldest death first, `limit` per page. Only while the "
    "topic's deadLetter setting (setTopicConfig) is true: with it false the list is empty. Each carries "
    "deadReason and deadTime. Pass the answer's nextCursor as `cursor` for the next page; the last page has none.",
    answer("GetDeadMsgListAnswer", DeadMsgListResultSerializer), DeadMsgListSerializer, method="GET",
    example={"topic": "orders", "limit": 100})
class GetDeadMsgListView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        data = self.validated(DeadMsgListSerializer)
        page, next_cursor = await dead_letters(self.rt, topic=data["topic"], limit=data["limit"],
                                                           cursor=data.get("cursor"))
        return reply(delayMsgList=[wire.dead_letter(dead) for dead in page],
                     **({"nextCursor": next_cursor} if next_cursor else {}))


@queue_endpoint(
    "Send dead letters back",
    "Starts a redrive of the topic's dead letters (only those in msgIds, a JSON list in a JSON body, when "
    "given): each goes back as a new life under its msgId, ready at once with retry 0, at most maxPerSecond "
    "a second. The scanners run it, and a scanner that stops halfway leaves it to another. Answers taskId "
    "(see getRedriveTask); code 404 when there is no such dead letter. Rate and live-message limits do not "
    "apply: maxPerSecond paces it.",
    answer("RedriveDeadMsgAnswer", TaskIdResultSerializer), body=RedriveDeadMsgSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel"], "maxPerSecond": 500})
class RedriveDeadMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated_fully(RedriveDeadMsgSerializer)
        topic = data["topic"]
        task_id = await create_redrive(self.rt, topic=topic, msg_ids=data.get("msgIds"),
                                                   max_per_second=data["maxPerSecond"])
        if task_id is None:
            raise NotFound(f"topic {topic} has no such dead letter" if "msgIds" in data
                           else f"topic {topic} has no dead letters")
        return reply(taskId=task_id)


@queue_endpoint(
    "Progress of a redrive",
    "How many dead letters a redrive has sent back (moved), how many it has still to send (left), and its "
    "state: running or done. Code 404 for an unknown taskId.",
    answer("GetRedriveTaskAnswer", RedriveTaskResultSerializer), RedriveTaskSerializer, method="GET",
    example={"taskId": 1})
class GetRedriveTaskView(QueueAPIView):
    needs_scope = Scope.MANAGE
    marks_use = False

    async def handle(self):
        task_id = self.validated(RedriveTaskSerializer)["taskId"]
        state = await redrive_state(self.rt, task_id=task_id)
        if state is None:
            raise NotFound(f"redrive task {task_id} not found")
        return reply(**wire.redrive_progress(state))


@queue_endpoint(
    "Remove dead letters",
    "Removes the topic's dead letters (only those in msgIds, a JSON list in a JSON body, when given) and "
    "their history from the message log. Answers count, the number removed.",
    answer("PurgeDeadMsgAnswer", CountResultSerializer), body=PurgeDeadMsgSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel"]})
class PurgeDeadMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated_fully(PurgeDeadMsgSerializer)
        return reply(count=await purge_dead_letters(self.rt, topic=data["topic"],
                                                                msg_ids=data.get("msgIds")))


def health_reply(code: int) -> HttpResponse:
    """camellia's health answers: {"code": N} with the same HTTP status, for load balancers."""
    return HttpResponse(orjson.dumps({"code": code}), status=code,
                        content_type="application/json")


class HealthView(QueueAPIView):
    marks_use = False
    host_wide = True

    def handle_exception(self, exc):
        code, _msg = error_answer(self.queue_error(exc), type(self).__name__)
        return health_reply(code)


@health_endpoint("Is this host online",
                 "Answers 200 while this host reports itself online, 500 after /camellia/health/offline "
                 "(until /camellia/health/online).", failing="offline, or the check failed")
class HealthStatusView(HealthView):
    async def handle(self):
        return health_reply(200 if await health.is_online(self.rt) else 500)


@health_endpoint("Is the process serving", "Answers 200 whenever the process serves requests.",
                 failing="the check failed")
class HealthCheckView(HealthView):
    async def handle(self):
        return health_reply(200)


@health_endpoint("Report this host online", "Makes /camellia/health/status answer 200 again.",
                 failing="the change failed", refusable=True)
class HealthOnlineView(HealthView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await health.set_online(self.rt, True)
        return health_reply(200)


@health_endpoint("Report this host offline (to drain it)",
                 "Makes /camellia/health/status answer 500 so load balancers stop sending traffic. Answers "
                 "200 once no worker of this host has served a queue request for 20 s, else 500: call it "
                 "again until it answers 200.",
                 failing="still serving queue requests", refusable=True)
class HealthOfflineView(HealthView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        rt = self.rt
        await health.set_online(rt, False)
        return health_reply(200 if await health.idle(rt) else 500)
