"""Calling the async queue layer from sync code (the admin, the dashboard).

asyncio Redis connections belong to one event loop, and async_to_sync may run each call on a
different one, so every call gets its own Runtime, closed before returning."""
import os

from asgiref.sync import async_to_sync

from delayqueue.config.settings import load_config
from delayqueue.runtime import Runtime


def run_with_runtime(func, *args, **kwargs):
    """Runs `await func(rt, *args, **kwargs)` with a fresh Runtime and returns its result."""

    async def call():
        rt = Runtime(load_config(), process=f"admin pid {os.getpid()}")
        try:
            return await func(rt, *args, **kwargs)
        finally:
            await rt.close()

    return async_to_sync(call)()
