"""OpenAPI descriptions of the API (drf-spectacular). Requests are described by the serializers
that validate them (validation.py); these document what comes back, and how each endpoint is
listed: one operation per endpoint, the method camellia's SDK uses."""
from django.conf import settings
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers

from delayqueue.api.wire import GAP_LISTS, WAITING_BUCKET_NAMES
from delayqueue.core.constants import MAX_PRIORITY
from delayqueue.live.stats import Counter

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
BATCH_PATH = "/camellia/delayQueue/sendMsgBatch"


class DelayMsgSerializer(serializers.Serializer):
    topic = serializers.CharField()
    msgId = serializers.CharField()
    msg = serializers.CharField(help_text="the payload, as sent")
    produceTime = serializers.IntegerField(help_text="server time the message was accepted (epoch ms)")
    triggerTime = serializers.IntegerField(help_text="produceTime + delayMillis: when it can be pulled (epoch ms)")
    expireTime = serializers.IntegerField(help_text="triggerTime + ttlMillis (epoch ms)")
    maxRetry = serializers.IntegerField(help_text="deliveries allowed after the first")
    retry = serializers.IntegerField(help_text="deliveries so far")
    status = serializers.IntegerField(
        help_text="1 waiting, 2 ready, 3 consuming, 4 acked, 5 expired undelivered, 6 retries/TTL exhausted, 7 deleted"
    )
    priority = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_PRIORITY,
        help_text="the priority it was sent with, only when above 0 (absent: 0); higher is pulled first")


class SentMsgSerializer(DelayMsgSerializer):
    msg = serializers.CharField(
        required=False, help_text="the payload; absent when a message sent earlier holds the msgId (see sendMsg) "
                                  "with another body, which the caller's token, lacking the consume scope, may not read")


class ErrorSerializer(serializers.Serializer):
    """Every refusal or failure: `code` and `msg`, and `retryAfterMillis` when over a limit (429)."""

    code = serializers.IntegerField(
        min_value=400, max_value=599,
        help_text="400 bad parameter, 401 not authenticated, 403 not allowed, 404 not found, 429 too many "
                  "requests, 500 server error (e.g. Redis or the message log unavailable)")
    msg = serializers.CharField(help_text="what went wrong; for a bad parameter it starts with the parameter's "
                                          "name, e.g. `delayMillis: A valid integer is required.`")
    retryAfterMillis = serializers.IntegerField(
        required=False, min_value=1,
        help_text="code 429 only: ms until the rate limit the call ran into lets one through again (for a "
                  "live-message cap, a hint: messages leave as they are acked, deleted or expire)")


class ResultSerializer(serializers.Serializer):
    code = serializers.IntegerField(min_value=200, max_value=200, help_text="200: done")
    msg = serializers.CharField(help_text='"success"')


class DelayMsgResultSerializer(ResultSerializer):
    delayMsg = DelayMsgSerializer()


class SentMsgResultSerializer(ResultSerializer):
    delayMsg = SentMsgSerializer()


class DelayMsgListResultSerializer(ResultSerializer):
    delayMsgList = DelayMsgSerializer(many=True, help_text="possibly empty")


def answer(name: str, success, description: str = "") -> OpenApiResponse:
    """Every queue answer is HTTP 200 and either the success shape (code 200) or an error (code 4xx/5xx)."""
    return OpenApiResponse(
        PolymorphicProxySerializer(component_name=name, serializers=[success, ErrorSerializer],
                                   resource_type_field_name=None, many=False),
        description=description or "code 200 with the result, or an error's code and msg",
    )


class BatchResultSerializer(ResultSerializer):
    results = PolymorphicProxySerializer(
        component_name="SendMsgBatchItemAnswer", serializers=[SentMsgResultSerializer, ErrorSerializer],
        resource_type_field_name=None, many=True,
        help_text="one result per message, in request order: the sent message, or why it was not sent")


