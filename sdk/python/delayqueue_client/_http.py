"""HTTP for the clients: one `post(endpoint, body, timeout) -> (status, content)` each, raising
NotSent or MaybeSent for failures below HTTP. Both pools take one Settings, so TLS, the proxy and
the connection bound are the same in both clients.

The blocking client speaks HTTP/1.1 through the standard library's http.client over a pool of
keep-alive connections: measured against the same server, it costs a call less than half of
what httpx's blocking client adds, and a sequential caller waits that on every call. The asyncio
client keeps httpx's AsyncClient.
"""
import asyncio
import base64
import functools
import http.client
import io
import json
import os
import re
import select
import socket
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit


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


class Transport(Protocol):
    """What Client sends its requests through (Pool; a fake server plugs in here)."""

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """What AsyncClient sends its requests through (AsyncPool)."""

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Settings:
    """How a client reaches its server: `url` the API's base URL; `proxy` an http:// proxy URL or
    None for a direct connection; `max_connections` open at once (a call waits for one, up to its
    timeout)."""
    url: str = field(repr=False)  # may hold the token (/t/<token>) or a password: never in a repr
    headers: dict[str, str] = field(repr=False)  # the token: never in a repr
    timeout: float
    ssl_context: ssl.SSLContext
    proxy: str | None = field(repr=False)  # may hold the proxy's password
    max_connections: int


def ssl_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext:
    """`verify`: True checks the server's certificate against the system's CAs (SSL_CERT_FILE and
    SSL_CERT_DIR honoured), a path against that CA file or directory, False not at all. `cert`: a
    client certificate, one PEM file holding it and its key or (cert file, key file)."""
    if isinstance(verify, str):
        context = (ssl.create_default_context(capath=verify) if os.path.isdir(verify) else
                   ssl.create_default_context(cafile=verify))
    else:
        context = ssl.create_default_context()
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
        context.load_cert_chain(certfile, keyfile)
    return context


def proxy_for(url: str, proxy: str | None, trust_env: bool) -> str | None:
    """The proxy a client uses for `url`: `proxy` when given, else (with trust_env) the
    environment's HTTPS_PROXY / HTTP_PROXY / ALL_PROXY for the URL's scheme unless NO_PROXY covers
    its host, else None. Only http:// proxies (a CONNECT tunnel carries https)."""
    parts = urlsplit(url)
    if proxy is None and trust_env:
        found = urllib.request.getproxies_environment()
        proxy = found.get(parts.scheme) or found.get("all")
        if proxy and urllib.request.proxy_bypass(parts.hostname or ""):
            proxy = None
    if not proxy:
        return None
    if urlsplit(proxy).scheme != "http" or not urlsplit(proxy).hostname:
        raise ValueError(f"the proxy must be http://[user:password@]host:port, got {shown_url(proxy)!r}")
    return proxy


# The server's token path prefix (/t/<token>/...), which camellia's SDK is configured with and this one takes too.
_TOKEN_IN_PATH = re.compile(r"(/t/)[^/?#]+")
_TOKEN_ENDING_PATH = re.compile(r"(.*)/t/([^/]+)")


def lifted_token(url: str) -> tuple[str, str | None]:
    """A base URL ending in the token prefix /t/<token> as the URL without it and the token, which
    the server takes as well as a bearer header (then kept out of every URL: httpx logs each one);
    another URL as it is, and None."""
    parts = urlsplit(url)
    found = _TOKEN_ENDING_PATH.fullmatch(parts.path)
    if found is None:
        return url, None
    return urlunsplit(parts._replace(path=found[1])), unquote(found[2])


