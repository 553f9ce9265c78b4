"""Push delivery (docs/push.md) against real HTTP receivers: what a receiver gets, what its
answers do to the message, and what the pushers hold to."""
import asyncio
import dataclasses
import hashlib
import hmac
import socket
import threading
import time
from collections import Counter
from urllib.parse import unquote

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from delayqueue_client import InvalidSignature, verify_signature
from django.contrib.auth.models import User
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue.config.push_hosts import HostPolicy
from delayqueue.core.constants import Reason, Status
from delayqueue.live.keys import Meta
from delayqueue.messagelog import sql
from delayqueue.models import Message
from delayqueue.runtime import close_current
from delayqueue.services import topic_control
from delayqueue.services.admission import throttled_field
from delayqueue.services.messages import get_message
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.services.topic_control import set_topic_config
from delayqueue.stores.limits import NAMESPACE
from delayqueue.stores.rows import set_limits
from delayqueue.workers import push_http
from delayqueue.workers import pusher as pusher_module
from tests.helpers import (REDIS_CLUSTER_URL, REDIS_URL, LoopTurns, call, drain_log, make_runtime, query,
                           wait_until)
from tools.stack import free_port


async def set_push(api, topic: str, url: str, **settings) -> dict:
    answer = await call(api, "setTopicConfig", topic=topic, pushUrl=url, **settings)
    assert answer["code"] == 200, answer
    return answer["data"]


async def send(api, topic: str, msg_id: str, delay: int = 0, **params) -> dict:
    answer = await call(api, "sendMsg", topic=topic, msgId=msg_id, msg=f"body of {msg_id}", delayMillis=delay, **params)
    assert answer["code"] == 200, answer
    return answer["delayMsg"]


async def status_of(api, topic: str, msg_id: str) -> int:
    answer = await call(api, "getMsg", method="get", topic=topic, msgId=msg_id)
    return answer["delayMsg"]["status"]


async def arrived(receiver, msg_id: str, count: int = 1, timeout: float = 10) -> list[dict]:
    async def enough():
        return len(receiver.of(msg_id)) >= count

    await wait_until(enough, timeout=timeout, what=f"{count} push(es) of {msg_id}")
    return receiver.of(msg_id)


async def ends_as(api, topic: str, msg_id: str, status: int, timeout: float = 10) -> None:
    async def ended():
        return await status_of(api, topic, msg_id) == status

    await wait_until(ended, timeout=timeout, what=f"{msg_id} in status {status}")


async def attempts(rt, topic: str, msg_id: str) -> list[tuple]:
    """The push attempts in the message log's history, (reason, detail) in order: each event
    with a detail (the last failed attempt's reason says how the message ended)."""
    await drain_log(rt, [topic])
    rows = await query("SELECT reason, detail FROM delayqueue_messageevent WHERE topic = %s AND msg_id = %s"
                       " AND detail <> '' ORDER BY at, id", topic, msg_id)
    return [tuple(row) for row in rows]


async def test_a_due_message_is_posted_signed_and_acked_by_a_2xx(api, single_rt, start_pusher, push_receiver):
    receiver = await push_receiver()
    config = await set_push(api, "orders", receiver.url)
    secret = config["pushSecret"]
    assert secret.startswith("dqps_") and len(secret) == 5 + 43
    await start_pusher()
    sent = await send(api, "orders", "m1", delay=300)
    [request] = await arrived(receiver, "m1")
    assert request["at"] >= sent["triggerTime"]
    assert request["message"] == {**sent, "retry": 1, "status": Status.CONSUMING}
    headers = request["headers"]
    assert headers["DelayQueue-Topic"] == "orders"
    assert headers["DelayQueue-Msg-Id"] == "m1"
    assert headers["DelayQueue-Retry"] == "1"
    assert headers["Content-Type"] == "application/json"
    t, v1 = headers["DelayQueue-Signature"].split(",")
    assert t.startswith("t=") and abs(int(t[2:]) - request["at"]) < 5_000
    expected = hmac.new(secret.encode(), f"{t[2:]}.".encode() + request["body"], hashlib.sha256).hexdigest()
    assert v1 == f"v1={expected}"
    verify_signature(secret, headers, request["body"])
    await ends_as(api, "orders", "m1", Status.ACKED)
    assert await attempts(single_rt, "orders", "m1") == [(Reason.PUSHED, "200")]
    assert len(receiver.requests) == 1
    # Consumers get nothing of a push topic.
    await send(api, "orders", "m2", delay=60_000)
    answer = await call(api, "pullMsg", topic="orders", batch=10)
    assert answer["code"] == 200 and answer["delayMsgList"] == []
    await send(api, "orders", "m3")  # due now: the pusher's, not a long poll's
    answer = await call(api, "longPollingMsg", topic="orders", batch=10, longPollingTimeoutMillis=300)
    assert answer["code"] == 200 and answer["delayMsgList"] == []
    await arrived(receiver, "m3")


async def test_a_failed_attempt_is_pushed_again_after_a_backoff(api, single_rt, start_scanner, start_pusher,
                                                                push_receiver):
    receiver = await push_receiver(lambda request: 500 if request["headers"]["DelayQueue-Retry"] == "1" else 204)
    await set_push(api, "t", receiver.url)  # no retryBackoffMillis: push's own default, 1 s doubling
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m1")
    first, second = await arrived(receiver, "m1", 2)
    # The backoff is 1 s less up to 20% jitter: not before 800 ms.
    assert second["at"] - first["at"] >= 800
    assert second["headers"]["DelayQueue-Retry"] == "2"
    await ends_as(api, "t", "m1", Status.ACKED)
    assert await attempts(single_rt, "t", "m1") == [(Reason.PUSH_FAILED, "HTTP 500"), (Reason.PUSHED, "204")]


