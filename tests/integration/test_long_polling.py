"""Long polling: woken through Redis by due messages, nacks and ack timeouts; final pull at the timeout."""
import asyncio
import time

import pytest

from delayqueue.runtime import close_current, current
from delayqueue.services.consume import long_poll_messages, nack_message, pull_messages
from delayqueue.services.send import SendRequest, send_message, send_messages
from tests.helpers import REDIS_URL, make_runtime

BASE = "/camellia/delayQueue/"


async def long_poll(api, topic, timeout_ms=5000, **params):
    started = time.monotonic()
    response = await api.post(BASE + "longPollingMsg",
                              data={"topic": topic, "longPollingTimeoutMillis": str(timeout_ms), **params})
    body = response.json()
    assert body["code"] == 200
    return body["delayMsgList"], time.monotonic() - started


async def test_returns_at_once_when_a_message_is_ready(api, single_rt):
    await send_message(single_rt, request=SendRequest(topic="lp", msg="x", delay_millis=0))
    messages, elapsed = await long_poll(api, "lp", timeout_ms=5000)
    assert [m["msg"] for m in messages] == ["x"] and elapsed < 4


async def test_times_out_with_an_empty_list(api):
    messages, elapsed = await long_poll(api, "lp", timeout_ms=300)
    assert messages == [] and elapsed >= 0.3


