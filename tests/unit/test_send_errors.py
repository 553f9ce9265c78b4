"""What a send answers when Redis failed its script call (services/send.send_errors): a timeout may
have run it (MaybeSent: the log keeps the row and a resend under its msgId is safe), any other
error did not (the log drops the row)."""
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue.core.exceptions import MaybeSent, QueueError
from delayqueue.core.messages import Message
from delayqueue.live.scripts import SendReply
from delayqueue.services.send import send_errors


def row(msg_id: str) -> Message:
    return Message("t", msg_id, "body", 1, 2, 3, 10, 0, 1)


def test_a_timeout_may_have_sent_another_error_did_not_and_a_reply_stays():
    created = SendReply(True, 1, None, False)
    rows = [row("a"), row("b"), row("c"), row("d")]
    replies = send_errors(rows, [RedisTimeoutError("t"), RedisConnectionError("refused"), ResponseError("lua"),
                                 created])
    assert isinstance(replies[0], MaybeSent) and "msgId a" in str(replies[0])
    assert all(isinstance(r, QueueError) and not isinstance(r, MaybeSent) for r in replies[1:3])
    assert replies[3] is created
