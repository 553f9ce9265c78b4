"""The one message type, and its converters: to and from the API's wire dict (camellia's
CamelliaDelayMsg, also what Redis stores as json: lua/includes/new_message.lua builds it with
the names of WIRE_FIELDS) and the message log's row; and the msgIds the service generates."""
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

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
        """The message as Redis stores it: its wire json (stored_json writes it)."""
        return stored_json(orjson.dumps(self.topic), self.msg_id, self.payload, self.produce_time, self.trigger_time,
                           self.expire_time, self.max_retry, self.retry, self.status, self.priority).decode()

    @classmethod
    def from_stored(cls, raw: str) -> "Message":
        """A message as Redis stores it (its wire json)."""
        return cls.from_wire(orjson.loads(raw))

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


def stored_json(topic: bytes, msg_id: str, payload: str, produce_time: int, trigger_time: int, expire_time: int,
                max_retry: int, retry: int, status: int, priority: int) -> bytes:
    """A message as Redis stores it (Message.to_stored), as bytes: the same json as its to_wire,
    for a third of the cost of dumping that dict; the cold tier's loader builds thousands a page.
    `topic`: orjson.dumps of the topic, made once for all of them."""
    stored = (b'{"topic":%b,"msgId":%b,"msg":%b,"produceTime":%d,"triggerTime":%d,"expireTime":%d,"maxRetry":%d,'
              b'"retry":%d,"status":%d' % (topic, orjson.dumps(msg_id), orjson.dumps(payload), produce_time,
                                           trigger_time, expire_time, max_retry, retry, status))
    return stored + (b',"priority":%d}' % priority if priority else b"}")


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
