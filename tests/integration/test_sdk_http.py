"""The clients' transport (sdk/python/delayqueue_client/_http.py) against real socket servers that
misbehave as servers and proxies do: closing a kept-alive connection as a request arrives (and one
idle past MAX_IDLE_SECONDS not reused), closing without an answer, never answering, a proxy
answering 502/503/504 in front of the real server; a forward proxy from the environment or the
options; the blocking pool's bound; TLS verification and client certificates."""
import asyncio
import http.server
import json
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from delayqueue_client import AsyncClient, Client, MaybeApplied, ServerError, Unavailable, _http

from tests.helpers import wait_for

ENVELOPE = json.dumps({"code": 200, "msg": "success", "data": {"topic": "t"}, "done": True}).encode()


class RawServer:
    """Accepts connections on a thread each; `behave(conn, nth_request_on_conn)` answers or not."""

    def __init__(self, behave):
        self.behave = behave
        self.requests = 0
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            nth = 0
            while read_request(conn):
                self.requests += 1
                nth += 1
                if not self.behave(conn, nth):
                    return

    def close(self):
        self._sock.close()


def read_request(conn) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)
    return True


def answer(conn, envelope: bytes = ENVELOPE) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(envelope), envelope))
    return True


@pytest.fixture
def serve():
    servers = []

    def start(behave):
        servers.append(RawServer(behave))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_kept_alive_connection_closed_as_the_request_arrives_is_replaced_and_the_call_made_once(serve):
    # The second request on each connection is read and dropped unanswered, as by a server closing
    # an idle connection: the request was not processed, so even an ack may go again, once.
    server = serve(lambda conn, nth: answer(conn) if nth == 1 else False)
    with Client(server.url, max_retries=0) as client:
        assert client.topic_info("t") == {"topic": "t"}
        assert client.ack("t", "m1") is True
        assert server.connections == 2 and server.requests == 3


async def test_the_async_client_too_makes_a_call_once_more_on_a_new_connection_when_a_kept_alive_one_closed(serve):
    server = serve(lambda conn, nth: answer(conn) if nth == 1 else False)
    async with AsyncClient(server.url, max_retries=0) as client:
        assert await client.topic_info("t") == {"topic": "t"}
        assert await client.ack("t", "m1") is True
        assert server.connections == 2 and server.requests == 3


async def test_both_clients_replace_a_connection_idle_past_max_idle_seconds_rather_than_reuse_it(serve, monkeypatch):
    # Servers close idle connections (uvicorn after 5 s): a request written into one as it closes is
    # lost, and for an ack that is MaybeApplied. So neither client reuses one idle that long.
    monkeypatch.setattr(_http, "MAX_IDLE_SECONDS", 0.2)
    server = serve(lambda conn, nth: answer(conn))
    with Client(server.url) as client:
        client.topic_info("t")
        client.topic_info("t")
        assert server.connections == 1  # kept alive while fresh
        time.sleep(0.5)  # idle past MAX_IDLE_SECONDS: the input here
        client.topic_info("t")
        assert server.connections == 2
    async with AsyncClient(server.url) as async_client:
        await async_client.topic_info("t")
        await async_client.topic_info("t")
        assert server.connections == 3
        await asyncio.sleep(0.5)
        await async_client.topic_info("t")
        assert server.connections == 4


def test_an_answer_cut_after_it_began_on_a_kept_alive_connection_is_not_sent_again(serve):
    def cut_second(conn, nth):
        if nth == 1:
            return answer(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"code\"")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not a clean close
        return False

    server = serve(cut_second)
    with Client(server.url, max_retries=2, backoff_base=0.001) as client:
        assert client.topic_info("t") == {"topic": "t"}
        with pytest.raises(MaybeApplied, match="may have been applied"):
            client.ack("t", "m1")  # the server may have acked it: not sent again
        assert server.requests == 2


def test_a_connection_closed_without_an_answer_fails_a_fresh_call_and_is_retried_only_when_idempotent(serve):
    server = serve(lambda conn, nth: False)
    with Client(server.url, max_retries=2, backoff_base=0.001) as client:
        with pytest.raises(MaybeApplied, match="may have been applied: RemoteDisconnected"):
            client.ack("t", "m1")
        assert server.requests == 1  # an ack is not idempotent: it may have been taken
        with pytest.raises(Unavailable, match="unreachable: RemoteDisconnected"):
            client.topic_info("t")
        assert server.requests == 1 + 3


