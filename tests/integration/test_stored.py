"""The form the msgs hash stores (lua/includes/stored.lua): every script that writes a message
writes its short record (marked with its status unless it is waiting), byte for byte what
core.messages writes for the same message, and reads it back whole; a body an older version
stored as the wire json is still read, pulled and acked. On a single Redis and on the Redis
Cluster."""
import asyncio

import orjson

from delayqueue.core.constants import Status
from delayqueue.services.consume import ack_messages, nack_message, pull_messages
from delayqueue.services.messages import get_message, reschedule_message
from delayqueue.services.send import SendRequest, send_message
from tests.helpers import promote

TOPIC = "订单, with commas: and \\ a backslash"
BODIES = ["plain", 'quoted "x" \\ back', "line\nbreak\ttab, comma", "🙂 ✓", ""]


async def stored(rt, msg_id: str) -> str:
    return await rt.redis.hget(rt.ns.topic(TOPIC).msgs, msg_id)


async def held_as_its_record(rt, msg_id: str):
    """The message getMsg answers, after checking Redis holds it as that message's record."""
    m = await get_message(rt, topic=TOPIC, msg_id=msg_id)
    assert m.status == Status.WAITING
    raw = await stored(rt, msg_id)
    assert raw == m.to_stored() and not raw.startswith("{")
    assert len(raw.encode()) < len(orjson.dumps(m.to_wire())) - 60
    return m


async def test_every_script_that_makes_a_message_wait_stores_its_record(rt):
    sent = []
    for i, body in enumerate(BODIES):
        reply = await send_message(rt, request=SendRequest(topic=TOPIC, msg=body, delay_millis=60_000, msg_id=f"m{i}",
                                                           ttl_millis=3_600_000, max_retry=i, priority=i % 3))
        m = await held_as_its_record(rt, f"m{i}")
        assert (m.payload, m.priority, m.max_retry, m.retry) == (body, i % 3, i, 0)
        assert m == reply
        sent.append(m)

    moved = await reschedule_message(rt, topic=TOPIC, msg_id="m2", delay_millis=120_000)
    assert await held_as_its_record(rt, "m2") == moved and moved.payload == BODIES[2]

    # Due now, pulled, then given back with a delay past its TTL: waiting again, its TTL before it.
    await reschedule_message(rt, topic=TOPIC, msg_id="m3", delay_millis=5)
    await asyncio.sleep(0.02)
    await promote(rt, TOPIC)
    assert await stored(rt, "m3") == (await get_message(rt, topic=TOPIC, msg_id="m3")).to_stored()
    pulled, _ = await pull_messages(rt, topic=TOPIC, batch=10)
    assert [m.msg_id for m in pulled] == ["m3"] and pulled[0].payload == BODIES[3]
    assert await stored(rt, "m3") == pulled[0].to_stored() and pulled[0].status == Status.CONSUMING
    await nack_message(rt, topic=TOPIC, msg_id="m3", delay_millis=7_200_000)
    again = await held_as_its_record(rt, "m3")
    assert again.retry == 1 and again.expire_time < again.trigger_time and again.payload == BODIES[3]

    # Due and promoted, pulled, acked: each its marked record, with every field the first kept.
    await reschedule_message(rt, topic=TOPIC, msg_id="m4", delay_millis=5)
    await asyncio.sleep(0.02)
    await promote(rt, TOPIC)
    ready = await get_message(rt, topic=TOPIC, msg_id="m4")
    assert ready.status == Status.READY and ready.payload == "" and ready.priority == 1
    assert await stored(rt, "m4") == ready.to_stored() == f"!{Status.READY:d}," + ready.to_stored().split(",", 1)[1]
    [taken], _ = await pull_messages(rt, topic=TOPIC, batch=10)
    assert await ack_messages(rt, topic=TOPIC, msg_ids=["m4"]) == [True]
    acked = await get_message(rt, topic=TOPIC, msg_id="m4")
    assert (acked.status, acked.retry, acked.payload, acked.priority) == (Status.ACKED, 1, "", 1)
    assert await stored(rt, "m4") == acked.to_stored() and len(acked.to_stored().encode()) < len(
        orjson.dumps(acked.to_wire())) - 60


async def test_a_body_an_older_version_stored_as_json_is_pulled_and_acked(rt):
    """Redis may hold ready messages as the wire json an older version wrote: read as before,
    then stored as records from their next change."""
    await send_message(rt, request=SendRequest(topic=TOPIC, msg=BODIES[1], delay_millis=0, msg_id="old", priority=2))
    ready = await get_message(rt, topic=TOPIC, msg_id="old")
    await rt.redis.hset(rt.ns.topic(TOPIC).msgs, "old", orjson.dumps(ready.to_wire()).decode())
    assert await get_message(rt, topic=TOPIC, msg_id="old") == ready
    [pulled], _ = await pull_messages(rt, topic=TOPIC, batch=10)
    assert (pulled.msg_id, pulled.payload, pulled.priority, pulled.status) == ("old", BODIES[1], 2, Status.CONSUMING)
    assert await stored(rt, "old") == pulled.to_stored()
    assert await ack_messages(rt, topic=TOPIC, msg_ids=["old"]) == [True]
    assert (await get_message(rt, topic=TOPIC, msg_id="old")).status == Status.ACKED


async def test_a_resend_of_a_waiting_msg_id_answers_the_stored_message(rt):
    first = await send_message(rt, request=SendRequest(topic=TOPIC, msg=BODIES[2], delay_millis=60_000, msg_id="dup",
                                                       priority=4))
    again = await send_message(rt, request=SendRequest(topic=TOPIC, msg="other", delay_millis=1, msg_id="dup"))
    assert again == first == await held_as_its_record(rt, "dup")
    assert again.payload == BODIES[2] and again.priority == 4
