"""A msgId is deduplicated beyond its message's life: a send under the msgId of a message that
ended less than DELAYQUEUE_DEDUPE_WINDOW_MILLIS ago answers that message and delivers nothing,
whether only Redis knows it ended yet (the log writer has not run), or only the log still holds it
(Redis purged the ended body); a dead letter is never replaced by a send; after the window the
msgId starts a new life. Concurrent resends deliver at most once."""
import asyncio

import pytest

from delayqueue.core.constants import Status
from delayqueue.services.consume import ack_message, nack_message, pull_messages
from delayqueue.services.messages import delete_message
from delayqueue.services.send import SendRequest, send_message
from tests.helpers import REDIS_URL, dead_letter_page, drain_log, history, logged, make_runtime

# Where the ended message is known when the resend comes: only in Redis (no log writer ran yet),
# in both, or only in the log (Redis purged the ended body after its retention).
WHERE_ENDED = ("redis", "both", "log")


async def settle_end(rt, topic: str, msg_id: str, where: str) -> None:
    """Makes the ended message known where `where` says."""
    if where != "redis":
        await drain_log(rt, [topic])
    if where == "log":
        await purge_ended_body(rt, topic, msg_id)


async def purge_ended_body(rt, topic: str, msg_id: str) -> None:
    """What purge_ended.lua does to an ended message once the ended retention has passed."""
    keys = rt.ns.topic(topic)
    await rt.redis.hdel(keys.msgs, msg_id)
    await rt.redis.zrem(keys.ended, msg_id)


async def delivered_then_acked(rt, topic: str, msg_id: str, body: str = "first") -> None:
    await send_message(rt, request=SendRequest(topic, body, 0, msg_id))
    [pulled], _ = await pull_messages(rt, topic=topic)
    assert pulled.msg_id == msg_id
    assert (await ack_message(rt, topic=topic, msg_id=msg_id)).done


async def nothing_to_pull(rt, topic: str) -> bool:
    pulled, _ = await pull_messages(rt, topic=topic, batch=10)
    return pulled == []


@pytest.mark.parametrize("where", WHERE_ENDED)
async def test_a_resend_of_an_acked_message_within_the_window_answers_it_and_delivers_nothing(single_rt, where):
    rt = single_rt
    await delivered_then_acked(rt, "t", "retried")
    await settle_end(rt, "t", "retried", where)
    again = await send_message(rt, request=SendRequest("t", "first", 0, "retried"))
    assert (again.status, again.payload, again.retry) == (Status.ACKED, "first", 1)
    assert await nothing_to_pull(rt, "t")
    other_body = await send_message(rt, request=SendRequest("t", "second", 0, "retried"))
    assert (other_body.status, other_body.payload) == (Status.ACKED, "first")
    assert await nothing_to_pull(rt, "t")
    await drain_log(rt, ["t"])
    assert (await logged("t", "retried"))["status"] == Status.ACKED
    assert [row[0] for row in await history("t", "retried")] == ["sent", "pulled", "acked"]


