"""The camellia-compatible HTTP API: shapes, defaults, and bad input on every endpoint."""
import asyncio
import logging
import re
from types import SimpleNamespace

import orjson
import pytest
from django.test import AsyncRequestFactory
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.throttling import BaseThrottle

from delayqueue.api.urls import urlpatterns
from delayqueue.api.views.messages import SendMsgView
from delayqueue.api.views.topics import GetTopicInfoView
from delayqueue.core import exceptions
from delayqueue.runtime import close_current
from tests.helpers import API, call

MSG_FIELDS = ["topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry", "status"]


async def test_send_get_pull_ack_round_trip(api):
    sent = await call(api, "sendMsg", topic="orders", msg="cancel #1", delayMillis="0", msgId="o1")
    assert sent["code"] == 200 and sent["msg"] == "success"
    assert list(sent["delayMsg"]) == MSG_FIELDS
    assert sent["delayMsg"]["msgId"] == "o1" and sent["delayMsg"]["status"] == 2

    got = await call(api, "getMsg", topic="orders", msgId="o1")
    assert got["delayMsg"] == sent["delayMsg"]

    pulled = await call(api, "pullMsg", topic="orders")
    assert pulled["code"] == 200 and [m["msgId"] for m in pulled["delayMsgList"]] == ["o1"]
    assert pulled["delayMsgList"][0]["status"] == 3 and pulled["delayMsgList"][0]["retry"] == 1

    acked = await call(api, "ackMsg", topic="orders", msgId="o1", ack="true")
    assert acked == {"code": 200, "msg": "success", "done": True}
    assert (await call(api, "getMsg", topic="orders", msgId="o1"))["delayMsg"]["status"] == 4


async def test_json_bodies_and_query_strings_are_accepted(api):
    sent = await call(api, "sendMsg", json={"topic": "j", "msg": "hi 你好", "delayMillis": 60000, "maxRetry": 2})
    assert sent["code"] == 200 and sent["delayMsg"]["msg"] == "hi 你好" and sent["delayMsg"]["maxRetry"] == 2
    response = await api.post(API + "getMsg", params={"topic": "j", "msgId": sent["delayMsg"]["msgId"]})
    assert response.json()["delayMsg"]["status"] == 1


async def test_query_string_and_body_merge(api):
    """Each parameter from either; one in both is refused (test_request_bodies.py)."""
    response = await api.post(API + "sendMsg?topic=q&delayMillis=0&msgId=m1", data={"msg": "from-body"})
    sent = response.json()["delayMsg"]
    assert (sent["topic"], sent["msgId"], sent["msg"], sent["status"]) == ("q", "m1", "from-body", 2)
    response = await api.post(API + "sendMsg", params={"topic": "q", "delayMillis": "0"},
                              data={"msg": "from-multipart", "msgId": "m2"}, files={"attachment": b"ignored"})
    sent = response.json()["delayMsg"]
    assert (sent["topic"], sent["msgId"], sent["msg"]) == ("q", "m2", "from-multipart")


async def test_ack_defaults_to_true_and_false_means_nack(api):
    await call(api, "sendMsg", topic="a", msg="x", delayMillis="0", msgId="m1")
    await call(api, "pullMsg", topic="a")
    assert (await call(api, "ackMsg", topic="a", msgId="m1", ack="false"))["code"] == 200
    assert (await call(api, "getMsg", topic="a", msgId="m1"))["delayMsg"]["status"] == 2
    await call(api, "pullMsg", topic="a")
    assert (await call(api, "ackMsg", topic="a", msgId="m1"))["code"] == 200
    assert (await call(api, "getMsg", topic="a", msgId="m1"))["delayMsg"]["status"] == 4
    # ack of an unknown id: 200, as camellia
    assert (await call(api, "ackMsg", topic="a", msgId="nope"))["code"] == 200


