"""A namespace's table of operator settings (limits, topic settings) as each process holds it:
read from PostgreSQL on first use and every REFRESH_SECONDS after, so the hot paths read
`current` without waiting on PostgreSQL and a change is in force on every process within a
second. Reading fails open: while PostgreSQL cannot be read, the table last read stays in force
(an empty one, in a process that has not read it yet) and the log says so once."""
import asyncio
import logging

from delayqueue.core.exceptions import LogUnavailable
from delayqueue.live.keys import NamespaceKeys
from delayqueue.messagelog.connection import LogConnection

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5
# A read that takes longer fails (and the table last read stays in force): the first read holds
# the process' first queue requests.
READ_TIMEOUT_MILLIS = 2_000


class RefreshedTable:
    """Subclasses say what the table is (`what`, for the log), the statement that reads it (one
    parameter: the namespace), what is in force before the first read (`unread`, for the log),
    and how its rows become the table (`build`)."""

    what: str
    statement: str
    unread: str

    def __init__(self, ns: NamespaceKeys):
        self._ns = ns
        self._db = LogConnection(READ_TIMEOUT_MILLIS)
        self.current: dict | None = None  # the table in force, None until the first read
        self._first_read: asyncio.Future | None = None
        self._refresher: asyncio.Task | None = None
        self._failing = False  # a read failed, and the log said so: said again once one succeeds

    def build(self, rows: list[tuple]) -> dict:
        raise NotImplementedError

    async def table(self) -> dict:
        """The table in force (read first, on the first call)."""
        if self.current is None:
            if self._first_read is None:
                self._first_read = asyncio.ensure_future(self._read())
                self._refresher = asyncio.ensure_future(self._refresh_forever())
            await asyncio.shield(self._first_read)  # a caller that goes away leaves the read to the others
        return self.current

    async def fresh(self) -> dict:
        """The table read now, and in force in this process from now (after this process changed
        it). Raises LogUnavailable."""
        async with self._db.use() as conn:
            cursor = await conn.execute(self.statement, [self._ns.namespace])
            rows = await cursor.fetchall()
        self.current = self.build(rows)
        return self.current

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
