"""Request parsing for the camellia-compatible API. Errors name the parameter."""
from django.conf import settings
from rest_framework import serializers

from .keys import NAME_PATTERN

# Upper bounds keep every time (ms) well inside what Redis' Lua numbers and JSON hold exactly.
MAX_DELAY_MILLIS = 10 * 365 * 86_400_000  # ten years
MAX_RETRY = 100_000


class TopicField(serializers.RegexField):
    def __init__(self, **kwargs):
        super().__init__(
            NAME_PATTERN,
            max_length=128,
            error_messages={"invalid": "must be 1-128 characters of A-Z a-z 0-9 . _ : -"},
            **kwargs,
        )


class MsgIdField(serializers.CharField):
    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", 256)
        super().__init__(**kwargs)


class TopicSerializer(serializers.Serializer):
    topic = TopicField()


class MessageRefSerializer(TopicSerializer):
    msgId = MsgIdField()


class SendMsgSerializer(TopicSerializer):
    msgId = MsgIdField(required=False, allow_blank=True)  # empty means "generate one"
    msg = serializers.CharField(trim_whitespace=False)
    delayMillis = serializers.IntegerField(min_value=-MAX_DELAY_MILLIS, max_value=MAX_DELAY_MILLIS)
    ttlMillis = serializers.IntegerField(required=False, default=-1, max_value=MAX_DELAY_MILLIS)
    maxRetry = serializers.IntegerField(required=False, default=-1, max_value=MAX_RETRY)

    def validate_msg(self, value: str) -> str:
        limit = settings.DELAYQUEUE["MAX_MSG_BYTES"]
        size = len(value.encode("utf-8"))
        if size > limit:
            raise serializers.ValidationError(f"is {size} bytes, over the limit of {limit} bytes")
        return value


class PullMsgSerializer(TopicSerializer):
    ackTimeoutMillis = serializers.IntegerField(required=False, default=-1, max_value=MAX_DELAY_MILLIS)
    batch = serializers.IntegerField(required=False, default=-1)

    def validate_batch(self, value: int) -> int:
        limit = settings.DELAYQUEUE["MAX_PULL_BATCH"]
        if value > limit:
            raise serializers.ValidationError(f"must be at most {limit}")
        return value


class LongPollingMsgSerializer(PullMsgSerializer):
    longPollingTimeoutMillis = serializers.IntegerField(required=False, default=-1, max_value=MAX_DELAY_MILLIS)


class AckMsgSerializer(MessageRefSerializer):
    ack = serializers.BooleanField(required=False, default=True)


class DeleteMsgSerializer(MessageRefSerializer):
    release = serializers.BooleanField(required=False, default=False)


class RestoreSerializer(serializers.Serializer):
    """Restore from the message log (seed 003's /restore?expire=true|false), optionally one topic."""

    topic = TopicField(required=False)
    expire = serializers.BooleanField(required=False, default=False)


class RestoreMsgSerializer(MessageRefSerializer):
    expire = serializers.BooleanField(required=False, default=False)


def first_error(errors) -> str:
    """DRF's error dict -> one readable line naming the parameter, e.g. 'delayMillis: A valid integer is required.'"""
    if isinstance(errors, dict):
        for field, problems in errors.items():
            text = first_error(problems)
            return text if field == "non_field_errors" else f"{field}: {text}"
    if isinstance(errors, list) and errors:
        return first_error(errors[0])
    return str(errors)
