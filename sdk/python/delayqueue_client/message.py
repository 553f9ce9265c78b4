"""The message as the client hands it out: the server's camelCase fields in snake_case."""
import os
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    msg_id: str
    msg: str | None  # None: a send met another message under its msgId, whose body the token may not read
    produce_time: int
    trigger_time: int
    expire_time: int
    max_retry: int
    retry: int
    status: int
    priority: int = 0
    # Dead letters only (Client.dead_letters): the history reason that ended it and when (epoch ms).
    dead_reason: str | None = None
    dead_time: int | None = None
    # the reason its consumer gave on the nack that ended it, or a push's failure that did ("" when none)
    dead_detail: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> "Message":
        """From a `delayMsg` of the API; fields this client does not know are ignored."""
        return cls(topic=data["topic"], msg_id=data["msgId"], msg=data.get("msg"), produce_time=data["produceTime"],
                   trigger_time=data["triggerTime"], expire_time=data["expireTime"], max_retry=data["maxRetry"],
                   retry=data["retry"], status=data["status"], priority=data.get("priority", 0),
                   dead_reason=data.get("deadReason"), dead_time=data.get("deadTime"),
                   dead_detail=data.get("deadDetail"))


def new_msg_id() -> str:
    """A version 7 UUID in 32 hex digits, as the server generates them (its first 12 hex digits are
    the time in ms, so ids sort by time): made here, a send can be retried safely."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # RFC 4122 variant
    return f"{value:032x}"