async def test_a_resend_after_a_delete_with_release_is_deduplicated_once_the_log_holds_the_delete(single_rt):
    """A delete with release frees the body at once, so only the log remembers the msgId: once the
    log writer has recorded the delete, a resend within the window answers the deleted message."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 60_000, "released"))
    assert await delete_message(rt, topic="t", msg_id="released", release=True)
    await drain_log(rt, ["t"])
    again = await send_message(rt, request=SendRequest("t", "first", 0, "released"))
    assert (again.status, again.payload) == (Status.DELETED, "first")
    assert await nothing_to_pull(rt, "t")


async def test_a_resend_before_the_log_holds_a_release_delete_is_a_new_life_logged_as_such(single_rt):
    """Before the log writer has recorded such a delete (about 100 ms), nothing remembers it ended:
    the resend starts a new life (README, "Sending twice"), which the log then holds, not the old one."""
    rt = single_rt
    await send_message(rt, request=SendRequest("t", "first", 60_000, "released"))
    assert await delete_message(rt, topic="t", msg_id="released", release=True)
    again = await send_message(rt, request=SendRequest("t", "second", 0, "released"))
    assert (again.status, again.payload) == (Status.READY, "second")
    await drain_log(rt, ["t"])
    row = await logged("t", "released")
    assert (row["status"], row["msg"], row["produceTime"]) == (Status.READY, "second", again.produce_time)
    [pulled], _ = await pull_messages(rt, topic="t")
    assert pulled.payload == "second"


@pytest.mark.parametrize("where", WHERE_ENDED)
async def test_after_the_window_the_msgid_starts_a_new_life_that_is_delivered(clean_state, where):
    rt = make_runtime(REDIS_URL, dedupe_window_millis=200)
    try:
        await delivered_then_acked(rt, "t", "reused")
        await settle_end(rt, "t", "reused", where)
        await asyncio.sleep(0.3)  # the window passes (Redis still keeps the ended body: retention 2 s)
        again = await send_message(rt, request=SendRequest("t", "second", 0, "reused"))
        assert (again.status, again.payload) == (Status.READY, "second")
        pulled, _ = await pull_messages(rt, topic="t", batch=10)
        assert [(m.msg_id, m.payload, m.retry) for m in pulled] == [("reused", "second", 1)]
        assert (await logged("t", "reused"))["msg"] == "second"
    finally:
        await rt.close()


@pytest.mark.parametrize("where", ("both", "log"))
async def test_a_resend_never_replaces_a_dead_letter_even_after_the_window(clean_state, where):
    rt = make_runtime(REDIS_URL, dedupe_window_millis=0)
    try:
        await send_message(rt, request=SendRequest("t", "poison", 0, "dead", max_retry=0))
        await pull_messages(rt, topic="t")
        assert (await nack_message(rt, topic="t", msg_id="dead", dead_letter=True)).done
        await settle_end(rt, "t", "dead", where)
        again = await send_message(rt, request=SendRequest("t", "replacement", 0, "dead"))
        assert (again.status, again.payload) == (Status.EXHAUSTED, "poison")
        assert await nothing_to_pull(rt, "t")
        page, _ = await dead_letter_page(rt, topic="t", limit=10, cursor=None)
        assert [(m["msgId"], m["msg"], m["deadReason"]) for m in page] == [("dead", "poison", "dead_lettered")]
    finally:
        await rt.close()


async def test_a_resend_of_a_live_message_past_its_ttl_ends_it_as_a_dead_letter_and_delivers_nothing(single_rt):
    rt = single_rt
    sent = await send_message(rt, request=SendRequest("t", "late", 0, "stale", ttl_millis=1))
    await asyncio.sleep(0.05)  # its TTL passes; no scanner runs to end it
    again = await send_message(rt, request=SendRequest("t", "fresh", 0, "stale"))
    assert (again.status, again.payload, again.produce_time) == (Status.EXPIRED, "late", sent.produce_time)
    assert await nothing_to_pull(rt, "t")
    await drain_log(rt, ["t"])
    page, _ = await dead_letter_page(rt, topic="t", limit=10, cursor=None)
    assert [(m["msgId"], m["msg"], m["deadReason"]) for m in page] == [("stale", "late", "expired")]


@pytest.mark.parametrize("where", WHERE_ENDED)
async def test_concurrent_resends_from_two_processes_of_ended_messages_deliver_nothing(clean_state, where):
    first, second = make_runtime(REDIS_URL), make_runtime(REDIS_URL)
    try:
        ids = [f"m{i}" for i in range(10)]
        for msg_id in ids:
            await delivered_then_acked(first, "t", msg_id)
            await settle_end(first, "t", msg_id, where)
        answers = await asyncio.gather(*[send_message(rt, request=SendRequest("t", "again", 0, msg_id))
                                         for msg_id in ids for rt in (first, second)])
        assert {(a.status, a.payload) for a in answers} == {(Status.ACKED, "first")}
        assert await nothing_to_pull(first, "t")
    finally:
        await first.close()
        await second.close()


async def test_concurrent_resends_after_the_window_deliver_once(clean_state):
    first, second = make_runtime(REDIS_URL, dedupe_window_millis=100), make_runtime(REDIS_URL, dedupe_window_millis=100)
    try:
        ids = [f"m{i}" for i in range(10)]
        for msg_id in ids:
            await delivered_then_acked(first, "t", msg_id)
        await drain_log(first, ["t"])
        await asyncio.sleep(0.2)  # the window passes
        await asyncio.gather(*[send_message(rt, request=SendRequest("t", "again", 0, msg_id))
                               for msg_id in ids for rt in (first, second)])
        pulled, _ = await pull_messages(first, topic="t", batch=100)
        assert sorted(m.msg_id for m in pulled) == ids
        for msg_id in ids:
            assert [row[0] for row in await history("t", msg_id)] == ["sent", "pulled", "acked", "sent"]
    finally:
        await first.close()
        await second.close()


async def test_with_the_message_log_off_redis_dedupes_while_it_keeps_the_ended_message(clean_state):
    rt = make_runtime(REDIS_URL, message_log=False)
    try:
        await delivered_then_acked(rt, "t", "nolog")
        again = await send_message(rt, request=SendRequest("t", "second", 0, "nolog"))
        assert (again.status, again.payload) == (Status.ACKED, "first")
        assert await nothing_to_pull(rt, "t")
        await purge_ended_body(rt, "t", "nolog")  # nothing remembers the msgId any more
        again = await send_message(rt, request=SendRequest("t", "second", 0, "nolog"))
        assert (again.status, again.payload) == (Status.READY, "second")
    finally:
        await rt.close()
