"""The task layer's message body: a versioned JSON envelope naming the task and its arguments,
`{"v": 1, "task": name, "args": [...], "kwargs": {...}, "headers": {str: str}}` (headers carry
context such as a trace's, never the arguments)."""
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
# The server's default DELAYQUEUE_MAX_MSG_BYTES: the largest msg it stores, in UTF-8 bytes.
MAX_MSG_BYTES = 1_048_576
# json.dumps with options other than its defaults makes an encoder per call: one made once costs a send less.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_STR, _PLAIN = {str}, {str, int, float, bool, type(None)}  # types holding no dict


class EnvelopeError(ValueError):
    """A message body that is not an envelope this code can read (the text says what is wrong)."""


class TaskTooLarge(ValueError):
    """A task's envelope over the server's message size limit: refused before it is sent."""


@dataclass(frozen=True)
class Envelope:
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def encode(envelope: Envelope, *, max_bytes: int = MAX_MSG_BYTES) -> str:
    """The envelope's JSON text; a TypeError names the argument that JSON cannot carry as it is, a
    TaskTooLarge says by how much it is over `max_bytes`."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in envelope.headers.items()):
        raise TypeError(f"task {envelope.task}: headers must map str to str")
    try:
        text = _ENCODER.encode({"v": VERSION, "task": envelope.task, "args": envelope.args, "kwargs": envelope.kwargs,
                                "headers": envelope.headers})
    except (TypeError, ValueError) as exc:
        raise _not_serializable(envelope, _fails_json, str(exc)) from None
    if _non_str_key(envelope.args) or _non_str_key(envelope.kwargs):
        raise _not_serializable(envelope, _non_str_key, "a dict key that is not a str, which JSON would turn into "
                                                        "one: 1 into \"1\"")
    size = len(text) if text.isascii() else len(text.encode())  # encoded only when not ASCII: the same count
    if size > max_bytes:
        raise TaskTooLarge(f"task {envelope.task}: its message is {size} bytes, over the server's limit of "
                           f"{max_bytes} (DELAYQUEUE_MAX_MSG_BYTES); pass a reference (an id, a URL) instead")
    return text


def _non_str_key(value: Any) -> bool:
    """Whether a dict in `value` has a key that is not a str: JSON makes 1 "1" without a word, and the
    task would look for 1 in vain. The types of a container's items are looked at in C first: a
    list of 10,000 numbers costs a send 0.1 ms, not 1 ms."""
    if isinstance(value, dict):
        if not set(map(type, value)) <= _STR and not all(isinstance(key, str) for key in value):
            return True
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return False
    return not set(map(type, items)) <= _PLAIN and any(_non_str_key(item) for item in items)


def _fails_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return True
    return False


def _not_serializable(envelope: Envelope, fails: Callable[[Any], bool], reason: str) -> TypeError:
    """The error naming the first argument `fails` (looked for once the whole envelope failed)."""
    named = [(f"argument {i}", v) for i, v in enumerate(envelope.args)]
    named += [(f"argument {k!r}", v) for k, v in envelope.kwargs.items()]
    what = next((what for what, value in named if fails(value)), "a keyword argument's name")
    return TypeError(f"task {envelope.task}: {what} is not JSON-serializable ({reason}); send ids and plain data "
                     "(str, int, float, bool, None, list, dict with str keys) or a pydantic model the parameter is "
                     "annotated with")


def decode(text: str | None) -> Envelope:
    """The envelope in a message body; EnvelopeError saying what is wrong with any other text."""
    if text is None:
        raise EnvelopeError("the message has no body this token may read")
    try:
        data = json.loads(text)
    except ValueError:
        raise EnvelopeError("the message body is not JSON, so not a task envelope") from None
    except RecursionError:  # a body of any text may reach a worker: "[" * 1000 is one
        raise EnvelopeError("the message body is JSON nested too deep to read, so not a task envelope") from None
    if not isinstance(data, dict) or "v" not in data:
        raise EnvelopeError("the message body is not a task envelope (no \"v\" field)")
    if data["v"] != VERSION:
        raise EnvelopeError(f"task envelope version {data['v']!r} is unknown to this code (it reads {VERSION})")
    task, args, kwargs, headers = data.get("task"), data.get("args"), data.get("kwargs"), data.get("headers")
    if not isinstance(task, str) or not task:
        raise EnvelopeError("the task envelope names no task")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise EnvelopeError(f"task {task}: the envelope's args must be a list and kwargs an object")
    headers = {} if headers is None else headers
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise EnvelopeError(f"task {task}: the envelope's headers must map str to str")
    return Envelope(task, args, kwargs, headers)
