"""Endpoints on messages: send, pull and long poll, ack and nack, touch, reschedule, read and
delete."""

from contextlib import nullcontext

from delayqueue.api import wire
from delayqueue.api.auth import request_token
from delayqueue.api.schema import (AckBatchResultSerializer, AckResultSerializer, BatchResultSerializer,
                                   DelayMsgListResultSerializer, DelayMsgResultSerializer, ResultSerializer,
                                   SentMsgResultSerializer, TouchResultSerializer, answer, queue_endpoint)
from delayqueue.api.validation import (AckMsgBatchSerializer, AckMsgSerializer, DeleteMsgSerializer,
                                       LongPollingMsgSerializer, MessageRefSerializer, PullMsgSerializer,
                                       RescheduleMsgSerializer, SendMsgSerializer, TouchMsgSerializer)
from delayqueue.api.views.base import QueueAPIView, given, parse, reply
from delayqueue.config.settings import setting_text
from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import BadRequest, NotFound, error_body
from delayqueue.core.messages import Message
from delayqueue.services.caps import long_poll_hold
from delayqueue.services.consume import (ack_message, ack_messages, long_poll_messages, nack_message, pull_messages,
                                         touch_message)
from delayqueue.services.messages import delete_message, get_message, reschedule_message
from delayqueue.services.send import SendRequest, send_message, send_messages
from delayqueue.stores.tokens import token_hash


@queue_endpoint(
    "Send a message",
    "Stores a message that can be pulled from its topic once delayMillis have passed. The answer carries "
    "the stored message: its msgId (generated when none was given), its times and its status (1 waiting, "
    "or 2 ready when the delay is 0 or less). Sending again under the msgId of a message that is still live, "
    "or that ended (acked, expired, dead, deleted) less than "
    f"{setting_text('dedupe_window_millis')} ms ago, or that is a dead letter, delivers nothing and answers "
    "that message, with its body (`msg`) only when it is the body sent or the token has the consume scope; "
    "after the window the msgId starts a new life. Over a produce rate or a live-message cap of the "
    "namespace or the topic: code 429 with retryAfterMillis. To a topic new to a namespace that has "
    f"{setting_text('max_topics')} topics already: code 429.",
    answer("SendMsgAnswer", SentMsgResultSerializer), SendMsgSerializer,
    example={"topic": "orders", "msg": '{"orderId": 42, "action": "cancel-if-unpaid"}', "delayMillis": 1800000,
             "msgId": "order-42-cancel", "ttlMillis": 3600000, "maxRetry": 3})
class SendMsgView(QueueAPIView):
    needs_scope = Scope.PRODUCE

    async def handle(self):
        request = wire.send_request(self.validated(SendMsgSerializer))
        sent = await send_message(self.rt, request=request)
        return reply(delayMsg=wire.sent_message(sent, body_readable=await body_readable(self, request, sent)))


async def body_readable(view: QueueAPIView, request: SendRequest, sent: Message) -> bool:
    """Whether a send's caller may read the answered message's body: the one it sent, or another
    message's that held the msgId, which only a token that may read messages (consume) may read."""
    return sent.payload == request.msg or await view.holds(Scope.CONSUME)


@queue_endpoint(
    "Send many messages",
    "Sends each message of a JSON list (each with sendMsg's parameters), in one call. The answer's "
    "`results` has one entry per message, in request order: code 200 with the stored message, or the "
    "code and msg saying why that message was not sent (its msg starts with `message <index>:`; over a "
    "limit, code 429 with retryAfterMillis). A refused message does not stop the others. The body may also be a JSON object "
    f'`{{"messages": [...]}}`. The list must hold 1 to {setting_text("max_batch_send")} '
    "messages.",
    answer("SendMsgBatchAnswer", BatchResultSerializer), body=SendMsgSerializer(many=True),
    example=[{"topic": "orders", "msg": "remind 42", "delayMillis": 600000},
             {"topic": "orders", "msg": "cancel 42", "delayMillis": 1800000, "msgId": "order-42-cancel"}])
