"""Client (blocking) and AsyncClient (asyncio): the same methods (see _calls.Calls), one pool of
keep-alive connections each (see _http)."""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from delayqueue_client._calls import Again, Body, Call, Calls, SendResult, send_body
from delayqueue_client._http import AsyncPool, AsyncTransport, Pool, Settings, Transport, TransportError, encoded
from delayqueue_client.errors import DelayQueueError
from delayqueue_client.middleware import SendContext

if TYPE_CHECKING:
    from delayqueue_client.producer import AsyncProducer, Producer

T = TypeVar("T")


class Client(Calls):
    """The blocking client; safe to share between threads. `Client(base_url, token)`, both read from
    DELAYQUEUE_URL and DELAYQUEUE_TOKEN when not given; the other options are Calls'. Its `_http`
    (Pool, or anything with its post() and close()) sends the requests."""

    _http: Transport

    def _new_transport(self, settings: Settings) -> Transport:
        return Pool(settings)

    def _run(self, call: Call[T]) -> T:
        if not call.sends:
            return self._attempts(call)
        try:
            result = self._attempts(call)
        except BaseException as exc:
            self._end_sends(call.sends, exc)
            raise
        self._end_sends(call.sends, [result])  # type: ignore[list-item]  # a send's Message
        return result

    def _attempts(self, call: Call[T]) -> T:
        if call.known is not None:
            return call.parse(call.known)
        body = encoded(call.body)
        for attempt in itertools.count():
            posted: tuple[int, bytes] | TransportError
            try:
                posted = self._http.post(call.endpoint, body, self.timeout + call.extra_timeout)
            except TransportError as exc:
                posted = exc
            outcome = self._after_attempt(call, attempt, posted)
            if not isinstance(outcome, Again):
                return outcome
            time.sleep(outcome.seconds)
        raise AssertionError("unreachable")

    def send_many(self, items: list[dict[str, Any]]) -> list[SendResult]:
        """One sendMsgBatch of dicts with send()'s keyword names; per item its Message or its error
        (an item a store was unavailable for, or over a rate limit, is sent again as a call is); no
        items, no call (the API refuses an empty batch)."""
        return self._send_batch([send_body(**item) for item in items]) if items else []

    def _send_batch(self, bodies: list[Body], sends: Sequence[SendContext] | None = None) -> list[SendResult]:
        """sendMsgBatch of these bodies; items worth another try are sent again (same msgIds).
        `sends`: their middleware contexts, before_send run (made here when not given)."""
        contexts = self._send_contexts(bodies) if sends is None else sends
        try:
            results = self._batch_attempts(bodies)
        except BaseException as exc:
            self._end_sends(contexts, exc)
            raise
        self._end_sends(contexts, results)
        return results

    def _batch_attempts(self, bodies: list[Body]) -> list[SendResult]:
        results: list[SendResult | None] = [None] * len(bodies)
        todo = list(range(len(bodies)))
        for attempt in itertools.count():
            answered: list[SendResult] | DelayQueueError
            try:
                answered = self._run(self._batch_call(bodies, todo))
            except DelayQueueError as exc:
                if attempt == 0:
                    raise  # the whole batch failed: nothing of it is known stored
                answered = exc
            todo, wait = self._batch_again(results, todo, answered, attempt)
            if not todo:
                return results  # type: ignore[return-value]  # every position answered
            time.sleep(wait)
        raise AssertionError("unreachable")

    def producer(self, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4, max_queue: int = 100_000,
                 when_full: Literal["block", "raise"] = "block") -> Producer:
        """A batching producer on this client (see Producer)."""
        from delayqueue_client.producer import Producer

        return Producer(self, linger_ms=linger_ms, max_batch=max_batch, in_flight=in_flight, max_queue=max_queue,
                        when_full=when_full)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(Calls):
    """The asyncio client: Client's methods and options, each method answering an awaitable of the
    same value."""

    _http: AsyncTransport

    def _new_transport(self, settings: Settings) -> AsyncTransport:
        return AsyncPool(settings)

    async def _run(self, call: Call[T]) -> T:
        if not call.sends:
            return await self._attempts(call)
        try:
            result = await self._attempts(call)
        except BaseException as exc:
            self._end_sends(call.sends, exc)
            raise
        self._end_sends(call.sends, [result])  # type: ignore[list-item]  # a send's Message
        return result

    async def _attempts(self, call: Call[T]) -> T:
        if call.known is not None:
            return call.parse(call.known)
        body = encoded(call.body)
        for attempt in itertools.count():
            posted: tuple[int, bytes] | TransportError
            try:
                posted = await self._http.post(call.endpoint, body, self.timeout + call.extra_timeout)
            except TransportError as exc:
                posted = exc
            outcome = self._after_attempt(call, attempt, posted)
            if not isinstance(outcome, Again):
                return outcome
            await asyncio.sleep(outcome.seconds)
        raise AssertionError("unreachable")

    async def send_many(self, items: list[dict[str, Any]]) -> list[SendResult]:
        """Client.send_many."""
        return await self._send_batch([send_body(**item) for item in items]) if items else []

    async def _send_batch(self, bodies: list[Body], sends: Sequence[SendContext] | None = None) -> list[SendResult]:
        """Client._send_batch."""
        contexts = self._send_contexts(bodies) if sends is None else sends
        try:
            results = await self._batch_attempts(bodies)
        except BaseException as exc:
            self._end_sends(contexts, exc)
            raise
        self._end_sends(contexts, results)
        return results

    async def _batch_attempts(self, bodies: list[Body]) -> list[SendResult]:
        results: list[SendResult | None] = [None] * len(bodies)
        todo = list(range(len(bodies)))
        for attempt in itertools.count():
            answered: list[SendResult] | DelayQueueError
            try:
                answered = await self._run(self._batch_call(bodies, todo))
            except DelayQueueError as exc:
                if attempt == 0:
                    raise  # the whole batch failed: nothing of it is known stored
                answered = exc
            todo, wait = self._batch_again(results, todo, answered, attempt)
            if not todo:
                return results  # type: ignore[return-value]  # every position answered
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    def producer(self, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4,
                 max_queue: int = 100_000) -> AsyncProducer:
        """A batching producer on this client (see AsyncProducer); made inside the running loop."""
        from delayqueue_client.producer import AsyncProducer

        producer = AsyncProducer(self, linger_ms=linger_ms, max_batch=max_batch, in_flight=in_flight,
                                 max_queue=max_queue)
        self._producers.add(producer)
        return producer

    async def aclose(self) -> None:
        """Closes the producers made on it first (their sends go): once closed, it can send nothing more."""
        for producer in list(self._producers):
            await producer.aclose()
        await self._http.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
