"""The client SDK's pure logic (sdk/python): envelope -> exception, Message from the API's fields,
client-made msgIds, request bodies and the retry decision. No server."""
import io
import subprocess
import sys
import time
import uuid

import pytest
import json

from delayqueue_client import (AsyncClient, BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, MaybeApplied,
                               Message, NotFound, NotTheAPI, RateLimited, ServerError, Unauthorized, Unavailable)
from delayqueue_client._calls import (Again, Call, backoff, batch_results, envelope_of, merge_batch, result_of,
                                      send_body)
from delayqueue_client import cli
from delayqueue_client._http import MaybeSent, NotSent, proxy_for
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


def test_a_non_envelope_http_answer_is_none():
    assert envelope_of(b"<html>bad gateway</html>") is None
    assert envelope_of(b'{"detail": "not found"}') is None
    assert envelope_of(b'{"code": 200, "msg": "success"}') == {"code": 200, "msg": "success"}


def envelope(**fields) -> tuple[int, bytes]:
    return 200, json.dumps(fields).encode()


@pytest.fixture
def decide():
    """One attempt's outcome for a Client with 2 retries: a float (seconds to wait before the next
    attempt), or the error it raises; the result otherwise."""
    client = Client("http://127.0.0.1:1", max_retries=2, max_retry_after=5.0)

    def outcome(idempotent: bool, posted, attempt: int = 0):
        try:
            found = client._after_attempt(Call("ackMsg", {}, lambda a: "result", idempotent=idempotent), attempt, posted)
        except DelayQueueError as exc:
            return exc
        return found.seconds if isinstance(found, Again) else found
    yield outcome
    client.close()


def test_retry_decision_connect_errors_always_sent_errors_and_unavailable_only_when_idempotent(decide):
    refused, cut = NotSent("ConnectionRefusedError"), MaybeSent("ConnectionResetError")
    unavailable, broken = envelope(code=500, msg="redis unavailable: timeout"), envelope(code=500, msg="bug")
    assert isinstance(decide(False, refused), float)
    assert isinstance(decide(True, cut), float)
    assert isinstance(decide(True, unavailable), float)
    assert isinstance(decide(False, unavailable), ServerError)
    assert isinstance(decide(True, broken), ServerError)
    assert decide(True, envelope(code=200, msg="success")) == "result"
    assert all(0 <= backoff(n, 0.1, 2.0) <= min(2.0, 0.1 * 2 ** n) for n in range(10))


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_proxy_failure_is_retried_only_when_idempotent_then_unavailable_else_maybe_applied(decide, status):
    page = (status, b"<html>gateway trouble</html>")
    assert isinstance(decide(True, page), float)
    final = decide(True, page, attempt=2)  # max_retries reached
    assert isinstance(final, Unavailable) and isinstance(final, ServerError) and f"HTTP {status}" in final.msg
    lost = decide(False, page)  # the proxy may have passed an ack on: not sent again
    assert isinstance(lost, MaybeApplied) and isinstance(lost, ServerError) and "may have been applied" in lost.msg


@pytest.mark.parametrize("status", [200, 301, 404])
def test_a_page_not_the_apis_below_500_is_not_the_api_at_once_and_not_the_servers_500(decide, status):
    """A wrong base URL (another site, http redirected to https, a wrong prefix): no retry changes
    it, and nothing was applied, whatever the call."""
    for idempotent in (True, False):
        found = decide(idempotent, (status, b"<html>another site</html>"))
        assert type(found) is NotTheAPI and (found.status, found.code) == (status, None)
        assert found.msg == f"HTTP {status} answer, not the delay queue API's: check the base URL"


@pytest.mark.parametrize("status, cause", [
    (401, "a proxy in front of the server asks for its own login"),
    (403, "a proxy in front of the server refused the request"),
    (407, "the HTTP proxy asks for its own login"),
    (413, "a proxy in front of the server refused the body size"),
])
def test_a_proxys_own_refusal_says_what_it_means_not_check_the_base_url(decide, status, cause):
    """A proxy's login or body cap answers its own page: the base URL is right, so the message says
    what the status means; still no retry (none changes it) and nothing applied."""
    for idempotent in (True, False):
        found = decide(idempotent, (status, b"<html>proxy</html>"))
        assert type(found) is NotTheAPI and (found.status, found.code) == (status, None)
        assert found.msg == f"HTTP {status} answer, not the delay queue API's: {cause}"


