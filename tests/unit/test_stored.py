"""core.messages.stored, what Message.to_stored and the cold tier's loader write (and
lua/includes/stored.lua, held to it byte for byte in tests/integration/test_stored.py): a message
as its short record, marked with its status unless it is waiting; the wire json an older version
stored is still read."""
import orjson
import pytest

from delayqueue.core.constants import Status
from delayqueue.core.messages import Message, stored

CASES = [
    ("orders", "01a227c95e2e7a66a281412e8dc2afcd", "x" * 100, 0),
    ("t", "k", 'quote " backslash \\ newline \n tab \t nul \x00 and ü, 漢字, 🙂', 9),
    ("a topic: with spaces/and\\slashes, commas,", "id with \"quotes\"", "", 1),
    ("订单", "id", "\n,\n", 0),
]


def message(topic, msg_id, payload, priority, status, **times):
    fields = dict(produce_time=1_795_962_595_466, trigger_time=1_795_962_595_467, expire_time=2_111_000_000_000)
    return Message(topic, msg_id, payload, **{**fields, **times}, max_retry=10, retry=3, status=status,
                   priority=priority)


@pytest.mark.parametrize("topic,msg_id,payload,priority", CASES)
@pytest.mark.parametrize("status", [s for s in Status if s != Status.WAITING])
def test_a_message_not_waiting_is_stored_as_its_marked_record_that_reads_back_whole(topic, msg_id, payload, priority,
                                                                                     status):
    m = message(topic, msg_id, payload, priority, status)
    raw = m.to_stored()
    assert raw == stored(topic, msg_id, payload, m.produce_time, m.trigger_time, m.expire_time, m.max_retry,
                         m.retry, status, priority)
    assert raw == f"!{int(status)}," + message(topic, msg_id, payload, priority, Status.WAITING).to_stored()
    assert Message.from_stored(raw, msg_id) == m
    assert len(raw.encode()) < len(orjson.dumps(m.to_wire())) - 60


@pytest.mark.parametrize("topic,msg_id,payload,priority", CASES)
def test_the_wire_json_an_older_version_stored_reads_back_whole(topic, msg_id, payload, priority):
    m = message(topic, msg_id, payload, priority, Status.ACKED)
    assert Message.from_stored(orjson.dumps(m.to_wire()).decode(), msg_id) == m


@pytest.mark.parametrize("topic,msg_id,payload,priority", CASES)
def test_a_waiting_message_is_stored_as_a_record_that_reads_back_whole(topic, msg_id, payload, priority):
    m = message(topic, msg_id, payload, priority, Status.WAITING)
    raw = m.to_stored()
    assert msg_id not in raw.split("\n", 1)[0]  # the hash field holds it
    assert Message.from_stored(raw, msg_id) == m
    assert len(raw.encode()) < len(orjson.dumps(m.to_wire())) - 60


def test_a_record_keeps_times_on_either_side_of_the_trigger_time():
    """A waiting message may be due before it was produced (a clock apart) or after its TTL ends
    (a nack's delay past it): the differences are signed."""
    m = message("t", "id", "body", 0, Status.WAITING, produce_time=2_000, trigger_time=1_500, expire_time=1_000)
    assert m.to_stored().startswith("5dc,-1f4,-1f4,10,3,0,t\n")
    assert Message.from_stored(m.to_stored(), "id") == m


def test_a_records_header_is_ascii_before_the_topic():
    """Redis answers are decoded as UTF-8 (live/client.py): the header is text, not packed bytes;
    the topic and body follow as sent."""
    m = message("订单", "id", "🙂", 2, Status.WAITING)
    header, body = m.to_stored().split("\n", 1)
    numbers, topic = header.rsplit(",", 1)
    assert numbers.isascii() and (topic, body) == ("订单", "🙂")