async def test_spring_style_booleans(api):
    for value, expected in [("on", True), ("1", True), ("yes", True), ("off", False), ("0", False), ("no", False)]:
        await call(api, "sendMsg", topic="b", msg="x", delayMillis="0", msgId=f"id-{value}")
        await call(api, "pullMsg", topic="b")
        await call(api, "ackMsg", topic="b", msgId=f"id-{value}", ack=value)
        status = (await call(api, "getMsg", topic="b", msgId=f"id-{value}"))["delayMsg"]["status"]
        assert status == (4 if expected else 2), value
        if not expected:
            await call(api, "deleteMsg", topic="b", msgId=f"id-{value}")


async def test_delete_and_get_not_found(api):
    await call(api, "sendMsg", topic="d", msg="x", delayMillis="60000", msgId="d1")
    assert await call(api, "deleteMsg", topic="d", msgId="d1") == {"code": 200, "msg": "success"}
    assert (await call(api, "getMsg", topic="d", msgId="d1"))["delayMsg"]["status"] == 7
    again = await call(api, "deleteMsg", topic="d", msgId="d1")
    assert again["code"] == 404 and "d1" in again["msg"]
    await call(api, "sendMsg", topic="d", msg="x", delayMillis="60000", msgId="d2")
    assert (await call(api, "deleteMsg", topic="d", msgId="d2", release="true"))["code"] == 200
    missing = await call(api, "getMsg", topic="d", msgId="d2")
    # An error answer is only code and msg; camellia's SDK maps code 404 to null either way.
    assert missing == {"code": 404, "msg": "message d2 not found in topic d"}


async def test_empty_msg_id_means_generate_one(api):
    sent = await call(api, "sendMsg", topic="g", msg="x", delayMillis="0", msgId="")
    assert len(sent["delayMsg"]["msgId"]) == 32


async def test_empty_optional_numbers_mean_default(api, settings):
    sent = await call(api, "sendMsg", topic="g", msg="x", delayMillis="5", ttlMillis="", maxRetry="")
    assert sent["code"] == 200
    assert sent["delayMsg"]["maxRetry"] == settings.DELAYQUEUE["MAX_RETRY"]


async def test_a_delay_however_far_in_the_past_means_due_now(api):
    """camellia's SDK sends sendMsgByTriggerTime(t) as delayMillis = t - now: a trigger time of 0 or
    years ago is a large negative delay, which camellia (any Java long) makes due at once."""
    for delay in (-1_796_000_000_000, -(2 ** 63)):
        sent = await call(api, "sendMsg", topic="past", msg="x", delayMillis=str(delay))
        assert sent["code"] == 200, sent
        assert sent["delayMsg"]["status"] == 2 and sent["delayMsg"]["triggerTime"] == sent["delayMsg"]["produceTime"]
    refused = await call(api, "sendMsg", topic="past", msg="x", delayMillis=str(-(2 ** 63) - 1))
    assert refused["code"] == 400 and "delayMillis" in refused["msg"]


async def test_pull_batch_and_defaults(api):
    for i in range(5):
        await call(api, "sendMsg", topic="p", msg=str(i), delayMillis="0")
    one = await call(api, "pullMsg", topic="p", batch="0")
    assert len(one["delayMsgList"]) == 1 and one["delayMsgList"][0]["msg"] == "0"
    rest = await call(api, "pullMsg", topic="p", batch="10", ackTimeoutMillis="-1")
    assert [m["msg"] for m in rest["delayMsgList"]] == ["1", "2", "3", "4"]
    assert (await call(api, "pullMsg", topic="p"))["delayMsgList"] == []