def test_a_page_not_the_apis_from_a_failing_or_busy_server_is_retried_when_idempotent(decide):
    for status in (408, 429, 500):
        page = (status, b"<html>trouble</html>")
        assert isinstance(decide(True, page), float)
        final = decide(True, page, attempt=2)
        assert type(final) is ServerError and f"HTTP {status} answer, not the API's envelope" in final.msg
        assert isinstance(decide(False, page), MaybeApplied)


def test_a_lost_answer_is_maybe_applied_for_a_call_that_is_not_idempotent_and_unavailable_otherwise(decide):
    cut, refused = MaybeSent("RemoteDisconnected"), NotSent("ConnectionRefusedError")
    lost = decide(False, cut)
    assert isinstance(lost, MaybeApplied) and lost.code is None and "RemoteDisconnected" in lost.msg
    assert isinstance(decide(True, cut, attempt=2), Unavailable)
    never_sent = decide(False, refused, attempt=2)
    assert isinstance(never_sent, Unavailable) and "unreachable: ConnectionRefusedError" in never_sent.msg


def test_a_429_with_retry_after_is_waited_for_on_every_call_and_a_cap_without_it_is_raised(decide):
    throttled = envelope(code=429, msg="too many requests", retryAfterMillis=250)
    assert decide(False, throttled) == 0.25  # refused, so nothing applied: even an ack goes again
    assert decide(True, throttled) == 0.25
    assert isinstance(decide(False, throttled, attempt=2), RateLimited)  # max_retries reached
    cap = envelope(code=429, msg="too many topics: the cap is 10 (DELAYQUEUE_MAX_TOPICS)")
    assert isinstance(decide(True, cap), RateLimited)  # waiting does not lift a cap
    too_long = envelope(code=429, msg="too many invalid API tokens", retryAfterMillis=60_000)
    assert isinstance(decide(True, too_long), RateLimited)  # over max_retry_after: the caller decides
    # A proxy's or another server's odd value: no negative sleep (time.sleep raises), no boolean as 1 ms.
    assert decide(True, envelope(code=429, msg="too many requests", retryAfterMillis=-5)) == 0.0
    assert isinstance(decide(True, envelope(code=429, msg="too many requests", retryAfterMillis=True)), RateLimited)


