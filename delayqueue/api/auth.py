"""Who may call the queue API: the request's API token, checked against the token table with
async psycopg (the API path never uses the ORM) through a per-process cache.

A token comes as `Authorization: Bearer <token>`, or as the path prefix `/t/<token>/camellia/...`
that project/asgi.py strips into scope["delayqueue.token"] (camellia's Java SDK cannot set
headers). Every answer of the table, a refusal included, is reused for REFRESH_SECONDS, so a
revoked token is refused by every process within a second of its revocation."""
import asyncio
import logging
import time
from dataclasses import dataclass

from delayqueue.core.exceptions import LogUnavailable, Refused, Unavailable
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection
from delayqueue.stores.tokens import token_hash

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5  # an answer older than this is asked again: revocation takes effect within 1 s
MAX_ENTRIES = 10_000  # bounded: random tokens sprayed at the API cannot grow the process
# A lookup waits at most this long for PostgreSQL: a known token then keeps its last answer.
LOOKUP_TIMEOUT_MILLIS = 1_000
BEARER = "bearer "


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


def request_token(request) -> str | None:
    """The token of the path prefix, else of the Authorization header; None without one."""
    token = getattr(request, "scope", {}).get("delayqueue.token")  # ASGI requests only
    if token:
        return token
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header[:len(BEARER)].lower() == BEARER:
        return header[len(BEARER):].strip() or None
    return None


async def authorize(rt, request, scope: str | tuple[str, ...]) -> str:
    """The namespace the request's token works in; Refused 401 without a valid token, 403 when
    the token lacks `scope` (a tuple: lacks every one of them). No message names the token."""
    token = request_token(request)
    if token is None:
        raise Refused("missing API token: send the header 'Authorization: Bearer <token>' "
                      "or call /t/<token>/camellia/...", 401)
    grant = await rt.tokens.grant(token)
    if grant is None or grant.revoked:
        raise Refused("invalid or revoked API token", 401)
    if isinstance(scope, tuple):
        if grant.scopes.isdisjoint(scope):
            raise Refused(f"this API token lacks the {' or '.join(scope)} scope", 403)
    elif scope not in grant.scopes:
        raise Refused(f"this API token lacks the {scope} scope", 403)
    return grant.namespace
