"""Generated msgIds: version 7 UUIDs in 32 hex digits, the send's millisecond first."""
import uuid

from delayqueue.services import _new_msg_id


def test_a_generated_id_is_a_uuid7_carrying_the_produce_time():
    produce_time = 1_795_000_000_123
    msg_id = _new_msg_id(produce_time)
    assert len(msg_id) == 32 and msg_id == msg_id.lower() and "-" not in msg_id
    parsed = uuid.UUID(hex=msg_id)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(msg_id[:12], 16) == produce_time


def test_ids_sort_by_time_and_do_not_repeat_within_a_millisecond():
    same_ms = {_new_msg_id(1_000) for _ in range(10_000)}
    assert len(same_ms) == 10_000
    assert max(same_ms) < min(_new_msg_id(1_001) for _ in range(100))
