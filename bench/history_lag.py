"""History lag: time from a transition in Redis to its history row in PostgreSQL, under load.

Producers send --rate messages/s (batches every 10 ms) and consumers pull and ack them, through
the service layer on the same Redis and durable PostgreSQL as the real stack; a real
`manage.py run_scanners` process runs the log writer. A poller reads new history rows every
10 ms; lag = when the poller first saw a row − the transition's time (`at`: the Redis stream entry
id, or for 'sent' rows, which the send path writes itself, the produceTime; the same host
clock). Three transitions per message: sent, pulled, acked.
Goal (issue 3): p99 <= 1 s at 2,000 messages/s.

    .venv/bin/python -m bench.history_lag [--rate 2000] [--seconds 20]
"""
import argparse
import asyncio
import os
import time

import psycopg

from bench.harness import percentile, stack


async def run(rate: int, seconds: int, env: dict) -> None:
    import django

    os.environ.update({k: env[k] for k in ("REDIS_URL", "DATABASE_URL")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    django.setup()
    from delayqueue.config.settings import load_config
    from delayqueue.runtime import Runtime
    from delayqueue.services.consume import ack_message, pull_messages
    from delayqueue.services.send import SendRequest, send_messages

    rt = Runtime(load_config(), process="bench-load")
    topics = [f"lag{i}" for i in range(4)]
    stop_at = time.monotonic() + seconds
    sent = acked = 0
    lags: list[float] = []

    async def produce():
        """A batch every 10 ms, not waiting for the previous one: the rate holds while sends queue."""
        nonlocal sent
        per_tick = rate // 100
        next_tick = time.monotonic()
        pending = set()
        while time.monotonic() < stop_at:
            batch = [SendRequest(topic=topics[(sent + j) % 4], msg="x", delay_millis=0) for j in range(per_tick)]
            task = asyncio.ensure_future(send_messages(rt, requests=batch))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += per_tick
            next_tick += 0.01
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        await asyncio.gather(*pending)

    async def consume(topic):
        nonlocal acked
        while time.monotonic() < stop_at + 1:
            messages, _ = await pull_messages(rt, topic=topic, batch=200)
            if not messages:
                await asyncio.sleep(0.005)
                continue
            await asyncio.gather(*(ack_message(rt, topic=topic, msg_id=m.msg_id) for m in messages))
            acked += len(messages)

    async def poll():
        # Sends and the log writer commit concurrently, so a row may become visible after rows
        # with higher ids: ids skipped over are asked for again until they show up, or for 5 s
        # (an ON CONFLICT DO NOTHING leaves a gap that never fills).
        last_id, missing = 0, {}
        async with await psycopg.AsyncConnection.connect(
                env["DATABASE_URL"].replace("postgres://", "postgresql://"), autocommit=True) as conn:
            while time.monotonic() < stop_at + 5:
                # Two index scans: with OR the planner scans the whole table, every 10 ms.
                rows = await (await conn.execute(
                    "SELECT id, (extract(epoch FROM at) * 1000)::int8 FROM delayqueue_messageevent WHERE id > %s"
                    " UNION ALL SELECT id, (extract(epoch FROM at) * 1000)::int8 FROM delayqueue_messageevent"
                    " WHERE id = ANY(%s) ORDER BY id", [last_id, list(missing)])).fetchall()
                seen = time.time() * 1000
                for row_id, at in rows:
                    if row_id > last_id:
                        missing.update(dict.fromkeys(range(last_id + 1, row_id), seen))
                        last_id = row_id
                    else:
                        del missing[row_id]
                    lags.append(seen - at)
                missing = {i: since for i, since in missing.items() if seen - since < 5000}
                await asyncio.sleep(0.01)

    await asyncio.gather(produce(), *(consume(t) for t in topics), poll())
    await rt.close()
    print(f"sent {sent:,} and acked {acked:,} messages in {seconds} s ({sent / seconds:,.0f} msg/s); "
          f"{len(lags):,} history rows seen ({len(lags) / seconds:,.0f}/s)")
    print(f"  history lag p50 {percentile(lags, 50):.0f} ms, p99 {percentile(lags, 99):.0f} ms, "
          f"max {max(lags):.0f} ms  (goal p99 <= 1000 ms)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="messages per second")
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    with stack(scanners=1) as (_urls, env):
        asyncio.run(run(args.rate, args.seconds, env))


if __name__ == "__main__":
    main()
