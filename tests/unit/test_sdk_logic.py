"""The client SDK's pure logic (sdk/python): envelope -> exception, Message from the API's fields,
client-made msgIds, request bodies and the retry decision. No server."""
import time
import uuid

import pytest
from delayqueue_client import (AsyncClient, BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, Message,
                               NotFound, RateLimited, ServerError, Unauthorized)
from delayqueue_client._calls import Call, answer_of, backoff, batch_results, merge_batch, result_of, send_body
from delayqueue_client._http import MaybeSent, NotSent
from delayqueue_client.client import Client
from delayqueue_client.errors import error_from_answer
from delayqueue_client.message import new_msg_id

API_MESSAGE = {"topic": "orders", "msgId": "m1", "msg": "body", "produceTime": 1000, "triggerTime": 1500,
               "expireTime": 9000, "maxRetry": 3, "retry": 1, "status": 3}


@pytest.mark.parametrize("code,cls", [(400, BadRequest), (401, Unauthorized), (403, Forbidden), (404, NotFound),
                                      (409, Conflict), (429, RateLimited), (500, ServerError)])
def test_each_answer_code_is_its_own_exception_class_carrying_code_and_msg(code, cls):
    error = error_from_answer({"code": code, "msg": f"problem {code}"})
    assert type(error) is cls and isinstance(error, DelayQueueError)
    assert (error.code, error.msg, str(error)) == (code, f"problem {code}", f"problem {code}")


def test_rate_limited_carries_retry_after_in_seconds_and_as_sent_in_ms():
    error = error_from_answer({"code": 429, "msg": "too many requests", "retryAfterMillis": 250})
    assert (error.retry_after, error.retry_after_ms) == (0.25, 250)
    assert error_from_answer({"code": 429, "msg": "x"}).retry_after is None


def test_an_unknown_code_is_a_plain_delayqueue_error_keeping_its_code():
    error = error_from_answer({"code": 418, "msg": "teapot"})
    assert type(error) is DelayQueueError and error.code == 418
    assert not issubclass(DeadLetter, DelayQueueError)  # a handler's signal, not a server answer


def test_message_reads_the_api_fields_in_snake_case_priority_defaulting_to_0():
    message = Message.from_api({**API_MESSAGE, "someFutureField": 1})
    assert message == Message(topic="orders", msg_id="m1", msg="body", produce_time=1000, trigger_time=1500,
                              expire_time=9000, max_retry=3, retry=1, status=3, priority=0)
    assert Message.from_api({**API_MESSAGE, "priority": 7}).priority == 7
    dead = Message.from_api({**API_MESSAGE, "deadReason": "dead_lettered", "deadTime": 2000})
    assert (dead.dead_reason, dead.dead_time) == ("dead_lettered", 2000)
    with pytest.raises(AttributeError):
        message.status = 4  # frozen


