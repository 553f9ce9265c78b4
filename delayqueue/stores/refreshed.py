"""A namespace's table of operator settings (limits, topic settings) as each process holds it:
read from PostgreSQL on first use and every REFRESH_SECONDS after, so the hot paths read
`current` without waiting on PostgreSQL and a change is in force on every process within a
second. A refresh reads only the rows written or deleted since the last read (sql.settings_reads:
nothing at all while nothing changes), and the whole table every FULL_READ_SECONDS. Reading fails
open: while PostgreSQL cannot be read, the table last read stays in force (an empty one, in a
process that has not read it yet) and the log says so once."""
import asyncio
import logging
import math
import time

from delayqueue.core.exceptions import LogUnavailable
from delayqueue.live.keys import NamespaceKeys
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import LogConnection

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5
# The whole table is read again this often: a process' table never drifts for longer, whatever
# went wrong (a row changed by hand with the trigger off, a deletion mark pruned while it could not read).
FULL_READ_SECONDS = 300.0
# A read that takes longer fails (and the table last read stays in force): the first read holds
# the process' first queue requests.
READ_TIMEOUT_MILLIS = 2_000


class RefreshedTable:
    """Subclasses say what the table is (`what`, for the log), the statements that read it
    (`reads`: sql.settings_reads' pair), what is in force before the first read (`unread`, for
    the log), and what a row's values are in the table (`entry`)."""

    what: str
    reads: tuple[str, str]
    unread: str

    def __init__(self, ns: NamespaceKeys, database: str):
        """`database`: the alias of the database that holds the namespace's rows."""
        self._ns = ns
        self._db = LogConnection(READ_TIMEOUT_MILLIS, database)
        self.current: dict | None = None  # the table in force, None until the first read
        self._first_read: asyncio.Future | None = None
        self._refresher: asyncio.Task | None = None
        self._failing = False  # a read failed, and the log said so: said again once one succeeds
        self._reading = asyncio.Lock()  # one read at a time: each builds on the one before
        self._since: str | None = None  # the last read's snapshot xmin; None: read the whole table next
        self._full_read_at = 0.0  # time.monotonic() of the last whole read
        self._read_began = -math.inf  # time.monotonic() when the read in force began
        self.rows_read = 0  # how many rows the last read's statement answered

    def entry(self, values: tuple):
        """A row's values as the table holds them; None: the row has no entry."""
        raise NotImplementedError

    async def table(self) -> dict:
        """The table in force (read first, on the first call)."""
        if self.current is None:
            if self._first_read is None:
                self._first_read = asyncio.ensure_future(self._read())
                self._refresher = asyncio.ensure_future(self._refresh_forever())
            first = self._first_read
            try:
                await asyncio.shield(first)  # a caller that goes away leaves the read to the others
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling() or not first.cancelled():
                    raise
                # The read was cancelled by close(), not this caller: it answers what _read left.
        return self.current

    async def fresh(self, after: float | None = None) -> dict:
        """The table read now, and in force in this process from now (after this process changed
        it). `after` (time.monotonic()): a read begun then or later will do, so callers that wait
        together share one. Raises LogUnavailable."""
        async with self._reading:
            if after is not None and self._read_began >= after:
                return self.current
            began = time.monotonic()
            whole = self._since is None or time.monotonic() - self._full_read_at >= FULL_READ_SECONDS
            async with self._db.use() as conn:
                since = (await (await conn.execute(sql.SNAPSHOT_XMIN)).fetchone())[0]
                all_rows, changed_rows = self.reads
                cursor = await conn.execute(all_rows if whole else changed_rows,
                                            {"namespace": self._ns.namespace, "since": self._since})
                rows = await cursor.fetchall()
                self.rows_read = cursor.rowcount
            table = {} if whole else dict(self.current or {})
            for deleted, topic, *values in rows:  # the deleted first: a topic written since is written again
                entry = None if deleted else self.entry(tuple(values))
                if entry is None:
                    table.pop(topic, None)
                else:
                    table[topic] = entry
            self.current, self._since, self._read_began = table, since, began
            if whole:
                self._full_read_at = time.monotonic()
        return table

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await self._read()
            except Exception:  # the refresher must outlive any one failed read
                log.exception("reading the %s of namespace %s failed", self.what, self._ns.namespace)

    async def _read(self) -> None:
        try:
            await self.fresh()
        except LogUnavailable as exc:
            if not self._failing:
                log.warning("%s of namespace %s could not be read, %s: %s", self.what, self._ns.namespace,
                            f"{self.unread} until they can" if self.current is None else
                            f"the {self.what} last read stay in force", exc)
                self._failing = True
            return
        finally:
            if self.current is None:
                self.current = {}  # whatever went wrong, requests are not held by it
        if self._failing:
            log.warning("%s of namespace %s read again", self.what, self._ns.namespace)
            self._failing = False

    async def close(self) -> None:
        for task in (self._refresher, self._first_read):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._refresher = self._first_read = None
        await self._db.close()