def test_a_server_that_never_answers_times_out(serve):
    hold = threading.Event()
    server = serve(lambda conn, nth: hold.wait(30) and False)
    with Client(server.url, timeout=0.3, max_retries=0) as client:
        started = time.monotonic()
        with pytest.raises(ServerError, match="unreachable: (TimeoutError|timeout)"):
            client.topic_info("t")
        assert 0.3 <= time.monotonic() - started < 5
    hold.set()


class NeverAccepts:
    """A listening socket whose backlog one connection fills: the kernel answers no other's SYN, so
    connecting waits, as to a server too busy to accept."""

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0)
        self._filler = socket.create_connection(self._sock.getsockname())
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self):
        self._filler.close()
        self._sock.close()


def second_of_two_calls(url: str, in_async: bool, **options) -> tuple[float, BaseException | None]:
    """Two topic_info calls on one client (one connection at most), the second 0.5 s after the
    first: how long the second took, and what it raised."""
    async def on_async():
        async with AsyncClient(url, max_connections=1, **options) as client:
            first = asyncio.create_task(client.topic_info("t"))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            second = (await asyncio.gather(client.topic_info("t"), return_exceptions=True))[0]
            took = time.monotonic() - started
            await asyncio.gather(first, return_exceptions=True)
            return took, second

    if in_async:
        return asyncio.run(on_async())
    with Client(url, max_connections=1, **options) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.topic_info, "t")
        time.sleep(0.5)
        started = time.monotonic()
        try:
            client.topic_info("t")
        except Exception as exc:
            return time.monotonic() - started, exc
        finally:
            first.exception(timeout=30)
        return time.monotonic() - started, None


@pytest.mark.parametrize("in_async", [False, True], ids=["Client", "AsyncClient"])
@pytest.mark.parametrize("server_kind", ["never answers", "never accepts"])
def test_the_timeout_bounds_an_attempt_with_its_wait_for_a_free_connection(serve, server_kind, in_async):
    # The first call holds the one connection for its whole timeout (1 s); the second waits half
    # of its own for it, and has only the other half left for its request.
    hold = threading.Event()
    server = serve(lambda conn, nth: hold.wait(30) and False) if server_kind == "never answers" else NeverAccepts()
    try:
        took, raised = second_of_two_calls(server.url, in_async, timeout=1.0, max_retries=0)
    finally:
        hold.set()
        server.close()
    assert isinstance(raised, Unavailable)
    assert 0.4 <= took < 1.25


def trickle(conn, nth):
    """Answers a byte every 20 ms: every read gets something well within any timeout."""
    try:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                len(ENVELOPE), ENVELOPE):
            conn.sendall(bytes([byte]))
            time.sleep(0.02)
    except OSError:  # the client gave up
        return False
    return True


@pytest.mark.parametrize("in_async", [False, True], ids=["Client", "AsyncClient"])
def test_the_timeout_bounds_an_attempt_whose_answer_trickles_in(serve, in_async):
    server = serve(trickle)
    call = both_clients(server.url, timeout=0.5, max_retries=0)[1][in_async]
    started = time.monotonic()
    with pytest.raises(Unavailable, match="unreachable: .*(TimeoutError|timed out|Timeout)"):
        call("topic_info", "t")
    assert time.monotonic() - started < 0.8


def test_an_answer_closing_its_connection_is_read_whole_however_many_pieces_it_comes_in(serve):
    # http.client closes such a connection's socket as the headers are read: the answer's reader
    # must keep it open until the body is read.
    big = json.dumps({"code": 200, "msg": "success", "data": {"pad": "x" * 300_000}}).encode()

    def in_pieces(conn, nth):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(big))
        for start in range(0, len(big), 50_000):
            time.sleep(0.02)
            conn.sendall(big[start:start + 50_000])
        return False

    server = serve(in_pieces)
    for call in both_clients(server.url, max_retries=0)[1]:
        assert len(call("topic_info", "t")["pad"]) == 300_000


