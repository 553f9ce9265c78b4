"""FairShare: the turns at the scanners' shared Redis connection, granted round-robin among the namespaces."""
import asyncio

from delayqueue.core.fair_share import FairShare


async def test_a_party_alone_holds_every_turn():
    share = FairShare(3)
    party = share.party("busy")
    held = asyncio.Event()

    async def hold():
        async with party:
            await held.wait()

    holders = [asyncio.ensure_future(hold()) for _ in range(4)]
    await asyncio.sleep(0)
    assert share._free == 0 and len(share._waiting["busy"]) == 1  # three turns held, the fourth waits
    held.set()
    await asyncio.gather(*holders)
    assert share._free == 3 and not share._waiting


async def test_free_turns_go_round_the_parties_waiting_not_to_the_first_comers():
    share = FairShare(2)
    order, release = [], asyncio.Event()

    async def one(name):
        async with share.party(name):
            order.append(name)
            await release.wait()

    tasks = [asyncio.ensure_future(one(name)) for name in ("a",) * 6 + ("b",) * 3 + ("c",)]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["a", "a", "a", "b", "c", "a", "b", "a", "b", "a"]


async def test_takers_cancelled_while_waiting_or_as_they_were_granted_leave_no_turn_lost():
    share = FairShare(1)
    await share.take("a")
    b, c, d = (asyncio.ensure_future(share.take(name)) for name in "bcd")
    await asyncio.sleep(0)
    b.cancel()  # and out of the queue before the turn comes back
    await asyncio.sleep(0)
    c.cancel()  # still in its queue as the turn comes back: passed over
    share.give_back()  # to d
    d.cancel()  # granted, cancelled before it ran: d gives it back
    await asyncio.gather(b, c, d, return_exceptions=True)
    assert all(task.cancelled() for task in (b, c, d))
    assert share._free == 1 and not share._waiting
    await asyncio.wait_for(share.take("e"), 1)
