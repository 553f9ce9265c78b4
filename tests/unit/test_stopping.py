"""Stopping a task that swallows a cancellation still stops it."""
import asyncio

from delayqueue.core.stopping import cancel_and_wait


async def test_cancel_and_wait_repeats_a_cancellation_the_task_dropped():
    dropped = asyncio.Event()

    async def drops_the_first_cancellation():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            dropped.set()  # as Python 3.11's wait_for does when what it waits for completes
        await asyncio.sleep(60)

    task = asyncio.ensure_future(drops_the_first_cancellation())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert dropped.is_set() and task.cancelled()
