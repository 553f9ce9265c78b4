"""A stand-in for a task App, for the `delayqueue worker` supervisor tests (test_sdk_supervisor.py):
`app.worker(topics=..., concurrency=..., asynchronous=..., max_messages=...)` answers a real Worker
on a Client (or AsyncClient) of DELAYQUEUE_URL whose handler sleeps the number of seconds in the
message body, then appends "<pid> <msgId>" to the file SDK_APP_DONE (a thread handler calls sys.exit(3) for the
body "exit"). SDK_APP_CRASH=1 makes
the worker's run() raise (a child that always crashes); SDK_APP_BREAK_SETTLE=1 makes a child's first ack
call raise KeyError (a bug in the settle loop); SDK_APP_HANDLER_TIMEOUT is the Worker's
handler_timeout (seconds); SDK_APP_RETURN_AT_ONCE=1 answers a Worker already stopped, whose run()
returns at once (a child that always exits 0 without work)."""
import asyncio
import os
import sys
import time
from collections.abc import Sequence

from delayqueue_client import AsyncClient, Client, Message, Worker


def record(message: Message) -> None:
    with open(os.environ["SDK_APP_DONE"], "a") as done:
        done.write(f"{os.getpid()} {message.msg_id}\n")


def handler(message: Message) -> None:
    if message.msg == "exit":
        sys.exit(3)
    time.sleep(float(message.msg or 0))
    record(message)


async def async_handler(message: Message) -> None:
    await asyncio.sleep(float(message.msg or 0))
    record(message)


def crash(*args: object, **kwargs: object) -> None:
    raise RuntimeError("this app cannot start")


class StandInApp:
    def worker(self, topics: Sequence[str] | None = None, *, concurrency: int = 8, asynchronous: bool = False,
               **worker_options: object) -> Worker:
        client = AsyncClient() if asynchronous else Client()
        if os.environ.get("SDK_APP_BREAK_SETTLE") == "1":
            ack_many = client.ack_many
            broken = []

            def ack_many_broken_once(*args, **kwargs):  # type: ignore[no-untyped-def]
                if kwargs.get("ack", True) and not broken:
                    broken.append(True)
                    raise KeyError("a bug in the settle path")
                return ack_many(*args, **kwargs)
            client.ack_many = ack_many_broken_once  # type: ignore[method-assign]
        if timeout := os.environ.get("SDK_APP_HANDLER_TIMEOUT"):
            worker_options["handler_timeout"] = float(timeout)
        worker = Worker(client, list(topics or ["sup"]), async_handler if asynchronous else handler,
                        concurrency=concurrency, wait_ms=300, **worker_options)  # type: ignore[arg-type]
        if os.environ.get("SDK_APP_RETURN_AT_ONCE") == "1":
            worker.stop()
        if os.environ.get("SDK_APP_CRASH") == "1":
            worker.run = crash  # type: ignore[method-assign]
        return worker


app = StandInApp()