async def test_send_msg_batch(api):
    body = [
        {"topic": "s1", "msg": "a", "delayMillis": 0},
        {"topic": "s2", "msg": "b", "delayMillis": 60000, "msgId": "fixed"},
        {"topic": "bad\ttopic", "msg": "c", "delayMillis": 0},
        {"topic": "s1", "msg": "d"},
        "not an object",
        {"topic": "s2", "msg": "dup", "delayMillis": 0, "msgId": "fixed"},
    ]
    result = await call(api, "sendMsgBatch", json=body)
    assert result["code"] == 200
    codes = [r["code"] for r in result["results"]]
    assert codes == [200, 200, 400, 400, 400, 200]
    assert "topic" in result["results"][2]["msg"] and "delayMillis" in result["results"][3]["msg"]
    assert result["results"][4] == {"code": 400, "msg": "message 4: must be a JSON object"}
    assert all(set(r) == {"code", "msg"} for r in result["results"] if r["code"] != 200)  # no delayMsg
    assert result["results"][5]["delayMsg"]["msg"] == "b"  # deduplicated against the earlier one
    info = await call(api, "getTopicInfo", method="get", topic="s2")
    assert info["data"]["waitingQueueSize"] == 1


@pytest.mark.parametrize("body", [[], {"x": 1}, "text", None])
async def test_send_msg_batch_bad_bodies(api, body):
    if body is None:
        response = await api.post(API + "sendMsgBatch", content=b"[{", headers={"content-type": "application/json"})
        result = response.json()
    else:
        result = await call(api, "sendMsgBatch", json=body)
    assert result["code"] == 400 and result["msg"]


