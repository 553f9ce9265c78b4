"""uvicorn's HTTP protocol (httptools) with a bound on the time a client takes over a request's
line and headers, DELAYQUEUE_HEADER_TIMEOUT_MILLIS: uvicorn has none, so a connection that sends
nothing, or a header byte now and then, is otherwise held for ever. The bodies are bounded in
api/asgi.py. Served by `uvicorn --http delayqueue.api.http_protocol:BoundedHttpToolsProtocol`."""
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from delayqueue.config.settings import load_config
from delayqueue.core.deadlines import loop_deadlines

# The --http value of every uvicorn command that serves the project.
HTTP_PROTOCOL = "delayqueue.api.http_protocol:BoundedHttpToolsProtocol"


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def wait_for_headers(self) -> None:
        """From a new connection's start, or a request's first byte, until its headers are in."""
        deadlines = loop_deadlines(self.loop)
        if self not in deadlines.due:
            deadlines.watch(self, load_config().header_timeout_millis / 1000, self.headers_too_slow)

    def headers_too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.wait_for_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.wait_for_headers()

    def on_headers_complete(self) -> None:
        loop_deadlines(self.loop).forget(self)
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        loop_deadlines(self.loop).forget(self)
        super().connection_lost(exc)
