"""A topic's event stream: one entry per status change, appended by the scripts in the same
atomic step as the change (lua/includes/history.lua) and read back as Events by the log writer
(workers/log_writer.py), which writes them to the message log.

The entries' field names have one owner, EVENT_FIELDS: the scripts get them through the prelude's
EVENT table (live/scripts.py), and Event.parse reads them back with the same table.
"""
from dataclasses import dataclass

import orjson

# Event attribute -> the stream entry's field; 'batch' holds the same change of many messages.
EVENT_FIELDS = {
    "msg_id": "i", "from_status": "f", "to_status": "t", "retry": "r", "produce_time": "p", "reason": "w",
    "actor": "a", "trigger_time": "tt", "expire_time": "et", "detail": "d", "batch": "b",
}
_F = EVENT_FIELDS


@dataclass(frozen=True, slots=True)
class Event:
    """One status change. The message log's statements read these fields by name from orjson's
    dump of Events (messagelog/sql.py declares its records from this class)."""

    topic: str
    entry_id: str  # the stream entry's id, with its place in a batch entry: the history row's key
    at: int  # epoch ms of the change: the stream entry's time
    msg_id: str
    from_status: int
    to_status: int
    retry: int
    produce_time: int
    reason: str
    process: str
    host: str
    trigger_time: int | None = None  # set by a change that moved the message's times (reschedule, nack with a delay)
    expire_time: int | None = None
    detail: str = ""  # a push attempt's HTTP status or error, a consumer's nack reason

    @classmethod
    def parse(cls, topic: str, entry_id: str, fields: dict) -> list["Event"]:
        """The events of one stream entry: one status change, or (the batch field) the same
        change of many messages, each then keyed by the entry id and its place in the entry."""
        process, _, host = fields[_F["actor"]].rpartition("@")
        from_status, reason = int(fields[_F["from_status"]]), fields[_F["reason"]]
        at = int(entry_id.split("-", 1)[0])
        if _F["batch"] in fields:
            return [cls(topic, f"{entry_id}.{n}", at, msg_id, from_status, to_status, retry, produce_time, reason,
                        process, host)
                    for n, (msg_id, to_status, retry, produce_time) in enumerate(orjson.loads(fields[_F["batch"]]))]
        times = ((int(fields[_F["trigger_time"]]), int(fields[_F["expire_time"]])) if _F["trigger_time"] in fields
                 else (None, None))
        return [cls(topic, entry_id, at, fields[_F["msg_id"]], from_status, int(fields[_F["to_status"]]),
                    int(fields[_F["retry"]]), int(fields[_F["produce_time"]]), reason, process, host, *times,
                    fields.get(_F["detail"], ""))]