# Built from the same names the answers are rendered with (api/wire.py), so the schema cannot drift from them.
RequestStatsSerializer = type("RequestStatsSerializer", (serializers.Serializer,), {
    "topic": serializers.CharField(), **{counter.value: serializers.IntegerField() for counter in Counter},
})


class GapStatsSerializer(serializers.Serializer):
    topic = serializers.CharField()
    count = serializers.IntegerField()
    avg = serializers.FloatField(help_text="ms")
    max = serializers.IntegerField(help_text="ms")


MonitorDataSerializer = type("MonitorDataSerializer", (serializers.Serializer,), {
    "requestStatsList": RequestStatsSerializer(many=True),
    **{list_name: GapStatsSerializer(many=True) for list_name in GAP_LISTS.values()},
})


class MonitorDataResultSerializer(ResultSerializer):
    data = MonitorDataSerializer(help_text="the last complete monitor interval, summed over all processes")


WaitingQueueInfoSerializer = type("WaitingQueueInfoSerializer", (serializers.Serializer,), {
    name: serializers.IntegerField() for name in WAITING_BUCKET_NAMES
})


class TopicInfoSerializer(serializers.Serializer):
    topic = serializers.CharField()
    waitingQueueSize = serializers.IntegerField(help_text="messages not yet due (hotWaitingSize + coldWaitingSize)")
    waitingQueueInfo = WaitingQueueInfoSerializer(
        help_text="waiting messages by how long until they are due (those in the message log only, the cold tier's, "
                  "by the hour they fall due in)")
    hotWaitingSize = serializers.IntegerField(help_text="waiting messages in Redis")
    coldWaitingSize = serializers.IntegerField(
        help_text="waiting messages in the message log only, due after the hot window (DELAYQUEUE_HOT_WINDOW_MILLIS)")
    readyQueueSize = serializers.IntegerField(help_text="due messages not yet pulled")
    ackQueueSize = serializers.IntegerField(help_text="pulled messages not yet acked")


class TopicInfoResultSerializer(ResultSerializer):
    data = TopicInfoSerializer()


class TopicInfoListResultSerializer(ResultSerializer):
    data = TopicInfoSerializer(many=True)


class DeadMsgSerializer(DelayMsgSerializer):
    deadReason = serializers.CharField(
        help_text="why it died: retries_exhausted, expired (its TTL ran out: status 5 if it was never delivered, "
                  "6 after a delivery) or dead_lettered (by its consumer)")
    deadDetail = serializers.CharField(
        allow_blank=True, help_text="the reason its consumer gave on the nack that ended it (ackMsg's `reason`), "
                                    "or on a push topic the status or error of the failed attempt that did; empty "
                                    "when none")
    deadTime = serializers.IntegerField(help_text="when it died (epoch ms)")


class DeadMsgListResultSerializer(ResultSerializer):
    delayMsgList = DeadMsgSerializer(many=True, help_text="oldest death first; possibly empty")
    nextCursor = serializers.CharField(required=False,
                                       help_text="pass as `cursor` for the next page; absent on the last page")


class CountResultSerializer(ResultSerializer):
    count = serializers.IntegerField(help_text="messages removed")


class TaskIdResultSerializer(ResultSerializer):
    taskId = serializers.IntegerField(help_text="the redrive task, for getRedriveTask")


class RedriveTaskResultSerializer(ResultSerializer):
    moved = serializers.IntegerField(help_text="dead letters sent back so far")
    left = serializers.IntegerField(help_text="dead letters still to send (0 when done)")
    state = serializers.ChoiceField(choices=["running", "done"])


class RestoreResultSerializer(ResultSerializer):
    restored = serializers.IntegerField(help_text="messages put back into Redis")
    alreadyLive = serializers.IntegerField(help_text="Redis already held the msgId")
    skipped = serializers.IntegerField(help_text="ended, or past its TTL without expire=true")
    leftCold = serializers.IntegerField(help_text="waiting beyond the hot window: left in the message log for the "
                                                  "loader (the cold tier; 0 without it)")


