"""Builds small message logs with known contents (times in epoch milliseconds)."""
import itertools

from delayqueue.models import Message, MessageEvent

from .conftest import dt


class LogBuilder:
    def __init__(self, namespace: str = "default"):
        self.namespace = namespace
        self.messages: list[Message] = []
        self.events: list[MessageEvent] = []
        self._seq = itertools.count()

    def message(self, topic: str, msg_id: str, produce: int, *, delay: int = 0, ttl: int = 3_600_000,
                max_retry: int = 3, retry: int = 0, status: int = 1, updated: int | None = None,
                payload: str | None = None, namespace: str | None = None) -> Message:
        message = Message(namespace=namespace or self.namespace, topic=topic, msg_id=msg_id,
                          payload=payload if payload is not None else f"body of {msg_id}",
                          produce_time=dt(produce), trigger_time=dt(produce + delay),
                          expire_time=dt(produce + delay + ttl), max_retry=max_retry, retry=retry,
                          status=status, updated_at=dt(updated if updated is not None else produce))
        self.messages.append(message)
        return message

    def event(self, topic: str, msg_id: str, at: int, from_status: int, to_status: int, reason: str,
              retry: int = 0, namespace: str | None = None) -> MessageEvent:
        event = MessageEvent(namespace=namespace or self.namespace, topic=topic, msg_id=msg_id,
                             event_id=f"{at}-{next(self._seq)}", at=dt(at), from_status=from_status,
                             to_status=to_status, retry=retry, reason=reason, process="test", host="test")
        self.events.append(event)
        return event

    def save(self) -> "LogBuilder":
        Message.objects.bulk_create(self.messages, batch_size=2000)
        MessageEvent.objects.bulk_create(self.events, batch_size=2000)
        return self
