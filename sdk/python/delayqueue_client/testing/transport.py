"""The clients' transport (`client._http`) on a FakeServer: `post(path, body, timeout) -> (status,
content)` as _http.Pool and _http.AsyncPool, so everything above it (retries, parsing, errors,
the producer, the Worker) runs unchanged."""
import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server makes its clients with these transports
    from delayqueue_client.testing.server import FakeServer

LONG_POLL = "longPollingMsg"
ASYNC_POLL_STEP = 0.002  # seconds between an async long poll's attempts (the server's lock is a thread's)


class FakeTransport:
    """Client's transport: a call is the server's at once; a long poll waits on the server's
    changes (a send, an ack, an advance of its clock) until it has messages or its time is up."""

    def __init__(self, server: "FakeServer"):
        self.server = server

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        if path != LONG_POLL:
            return self.server.post(path, body)
        poll = self.server.long_poll(body)
        with self.server._changed:  # held from each attempt to its wait: no change is missed between
            while (answer := poll.attempt()) is None:
                self.server._changed.wait(poll.wait_seconds())
        return answer

    def close(self) -> None:
        pass


class AsyncFakeTransport:
    """AsyncClient's transport: as FakeTransport, with its long polls waiting in the event loop."""

    def __init__(self, server: "FakeServer"):
        self.server = server

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        if path != LONG_POLL:
            return self.server.post(path, body)
        poll = self.server.long_poll(body)
        while (answer := poll.attempt()) is None:
            await asyncio.sleep(min(ASYNC_POLL_STEP, poll.wait_seconds()))
        return answer

    async def close(self) -> None:
        pass
