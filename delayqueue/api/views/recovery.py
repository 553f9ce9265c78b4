"""Endpoints that bring messages back: restore from the message log, and dead letters (list,
redrive, purge)."""

from delayqueue.api import wire
from delayqueue.api.schema import (CountResultSerializer, DeadMsgListResultSerializer, RedriveTaskResultSerializer,
                                   RestoreResultSerializer, TaskIdResultSerializer, answer, queue_endpoint)
from delayqueue.api.validation import (DeadMsgListSerializer, PurgeDeadMsgSerializer, RedriveDeadMsgSerializer,
                                       RedriveTaskSerializer, RestoreMsgSerializer, RestoreSerializer)
from delayqueue.api.views.base import QueueAPIView, reply
from delayqueue.config.settings import setting_text
from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import NotFound
from delayqueue.services.dead_letters import create_redrive, dead_letters, purge_dead_letters, redrive_state
from delayqueue.services.restore import restore


@queue_endpoint(
    "Restore messages from the message log",
    "Puts back into Redis the messages the message log says are live (after Redis lost data), for every "
    "topic or only `topic`; expire=true also brings back messages whose TTL ran out before delivery. Safe "
    "to repeat: messages Redis still holds are counted in alreadyLive and left alone. Code 404 when "
    "`topic` has no messages in the log; code 429 while another restore of the namespace runs (one at a time).",
    answer("RestoreAnswer", RestoreResultSerializer), RestoreSerializer,
    example={"topic": "orders", "expire": False})
class RestoreView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RestoreSerializer)
        rt = self.rt
        topic = data.get("topic")
        counts = await restore(rt, topic=topic, include_expired=data["expire"])
        if topic is not None and not counts.seen:
            raise NotFound(f"topic {topic} has no messages in the message log")
        return reply(**wire.restore_counts(counts))


@queue_endpoint(
    "Restore one message from the message log",
    "As restore, for one message. Code 404 when the message log does not have it.",
    answer("RestoreMsgAnswer", RestoreResultSerializer), RestoreMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "expire": False})
class RestoreMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RestoreMsgSerializer)
        rt = self.rt
        topic, msg_id = data["topic"], data["msgId"]
        counts = await restore(rt, topic=topic, msg_id=msg_id, include_expired=data["expire"])
        if not counts.seen:
            raise NotFound(f"message {msg_id} not found in the message log of topic {topic}")
        return reply(**wire.restore_counts(counts))


@queue_endpoint(
    "List a topic's dead letters",
    "Messages of the topic that ended as dead letters (status 5: their TTL ran out before any delivery; "
    "status 6: their deliveries or TTL ran out after a delivery, or their consumer dead-lettered them), kept "
    "in the message log for "
    f"days ({setting_text('dead_letter_retention_days')}), oldest death first, `limit` per page. Only while the "
    "topic's deadLetter setting (setTopicConfig) is true: with it false the list is empty. Each carries "
    "deadReason, deadDetail (the consumer's nack reason, or a push's failure) and deadTime. Pass the answer's nextCursor as `cursor` "
    "for the next page; the last page has none.",
    answer("GetDeadMsgListAnswer", DeadMsgListResultSerializer), DeadMsgListSerializer, method="GET",
    example={"topic": "orders", "limit": 100})
class GetDeadMsgListView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        data = self.validated(DeadMsgListSerializer)
        page, next_cursor = await dead_letters(self.rt, topic=data["topic"], limit=data["limit"],
                                                           cursor=data.get("cursor"))
        return reply(delayMsgList=[wire.dead_letter(dead) for dead in page],
                     **({"nextCursor": next_cursor} if next_cursor else {}))


@queue_endpoint(
    "Send dead letters back",
    "Starts a redrive of the topic's dead letters (only those in msgIds, a JSON list in a JSON body, when "
    "given): each goes back as a new life under its msgId, ready at once with retry 0, at most maxPerSecond "
    "a second. The scanners run it, and a scanner that stops halfway leaves it to another. Answers taskId "
    "(see getRedriveTask); code 404 when there is no such dead letter. Rate and live-message limits do not "
    f"apply: maxPerSecond paces it, at most {setting_text('max_redrive_rate')} (above it: code 429).",
    answer("RedriveDeadMsgAnswer", TaskIdResultSerializer), body=RedriveDeadMsgSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel"], "maxPerSecond": 500})
class RedriveDeadMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated_fully(RedriveDeadMsgSerializer)
        topic = data["topic"]
        task_id = await create_redrive(self.rt, topic=topic, msg_ids=data.get("msgIds"),
                                                   max_per_second=data.get("maxPerSecond"))
        if task_id is None:
            raise NotFound(f"topic {topic} has no such dead letter" if "msgIds" in data
                           else f"topic {topic} has no dead letters")
        return reply(taskId=task_id)


@queue_endpoint(
    "Progress of a redrive",
    "How many dead letters a redrive has sent back (moved), how many it has still to send (left), and its "
    "state: running or done. Code 404 for an unknown taskId.",
    answer("GetRedriveTaskAnswer", RedriveTaskResultSerializer), RedriveTaskSerializer, method="GET",
    example={"taskId": 1})
class GetRedriveTaskView(QueueAPIView):
    needs_scope = Scope.MANAGE
    marks_use = False

    async def handle(self):
        task_id = self.validated(RedriveTaskSerializer)["taskId"]
        state = await redrive_state(self.rt, task_id=task_id)
        if state is None:
            raise NotFound(f"redrive task {task_id} not found")
        return reply(**wire.redrive_progress(state))


@queue_endpoint(
    "Remove dead letters",
    "Removes the topic's dead letters (only those in msgIds, a JSON list in a JSON body, when given) and "
    "their history from the message log. Answers count, the number removed.",
    answer("PurgeDeadMsgAnswer", CountResultSerializer), body=PurgeDeadMsgSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel"]})
class PurgeDeadMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated_fully(PurgeDeadMsgSerializer)
        return reply(count=await purge_dead_letters(self.rt, topic=data["topic"],
                                                                msg_ids=data.get("msgIds")))