class SendMsgBatchView(QueueAPIView):
    needs_scope = Scope.PRODUCE

    async def handle(self):
        items = self.body_data()
        if isinstance(items, dict) and "messages" in items:
            items = items["messages"]
        if not isinstance(items, list) or not items:
            raise BadRequest("body must be a non-empty JSON list of messages")
        rt = self.rt
        if len(items) > rt.config.max_batch_send:
            raise BadRequest(f"batch has {len(items)} messages, over the limit of {rt.config.max_batch_send}")
        results: list[dict | None] = [None] * len(items)
        accepted, positions = [], []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise BadRequest("must be a JSON object")
                data = parse(SendMsgSerializer, given(item))
            except BadRequest as exc:
                results[i] = item_error(i, exc)
            else:
                accepted.append(wire.send_request(data))
                positions.append(i)
        sent = await send_messages(rt, requests=accepted) if accepted else []
        for i, request, outcome in zip(positions, accepted, sent):
            if isinstance(outcome, Exception):
                results[i] = item_error(i, outcome)
            else:
                delay_msg = wire.sent_message(outcome, body_readable=await body_readable(self, request, outcome))
                results[i] = {"code": 200, "msg": "success", "delayMsg": delay_msg}
        return reply(results=results)


def item_error(index: int, exc: Exception) -> dict:
    """A batch item's error answer: worded as a single send's, prefixed with its position."""
    body = error_body(exc, "sendMsgBatch")
    body["msg"] = f"message {index}: {body['msg']}"
    return body


@queue_endpoint(
    "Pull ready messages",
    "Hands out up to `batch` messages of the topic that are due, oldest first, and answers at once; the "
    "list is empty when none is ready. Each message handed out is consuming (status 3) until it is acked "
    "with ackMsg; if it is not acked within ackTimeoutMillis it is delivered again (while retries last). "
    "Under a consume rate at most as many messages as the rate has tokens left are handed out, and none at "
    "all answers code 429 with retryAfterMillis.",
    answer("PullMsgAnswer", DelayMsgListResultSerializer), PullMsgSerializer,
    example={"topic": "orders", "batch": 10, "ackTimeoutMillis": 30000})
class PullMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(PullMsgSerializer)
        pulled = await pull_messages(self.rt, topic=data["topic"], batch=data["batch"],
                                     ack_timeout_millis=data["ackTimeoutMillis"])
        return reply(delayMsgList=wire.messages(pulled.messages))


@queue_endpoint(
    "Pull, waiting for a ready message",
    "As pullMsg, but when no message is ready the request is held until one becomes ready or "
    "longPollingTimeoutMillis pass; the list is empty if the time ran out. Over a consume rate the request "
    "is held until the rate lets a message through, not refused. A token holding "
    f"{setting_text('max_long_polls_per_token')} long polls at once gets code 429 with retryAfterMillis.",
    answer("LongPollingMsgAnswer", DelayMsgListResultSerializer), LongPollingMsgSerializer,
    example={"topic": "orders", "batch": 10, "ackTimeoutMillis": 30000, "longPollingTimeoutMillis": 10000})
class LongPollingMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(LongPollingMsgSerializer)
        token = request_token(self.request)
        holding = (long_poll_hold(self.rt, holder=token_hash(token), hold_millis=data["longPollingTimeoutMillis"])
                   if token is not None and self.rt.config.auth == "tokens" else nullcontext())
        async with holding:
            messages = await long_poll_messages(
                self.rt, topic=data["topic"], batch=data["batch"], ack_timeout_millis=data["ackTimeoutMillis"],
                timeout_millis=data["longPollingTimeoutMillis"]
            )
        return reply(delayMsgList=wire.messages(messages))


@queue_endpoint(
    "Acknowledge a pulled message",
    "ack=true (the default) marks a pulled message as consumed (status 4): it is not delivered again. "
    "ack=false gives it back: ready again at once (or after the topic's retry backoff), or with delayMillis after "
    "that delay (it waits, status 1, its retry count kept), or with deadLetter=true it ends now as a dead letter "
    "(status 6). `done` says whether the message was being consumed and so was acked (or given back, or "
    "dead-lettered) by this call. With ack=false a `reason` text (why the consumer gave it back) is kept on that "
    "history row and shown as a dead letter's deadDetail. With `retry` (the pulled message's retry) the call acts "
    "only on that delivery: a late one, after the ack timeout gave the message back and it was pulled again, "
    "does nothing (done false).",
    answer("AckMsgAnswer", AckResultSerializer), AckMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "ack": True})
class AckMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(AckMsgSerializer)
        if data["ack"]:
            outcome = await ack_message(self.rt, topic=data["topic"], msg_id=data["msgId"], retry=data["retry"])
        else:
            outcome = await nack_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                                  delay_millis=data["delayMillis"], dead_letter=data["deadLetter"],
                                                  reason=data["reason"], retry=data["retry"])
        return reply(done=outcome.done)


