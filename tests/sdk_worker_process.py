"""A delayqueue_client Worker as its own process, for test_sdk_worker's SIGTERM test:
`python -m tests.sdk_worker_process URL TOPIC HANDLER_SECONDS DONE_FILE`. Each handler sleeps, then
appends its msgId to DONE_FILE; SIGTERM stops the worker (installed by Worker.run)."""
import logging
import sys
import time

from delayqueue_client import Client, Worker


def main() -> None:
    url, topic, seconds, done_path = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    def handler(message):
        time.sleep(float(seconds))
        with open(done_path, "a") as done:
            done.write(message.msg_id + "\n")

    with Client(url) as client:
        Worker(client, topic, handler, concurrency=4, ack_timeout_ms=5_000, wait_ms=300).run()


if __name__ == "__main__":
    main()
