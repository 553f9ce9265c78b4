"""core.messages.stored_json, the cold tier's loader's fast path, gives exactly Message.to_stored."""
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
    assert fast.decode() == m.to_stored() and Message.from_stored(fast) == m
