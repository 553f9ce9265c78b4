"""uvicorn's HTTP protocol (httptools) with bounds on a request's line and headers: the time a
client takes over them, DELAYQUEUE_HEADER_TIMEOUT_MILLIS, and their size, MAX_HEADER_BYTES. uvicorn
has neither, so a connection that sends nothing, or a header byte now and then, is otherwise held
for ever, and one that sends an endless header has it kept in memory until the timeout. A hang-up
is told to every request of the connection being answered, not only to its last, and is seen while
requests wait behind a held one; a request refused behind others is answered after them. The bodies
are bounded in api/asgi.py. Served by `uvicorn --http delayqueue.api.http_protocol:BoundedHttpToolsProtocol`."""
from collections.abc import Callable
from functools import partial

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from delayqueue.config.settings import load_config
from delayqueue.core.deadlines import loop_deadlines

# The --http value of every uvicorn command that serves the project.
HTTP_PROTOCOL = "delayqueue.api.http_protocol:BoundedHttpToolsProtocol"
# A request line and headers past this are refused (HTTP 431); nginx's large_client_header_buffers
# allow 32 KiB. Counted by the pieces fed to the parser that end no request's headers, so up to two
# pieces more may be taken.
MAX_HEADER_BYTES = 65_536
# A read (up to 256 KiB) is fed to the parser this much at a time: it parses all it is given at once,
# so headers that came whole in one read were never counted, however big, and a read of small
# pipelined requests queued thousands (each queued one cost a pass over those before it).
FEED_BYTES = 4096
# uvicorn stops reading a connection once one request waits behind the one being answered, so a
# hang-up went unseen until a held long poll's end. Reading goes on while fewer than this wait, and
# the rest of a read is parsed only when fewer do: what a connection holds stays bounded, and a
# client pipelining more has its hang-up seen late, as before.
MAX_PIPELINED = 8
HEADERS_TOO_BIG = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                   b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    header_bytes = 0  # of the request whose headers are coming in
    headers_done = 0  # requests whose headers came in, on this connection
    unparsed = b""  # read while MAX_PIPELINED requests wait
    refusal: Callable[[], None] | None = None  # of a request refused behind others, answered after them

    def wait_for_headers(self) -> None:
        """From a new connection's start, a request's first byte, or the first byte after an answer (a
        blank line begins no request, and stops uvicorn's keep-alive timeout), until its headers are in."""
        deadlines = loop_deadlines(self.loop)
        if self not in deadlines.due:
            deadlines.watch(self, load_config().header_timeout_millis / 1000, self.headers_too_slow)

    def headers_too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def refuse(self, answer: Callable[[], None]) -> None:
        """Refuses the request coming in: `answer` writes why and closes the connection, once the requests
        before it are answered (written at once, it was read as the first one's answer, which was lost).
        A request refused in its body is the one being read: answered at once, as uvicorn does."""
        loop_deadlines(self.loop).forget(self)
        self.unparsed = b""
        self.flow.pause_reading()
        if self.cycle is None or self.cycle.response_complete or self.cycle.more_body:
            answer()
        else:
            self.refusal = answer

    def send_400_response(self, msg: str) -> None:  # uvicorn's answer to a request it cannot parse
        self.refuse(partial(super().send_400_response, msg))

    def headers_too_big(self) -> None:
        msg = f"request line and headers are over {MAX_HEADER_BYTES} bytes\n".encode()
        self.transport.write(HEADERS_TOO_BIG % (len(msg), msg))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:  # nothing after a refused request is read
            return
        if self.timeout_keep_alive_task is not None:  # idle after an answer
            self.wait_for_headers()
        deadlines = loop_deadlines(self.loop)
        data, self.unparsed = self.unparsed + data, b""
        view = memoryview(data)
        for start in range(0, len(data), FEED_BYTES):
            waiting, done = self in deadlines.due, self.headers_done
            # The rest is parsed as the requests waiting are answered (on_response_complete); not in
            # the middle of a request's headers, whose time runs.
            if len(self.pipeline) >= MAX_PIPELINED and not waiting:
                self.unparsed = data[start:]
                self.flow.pause_reading()
                return
            piece = view[start:start + FEED_BYTES]
            super().data_received(piece)
            # Refused (HTTP 400: see refuse) or upgraded: the rest of the read is dropped, as uvicorn does.
            if self.transport.is_closing() or self.refusal is not None or self.parser.should_upgrade():
                return
            # Counted only when all of the piece was the same request's line and headers.
            if waiting and done == self.headers_done and self in deadlines.due:
                self.header_bytes += len(piece)
                if self.header_bytes > MAX_HEADER_BYTES:
                    self.refuse(self.headers_too_big)
                    return
        if self in deadlines.due:  # the rest of a request's headers is read even while requests wait: its time runs
            self.flow.resume_reading()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.unanswered = []  # the connection's requests being answered before its last (pipelined) one
        self.wait_for_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_bytes = 0
        self.wait_for_headers()

    def on_headers_complete(self) -> None:
        loop_deadlines(self.loop).forget(self)
        self.headers_done += 1
        earlier = self.cycle
        super().on_headers_complete()
        if earlier is not None and not earlier.response_complete:  # a request pipelined behind it
            self.unanswered = [cycle for cycle in self.unanswered if not cycle.response_complete] + [earlier]
            if len(self.pipeline) < MAX_PIPELINED:
                self.flow.resume_reading()

    def on_response_complete(self) -> None:
        if self.refusal is not None and not self.pipeline:  # the last request before the refused one
            self.refusal()
        super().on_response_complete()  # starts the next request waiting, and reads on
        if self.unparsed and len(self.pipeline) < MAX_PIPELINED and not self.transport.is_closing():
            self.data_received(b"")

    def connection_lost(self, exc) -> None:
        loop_deadlines(self.loop).forget(self)
        # uvicorn tells only the last request of the hang-up: one pipelined behind a held long poll
        # left it held, to take messages for a client that was gone.
        for cycle in self.unanswered:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)