async def test_a_hanging_receiver_times_out_and_a_redirect_is_not_followed(api, single_rt, start_scanner,
                                                                          start_pusher, push_receiver):
    async def hang_then_redirect_then_ok(request):
        retry = request["headers"]["DelayQueue-Retry"]
        if retry == "1":
            await asyncio.sleep(5)
        return 302 if retry == "2" else 200

    receiver = await push_receiver(hang_then_redirect_then_ok)
    await set_push(api, "t", receiver.url, pushTimeoutMillis=300, retryBackoffMillis=200)
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m1")
    _first, second, third = await arrived(receiver, "m1", 3)
    await ends_as(api, "t", "m1", Status.ACKED)
    assert await attempts(single_rt, "t", "m1") == [
        (Reason.PUSH_FAILED, "timeout: no answer within 300 ms"), (Reason.PUSH_FAILED, "HTTP 302"),
        (Reason.PUSHED, "200")]
    # The topic's own backoff, 200 ms then 400 ms less up to 20%, from each failed attempt's end
    # in the history (Redis' clock; the same host's) to the next request's arrival. (Counted from
    # the first request's arrival instead, it lost the time that request took to arrive, and came
    # out at 459 ms of 460 on a loaded machine.)
    failed_at = [at for [at] in await query(
        f"SELECT {sql.to_millis('at')} FROM delayqueue_messageevent WHERE topic = 't' AND msg_id = 'm1'"
        " AND reason = %s ORDER BY at, id", Reason.PUSH_FAILED)]
    assert second["at"] - failed_at[0] >= 160 and third["at"] - failed_at[1] >= 320
    assert all(r["path"] == "/hook" for r in receiver.requests)  # the redirect's Location was not visited


async def test_an_attempt_settled_after_its_ack_deadline_leaves_the_next_delivery_alone(
        api, single_rt, start_scanner, start_pusher, push_receiver, monkeypatch):
    """An attempt's answer can be settled after its ack deadline (a busy loop, a slow Redis): the
    message was given back and is being pushed again. Its nack must not give that delivery back too."""
    monkeypatch.setattr(pusher_module, "ACK_MARGIN_MILLIS", 200)
    late_nack_done = asyncio.Event()

    async def fail_then_ok_once_the_late_nack_landed(request):
        if request["headers"]["DelayQueue-Retry"] == "1":
            return 500
        await late_nack_done.wait()
        return 200

    receiver = await push_receiver(fail_then_ok_once_the_late_nack_landed)
    real_nack = pusher_module.nack_message

    async def late_nack(*args, **kwargs):
        await arrived(receiver, "m1", 2)  # past the ack deadline: delivered again
        try:
            return await real_nack(*args, **kwargs)
        finally:
            late_nack_done.set()

    monkeypatch.setattr(pusher_module, "nack_message", late_nack)
    await set_push(api, "t", receiver.url, pushTimeoutMillis=300, retryBackoffMillis=100)
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m1")
    await ends_as(api, "t", "m1", Status.ACKED)
    assert [r["headers"]["DelayQueue-Retry"] for r in receiver.requests] == ["1", "2"]


async def test_a_receiver_that_is_down_makes_a_dead_letter_after_max_retry(api, single_rt, start_scanner,
                                                                          start_pusher, push_receiver):
    receiver = await push_receiver()
    url = receiver.url
    await receiver.stop()  # nothing listens on its port now
    await set_push(api, "t", url, retryBackoffMillis=50)
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m1", maxRetry=2)
    await ends_as(api, "t", "m1", Status.EXHAUSTED)
    tried = await attempts(single_rt, "t", "m1")
    # The first delivery and 2 retries; the last one's failure ended the message.
    assert [reason for reason, _ in tried] == [Reason.PUSH_FAILED, Reason.PUSH_FAILED, Reason.RETRIES_EXHAUSTED]
    assert all(detail.startswith("connection: ") for _, detail in tried)
    dead = await call(api, "getDeadMsgList", method="get", topic="t")
    [letter] = dead["delayMsgList"]
    # Its deadDetail is the failure of the attempt that ended it, as a consumer's nack reason would be.
    assert letter["msgId"] == "m1" and letter["deadReason"] == Reason.RETRIES_EXHAUSTED
    assert letter["deadDetail"] == tried[-1][1]


async def test_push_concurrency_holds_across_pushers_and_rate_is_respected(api, single_rt, start_scanner,
                                                                           start_pusher, push_receiver):
    async def slow(request):
        await asyncio.sleep(0.2)
        return 200

    receiver = await push_receiver(slow)
    await set_push(api, "c", receiver.url, pushConcurrency=3)
    await start_scanner(single_rt)
    await start_pusher()
    await start_pusher()  # two pushers, as two processes would run them
    for i in range(12):
        await send(api, "c", f"m{i}")
    for i in range(12):
        await arrived(receiver, f"m{i}")
    assert receiver.most_in_flight == 3
    assert len(receiver.requests) == 12

    rated = await push_receiver()
    await set_push(api, "r", rated.url, pushRatePerSecond=4)
    started = time.time() * 1000
    for i in range(12):
        await send(api, "r", f"m{i}")
    for i in range(12):
        await arrived(rated, f"m{i}")
    # A bucket of 4/s holds at most a second's worth: 12 pushes take at least 2 s.
    arrivals = sorted(r["at"] for r in rated.requests)
    assert arrivals[-1] - started >= 1_900
    assert sum(at - started < 1_000 for at in arrivals) <= 8


