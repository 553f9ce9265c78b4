"""What a topic, a namespace and a msgId may be called.

A topic: what camellia accepts, any non-empty UTF-8 text without control characters, up to
MAX_TOPIC_BYTES bytes. The API's serializers, the admin, the dashboard and the command lines'
--topic all ask topic_problem. Inside Redis key names a topic is encoded (delayqueue/live/keys.py),
so no character of it can break a key.

A namespace goes raw into Redis keys (inside the topic's hash tag), so it has no ':' or braces:
NAMESPACE_PATTERN. DELAYQUEUE_NAMESPACE, tokens, the admin and --namespace all ask checked_namespace.

A msgId: text without control characters, not only spaces, up to MAX_MSG_ID_CHARS characters (the
API's MsgIdField, the log's column); the command lines' --msg-id ask msg_id_problem."""
import re

from delayqueue.core.constants import MAX_TOPIC_BYTES

MAX_MSG_ID_CHARS = 256
NAMESPACE_PATTERN = r"[A-Za-z0-9._-]{1,64}"

TOPIC_RULE = f"must be 1-{MAX_TOPIC_BYTES} bytes of UTF-8 text without control characters"
MSG_ID_RULE = f"must be UTF-8 text without control characters, 1-{MAX_MSG_ID_CHARS} characters long"
# Control characters (C0, DEL, C1), and surrogates, which are no text and have no UTF-8 form.
_REFUSED_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A JSON-schema pattern (ECMA and Python alike) for a control character, for the API's schema.
CONTROL_CHARACTER_PATTERN = "[\\x00-\\x1f\\x7f-\\x9f]"


def topic_problem(topic: str) -> str | None:
    """What makes this text no topic name, worded after the rule; None for a good one."""
    if not topic:
        return f"{TOPIC_RULE}; it is empty"
    refused = _REFUSED_CHARACTER.search(topic)
    if refused:
        return f"{TOPIC_RULE}; it has U+{ord(refused[0]):04X}"
    if len(topic) * 4 > MAX_TOPIC_BYTES:  # up to 4 bytes a character: only a long one needs encoding
        size = len(topic.encode("utf-8"))
        if size > MAX_TOPIC_BYTES:
            return f"{TOPIC_RULE}; it is {size} bytes"
    return None


def msg_id_problem(msg_id: str) -> str | None:
    """What makes this text no msgId, worded after the rule; None for a good one. A byte of argv that
    is not UTF-8 reaches Python as a surrogate, which the message log cannot take."""
    if not msg_id:
        return f"{MSG_ID_RULE}; it is empty"
    if msg_id.isspace():  # as the API's MsgIdField refuses it
        return f"{MSG_ID_RULE}; it is only spaces"
    refused = _REFUSED_CHARACTER.search(msg_id)
    if refused:
        return f"{MSG_ID_RULE}; it has U+{ord(refused[0]):04X}"
    if len(msg_id) > MAX_MSG_ID_CHARS:
        return f"{MSG_ID_RULE}; it has {len(msg_id)}"
    return None


def checked_namespace(namespace: str) -> str:
    """The namespace, if it is one; else ValueError saying what is wrong."""
    if not re.fullmatch(NAMESPACE_PATTERN, namespace):
        raise ValueError(f"must be 1-64 of A-Z a-z 0-9 . _ - (it goes into Redis keys), got {namespace!r}")
    return namespace
