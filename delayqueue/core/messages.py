"""The one message type, and its converters: to and from the API's wire dict (camellia's
CamelliaDelayMsg: lua/includes/new_message.lua builds it with the names of WIRE_FIELDS), the form
Redis stores (lua/includes/stored.lua: a short record, marked with its status unless it is
waiting) and the message log's row; and the msgIds the service generates."""
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from delayqueue.core.constants import Status
from delayqueue.core.random_bits import random_bits

# A message's fields in the API and in Redis (priority only above 0), as to_wire writes them.
WIRE_FIELDS = ("topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry", "status",
               "priority")


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 6x as much to build, per message
class Message:
    """A message; times are epoch milliseconds."""

    topic: str
    msg_id: str
    payload: str
    produce_time: int
    trigger_time: int
    expire_time: int
    max_retry: int
    retry: int
    status: int
    priority: int = 0  # 0-9, higher pulled first

    @property
    def key(self) -> tuple[str, str]:
        return self.topic, self.msg_id

    def to_wire(self) -> dict:
        wire = {"topic": self.topic, "msgId": self.msg_id, "msg": self.payload, "produceTime": self.produce_time,
                "triggerTime": self.trigger_time, "expireTime": self.expire_time, "maxRetry": self.max_retry,
                "retry": self.retry, "status": self.status}
        if self.priority:  # only above 0: a message sent without one answers exactly as camellia's
            wire["priority"] = self.priority
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping) -> "Message":
        return cls(wire["topic"], wire["msgId"], wire["msg"], wire["produceTime"], wire["triggerTime"],
                   wire["expireTime"], wire["maxRetry"], wire["retry"], wire["status"], wire.get("priority", 0))

    def to_stored(self) -> str:
        """The message as Redis stores it (stored writes it)."""
        return stored(self.topic, self.msg_id, self.payload, self.produce_time, self.trigger_time, self.expire_time,
                      self.max_retry, self.retry, self.status, self.priority)

    @classmethod
    def from_json(cls, raw: str) -> "Message":
        """A message as the API's json (what a script answers for a message it read)."""
        return cls.from_wire(orjson.loads(raw))

    @classmethod
    def from_stored(cls, raw: str, msg_id: str) -> "Message":
        """A message as Redis stores it under `msg_id` (its record does not repeat it), or as an
        older version stored one that was not waiting: the API's json."""
        if raw.startswith("{"):
            return cls.from_json(raw)
        status = Status.WAITING
        if raw.startswith("!"):
            marked, raw = raw[1:].split(",", 1)
            status = int(marked)
        header, payload = raw.split("\n", 1)
        trigger, before, ttl, max_retry, retry, priority, topic = header.split(",", 6)
        trigger_time = int(trigger, 16)
        return cls(topic, msg_id, payload, trigger_time - int(before, 16), trigger_time, trigger_time + int(ttl, 16),
                   int(max_retry), int(retry), status, int(priority))

    def to_row(self) -> dict:
        """The message log's columns (times as epoch ms)."""
        return {"topic": self.topic, "msg_id": self.msg_id, "payload": self.payload,
                "produce_time": self.produce_time, "trigger_time": self.trigger_time,
                "expire_time": self.expire_time, "max_retry": self.max_retry, "retry": self.retry,
                "status": self.status, "priority": self.priority}

    @classmethod
    def from_row(cls, row: Mapping) -> "Message":
        return cls(row["topic"], row["msg_id"], row["payload"], row["produce_time"], row["trigger_time"],
                   row["expire_time"], row["max_retry"], row["retry"], row["status"], row.get("priority", 0))


def stored(topic: str, msg_id: str, payload: str, produce_time: int, trigger_time: int, expire_time: int,
           max_retry: int, retry: int, status: int, priority: int) -> str:
    """A message as Redis stores it (Message.to_stored), as lua/includes/stored.lua writes it: its
    record (its triggerTime, the produceTime before it and the TTL after it in hex, maxRetry,
    retry, priority, the topic up to a newline, the body), led by '!', the status and a comma
    unless it is waiting; the cold tier's loader builds thousands a page."""
    record = (f"{trigger_time:x},{trigger_time - produce_time:x},{expire_time - trigger_time:x},{max_retry},{retry},"
              f"{priority},{topic}\n{payload}")
    return record if status == Status.WAITING else f"!{status},{record}"


_LOW_62 = (1 << 62) - 1


def new_msg_id(produce_time: int) -> str:
    """A version 7 UUID (RFC 9562) in 32 hex digits, as camellia's dashless UUIDs: the
    millisecond first, then 74 random bits. Ids made in time order go in at the right-hand end
    of the message log's msgId indexes instead of at random pages, which costs PostgreSQL a
    quarter less per logged send and does not grow with the log (docs/benchmarks.md). The random
    bits come from the OS CSPRNG (random_bits.py), so one id tells nothing of the next: knowing
    an id is what lets a client ack, delete or read a message."""
    rand = random_bits(74)
    return f"{produce_time << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0b10 << 62 | rand & _LOW_62:032x}"
