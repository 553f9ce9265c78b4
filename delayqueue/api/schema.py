"""OpenAPI descriptions of the API's answers (drf-spectacular). Requests are described by the
serializers that validate them (serializers.py); these only document what comes back."""
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers

from delayqueue.selectors import GAP_STATS, REQUEST_COUNTERS, WAITING_BUCKETS

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"


class DelayMsgSerializer(serializers.Serializer):
    topic = serializers.CharField()
    msgId = serializers.CharField()
    msg = serializers.CharField()
    produceTime = serializers.IntegerField(help_text="server time the message was accepted (epoch ms)")
    triggerTime = serializers.IntegerField(help_text="produceTime + delayMillis (epoch ms)")
    expireTime = serializers.IntegerField(help_text="triggerTime + ttlMillis (epoch ms)")
    maxRetry = serializers.IntegerField()
    retry = serializers.IntegerField(help_text="deliveries so far")
    status = serializers.IntegerField(
        help_text="1 waiting, 2 ready, 3 consuming, 4 acked, 5 expired undelivered, 6 retries/TTL exhausted, 7 deleted"
    )


class ResultSerializer(serializers.Serializer):
    code = serializers.IntegerField(help_text="200 ok, 400 bad parameter, 404 not found, 500 server error")
    msg = serializers.CharField(help_text='"success", or what went wrong')


class DelayMsgResultSerializer(ResultSerializer):
    delayMsg = DelayMsgSerializer(allow_null=True)


class DelayMsgListResultSerializer(ResultSerializer):
    delayMsgList = DelayMsgSerializer(many=True)


class BatchResultSerializer(ResultSerializer):
    results = DelayMsgResultSerializer(many=True, help_text="one result per message, in request order")


# Built from the same name lists the selectors answer with, so the schema cannot drift from them.
RequestStatsSerializer = type("RequestStatsSerializer", (serializers.Serializer,), {
    "topic": serializers.CharField(), **{name: serializers.IntegerField() for name in REQUEST_COUNTERS},
})


class GapStatsSerializer(serializers.Serializer):
    topic = serializers.CharField()
    count = serializers.IntegerField()
    avg = serializers.FloatField(help_text="ms")
    max = serializers.IntegerField(help_text="ms")


MonitorDataSerializer = type("MonitorDataSerializer", (serializers.Serializer,), {
    "requestStatsList": RequestStatsSerializer(many=True),
    **{list_name: GapStatsSerializer(many=True) for _, list_name in GAP_STATS},
})


class MonitorDataResultSerializer(ResultSerializer):
    data = MonitorDataSerializer(help_text="the last complete monitor interval, summed over all processes")


WaitingQueueInfoSerializer = type("WaitingQueueInfoSerializer", (serializers.Serializer,), {
    name: serializers.IntegerField() for name, _ in WAITING_BUCKETS
})


class TopicInfoSerializer(serializers.Serializer):
    topic = serializers.CharField()
    waitingQueueSize = serializers.IntegerField()
    waitingQueueInfo = WaitingQueueInfoSerializer()
    readyQueueSize = serializers.IntegerField()
    ackQueueSize = serializers.IntegerField()


class TopicInfoResultSerializer(ResultSerializer):
    data = TopicInfoSerializer()


class TopicInfoListResultSerializer(ResultSerializer):
    data = TopicInfoSerializer(many=True)


class RestoreResultSerializer(ResultSerializer):
    restored = serializers.IntegerField()
    alreadyLive = serializers.IntegerField(help_text="Redis already held the msgId")
    skipped = serializers.IntegerField(help_text="ended, or past its TTL without expire=true")


class HealthSerializer(serializers.Serializer):
    code = serializers.IntegerField()


def _described(get, post):
    """extend_schema_view, keeping the view async: for methods a view inherits, spectacular
    stores the schema on a sync wrapper, which would make Django and DRF run the view as sync.
    So each view gets its own async get/post first (dispatch calls handle() for both anyway)."""

    def decorate(view):
        for name in ("get", "post"):
            if name not in view.__dict__:
                async def method(self, request, *args, **kwargs):
                    return await self.handle(request)

                method.__name__ = name
                setattr(view, name, method)
        return extend_schema_view(get=get, post=post)(view)

    return decorate


def queue_endpoint(summary: str, response, params=None, body=None, tag="delayQueue"):
    """GET takes the parameters in the query string; POST as form fields or a JSON object."""
    get = extend_schema(summary=summary, tags=[tag], parameters=[params] if params else None,
                        responses={200: response})
    post = extend_schema(summary=summary, tags=[tag],
                         request={FORM: body or params, JSON: body or params} if (body or params) else None,
                         responses={200: response})
    return _described(get, post)


def health_endpoint(summary: str, failing: str | None = None):
    responses = {200: OpenApiResponse(HealthSerializer, description='{"code":200}')}
    if failing:
        responses[500] = OpenApiResponse(HealthSerializer, description=failing)
    view = extend_schema(summary=summary, tags=["health"], request=None, responses=responses)
    return _described(view, view)