def shown_url(url: str) -> str:
    """The URL as reprs and errors show it: its password and a /t/<token> path prefix as ***."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc, path=_TOKEN_IN_PATH.sub(r"\1***", parts.path, count=1)))


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


def _left(deadline: float) -> float:
    """Seconds until the attempt's deadline; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _DeadlineReads(io.RawIOBase):
    """A socket's reads, each waiting only until the attempt's deadline: a socket's own timeout
    starts again at every read, so an answer trickling in would never time out. `raw`, the
    socket's reader from sock.makefile, keeps it open while this one is (http.client closes a
    closing answer's connection before its body is read)."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: float):
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """HTTPResponse (of the answer, or of a proxy's CONNECT) read within the attempt's deadline."""

    def __init__(self, sock: socket.socket, *args: object, deadline: float, **kwargs: object):
        super().__init__(sock, *args, **kwargs)  # type: ignore[arg-type]  # HTTPResponse's own
        # The reader it made, read through one that keeps the deadline.
        self.fp = io.BufferedReader(_DeadlineReads(self.fp.detach(), sock, deadline))


class _DeadlineHTTPSConnection(http.client.HTTPSConnection):
    """HTTPSConnection whose TLS handshake waits only until the attempt's deadline: the socket's
    timeout, set when connecting began, would give it a whole timeout again after a slow TCP
    connect or a proxy's slow CONNECT."""

    def __init__(self, *args: Any, deadline: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        # HTTPSConnection.connect's steps, the socket's timeout set anew before the handshake.
        http.client.HTTPConnection.connect(self)  # TCP, and a proxy's tunnel
        assert self.sock is not None
        self.sock.settimeout(_left(self._deadline))
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]  # HTTPSConnection's own
        tunnelled_to = self._tunnel_host  # type: ignore[attr-defined]  # HTTPConnection's own
        self.sock = context.wrap_socket(self.sock, server_hostname=tunnelled_to or self.host)


class Pool:
    """Keep-alive connections to one server, shared by any number of threads: a call takes an idle
    connection (or opens one) and gives it back once its answer is read. A call's timeout is one
    deadline for its wait for a connection, connecting, sending and reading the answer."""

    def __init__(self, settings: Settings):
        parts = urlsplit(settings.url)  # checked by the client
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        # Endpoints are relative to the base URL's path; through a proxy, plain HTTP names the whole URL.
        self._prefix = parts.path.rstrip("/") + "/"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT,
                         **settings.headers}
        self._proxy = urlsplit(settings.proxy) if settings.proxy else None
        self._tunnel_headers: dict[str, str] = {}
        if self._proxy is not None:
            if self._proxy.username is not None:
                credentials = f"{unquote(self._proxy.username)}:{unquote(self._proxy.password or '')}"
                self._tunnel_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
            if not self._https:
                self._prefix = f"http://{parts.netloc}{self._prefix}"
                self._headers.update(self._tunnel_headers)
        self._ssl = settings.ssl_context
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._max_connections = settings.max_connections
        self._slots = threading.BoundedSemaphore(settings.max_connections)

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        # A call waits for a free connection up to its timeout; none by then is a request never sent.
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise NotSent(f"PoolTimeout: all {self._max_connections} connections busy for {timeout:g} s")
        try:
            return self._post(path, body, deadline)
        finally:
            self._slots.release()

    def _post(self, path: str, body: bytes, deadline: float) -> tuple[int, bytes]:
        conn, reused = self._take(deadline)
        try:
            try:
                response = self._ask(conn, path, body, deadline)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # A reused connection the server closed before answering (no status line came):
                # the request was not processed, so it goes once more on a new connection.
                conn.close()
                conn = self._connect(deadline)
                response = self._ask(conn, path, body, deadline)
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
             deadline: float) -> http.client.HTTPResponse:
        """Sends the request and reads the status line and headers."""
        assert conn.sock is not None  # connected by _connect
        conn.sock.settimeout(_left(deadline))  # sendall's timeout bounds the whole send
        conn.response_class = functools.partial(_DeadlineResponse, deadline=deadline)  # type: ignore[assignment]
        conn.request("POST", self._prefix + path, body, self._headers)
        return conn.getresponse()

    def _take(self, deadline: float) -> tuple[http.client.HTTPConnection, bool]:
        while True:
            with self._lock:
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                return self._connect(deadline), False
            if not idle.stale():
                return idle.conn, True
            idle.conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(_Connection(conn))

    def _connect(self, deadline: float) -> http.client.HTTPConnection:
        host, port = ((self._proxy.hostname or "", self._proxy.port or 80) if self._proxy is not None else
                      (self._host, self._port))
        conn: http.client.HTTPConnection
        try:
            timeout = _left(deadline)
        except TimeoutError as exc:
            raise NotSent(_described(exc)) from exc
        if self._https:
            conn = _DeadlineHTTPSConnection(host, port, timeout=timeout, context=self._ssl, deadline=deadline)
            if self._proxy is not None:  # HTTPS through the proxy: a CONNECT tunnel, TLS with the server inside
                conn.set_tunnel(self._host, self._port, headers=self._tunnel_headers)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        # The proxy's answer to CONNECT is read as an answer is, within the deadline.
        conn.response_class = functools.partial(_DeadlineResponse, deadline=deadline)  # type: ignore[assignment]
        try:
            conn.connect()
            assert conn.sock is not None
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


