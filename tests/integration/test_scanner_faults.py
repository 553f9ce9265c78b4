"""`manage.py run_scanners` started while Redis or PostgreSQL is down: it waits, saying so once,
and works as soon as the store is there."""
import asyncio

import pytest

from delayqueue.services.messages import get_message
from delayqueue.services.send import SendRequest, send_message
from tests.helpers import history, make_runtime, wait_until
from tools.stack import Services, free_port

pytestmark = [pytest.mark.process, pytest.mark.fault]


async def promoted(rt, message) -> bool:
    stored = await get_message(rt, topic=message.topic, msg_id=message.msg_id)
    return stored is not None and stored.status == 2


def lines_with(scanner, text: str) -> list[str]:
    return [line for line in scanner.output().splitlines() if text in line]


async def said(scanner, text: str) -> None:
    """Waits for the scanner's first line with `text`: its first try comes once Python and Django
    are up, which takes seconds on a loaded machine."""
    async def line():
        return lines_with(scanner, text)

    await wait_until(line, timeout=60, interval=0.05, what=f"the scanner to say {text!r}")


async def test_a_scanner_started_while_redis_is_down_waits_for_it(server_dir, scanner_process):
    port = free_port()
    redis = Services(server_dir, durable=False)
    url = f"redis://:{redis.redis_password}@127.0.0.1:{port}/0"
    scanner = scanner_process("early", REDIS_URL=url, DELAYQUEUE_MESSAGE_LOG=0)
    await said(scanner, "cannot start yet")
    await asyncio.sleep(3)  # a dozen tries more
    assert scanner.proc.poll() is None, scanner.output()
    [waiting] = lines_with(scanner, "cannot start yet")  # one line, not one per try
    assert "connection refused" in waiting
    rt = make_runtime(url, message_log=False)
    try:
        redis.redis("redis", port)
        sent = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=300))
        await wait_until(lambda: promoted(rt, sent), timeout=15, what="the scanner to promote the message")
        assert lines_with(scanner, "working again")
    finally:
        await rt.close()
        assert scanner.stop() == 0, scanner.output()  # SIGTERM: a clean exit
        redis.stop()


async def test_a_scanner_started_while_postgres_is_down_works_and_writes_the_history_later(
        single_rt, scanner_process, postgres):
    rt = single_rt
    sent = await send_message(rt, request=SendRequest(topic="t", msg="x", delay_millis=2000))  # logged before the stop
    postgres.stop()
    scanner = scanner_process("early")
    # Promotion needs only Redis: it goes on while the log is down (a loaded machine's start takes a while).
    await wait_until(lambda: promoted(rt, sent), timeout=30, what="the scanner to promote the message")
    await said(scanner, "log writer")
    await asyncio.sleep(1.5)  # several of the log writer's tries more
    assert scanner.proc.poll() is None, scanner.output()
    [waiting] = lines_with(scanner, "log writer")
    assert "message log unavailable: connection refused" in waiting
    postgres.start()

    async def due_in_history():
        return ("due", 1, 2, 0) in await history("t", sent.msg_id)

    await wait_until(due_in_history, timeout=20, what="the 'due' history row once PostgreSQL is back")
    assert scanner.stop() == 0, scanner.output()
