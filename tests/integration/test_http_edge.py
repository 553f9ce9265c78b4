"""The HTTP edge under attack: request bodies are capped (chunked or not) and timed, an anonymous
client is refused before its body is read, /metrics serves only this host without a metrics
token, the /t/<token>/ prefix leads only to the queue API and stays out of the logs, answers are
never sniffed or cached, and debug pages hide the datastores' passwords. Attacks on the body go
through a real uvicorn and a raw socket, as a client on the network would send them."""
import contextlib
import io
import re
import secrets
import select
import socket
import subprocess
import sys
import time

import httpx
import pytest
import redis
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.test import RequestFactory, override_settings
from django.views.debug import technical_500_response

from delayqueue.live.keys import namespace_keys
from delayqueue.stores.tokens import token_hash
from tests.helpers import REDIS_URL, ROOT, WebProcess, scanner_env, wait_for

SEND = "/camellia/delayQueue/sendMsg"
LONG_POLL = "/camellia/delayQueue/longPollingMsg"
FORM = {"content-type": "application/x-www-form-urlencoded"}
BODY_CAP = 1_048_576
BODY_TIMEOUT_MILLIS = 1000
MiB = 1_048_576


def new_token(name: str) -> str:
    return call_command_token(name, "produce,consume,manage,monitor")


def held_polls(token: str) -> int:
    """The long polls the token holds, as the web processes count them in Redis (services/caps.py)."""
    with redis.Redis.from_url(REDIS_URL) as client:
        return client.zcard(namespace_keys("edge").long_polls(token_hash(token)))


def call_command_token(name: str, scopes: str) -> str:
    out = io.StringIO()
    call_command("create_token", "--namespace", "edge", "--scopes", scopes, "--name", name, stdout=out)
    return out.getvalue().splitlines()[-1]


@pytest.fixture
def web(clean_state):
    """A real uvicorn with tokens required, a 1 MiB body cap, 1 s header and body timeouts and its access log on."""
    proc = WebProcess("edge", scanner_env(DELAYQUEUE_AUTH="tokens", DELAYQUEUE_MAX_BODY_BYTES=BODY_CAP,
                                          DELAYQUEUE_BODY_TIMEOUT_MILLIS=BODY_TIMEOUT_MILLIS,
                                          DELAYQUEUE_HEADER_TIMEOUT_MILLIS=BODY_TIMEOUT_MILLIS), access_log=True)
    try:
        proc.wait_started()
        yield proc
    finally:
        proc.stop()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def request_head(path: str, headers: dict) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked",
             "Content-Type: application/x-www-form-urlencoded", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def stream_chunked(port: int, path: str, total: int, headers: dict | None = None) -> tuple[int, bytes]:
    """Streams a chunked body of `total` bytes as fast as the server takes it, stopping when the
    server answers or drops the connection. Returns (body bytes sent, the answer's bytes)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(request_head(path, headers or {}) + chunk(b"topic=t&msg="))
    sock.setblocking(False)
    piece, pending, sent, answer = chunk(b"x" * 65_536), b"", 0, b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock] if sent < total else [], [], 1)
            if readable:
                data = sock.recv(65_536)
                if not data:
                    break
                answer += data
                continue
            if writable:
                if not pending:
                    pending = piece if sent + 65_536 < total else piece + b"0\r\n\r\n"
                    sent += 65_536
                pending = pending[sock.send(pending):]
    except OSError:  # reset: the server closed with our body unread
        pass
    finally:
        sock.close()
    return sent, answer


def poll_request(token: str, topic: str) -> bytes:
    """A long poll of 30 s, as a client writes it on its connection."""
    poll = f"topic={topic}&longPollingTimeoutMillis=30000".encode()
    return (f"POST {LONG_POLL} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(poll)}\r\n\r\n").encode() + poll


@contextlib.contextmanager
def held_poll(port: int, token: str, topic: str):
    """A connection whose long poll the server holds."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(poll_request(token, topic))
        wait_for(lambda: held_polls(token) == 1, what="the poll to be held")
        yield sock