def test_a_long_poll_waits_its_wait_beyond_the_client_timeout(serve):
    def slow(conn, nth):
        time.sleep(0.6)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(b'{"code":200,"msg":"success","delayMsgList":[]}'), b'{"code":200,"msg":"success","delayMsgList":[]}'))
        return True

    server = serve(slow)
    with Client(server.url, timeout=0.3, max_retries=0) as client:
        assert client.pull("t", wait_ms=1000) == []


async def test_the_async_client_retries_as_the_blocking_one(serve):
    server = serve(lambda conn, nth: False)  # reads each request, closes without an answer
    async with AsyncClient(server.url, max_retries=2, backoff_base=0.001) as client:
        with pytest.raises(MaybeApplied, match="may have been applied: RemoteProtocolError"):
            await client.ack("t", "m1")
        assert server.requests == 1  # not idempotent: it may have been taken
        with pytest.raises(Unavailable, match="unreachable: RemoteProtocolError"):
            await client.topic_info("t")
        assert server.requests == 1 + 3
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, never listening: refused before anything was sent
        async with AsyncClient(f"http://127.0.0.1:{holder.getsockname()[1]}", max_retries=1,
                               backoff_base=0.001) as client:
            with pytest.raises(Unavailable, match="unreachable: ConnectError"):
                await client.ack("t", "m1")  # refused: never sent, so not MaybeApplied


