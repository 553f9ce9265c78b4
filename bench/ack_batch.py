"""Batch acks: a ready backlog drained by one consumer process with one ackMsg per message, then
the same backlog drained with one ackMsgBatch per pull, in the same run on the same stack.

The consumer is this process: sequential calls over one keep-alive HTTP connection, as an SDK
consumer thread makes them; each pull takes --batch messages, then acks them (one call each, or
one ackMsgBatch). The backlog is sent with sendMsgBatch before each drain (due at once), and the
drain's clock runs from its first pull to its last ack. Message log on, one scanner (its log
writer takes the acks' history). Goal (issue 17): ackMsgBatch at least 3x the per-message rate.

    .venv/bin/python -m bench.ack_batch [--messages 20000] [--batch 100] [--rounds 1]
"""
import argparse
import statistics
import time

import httpx

from bench.harness import stack

API = "/camellia/delayQueue/"


def fill(client: httpx.Client, topic: str, messages: int) -> None:
    for start in range(0, messages, 1000):
        items = [{"topic": topic, "msg": f"m{i}", "delayMillis": 0} for i in range(start, min(start + 1000, messages))]
        body = client.post(API + "sendMsgBatch", json=items).json()
        assert all(result["code"] == 200 for result in body["results"]), body


def drain(client: httpx.Client, topic: str, messages: int, batch: int, batched: bool) -> float:
    """Pulls and acks until `messages` are acked; answers messages per second."""
    acked = 0
    started = time.perf_counter()
    while acked < messages:
        pulled = client.post(API + "pullMsg", data={"topic": topic, "batch": batch}).json()["delayMsgList"]
        ids = [m["msgId"] for m in pulled]
        if batched:
            results = client.post(API + "ackMsgBatch", json={"topic": topic, "msgIds": ids}).json()["results"]
            assert all(result["done"] for result in results)
        else:
            for msg_id in ids:
                assert client.post(API + "ackMsg", data={"topic": topic, "msgId": msg_id}).json()["done"]
        acked += len(ids)
    return messages / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="backlog per drain")
    parser.add_argument("--batch", type=int, default=100, help="messages per pull (and per ackMsgBatch)")
    parser.add_argument("--rounds", type=int, default=1, help="each round drains once per way; medians are printed")
    args = parser.parse_args()
    rates = {"ackMsg": [], "ackMsgBatch": []}
    with stack(scanners=1) as (urls, _env), httpx.Client(base_url=urls["main"], timeout=30) as client:
        for round_number in range(args.rounds):
            # Alternating which goes first evens out whatever the first drain of a round pays.
            order = ["ackMsg", "ackMsgBatch"] if round_number % 2 == 0 else ["ackMsgBatch", "ackMsg"]
            for way in order:
                topic = f"drain-{way}-{round_number}"
                fill(client, topic, args.messages)
                rate = drain(client, topic, args.messages, args.batch, batched=way == "ackMsgBatch")
                rates[way].append(rate)
                print(f"round {round_number + 1}: {way:<11} {rate:,.0f} msg/s")
    single, batched = statistics.median(rates["ackMsg"]), statistics.median(rates["ackMsgBatch"])
    print(f"{args.messages:,} ready messages, pulls of {args.batch}, one consumer process:")
    print(f"  one ackMsg per message  {single:,.0f} msg/s")
    print(f"  one ackMsgBatch a pull  {batched:,.0f} msg/s")
    print(f"  ratio {batched / single:.1f}x  (goal >= 3x)")


if __name__ == "__main__":
    main()
