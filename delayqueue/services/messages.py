"""One message by its msgId: read, deleted, rescheduled."""
from delayqueue.core.constants import Status
from delayqueue.core.exceptions import Conflict, NotFound
from delayqueue.core.messages import Message
from delayqueue.live import scripts
from delayqueue.runtime import Runtime


async def get_message(rt: Runtime, *, topic: str, msg_id: str) -> Message | None:
    """A live message, or an ended one inside the retention window; None otherwise."""
    return await rt.scripts.call(scripts.get(rt.context, topic, msg_id=msg_id))


async def delete_message(rt: Runtime, *, topic: str, msg_id: str, release: bool = False) -> bool:
    """Deletes a live message (status deleted); False if it is missing or already ended.
    `release` frees its body at once instead of keeping it readable for the retention."""
    return await rt.scripts.call(scripts.delete(rt.context, topic, msg_id=msg_id, release=release))


async def reschedule_message(rt: Runtime, *, topic: str, msg_id: str, trigger_time: int = -1,
                             delay_millis: int = 0) -> Message:
    """A waiting or ready message gets a new trigger time: `trigger_time` (epoch ms), or with -1
    Redis' now + `delay_millis`; one not in the future makes it ready now. Its expireTime moves
    with it (the TTL counts from the new trigger time). Answers the message as stored.
    Raises Conflict when it is consuming, NotFound when it is unknown or ended."""
    reply = await rt.scripts.call(scripts.reschedule(rt.context, topic, msg_id=msg_id, trigger_time=trigger_time,
                                                     delay_millis=delay_millis))
    if reply.stored is not None:
        return reply.stored
    if reply.status == Status.CONSUMING:
        raise Conflict(f"message {msg_id} is being consumed: only a waiting or ready message can be rescheduled")
    if reply.status == 0:
        raise NotFound(f"message {msg_id} not found in topic {topic}")
    raise NotFound(f"message {msg_id} has already ended (status {reply.status}) in topic {topic}")