class Proxy:
    """A threaded HTTP proxy in front of the real server: forwards each POST (an absolute URL, as a
    client configured with a forward proxy sends it, or a path, as to a reverse proxy in front of
    `upstream`) unless told to answer `status` with an HTML page, as nginx does when the server is
    down. Records what it was asked."""

    def __init__(self, upstream: str | None = None):
        self.upstream, self.fail_next, self.status, self.seen = upstream, 0, 502, []
        self.refuse_tunnels = False  # answer CONNECT 407, as a proxy wanting other credentials does
        self.tunnel_delay = 0.0  # seconds before a tunnel opens
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                proxy.seen.append(self.path)
                if proxy.fail_next:
                    proxy.fail_next -= 1
                    return self.answer(proxy.status, b"<html><body>gateway trouble</body></html>", "text/html")
                target = self.path if self.path.startswith("http://") else proxy.upstream + self.path
                passed = {k: v for k, v in self.headers.items()
                          if k.lower() not in ("host", "connection", "proxy-connection", "accept-encoding")}
                request = urllib.request.Request(target, body, passed)
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30) as up:
                    self.answer(up.status, up.read(), up.headers["Content-Type"])

            def do_CONNECT(self):  # a tunnel, for https:// through the proxy
                proxy.seen.append(f"CONNECT {self.path}")
                if proxy.refuse_tunnels:
                    self.send_response(407)
                    self.send_header("Proxy-Authenticate", 'Basic realm="proxy"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                host, port = self.path.rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)), timeout=30)
                time.sleep(proxy.tunnel_delay)
                self.send_response(200)
                self.end_headers()
                pipes = [threading.Thread(target=pipe, args=ends, daemon=True)
                         for ends in ((self.connection, upstream), (upstream, self.connection))]
                for each in pipes:
                    each.start()
                for each in pipes:
                    each.join()
                self.close_connection = True

            def answer(self, status, content, content_type):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


def pipe(source, target):
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def proxy():
    proxies = []

    def start(upstream=None):
        proxies.append(Proxy(upstream))
        return proxies[-1]

    yield start
    for each in proxies:
        each.close()


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def both_clients(url, **options):
    """A Client and an AsyncClient behind one blocking interface: call(name, *args) runs the method."""
    sync = Client(url, **options)

    async def on_async(name, args, kwargs):
        async with AsyncClient(url, **options) as client:
            return await getattr(client, name)(*args, **kwargs)

    def call_sync(name, *args, **kwargs):
        return getattr(sync, name)(*args, **kwargs)

    def call_async(name, *args, **kwargs):
        return asyncio.run(on_async(name, args, kwargs))
    return sync, (call_sync, call_async)


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_proxy_failing_a_send_is_retried_and_the_message_stored_once_in_both_clients(sdk_server, proxy, status,
                                                                                      no_proxy_env):
    gateway = proxy(sdk_server)
    gateway.status = status
    sync, calls = both_clients(gateway.url, max_retries=3, backoff_base=0.001)
    with sync:
        for n, call in enumerate(calls):
            gateway.fail_next, gateway.seen = 2, []
            sent = call("send", "proxied", "body", msg_id=f"p{status}-{n}")
            assert len(gateway.seen) == 3  # two 5xx pages, then the send that went through
            assert sync.get("proxied", sent.msg_id) == sent
        assert sync.topic_info("proxied")["readyQueueSize"] == 2  # each stored once


def test_a_proxy_failure_to_an_ack_is_maybe_applied_and_not_sent_again_a_read_unavailable(sdk_server, proxy,
                                                                                         no_proxy_env):
    gateway = proxy(sdk_server)
    sync, calls = both_clients(gateway.url, max_retries=2, backoff_base=0.001)
    with sync:
        for call in calls:
            gateway.fail_next, gateway.seen = 100, []
            with pytest.raises(MaybeApplied, match="ackMsg: the answer was lost, the call may have been applied: "
                                                   "HTTP 502 answer, not the API's envelope"):
                call("ack", "t", "m1")
            assert len(gateway.seen) == 1  # the proxy may have passed it on: not sent twice
            with pytest.raises(Unavailable, match="HTTP 502 answer"):
                call("topic_info", "t")
            assert len(gateway.seen) == 1 + 3


def test_both_clients_go_through_the_proxy_of_the_environment_unless_no_proxy_or_told_otherwise(sdk_server, proxy,
                                                                                               no_proxy_env):
    forward = proxy()
    no_proxy_env.setenv("HTTP_PROXY", forward.url)
    sync, calls = both_clients(sdk_server)
    with sync:
        for n, call in enumerate(calls):
            forward.seen = []
            call("send", "via", "x", msg_id=f"env-{n}")
            assert forward.seen == [f"{sdk_server}/camellia/delayQueue/sendMsg"]  # the absolute URL, as to a proxy
        no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
        for call in both_clients(sdk_server)[1]:
            forward.seen = []
            call("get", "via", "env-0")
            assert forward.seen == []  # NO_PROXY covers the host: direct
        no_proxy_env.delenv("NO_PROXY")
        for call in both_clients(sdk_server, trust_env=False)[1]:
            call("get", "via", "env-0")
            assert forward.seen == []
        no_proxy_env.delenv("HTTP_PROXY")
        for call in both_clients(sdk_server, proxy=forward.url)[1]:
            forward.seen = []
            assert call("get", "via", "env-1").msg_id == "env-1"
            assert forward.seen == [f"{sdk_server}/camellia/delayQueue/getMsg"]


def test_the_blocking_pool_opens_at_most_max_connections_and_a_call_waits_for_a_free_one(serve):
    release = threading.Event()
    server = serve(lambda conn, nth: release.wait(30) and answer(conn))
    with Client(server.url, max_connections=2, max_retries=0, timeout=20) as client, ThreadPoolExecutor(5) as pool:
        calls = [pool.submit(client.topic_info, "t") for _ in range(5)]
        wait_for(lambda: server.requests == 2, what="two calls held by the server")
        release.set()
        assert [c.result(timeout=30) for c in calls] == [{"topic": "t"}] * 5
        assert server.connections == 2  # the three others waited for one of the two


async def test_the_async_client_opens_at_most_max_connections_too(serve):
    release = threading.Event()
    server = serve(lambda conn, nth: release.wait(30) and answer(conn))
    async with AsyncClient(server.url, max_connections=2, max_retries=0, timeout=20) as client:
        calls = [asyncio.create_task(client.topic_info("t")) for _ in range(5)]
        while server.requests < 2:
            await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(*calls) == [{"topic": "t"}] * 5
        assert server.connections == 2


def test_a_call_finding_no_free_connection_within_its_timeout_is_unavailable_never_sent(serve):
    release = threading.Event()
    server = serve(lambda conn, nth: release.wait(30) and answer(conn, b'{"code":200,"delayMsgList":[]}'))
    with Client(server.url, max_connections=1, max_retries=0, timeout=0.5) as client, ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.pull, "t", wait_ms=20_000)  # a long poll holds the one connection
        wait_for(lambda: server.requests == 1, what="the long poll at the server")
        with pytest.raises(Unavailable, match="PoolTimeout: all 1 connections busy"):
            client.ack("t", "m1")  # not sent at all, so not MaybeApplied
        assert server.requests == 1
        release.set()
        assert held.result(timeout=30) == []


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    where = tmp_path_factory.mktemp("tls")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=test CA", cwd=where)
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=where)
        (where / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=where)
    return where