@queue_endpoint(
    "Acknowledge many pulled messages",
    "ackMsg for each msgId of a JSON list (1 to DELAYQUEUE_MAX_BATCH_SEND), all with the same ack, delayMillis, "
    "deadLetter and reason, in one Redis round trip. `results` has one {msgId, done} per msgId, in request order. "
    "`retries` (optional): per msgId, its pulled retry (null: any), as ackMsg's retry.",
    answer("AckMsgBatchAnswer", AckBatchResultSerializer), body=AckMsgBatchSerializer,
    example={"topic": "orders", "msgIds": ["order-42-cancel", "order-43-cancel"], "ack": True})
class AckMsgBatchView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(AckMsgBatchSerializer)
        msg_ids = data["msgIds"]
        done = await ack_messages(self.rt, topic=data["topic"], msg_ids=msg_ids, ack=data["ack"],
                                           delay_millis=data["delayMillis"], dead_letter=data["deadLetter"],
                                           reason=data["reason"], retries=data["retries"])
        return reply(results=[{"msgId": msg_id, "done": each} for msg_id, each in zip(msg_ids, done)])


@queue_endpoint(
    "Extend a pulled message's ack deadline",
    "A message being consumed (status 3) gets the ack deadline now + ackTimeoutMillis (Redis' clock), answered as "
    "ackDeadline. Code 409 when the message is not being consumed (or, with `retry`, the pulled message's retry, "
    "when it was delivered again since), 404 when the topic has no such message.",
    answer("TouchMsgAnswer", TouchResultSerializer), TouchMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "ackTimeoutMillis": 60000})
class TouchMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(TouchMsgSerializer)
        deadline = await touch_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                                ack_timeout_millis=data["ackTimeoutMillis"], retry=data["retry"])
        return reply(ackDeadline=deadline)


@queue_endpoint(
    "Change when a message falls due",
    "A waiting or ready message gets a new triggerTime: delayMillis from now, or triggerTime (epoch ms); exactly "
    "one of them. One not in the future makes it ready now (run now). Its expireTime moves by as much as its "
    "triggerTime, so its TTL counts from the new trigger time (one before its triggerTime, a TTL ending during a "
    "nack's delay or a retry backoff, stays). Answers the updated message. Code 409 when it is "
    "being consumed, 404 when the topic has no such message or it has ended.",
    answer("RescheduleMsgAnswer", DelayMsgResultSerializer), RescheduleMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "delayMillis": 600000})
class RescheduleMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(RescheduleMsgSerializer)
        trigger, delay = data["triggerTime"], data["delayMillis"]
        message = await reschedule_message(
            self.rt, topic=data["topic"], msg_id=data["msgId"], trigger_time=-1 if trigger is None else trigger,
            delay_millis=0 if delay is None else delay)
        return reply(delayMsg=wire.message(message))


@queue_endpoint(
    "Read one message",
    "Answers the message with its current status, without changing it. Ended messages (acked, expired, "
    "deleted) stay readable for a while. Code 404 when the topic has no such message.",
    answer("GetMsgAnswer", DelayMsgResultSerializer), MessageRefSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel"})
class GetMsgView(QueueAPIView):
    needs_scope = Scope.CONSUME

    async def handle(self):
        data = self.validated(MessageRefSerializer)
        message = await get_message(self.rt, topic=data["topic"], msg_id=data["msgId"])
        if message is None:
            raise NotFound(f"message {data['msgId']} not found in topic {data['topic']}")
        return reply(delayMsg=wire.message(message))


@queue_endpoint(
    "Delete a message",
    "Ends a message that is waiting, ready or being consumed (status 7): it is not delivered any more. "
    "Code 200 when deleted, 404 when the topic has no such message or it had already ended. A msgId Redis does not "
    "hold is looked for in the message log (Redis may have lost it): with PostgreSQL down, code 500 "
    "`message log unavailable: …`.",
    answer("DeleteMsgAnswer", ResultSerializer), DeleteMsgSerializer,
    example={"topic": "orders", "msgId": "order-42-cancel", "release": False})
class DeleteMsgView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(DeleteMsgSerializer)
        if not await delete_message(self.rt, topic=data["topic"], msg_id=data["msgId"],
                                             release=data["release"]):
            raise NotFound(f"message {data['msgId']} not found or already ended in topic {data['topic']}")
        return reply()
