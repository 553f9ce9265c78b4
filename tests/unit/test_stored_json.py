"""core.messages.stored_json, what Message.to_stored and the cold tier's loader write, is exactly the
wire json (Message.to_wire) dumped."""
import orjson
import pytest

from delayqueue.core.messages import Message, stored_json


@pytest.mark.parametrize("topic,msg_id,payload,priority", [
    ("orders", "01a227c95e2e7a66a281412e8dc2afcd", "x" * 100, 0),
    ("t", "k", 'quote " backslash \\ newline \n tab \t nul \x00 and ü, 漢字, 🙂', 9),
    ("a topic: with spaces/and\\slashes", "id with \"quotes\"", "", 1),
])
def test_the_fast_json_is_the_stored_json(topic, msg_id, payload, priority):
    m = Message(topic, msg_id, payload, 1_795_962_595_466, 1_795_962_595_467, 2_111_000_000_000, 10, 3, 1, priority)
    fast = stored_json(orjson.dumps(topic), m.msg_id, m.payload, m.produce_time, m.trigger_time, m.expire_time,
                       m.max_retry, m.retry, m.status, m.priority)
    assert orjson.loads(fast) == m.to_wire() and Message.from_stored(fast) == m
    assert fast.decode() == orjson.dumps(m.to_wire()).decode()  # the same bytes as the wire json's dump
