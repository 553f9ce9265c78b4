"""A bound on how many turns at something shared are held at once, with the free turns granted
round-robin among the parties waiting: a party that wants a turn waits behind at most one grant to
each other party waiting, however many turns those want. A party alone gets every turn."""
import asyncio
from collections import deque


class FairShare:
    def __init__(self, turns: int):
        self._free = turns
        # A waiting party -> its takers, first come first served; the dict's order is the round.
        self._waiting: dict[str, deque[asyncio.Future]] = {}

    def party(self, name: str) -> "Party":
        return Party(self, name)

    async def take(self, name: str) -> None:
        """Returns once `name` holds a turn, given back with give_back."""
        if self._free and not self._waiting:
            self._free -= 1
            return
        taker = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(name, deque())
        queue.append(taker)
        try:
            await taker
        except asyncio.CancelledError:
            if taker.done() and not taker.cancelled():  # granted as it was cancelled: the turn goes on
                self.give_back()
            elif taker in queue:  # still waiting: a turn granted to it would never be given back
                queue.remove(taker)
                if not queue and self._waiting.get(name) is queue:
                    del self._waiting[name]
            raise

    def give_back(self) -> None:
        self._free += 1
        while self._free and self._waiting:
            name = next(iter(self._waiting))
            queue = self._waiting.pop(name)
            taker = queue.popleft()
            if queue:
                self._waiting[name] = queue  # to the end of the round
            if not taker.done():  # else cancelled, and not yet out of its queue
                self._free -= 1
                taker.set_result(None)


class Party:
    """One party's turns, as an async context manager."""

    def __init__(self, share: FairShare, name: str):
        self._share, self._name = share, name

    async def __aenter__(self) -> None:
        await self._share.take(self._name)

    async def __aexit__(self, *exc) -> None:
        self._share.give_back()