def test_a_client_made_msg_id_is_a_uuid7_in_32_hex_carrying_the_time_as_the_servers():
    before = time.time_ns() // 1_000_000
    ids = [new_msg_id() for _ in range(1000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 1000
    for msg_id in ids:
        parsed = uuid.UUID(hex=msg_id)
        assert len(msg_id) == 32 and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= int(msg_id[:12], 16) <= after


def test_send_body_names_the_api_fields_gives_every_send_a_msg_id_and_refuses_non_text():
    assert send_body("t", "m", delay_ms=5, msg_id="x", ttl_ms=9, max_retry=2, priority=3, trigger_time=None) == {
        "topic": "t", "msg": "m", "msgId": "x", "delayMillis": 5, "ttlMillis": 9, "maxRetry": 2, "priority": 3}
    plain = send_body("t", "m")
    assert len(plain["msgId"]) == 32 and plain["delayMillis"] == 0  # neither delay nor trigger time: due now
    assert "delayMillis" not in send_body("t", "m", trigger_time=5)
    with pytest.raises(TypeError, match="msg must be a str, got dict"):
        send_body("t", {"a": 1})


def test_result_of_parses_success_maps_404_when_asked_and_raises_the_rest():
    call = Call("getMsg", {}, lambda a: Message.from_api(a["delayMsg"]), idempotent=True, not_found=None)
    assert result_of(call, {"code": 200, "delayMsg": API_MESSAGE}).msg_id == "m1"
    assert result_of(call, {"code": 404, "msg": "not found"}) is None
    with pytest.raises(Conflict, match="consuming"):
        result_of(call, {"code": 409, "msg": "not consuming"})


def test_batch_results_keep_order_with_each_failed_item_as_its_error_not_raised():
    results = batch_results({"code": 200, "results": [
        {"code": 200, "msg": "success", "delayMsg": API_MESSAGE},
        {"code": 429, "msg": "message 1: too many requests", "retryAfterMillis": 40},
        {"code": 400, "msg": "message 2: topic is required"}]})
    assert results[0].msg_id == "m1"
    assert isinstance(results[1], RateLimited) and results[1].retry_after_ms == 40
    assert isinstance(results[2], BadRequest) and results[2].msg == "message 2: topic is required"


def test_a_non_envelope_http_answer_is_a_server_error():
    with pytest.raises(ServerError, match="HTTP 502"):
        answer_of(502, b"<html>bad gateway</html>")


def test_retry_decision_connect_errors_always_sent_errors_and_unavailable_only_when_idempotent():
    client = Client("http://127.0.0.1:1", max_retries=2)
    safe, unsafe = (Call("x", {}, dict, idempotent=flag) for flag in (True, False))
    refused, cut = NotSent("ConnectionRefusedError"), MaybeSent("ConnectionResetError")
    unavailable, broken = {"code": 500, "msg": "redis unavailable: timeout"}, {"code": 500, "msg": "bug"}
    assert client._retry_after(unsafe, 0, refused, None) is not None
    assert client._retry_after(unsafe, 0, cut, None) is None
    assert client._retry_after(safe, 0, cut, None) is not None
    assert client._retry_after(safe, 0, None, unavailable) is not None
    assert client._retry_after(unsafe, 0, None, unavailable) is None
    assert client._retry_after(safe, 0, None, broken) is None
    assert client._retry_after(safe, 2, refused, None) is None  # max_retries reached
    assert all(0 <= backoff(n, 0.1, 2.0) <= min(2.0, 0.1 * 2 ** n) for n in range(10))
    client.close()


def test_url_and_token_come_from_the_environment_and_the_token_shows_in_no_repr(monkeypatch):
    monkeypatch.setenv("DELAYQUEUE_URL", "http://queue.example:9000/")
    monkeypatch.setenv("DELAYQUEUE_TOKEN", "dq_secret")
    client = Client()
    assert client.base_url == "http://queue.example:9000"
    assert client._headers["Authorization"] == "Bearer dq_secret"
    assert "dq_secret" not in repr(client)
    assert Client("http://other", token="dq_2")._headers["Authorization"] == "Bearer dq_2"
    client.close()


def test_merge_batch_places_answers_and_picks_only_unavailable_items_to_send_again():
    results = [None] * 4
    answered = [Message.from_api(API_MESSAGE), ServerError("message 1: message log unavailable: connection refused"),
                RateLimited("message 2: too many requests", retry_after_ms=5), ServerError("message 3: bug")]
    assert merge_batch(results, [0, 1, 2, 3], answered, retry=True) == [1]
    assert results == answered
    assert merge_batch(results, [1], [ServerError("message 0: redis unavailable: timeout")], retry=False) == []
    assert results[1].msg == "message 0: redis unavailable: timeout"


def test_a_resend_that_fails_as_a_whole_keeps_what_the_first_answer_stored():
    class FlakyBatchClient(Client):
        """A Client whose server stores the first item, is unavailable for the second, then unreachable."""
        calls = 0

        def _run(self, call):
            self.calls += 1
            if self.calls == 1:
                return [Message.from_api(API_MESSAGE), ServerError("message 1: redis unavailable: timeout")]
            raise ServerError("delayqueue server unreachable: ConnectionRefusedError")

    with FlakyBatchClient("http://127.0.0.1:9", backoff_base=0.001) as client:
        stored, failed = client._send_batch([{"msgId": "m1"}, {"msgId": "m2"}])
    assert stored.msg_id == "m1"  # stored by the first answer: never reported as failed
    assert isinstance(failed, ServerError) and "unreachable" in failed.msg


@pytest.mark.parametrize("url", ["ftp://queue.example", "queue.example:8000", "http://"])
def test_a_server_url_that_is_not_http_is_refused_by_both_clients(url):
    with pytest.raises(ValueError, match="must be http"):
        Client(url)
    with pytest.raises(ValueError, match="must be http"):
        AsyncClient(url)