class TLSServer(RawServer):
    """RawServer over TLS; with client_ca, a client certificate signed by it is required."""

    def __init__(self, behave, certificates, client_ca: bool):
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certificates / "server.pem", certificates / "server.key")
        if client_ca:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(certificates / "ca.pem")
        super().__init__(behave)
        self.url = self.url.replace("http://", "https://")

    def _serve(self, conn):
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()
            return
        super()._serve(tls)


@pytest.mark.parametrize("client_ca", [False, True])
def test_both_clients_verify_the_server_certificate_against_a_ca_and_send_a_client_certificate(
        certificates, client_ca, no_proxy_env):
    server = TLSServer(answer_all, certificates, client_ca)
    ca, cert = str(certificates / "ca.pem"), (str(certificates / "client.pem"), str(certificates / "client.key"))
    try:
        for call in both_clients(server.url, max_retries=0)[1]:  # the system's CAs do not know this one
            with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
                call("topic_info", "t")
        for options in ({"verify": ca}, {"verify": False}):
            for call in both_clients(server.url, max_retries=0, **options, cert=cert if client_ca else None)[1]:
                assert call("topic_info", "t") == {"topic": "t"}
        if client_ca:
            for call in both_clients(server.url, max_retries=0, verify=ca)[1]:
                with pytest.raises(Unavailable):  # no client certificate: the server ends the handshake
                    call("topic_info", "t")
    finally:
        server.close()


def answer_all(conn, nth):
    return answer(conn)


def test_https_goes_through_the_proxy_in_a_connect_tunnel_in_both_clients(certificates, proxy, no_proxy_env):
    server = TLSServer(answer_all, certificates, client_ca=False)
    forward = proxy()
    try:
        for call in both_clients(server.url, max_retries=0, verify=str(certificates / "ca.pem"), proxy=forward.url)[1]:
            forward.seen = []
            assert call("topic_info", "t") == {"topic": "t"}
            assert forward.seen == [f"CONNECT {server.url.removeprefix('https://')}"]  # the server's TLS inside
    finally:
        server.close()


@pytest.mark.parametrize("in_async", [False, True], ids=["Client", "AsyncClient"])
def test_the_timeout_bounds_a_tls_handshake_begun_after_a_slow_tunnel(serve, proxy, no_proxy_env, in_async):
    # The proxy takes 1.5 s of the 2 s to open the tunnel, and the server behind it never answers
    # the handshake: the handshake has the half second left, not a timeout of its own.
    silent = serve(lambda conn, nth: False)  # takes the TLS hello for the start of a request that never ends
    forward = proxy()
    forward.tunnel_delay = 1.5
    call = both_clients(silent.url.replace("http://", "https://"), timeout=2.0, max_retries=0,
                        proxy=forward.url)[1][in_async]
    started = time.monotonic()
    with pytest.raises(Unavailable, match="unreachable: .*(TimeoutError|timed out|Timeout)"):
        call("topic_info", "t")
    assert 1.5 <= time.monotonic() - started < 2.9


def test_a_tunnel_the_proxy_refuses_is_unavailable_in_both_clients_even_for_an_ack(certificates, proxy, no_proxy_env):
    server = TLSServer(answer_all, certificates, client_ca=False)
    forward = proxy()
    forward.refuse_tunnels = True
    try:
        for call in both_clients(server.url, max_retries=1, backoff_base=0.001, verify=str(certificates / "ca.pem"),
                                 proxy=forward.url)[1]:
            forward.seen = []
            with pytest.raises(Unavailable, match="407"):
                call("ack", "t", "m1")  # the request never left the proxy: not MaybeApplied, and tried again
            assert len(forward.seen) == 2
        assert server.requests == 0
    finally:
        server.close()