def health_check_on(sock: socket.socket) -> None:
    """A health check on the connection, its whole answer read."""
    sock.sendall(b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not answer.endswith(b'{"code":200}'):
        data = sock.recv(65_536)
        assert data, answer
        answer += data
    assert answer.startswith(b"HTTP/1.1 200 "), answer


def read_to_end(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection (a reset, for a request left unread, ends it too)."""
    answers = b""
    try:
        while data := sock.recv(65_536):
            answers += data
    except ConnectionResetError:
        pass
    return answers


def answer_body(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:200]
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    whole = b""
    while True:
        size, _, body = body.partition(b"\r\n")
        if int(size, 16) == 0:
            return whole
        whole, body = whole + body[:int(size, 16)], body[int(size, 16) + 2:]


@pytest.mark.process
def test_an_anonymous_chunked_body_is_refused_before_the_server_reads_it(web):
    total = 256 * MiB
    sent, answer = stream_chunked(web.port, SEND, total)
    # Refused on its (missing) token at once: what the client got through is the sockets'
    # buffers, not the body. Before, the server read all 256 MiB and only then answered 401.
    assert sent < 32 * MiB, sent
    if answer:  # the answer can be lost to the reset of the unread body; the refusal is what matters
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"code":401' in answer_body(answer) and b"connection: close" in answer.lower()
    # The same with a token that is not one: nothing read past the headers either.
    sent, _answer = stream_chunked(web.port, "/t/dq_not-a-token" + SEND, total)
    assert sent < 32 * MiB, sent
    assert httpx.get(web.url + "/camellia/health/check").status_code == 200  # the worker is fine


@pytest.mark.process
def test_a_chunked_body_over_the_cap_is_refused_on_the_admin_path_too(web):
    sent, answer = stream_chunked(web.port, "/admin/login/", 256 * MiB)
    assert sent < 32 * MiB, sent
    if answer:
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert answer_body(answer) == f"request body is over {BODY_CAP} bytes\n".encode()


@pytest.mark.process
def test_a_chunked_body_over_the_cap_with_a_valid_token_is_code_400_naming_the_limit(web):
    token = new_token("big")
    sent, answer = stream_chunked(web.port, SEND, 64 * MiB, {"Authorization": f"Bearer {token}"})
    assert sent < 48 * MiB, sent  # read up to the cap, then refused
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer_body(answer) == b'{"code":400,"msg":"request body is over 1048576 bytes"}'
    under = httpx.post(web.url + SEND, data={"topic": "t", "msg": "x" * (BODY_CAP - 1000), "delayMillis": "0"},
                       headers={"Authorization": f"Bearer {token}"})
    assert under.json()["code"] == 200


@pytest.mark.process
def test_a_client_that_trickles_its_body_is_cut_off_after_the_timeout(web):
    token = new_token("slow")
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
    try:
        sock.sendall(request_head(SEND, {"Authorization": f"Bearer {token}"}) + chunk(b"topic=t&msg="))
        # ... and nothing more: the server must not wait for the rest for ever (before, it did).
        answer = b""
        while data := sock.recv(65_536):
            answer += data
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer_body(answer) == (b'{"code":400,"msg":"request body not received within 1000 ms '
                                   b'(DELAYQUEUE_BODY_TIMEOUT_MILLIS)"}')


@pytest.mark.process
def test_a_client_that_never_finishes_its_headers_is_cut_off_after_the_timeout(web):
    # Nothing; half the headers; a blank line after an answer (it begins no request, and stopped
    # uvicorn's keep-alive timeout). Each on its connection, all at once: the timeouts run together.
    sent = [(False, b""), (False, b"POST /camellia/delayQueue/sendMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
            (True, b"\r\n")]
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.create_connection(("127.0.0.1", web.port), timeout=30)) for _ in sent]
        for sock, (answered, data) in zip(socks, sent):
            if answered:
                health_check_on(sock)
            sock.sendall(data)
        # ... and nothing more: before, uvicorn held each connection for ever (this recv timed out).
        assert [sock.recv(65_536) for sock in socks] == [b""] * len(sent)
    assert httpx.get(web.url + "/camellia/health/check").status_code == 200


@pytest.mark.process
def test_headers_over_the_cap_are_refused_at_once(web):
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000)
        # ... and more to come: before, uvicorn kept every header byte until the header timeout, so a
        # fast client made a worker hold hundreds of MiB (this recv got b"" at the timeout).
        answer = sock.recv(65_536)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    # Whole in one write, first on the connection or after an answer: before, headers that came in
    # one read (up to 256 KiB) were never counted, and these were served.
    big = b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 80_000 + b"\r\n\r\n"
    for answered_first in (False, True):
        with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
            if answered_first:
                health_check_on(sock)
            sock.sendall(big)
            answer = read_to_end(sock)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert httpx.get(web.url + "/camellia/health/check", headers={"X-Big": "a" * 8000}).status_code == 200


@pytest.mark.process
def test_a_request_refused_behind_others_is_answered_after_them(web):
    check = b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    big = b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 80_000 + b"\r\n\r\n"
    for refused, status in ((b"NOT HTTP AT ALL\r\n\r\n", b"400"), (big, b"431")):
        with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
            sock.sendall(check * 2 + refused)
            answers = read_to_end(sock)
        # Before, the refusal was written at once, read as the first request's answer, and the answers
        # of both were lost (for a sendMsg: the message sent, the client told 400, and sending it again).
        assert re.findall(rb"HTTP/1.1 (\d+) ", answers) == [b"200", b"200", status], answers


@pytest.mark.process
@pytest.mark.parametrize("together", [True, False], ids=["in one write", "after the poll is held"])
def test_a_held_long_poll_with_a_request_pipelined_behind_it_stops_when_the_client_hangs_up(web, together):
    token = new_token("piped")
    auth = {"Authorization": f"Bearer {token}"}
    behind = b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(poll_request(token, "piped") + (behind if together else b""))
        wait_for(lambda: held_polls(token) == 1, what="the poll to be held")  # the GET waits behind it
        if not together:
            # Before, the GET's arrival stopped the reading (uvicorn queues a pipelined request so),
            # and nothing read again: the hang-up went unseen until the poll's 30 s were over.
            sock.sendall(behind)
            time.sleep(0.5)
    wait_for(lambda: held_polls(token) == 0, what="the hang-up to end the held poll")
    # Before, uvicorn told only the GET of the hang-up: the poll held on, took this message for a
    # client that was gone, and left it consuming until its ack timeout.
    sent = httpx.post(web.url + SEND, data={"topic": "piped", "msg": "m", "delayMillis": "0"}, headers=auth)
    polled = httpx.post(web.url + LONG_POLL, data={"topic": "piped", "longPollingTimeoutMillis": "5000"},
                        headers=auth, timeout=30)
    assert [m["msgId"] for m in polled.json()["delayMsgList"]] == [sent.json()["delayMsg"]["msgId"]]


@pytest.mark.process
def test_requests_pipelined_behind_a_held_long_poll_are_answered_in_order_when_it_ends(web):
    token = new_token("queued")
    with held_poll(web.port, token, "queued") as sock:
        for i in range(20):  # more than the protocol reads on while they wait
            sock.sendall(f"GET /camellia/health/check?n={i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        sent = httpx.post(web.url + SEND, data={"topic": "queued", "msg": "m", "delayMillis": "0"},
                          headers={"Authorization": f"Bearer {token}"})
        answers = b""
        while answers.count(b"HTTP/1.1 200 ") < 21:
            data = sock.recv(65_536)
            assert data, answers
            answers += data
    first, _, rest = answers.partition(b"HTTP/1.1 200 ")[2].partition(b"HTTP/1.1 200 ")
    assert sent.json()["delayMsg"]["msgId"].encode() in first  # the poll's answer came first
    assert rest.count(b"HTTP/1.1 200 ") == 19


@pytest.mark.process
def test_thousands_of_requests_pipelined_behind_a_held_long_poll_do_not_stall_the_worker(web):
    token = new_token("flood")
    with held_poll(web.port, token, "flood") as sock:
        # As many as the sockets' buffers take at once: the server reads on only while few wait.
        sock.setblocking(False)
        flood, sent = b"GET /camellia/health/check HTTP/1.1\r\n\r\n" * 50_000, 0
        with contextlib.suppress(BlockingIOError):
            while sent < len(flood):
                sent += sock.send(flood[sent:])
        assert sent > 300_000, sent  # more than a read (256 KiB)
        httpx.post(web.url + SEND, data={"topic": "flood", "msg": "m", "delayMillis": "0"},
                   headers={"Authorization": f"Bearer {token}"})  # the poll answers: the flood is read
        # Before, every read of them (thousands at once) cost the worker seconds, growing: this timed out.
        checked = httpx.get(web.url + "/camellia/health/check", timeout=3)
        assert checked.status_code == 200


@pytest.mark.process
def test_an_http_1_0_client_gets_the_queue_api_answers_unchunked(web):
    token = new_token("old")
    for request in (b"GET /camellia/health/check HTTP/1.0\r\n\r\n",
                    f"GET /t/{token}/camellia/delayQueue/getTopicInfoList HTTP/1.0\r\n\r\n".encode()):
        with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
            sock.sendall(request)
            head, _, body = read_to_end(sock).partition(b"\r\n\r\n")
        # An HTTP/1.0 client knows no chunked encoding: before, it read the chunks' sizes as the answer.
        assert b"transfer-encoding" not in head.lower(), head
        assert f"content-length: {len(body)}".encode() in head.lower() and body.startswith(b'{"code":200'), body


@pytest.mark.process
def test_a_websocket_handshake_is_refused_not_a_server_error(web):
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(b"GET /camellia/health/check HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        answer = sock.recv(65_536)
    # Before, Django's handler raised ValueError on the websocket scope: HTTP 500 and a traceback logged.
    assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
    assert "Traceback" not in web.output()


@pytest.mark.process
def test_token_prefixes_stay_out_of_the_access_log_and_lead_only_to_the_queue_api(web):
    token = new_token("logged")
    sent = httpx.post(f"{web.url}/t/{token}{SEND}", data={"topic": "t", "msg": "m", "delayMillis": "0"})
    assert sent.json()["code"] == 200
    for path in ("metrics", "admin/login/", "api/docs/"):
        assert httpx.get(f"{web.url}/t/{token}/{path}").status_code == 404
    logged = wait_for(lambda: (out := web.output()).count(" 404") >= 3 and out, what="the access log lines")
    assert f"/camellia/delayQueue/sendMsg" in logged and "/t/-/metrics" in logged
    assert token not in logged


# --- In process


@pytest.fixture
def tokens_on(settings, clean_state):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH": "tokens"}


def client_from(address: str) -> httpx.AsyncClient:
    from project.asgi import application

    transport = httpx.ASGITransport(app=application, client=(address, 40_000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30)


@pytest.mark.usefixtures("tokens_on")
async def test_an_anonymous_body_is_not_read_at_all(api):
    pulled = []

    async def body():
        for _ in range(1000):
            pulled.append(1)
            yield b"x" * 65_536

    refused = await api.post(SEND, content=body(), headers=FORM)
    assert refused.json()["code"] == 401 and refused.headers["connection"] == "close"
    assert pulled == []
    # Nor by what takes no body: a preflight, the health endpoints (online and offline take a credential).
    for method, path, status, answer in (("OPTIONS", SEND, 200, {"code": 400, "msg": "method OPTIONS not allowed, "
                                                                                      "use GET or POST"}),
                                         ("POST", "/camellia/health/online", 401, {"code": 401}),
                                         ("POST", "/camellia/health/offline", 401, {"code": 401}),
                                         ("POST", "/camellia/health/check", 200, {"code": 200})):
        answered = await api.request(method, path, content=body(), headers=FORM)
        assert (answered.status_code, answered.json(), answered.headers["connection"]) == (status, answer, "close")
        assert pulled == [], path
    checked = await api.get("/camellia/health/check")  # without a body the connection stays open
    assert checked.status_code == 200 and "connection" not in checked.headers


@pytest.mark.usefixtures("tokens_on")
async def test_a_refusal_given_before_the_body_passes_the_edge_checks_as_any_answer(api, settings):
    app = "https://app.example.com"
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "ALLOWED_ORIGINS": app}
    refused = await api.post(SEND, data={"topic": "t"}, headers={"Origin": app, "Sec-Fetch-Site": "cross-site"})
    assert refused.json()["code"] == 401
    assert refused.headers["access-control-allow-origin"] == app  # the page can read why
    elsewhere = await api.post(SEND, data={"topic": "t"}, headers={"Host": "attacker.example"})
    assert elsewhere.json() == {"code": 400, "msg": "Host 'attacker.example' is not allowed: it is not in ALLOWED_HOSTS"}
    preflight = await api.options(SEND, headers={"Origin": app, "Sec-Fetch-Site": "cross-site",
                                                 "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == app


async def test_an_origin_that_is_no_url_is_refused_not_a_server_error(api):
    # "http://[::1" is no URL to urlsplit (ValueError): it was answered HTTP 500 with a traceback in the log.
    for headers in ({"Origin": "http://[::1"}, {"Origin": "http://[::1", "Sec-Fetch-Site": "same-origin"}):
        refused = await api.get("/camellia/delayQueue/getTopicInfoList", headers=headers)
        assert refused.status_code == 200 and refused.json()["code"] == 403, refused.text


@pytest.mark.usefixtures("tokens_on")
async def test_a_long_poll_refused_for_its_token_answers_after_a_pause(api):
    for headers in ({}, {"Authorization": "Bearer dq_wrong"}):
        started = time.monotonic()
        refused = await api.post("/camellia/delayQueue/longPollingMsg", data={"topic": "t"}, headers=headers)
        assert refused.json()["code"] == 401
        assert time.monotonic() - started >= 0.9  # the behaviour itself: a blind retry loop cannot spin


@pytest.mark.usefixtures("tokens_on")
async def test_a_long_poll_refused_for_its_scope_its_parameters_or_its_host_answers_after_a_pause(api):
    """camellia's SDK polls again at once on any answer but code 200: a long poll answered an error
    at once (a produce-only token: 403; a bad batch, a Host not in ALLOWED_HOSTS: 400) made it spin."""
    producer = await sync_to_async(call_command_token)("edge-producer", "produce")
    consumer = await sync_to_async(call_command_token)("edge-consumer", "consume")
    for token, data, code, host in ((producer, {"topic": "t"}, 403, "127.0.0.1"),
                                    (consumer, {"topic": "t", "batch": "x"}, 400, "127.0.0.1"),
                                    (consumer, {"topic": "t"}, 400, "not-allowed.example")):
        started = time.monotonic()
        refused = await api.post(LONG_POLL, data=data, headers={"Authorization": f"Bearer {token}", "Host": host})
        assert refused.json()["code"] == code
        assert time.monotonic() - started >= 0.9  # the behaviour itself: a blind retry loop cannot spin


async def test_a_message_of_a_hundred_kilobytes_is_taken_by_default(api):
    sent = await api.post(SEND, data={"topic": "t", "msg": "x" * 100_000, "delayMillis": "0"})
    assert sent.json()["code"] == 200


async def test_a_batch_over_the_body_cap_is_refused_naming_the_cap(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    batch = [{"topic": "t", "msg": "x" * 1000, "delayMillis": 0} for _ in range(20)]

    async def body():  # chunked: no Content-Length to check
        yield b'{"messages": ['
        for i, item in enumerate(batch):
            yield (b"," if i else b"") + httpx.Response(200, json=item).content
        yield b"]}"

    refused = await api.post("/camellia/delayQueue/sendMsgBatch", content=body(),
                             headers={"content-type": "application/json"})
    assert refused.json() == {"code": 400, "msg": "request body is over 10000 bytes"}


async def test_metrics_and_docs_serve_only_this_host_without_a_metrics_token(api):
    for path in ("/metrics", "/api/schema/"):
        assert (await api.get(path)).status_code == 200  # 127.0.0.1
        async with client_from("::1") as local:
            assert (await local.get(path)).status_code == 200
        async with client_from("203.0.113.9") as remote:
            refused = await remote.get(path)
            assert refused.status_code == 403 and "DELAYQUEUE_METRICS_TOKEN" in refused.text
        # Through a proxy on this host every peer is loopback: a forwarded request is not trusted.
        for header in ({"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-For": "203.0.113.9"},
                       {"Forwarded": "for=127.0.0.1"}):
            assert (await api.get(path, headers=header)).status_code == 403


async def test_metrics_token_serves_any_address(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "METRICS_TOKEN": "m-token-1"}
    async with client_from("203.0.113.9") as remote:
        assert (await remote.get("/metrics")).status_code == 401
        assert (await remote.get("/metrics", headers={"Authorization": "Bearer m-token-1"})).status_code == 200


async def test_wrong_metrics_tokens_count_against_the_address_failure_limit(api, settings):
    """A guess at DELAYQUEUE_METRICS_TOKEN is a failed token like a wrong API token: counted per
    address with them, and an address past DELAYQUEUE_AUTH_FAILURE_LIMIT is refused (429)."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "METRICS_TOKEN": "m-token-1", "AUTH": "tokens",
                           "AUTH_FAILURE_LIMIT": 3}
    wrong = {"Authorization": "Bearer m-token-2"}
    async with client_from("203.0.113.9") as guesser, client_from("203.0.113.10") as other:
        assert (await guesser.post(SEND, data={"topic": "t"}, headers={"Authorization": "Bearer dq_nope"})
                ).json()["code"] == 401  # a wrong API token: one failure
        for path in ("/metrics", "/api/schema/"):
            assert (await guesser.get(path, headers=wrong)).status_code == 401
        for path in ("/metrics", "/api/docs/"):
            refused = await guesser.get(path, headers=wrong)
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, path
            assert "too many invalid" in refused.text
        assert (await guesser.post(SEND, data={"topic": "t"}, headers={"Authorization": "Bearer dq_nope2"})
                ).json()["code"] == 429  # and the other way round
        assert (await guesser.get("/metrics")).status_code == 401  # no token at all: no guess
        assert (await guesser.get("/metrics", headers={"Authorization": "Bearer m-token-1"})).status_code == 200
        assert (await other.get("/metrics", headers=wrong)).status_code == 401


@pytest.mark.process
def test_the_web_process_warns_at_start_of_a_metrics_token_short_enough_to_guess():
    def start(token: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import project.asgi"], cwd=ROOT, capture_output=True,
                              env=dict(scanner_env(), DELAYQUEUE_METRICS_TOKEN=token), text=True, timeout=60)

    short, long_enough = start("m-token-1"), start("m" * 32)
    assert short.returncode == 0 and "DELAYQUEUE_METRICS_TOKEN has 9 characters" in short.stderr
    assert "m-token-1" not in short.stderr
    assert long_enough.returncode == 0 and "DELAYQUEUE_METRICS_TOKEN" not in long_enough.stderr


async def test_a_token_prefix_before_anything_but_the_queue_api_is_no_page(api):
    for path in ("/t/anything/metrics", "/t/x/api/schema/", "/t/x/admin/", "/t/x", "/t/"):
        response = await api.get(path)
        assert response.status_code == 404, path
        assert "delayqueue_" not in response.text
    served = await api.post("/t/anything" + SEND, data={"topic": "t", "msg": "m", "delayMillis": "0"})
    assert served.json()["code"] == 200  # open mode: the prefix is taken and ignored


async def test_api_and_health_answers_are_never_sniffed_or_cached(api):
    answers = [
        await api.post(SEND, data={"topic": "t", "msg": "m", "delayMillis": "0"}),
        await api.post(SEND, data={"topic": "", "msg": "m"}),  # an error
        await api.get("/camellia/health/status"),
        await api.get("/camellia/health/check"),
        await api.get("/camellia/nothing-here"),
    ]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff", answer.request.url
        assert answer.headers["cache-control"] == "no-store", answer.request.url
    assert (await api.get("/admin/login/")).headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware


class Unshown(list):
    def __repr__(self):
        return "<the passwords>"


def test_debug_error_pages_hide_the_datastores_passwords():
    # Made at run time (the page shows this test's source lines) and not shown as this frame's variable.
    passwords = Unshown(f"pw{i}-{secrets.token_hex(8)}" for i in range(5))
    redis_url = f"redis://:{passwords[0]}@10.0.0.5:6379/0"
    database_url = f"postgres://dq:{passwords[1]}@10.0.0.6:5432/delayqueue"
    cluster = f"redis-cluster://:{passwords[2]}@10.0.0.7:7000,10.0.0.8:7000"
    sentinel = f"redis+sentinel://:{passwords[3]}@10.0.0.9:26379/mymaster?sentinel_password={passwords[4]}"
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": redis_url}}
    with override_settings(DEBUG=True, REDIS_URL=redis_url, DATABASE_URL=database_url, CACHES=caches,
                           OTHER_URLS=[cluster, sentinel]):
        request = RequestFactory().get("/admin/")
        config_in_a_frame = {"redis_url": redis_url, "database_url": database_url}  # noqa: F841  (shown as a local)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            page = technical_500_response(request, *sys.exc_info()).content.decode()
    assert "boom" in page and "10.0.0.5:6379" in page  # the page still shows where
    for password in passwords:
        assert password not in page, password


async def test_a_token_never_reaches_our_log_lines(api, caplog, tokens_on):
    token = await sync_to_async(new_token)("quiet")
    await api.post(f"/t/{token}{SEND}", data={"topic": "t", "msg": "m", "delayMillis": "0"})
    await api.get(f"/t/{token}/metrics")
    await api.get(f"/t/{token}/camellia/delayQueue/noSuchThing")
    ours = [record for record in caplog.records if not record.name.startswith(("httpx", "httpcore"))]  # the client's
    assert ours and not [record for record in ours if token in record.getMessage()]
