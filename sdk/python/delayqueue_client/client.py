"""Client (blocking) and AsyncClient (asyncio): the same methods (see _calls.Calls), one pool of
keep-alive connections each (see _http)."""
import asyncio
import itertools
import time

from delayqueue_client._http import AsyncPool, Pool, TransportError, encoded
from delayqueue_client._calls import API_PATH, Call, Calls, backoff, merge_batch
from delayqueue_client.errors import DelayQueueError


class Client(Calls):
    """The blocking client; safe to share between threads. `Client(base_url, token)`, both read from
    DELAYQUEUE_URL and DELAYQUEUE_TOKEN when not given."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_retries: int = 4, backoff_base: float = 0.1, backoff_max: float = 2.0):
        super().__init__(base_url, token, timeout=timeout, max_retries=max_retries, backoff_base=backoff_base,
                         backoff_max=backoff_max)
        self._http = Pool(self.base_url + API_PATH, self._headers, timeout)

    def _run(self, call: Call):
        body = encoded(call.body)
        for attempt in itertools.count():
            try:
                posted = self._http.post(call.endpoint, body, self.timeout + call.extra_timeout)
            except TransportError as exc:
                posted = exc
            result, wait = self._after_attempt(call, attempt, posted)
            if wait is None:
                return result
            time.sleep(wait)

    def _send_batch(self, bodies: list[dict]) -> list:
        results, todo = [None] * len(bodies), list(range(len(bodies)))
        for attempt in range(self.max_retries + 1):
            try:
                answered = self._run(self._batch_call(bodies, todo))
            except DelayQueueError as exc:
                if attempt == 0:
                    raise  # the whole batch failed: nothing of it is known stored
                answered = exc
            todo = merge_batch(results, todo, answered, attempt < self.max_retries)
            if not todo:
                break
            time.sleep(backoff(attempt, self.backoff_base, self.backoff_max))
        return results

    def producer(self, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4):
        """A batching producer on this client (see Producer)."""
        from delayqueue_client.producer import Producer

        return Producer(self, linger_ms=linger_ms, max_batch=max_batch, in_flight=in_flight)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(Calls):
    """The asyncio client: Client's methods, each answering an awaitable of the same value."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_retries: int = 4, backoff_base: float = 0.1, backoff_max: float = 2.0):
        super().__init__(base_url, token, timeout=timeout, max_retries=max_retries, backoff_base=backoff_base,
                         backoff_max=backoff_max)
        self._http = AsyncPool(self.base_url + API_PATH, self._headers, timeout)

    async def _run(self, call: Call):
        body = encoded(call.body)
        for attempt in itertools.count():
            try:
                posted = await self._http.post(call.endpoint, body, self.timeout + call.extra_timeout)
            except TransportError as exc:
                posted = exc
            result, wait = self._after_attempt(call, attempt, posted)
            if wait is None:
                return result
            await asyncio.sleep(wait)

    async def _send_batch(self, bodies: list[dict]) -> list:
        results, todo = [None] * len(bodies), list(range(len(bodies)))
        for attempt in range(self.max_retries + 1):
            try:
                answered = await self._run(self._batch_call(bodies, todo))
            except DelayQueueError as exc:
                if attempt == 0:
                    raise  # the whole batch failed: nothing of it is known stored
                answered = exc
            todo = merge_batch(results, todo, answered, attempt < self.max_retries)
            if not todo:
                break
            await asyncio.sleep(backoff(attempt, self.backoff_base, self.backoff_max))
        return results

    def producer(self, *, linger_ms: float = 2, max_batch: int = 500, in_flight: int = 4):
        """A batching producer on this client (see AsyncProducer); made inside the running loop."""
        from delayqueue_client.producer import AsyncProducer

        return AsyncProducer(self, linger_ms=linger_ms, max_batch=max_batch, in_flight=in_flight)

    async def aclose(self) -> None:
        await self._http.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
