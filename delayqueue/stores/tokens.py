"""API tokens as the API checks them, without the ORM (rows.py creates and revokes them): a
token's sha256 looked up in the token table through a per-process cache.

Every answer of the table, a refusal included, is reused for refreshed.REFRESH_SECONDS, so a
revoked token is refused by every process within a second of its revocation."""
import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from delayqueue.core.exceptions import LogUnavailable, Unavailable
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.stores.refreshed import REFRESH_SECONDS

log = logging.getLogger(__name__)

MAX_ENTRIES = 10_000  # bounded: random tokens sprayed at the API cannot grow the process
# A lookup waits at most this long for PostgreSQL: a known token then keeps its last answer.
LOOKUP_TIMEOUT_MILLIS = 1_000


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    namespace: str
    scopes: frozenset[str]
    revoked: bool


@dataclass
class Entry:
    grant: Grant | None  # None: no such token
    checked_at: float


class TokenCache:
    """token sha256 -> its row's answer, asked again when older than REFRESH_SECONDS.
    Concurrent lookups of one token share one query."""

    def __init__(self, timeout_millis: int):
        self._conn = LogConnection(min(timeout_millis, LOOKUP_TIMEOUT_MILLIS))
        self._entries: dict[str, Entry] = {}
        self._pending: dict[str, asyncio.Future] = {}

    async def grant(self, token: str) -> Grant | None:
        digest = token_hash(token)
        entry = self._entries.get(digest)
        if entry is not None and time.monotonic() - entry.checked_at < REFRESH_SECONDS:
            return entry.grant
        pending = self._pending.get(digest)
        if pending is None:
            pending = self._pending[digest] = asyncio.ensure_future(self._lookup(digest, entry))
            pending.add_done_callback(lambda _f: self._pending.pop(digest, None))
        return await asyncio.shield(pending)  # one caller hanging up must not cancel the others' query

    async def _lookup(self, digest: str, entry: Entry | None) -> Grant | None:
        try:
            async with self._conn.use() as conn:
                cursor = await conn.execute(sql.TOKEN_BY_HASH, [digest])
                row = await cursor.fetchone()
        except LogUnavailable as exc:
            log.warning("token check failed: %s", exc)
            if entry is None:
                raise Unavailable("token check unavailable: the message log (PostgreSQL) does not answer") from None
            entry.checked_at = time.monotonic()  # keep its last answer; ask again after the refresh time
            return entry.grant
        grant = None if row is None else Grant(row[0], frozenset(row[1].split(",")), row[2])
        self._entries.pop(digest, None)
        if len(self._entries) >= MAX_ENTRIES:
            del self._entries[next(iter(self._entries))]  # the oldest answer
        self._entries[digest] = Entry(grant, time.monotonic())
        return grant

    async def close(self) -> None:
        await self._conn.close()


def ordered_namespaces(own: str, token_namespaces: Iterable[str]) -> list[str]:
    """DELAYQUEUE_NAMESPACE first, then the tokens' other namespaces, sorted and each once."""
    return [own, *sorted(set(token_namespaces) - {own})]
