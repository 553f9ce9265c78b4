"""Deadlines for many short waits on one event loop (a request's headers, its body), checked
together a few times a second: a timer per wait (asyncio.timeout, loop.call_later) costs more
than the wait itself when it is over at once, as nearly all are."""
import asyncio
import weakref
from collections.abc import Callable, Hashable

# How often the deadlines of one event loop are checked: a wait is cut off up to this late.
CHECK_SECONDS = 0.25


class Deadlines:
    """What each watched key must be done by, and what to do when it is late (called once)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.due: dict[Hashable, tuple[float, Callable[[], None]]] = {}
        self.late: set[Hashable] = set()
        self.checker: asyncio.Task | None = None

    def watch(self, key: Hashable, seconds: float, when_late: Callable[[], None]) -> None:
        self.due[key] = (self.loop.time() + seconds, when_late)
        if self.checker is None or self.checker.done():
            self.checker = self.loop.create_task(self.check())

    def forget(self, key: Hashable) -> bool:
        """Stops watching the key; whether it was found late."""
        self.due.pop(key, None)
        if key in self.late:
            self.late.discard(key)
            return True
        return False

    async def check(self) -> None:
        while self.due:
            await asyncio.sleep(CHECK_SECONDS)
            now = self.loop.time()
            for key, (deadline, when_late) in list(self.due.items()):
                if deadline <= now and key not in self.late:
                    self.late.add(key)
                    when_late()


_of_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loop_deadlines(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """The loop's Deadlines (one per event loop: a uvicorn worker has one, tests many)."""
    deadlines = _of_loop.get(loop)
    if deadlines is None:
        deadlines = _of_loop[loop] = Deadlines(loop)
    return deadlines