class TopicConfigSerializer(serializers.Serializer):
    topic = serializers.CharField()
    ttlMillis = serializers.IntegerField(help_text="default TTL of the topic's sends (its own, else the server's)")
    maxRetry = serializers.IntegerField(help_text="default maxRetry of the topic's sends")
    ackTimeoutMillis = serializers.IntegerField(help_text="default ack timeout of the topic's pulls")
    retryBackoffMillis = serializers.IntegerField(help_text="first backoff wait after an ack timeout; 0: none")
    retryBackoffMaxMillis = serializers.IntegerField(help_text="longest backoff wait")
    deadLetter = serializers.BooleanField(help_text="messages ending as 5 or 6 are kept as dead letters (false: "
                                                    "its status-5 and 6 messages are not dead letters, see "
                                                    "setTopicConfig)")
    paused = serializers.BooleanField(help_text="pulls hand out nothing (pauseTopic)")
    produceRatePerSecond = serializers.IntegerField(help_text="0: no limit")
    consumeRatePerSecond = serializers.IntegerField(help_text="0: no limit")
    maxLiveMessages = serializers.IntegerField(help_text="0: no cap")
    pushUrl = serializers.CharField(help_text="where due messages are POSTed; empty: consumers pull them")
    pushConcurrency = serializers.IntegerField(help_text="most pushes in flight at once")
    pushTimeoutMillis = serializers.IntegerField(help_text="a push attempt's time limit")
    pushRatePerSecond = serializers.IntegerField(help_text="most pushes started a second; 0: no limit")
    pushSecretRotating = serializers.BooleanField(help_text="a rotated-out secret still signs (its grace period)")
    shards = serializers.IntegerField(help_text="Redis key sets the topic's new messages spread over")
    drainingShards = serializers.ListField(child=serializers.IntegerField(), help_text="shard counts the topic had "
                                           "whose shards may still hold messages, read until they are empty")


class TopicConfigResultSerializer(ResultSerializer):
    data = TopicConfigSerializer()


class SetTopicConfigDataSerializer(TopicConfigSerializer):
    pushSecret = serializers.CharField(required=False, help_text="the new signing secret, answered this once: when "
                                       "a first pushUrl was set, or rotatePushSecret")


class SetTopicConfigResultSerializer(ResultSerializer):
    data = SetTopicConfigDataSerializer()


class PurgeResultSerializer(ResultSerializer):
    count = serializers.IntegerField(help_text="live messages ended as deleted")


class AckResultSerializer(ResultSerializer):
    done = serializers.BooleanField(help_text="true: the message was being consumed and this call acked it (or gave "
                                              "it back, or dead-lettered it); false: it was not (unknown, already "
                                              "ended, or given back by its ack timeout)")


class AckBatchItemSerializer(serializers.Serializer):
    msgId = serializers.CharField()
    done = serializers.BooleanField(help_text="as ackMsg's done")


class AckBatchResultSerializer(ResultSerializer):
    results = AckBatchItemSerializer(many=True, help_text="one per msgId, in request order")


class TouchResultSerializer(ResultSerializer):
    ackDeadline = serializers.IntegerField(help_text="the new ack deadline (epoch ms, Redis' clock)")


def _fixed_code(code: int):
    return type(f"Health{code}Serializer", (serializers.Serializer,), {
        "code": serializers.IntegerField(min_value=code, max_value=code, help_text=f"{code}, as the HTTP status"),
    })


HEALTH_OK, HEALTH_FAILED = _fixed_code(200), _fixed_code(500)

OTHER_METHOD = {"POST": "GET", "GET": "POST"}
HOW_PARAMETERS_COME = {
    "POST": "Parameters come as form fields (as camellia's SDK sends them) or a JSON object; they may also "
            "come in the query string, and GET is accepted too. Empty optional parameters count as absent.",
    "GET": "Parameters come in the query string; POST with form fields or a JSON object is accepted too.",
}


