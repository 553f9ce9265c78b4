"""Connections to the PostgreSQL message log, and how their failures are reported."""
import asyncio
import contextlib

import psycopg
from django.db import DatabaseError, connections
from psycopg import pq
from psycopg.conninfo import make_conninfo

from delayqueue.core.exceptions import LogMaybeWritten, LogUnavailable, LogUnreachable, connection_reason

# libpq's parameters, which DATABASE_URL's query may carry (sslmode=verify-full, sslrootcert=...)
# as Django's OPTIONS; Django's own OPTIONS (pool, isolation_level...) are not for libpq.
LIBPQ_KEYWORDS = frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


def conninfo(timeout_millis: int, database: str) -> str:
    """Connection string of Django's database `database` (an alias: routing.database_of; the test
    database under pytest), with `timeout_millis` as the server's statement timeout (a lock must
    end in an error)."""
    s = connections[database].settings_dict
    params = {k: v for k, v in (s.get("OPTIONS") or {}).items() if k in LIBPQ_KEYWORDS}
    params.update(dbname=s["NAME"], user=s.get("USER") or None, password=s.get("PASSWORD") or None,
                  host=s.get("HOST") or None, port=s.get("PORT") or None)
    return make_conninfo(**{k: v for k, v in params.items() if v}, connect_timeout=3,
                         options=f"-c statement_timeout={timeout_millis}", application_name="delayqueue")


async def connect(timeout_millis: int, database: str) -> psycopg.AsyncConnection:
    try:
        return await psycopg.AsyncConnection.connect(conninfo(timeout_millis, database), autocommit=True)
    except psycopg.Error as exc:
        raise log_unavailable(exc) from None


def first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# PostgreSQL stopping (a fast shutdown ends every session), crashed, or starting up.
RESTARTING = (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown, psycopg.errors.CannotConnectNow)


def log_reason(exc: psycopg.Error) -> str:
    """Why the message log failed, in words naming no host, port or path (psycopg's connection
    errors name them all)."""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return "statement timed out"
    if isinstance(exc, RESTARTING) or "the database system is" in str(exc):  # refused at connect: no state
        return "server shutting down or starting"
    if exc.sqlstate is None or exc.sqlstate.startswith("08") or isinstance(exc, psycopg.errors.InvalidPassword):
        # Client-side (no state): could not connect, or the connection broke.
        return connection_reason(str(exc), otherwise="connection failed")
    return f"database error {exc.sqlstate} ({type(exc).__name__})"


def unreachable(exc: psycopg.Error) -> bool:
    """Whether PostgreSQL could not be reached (a connection refused or lost, the server
    restarting), rather than refusing the work: a constraint, bad data, a statement timeout, a
    password. Connection failures come without a state, or in class 08."""
    if isinstance(exc, RESTARTING):
        return True
    if exc.sqlstate is not None:
        return exc.sqlstate.startswith("08")
    return isinstance(exc, psycopg.OperationalError) and log_reason(exc) != "authentication failed"


def log_unavailable(exc: psycopg.Error) -> LogUnavailable:
    kind = LogUnreachable if unreachable(exc) else LogUnavailable
    return kind(f"message log unavailable: {log_reason(exc)}", detail=first_line(exc))


def orm_unavailable(exc: DatabaseError) -> LogUnavailable:
    """log_unavailable of an error of Django's ORM, whose cause is psycopg's."""
    cause = exc.__cause__
    if isinstance(cause, psycopg.Error):
        return log_unavailable(cause)
    return LogUnavailable("message log unavailable", detail=first_line(exc))


class LogConnection:
    """One autocommit connection to the message log, opened on first use and again after a
    failure. Any PostgreSQL error inside `use()` drops it and comes out as LogUnavailable; so
    does a block that takes longer than `timeout_millis`. A send waits on the log, and the
    server's statement timeout cannot end a wait on a server that is hung or unreachable."""

    def __init__(self, timeout_millis: int, database: str):
        self._timeout_millis = timeout_millis
        self._database = database
        self._conn: psycopg.AsyncConnection | None = None

    @contextlib.asynccontextmanager
    async def use(self):
        connected = False
        try:
            async with asyncio.timeout(self._timeout_millis / 1000):
                if self._conn is None or self._conn.closed:
                    self._conn = await connect(self._timeout_millis, self._database)
                connected = True
                yield self._conn
        except psycopg.Error as exc:
            await self.close()
            raise log_unavailable(exc) from None
        except TimeoutError:
            await self.close()
            # A statement sent may still be running: psycopg's cancel does not reach a server that is not answering.
            kind = LogMaybeWritten if connected else LogUnavailable
            raise kind(f"message log unavailable: no answer within {self._timeout_millis / 1000:g} s") from None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:
                pass


class SharedConnection(LogConnection):
    """A LogConnection that concurrent callers take in turn, one block (a transaction) at a time:
    for infrequent work (a schedule's change) that should not open a connection per call."""

    def __init__(self, timeout_millis: int, database: str):
        super().__init__(timeout_millis, database)
        self._turn = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def use(self):
        async with self._turn, super().use() as conn:
            yield conn


@contextlib.asynccontextmanager
async def one_use(timeout_millis: int, database: str):
    """A LogConnection's connection for one piece of work (a page, a call), closed after it."""
    db = LogConnection(timeout_millis, database)
    try:
        async with db.use() as conn:
            yield conn
    finally:
        await db.close()