async def test_send_msg_batch_size_limit(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_BATCH_SEND": 3}
    result = await call(api, "sendMsgBatch", json=[{"topic": "t", "msg": "x", "delayMillis": 0}] * 4)
    assert result["code"] == 400 and "limit of 3" in result["msg"]


BAD_SENDS = [
    ({"msg": "x", "delayMillis": "0"}, "topic"),
    ({"topic": "", "msg": "x", "delayMillis": "0"}, "topic"),
    ({"topic": "a\nb", "msg": "x", "delayMillis": "0"}, "topic"),
    ({"topic": "t" * 256, "msg": "x", "delayMillis": "0"}, "topic"),
    ({"topic": "é" * 128, "msg": "x", "delayMillis": "0"}, "topic"),  # 128 characters, 256 bytes
    ({"topic": "t", "delayMillis": "0"}, "msg"),
    ({"topic": "t", "msg": "", "delayMillis": "0"}, "msg"),
    ({"topic": "t", "msg": "x"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "abc"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "1.5"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "9" * 30}, "delayMillis"),
    # What Python's int() takes and Java's Long.parseLong does not (full-width digits it takes: no client sends them).
    ({"topic": "t", "msg": "x", "delayMillis": "1_0"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": " 10 "}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "10\n"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "１０"}, "delayMillis"),  # full-width digits
    ({"topic": "t", "msg": "x", "delayMillis": "10.0"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "+-1"}, "delayMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "maxRetry": "1_0"}, "maxRetry"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "priority": " 1"}, "priority"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "ttlMillis": "ten"}, "ttlMillis"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "maxRetry": "x"}, "maxRetry"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "maxRetry": "1000001"}, "maxRetry"),
    ({"topic": "t", "msg": "x", "delayMillis": "0", "msgId": "i" * 300}, "msgId"),
]


@pytest.mark.parametrize("params,parameter", BAD_SENDS)
async def test_send_bad_input_names_the_parameter(api, params, parameter):
    result = await call(api, "sendMsg", **params)
    assert result["code"] == 400
    assert result["msg"].startswith(parameter + ":"), result["msg"]
    assert (await call(api, "getTopicInfoList", method="get"))["data"] == []  # nothing half-written


async def test_numbers_are_read_as_java_reads_a_long(api):
    """What Long.parseLong takes: an optional sign, ASCII digits (leading zeros too); and a JSON number
    that is whole."""
    for text, delay in (("+5000", 5000), ("-0", 0), ("007", 7), ("-15", -15)):
        sent = await call(api, "sendMsg", topic="t", msg="x", delayMillis=text, maxRetry="+3")
        assert sent["code"] == 200, sent
        message = sent["delayMsg"]
        assert message["triggerTime"] - message["produceTime"] == max(delay, 0) and message["maxRetry"] == 3
    sent = await call(api, "sendMsg", json={"topic": "t", "msg": "x", "delayMillis": 5000.0, "maxRetry": 2})
    assert sent["code"] == 200 and sent["delayMsg"]["triggerTime"] - sent["delayMsg"]["produceTime"] == 5000
    refused = await call(api, "sendMsg", json={"topic": "t", "msg": "x", "delayMillis": 5000.5})
    assert refused["code"] == 400 and refused["msg"].startswith("delayMillis:"), refused


async def test_oversized_message_is_rejected(api, settings):
    limit = settings.DELAYQUEUE["MAX_MSG_BYTES"]
    result = await call(api, "sendMsg", topic="t", msg="é" * (limit // 2 + 1), delayMillis="0")
    assert result["code"] == 400 and "msg:" in result["msg"] and str(limit) in result["msg"]
    ok = await call(api, "sendMsg", topic="t", msg="x" * limit, delayMillis="0")
    assert ok["code"] == 200


async def test_malformed_json_body(api):
    response = await api.post(API + "sendMsg", content=b'{"topic": ', headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.json()["code"] == 400 and "JSON" in response.json()["msg"]


async def test_json_list_body_on_single_endpoint(api):
    result = await call(api, "sendMsg", json=[{"topic": "t"}])
    assert result["code"] == 400 and "JSON object" in result["msg"]


@pytest.mark.parametrize("endpoint,params,parameter", [
    ("pullMsg", {}, "topic"),
    ("pullMsg", {"topic": "t", "batch": "x"}, "batch"),
    ("pullMsg", {"topic": "t", "batch": "100000"}, "batch"),
    ("pullMsg", {"topic": "t", "ackTimeoutMillis": "soon"}, "ackTimeoutMillis"),
    ("longPollingMsg", {"topic": "t", "longPollingTimeoutMillis": "x"}, "longPollingTimeoutMillis"),
    ("longPollingMsg", {"topic": "del\x7f"}, "topic"),
    ("ackMsg", {"topic": "t"}, "msgId"),
    ("ackMsg", {"topic": "t", "msgId": ""}, "msgId"),
    ("ackMsg", {"topic": "t", "msgId": "m", "ack": "maybe"}, "ack"),
    ("getMsg", {"msgId": "m"}, "topic"),
    ("getMsg", {"topic": "t"}, "msgId"),
    ("deleteMsg", {"topic": "t", "msgId": "m", "release": "sure"}, "release"),
    ("deleteMsg", {"topic": "t"}, "msgId"),
    ("getTopicInfo", {}, "topic"),
])
async def test_bad_input_on_every_endpoint(api, endpoint, params, parameter):
    result = await call(api, endpoint, **params)
    assert set(result) == {"code", "msg"} and result["code"] == 400
    assert result["msg"].startswith(parameter + ":"), result["msg"]


CONTROL_CHARACTERS = ["a\x00b", "a\x01b", "\x1b[31mred", "id\n", "\tid", "a\x7fb", "a\x85b", "a\x9fb"]
MSG_ID_ENDPOINTS = [("sendMsg", {"msg": "x", "delayMillis": "0"}), ("ackMsg", {}), ("getMsg", {}), ("deleteMsg", {}),
                    ("restoreMsg", {})]


@pytest.mark.parametrize("endpoint,params", MSG_ID_ENDPOINTS, ids=[e for e, _ in MSG_ID_ENDPOINTS])
async def test_a_msg_id_with_control_characters_is_refused_everywhere(api, endpoint, params):
    for msg_id in CONTROL_CHARACTERS:
        for how in ("form", "get", "json"):
            fields = {"topic": "t", "msgId": msg_id, **params}
            if how == "json":
                result = await call(api, endpoint, json=fields)
            else:
                result = await call(api, endpoint, method="get" if how == "get" else "post", **fields)
            assert result == {"code": 400, "msg": "msgId: must not contain control characters"}, (msg_id, how)
    batch = await call(api, "sendMsgBatch", json=[{"topic": "t", "msg": "x", "delayMillis": 0, "msgId": m}
                                                  for m in CONTROL_CHARACTERS])
    assert {r["msg"].split(": ", 1)[1] for r in batch["results"]} == {"msgId: must not contain control characters"}
    assert (await call(api, "getTopicInfoList", method="get"))["data"] == []  # nothing sent
    # Other text is an id as before: spaces inside, any script, U+00A0 (not a control character).
    for msg_id in ("order 42", "订单-42", "a\u00a0b"):
        assert (await call(api, "sendMsg", topic="t", msg="x", delayMillis="0", msgId=msg_id))["code"] == 200


async def test_a_msg_id_is_taken_as_sent_spaces_around_it_and_all(api):
    """camellia keeps a msgId as the client gave it: " a " is another message than "a", and a client
    reads, acks and deletes it under the id it sent (they were trimmed: " a " was stored as "a")."""
    for msg_id in (" a ", "a", "b\u3000"):
        sent = await call(api, "sendMsg", topic="sp", msg=f"body {msg_id!r}", delayMillis="0", msgId=msg_id)
        assert sent["delayMsg"]["msgId"] == msg_id
    assert (await call(api, "getMsg", topic="sp", msgId=" a "))["delayMsg"]["msg"] == "body ' a '"
    pulled = await call(api, "pullMsg", topic="sp", batch="10")
    assert sorted(m["msgId"] for m in pulled["delayMsgList"]) == [" a ", "a", "b\u3000"]
    assert (await call(api, "ackMsg", topic="sp", msgId=" a ", ack="true"))["done"] is True
    assert (await call(api, "ackMsgBatch", json={"topic": "sp", "msgIds": ["b\u3000"]}))["results"] == [
        {"msgId": "b\u3000", "done": True}]
    statuses = [(await call(api, "getMsg", json={"topic": "sp", "msgId": m}))["delayMsg"]["status"]
                for m in (" a ", "a", "b\u3000")]
    assert statuses == [4, 3, 4]
    await call(api, "sendMsg", topic="sp", msg="x", delayMillis="60000", msgId=" c")
    assert (await call(api, "deleteMsg", topic="sp", msgId="c"))["code"] == 404
    assert (await call(api, "deleteMsg", method="get", topic="sp", msgId=" c"))["code"] == 200


@pytest.mark.parametrize("endpoint,params", MSG_ID_ENDPOINTS, ids=[e for e, _ in MSG_ID_ENDPOINTS])
async def test_a_blank_msg_id_is_refused_everywhere(api, endpoint, params):
    """An id of spaces only is a client's mistake (camellia would take it): code 400, also on
    sendMsg, where only an empty msgId means "generate one"."""
    for msg_id in (" ", "   ", "\u3000", "\u00a0"):
        for how in ("form", "json"):
            fields = {"topic": "t", "msgId": msg_id, **params}
            result = await (call(api, endpoint, json=fields) if how == "json" else call(api, endpoint, **fields))
            assert result == {"code": 400, "msg": "msgId: This field may not be blank."}, (msg_id, how)
    assert (await call(api, "getTopicInfoList", method="get"))["data"] == []  # nothing sent


async def test_unsupported_method(api):
    response = await api.put(API + "sendMsg")
    assert response.status_code == 200 and response.json()["code"] == 400


async def test_topic_info_buckets_and_list(api):
    now_delays = {"sizeOf0To1min": 1_000, "sizeOf1minTo10min": 5 * 60_000, "sizeOf10minTo30min": 20 * 60_000,
                  "sizeOf30minTo1hour": 45 * 60_000, "sizeOf1hourTo6hour": 2 * 3_600_000,
                  "sizeOf6hourTo1day": 12 * 3_600_000, "sizeOf1dayTo7day": 3 * 86_400_000,
                  "sizeOf7dayTo30day": 10 * 86_400_000, "sizeOf30dayToInfinite": 60 * 86_400_000}
    for bucket, delay in now_delays.items():
        await call(api, "sendMsg", topic="info", msg=bucket, delayMillis=str(delay), ttlMillis="1000")
    await call(api, "sendMsg", topic="info", msg="now", delayMillis="0")
    await call(api, "sendMsg", topic="other", msg="now", delayMillis="0")
    await call(api, "pullMsg", topic="other")
    info = (await call(api, "getTopicInfo", method="get", topic="info"))["data"]
    assert info["topic"] == "info" and info["waitingQueueSize"] == 9
    assert info["waitingQueueInfo"] == {bucket: 1 for bucket in now_delays}
    assert list(info["waitingQueueInfo"]) == list(now_delays)
    assert info["readyQueueSize"] == 1 and info["ackQueueSize"] == 0
    listed = (await call(api, "getTopicInfoList", method="get"))["data"]
    assert [t["topic"] for t in listed] == ["info", "other"]  # registration order, no duplicates
    assert listed[1]["ackQueueSize"] == 1
    unknown = (await call(api, "getTopicInfo", method="get", topic="never-used"))["data"]
    assert unknown["waitingQueueSize"] == 0 and set(unknown["waitingQueueInfo"].values()) == {0}


async def test_monitor_data_counts_the_last_interval(api, settings):
    interval = settings.DELAYQUEUE["MONITOR_INTERVAL_SECONDS"]
    # Start right after an interval boundary so all traffic lands in one interval.
    import time
    await asyncio.sleep(interval - (time.time() % interval) + 0.05)
    for i in range(3):
        await call(api, "sendMsg", topic="mon", msg=str(i), delayMillis="0", msgId=f"m{i}")
    await call(api, "sendMsg", topic="mon", msg="dup", delayMillis="0", msgId="m0")
    await call(api, "pullMsg", topic="mon", batch="2")
    await call(api, "ackMsg", topic="mon", msgId="m0")
    await call(api, "ackMsg", topic="mon", msgId="m1", ack="false")
    await call(api, "getMsg", topic="mon", msgId="m2")
    await call(api, "deleteMsg", topic="mon", msgId="m2")
    before = (await call(api, "getMonitorData", method="get"))["data"]
    assert before["requestStatsList"] == []  # the interval is not complete yet
    await asyncio.sleep(interval - (time.time() % interval) + 0.05)
    data = (await call(api, "getMonitorData", method="get"))["data"]
    [stats] = data["requestStatsList"]
    assert stats == {"topic": "mon", "sendMsg": 4, "pullMsg": 2, "deleteMsg": 1, "ackMsg": 2, "getMsg": 1,
                     "triggerMsgReady": 0, "triggerMsgEndLife": 0, "triggerMsgTimeout": 0}
    [gap] = data["pullMsgTimeGapStatsList"]
    assert gap["topic"] == "mon" and gap["count"] == 2 and gap["max"] >= 0 and gap["avg"] >= 0
    assert data["readyQueueTimeGapStatsList"] == []


def assert_names_no_place(text: str, port: int) -> None:
    """An error answer says what failed, not where: no host, address, port or socket path."""
    assert not re.search(r"\d+\.\d+\.\d+\.\d+|localhost|\[::1\]|/tmp|\.sock|port", text), text
    assert str(port) not in text, text


async def test_redis_down_gives_500_naming_what_failed_not_where(api, settings, caplog, monkeypatch):
    monkeypatch.setattr(exceptions, "_logged", {})  # no failure seen yet
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 300}
    from delayqueue.runtime import close_current

    await close_current()  # the next request builds its runtime from the settings above
    try:
        answers = [await call(api, "sendMsg", topic="t", msg="x", delayMillis="0"),
                   *[await call(api, "pullMsg", topic="t") for _ in range(5)],
                   await call(api, "getTopicInfoList", method="get"),
                   *(await call(api, "sendMsgBatch", json=[{"topic": "t", "msg": "x", "delayMillis": 0}]))["results"]]
    finally:
        await close_current()
    for answer in answers:
        assert answer["code"] == 500 and answer["msg"].endswith("redis unavailable: connection refused"), answer
        assert_names_no_place(answer["msg"], 1)
    # Where it failed is in the log, once per failure however many requests met it: one for the
    # script connection's error text, one for redis-py's.
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 2 and all("127.0.0.1" in line for line in logged), logged


class DenyAll(BasePermission):
    message = "no entry"

    def has_permission(self, request, view):
        return False


class RequireToken(BaseAuthentication):
    """Accepts `Authorization: Token ok`; refuses other tokens; no header: anonymous."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None
        if header != "Token ok":
            raise AuthenticationFailed("bad token")
        return (SimpleNamespace(is_authenticated=True), None)

    def authenticate_header(self, request):
        return "Token"


async def answer_of(view, method="post", **data):
    request = getattr(AsyncRequestFactory(), method)(API + "sendMsg", data)
    response = await view(request)
    assert response.status_code == 200 and response["content-type"] == "application/json"
    return orjson.loads(response.content)


SEND = {"topic": "t", "msg": "x", "delayMillis": "0"}


@pytest.fixture
async def direct():
    """For views called without the ASGI stack: closes the runtime they built on this loop."""
    yield
    await close_current()


async def test_a_permission_class_on_a_queue_view_is_enforced(direct):
    denied = await answer_of(SendMsgView.as_view(permission_classes=[DenyAll]), **SEND)
    assert denied == {"code": 403, "msg": "no entry"}
    assert (await answer_of(SendMsgView.as_view(), **SEND))["code"] == 200  # the same request, no class
    info = await answer_of(GetTopicInfoView.as_view(permission_classes=[DenyAll]), method="get", topic="t")
    assert info["code"] == 403


async def test_authentication_runs_before_the_view(direct):
    view = SendMsgView.as_view(authentication_classes=[RequireToken], permission_classes=[IsAuthenticated])
    assert (await answer_of(view, **SEND))["code"] == 401  # anonymous
    request = AsyncRequestFactory().post(API + "sendMsg", SEND, headers={"authorization": "Token wrong"})
    assert orjson.loads((await view(request)).content) == {"code": 401, "msg": "bad token"}
    request = AsyncRequestFactory().post(API + "sendMsg", SEND, headers={"authorization": "Token ok"})
    assert orjson.loads((await view(request)).content)["code"] == 200


async def test_a_throttle_on_a_queue_view_is_enforced(direct):
    class NoMore(BaseThrottle):
        def allow_request(self, request, view):
            return False

    answer = await answer_of(SendMsgView.as_view(throttle_classes=[NoMore]), **SEND)
    assert answer["code"] == 429 and set(answer) == {"code", "msg"}


async def test_unexpected_errors_answer_their_type_only_and_go_to_the_log(direct, caplog):
    class Broken(SendMsgView):
        async def handle(self):
            raise KeyError("postgres://user:secret@db/x")

    answer = await answer_of(Broken.as_view(), **SEND)
    assert answer == {"code": 500, "msg": "internal error: KeyError"}
    assert "secret" in caplog.text and "Traceback" in caplog.text  # the details are in the log only


def test_queue_views_are_async_and_serve_get_and_post():
    for pattern in urlpatterns:
        view = pattern.callback.view_class
        assert view.view_is_async, view
        assert {"get", "post"} <= {m for m in view.http_method_names if hasattr(view, m)}, view
