"""API tokens as the API checks them, without the ORM (rows.py creates and revokes them): a
token's sha256 looked up in the token table through a per-process cache.

Every answer of the table is reused for refreshed.REFRESH_SECONDS, so a revoked token is refused
by every process within a second of its revocation, and a new one works within a second.

Random tokens sprayed at the API must not make the real ones fail:
- Answers for a row (grants) and for no row (misses) are held apart, each bounded: misses never
  push a grant out.
- Lookups reach PostgreSQL in batches (one query for every hash waiting), on two connections:
  one refreshes the grants held, the other asks about tokens not held. However many unknown
  tokens wait, and whether their query times out, a grant's refresh neither waits nor fails
  for them.
- A client address (an IPv6 client's /64) that presented DELAYQUEUE_AUTH_FAILURE_LIMIT unknown or
  revoked tokens within DELAYQUEUE_AUTH_FAILURE_WINDOW_SECONDS is refused (429) for every token not
  held as a valid grant, without a query, until its window ends (AddressFailures; per process).

While PostgreSQL does not answer, a grant keeps its last answer for at most
DELAYQUEUE_TOKEN_TRUST_SECONDS after PostgreSQL last confirmed it; after that, and at once for a
token not held, the check fails: 500 token check unavailable."""
import asyncio
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from delayqueue.config.settings import DEFAULT_DATABASE
from delayqueue.core.addresses import counted_address
from delayqueue.core.exceptions import LogUnavailable, Throttled, Unavailable
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.stores.refreshed import REFRESH_SECONDS

log = logging.getLogger(__name__)

# Bounds that keep a flood of random tokens (or of client addresses) from growing the process.
MAX_GRANTS = 10_000
MAX_MISSES = 10_000
MAX_ADDRESSES = 10_000
# Hashes asked about in one query, and hashes not held that may wait for a query at once.
MAX_BATCH = 1_000
MAX_WAITING = 10_000
# A lookup waits at most this long for PostgreSQL: a grant then keeps its last answer (within
# the trust bound).
LOOKUP_TIMEOUT_MILLIS = 1_000
RETRY_WHEN_BUSY_MILLIS = 1_000

UNAVAILABLE = "token check unavailable: the message log (PostgreSQL) does not answer"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    namespace: str
    scopes: frozenset[str]
    revoked: bool


@dataclass
class Entry:
    grant: Grant
    checked_at: float  # last asked, answered or not (monotonic)
    confirmed_at: float  # last answered by PostgreSQL


def _retrieve(future: asyncio.Future) -> None:
    """Marks a lookup's exception seen: its callers may all have gone."""
    if not future.cancelled():
        future.exception()


