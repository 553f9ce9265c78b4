"""The SDK's FakeServer under a test-sized load (issue 30's goal: 10,000 tasks in at most 2 s):
send N messages with delays up to a minute (in sendMsgBatch calls of 500, or through the batching
producer), advance the fake clock past them, and drain them with the SDK's Worker (8 threads) or
with plain pulls and ackMsgBatch calls. One row per way; each on a new FakeServer.

    python -m bench.sdk_fake [count=10000]
"""
import sys
import threading
import time
from typing import Callable

from delayqueue_client import Worker
from delayqueue_client.testing import FakeServer

TOPIC = "bench"


def body(i: int) -> str:
    return f'{{"v": 1, "task": "noop", "args": [{i}], "kwargs": {{}}, "headers": {{}}}}'


def send_batches(server: FakeServer, count: int) -> None:
    with server.client() as client:
        for start in range(0, count, 500):
            client.send_many([{"topic": TOPIC, "msg": body(i), "delay_ms": i % 60_000}
                              for i in range(start, min(count, start + 500))])
    server.clock.advance(60)


def send_through_producer(server: FakeServer, count: int) -> None:
    with server.client() as client, client.producer(max_batch=500) as producer:
        for i in range(count):
            producer.send(TOPIC, body(i), delay_ms=i % 60_000)
    server.clock.advance(60)


def drain_with_worker(server: FakeServer, count: int) -> None:
    handled = 0
    lock, done = threading.Lock(), threading.Event()

    def handler(message: object) -> None:
        nonlocal handled
        with lock:
            handled += 1
            if handled == count:
                done.set()

    with server.client() as client:
        worker = Worker(client, TOPIC, handler, concurrency=8, wait_ms=1000)
        runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        runner.start()
        done.wait()
        worker.stop()
        runner.join()
        assert client.topic_info(TOPIC)["ackQueueSize"] == 0


def drain_with_pulls(server: FakeServer, count: int) -> None:
    drained = 0
    with server.client() as client:
        while drained < count:
            messages = client.pull(TOPIC, batch=500)
            assert all(client.ack_many(TOPIC, [m.msg_id for m in messages]))
            drained += len(messages)


def run(count: int, send: Callable[[FakeServer, int], None], drain: Callable[[FakeServer, int], None]) -> float:
    server = FakeServer()
    started = time.perf_counter()
    send(server, count)
    drain(server, count)
    seconds = time.perf_counter() - started
    info = server.client().topic_info(TOPIC)
    assert info["readyQueueSize"] == info["waitingQueueSize"] == info["ackQueueSize"] == 0
    return seconds


def main() -> None:
    count = int(sys.argv[1].split("=", 1)[1]) if len(sys.argv) > 1 else 10_000
    for sent, send, drained, drain in (
            ("sendMsgBatch calls", send_batches, "the Worker (8 threads)", drain_with_worker),
            ("sendMsgBatch calls", send_batches, "pulls + ackMsgBatch", drain_with_pulls),
            ("the producer", send_through_producer, "the Worker (8 threads)", drain_with_worker)):
        seconds = run(count, send, drain)
        print(f"fake server: {count} tasks sent in {sent}, clock advanced, drained by {drained}: "
              f"{seconds:.2f} s ({count / seconds:,.0f} tasks/s)")


if __name__ == "__main__":
    main()
