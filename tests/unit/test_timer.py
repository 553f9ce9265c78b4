"""The scanner's precise timer: wakes in the event loop, never early, in due order, and
thousands falling due at once handed to the loop together."""
import asyncio
import threading
import time

from delayqueue.core.timer import PreciseTimer


async def test_callbacks_run_in_the_loop_in_due_order_and_never_early():
    loop = asyncio.get_running_loop()
    timer = PreciseTimer(loop)
    ran, done = [], asyncio.Event()
    start = time.monotonic()
    try:
        for delay in (0.08, 0.02, 0.05, 0.0):
            def fired(delay=delay):
                ran.append((delay, time.monotonic() - start, threading.current_thread()))
                if len(ran) == 4:
                    done.set()
            timer.call_at(start + delay, fired)
        await asyncio.wait_for(done.wait(), 5)
    finally:
        timer.close()
    assert [delay for delay, _, _ in ran] == [0.0, 0.02, 0.05, 0.08]
    assert all(at >= delay for delay, at, _ in ran)
    assert {thread for _, _, thread in ran} == {threading.current_thread()}


async def test_thousands_due_at_once_reach_the_loop_in_a_few_hand_overs():
    loop = asyncio.get_running_loop()
    hand_overs = 0
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counting(*args):
        nonlocal hand_overs
        hand_overs += 1
        return call_soon_threadsafe(*args)

    loop.call_soon_threadsafe = counting
    timer = PreciseTimer(loop)
    ran, done = [], asyncio.Event()
    due = time.monotonic() + 0.2
    try:
        for i in range(2000):
            def fired(i=i):
                ran.append(i)
                if len(ran) == 2000:
                    done.set()
            timer.call_at(due, fired)
        await asyncio.wait_for(done.wait(), 5)
    finally:
        timer.close()
        del loop.call_soon_threadsafe
    assert ran == list(range(2000))  # same due time: in the order they were set
    assert hand_overs <= 5  # one wake of the loop for them all, not one each