async def test_a_pull_of_many_due_messages_begins_their_pushes_a_few_at_a_turn_of_the_event_loop(
        api, single_rt, start_pusher, push_receiver, monkeypatch):
    """run_scanners' one event loop serves every namespace's scanner and pusher. A pull's messages begun all at
    once (body, signature, request: 200 of them in a storm held the loop 30-80 ms) made another namespace's due
    messages wait as long; the pusher lets the loop turn between a few. Counted per turn, not timed."""
    turns, begun = LoopTurns(), Counter()  # per turn, the pushes begun (each signs its request first)
    monkeypatch.setattr(pusher_module, "push_headers", turns.counting(begun, pusher_module.push_headers))
    receiver = await push_receiver()
    await set_push(api, "many", receiver.url, pushConcurrency=50)
    await send_messages(single_rt, requests=[SendRequest(topic="many", msg=str(i), msg_id=f"m{i}")
                                             for i in range(50)])  # due now: ready for the pusher's first pull
    async with turns:
        await start_pusher()
        for i in range(50):
            await arrived(receiver, f"m{i}")
    assert sum(begun.values()) == 50
    assert max(begun.values()) <= pusher_module.STARTS_PER_TURN


async def test_a_hanging_endpoint_holds_only_its_own_topics_slots(api, single_rt, start_scanner, start_pusher,
                                                                 push_receiver):
    async def hang(request):
        await asyncio.sleep(3)
        return 200

    stuck, healthy = await push_receiver(hang), await push_receiver()
    await set_push(api, "stuck", stuck.url, pushConcurrency=2, pushTimeoutMillis=10_000)
    await set_push(api, "healthy", healthy.url)
    await start_scanner(single_rt)
    await start_pusher()
    for i in range(6):
        await send(api, "stuck", f"s{i}")
    await wait_until(lambda: asyncio.sleep(0, stuck.in_flight == 2), what="the stuck topic's slots held")
    for i in range(20):
        await send(api, "healthy", f"h{i}")
    for i in range(20):
        await arrived(healthy, f"h{i}", timeout=2)
    assert stuck.most_in_flight == 2 and len(stuck.requests) == 2


async def test_push_urls_are_checked_when_set(api, settings):
    async def refused(url: str, **extra) -> str:
        answer = await call(api, "setTopicConfig", topic="t", pushUrl=url, **extra)
        assert answer["code"] == 400, answer
        return answer["msg"]

    assert "DELAYQUEUE_PUSH_ALLOWED_HOSTS does not list" in await refused("http://example.com/hook")
    assert "not a host name" in await refused("http://127\u30020\u30020\u30021/hook")  # ideographic dots
    assert "loopback, private or reserved" in await refused("http://10.1.2.3/hook")
    assert "http:// or https://" in await refused("ftp://127.0.0.1/hook")
    assert "user name or password" in await refused("http://user:pw@127.0.0.1/hook")
    assert "rotatePushSecret" in (await call(api, "setTopicConfig", topic="u", rotatePushSecret="true"))["msg"]
    for bad in ({"pushConcurrency": 0}, {"pushConcurrency": 1001}, {"pushTimeoutMillis": 0},
                {"pushRatePerSecond": -1}, {"pushUrl": "http://127.0.0.1/" + "x" * 2000}):
        answer = await call(api, "setTopicConfig", topic="t", **bad)
        assert answer["code"] == 400 and next(iter(bad)) in answer["msg"], answer
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": ""}
    await close_current()  # the API's runtime is built again, from the settings now
    assert "push is off" in await refused("http://127.0.0.1:9/hook")
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": "localhost"}
    await close_current()
    # A listed name that resolves to loopback is refused unless the address is listed too.
    assert "loopback, private or reserved" in await refused("http://localhost:9/hook")
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": "*"}
    await close_current()
    # Names no resolver takes are a 400, not a failed lookup's 500.
    assert "not a host name" in await refused(f"http://{'a' * 64}.example.com/hook")
    assert "not a host name" in await refused("http://a..example.com/hook")
    assert "loopback, private or reserved" in await refused("http://[64:ff9b::a00:5]/hook")  # NAT64 of 10.0.0.5
    config = await call(api, "getTopicConfig", method="get", topic="t")
    assert config["data"]["pushUrl"] == ""