def queue_endpoint(summary: str, description: str, response, params=None, *, method: str = "POST",
                   body=None, example=None, tag: str = "delayQueue"):
    """Documents a queue view as one operation (`method`) and hides the other method the view also
    serves. Applied to the class, so no view method is wrapped (a wrapped method would be sync).
    `example`: a typical request's parameters (or body)."""
    request = {JSON: body} if body is not None else {FORM: params, JSON: params} if params else None
    described = extend_schema(
        examples=[OpenApiExample("a typical request", value=example, request_only=True)] if example is not None else None,
        methods=[method], summary=summary, tags=[tag],
        description=f"{description}\n\n{HOW_PARAMETERS_COME[method]}" if params else description,
        parameters=[params] if params and method == "GET" else None,
        request=request if method == "POST" else None,
        responses={200: response},
    )
    hidden = extend_schema(methods=[OTHER_METHOD[method]], exclude=True)
    return lambda view: hidden(described(view))


def health_endpoint(summary: str, description: str, failing: str, refusable: bool = False):
    """camellia's health endpoints, for load balancers: the answer's code is also its HTTP status.
    `refusable`: the browser-safe edge checks it (delayqueue/api/edge.py), so it may be refused."""
    responses = {200: OpenApiResponse(HEALTH_OK, description='HTTP 200, {"code":200}'),
                 500: OpenApiResponse(HEALTH_FAILED, description=f'HTTP 500, {{"code":500}}: {failing}')}
    if refusable:
        responses[400] = OpenApiResponse(ErrorSerializer, description="HTTP 400, code and msg: Host not in ALLOWED_HOSTS")
        responses[403] = OpenApiResponse(ErrorSerializer, description="HTTP 403, code and msg: a cross-site browser "
                                                                      "request (see DELAYQUEUE_ALLOWED_ORIGINS)")
    described = extend_schema(
        methods=["GET"], summary=summary, description=f"{description} POST is accepted too.",
        tags=["health"], request=None, responses=responses,
    )
    hidden = extend_schema(methods=["POST"], exclude=True)
    return lambda view: hidden(described(view))


def settings_limits(result, generator, request, public):
    """Limits the operator sets (DELAYQUEUE_*) go into the schema when it is generated, as the
    server reads them per request; the serializers cannot state them at import. Answers are
    closed objects: an answer carries exactly the fields listed (an error: code, msg, retryAfterMillis)."""
    limits = settings.DELAYQUEUE
    schemas = result["components"]["schemas"]
    for name, component in schemas.items():
        if "properties" in component and not name.endswith("Request"):
            component["additionalProperties"] = False
    schemas["SendMsgRequest"]["properties"]["msg"]["maxLength"] = limits["MAX_MSG_BYTES"]  # bytes >= characters
    for name in ("PullMsgRequest", "LongPollingMsgRequest"):
        schemas[name]["properties"]["batch"]["maximum"] = limits["MAX_PULL_BATCH"]
    batch = result["paths"][BATCH_PATH]["post"]["requestBody"]["content"][JSON]["schema"]
    batch.update(minItems=1, maxItems=limits["MAX_BATCH_SEND"])
    schemas["AckMsgBatchRequest"]["properties"]["msgIds"].update(minItems=1, maxItems=limits["MAX_BATCH_SEND"])
    return result


# Rules between parameters that the serializers' validate() enforce, stated for the schema.
ONE_OF_DELAY_OR_TRIGGER = [{"required": ["delayMillis"]}, {"required": ["triggerTime"]}]
ACK_CHOICES = [
    # ack=false: given back, at once or after delayMillis
    {"required": ["ack"], "properties": {"ack": {"enum": [False]}, "deadLetter": {"enum": [False]}}},
    # ack=false with deadLetter=true: no delayMillis
    {"required": ["ack", "deadLetter"], "properties": {"ack": {"enum": [False]}, "deadLetter": {"enum": [True]}},
     "not": {"required": ["delayMillis"]}},
    # ack=true (the default): no delayMillis, no reason
    {"properties": {"ack": {"enum": [True]}, "deadLetter": {"enum": [False]}},
     "not": {"anyOf": [{"required": ["delayMillis"]}, {"required": ["reason"]}]}},
]