class BatchedLookup:
    """Token hashes answered by PostgreSQL on a connection of their own: every hash waiting goes
    in one query (at most MAX_BATCH), so a thousand concurrent lookups cost one round trip, not a
    thousand queued on the connection. A failed query fails only its own batch."""

    def __init__(self, timeout_millis: int):
        self._conn = LogConnection(timeout_millis, DEFAULT_DATABASE)  # tokens belong to no one namespace
        self._waiting: dict[str, asyncio.Future] = {}
        self._runner: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def lookup(self, digest: str) -> Grant | None:
        """The hash's row as a Grant, None without one; LogUnavailable when the query failed."""
        future = self._waiting.get(digest)
        if future is None:
            future = self._waiting[digest] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            if self._runner is None or self._runner.done():
                self._runner = asyncio.ensure_future(self._run())
        return await asyncio.shield(future)

    async def _run(self) -> None:
        while self._waiting:
            batch = dict(itertools.islice(self._waiting.items(), MAX_BATCH))
            for digest in batch:
                del self._waiting[digest]
            try:
                async with self._conn.use() as conn:
                    cursor = await conn.execute(sql.TOKENS_BY_HASH, [list(batch)])
                    rows = await cursor.fetchall()
            except LogUnavailable as exc:
                log.warning("token check of %d token(s) failed: %s", len(batch), exc)  # once a batch, not a token
                for future in batch.values():
                    if not future.done():
                        future.set_exception(LogUnavailable(str(exc), exc.detail))
                continue
            except BaseException:  # cancelled by close(): no batch is left waiting
                for future in batch.values():
                    future.cancel()
                raise
            found = {digest: Grant(namespace, frozenset(scopes.split(",")), revoked)
                     for digest, namespace, scopes, revoked in rows}
            for digest, future in batch.items():
                if not future.done():
                    future.set_result(found.get(digest))

    async def close(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
        await self._conn.close()


class AddressFailures:
    """Failed token checks per client address (an IPv6 client by its /64: core.addresses),
    counted in a window that starts at the address' first failure; at `limit` failures the
    address is refused until the window ends."""

    def __init__(self, *, limit: int, window_seconds: int):
        self._limit = limit
        self._window = window_seconds
        self._counts: dict[str, list] = {}  # address -> [window start (monotonic), failures]

    def check(self, address: str) -> None:
        """Throttled (429) while the address is over the limit."""
        address = counted_address(address)
        counted = self._counts.get(address)
        if counted is None:
            return
        left = counted[0] + self._window - time.monotonic()
        if left <= 0:
            del self._counts[address]
        elif counted[1] >= self._limit:
            raise Throttled(f"too many invalid API tokens from this address ({self._limit} within "
                            f"{self._window} s)", math.ceil(left * 1000), limit="auth_failures", topic="")

    def add(self, address: str) -> None:
        address = counted_address(address)
        now = time.monotonic()
        counted = self._counts.get(address)
        if counted is None or now - counted[0] >= self._window:
            self._counts.pop(address, None)
            if len(self._counts) >= MAX_ADDRESSES:
                del self._counts[next(iter(self._counts))]  # the oldest window
            counted = self._counts[address] = [now, 0]
        counted[1] += 1


def _remember(table: dict, digest: str, value, bound: int) -> None:
    """Puts the answer last in `table`, dropping the oldest past `bound`."""
    table.pop(digest, None)
    if len(table) >= bound:
        del table[next(iter(table))]
    table[digest] = value


class TokenCache:
    """token sha256 -> its row's answer, asked again when older than REFRESH_SECONDS (see the
    module's docstring). Concurrent lookups of one token share one query."""

    def __init__(self, *, timeout_millis: int, trust_seconds: int, failure_limit: int, failure_window_seconds: int):
        timeout_millis = min(timeout_millis, LOOKUP_TIMEOUT_MILLIS)
        self._grants: dict[str, Entry] = {}
        self._misses: dict[str, float] = {}  # digest -> when PostgreSQL said it has no such token
        self._held = BatchedLookup(timeout_millis)  # refreshes the grants held
        self._unknown = BatchedLookup(timeout_millis)  # asks about the tokens not held
        self._pending: dict[str, asyncio.Future] = {}
        self._trust_seconds = trust_seconds
        # Every failed token of this process' callers (the metrics token's too: api/edge.py).
        self.failures = AddressFailures(limit=failure_limit, window_seconds=failure_window_seconds)

    async def grant(self, token: str, *, address: str = "") -> Grant | None:
        """The token's grant (revoked or not), None for no such token. A failure (None or revoked)
        counts against the client `address`. Throttled when the address is over its limit and the
        token is not a valid grant held, or too many unknown tokens wait; Unavailable when PostgreSQL
        cannot answer (see the module's docstring)."""
        digest = token_hash(token)
        entry = self._grants.get(digest)
        if entry is None or entry.grant.revoked:  # a revoked row held is a failure like a miss
            self.failures.check(address)
        grant = await self._answer(digest, entry)
        if grant is None or grant.revoked:
            self.failures.add(address)
        return grant

    async def _answer(self, digest: str, entry: Entry | None) -> Grant | None:
        now = time.monotonic()
        if entry is not None and now - entry.checked_at < REFRESH_SECONDS:
            return entry.grant
        if entry is None and now - self._misses.get(digest, -math.inf) < REFRESH_SECONDS:
            return None
        pending = self._pending.get(digest)
        if pending is None:
            if entry is None and self._unknown.waiting >= MAX_WAITING:
                raise Throttled("too many unknown API tokens are being checked at once", RETRY_WHEN_BUSY_MILLIS,
                                limit="token_checks", topic="")
            pending = self._pending[digest] = asyncio.ensure_future(self._lookup(digest, entry))
            pending.add_done_callback(lambda _f: self._pending.pop(digest, None))
        return await asyncio.shield(pending)  # one caller hanging up must not cancel the others' query

    async def _lookup(self, digest: str, entry: Entry | None) -> Grant | None:
        try:
            grant = await (self._unknown if entry is None else self._held).lookup(digest)
        except LogUnavailable:
            now = time.monotonic()
            if entry is None or now - entry.confirmed_at > self._trust_seconds:
                raise Unavailable(UNAVAILABLE) from None
            entry.checked_at = now  # its last answer stands until the next refresh time
            return entry.grant
        now = time.monotonic()
        if grant is None:
            self._grants.pop(digest, None)
            _remember(self._misses, digest, now, MAX_MISSES)
        else:
            self._misses.pop(digest, None)
            _remember(self._grants, digest, Entry(grant, now, now), MAX_GRANTS)
        return grant

    async def close(self) -> None:
        await self._held.close()
        await self._unknown.close()


def ordered_namespaces(own: str, token_namespaces: Iterable[str]) -> list[str]:
    """DELAYQUEUE_NAMESPACE first, then the tokens' other namespaces, sorted and each once."""
    return [own, *sorted(set(token_namespaces) - {own})]


async def read_served_namespaces(own: str, tokens: LogConnection) -> list[str]:
    """rows.served_namespaces' list read on a log connection, whose timeout ends the wait on a
    PostgreSQL that does not answer (the ORM's connection has none): for the scanners' loop and
    /metrics. When the message log does not answer, `own` (DELAYQUEUE_NAMESPACE) alone, the
    failure logged."""
    found = []
    try:
        async with tokens.use() as conn:
            cursor = await conn.execute(sql.TOKEN_NAMESPACES)
            found = [row[0] for row in await cursor.fetchall()]
    except LogUnavailable as exc:
        log.warning("could not read the token namespaces: %s", exc)
    return ordered_namespaces(own, found)
