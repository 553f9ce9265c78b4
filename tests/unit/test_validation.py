"""The serializers' fast path agrees with DRF: for every input it accepts, the same result; for
every input DRF refuses, it declines (so DRF words the error)."""
import random

import pytest
from rest_framework.exceptions import ValidationError

from delayqueue.api.validation import (AckMsgBatchSerializer, AckMsgSerializer, DeleteMsgSerializer, FastValidation,
                                       LongPollingMsgSerializer, MessageRefSerializer, PullMsgSerializer,
                                       RescheduleMsgSerializer, RestoreMsgSerializer, RestoreSerializer,
                                       SendMsgSerializer, TopicSerializer, TouchMsgSerializer)

SERIALIZERS = [AckMsgSerializer, DeleteMsgSerializer, LongPollingMsgSerializer, MessageRefSerializer,
               PullMsgSerializer, RestoreMsgSerializer, RestoreSerializer, SendMsgSerializer, TopicSerializer,
               AckMsgBatchSerializer, TouchMsgSerializer, RescheduleMsgSerializer]
MISSING = object()
CANDIDATES = [
    MISSING, None, "", " ", "orders", "a b", "x" * 128, "x" * 129, "x" * 300, "ünïcode", " padded ", "12", "-5",
    "0", "007", "12.0", " 12 ", "1e3", "9" * 30, 12, -1, 0, 600_000, -600_000, 10 ** 20, 315_360_000_001,
    True, False, "true", "TRUE", "tRuE", "no", "off", "1", "2", 1, 2, 1.5, [], {}, ["a"], "\x00a", "a\ud800",
    "y" * 70_000, "-", "a:b.c_d-e", "a\x01b", "id\n", "\x85x", "\x9f",
    # topic names: camellia's rule, bytes not characters
    "订单-cancel", "a/b {c}* ?[x]", "x" * 255, "x" * 256, "é" * 127 + "x", "é" * 128, "a\nb", "a\x85", "\x7f", "\t",
]

# Parameters that stand for one another or go only with some value of another (ackMsg's delayMillis
# and deadLetter with ack=false): a request mostly leaves them out.
MOSTLY_ABSENT = ("delayMillis", "triggerTime", "deadLetter")
# A list parameter's own candidates.
FIELD_CANDIDATES = {"msgIds": [MISSING, None, [], ["a"], ["a", "b c"], ["x" * 300], ["a", 5], ["a\n"], "a", [None]],
                    "retries": [MISSING, MISSING, MISSING, None, [], [1], [0, "2"], [None], [-1], [100_002], "1"]}


def drf(serializer, data):
    try:
        return serializer.run_validation(data)
    except ValidationError:
        return "refused"


@pytest.mark.parametrize("serializer_class", SERIALIZERS, ids=lambda c: c.__name__)
def test_fast_path_agrees_with_the_serializer(serializer_class):
    serializer = serializer_class()
    fast = FastValidation(serializer)
    names = list(serializer.fields)
    rng = random.Random(serializer_class.__name__)
    taken = 0
    for _ in range(3000):
        data = {name: value for name in names
                if (value := rng.choice(FIELD_CANDIDATES.get(name, CANDIDATES))) is not MISSING}
        for name in MOSTLY_ABSENT:
            if rng.random() < 0.6:
                data.pop(name, None)
        quick = fast(data)
        expected = drf(serializer, data)
        if quick is not None:
            taken += 1
            assert expected != "refused", f"fast path accepted what DRF refuses: {data!r}"
            assert dict(quick) == dict(expected), data
    assert taken > 0, "the fast path never applied"


def test_the_common_requests_take_the_fast_path():
    cases = [
        (SendMsgSerializer, {"topic": "orders", "msg": "hello", "delayMillis": "3000"}),
        (SendMsgSerializer, {"topic": "orders", "msg": " x ", "delayMillis": 0, "msgId": "", "ttlMillis": "60000",
                             "maxRetry": "3"}),
        (PullMsgSerializer, {"topic": "orders", "batch": "10", "ackTimeoutMillis": "30000"}),
        (LongPollingMsgSerializer, {"topic": "orders", "longPollingTimeoutMillis": "10000"}),
        (AckMsgSerializer, {"topic": "orders", "msgId": "abc", "ack": "false"}),
        (DeleteMsgSerializer, {"topic": "orders", "msgId": "abc", "release": "true"}),
        (SendMsgSerializer, {"topic": "orders", "msg": "hello", "triggerTime": "1700000000000"}),
        (AckMsgSerializer, {"topic": "orders", "msgId": "abc", "ack": "false", "delayMillis": "5000"}),
        (AckMsgBatchSerializer, {"topic": "orders", "msgIds": ["a", "b"], "ack": True}),
        (TouchMsgSerializer, {"topic": "orders", "msgId": "abc", "ackTimeoutMillis": "60000"}),
    ]
    for serializer_class, data in cases:
        serializer = serializer_class()
        assert FastValidation(serializer)(data) == dict(serializer.run_validation(data)), data


def test_no_fast_path_for_what_it_cannot_mirror():
    """Fields it would have to treat differently from DRF refuse a fast path when it is built,
    rather than validate wrongly per request."""
    from rest_framework import serializers

    class CallableDefault(serializers.Serializer):
        batch = serializers.IntegerField(required=False, default=lambda: 10)

    class UnknownField(serializers.Serializer):
        when = serializers.DateTimeField()

    for serializer_class in (CallableDefault, UnknownField):
        with pytest.raises(TypeError, match="no fast validation"):
            FastValidation(serializer_class())
