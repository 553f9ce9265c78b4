"""Stopping background tasks (pub/sub listeners, topic workers) so that they really stop, and the
loop of a background worker that stops when told."""
import asyncio
import contextlib

from delayqueue.core.outage import Outage, describe

# How long one cancellation is given before it is made again.
CANCEL_AGAIN_SECONDS = 0.5


async def cancel_and_wait(*tasks: asyncio.Task) -> None:
    """Cancels the tasks and returns once every one has ended.

    A single cancel() is not enough on Python 3.11: asyncio.wait_for, which redis-py uses for
    its writes and connection handshakes, drops a cancellation that arrives just as the write
    completes (CPython gh-86296). A listener that was reconnecting after a Redis restart then
    went on listening, and whoever awaited it waited forever. The cancellation is repeated
    until the task has ended."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_SECONDS)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: asyncio would otherwise report it as never retrieved


async def repeat(step, stopping: asyncio.Event, *, outage: Outage, after_failure, retry_seconds: float) -> None:
    """Runs `step()` until `stopping` is set; it answers the seconds to pause before it runs again
    (0: at once). A failure is reported to `outage` (logged once per outage), `after_failure()`
    is awaited (dropping a connection that may be broken), and the step runs again after
    `retry_seconds`. A background worker's loop: stopping ends the pause at once."""
    while not stopping.is_set():
        try:
            pause = await step()
            outage.ok()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage.failed(describe(exc))
            await after_failure()
            pause = retry_seconds
        if pause:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), pause)