# httpcore's RemoteProtocolError for a connection closed before any byte of an answer.
_NO_RESPONSE = "disconnected without sending a response"


class _Attempt:
    """One request of AsyncPool, as httpcore's trace extension tells it: whether it opened a
    connection, and whether an answer began."""

    def __init__(self) -> None:
        self.opened = self.sent = self.answered = False

    async def trace(self, event: str, info: dict[str, object]) -> None:
        if event.startswith("connection.connect_tcp."):
            self.opened = True
        elif event == "http11.send_request_headers.started":
            self.sent = True
        elif event == "http11.receive_response_headers.complete":
            self.answered = True

    def kept_alive_closed(self) -> bool:
        """A reused connection the server closed before any answer (no status line came)."""
        return not self.opened and not self.answered


class AsyncPool:
    """Pool's post() for asyncio, on httpx.AsyncClient; a call's timeout is one deadline for all of
    it, as Pool's (httpx's timeouts bound each wait for a connection, connect, write and read)."""

    def __init__(self, settings: Settings):
        import httpx  # here, not at the top: a blocking client's process never pays for importing it (80 ms)

        self._httpx = httpx  # for post()'s exceptions, with no import statement run on every call
        # trust_env=False: the proxy was chosen by proxy_for, as for Pool, not again by httpx. httpx
        # keeps idle connections 5 s, as long as uvicorn: MAX_IDLE_SECONDS, as Pool's.
        limits = httpx.Limits(max_connections=settings.max_connections, keepalive_expiry=MAX_IDLE_SECONDS)
        self._http = httpx.AsyncClient(
            base_url=settings.url, timeout=settings.timeout, verify=settings.ssl_context, proxy=settings.proxy,
            trust_env=False, limits=limits,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT, **settings.headers})
        self._max_connections = settings.max_connections

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        httpx = self._httpx
        deadline = asyncio.get_running_loop().time() + timeout
        # Each retry below leaves a dead kept-alive connection behind: at most as many as can be open.
        for retries_left in range(self._max_connections, -1, -1):
            attempt = _Attempt()
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self._http.post(path, content=body, timeout=timeout,
                                                     extensions={"trace": attempt.trace})
            except TimeoutError as exc:  # the deadline, whichever wait it fell in
                raise (MaybeSent if attempt.sent else NotSent)(_described(exc)) from exc
            # ProxyError: the proxy refused the CONNECT tunnel, before the request (as Pool's NotSent).
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError) as exc:
                raise NotSent(_described(exc)) from exc
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                # As Pool, on a closed or reset connection only: a garbled status line was an answer.
                closed = isinstance(exc, httpx.ReadError) or _NO_RESPONSE in str(exc)
                if retries_left and closed and attempt.kept_alive_closed():
                    continue  # not processed, so sent once more (that connection is gone)
                raise MaybeSent(_described(exc)) from exc
            except (httpx.HTTPError, OSError) as exc:
                # OSError: what httpx leaves unmapped, such as a TLS 1.3 alert read after the request
                # went (a server that wants a client certificate says so only then).
                raise MaybeSent(_described(exc)) from exc
            return response.status_code, response.content
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self._http.aclose()


def utf8(text: str) -> bytes:
    """The text in UTF-8; ValueError, before anything is sent, for text UTF-8 cannot carry."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"cannot send {text[exc.start:exc.end]!a}: a lone surrogate, which no UTF-8 text holds "
                         "(a str decoded with errors='surrogateescape' or cut inside a pair?)") from None


def encoded(body: dict[str, object] | list[dict[str, object]]) -> bytes:
    """The call's JSON body (utf8's ValueError for text UTF-8 cannot carry)."""
    return utf8(json.dumps(body, ensure_ascii=False, separators=(",", ":")))