def parameter_rules(result, generator, request, public):
    """The rules between parameters (exactly one of delayMillis and triggerTime; what goes with
    ack=false), which no single field states."""
    schemas = result["components"]["schemas"]
    for name in ("SendMsgRequest", "RescheduleMsgRequest"):
        schemas[name]["oneOf"] = ONE_OF_DELAY_OR_TRIGGER
    for name in ("AckMsgRequest", "AckMsgBatchRequest"):
        schemas[name]["anyOf"] = ACK_CHOICES
    return result


def token_security(result, generator, request, public):
    """The API token each endpoint needs (DELAYQUEUE_AUTH=tokens): the bearer scheme, and per
    operation the scope its view declares (health status and check need none; online and offline
    the host operator's credential)."""
    from django.urls import resolve

    result["components"]["securitySchemes"] = {"apiToken": {
        "type": "http", "scheme": "bearer",
        "description": "An API token (manage.py create_token), as `Authorization: Bearer <token>` or as the path "
                       "prefix `/t/<token>/camellia/...`. Not needed when the server runs with DELAYQUEUE_AUTH=open.",
    }}
    for path, operations in result["paths"].items():
        view_class = resolve(path).func.view_class
        scope = getattr(view_class, "needs_scope", None)
        for operation in operations.values():
            if getattr(view_class, "host_operator", False):
                operation["security"] = [{"apiToken": []}]
                operation["description"] += ("\n\nNeeds the host token (DELAYQUEUE_HOST_TOKEN); when none is set, a "
                                             "token with the `manage` scope of the host's own namespace "
                                             "(DELAYQUEUE_NAMESPACE).")
            elif scope is None:
                operation["security"] = []
            else:
                operation["security"] = [{"apiToken": []}]
                scopes = " or ".join(f"`{name}`" for name in (scope if isinstance(scope, tuple) else (scope,)))
                operation["description"] += f"\n\nNeeds an API token with the {scopes} scope."
    return result


class ScheduleSerializer(serializers.Serializer):
    scheduleId = serializers.CharField()
    topic = serializers.CharField()
    msg = serializers.CharField(help_text="each tick's message body")
    cron = serializers.CharField(allow_null=True, help_text="null for an interval schedule")
    timezone = serializers.CharField(allow_null=True, help_text="the cron's time zone; null for an interval schedule")
    everyMillis = serializers.IntegerField(allow_null=True, help_text="null for a cron schedule")
    startTime = serializers.IntegerField(allow_null=True, help_text="epoch ms: an interval schedule's first tick, "
                                                                    "a cron schedule's earliest; null: none")
    endTime = serializers.IntegerField(allow_null=True, help_text="epoch ms: no tick after it; null: none")
    catchUp = serializers.CharField(help_text="latest, all or skip")
    priority = serializers.IntegerField()
    ttlMillis = serializers.IntegerField(help_text="0: the topic's default")
    maxRetry = serializers.IntegerField(help_text="-1: the topic's default")
    paused = serializers.BooleanField()
    nextFireTimes = serializers.ListField(child=serializers.IntegerField(),
                                          help_text="the next five ticks (epoch ms); empty while paused or ended, "
                                                    "or while its rule cannot be read (a time zone the server lacks)")
    createTime = serializers.IntegerField()
    updateTime = serializers.IntegerField()


class ScheduleResultSerializer(ResultSerializer):
    schedule = ScheduleSerializer()


class ScheduleListResultSerializer(ResultSerializer):
    schedules = ScheduleSerializer(many=True, help_text="in scheduleId order; possibly empty")
    nextCursor = serializers.CharField(required=False,
                                       help_text="pass as `cursor` for the next page; absent on the last page")