async def test_a_push_url_whose_name_never_resolves_is_refused_within_the_push_timeout(api, settings, monkeypatch):
    """setTopicConfig looked a new push URL's name up on the loop's default executor with no time
    limit: a resolver that never answered held the call until the system resolver gave up, and a
    few such calls took every thread of that executor, which the settings' save itself needs."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": "*"}
    await close_current()
    answer = threading.Event()
    getaddrinfo = socket.getaddrinfo

    def hanging_getaddrinfo(host, *args, **kwargs):
        if host.endswith(".hang.test"):
            answer.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging_getaddrinfo)
    try:
        started = time.monotonic()
        answers = await asyncio.gather(*(
            call(api, "setTopicConfig", topic=f"t{i}", pushUrl=f"http://h{i}.hang.test/hook", pushTimeoutMillis=500)
            for i in range(40)))
        assert time.monotonic() - started < 5
        assert answers == [{"code": 400, "msg": f"pushUrl has host h{i}.hang.test, which did not resolve within 500 "
                                                "ms (pushTimeoutMillis)"} for i in range(40)]
        # The loop's own threads are free: the process' other work (a save through sync_to_async) goes on.
        assert await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, int), 2) == 0
        assert (await call(api, "setTopicConfig", topic="t", maxRetry=3))["code"] == 200
    finally:
        answer.set()


async def test_the_secret_is_shown_once_and_a_rotation_signs_with_both(api, single_rt, start_pusher, push_receiver):
    receiver = await push_receiver()
    first = (await set_push(api, "t", receiver.url))["pushSecret"]
    again = await set_push(api, "t", receiver.url, pushConcurrency=4)
    assert "pushSecret" not in again and again["pushConcurrency"] == 4
    got = (await call(api, "getTopicConfig", method="get", topic="t"))["data"]
    assert "pushSecret" not in got and got["pushSecretRotating"] is False and got["pushUrl"] == receiver.url
    rotated = await call(api, "setTopicConfig", topic="t", rotatePushSecret="true")
    second = rotated["data"]["pushSecret"]
    assert second != first and rotated["data"]["pushSecretRotating"] is True
    await start_pusher()
    await send(api, "t", "m1")
    [request] = await arrived(receiver, "m1")
    assert request["headers"]["DelayQueue-Signature"].count("v1=") == 2
    verify_signature(first, request["headers"], request["body"])
    verify_signature(second, request["headers"], request["body"])
    # The topic settings every web process holds carry no secret: only pushers read them.
    held = (await single_rt.topic_configs.fresh())["t"]
    assert not any(secret in str(value) for value in dataclasses.astuple(held) for secret in (first, second))
    # Turning push off forgets the secrets: a new URL gets a new one.
    off = await call(api, "setTopicConfig", topic="t", pushUrl="")
    assert off["data"]["pushUrl"] == "" and "pushSecret" not in off["data"]
    third = (await set_push(api, "t", receiver.url))["pushSecret"]
    assert third not in (first, second)


@pytest.mark.process
async def test_two_pusher_processes_push_each_message_once(api, scanner_process, push_receiver):
    receiver = await push_receiver()
    topics = ["a", "b", "c"]
    for topic in topics:
        await set_push(api, topic, receiver.url, pushConcurrency=16)
    procs = [scanner_process("p1"), scanner_process("p2")]
    for proc in procs:
        await asyncio.to_thread(proc.wait_started)
    sent = []
    for i in range(300):
        topic = topics[i % 3]
        await send(api, topic, f"m{i}", delay=200 + i % 50)
        sent.append((topic, f"m{i}"))
    for topic, msg_id in sent:
        await arrived(receiver, msg_id, timeout=20)

    async def all_acked():
        # Read in the message log, which the scanners' log writers keep: getMsg reads an acked body
        # only for the ended-message retention (2 s here), which 300 pushes can outlast.
        [(acked,)] = await query("SELECT count(*) FROM delayqueue_message WHERE topic = ANY(%s) AND status = %s",
                                 topics, Status.ACKED)
        return acked == len(sent)

    await wait_until(all_acked, timeout=20, what="every pushed message acked")
    await asyncio.sleep(0.5)  # a second push of any of them would have come by now
    assert sorted(r["message"]["msgId"] for r in receiver.requests) == sorted(msg_id for _, msg_id in sent)


@pytest.mark.process
@pytest.mark.fault
async def test_a_pusher_killed_mid_delivery_leaves_the_message_to_be_pushed_again(api, scanner_process,
                                                                                 push_receiver):
    async def hang_first(request):
        if request["headers"]["DelayQueue-Retry"] == "1":
            await asyncio.sleep(30)
        return 200

    receiver = await push_receiver(hang_first)
    await set_push(api, "t", receiver.url, pushTimeoutMillis=1_000)
    first = scanner_process("first")
    await asyncio.to_thread(first.wait_started)
    await send(api, "t", "m1")
    await arrived(receiver, "m1")
    first.kill()
    first.proc.wait()
    second = scanner_process("second")
    await asyncio.to_thread(second.wait_started)
    # Back once its ack deadline (1 s + the margin) passed, and pushed by the pusher still alive.
    [_, again] = await arrived(receiver, "m1", 2, timeout=20)
    assert again["headers"]["DelayQueue-Retry"] == "2"
    await ends_as(api, "t", "m1", Status.ACKED)


async def test_operators_see_pushes_failures_lateness_and_each_attempt(api, single_rt, start_scanner, start_pusher,
                                                                       push_receiver, async_client):
    receiver = await push_receiver(lambda request: 503 if request["headers"]["DelayQueue-Retry"] == "1" else 200)
    await set_push(api, "orders", receiver.url, retryBackoffMillis=100)
    await start_scanner(single_rt)
    pusher = await start_pusher()
    await send(api, "orders", "m1")
    await send(api, "orders", "m2", delay=200)
    for msg_id in ("m1", "m2"):
        await arrived(receiver, msg_id, 2)
        await ends_as(api, "orders", msg_id, Status.ACKED)
    await pusher._write_figures()  # what the pusher writes every second
    metrics = (await api.get("/metrics")).text
    assert 'delayqueue_pushes_total{namespace="default",topic="orders"} 2.0' in metrics
    assert 'delayqueue_push_failures_total{namespace="default",status="503",topic="orders"} 2.0' in metrics
    assert 'delayqueue_push_lateness_seconds_count{namespace="default",topic="orders"} 2.0' in metrics
    assert 'delayqueue_push_in_flight{namespace="default",topic="orders"} 0.0' in metrics

    await User.objects.acreate_superuser("admin", password="pw")
    await async_client.alogin(username="admin", password="pw")
    dashboard = (await async_client.get("/admin/dashboard/")).content.decode()
    table = dashboard.split('id="pushes"', 1)[1].split("</table>", 1)[0]
    assert 'class="pushed">2<' in table and "503: 2" in table
    await drain_log(single_rt, ["orders"])
    row = await Message.objects.aget(topic="orders", msg_id="m1")
    page = (await async_client.get(f"/admin/delayqueue/message/{row.pk}/change/")).content.decode()
    assert "(push failed, delivery 1)" in page and '<span class="detail">HTTP 503</span>' in page
    assert '(Pushed, delivery 2)' in page and '<span class="detail">200</span>' in page


async def test_an_answer_is_read_only_up_to_its_limit(api, single_rt, start_pusher):
    async def endless(request):  # a 2xx whose body never ends: read in full, it would time out
        answer = web.StreamResponse(status=200)
        await answer.prepare(request)
        while True:
            await answer.write(b"x" * 65_536)
            await asyncio.sleep(0.01)

    app = web.Application()
    app.router.add_post("/endless", endless)
    runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await set_push(api, "t", f"http://127.0.0.1:{port}/endless", pushTimeoutMillis=2_000)
        await start_pusher()
        await send(api, "t", "m1")
        await ends_as(api, "t", "m1", Status.ACKED, timeout=5)
        assert await attempts(single_rt, "t", "m1") == [(Reason.PUSHED, "200")]
    finally:
        await runner.cleanup()


async def test_a_receivers_cookies_are_neither_kept_nor_sent_back(api, single_rt, start_pusher, settings):
    # The pushers of every namespace share a process: a receiver setting new cookies on each answer
    # must not grow it without bound, nor hand one topic's cookies to another pushing there.
    cookies_sent = []

    async def set_cookies(request):
        cookies_sent.append(request.headers.get("Cookie"))
        answer = web.Response(status=200)
        for i in range(20):
            answer.set_cookie(f"c{len(cookies_sent)}-{i}", "x" * 100)
        return answer

    app = web.Application()
    app.router.add_post("/hook", set_cookies)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        # A host name: cookies of an IP address' answers are not taken anyway.
        settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": "localhost,127.0.0.1"}
        await close_current()
        for topic in ("a", "b"):
            await set_push(api, topic, f"http://localhost:{port}/hook")
        pusher = await start_pusher(make_runtime(REDIS_URL, push_allowed_hosts="localhost,127.0.0.1"))
        for i, topic in enumerate(("a", "b", "a")):
            await send(api, topic, f"m{i}")
            await ends_as(api, topic, f"m{i}", Status.ACKED)
        assert cookies_sent == [None, None, None]
        assert [len(endpoint.session.cookie_jar) for endpoint in pusher._client._endpoints.values()] == [0]
    finally:
        await runner.cleanup()


async def test_addresses_are_checked_again_where_each_connection_is_made(api, single_rt, start_pusher,
                                                                         push_receiver, settings):
    receiver = await push_receiver()
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_ALLOWED_HOSTS": "localhost,127.0.0.1"}
    await close_current()
    await set_push(api, "t", f"http://localhost:{receiver.port}/hook", retryBackoffMillis=50)
    # This pusher's operator lists the name only: it resolves to loopback, which is not listed.
    await start_pusher(make_runtime(REDIS_URL, push_allowed_hosts="localhost"))
    await send(api, "t", "m1", maxRetry=0)
    await ends_as(api, "t", "m1", Status.EXHAUSTED)
    [(reason, detail)] = await attempts(single_rt, "t", "m1")
    assert reason == Reason.RETRIES_EXHAUSTED and "loopback, private or reserved" in detail
    assert receiver.requests == []


async def test_a_topic_and_msg_id_beyond_ascii_go_percent_encoded_in_the_headers(api, single_rt, start_pusher,
                                                                                push_receiver):
    receiver = await push_receiver()
    secret = (await set_push(api, "订单 orders", receiver.url))["pushSecret"]
    await start_pusher()
    await send(api, "订单 orders", "ид-1 100%")
    [request] = await arrived(receiver, "ид-1 100%")
    assert request["message"]["topic"] == "订单 orders"
    assert request["headers"]["DelayQueue-Topic"] == "%E8%AE%A2%E5%8D%95 orders"
    assert unquote(request["headers"]["DelayQueue-Msg-Id"]) == "ид-1 100%"
    verify_signature(secret, request["headers"], request["body"])
    await ends_as(api, "订单 orders", "ид-1 100%", Status.ACKED)
    # HTTP drops spaces around a header value: a topic's own (" orders " is not "orders") go as %20.
    await set_push(api, "  orders ", receiver.url)
    await send(api, "  orders ", "m2")
    [request] = await arrived(receiver, "m2")
    assert request["headers"]["DelayQueue-Topic"] == "%20%20orders%20"


async def test_a_topic_whose_slots_were_held_elsewhere_is_pulled_again_when_they_free(api, single_rt, start_pusher,
                                                                                      push_receiver):
    receiver = await push_receiver()
    for i in range(5):
        await send(api, "t", f"m{i}")
    await send(api, "t", "later", delay=3_600_000)  # what a pull that hands out nothing answers: due in an hour
    # Consumers took two before the topic got its push URL: they hold its two slots.
    taken = (await call(api, "pullMsg", topic="t", batch=2, ackTimeoutMillis=60_000))["delayMsgList"]
    await set_push(api, "t", receiver.url, pushConcurrency=2)
    await start_pusher()
    await asyncio.sleep(0.5)
    assert receiver.requests == []  # no slot free
    for message in taken:
        answer = await call(api, "ackMsg", topic="t", msgId=message["msgId"], ack="true")
        assert answer["code"] == 200
    # Their acks send no wake; the pusher looks again soon, not at its 5 s sweep.
    for message_id in {f"m{i}" for i in range(5)} - {m["msgId"] for m in taken}:
        await arrived(receiver, message_id, timeout=3)


async def test_an_attempt_outlasting_the_idle_endpoint_limit_is_not_cut(api, single_rt, start_pusher, push_receiver,
                                                                        monkeypatch):
    monkeypatch.setattr(push_http, "ENDPOINT_IDLE_SECONDS", 0.1)

    async def slow(request):
        await asyncio.sleep(1.6)  # past a figures turn (1 s), when idle endpoints are closed
        return 200

    receiver = await push_receiver(slow)
    await set_push(api, "t", receiver.url, pushTimeoutMillis=5_000)
    await start_pusher()
    await send(api, "t", "m1")
    await ends_as(api, "t", "m1", Status.ACKED)
    assert await attempts(single_rt, "t", "m1") == [(Reason.PUSHED, "200")]


async def test_an_endpoint_used_again_while_the_idle_ones_close_is_not_cut(push_receiver, monkeypatch):
    """Idle endpoints were closed one after another, each looked up when its turn came: an attempt
    to one still waiting its turn, started while an earlier one closed, took its session, which was
    then closed under it (a failed attempt, the message's delivery spent)."""
    monkeypatch.setattr(push_http, "ENDPOINT_IDLE_SECONDS", 0)
    first, second = await push_receiver(), await push_receiver()
    client = push_http.PushClient(HostPolicy.parse("127.0.0.1"))
    try:
        for receiver in (first, second):  # a keep-alive connection to each, idle from now on
            assert await client.post(receiver.url, b"{}", {}, 5_000) == (200, ("", ""))
        closing = asyncio.create_task(client.close_idle())
        await asyncio.sleep(0)  # the first endpoint's connection closing; the second's is next
        assert await client.post(second.url, b"{}", {}, 5_000) == (200, ("", ""))
        await closing
    finally:
        await client.close()


async def test_pushers_work_on_a_single_redis_and_on_the_cluster(rt, start_scanner, start_pusher, push_receiver):
    receiver = await push_receiver(lambda request: 500 if request["headers"]["DelayQueue-Retry"] == "1" else 200)
    for topic in ("a", "b"):  # two topics: on the Cluster, two slots in one pipelined pull
        await set_topic_config(rt, topic=topic, changes={"push_url": receiver.url, "retry_backoff_millis": 50},
                                        limits={})
    await start_scanner(rt)
    url = REDIS_CLUSTER_URL if rt.config.redis_url == REDIS_CLUSTER_URL else REDIS_URL
    pusher = await start_pusher(make_runtime(url))
    sent = [await send_message(rt, request=SendRequest(topic=topic, msg="x", delay_millis=100, msg_id=f"{topic}1"))
            for topic in ("a", "b")]
    for message in sent:
        await arrived(receiver, message.msg_id, 2)

    async def both_acked():
        statuses = [(await get_message(rt, topic=m.topic, msg_id=m.msg_id)).status for m in sent]
        return statuses == [Status.ACKED, Status.ACKED]

    await wait_until(both_acked, what="both acked")
    await pusher._write_figures()
    counts = await rt.redis.hgetall(rt.ns.pushes)
    assert counts["pushed\ta"] == "1" and counts["failed\tb\t500"] == "1"


async def test_a_stopped_pusher_lets_a_running_attempt_finish_and_settles_it(api, single_rt, push_receiver):
    async def slow(request):
        await asyncio.sleep(0.5)
        return 200

    receiver = await push_receiver(slow)
    await set_push(api, "t", receiver.url)
    runtime = make_runtime(REDIS_URL)
    pusher, stop = pusher_module.Pusher(runtime), asyncio.Event()
    task = asyncio.create_task(pusher.run(stop))
    try:
        await send(api, "t", "m1")
        await arrived(receiver, "m1")
        stop.set()  # what SIGTERM to run_scanners does
        await asyncio.wait_for(task, 5)
        # Stopped only once the attempt under way was answered and acked.
        assert await status_of(api, "t", "m1") == Status.ACKED
        assert await attempts(single_rt, "t", "m1") == [(Reason.PUSHED, "200")]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await runtime.close()


async def test_without_a_grace_period_a_rotation_signs_with_the_new_secret_alone(api, single_rt, start_pusher,
                                                                                  push_receiver, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "PUSH_SECRET_GRACE_SECONDS": 0}
    await close_current()
    receiver = await push_receiver()
    first = (await set_push(api, "t", receiver.url))["pushSecret"]
    rotated = (await call(api, "setTopicConfig", topic="t", rotatePushSecret="true"))["data"]
    assert rotated["pushSecretRotating"] is False
    await start_pusher()
    await send(api, "t", "m1")
    [request] = await arrived(receiver, "m1")
    assert request["headers"]["DelayQueue-Signature"].count("v1=") == 1
    verify_signature(rotated["pushSecret"], request["headers"], request["body"])
    with pytest.raises(InvalidSignature):
        verify_signature(first, request["headers"], request["body"])


@pytest.mark.parametrize("topic", [NAMESPACE, "limited"])
async def test_pushes_take_their_tokens_from_the_consume_rates_as_pulls_do(api, single_rt, start_pusher, push_receiver,
                                                                          topic):
    """A push is a consumer's take: under the namespace's consume rate, or the topic's (perhaps the
    operator's, which a tenant cannot lift by turning the topic into a push topic: its
    pushRatePerSecond is 0, none, here), 1 a second (a bucket of one), three pushes take two
    seconds. The namespace's refusals of the pusher count as its consume_rate refusals."""
    await sync_to_async(set_limits)(namespace=single_rt.ns.namespace, topic=topic, consume_rate=1)
    receiver = await push_receiver()
    await set_push(api, "limited", receiver.url)
    for i in range(3):
        await send(api, "limited", f"m{i}")
    started = time.time() * 1000
    await start_pusher()
    for i in range(3):
        await arrived(receiver, f"m{i}")
    assert len(receiver.requests) == 3
    # The bucket holds one token: the second and third pushes waited a second each for theirs.
    assert max(r["at"] for r in receiver.requests) - started >= 1_900
    if topic == NAMESPACE:
        throttled = await single_rt.redis.hgetall(single_rt.ns.throttled)
        assert int(throttled.get(throttled_field("consume_rate", NAMESPACE), 0)) >= 1


async def test_a_new_push_url_or_push_off_holds_from_its_answer_on(api, single_rt, start_scanner, start_pusher,
                                                                   push_receiver):
    """The pushers read their table of push topics every 0.5 s; a message sent after setTopicConfig
    answered a new URL (or none) was pushed to the old one if a pusher's table was a read behind.
    Redis' copy of the URL, which the pull script matches, makes the change exact, as the pause's is."""
    old, new = await push_receiver(), await push_receiver()
    await set_push(api, "t", old.url)
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m0")
    await arrived(old, "m0")
    await set_push(api, "t", new.url)
    await send(api, "t", "m1")
    await arrived(new, "m1")
    assert await call(api, "setTopicConfig", topic="t", pushUrl="")
    await send(api, "t", "m2")
    pulled = (await call(api, "pullMsg", topic="t", batch=10))["delayMsgList"]
    assert [m["msgId"] for m in pulled] == ["m2"]
    assert [r["message"]["msgId"] for r in old.requests] == ["m0"]
    assert [r["message"]["msgId"] for r in new.requests] == ["m1"]


async def test_a_paused_push_topic_is_not_pushed_until_resumed(api, single_rt, start_scanner, start_pusher,
                                                               push_receiver):
    """pauseTopic stops a push topic's pushes as it stops pulls (its messages still fall due), and
    resumeTopic's wake on the ready channel has them pushed at once, not at the pusher's 5 s sweep."""
    receiver = await push_receiver()
    await set_push(api, "t", receiver.url)
    await start_scanner(single_rt)
    await start_pusher()
    await send(api, "t", "m0")
    await arrived(receiver, "m0")
    assert (await call(api, "pauseTopic", topic="t"))["code"] == 200
    await send(api, "t", "m1")
    await send(api, "t", "m2", delay=200)
    await asyncio.sleep(1)  # m2 fell due and the pusher was woken for both
    assert [r["message"]["msgId"] for r in receiver.requests] == ["m0"]
    assert [await status_of(api, "t", msg_id) for msg_id in ("m1", "m2")] == [Status.READY, Status.READY]
    assert (await call(api, "resumeTopic", topic="t"))["code"] == 200
    for msg_id in ("m1", "m2"):
        await arrived(receiver, msg_id, timeout=3)


async def test_a_mirror_set_topic_config_could_not_write_is_mended_without_calling_it_again(
        api, single_rt, start_scanner, start_pusher, push_receiver, monkeypatch):
    """setTopicConfig saved a new push URL, then could not write Redis' copy of the settings (code
    500): the copy kept the old URL, which pull.lua matches, so the pushers (reading the new one)
    pushed nothing until the call was made again. The scanner holding the topic writes it again."""
    old, new = await push_receiver(), await push_receiver()
    await set_push(api, "t", old.url)
    await start_scanner(single_rt)
    pusher = await start_pusher()
    await send(api, "t", "m0")
    await arrived(old, "m0")
    write_mirrors = topic_control.write_mirrors

    async def fails_once(*args, **kwargs):
        monkeypatch.setattr(topic_control, "write_mirrors", write_mirrors)
        raise RedisConnectionError("Connection reset by peer")

    monkeypatch.setattr(topic_control, "write_mirrors", fails_once)
    assert (await call(api, "setTopicConfig", topic="t", pushUrl=new.url))["code"] == 500
    # Sent once the pusher has read the new URL: before, it could still take it for the old one.
    await wait_until(lambda: asyncio.sleep(0, pusher._topics.current["t"].push_url == new.url),
                     what="the pusher's table read again")
    await send(api, "t", "m1")
    await arrived(new, "m1")
    assert [r["message"]["msgId"] for r in old.requests] == ["m0"]
    # A topic without settings of its own has no mirror, which is its settings' (the defaults): none is written.
    await send(api, "plain", "p1")
    await asyncio.sleep(2.5)  # taken, and looked at
    assert Meta.PAUSED not in await single_rt.redis.hgetall(single_rt.ns.topic("plain").meta)


async def test_a_pusher_a_read_behind_never_signs_with_a_secret_the_topic_no_longer_has(
        api, single_rt, start_scanner, start_pusher, push_receiver, monkeypatch):
    """Push turned off and on again (the same URL) forgets the secret and makes a new one; a
    pusher whose table of push topics was a read behind pulled (Redis' copy had the same URL) and
    signed with the forgotten secret. The copy names the current secret too, so it takes nothing
    until it has read the new one."""
    receiver = await push_receiver()
    first = (await set_push(api, "t", receiver.url))["pushSecret"]
    await start_scanner(single_rt)
    pusher = await start_pusher()
    await send(api, "t", "m0")
    await arrived(receiver, "m0")
    behind = pusher._topics.current
    monkeypatch.setattr(pusher._topics, "fresh", lambda: asyncio.sleep(0, behind))  # its reads answer the old table
    assert (await call(api, "setTopicConfig", topic="t", pushUrl=""))["code"] == 200
    second = (await set_push(api, "t", receiver.url))["pushSecret"]
    await send(api, "t", "m1")
    await asyncio.sleep(1)
    assert receiver.of("m1") == []
    monkeypatch.undo()
    [request] = await arrived(receiver, "m1")
    verify_signature(second, request["headers"], request["body"])
    with pytest.raises(InvalidSignature):
        verify_signature(first, request["headers"], request["body"])


async def test_name_lookups_are_bounded_per_process_and_a_namespace_holds_only_its_share(push_receiver, monkeypatch):
    """Each namespace's pushers had 16 lookup threads of their own, so a process serving many
    namespaces ran 16 lookups per namespace at once (each left running after its attempt gave up).
    The process has DNS_THREADS; one namespace's pushers hold at most DNS_THREADS_PER_CLIENT, so
    its names that never answer hold up its own lookups, not another namespace's."""
    receiver = await push_receiver()
    answer = threading.Event()
    guard = threading.Lock()
    running, most = Counter(), Counter()  # namespace (the host's first label) -> lookups under way
    getaddrinfo = socket.getaddrinfo

    def slow_getaddrinfo(host, *args, **kwargs):
        if not host.startswith("slow"):
            return getaddrinfo("127.0.0.1" if host == "fast.test" else host, *args, **kwargs)
        namespace = host.split("-")[0]
        with guard:
            running[namespace] += 1
            most[namespace] = max(most[namespace], running[namespace])
            most["all"] = max(most["all"], running.total())
        answer.wait(20)
        with guard:
            running[namespace] -= 1
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    clients = [push_http.PushClient(HostPolicy.parse("*,127.0.0.1")) for _ in range(6)]

    async def slow_names(namespace: int, count: int) -> None:
        outcomes = await asyncio.gather(*(clients[namespace].post(f"http://slow{namespace}-{i}.test/hook", b"{}", {},
                                                                  300) for i in range(count)))
        assert {detail[0] for _status, detail in outcomes} == {"timeout"}

    async def lookups_reach(key: str, count: int) -> None:  # their threads may start after the attempts gave up
        await wait_until(lambda: asyncio.sleep(0, most[key] >= count), what=f"{count} lookups of {key}")
        await asyncio.sleep(0.2)  # and no more come

    try:
        # One namespace whose names never answer, more of them than the process has threads.
        await slow_names(0, push_http.DNS_THREADS + 10)
        await lookups_reach("slow0", push_http.DNS_THREADS_PER_CLIENT)
        assert most["slow0"] == push_http.DNS_THREADS_PER_CLIENT
        fast_url = f"http://fast.test:{receiver.port}/hook"
        assert await clients[5].post(fast_url, b"{}", {}, 2_000) == (200, ("", ""))
        # Many such namespaces: the process' lookups stay bounded.
        await asyncio.gather(*(slow_names(namespace, 20) for namespace in range(1, 5)))
        await lookups_reach("all", push_http.DNS_THREADS)
        assert most["all"] == push_http.DNS_THREADS
        assert max(most[f"slow{namespace}"] for namespace in range(5)) == push_http.DNS_THREADS_PER_CLIENT
    finally:
        answer.set()
        for client in clients:
            await client.close()


async def test_a_pusher_that_read_a_new_url_before_its_mirror_was_written_pushes_without_its_sweep(
        api, single_rt, start_pusher, push_receiver, monkeypatch):
    """A pusher that read the topic's new push URL between its save and the write of Redis' copy
    pulled and was refused (the copy had none yet); messages already ready sent it no wake, so
    they waited for its 5 s sweep, though pushing starts within a second (docs/push.md)."""
    monkeypatch.setattr(pusher_module, "SWEEP_SECONDS", 30)
    receiver = await push_receiver()
    assert (await call(api, "setTopicConfig", topic="t", retryBackoffMillis=100))["code"] == 200
    await send(api, "t", "m1")  # ready, a pulled topic's
    pusher = await start_pusher()
    write_mirrors = topic_control.write_mirrors

    async def after_the_pushers_pull(*args, **kwargs):
        # None until the pusher's first read of its topics, which a loaded machine may not have made yet.
        await wait_until(lambda: asyncio.sleep(0, "t" in (pusher._topics.current or {})), what="the pusher's read")
        await asyncio.sleep(0.2)  # its pull, refused
        await write_mirrors(*args, **kwargs)

    monkeypatch.setattr(topic_control, "write_mirrors", after_the_pushers_pull)
    await set_push(api, "t", receiver.url)
    await arrived(receiver, "m1")  # not at its sweep, 30 s on
