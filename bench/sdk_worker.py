"""One SDK worker process with an empty handler, as bench.python_queues starts it for the drain
rows; SIGTERM stops it (the Worker finishes and acks what it holds).

    python -m bench.sdk_worker BASE_URL TOPIC [concurrency=N] [batch=N]
"""
import sys

from delayqueue_client import Client, Worker


def main():
    base_url, topic = sys.argv[1:3]
    options = {name: int(value) for name, value in (arg.split("=", 1) for arg in sys.argv[3:])}
    with Client(base_url) as client:
        Worker(client, topic, lambda message: None, **options).run()


if __name__ == "__main__":
    main()
