"""The log writer's reading of stream entries: one entry is one status change, or (field 'b') the
same change of many messages; the rows it sends to PostgreSQL as JSON."""
import orjson

from delayqueue.messagelog.writer import Event, history_json, latest_per_message, status_json

ONE = {"a": "scanner-1@host-a", "f": "1", "w": "due", "i": "m1", "t": "2", "r": "0", "p": "1700000000000"}


def test_a_single_change_entry_is_one_event():
    [event] = Event.parse("orders", "1700000005000-3", ONE)
    assert event == Event("orders", "1700000005000-3", "m1", 1, 2, 0, 1_700_000_000_000, "due", "scanner-1", "host-a")
    assert event.at == 1_700_000_005_000  # the stream entry's time


def test_the_process_is_what_comes_before_the_last_at_sign():
    [event] = Event.parse("t", "1-0", {**ONE, "a": "worker@pod@node-7"})
    assert (event.process, event.host) == ("worker@pod", "node-7")


def test_a_batch_entry_gives_one_event_per_message_keyed_by_its_place():
    fields = {"a": "restore@h", "f": "0", "w": "restored",
              "b": orjson.dumps([["x", 1, 0, 100], ["y", 2, 3, 200]]).decode()}
    events = Event.parse("t", "5-1", fields)
    assert [(e.entry_id, e.msg_id, e.from_status, e.to_status, e.retry, e.produce_time) for e in events] == [
        ("5-1.0", "x", 0, 1, 0, 100), ("5-1.1", "y", 0, 2, 3, 200)]
    assert all(e.at == 5 and e.reason == "restored" and e.process == "restore" for e in events)


def test_latest_per_message_keeps_each_messages_last_event_per_topic():
    def ev(topic, msg_id, entry_id, to_status):
        return Event(topic, entry_id, msg_id, 0, to_status, 0, 1, "r", "p", "h")

    events = [ev("a", "m", "1-0", 1), ev("b", "m", "2-0", 1), ev("a", "m", "3-0", 2), ev("a", "n", "4-0", 3)]
    assert latest_per_message(events) == [events[2], events[1], events[3]]


def test_history_and_status_rows_carry_every_column_the_statements_unpack():
    [event] = Event.parse("orders", "1700000005000-3", ONE)
    assert orjson.loads(history_json([event])) == [{
        "t": "orders", "i": "m1", "e": "1700000005000-3", "at": 1_700_000_005_000, "f": 1, "s": 2, "r": 0,
        "w": "due", "p": "scanner-1", "h": "host-a"}]
    assert orjson.loads(status_json([event])) == [{
        "t": "orders", "i": "m1", "s": 2, "r": 0, "at": 1_700_000_005_000, "pt": 1_700_000_000_000, "g": None}]


def test_a_retimed_change_carries_the_new_trigger_time_to_the_row():
    [event] = Event.parse("orders", "9-0", {**ONE, "f": "3", "t": "1", "w": "ack_timeout", "g": "1700000009000"})
    assert event.trigger_time == 1_700_000_009_000
    assert orjson.loads(status_json([event]))[0]["g"] == 1_700_000_009_000


def test_a_trigger_time_set_earlier_in_the_batch_survives_later_changes_of_the_same_life():
    backed_off = Event("a", "1-0", "m", 3, 1, 1, 100, "ack_timeout", "p", "h", 5_000)
    due = Event("a", "2-0", "m", 1, 2, 1, 100, "due", "p", "h")
    next_life = Event("a", "3-0", "m", 0, 1, 0, 200, "sent", "p", "h")
    assert latest_per_message([backed_off, due]) == [Event("a", "2-0", "m", 1, 2, 1, 100, "due", "p", "h", 5_000)]
    assert latest_per_message([backed_off, next_life]) == [next_life]
