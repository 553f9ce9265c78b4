"""HTTP for the clients: one `post(endpoint, body, timeout) -> (status, content)` each, raising
NotSent or MaybeSent for failures below HTTP.

The blocking client speaks HTTP/1.1 through the standard library's http.client over a pool of
keep-alive connections: measured against the same server, it costs a call less than half of
what httpx's blocking client adds, and a sequential caller waits that on every call. The asyncio
client keeps httpx's AsyncClient.
"""
import http.client
import json
import select
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

import httpx

# A connection idle this long is closed rather than reused: servers close idle keep-alive
# connections (uvicorn after 5 s), and a request written into a closing one is lost.
MAX_IDLE_SECONDS = 4.0
USER_AGENT = "delayqueue-client"


class TransportError(Exception):
    """The call failed below HTTP; the message names the cause."""


class NotSent(TransportError):
    """The request never left this process (refused, unresolvable, connect timeout): any call may be retried."""


class MaybeSent(TransportError):
    """The request may have reached the server (reset, timeout while waiting for the answer)."""


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Connection:
    def __init__(self, conn: http.client.HTTPConnection):
        self.conn, self.idle_since = conn, time.monotonic()

    def stale(self) -> bool:
        """Idle too long, or closed by the server (readable while idle means EOF or junk)."""
        if time.monotonic() - self.idle_since > MAX_IDLE_SECONDS or self.conn.sock is None:
            return True
        try:
            if hasattr(select, "poll"):  # select() cannot watch descriptors above FD_SETSIZE (1024)
                poller = select.poll()
                poller.register(self.conn.sock, select.POLLIN)
                return bool(poller.poll(0))
            return bool(select.select([self.conn.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True


class Pool:
    """Keep-alive connections to one server, shared by any number of threads: a call takes an idle
    connection (or opens one) and gives it back once its answer is read."""

    def __init__(self, base_url: str, headers: dict, timeout: float):
        parts = urlsplit(base_url)  # checked by the client
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/") + "/"  # endpoints are relative to the base URL's path
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT,
                         **headers}
        self._timeout = timeout
        self._ssl = ssl.create_default_context() if self._https else None
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        conn, reused = self._take()
        try:
            try:
                response = self._ask(conn, path, body, timeout)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # A reused connection the server closed before answering (no status line came):
                # the request was not processed, so it goes once more on a new connection.
                conn.close()
                conn = self._connect()
                response = self._ask(conn, path, body, timeout)
            content = response.read()  # an answer begun and then cut is never sent again
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise MaybeSent(_described(exc)) from exc
        if response.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return response.status, content

    def _ask(self, conn: http.client.HTTPConnection, path: str, body: bytes,
             timeout: float) -> http.client.HTTPResponse:
        """Sends the request and reads the status line and headers."""
        conn.sock.settimeout(timeout)
        conn.request("POST", self._prefix + path, body, self._headers)
        return conn.getresponse()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        while True:
            with self._lock:
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                return self._connect(), False
            if not idle.stale():
                return idle.conn, True
            idle.conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(_Connection(conn))

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise NotSent(_described(exc)) from exc
        return conn

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for each in idle:
            each.conn.close()


class AsyncPool:
    """Pool's post() for asyncio, on httpx.AsyncClient."""

    def __init__(self, base_url: str, headers: dict, timeout: float):
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers})

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        try:
            response = await self._http.post(path, content=body, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise NotSent(_described(exc)) from exc
        except httpx.HTTPError as exc:
            raise MaybeSent(_described(exc)) from exc
        return response.status_code, response.content

    async def close(self) -> None:
        await self._http.aclose()


def encoded(body: dict | list) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