async def test_timeout_is_clamped_to_the_configured_maximum(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_LONG_POLLING_TIMEOUT_MILLIS": 300}
    messages, elapsed = await long_poll(api, "lp", timeout_ms=60_000)
    assert messages == [] and 0.3 <= elapsed < 30


@pytest.mark.process
async def test_woken_by_a_due_message_promoted_by_a_scanner_in_another_process(api, scanner_process):
    scanner = scanner_process("s1")
    scanner.wait_started()
    rt = current()
    poll = asyncio.create_task(long_poll(api, "due", timeout_ms=20_000))
    await asyncio.sleep(0.2)
    sent = await send_message(rt, request=SendRequest(topic="due", msg="later", delay_millis=300))
    messages, elapsed = await poll
    assert [m["msgId"] for m in messages] == [sent.msg_id]
    assert elapsed < 15  # woken by the promotion, long before the 20 s hold ends


async def test_woken_by_a_nack(api):
    rt = current()
    sent = await send_message(rt, request=SendRequest(topic="nk", msg="x", delay_millis=0))
    await pull_messages(rt, topic="nk")
    poll = asyncio.create_task(long_poll(api, "nk", timeout_ms=20_000))
    await asyncio.sleep(0.2)
    assert not poll.done()
    await nack_message(rt, topic="nk", msg_id=sent.msg_id)
    messages, elapsed = await poll
    assert [m["retry"] for m in messages] == [2] and elapsed < 15


async def test_woken_by_an_ack_timeout(api, start_scanner):
    rt = current()
    await start_scanner(make_runtime(REDIS_URL))
    sent = await send_message(rt, request=SendRequest(topic="to", msg="x", delay_millis=0))
    await pull_messages(rt, topic="to", ack_timeout_millis=300)
    messages, elapsed = await long_poll(api, "to", timeout_ms=20_000)
    assert [m["msgId"] for m in messages] == [sent.msg_id] and messages[0]["retry"] == 2
    assert elapsed < 15


async def test_many_waiters_each_get_one_message(api, start_scanner):
    rt = current()
    await start_scanner(make_runtime(REDIS_URL))
    polls = [asyncio.create_task(long_poll(api, "many", timeout_ms=20_000)) for _ in range(20)]
    await asyncio.sleep(0.3)
    # One promotion publishes once; the waiters pass the wake on while messages remain.
    await send_messages(rt, requests=[SendRequest(topic="many", msg=str(i), delay_millis=200) for i in range(20)])
    results = await asyncio.gather(*polls)
    delivered = sorted(m["msg"] for messages, _ in results for m in messages)
    assert delivered == sorted(str(i) for i in range(20))
    assert all(elapsed < 15 for _, elapsed in results)


async def test_a_timed_out_waiter_leaves_nothing_behind_and_takes_no_wake(single_rt):
    rt = single_rt
    assert await long_poll_messages(rt, topic="gone", timeout_millis=200) == []
    notifier = await rt.notifier()
    assert notifier.waiting("gone") == 0
    # A wake now finds nobody in this process, so the message stays ready for the next pull.
    await send_message(rt, request=SendRequest(topic="gone", msg="x", delay_millis=0))
    messages, remaining = await pull_messages(rt, topic="gone")
    assert [m.payload for m in messages] == ["x"] and remaining == 0


async def test_a_client_that_hangs_up_stops_its_hold(clean_state):
    """Served as uvicorn serves it: the body, then http.disconnect while the poll is held."""
    from project.asgi import application

    hung_up = asyncio.Event()
    messages = [{"type": "http.request", "body": b"topic=hangup&longPollingTimeoutMillis=20000", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await hung_up.wait()
        return {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": BASE + "longPollingMsg", "raw_path": (BASE + "longPollingMsg").encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/x-www-form-urlencoded")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    held = asyncio.create_task(application(scope, receive, send))
    notifier = await current().notifier()
    for _ in range(100):
        if notifier.waiting("hangup"):
            break
        await asyncio.sleep(0.02)
    assert notifier.waiting("hangup") == 1
    hung_up.set()
    await asyncio.wait_for(held, 5)  # returns long before the 20 s hold would have ended
    assert sent == [] and notifier.waiting("hangup") == 0
    await close_current()


async def test_a_cancelled_waiter_passes_its_wake_on(single_rt):
    rt = single_rt
    first = asyncio.create_task(long_poll_messages(rt, topic="c", timeout_millis=20_000))
    await asyncio.sleep(0.1)
    second = asyncio.create_task(long_poll_messages(rt, topic="c", timeout_millis=20_000))
    await asyncio.sleep(0.1)
    notifier = await rt.notifier()
    assert notifier.waiting("c") == 2
    first.cancel()
    await send_message(rt, request=SendRequest(topic="c", msg="x", delay_millis=0))
    messages = await asyncio.wait_for(second, 10)
    assert [m.payload for m in messages] == ["x"]
    assert notifier.waiting("c") == 0


async def test_a_held_poll_takes_a_waiting_message_when_it_falls_due_without_a_scanner(api):
    # No scanner runs here: the poll saw the message waiting and asked for a wake at its due time.
    rt = current()
    sent = await send_message(rt, request=SendRequest(topic="own", msg="x", delay_millis=400))
    messages, elapsed = await long_poll(api, "own", timeout_ms=20_000)
    received = time.time() * 1000
    assert [m["msgId"] for m in messages] == [sent.msg_id] and messages[0]["retry"] == 1
    assert received >= sent.trigger_time and 0.3 <= elapsed < 15  # not early, long before the hold ends


@pytest.mark.parametrize("rt", ["single", "cluster"], indirect=True)
async def test_a_pull_makes_due_messages_ready_first_each_at_its_priority(rt):
    # Due in a second: the send (its log write first) and the pull take more than the 100 ms
    # this had on a loaded machine, and found them due already.
    sent = await send_messages(rt, requests=[
        SendRequest(topic="late", msg=str(p), delay_millis=1000, priority=p) for p in (0, 5, 9)])
    assert await pull_messages(rt, topic="late", batch=3) == ([], 0)  # not due yet
    await asyncio.sleep(1.1)  # due now; no scanner has promoted them
    messages, remaining = await pull_messages(rt, topic="late", batch=2)
    assert [m.payload for m in messages] == ["9", "5"] and remaining == 1
    assert all(m.retry == 1 for m in messages) and {m.msg_id for m in messages} < {s.msg_id for s in sent}