def test_proxy_from_the_argument_or_the_environment_unless_no_proxy_covers_the_host(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert proxy_for("http://queue:8000", None, True) is None
    assert proxy_for("http://queue:8000", "http://proxy:3128", False) == "http://proxy:3128"
    monkeypatch.setenv("HTTPS_PROXY", "http://secure-proxy:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy:3128")
    assert proxy_for("https://queue", None, True) == "http://secure-proxy:3128"
    assert proxy_for("http://queue", None, True) == "http://plain-proxy:3128"
    assert proxy_for("http://queue", None, False) is None  # trust_env=False
    monkeypatch.setenv("NO_PROXY", "queue,.internal")
    assert proxy_for("http://queue:8000", None, True) is None
    assert proxy_for("http://a.internal", None, True) is None
    assert proxy_for("http://elsewhere", None, True) == "http://plain-proxy:3128"
    with pytest.raises(ValueError, match=r"http://\[user:password@\]host:port, got 'socks5://u:\*\*\*@p:1'"):
        proxy_for("http://queue", "socks5://u:secret@p:1", True)


async def test_text_utf8_cannot_carry_is_refused_in_the_caller_before_anything_is_sent():
    """A lone surrogate (a str decoded with surrogateescape, say): a ValueError naming it at once,
    not a UnicodeEncodeError from the transport, and no attempt (the URL below answers nothing)."""
    with Client("http://127.0.0.1:9", max_retries=0) as client:
        with pytest.raises(ValueError, match=r"cannot send '\\udc80': a lone surrogate"):
            client.send("t", "caf\udc80")
        with pytest.raises(ValueError, match="a lone surrogate"):
            client.nack("t", "m", reason="\ud800")
    async with AsyncClient("http://127.0.0.1:9", max_retries=0) as client:
        with pytest.raises(ValueError, match="a lone surrogate"):
            await client.send_many([{"topic": "t", "msg": "\udfff"}])


def test_client_options_are_checked():
    # An endless or NaN timeout would reach the transports, which cannot wait on it.
    for bad in ({"timeout": 0}, {"timeout": float("inf")}, {"timeout": float("nan")}, {"max_connections": 0},
                {"max_retries": -1}):
        with pytest.raises(ValueError, match="timeout must be above 0 and finite"):
            Client("http://queue", **bad)
        with pytest.raises(ValueError, match="timeout must be above 0 and finite"):
            AsyncClient("http://queue", **bad)


def test_url_and_token_come_from_the_environment_and_the_token_shows_in_no_repr(monkeypatch):
    monkeypatch.setenv("DELAYQUEUE_URL", "http://queue.example:9000/")
    monkeypatch.setenv("DELAYQUEUE_TOKEN", "dq_secret")
    client = Client()
    assert client.base_url == "http://queue.example:9000"
    assert client._headers["Authorization"] == "Bearer dq_secret"
    assert "dq_secret" not in repr(client) and "dq_secret" not in repr(client._settings)
    with Client("http://queue", proxy="http://user:proxy-secret@proxy:3128") as proxied:
        assert "proxy-secret" not in repr(proxied._settings)
    assert Client("http://other", token="dq_2")._headers["Authorization"] == "Bearer dq_2"
    client.close()


def test_a_token_or_password_in_the_url_shows_in_no_repr_nor_error():
    # camellia's SDK takes its token as the path prefix /t/<token>, and this client works with that URL too.
    with Client("http://queue.example:9000/t/dq_in_path") as client:
        # Sent as a bearer header, which the server takes as it takes the prefix: in no URL then.
        assert client._settings.url == "http://queue.example:9000/camellia/delayQueue/"
        assert client._headers["Authorization"] == "Bearer dq_in_path"
        for shown in (repr(client), repr(client._settings)):
            assert "dq_in_path" not in shown
        assert repr(client) == "Client('http://queue.example:9000/t/***')"
    with pytest.raises(ValueError) as refused:  # a password in it: refused, unshown
        Client("http://user:url-secret@queue.example:9000/t/dq_in_path")
    assert "url-secret" not in str(refused.value) and "dq_in_path" not in str(refused.value)
    with pytest.raises(ValueError) as refused:
        Client("ftp://queue.example/t/dq_in_path")
    assert "dq_in_path" not in str(refused.value) and "ftp://queue.example/t/***" in str(refused.value)


def test_merge_batch_places_answers_and_picks_unavailable_and_throttled_items_to_send_again():
    results = [None] * 4
    answered = [Message.from_api(API_MESSAGE), ServerError("message 1: message log unavailable: connection refused"),
                RateLimited("message 2: too many requests", retry_after_ms=5), ServerError("message 3: bug")]
    assert merge_batch(results, [0, 1, 2, 3], answered) == [1, 2]  # unavailable, over a rate limit
    assert results == answered
    assert merge_batch(results, [1], ServerError("unreachable")) == []
    assert results[1].msg == "unreachable"


def test_a_batch_sends_again_its_unavailable_and_throttled_items_after_the_longest_retry_after():
    with Client("http://127.0.0.1:1", max_retries=2, backoff_base=0.001) as client:
        results = [None] * 3
        answered = [ServerError("message 0: redis unavailable: x"), RateLimited("message 1: slow", retry_after_ms=300),
                    RateLimited("message 2: cap")]  # no retryAfterMillis: a cap, not sent again
        assert client._batch_again(results, [0, 1, 2], answered, attempt=0) == ([0, 1], 0.3)
        assert client._batch_again(results, [0, 1, 2], answered, attempt=2) == ([], 0.0)


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


@pytest.mark.parametrize("url", ["ftp://queue.example", "queue.example:8000", "http://", "http://queue.example/a b",
                                 "http://queue\n.example:8000"])
def test_a_server_url_that_is_not_http_is_refused_by_both_clients(url):
    with pytest.raises(ValueError, match="must be http"):
        Client(url)
    with pytest.raises(ValueError, match="must be http"):
        AsyncClient(url)


def test_a_server_url_read_with_whitespace_around_it_is_taken_without_it_by_both_clients(monkeypatch):
    monkeypatch.setenv("DELAYQUEUE_URL", " http://queue.example:9000/\n")  # as a config file's line holds it
    for cls in (Client, AsyncClient):
        client = cls()
        assert (client.base_url, client._settings.url) == (
            "http://queue.example:9000", "http://queue.example:9000/camellia/delayQueue/")


def test_a_server_url_holding_a_user_or_password_is_refused_by_both_clients_without_showing_it():
    # The blocking client dropped them and httpx sent them as Basic auth in place of the token.
    for url in ("http://me:url-secret@queue.example:8000", "https://url-secret@queue.example", "ftp://me:url-secret@q"):
        for cls in (Client, AsyncClient):
            with pytest.raises(ValueError, match="no user or password") as refused:
                cls(url)
            assert "url-secret" not in str(refused.value)


def test_the_methods_defined_once_show_their_own_parameters_and_doc_on_both_clients():
    import inspect

    for client in (Client("http://queue"), AsyncClient("http://queue")):
        assert str(inspect.signature(client.pull)) == (
            "(topic: 'str', *, batch: 'int' = 1, ack_timeout_ms: 'int | None' = None, wait_ms: 'int' = 0)")
        assert client.pull.__name__ == "pull" and "long-polls" in client.pull.__doc__
    assert inspect.iscoroutine(coroutine := AsyncClient("http://queue").topic_infos())
    coroutine.close()  # never awaited: nothing was sent


@pytest.mark.parametrize("argv, stdin, problem", [
    (["send", "t", "a\udcffb"], None, "argument msg: not UTF-8 text"),  # a byte of argv that is not UTF-8
    (["get", "t\udcff", "x"], None, "argument topic: not UTF-8 text"),
    (["dead", "redrive", "t", "--msg-id", "a", "b\udcff"], None, "argument msg_id: not UTF-8 text"),
    (["send", "t", "-"], b"from \xff stdin", "the message is not UTF-8 text"),
    (["send", "t", "x", "--delay", "9" * 400 + "d"], None, "argument --delay: invalid duration"),
    # Longer than a timedelta holds: schedule options go to the client as timedeltas (OverflowError, a traceback).
    (["schedule", "create", "s", "t", "x", "--every", "9" * 10 + "d"], None, "argument --every: invalid duration"),
    (["schedule", "update", "s", "--ttl", "9" * 10 + "d"], None, "argument --ttl: invalid duration"),
])
def test_the_cli_answers_text_it_cannot_send_with_one_usage_line_not_a_traceback(monkeypatch, capsys, argv, stdin,
                                                                                  problem):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), errors="surrogateescape"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["--url", "http://127.0.0.1:9", *argv])  # refused before any request
    assert exited.value.code == 2
    assert problem in capsys.readouterr().err.splitlines()[-1]


def test_httpx_is_imported_by_the_first_asyncclient_not_by_the_sdk_or_a_blocking_client():
    # A blocking client's process (the CLI, a thread worker) never pays the 80 ms of importing httpx.
    script = ("import sys, delayqueue_client, delayqueue_client.cli, delayqueue_client.supervisor\n"
              "delayqueue_client.Client('http://127.0.0.1:9').close()\n"
              "print('httpx' in sys.modules)\n"
              "delayqueue_client.AsyncClient('http://127.0.0.1:9')\n"
              "print('httpx' in sys.modules)\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout.split(), ran.stderr) == (0, ["False", "True"], "")
