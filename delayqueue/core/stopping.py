"""Stopping background tasks (pub/sub listeners, topic workers) so that they really stop."""
import asyncio

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
