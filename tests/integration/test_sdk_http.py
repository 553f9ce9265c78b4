"""The blocking client's connection pool (sdk/python/delayqueue_client/_http.py) against real
socket servers that misbehave as servers and proxies do: closing a kept-alive connection as a
request arrives, closing without an answer, never answering."""
import json
import socket
import struct
import threading
import time

import pytest
from delayqueue_client import AsyncClient, Client, ServerError

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


def answer(conn) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(ENVELOPE), ENVELOPE))
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
        with pytest.raises(ServerError, match="unreachable"):
            client.ack("t", "m1")  # the server may have acked it: not sent again
        assert server.requests == 2


def test_a_connection_closed_without_an_answer_fails_a_fresh_call_and_is_retried_only_when_idempotent(serve):
    server = serve(lambda conn, nth: False)
    with Client(server.url, max_retries=2, backoff_base=0.001) as client:
        with pytest.raises(ServerError, match="unreachable: RemoteDisconnected"):
            client.ack("t", "m1")
        assert server.requests == 1  # an ack is not idempotent: it may have been taken
        with pytest.raises(ServerError, match="unreachable: RemoteDisconnected"):
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
        with pytest.raises(ServerError, match="unreachable: RemoteProtocolError"):
            await client.ack("t", "m1")
        assert server.requests == 1  # not idempotent: it may have been taken
        with pytest.raises(ServerError, match="unreachable: RemoteProtocolError"):
            await client.topic_info("t")
        assert server.requests == 1 + 3
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, never listening: refused before anything was sent
        async with AsyncClient(f"http://127.0.0.1:{holder.getsockname()[1]}", max_retries=1,
                               backoff_base=0.001) as client:
            with pytest.raises(ServerError, match="unreachable: ConnectError"):
                await client.ack("t", "m1")
