"""A delayqueue_client Worker as its own process, for test_sdk_worker's SIGTERM test:
`python -m tests.sdk_worker_process URL TOPIC HANDLER_SECONDS DONE_FILE threads|async`. Each handler
sleeps, then appends its msgId to DONE_FILE; SIGTERM stops the worker (handlers installed by Worker.run)."""
import asyncio
import logging
import sys
import time

from delayqueue_client import AsyncClient, Client, Worker


def main() -> None:
    url, topic, seconds, done_path, flavour = sys.argv[1:6]
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    def record(message):
        with open(done_path, "a") as done:
            done.write(message.msg_id + "\n")

    def handler(message):
        time.sleep(float(seconds))
        record(message)

    async def async_handler(message):
        await asyncio.sleep(float(seconds))
        record(message)

    # Worker.run() on an AsyncClient runs run_async() in a new event loop.
    client = AsyncClient(url) if flavour == "async" else Client(url)
    Worker(client, topic, async_handler if flavour == "async" else handler, concurrency=4, batch=4, ack_timeout_ms=5_000,
           wait_ms=300).run()


if __name__ == "__main__":
    main()
