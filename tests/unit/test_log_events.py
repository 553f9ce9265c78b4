"""The log writer's reading of stream entries: one entry is one status change, or (the batch field)
the same change of many messages; and the rows it sends to PostgreSQL as JSON."""
import re

import orjson

from delayqueue.live.history import EVENT_FIELDS, Event
from delayqueue.messagelog import sql
from delayqueue.workers.log_writer import latest_per_message

F = EVENT_FIELDS
ONE = {F["actor"]: "scanner-1@host-a", F["from_status"]: "1", F["reason"]: "due", F["msg_id"]: "m1",
       F["to_status"]: "2", F["retry"]: "0", F["produce_time"]: "1700000000000"}


def test_a_single_change_entry_is_one_event():
    [event] = Event.parse("orders", "1700000005000-3", ONE)
    assert event == Event("orders", "1700000005000-3", 1_700_000_005_000, "m1", 1, 2, 0, 1_700_000_000_000, "due",
                          "scanner-1", "host-a")
    assert event.at == 1_700_000_005_000  # the stream entry's time


def test_the_process_is_what_comes_before_the_last_at_sign():
    [event] = Event.parse("t", "1-0", {**ONE, F["actor"]: "worker@pod@node-7"})
    assert (event.process, event.host) == ("worker@pod", "node-7")


def test_a_batch_entry_gives_one_event_per_message_keyed_by_its_place():
    fields = {F["actor"]: "restore@h", F["from_status"]: "0", F["reason"]: "restored",
              F["batch"]: orjson.dumps([["x", 1, 0, 100], ["y", 2, 3, 200]]).decode()}
    events = Event.parse("t", "5-1", fields)
    assert [(e.entry_id, e.msg_id, e.from_status, e.to_status, e.retry, e.produce_time) for e in events] == [
        ("5-1.0", "x", 0, 1, 0, 100), ("5-1.1", "y", 0, 2, 3, 200)]
    assert all(e.at == 5 and e.reason == "restored" and e.process == "restore" for e in events)


def test_latest_per_message_keeps_each_messages_last_event_per_topic():
    def ev(topic, msg_id, entry_id, to_status):
        return Event(topic, entry_id, int(entry_id.split("-")[0]), msg_id, 0, to_status, 0, 1, "r", "p", "h")

    events = [ev("a", "m", "1-0", 1), ev("b", "m", "2-0", 1), ev("a", "m", "3-0", 2), ev("a", "n", "4-0", 3)]
    assert latest_per_message(events) == [events[2], events[1], events[3]]


def test_the_statements_read_every_column_they_name_from_the_events_json():
    """INSERT_EVENTS, RECORD_EVENTS and UPDATE_MESSAGES read orjson's dump of Events by their field names."""
    [event] = Event.parse("orders", "1700000005000-3", ONE)
    dumped = orjson.loads(orjson.dumps([event]))[0]
    for statement in (sql.INSERT_EVENTS, sql.RECORD_EVENTS, sql.UPDATE_MESSAGES):
        columns = re.search(r"json_to_recordset\(%\(events\)s::json\) AS u\(([^)]*)\)", statement).group(1)
        assert {column.split()[0] for column in columns.split(",")} <= set(dumped)
    assert dumped["entry_id"] == "1700000005000-3" and dumped["at"] == 1_700_000_005_000


def test_a_push_attempts_status_or_error_is_the_events_detail():
    [event] = Event.parse("orders", "9-0", {**ONE, F["reason"]: "push_failed", F["detail"]: "HTTP 503"})
    assert event.detail == "HTTP 503"
    assert orjson.loads(orjson.dumps([event]))[0]["detail"] == "HTTP 503"


def test_a_change_that_moved_the_times_carries_them_to_the_status_row():
    """A reschedule (or a nack with a delay) records the new triggerTime and expireTime; a later
    event of the same life in the same batch ('due') keeps them for the row, another life does not."""
    [moved] = Event.parse("t", "10-0", {**ONE, F["reason"]: "rescheduled", F["to_status"]: "1",
                                         F["trigger_time"]: "5000", F["expire_time"]: "9000"})
    assert (moved.trigger_time, moved.expire_time) == (5000, 9000)
    due = Event("t", "11-0", 11, "m1", 1, 2, 0, 1_700_000_000_000, "due", "p", "h")
    [latest] = latest_per_message([moved, due])
    assert latest.reason == "due" and (latest.trigger_time, latest.expire_time) == (5000, 9000)
    other_life = Event("t", "11-0", 11, "m1", 0, 2, 0, 1_800_000_000_000, "sent", "p", "h")
    assert latest_per_message([moved, other_life])[1] == other_life
    assert orjson.loads(orjson.dumps([other_life]))[0]["trigger_time"] is None


def test_each_life_keeps_its_last_event_whatever_order_the_shards_streams_were_read_in():
    """A sharded topic's streams are read one after another, not in time order: an ended life's last
    event in one shard may come after the next life's in another (a resend while a shard count
    drains). Each life keeps its own; the row's update applies only that of the life it holds."""
    new_life = Event("t", "20-0", 20, "m1", 1, 2, 0, 1_800_000_000_000, "due", "p", "h")
    old_life = Event("t", "10-0", 10, "m1", 3, 4, 0, 1_700_000_000_000, "acked", "p", "h")
    assert latest_per_message([new_life, old_life]) == [new_life, old_life]


def test_records_are_typed_from_the_dataclass_fields():
    assert sql.record(Event, "topic", "at", "trigger_time") == "topic text, at int8, trigger_time int8"
